//! Snapshot reads: a transaction's `BatchGet` and `Scan` (and a multi-page plain scan's pages,
//! see the client's `multi`) at one timestamp on every shard.
//!
//! # What a snapshot read promises
//! A request carrying a [`TxnSnapshot`] is served at its `read_ts` (or, when that is 0, at
//! this node's clock after the read barrier, returned to the client to use on every other
//! shard). The answer is the shard's state at `read_ts`, and that state is final: every write
//! that will ever be applied to the shard at a version `<= read_ts` has been, before the read.
//! So reads of many shards at one `read_ts` together form one consistent snapshot, with no
//! commit-time check: a read-only transaction is serializable on its reads alone.
//!
//! # How (steps, in order)
//! 1. A given `read_ts` came from another node's clock: unless this node's HLC is already past
//!    it, wait, at most `max_offset`, until the physical clock passes it (a `read_ts` further
//!    ahead is `CLOCK_OFFSET`). The clock is never moved by it.
//! 2. The linearizable read barrier (lease or ReadIndex): this node leads the shard and has
//!    applied every entry committed before the request — in particular every entry of earlier
//!    terms. Its clock reading after the barrier is the *observed* timestamp.
//! 3. [`Issued::settle`]: every proposal this leader issued at or below `read_ts` that may
//!    write what the read reads (its keys, or its scan's range) is applied (or failed),
//!    resolutions excepted (their intents answer for them: a read meets one and answers
//!    `LOCKED`, see `meridian_raft::issued`); everything it issues from now on is above
//!    `read_ts`.
//! 4. The lease must still be held (else one more ReadIndex round): no other leader was
//!    elected before step 3 finished, and the next one issues above `read_ts` (it issues
//!    nothing until `max_offset` after it began the term, see `meridian_raft::issued`). Held
//!    means both: the last quorum acknowledgement is young enough (`lease_has_margin`, with
//!    its drift margin), and openraft's core grants a lease read now, which it refuses while a
//!    leader transfer is under way (the target may be elected while the followers' leases
//!    still run, so the acknowledgement's age alone does not show that no one else leads).
//!    A request that asked for `LINEARIZABLE_READ_INDEX` gets a second ReadIndex round here
//!    instead: its client does not trust clock rates, so no step of its read rests on a lease.
//!
//! # Uncertainty
//! `read_ts` came from one node's clock; a write acknowledged before the transaction began
//! may carry a timestamp up to `max_offset` above it (another node's clock). Versions in the
//! window `(read_ts, window_end]` are therefore *uncertain*: the reply names the newest one
//! (`uncertain_ts`) instead of answering, and the client restarts the transaction at that
//! timestamp. `window_end = min(limit, first_seen)` (widened for resolved intents, see below):
//! `limit` is the transaction's first
//! `read_ts + max_offset` (kept across its restarts), `first_seen` this node's clock reading the
//! transaction took first (carried in the request; raised to the HLC reading at this node's
//! first read barrier as leader of the current term, since versions an earlier leader
//! acknowledged may have reached this node only after that reading), or this request's own.
//! Every version acknowledged before the transaction began and applied here is at or below such
//! a reading (the barrier applied it, and apply merges versions into the clock), so newer
//! versions were written after the transaction began and cannot be uncertain. A transaction
//! whose `read_ts` this node picked, after its barrier, has an empty window here.
//!
//! # Prepared locks and resolved intents
//! A multi-shard transaction's write is first a lock (a prepared intent, see
//! `meridian_raft::locks`), then a version at its commit timestamp `C`, which came from
//! whichever participant's clock was furthest ahead, and which is applied here when the
//! transaction is resolved — possibly after this node's reading above was taken. So:
//! - a read that meets an intent prepared at or below the window's unwidened end
//!   `max(read_ts, min(first_seen, limit))` answers `LOCKED` (it may commit at a timestamp
//!   the read must see, or one it must treat as uncertain); the client waits for it to be
//!   resolved and reads again. An intent prepared above that commits above `read_ts` (so it is
//!   invisible) and, prepared after the transaction's first look at this node or committing
//!   above the limit, is never made uncertain by the widening below: the read ignores it;
//! - the window also reaches up to the largest `C` in `(read_ts, limit]` of the intents this
//!   replica resolved that were *prepared* at or before `first_seen`
//!   (`meridian_raft::resolutions`): such a transaction may have committed before this one
//!   began, so its version is uncertain or visible, never skipped as "written after the
//!   transaction began". One prepared after `first_seen` committed after this transaction
//!   first looked at the node, and is skipped like any later write. The widening is computed
//!   under the lock table's read guard in the same read as the data, so a resolution applied
//!   between the barrier and the read is not missed.
//!
//! # What this does not give
//! A *causal reverse* across shards is possible while clocks are skewed (as in CockroachDB):
//! a write to one shard stamped above `read_ts` by a fast clock, acknowledged, then a write to
//! another shard stamped below `read_ts` by a slow clock; a transaction reading both at
//! `read_ts` sees the second and not the first. Every write acknowledged before the
//! transaction *began* is seen; the order of two writes that both finished after it began is
//! not guaranteed to agree with real time across shards. With clocks in step (one host) no
//! stamp is out of real-time order, and a writer's commit-wait (`CommitRequest.commit_wait`,
//! see `kv_txn`) rules the reverse out: its answer waits until every clock has passed its
//! commit timestamp, so no write that begins after it is stamped below it.
//!
//! # Not done yet
//! - Writes in the first `max_offset` of a leader's term wait for it to end (see
//!   `meridian_raft::issued`).

use crate::error::{invalid, Result, ServerError};
use crate::kv::{get_response, KvService};
use meridian_proto::kv::{LockReply, LockRequest, ReadConsistency, SnapshotReply, TxnSnapshot};
use meridian_raft::issued::{ReadSpan, SettleError};
use meridian_raft::locks::LockTable;
use meridian_raft::ShardReplica;
use meridian_storage::uncertainty;
use meridian_types::limits::{
    EARLY_LOCK_WAIT_MAX_MS, MAX_OBSERVED_NODES, SNAPSHOT_SETTLE_TIMEOUT_MS,
};
use meridian_types::{ShardId, Timestamp, TxnRank};
use openraft::type_config::async_runtime::WatchReceiver;
use openraft::ReadPolicy;
use std::time::{Duration, Instant};

/// A snapshot read made ready on one shard.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Snapshot {
    pub read_ts: Timestamp,
    /// The uncertainty window is `(read_ts, window_end]`, widened for resolved intents
    /// ([`Snapshot::window_end_with`]).
    pub window_end: Timestamp,
    /// The transaction's first reading of this node (see the module docs).
    pub first_seen: Timestamp,
    /// This node's clock reading after the read barrier.
    pub observed: Timestamp,
    /// The transaction's uncertainty limit (first `read_ts + max_offset`).
    pub limit: Timestamp,
}

impl Snapshot {
    /// The window's end with the intents this replica resolved: those prepared before the
    /// transaction first saw this node may have committed before it began, at a timestamp
    /// from another node's clock (see `meridian_raft::resolutions`). Call it under the lock
    /// table's read guard, in the same read as the data.
    pub fn window_end_with(&self, table: &LockTable) -> Timestamp {
        let widened = table
            .resolutions
            .widen(self.read_ts.0, self.limit.0, self.first_seen.0)
            .map_or(Timestamp::ZERO, Timestamp);
        self.window_end.max(widened)
    }

    /// The intents this read must wait for: those prepared at or below this (the unwidened
    /// window's end, see the module docs); any other commits invisibly to it.
    pub fn lock_bound(&self) -> u64 {
        self.window_end.0
    }

    /// The reply's snapshot part; `uncertain` is the newest version found in the window.
    pub fn reply(&self, node_id: u64, uncertain: Option<Timestamp>) -> SnapshotReply {
        SnapshotReply {
            node_id,
            observed_ts: self.observed.0,
            uncertain_ts: uncertain.map_or(0, |t| t.0),
            uncertainty_limit: self.limit.0,
        }
    }
}

fn current_term(replica: &ShardReplica) -> u64 {
    replica.raft.metrics().borrow_watched().current_term
}

/// The shard's leader as this replica knows it, and its term.
pub(crate) fn leadership(replica: &ShardReplica) -> (Option<u64>, u64) {
    let metrics = replica.raft.metrics();
    let m = metrics.borrow_watched();
    (m.current_leader, m.current_term)
}

impl KvService {
    /// Steps 1–4 of the module docs: after it returns, the shard's state at `read_ts` is final
    /// for what `span` reads. `consistency` chooses both barriers as for plain reads (lease or
    /// ReadIndex).
    pub(crate) async fn snapshot(
        &self,
        shard: ShardId,
        replica: &ShardReplica,
        spec: &TxnSnapshot,
        consistency: i32,
        span: ReadSpan<'_>,
    ) -> Result<Snapshot> {
        self.snapshot_precheck(spec).await?;
        let requested = Timestamp(spec.read_ts);
        let term_before = current_term(replica);
        let observed = self.linearize(shard, replica, consistency).await?;
        let led_since = replica
            .issued
            .led_since(term_before, current_term(replica), observed.0);
        let max_offset =
            Timestamp::from_physical_ms(self.node.clock.max_offset().as_millis() as u64);
        let read_ts = if requested == Timestamp::ZERO {
            observed
        } else {
            requested
        };
        let limit = match spec.uncertainty_limit {
            0 => Timestamp(read_ts.0.saturating_add(max_offset.0)),
            given => Timestamp(given),
        };
        let first_seen = if requested == Timestamp::ZERO {
            // Picked here, after the barrier: nothing acknowledged before is above it.
            read_ts
        } else {
            // The transaction's first reading of this node counts only if this node has led
            // the shard since before it; otherwise the start of its leadership does.
            let node_id = self.node.config.node_id;
            spec.observed
                .iter()
                .find(|o| o.node_id == node_id && o.ts != 0)
                .map_or(observed, |o| Timestamp(o.ts.max(led_since)))
        };
        // Widened under the lock table's guard for resolved intents (`window_end_with`).
        let window_end = limit.min(first_seen).max(read_ts);
        let deadline = Instant::now() + Duration::from_millis(SNAPSHOT_SETTLE_TIMEOUT_MS);
        match replica
            .issued
            .settle(&self.node.clock, read_ts.0, &span, deadline)
            .await
        {
            Ok(()) => {}
            Err(SettleError::ClockBehind { now, read_ts }) => {
                return Err(ServerError::Unavailable(format!(
                    "shard {shard}: this node's clock ({}) is not past the snapshot ({})",
                    Timestamp(now),
                    Timestamp(read_ts)
                )))
            }
            Err(SettleError::Timeout { oldest }) => {
                return Err(ServerError::Unavailable(format!(
                    "shard {shard}: a write issued at {} was still in flight after {SNAPSHOT_SETTLE_TIMEOUT_MS} ms",
                    Timestamp(oldest)
                )))
            }
        }
        // A client that asked for ReadIndex does not trust clock rates: a second round.
        let lease_held = crate::kv_read::lease_allowed(consistency)
            && replica.lease_has_margin()
            && replica
                .raft
                .get_read_log_id(ReadPolicy::LeaseRead)
                .await
                .is_ok();
        if lease_held {
            self.node.read_barriers.count(&ReadPolicy::LeaseRead);
        } else {
            let read_index = ReadConsistency::LinearizableReadIndex as i32;
            self.linearize(shard, replica, read_index).await?;
        }
        Ok(Snapshot {
            read_ts,
            window_end,
            first_seen,
            observed,
            limit,
        })
    }

    /// Step 1 and the request's own checks: what can refuse a snapshot read before it
    /// touches the shard (so before a locking read takes locks).
    async fn snapshot_precheck(&self, spec: &TxnSnapshot) -> Result<()> {
        if spec.observed.len() > MAX_OBSERVED_NODES {
            return Err(invalid(format!(
                "{} observed timestamps, over MAX_OBSERVED_NODES ({MAX_OBSERVED_NODES})",
                spec.observed.len()
            )));
        }
        let requested = Timestamp(spec.read_ts);
        if requested != Timestamp::ZERO && self.node.clock.now() <= requested {
            self.wait_past(requested, "snapshot read_ts").await?;
        }
        Ok(())
    }

    /// A snapshot `BatchGet` of `keys`, all in `shard`.
    pub(crate) async fn snapshot_batch_get(
        &self,
        shard: ShardId,
        replica: &ShardReplica,
        keys: Vec<bytes::Bytes>,
        spec: &TxnSnapshot,
        consistency: i32,
        lock: Option<LockRequest>,
    ) -> Result<meridian_proto::kv::BatchGetResponse> {
        let locked = match lock {
            Some(lock) => {
                self.snapshot_precheck(spec).await?;
                Some(self.early_lock(shard, replica, &keys, lock).await?)
            }
            None => None,
        };
        let snap = self
            .snapshot(shard, replica, spec, consistency, ReadSpan::Keys(&keys))
            .await?;
        // A locking read at a given timestamp: any newer version of its keys would fail the
        // commit, so it restarts the transaction there instead (as an uncertain read does).
        let refresh = locked.is_some() && spec.read_ts != 0;
        let node_id = self.node.config.node_id;
        let keys = std::sync::Arc::new(keys);
        let probe = keys.clone();
        let (found, uncertain) = self
            .read_unlocked(
                replica,
                snap.read_ts,
                // An intent prepared at or below the bound may commit at a timestamp it must
                // see or count as uncertain (see the module docs).
                move |locks| {
                    probe
                        .iter()
                        .find_map(|k| locks.write_intent(k, None, snap.lock_bound()))
                },
                move |e, table| {
                    let refs: Vec<&[u8]> = keys.iter().map(|k| &k[..]).collect();
                    let (found, uncertain) = uncertainty::multi_get_in_window(
                        e,
                        shard,
                        &refs,
                        snap.read_ts,
                        match refresh {
                            true => Timestamp::MAX,
                            false => snap.window_end_with(table),
                        },
                    )?;
                    // An uncertain read answers nothing.
                    Ok(match uncertain {
                        Some(_) => (Vec::new(), uncertain),
                        None => (found, None),
                    })
                },
            )
            .await?;
        if refresh && uncertain.is_some() {
            let stats = &self.node.early_locks.stats;
            stats
                .refreshes
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        Ok(meridian_proto::kv::BatchGetResponse {
            results: found
                .into_iter()
                .map(|f| get_response(f, snap.read_ts, shard))
                .collect(),
            read_ts: snap.read_ts.0,
            snapshot: Some(snap.reply(node_id, uncertain)),
            served_by: node_id,
            lock: locked,
        })
    }

    /// Takes the early locks a locking read asks for (see `kv_early_lock`), before its
    /// snapshot: on a node that does not lead the shard, none (its barrier then answers
    /// `NOT_LEADER`).
    async fn early_lock(
        &self,
        shard: ShardId,
        replica: &ShardReplica,
        keys: &[bytes::Bytes],
        lock: LockRequest,
    ) -> Result<LockReply> {
        let owner = crate::kv::request_id(lock.owner)
            .ok_or_else(|| invalid("lock.owner needs a non-zero client_id"))?;
        if lock.age_ts == 0 || lock.age_ts > meridian_raft::types::MAX_COMMAND_TS {
            return Err(invalid(
                "lock.age_ts (the timestamp of the transaction's first attempt) must be set \
                 and at most MAX_COMMAND_TS",
            ));
        }
        let rank = TxnRank {
            priority: lock.priority,
            age_ts: lock.age_ts,
        };
        let (leader, term) = leadership(replica);
        if leader != Some(self.node.config.node_id) {
            return Ok(LockReply {
                held: vec![false; keys.len()],
                ..Default::default()
            });
        }
        let wait = Duration::from_millis(u64::from(lock.wait_ms).min(EARLY_LOCK_WAIT_MAX_MS));
        Ok(self
            .node
            .early_locks
            .acquire(shard, term, owner, rank, keys, wait)
            .await)
    }
}
