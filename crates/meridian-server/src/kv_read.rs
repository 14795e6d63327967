//! The read side of the `Kv` service shared by every read path: the wait for a causality
//! token, the linearizable read barrier (lease or ReadIndex) and the read of a shard's data
//! under its lock table's guard. The reasons are in `kv`'s module docs ("Reads", "Causality
//! tokens"); moved here from `kv.rs` unchanged when stale reads (`kv_follower`) were added.

use crate::error::{invalid, Result, ServerError};
use crate::kv::KvService;
use crate::shard_map::ShardDescriptor;
use meridian_proto::kv::ReadConsistency;
use meridian_raft::locks::{LockInfo, LockTable};
use meridian_raft::ShardReplica;
use meridian_types::{ShardId, Timestamp};
use openraft::ReadPolicy;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tonic::Request;

/// How many read barriers this node's leaders passed for client reads, by kind (the
/// `meridian_read_barriers_total` metric). Parked-lease reads are counted by the host.
#[derive(Debug, Default)]
pub struct ReadBarriers {
    /// Leadership confirmed by the leader's lease (no round).
    pub lease: AtomicU64,
    /// Leadership confirmed by a ReadIndex quorum round.
    pub read_index: AtomicU64,
}

impl ReadBarriers {
    pub(crate) fn count(&self, policy: &ReadPolicy) {
        let counter = match policy {
            ReadPolicy::LeaseRead => &self.lease,
            ReadPolicy::ReadIndex => &self.read_index,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// Whether a read at `consistency` may rest on a lease: any but `LINEARIZABLE_READ_INDEX`,
/// whose client does not trust clock rates and asks for quorum rounds only.
pub(crate) fn lease_allowed(consistency: i32) -> bool {
    consistency != ReadConsistency::LinearizableReadIndex as i32
}

/// Most sleeps a request spends waiting for the clock to pass its causality token.
const MAX_TOKEN_WAITS: u32 = 8;

impl KvService {
    /// Waits until this node's clock has passed the request's causality token (see the module
    /// docs); never moves the clock.
    pub(crate) async fn wait_for_token<T>(&self, request: &Request<T>) -> Result<()> {
        let Some(raw) = request.metadata().get(meridian_types::error::HLC_HEADER) else {
            return Ok(());
        };
        let token = raw
            .to_str()
            .ok()
            .and_then(|s| s.parse::<u64>().ok())
            .map(Timestamp)
            .ok_or_else(|| invalid("malformed meridian-hlc metadata: want a decimal u64"))?;
        self.wait_past(token, "causality token").await
    }

    /// Waits (at most `max_offset`) until this node's physical clock has passed `ts`, a
    /// timestamp from another node's clock (`what` names it in errors); never moves the clock.
    pub(crate) async fn wait_past(&self, ts: Timestamp, what: &str) -> Result<()> {
        self.wait_clock_past(ts, 0, what).await
    }

    /// Commit-wait (`CommitRequest.commit_wait`): waits until this node's physical clock is
    /// more than `max_offset` past `commit_ts`, so that every clock within `max_offset` of this
    /// one has passed it. At most `2 x max_offset`: a commit timestamp is never more than
    /// `max_offset` ahead of a correct node's clock.
    pub(crate) async fn commit_wait_on(&self, commit_ts: Timestamp) -> Result<()> {
        let max_offset_ms = self.node.clock.max_offset().as_millis() as u64;
        self.wait_clock_past(commit_ts, max_offset_ms, "commit timestamp")
            .await
    }

    /// Waits until this node's physical clock is more than `margin_ms` past `ts`; an error if
    /// that is more than `max_offset + margin_ms` away.
    async fn wait_clock_past(&self, ts: Timestamp, margin_ms: u64, what: &str) -> Result<()> {
        let clock = &self.node.clock;
        let max_offset_ms = clock.max_offset().as_millis() as u64;
        // A millisecond over, so that passing `target` is passing `ts + margin` whatever the
        // logical bits of `ts`; none for a plain wait, which compares with `ts` itself.
        let over_ms = margin_ms + u64::from(margin_ms > 0);
        let target = match over_ms {
            0 => ts,
            _ => Timestamp::from_physical_ms(ts.physical_ms() + over_ms),
        };
        let ahead_ms = |now: Timestamp| target.physical_ms().saturating_sub(now.physical_ms());
        let first = ahead_ms(clock.physical_now()).saturating_sub(over_ms);
        if first > max_offset_ms {
            return Err(ServerError::ClockOffset(format!(
                "{what} {} is {first} ms ahead of this node's clock, beyond max_offset {max_offset_ms} ms",
                ts.0
            )));
        }
        // Bounded: the physical clock advances, and the first wait covers the whole gap.
        for _ in 0..MAX_TOKEN_WAITS {
            if clock.physical_now() > target {
                return Ok(());
            }
            let ahead = ahead_ms(clock.physical_now()).max(1);
            tokio::time::sleep(std::time::Duration::from_millis(ahead)).await;
        }
        Err(ServerError::Unavailable(format!(
            "clock did not pass the {what} in time"
        )))
    }

    /// The shard owning `key` and this node's replica of it, for a linearizable point read
    /// (see [`Self::route_shard_read`]).
    pub(crate) fn route_read(
        &self,
        key: &[u8],
        consistency: i32,
    ) -> Result<(ShardDescriptor, Arc<ShardReplica>, bool)> {
        let desc = self.node.map().lookup(key).clone();
        let (replica, parked) = self.route_shard_read(desc.id, consistency)?;
        Ok((desc, replica, parked))
    }

    /// This node's replica of `shard`, for a linearizable read (a point read, a batch read or
    /// a scan page, none in a transaction) at `consistency`, which may use a lease unless it
    /// is `LINEARIZABLE_READ_INDEX` (that asks for a quorum round). Without waking the shard or counting as its activity, a
    /// leader serves the read on its parked lease (the second value is true: no Raft round;
    /// see `meridian_raft::parked_promise`) or, awake or parked, on its openraft lease while
    /// that has margin. So a read load alone lets a shard quiesce, and its reads move from the
    /// one lease to the other as it parks. Anything else (a follower, no lease) wakes the
    /// shard first, as every other request does. Either lease covers the whole shard, so what
    /// holds for one key holds for a batch or a range of them.
    pub(crate) fn route_shard_read(
        &self,
        shard: ShardId,
        consistency: i32,
    ) -> Result<(Arc<ShardReplica>, bool)> {
        if let Some(replica) = self
            .node
            .host
            .get(shard)
            .filter(|_| lease_allowed(consistency))
        {
            if self.node.host.serves_parked_read(&replica) {
                return Ok((replica, true));
            }
            if replica.raft.is_leader() && replica.lease_has_margin() {
                return Ok((replica, false));
            }
        }
        Ok((self.node.replica(shard)?, false))
    }

    /// The timestamp of a plain linearizable read on `replica`, routed by
    /// [`Self::route_shard_read`]: on a parked lease, now (no round); otherwise as
    /// [`Self::linearize`] decides.
    pub(crate) async fn plain_read_ts(
        &self,
        shard: ShardId,
        replica: &ShardReplica,
        parked: bool,
        consistency: i32,
    ) -> Result<Timestamp> {
        if parked {
            self.read_ts_now(replica)
        } else {
            self.linearize(shard, replica, consistency).await
        }
    }

    /// The timestamp of a linearizable read once the replica's leadership is confirmed (by a
    /// lease, a quorum round or a parked lease): now, or the applied floor if above.
    pub(crate) fn read_ts_now(&self, replica: &ShardReplica) -> Result<Timestamp> {
        let read_ts = self.node.clock.now().max(replica.sm.applied_floor());
        self.check_ceiling(read_ts)?;
        Ok(read_ts)
    }

    /// Makes a read on `replica` linearizable; returns the timestamp to read at.
    pub(crate) async fn linearize(
        &self,
        shard: ShardId,
        replica: &ShardReplica,
        consistency: i32,
    ) -> Result<Timestamp> {
        let policy = if lease_allowed(consistency) && replica.lease_has_margin() {
            ReadPolicy::LeaseRead
        } else {
            ReadPolicy::ReadIndex
        };
        // Only a quorum round waits on a heartbeat; a lease read must not hurry the node's
        // coalesced heartbeats (see `meridian_raft::heartbeat_batch::Urgent`).
        let mut result = if policy == ReadPolicy::ReadIndex {
            replica.ensure_linearizable(policy.clone()).await
        } else {
            replica.raft.ensure_linearizable(policy.clone()).await
        };
        let mut passed = policy.clone();
        if result.is_err() && policy == ReadPolicy::LeaseRead && replica.raft.is_leader() {
            // The lease is not valid (e.g. right after election): confirm with a quorum round.
            result = replica.ensure_linearizable(ReadPolicy::ReadIndex).await;
            passed = ReadPolicy::ReadIndex;
        }
        match result {
            Ok(_) => {
                self.node.read_barriers.count(&passed);
                self.read_ts_now(replica)
            }
            Err(e) => {
                if let Some(f) = e.forward_to_leader() {
                    return Err(self.node.not_leader(shard, f.leader_id).await);
                }
                Err(ServerError::Unavailable(format!(
                    "shard {shard}: cannot confirm leadership: {e}"
                )))
            }
        }
    }

    /// Reads the shard's data at `read_ts` with `f` unless `read_ts` is below the shard's GC
    /// threshold (then `BELOW_GC_THRESHOLD`: versions it needs may be gone) or `locked` finds
    /// a lock in `replica`'s lock table that the read must wait for (then `LOCKED`). The lock
    /// table's read guard is held across all three, so they see one applied state (see
    /// `meridian_raft::state_machine`; a GC page raises the threshold under the write guard).
    /// A read on a replica retired meanwhile answers `UNAVAILABLE` (its data may be gone).
    pub(crate) async fn read_unlocked<T: Send + 'static>(
        &self,
        replica: &ShardReplica,
        read_ts: Timestamp,
        locked: impl FnOnce(&LockTable) -> Option<LockInfo> + Send + 'static,
        f: impl FnOnce(&dyn meridian_storage::Engine, &LockTable) -> meridian_storage::Result<T>
            + Send
            + 'static,
    ) -> Result<T> {
        let (engine, shard) = (self.node.engine.clone(), replica.sm.shard());
        let table = replica.sm.locks();
        let out = tokio::task::spawn_blocking(move || {
            let table = table.read().unwrap_or_else(|p| p.into_inner());
            if read_ts.0 < table.gc_threshold {
                return Ok(Err(ServerError::BelowGcThreshold(format!(
                    "shard {}: read at {read_ts} is below its GC threshold {}",
                    shard,
                    Timestamp(table.gc_threshold)
                ))));
            }
            if let Some(lock) = (!table.is_empty()).then(|| locked(&table)).flatten() {
                return Ok(Err(ServerError::Locked(lock)));
            }
            f(&*engine, &table).map(Ok)
        })
        .await
        .map_err(|e| ServerError::Internal(e.to_string()))?
        .map_err(|e| ServerError::Internal(format!("storage: {e}")))?;
        // A replica retired while this read ran (`meridian_raft::retire`) may have had its
        // data deleted under it: the read goes key by key, so it may have seen part of the
        // shard empty. Retiring takes the replica out of the node's table before deleting, so
        // a read that saw deleted data finds it gone here and answers nothing (retryable).
        let hosted = self
            .node
            .host
            .get(shard)
            .is_some_and(|r| std::ptr::eq(Arc::as_ptr(&r), replica));
        if !hosted {
            return Err(ServerError::Unavailable(format!(
                "shard {shard}: this node's replica left the shard during the read"
            )));
        }
        out
    }
}
