//! The coordinator of a multi-shard transaction's commit: a *parallel commit* over Raft groups,
//! run by the client (see `meridian-raft`'s `locks` for what each shard does).
//!
//! ```text
//!  prepare every participant in parallel (the anchor's prepare stages the record, listing
//!  the others)
//!        │ every prepare answered "prepared"          │ any conflict, lock, abort or error
//!        ▼                                            ▼
//!  implicitly committed at C = max(prepare ts)   recover (txn_recover): it may be committed
//!  ── ack ──► then, in the background:           after all (a lost answer), else abort it
//!  commit the record at the anchor (explicit),
//!  then resolve the other participants at C,
//!  then finish the record (GC may collect it)
//! ```
//!
//! - The transaction's id is a write id of this client (never reused); its *anchor* is its
//!   first written key, whose shard holds its record. Every prepare and resolve carries its
//!   start timestamp (the attempt's read timestamp, or this machine's clock if it read
//!   nothing): GC collects its record and markers once that is below a shard's threshold,
//!   and refuses its prepares from then on.
//! - **One consensus round**: the commit is acknowledged when every participant answered its
//!   prepare, because from then on every recovery finds every participant prepared and commits
//!   at the same `C` (see `locks`). Making the commit explicit and resolving the intents take
//!   two more rounds, after the acknowledgement; readers that meet a lock meanwhile wait.
//! - A prepare that meets another transaction's lock fails at once in the transaction's first
//!   two attempts (and always with [`TxnOptions::no_wait`](crate::TxnOptions::no_wait)): the
//!   transaction is settled and [`Client::txn`](crate::Client::txn) runs it again after a
//!   backoff, like any conflict. From the third attempt on it follows wound-wait (see
//!   `locks`): it recovers a holder it outranks and sends the prepare again, and waits for a
//!   holder that outranks it (waits go only from junior to senior: no deadlock).
//! - A failed commit is settled by a recovery before it is reported: a prepare answered as
//!   failed may still land from an earlier attempt, so the coordinator cannot just abort. If
//!   the recovery finds the transaction committed, the commit succeeded; if it aborts it, the
//!   first failure is reported; if the recovery itself fails, the commit is
//!   [`Error::Ambiguous`].
//! - The explicit commit happens before any other participant is resolved, and a participant
//!   is not resolved if it fails: resolving removes locks, and a recovery that found a
//!   participant unlocked while the record is still staging would abort the transaction.
//!
//! # Not done yet
//! - If this process exits after the acknowledgement and before the background resolution,
//!   the locks stay until readers meet them and recover the transaction (after
//!   `LOCK_RECOVER_AFTER`) or a shard leader's sweeper does (`meridian-server`'s `sweeper`,
//!   after `txn_sweep_after_ms`).

use crate::client::Route;
use crate::error::{Error, Result};
use crate::locks::{LockPolicy, Resolution};
use crate::txn_commit::{first_send, send_commit};
use crate::txn_recover::Settled;
use crate::Client;
use bytes::Bytes;
use meridian_proto::kv::{self as proto, TxnState};
use meridian_types::limits::MAX_TXN_PARTICIPANTS;
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

/// How one multi-shard commit behaves.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Rules {
    /// The transaction's rank in lock conflicts.
    pub rank: meridian_types::TxnRank,
    /// What its prepares do when they meet a lock (see `locks`).
    pub locks: LockPolicy,
    /// Every prepare commit-waits on its own timestamp (`TxnOptions::linearizable`); the one
    /// that sets the commit timestamp waits on it.
    pub commit_wait: bool,
}

/// Commits a transaction whose reads and writes span `groups` (by shard) with a parallel
/// commit; `txn` is its id and start timestamp, `anchor` its first written key.
pub(crate) async fn commit(
    client: &Client,
    txn: (proto::WriteId, u64),
    rules: Rules,
    anchor: Bytes,
    groups: BTreeMap<u64, proto::CommitRequest>,
) -> Result<Timestamp> {
    if groups.len() > MAX_TXN_PARTICIPANTS + 1 {
        return Err(Error::InvalidArgument {
            message: format!(
                "the transaction touches {} shards, more than MAX_TXN_PARTICIPANTS + 1 ({})",
                groups.len(),
                MAX_TXN_PARTICIPANTS + 1
            ),
        });
    }
    let deadline = client.deadline();
    // The group that writes the anchor key: its shard stages the record (the server checks
    // it owns the anchor), and the record must list every other group.
    let anchor_shard = groups
        .iter()
        .find(|(_, m)| m.writes.iter().any(|w| w.key == anchor))
        .map(|(shard, _)| *shard)
        .ok_or_else(|| Error::internal("no participant writes the anchor key"))?;
    let participants: Vec<Participant> = groups
        .iter()
        .map(|(shard, message)| Participant {
            shard: *shard,
            key: routing_key(message),
        })
        .collect();
    let others: Vec<Bytes> = participants
        .iter()
        .filter(|p| p.shard != anchor_shard)
        .map(|p| p.key.clone())
        .collect();
    let prepares = groups.into_iter().map(|(shard, mut message)| {
        message.write_id = None;
        message.commit_wait = rules.commit_wait;
        message.prepare = Some(proto::TxnPrepare {
            txn: Some(txn.0),
            txn_ts: txn.1,
            priority: rules.rank.priority,
            age_ts: rules.rank.age_ts,
            anchor: anchor.clone(),
            participants: match shard == anchor_shard {
                true => others.clone(),
                false => Vec::new(),
            },
        });
        let deadline = &deadline;
        async move {
            let mut first = true;
            client
                .write_call_with(
                    Route::Shard(shard),
                    deadline,
                    rules.locks,
                    |channel, timeout, route| {
                        send_commit(channel, timeout, first_send(&message, route, &mut first))
                    },
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
            Err(Error::Ambiguous { message }) => Error::Unavailable {
                message: format!("a prepare's outcome is unknown: {message}"),
            },
            Err(other) => other,
        };
        failure.get_or_insert(failed);
    }
    let Some(failure) = failure else {
        // Implicitly committed: acknowledge now, make it explicit after.
        finish(
            client,
            txn,
            (&anchor, anchor_shard),
            &participants,
            Settled::Committed(commit_ts),
        );
        return Ok(Timestamp(commit_ts));
    };
    // A deadline of its own: the prepares may have used up the call's.
    match client.recover_txn(txn, &anchor, &client.deadline()).await {
        // The recovery resolved every participant and finished the record. The prepare that
        // set `c` may be one whose answer (and so its commit-wait) was lost.
        Ok(Settled::Committed(c)) => {
            if rules.commit_wait {
                // Committed for sure, but without the wait the caller could be told so before
                // every clock passed `c`: an error, then, naming what happened.
                client
                    .commit_wait(c, &client.deadline())
                    .await
                    .map_err(|error| Error::Ambiguous {
                        message: format!(
                            "a multi-shard commit was settled as committed at {c}, but its \
                             commit-wait failed ({error})"
                        ),
                    })?;
            }
            Ok(Timestamp(c))
        }
        Ok(Settled::Aborted) => {
            finish(
                client,
                txn,
                (&anchor, anchor_shard),
                &participants,
                Settled::Aborted,
            );
            Err(failure)
        }
        Ok(Settled::Forgotten) => Err(Error::Ambiguous {
            message: format!(
                "a multi-shard commit failed ({failure}) and its record was already collected \
                 (the transaction is older than the GC TTL); it may have committed"
            ),
        }),
        Err(error) => Err(Error::Ambiguous {
            message: format!(
                "a multi-shard commit failed ({failure}) and settling it failed too ({error}); \
                 it may have committed"
            ),
        }),
    }
}

/// In the background: after a commit, commits the record at the anchor (explicitly; it stops
/// if that does not answer `Committed`), resolves every other participant and finishes the
/// record (see `txn_recover`); after an abort, resolves every other participant.
fn finish(
    client: &Client,
    txn: (proto::WriteId, u64),
    (anchor, anchor_shard): (&Bytes, u64),
    participants: &[Participant],
    settled: Settled,
) {
    let others: Vec<Bytes> = participants
        .iter()
        .filter(|p| p.shard != anchor_shard)
        .map(|p| p.key.clone())
        .collect();
    let (task, anchor) = (client.clone(), anchor.clone());
    client.spawn_background("finish a multi-shard transaction", async move {
        let client = task;
        let deadline = client.deadline();
        let c = match settled {
            Settled::Committed(c) => c,
            Settled::Aborted | Settled::Forgotten => {
                let resolves = others
                    .iter()
                    .map(|key| client.resolve_txn(key, txn, false, Resolution::Abort, &deadline));
                for outcome in futures::future::join_all(resolves).await {
                    if let Err(error) = outcome {
                        tracing::debug!(%error, "resolving a participant failed; readers will");
                    }
                }
                return;
            }
        };
        let decided = client
            .resolve_txn(&anchor, txn, true, Resolution::Commit(c), &deadline)
            .await;
        match decided {
            Ok(d) if TxnState::try_from(d.state) == Ok(TxnState::Committed) => {}
            // A recovery finished the record and GC collected it: nothing is left to do.
            Ok(d) if TxnState::try_from(d.state) == Ok(TxnState::Forgotten) => return,
            Ok(d) => {
                tracing::error!(txn = ?txn.0, answer = ?d, "the anchor did not commit an implicitly committed transaction");
                return;
            }
            Err(error) => {
                tracing::debug!(%error, "the explicit commit failed; readers will recover the transaction");
                return;
            }
        }
        client
            .finish_committed(txn, &anchor, &others, c, &deadline)
            .await;
    });
}
