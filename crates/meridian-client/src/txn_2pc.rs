//! The coordinator of a multi-shard transaction's commit: two-phase commit over Raft groups,
//! run by the client (see `meridian-raft`'s `locks` for what each shard does).
//!
//! ```text
//!  prepare every participant (in parallel) ──► all prepared: C = max(prepare timestamps)
//!        │ any conflict, lock, abort or error            │
//!        ▼                                               ▼
//!  abort at the anchor, then the others       decide Committed(C) at the anchor ── ack ──►
//!  (the transaction did not commit)           then, in the background: resolve the other
//!                                             participants at C, and forget the record
//! ```
//!
//! - The transaction's id is a write id of this client (never reused); its *anchor* is its
//!   first written key, whose shard holds its record.
//! - A prepare that meets another transaction's lock fails at once (no waiting while holding
//!   locks: no deadlock); the transaction aborts and [`Client::txn`](crate::Client::txn) runs it
//!   again after a backoff, like any conflict.
//! - The decision at the anchor is the commit point. If it cannot be learnt (the call ran out
//!   of time), the commit is [`Error::Ambiguous`]: a reader may yet find the transaction
//!   committed. A failure before the decision is never ambiguous: the coordinator aborts at the
//!   anchor, and even if that abort is lost, nobody else will ever commit the transaction
//!   (readers that meet its locks abort it, see `locks`).
//! - The acknowledgement comes after two consensus rounds (prepare, decide); resolving the
//!   other participants takes a third, after it. Readers that meet a lock meanwhile wait.
//!
//! # Not done yet
//! - Parallel commit (acknowledging after one round, the record written as STAGING with the
//!   prepares): see `../shared/TXN-GEO-DESIGN.md`.
//! - If this process exits between the decision and the background resolution, the locks stay
//!   until readers resolve them (after `LOCK_RECOVER_AFTER`) and the record is never forgotten.

use crate::client::Route;
use crate::error::{Error, Result};
use crate::locks::{LockPolicy, Resolution};
use crate::routing::Routed;
use crate::txn_commit::send_commit;
use crate::Client;
use bytes::Bytes;
use meridian_proto::kv::{self as proto, TxnState};
use meridian_types::Timestamp;
use std::collections::BTreeMap;

/// One participant: its shard and a key it owns (to route resolves by).
#[derive(Clone, Debug)]
struct Participant {
    shard: u64,
    key: Bytes,
}

/// A key of `message`'s shard.
fn routing_key(message: &proto::CommitRequest) -> Bytes {
    message
        .writes
        .first()
        .map(|w| w.key.clone())
        .or_else(|| message.reads.first().map(|r| r.key.clone()))
        .or_else(|| message.ranges.first().map(|r| r.start.clone()))
        .unwrap_or_default()
}

/// Commits a transaction whose reads and writes span `groups` (by shard) with two-phase
/// commit; `txn` is its id and `anchor` its first written key.
pub(crate) async fn commit(
    client: &Client,
    txn: proto::WriteId,
    anchor: Bytes,
    groups: BTreeMap<u64, proto::CommitRequest>,
) -> Result<Timestamp> {
    let deadline = client.deadline();
    let participants: Vec<Participant> = groups
        .iter()
        .map(|(shard, message)| Participant {
            shard: *shard,
            key: routing_key(message),
        })
        .collect();
    let prepares = groups.into_iter().map(|(shard, mut message)| {
        message.write_id = None;
        message.prepare = Some(proto::TxnPrepare {
            txn: Some(txn),
            anchor: anchor.clone(),
        });
        let deadline = &deadline;
        async move {
            client
                .write_call_with(
                    Route::Shard(shard),
                    deadline,
                    LockPolicy::Fail,
                    |channel, timeout, route| send_commit(channel, timeout, message.routed(route)),
                )
                .await
        }
    });
    let answers = futures::future::join_all(prepares).await;
    let mut commit_ts = 0u64;
    let mut failure: Option<Error> = None;
    for answer in answers {
        let failed = match answer {
            Ok(reply) if reply.committed => {
                commit_ts = commit_ts.max(reply.commit_ts);
                continue;
            }
            Ok(reply) if reply.aborted => Error::TxnConflict {
                key: anchor.clone(),
            },
            Ok(reply) => Error::TxnConflict {
                key: reply.conflict_key,
            },
            Err(Error::Locked { lock }) => Error::TxnConflict { key: lock.key },
            // The prepare's own outcome is unknown, but the transaction will not commit: it
            // is aborted below, and only this coordinator ever decides a commit.
            Err(Error::Ambiguous { message }) => Error::Unavailable {
                message: format!(
                    "a prepare's outcome is unknown; the transaction was aborted: {message}"
                ),
            },
            Err(other) => other,
        };
        failure.get_or_insert(failed);
    }
    if let Some(failure) = failure {
        abort(client, txn, &anchor, &participants).await;
        return Err(failure);
    }
    let decided = client
        .resolve_txn(&anchor, txn, true, Resolution::Commit(commit_ts), &deadline)
        .await
        .map_err(|error| Error::Ambiguous {
            message: format!(
                "the decision of a multi-shard transaction at its anchor is unknown: {error}"
            ),
        })?;
    if TxnState::try_from(decided.state) != Ok(TxnState::Committed) {
        // A reader recovered (aborted) it first.
        finish(client, txn, &anchor, &participants, Resolution::Abort);
        return Err(Error::TxnConflict { key: anchor });
    }
    finish(
        client,
        txn,
        &anchor,
        &participants,
        Resolution::Commit(decided.commit_ts),
    );
    Ok(Timestamp(decided.commit_ts))
}

/// Aborts `txn` at its anchor (awaited: from here on it cannot commit), the rest after.
async fn abort(client: &Client, txn: proto::WriteId, anchor: &Bytes, participants: &[Participant]) {
    let deadline = client.deadline();
    if let Err(error) = client
        .resolve_txn(anchor, txn, true, Resolution::Abort, &deadline)
        .await
    {
        tracing::debug!(%error, "aborting a transaction at its anchor failed; readers will");
    }
    finish(client, txn, anchor, participants, Resolution::Abort);
}

/// In the background: resolves every participant but the anchor's as `resolution` says, then
/// forgets the record.
fn finish(
    client: &Client,
    txn: proto::WriteId,
    anchor: &Bytes,
    participants: &[Participant],
    resolution: Resolution,
) {
    let anchor_shard = client.route(anchor).map(|r| r.shard_id);
    let others: Vec<Participant> = participants
        .iter()
        .filter(|p| Some(p.shard) != anchor_shard)
        .cloned()
        .collect();
    let (client, anchor) = (client.clone(), anchor.clone());
    tokio::spawn(async move {
        let deadline = client.deadline();
        let resolves = others
            .iter()
            .map(|p| client.resolve_txn(&p.key, txn, false, resolution, &deadline));
        let mut all = true;
        for (p, outcome) in others.iter().zip(futures::future::join_all(resolves).await) {
            if let Err(error) = outcome {
                all = false;
                tracing::debug!(shard = p.shard, %error, "resolving a participant failed; readers will");
            }
        }
        if all {
            if let Err(error) = client
                .resolve_txn(&anchor, txn, true, Resolution::Forget, &deadline)
                .await
            {
                tracing::debug!(%error, "forgetting a transaction record failed");
            }
        }
    });
}
