//! Stale reads (`BOUNDED_STALENESS`, `EXACT_STALENESS`): served by whichever replica the
//! client reached, leader or follower, when that replica's closed timestamp covers the read
//! (see `meridian_raft::closed_ts`); otherwise refused with `NOT_LEADER` and a hint, and the
//! client asks the leader.
//!
//! # What a stale read promises
//! The answer is the shard's state at the returned `read_ts`, and that state is final (every
//! write that will ever be applied at a version `<= read_ts` has been), so every stale read at
//! one `read_ts`, on any shards and replicas, belongs to one consistent snapshot. There is no
//! uncertainty window: a stale read may miss a write acknowledged shortly before it (that is
//! what stale means), never half of one. How stale:
//! - `BOUNDED_STALENESS{max_ms}`: a follower reads at its closed timestamp `C` if
//!   `now − C <= max_ms` on *its own* clock; so the real staleness is at most
//!   `max_ms + max_offset`. The leader reads fresh (a linearizable read meets every bound).
//! - `EXACT_STALENESS{ms}` reads at `now − ms` (the serving node's clock), `as_of_ts` at
//!   exactly that timestamp. A follower serves it once its closed timestamp covers it
//!   (waiting up to two publication intervals if it is about to); the leader serves any
//!   timestamp through the snapshot-read path (`kv_snapshot`) with an empty window.
//!
//! # On a follower, under the lock table's read guard (one applied state)
//! 1. `read_ts <= closed` (checked again: the decision was taken before the guard);
//! 2. `read_ts >= gc_threshold`, else `BELOW_GC_THRESHOLD`;
//! 3. no write intent prepared at or below `read_ts` on the keys or range, else `LOCKED`: it
//!    may commit at or below `read_ts` (a 2PC resolution writes at the transaction's commit
//!    timestamp, which can be below the closed one); the client retries at the leader, whose
//!    lock wait and recovery handle it. Read locks and intents prepared above do not matter.
//!
//! A follower read uses the shard table directly (`MultiRaft::get`), not `Node::replica`,
//! which counts the request as activity and wakes a quiesced group: follower reads of an idle
//! shard must leave it asleep.
//!
//! # Not done yet
//! - Replica choice is by region (the client's); no latency measurements.
//! - Bounded-staleness reads of several shards each pick their own `read_ts` (the client's
//!   stale transactions pin the first one); no negotiation of a common one.
//! - Follower reads inside read-write transactions.
//! - The metadata shard (0) is never read this way.

use crate::error::{invalid, Result, ServerError};
use crate::kv::{get_response, KvService};
use meridian_proto::kv::*;
use meridian_raft::issued::ReadSpan;
use meridian_raft::locks::{LockInfo, LockTable};
use meridian_raft::types::MAX_COMMAND_TS;
use meridian_raft::ShardReplica;
use meridian_storage::mvcc;
use meridian_types::{ShardId, Timestamp};
use openraft::type_config::async_runtime::WatchReceiver;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The largest staleness a request may ask for, in milliseconds (a day: far beyond any GC
/// TTL, so a larger one can only be a mistake).
pub const MAX_STALENESS_MS: u64 = 86_400_000;

/// How often a follower looks at its closed timestamp again while a read waits for it.
const CLOSE_POLL_MS: u64 = 10;

/// A stale read's mode, from the request's consistency and `Staleness`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum StaleMode {
    Bounded { max_ms: u64 },
    Exact { ms: u64 },
    AsOf(Timestamp),
}

/// What a follower does with a stale read, given its clock and closed timestamp.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Decision {
    Serve(Timestamp),
    /// The closed timestamp is about to cover it: wait (bounded), then decide again.
    Wait,
    Redirect,
}

/// The stale mode a request asks for, `None` for any other read. Each field of `Staleness`
/// belongs to one consistency, and exactly one may be set.
pub(crate) fn stale_mode(
    consistency: i32,
    staleness: Option<&Staleness>,
) -> Result<Option<StaleMode>> {
    let given = staleness
        .filter(|s| s.max_staleness_ms != 0 || s.exact_staleness_ms != 0 || s.as_of_ts != 0);
    let bounded = consistency == ReadConsistency::BoundedStaleness as i32;
    let exact = consistency == ReadConsistency::ExactStaleness as i32;
    let Some(s) = given else {
        return match (bounded, exact) {
            (true, _) => Err(invalid(
                "BOUNDED_STALENESS needs staleness.max_staleness_ms",
            )),
            (_, true) => Err(invalid(
                "EXACT_STALENESS needs staleness.exact_staleness_ms or staleness.as_of_ts",
            )),
            _ => Ok(None),
        };
    };
    if !bounded && !exact {
        return Err(invalid(
            "staleness is for BOUNDED_STALENESS or EXACT_STALENESS reads only",
        ));
    }
    let set = [s.max_staleness_ms, s.exact_staleness_ms, s.as_of_ts]
        .iter()
        .filter(|v| **v != 0)
        .count();
    if set > 1 {
        return Err(invalid(
            "set exactly one of staleness.max_staleness_ms, exact_staleness_ms and as_of_ts",
        ));
    }
    if s.max_staleness_ms > MAX_STALENESS_MS || s.exact_staleness_ms > MAX_STALENESS_MS {
        return Err(invalid(format!(
            "staleness over MAX_STALENESS_MS ({MAX_STALENESS_MS})"
        )));
    }
    if s.as_of_ts > MAX_COMMAND_TS {
        return Err(invalid(
            "staleness.as_of_ts is above the largest version timestamp",
        ));
    }
    match (bounded, s.max_staleness_ms) {
        (true, 0) => Err(invalid(
            "BOUNDED_STALENESS takes staleness.max_staleness_ms only",
        )),
        (true, max_ms) => Ok(Some(StaleMode::Bounded { max_ms })),
        (false, 0) if s.as_of_ts != 0 => Ok(Some(StaleMode::AsOf(Timestamp(s.as_of_ts)))),
        (false, 0) => Ok(Some(StaleMode::Exact {
            ms: s.exact_staleness_ms,
        })),
        (false, _) => Err(invalid(
            "EXACT_STALENESS takes staleness.exact_staleness_ms or as_of_ts, not max_staleness_ms",
        )),
    }
}

/// `ts` less `ms` milliseconds.
fn minus_ms(ts: Timestamp, ms: u64) -> Timestamp {
    Timestamp(ts.0.saturating_sub(Timestamp::from_physical_ms(ms).0))
}

/// A follower's decision (see the module docs); `now` is its clock, `closed` its closed
/// timestamp (0: none), `wait_ms` how far below the read the closed timestamp may be for the
/// read to wait for it rather than go to the leader.
pub(crate) fn decide(mode: StaleMode, now: Timestamp, closed: Timestamp, wait_ms: u64) -> Decision {
    if closed == Timestamp::ZERO {
        return Decision::Redirect;
    }
    let read_ts = match mode {
        StaleMode::Bounded { max_ms } => {
            let behind_ms = now.physical_ms().saturating_sub(closed.physical_ms());
            return if behind_ms <= max_ms {
                Decision::Serve(closed)
            } else {
                Decision::Redirect
            };
        }
        StaleMode::Exact { ms } => minus_ms(now, ms),
        StaleMode::AsOf(ts) => ts,
    };
    if read_ts <= closed {
        Decision::Serve(read_ts)
    } else if read_ts < now && read_ts.physical_ms() <= closed.physical_ms() + wait_ms {
        Decision::Wait
    } else {
        Decision::Redirect
    }
}

/// Where and how a stale read is served on this node.
#[derive(Clone, Copy, Debug)]
pub(crate) struct StaleRead {
    pub read_ts: Timestamp,
    /// Write intents prepared at or below this block the read.
    pub lock_bound: u64,
    /// Served from this replica's closed timestamp: recheck it under the guard.
    pub from_closed: bool,
}

impl KvService {
    /// This node's replica of `shard` for a stale read, without counting it as activity
    /// (which would wake a quiesced group) unless this node leads it.
    pub(crate) fn stale_replica(&self, shard: ShardId) -> Result<Arc<ShardReplica>> {
        if shard.is_meta() {
            return Err(invalid("the metadata shard serves no stale reads"));
        }
        let replica = self.node.host.get(shard).ok_or_else(|| {
            ServerError::WrongShard(format!(
                "shard {shard} has no replica on node {}",
                self.node.config.node_id
            ))
        })?;
        if replica.raft.is_leader() {
            return self.node.replica(shard);
        }
        Ok(replica)
    }

    /// Picks a stale read's timestamp on `replica` (see the module docs) for a read of `span`,
    /// or refuses it.
    pub(crate) async fn stale_read(
        &self,
        shard: ShardId,
        replica: &ShardReplica,
        mode: StaleMode,
        span: ReadSpan<'_>,
    ) -> Result<StaleRead> {
        let closed = || Timestamp(replica.sm.closed_ts());
        let served = |read_ts: Timestamp| StaleRead {
            read_ts,
            lock_bound: read_ts.0,
            from_closed: true,
        };
        if replica.raft.is_leader() {
            let linearizable = ReadConsistency::Linearizable as i32;
            let read_ts = match mode {
                StaleMode::Bounded { .. } => {
                    let read_ts = self.linearize(shard, replica, linearizable).await?;
                    return Ok(StaleRead {
                        read_ts,
                        lock_bound: u64::MAX,
                        from_closed: false,
                    });
                }
                StaleMode::Exact { ms } => minus_ms(self.node.clock.now(), ms),
                StaleMode::AsOf(ts) => ts,
            };
            if read_ts <= closed() {
                return Ok(served(read_ts));
            }
            // An empty uncertainty window: the snapshot path only makes `read_ts` final.
            let spec = TxnSnapshot {
                read_ts: read_ts.0,
                observed: Vec::new(),
                uncertainty_limit: read_ts.0,
            };
            // Waits only for in-flight writes to what the read covers (see `kv_snapshot`).
            let snap = self
                .snapshot(shard, replica, &spec, linearizable, span)
                .await?;
            return Ok(StaleRead {
                read_ts: snap.read_ts,
                lock_bound: snap.lock_bound(),
                from_closed: false,
            });
        }
        let wait_ms = 2 * self.node.config.cluster.closed_ts_interval_ms;
        let deadline = Instant::now() + Duration::from_millis(wait_ms);
        loop {
            match decide(mode, self.node.clock.now(), closed(), wait_ms) {
                Decision::Serve(read_ts) => return Ok(served(read_ts)),
                Decision::Wait if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(CLOSE_POLL_MS)).await;
                }
                Decision::Wait | Decision::Redirect => {
                    let leader = replica.raft.metrics().borrow_watched().current_leader;
                    return Err(self.node.not_leader(shard, leader).await);
                }
            }
        }
    }

    /// [`KvService::read_unlocked`] for a stale read: also refuses (`UNAVAILABLE`) if the
    /// replica's closed timestamp does not cover the read under the guard.
    pub(crate) async fn read_stale<T: Send + 'static>(
        &self,
        replica: &ShardReplica,
        read: StaleRead,
        locked: impl FnOnce(&LockTable) -> Option<LockInfo> + Send + 'static,
        f: impl FnOnce(&dyn meridian_storage::Engine, &LockTable) -> meridian_storage::Result<T>
            + Send
            + 'static,
    ) -> Result<T> {
        let read_ts = read.read_ts;
        let covered = move |table: &LockTable| !read.from_closed || read_ts.0 <= table.closed.ts();
        let out = self
            .read_unlocked(replica, read_ts, locked, move |e, table| {
                if !covered(table) {
                    return Ok(None);
                }
                f(e, table).map(Some)
            })
            .await?;
        out.ok_or_else(|| {
            ServerError::Unavailable(format!(
                "shard {}: closed timestamp does not cover {read_ts}",
                replica.shard
            ))
        })
    }

    pub(crate) async fn stale_get(&self, req: GetRequest, mode: StaleMode) -> Result<GetResponse> {
        let map = self.node.map();
        let desc = map.lookup(&req.key);
        crate::kv_check::check_route(desc, req.route.as_ref())?;
        let shard = desc.id;
        let replica = self.stale_replica(shard)?;
        let read = self
            .stale_read(
                shard,
                &replica,
                mode,
                ReadSpan::Keys(std::slice::from_ref(&req.key)),
            )
            .await?;
        let (key, probe, bound) = (req.key.clone(), req.key, read.lock_bound);
        let found = self
            .read_stale(
                &replica,
                read,
                move |locks| locks.write_intent(&probe, None, bound),
                move |e, _| mvcc::get(e, shard, &key, read.read_ts),
            )
            .await?;
        let mut reply = get_response(found, read.read_ts, shard);
        reply.served_by = self.node.config.node_id;
        Ok(reply)
    }

    /// A stale batch get of `keys`, all in `shard` (checked by the caller).
    pub(crate) async fn stale_batch_get(
        &self,
        shard: ShardId,
        keys: Vec<bytes::Bytes>,
        mode: StaleMode,
    ) -> Result<BatchGetResponse> {
        let replica = self.stale_replica(shard)?;
        let read = self
            .stale_read(shard, &replica, mode, ReadSpan::Keys(&keys))
            .await?;
        let keys = Arc::new(keys);
        let (probe, bound) = (keys.clone(), read.lock_bound);
        let found = self
            .read_stale(
                &replica,
                read,
                move |locks| {
                    probe
                        .iter()
                        .find_map(|k| locks.write_intent(k, None, bound))
                },
                move |e, _| {
                    let refs: Vec<&[u8]> = keys.iter().map(|k| &k[..]).collect();
                    mvcc::multi_get(e, shard, &refs, read.read_ts)
                },
            )
            .await?;
        let node_id = self.node.config.node_id;
        let results = found
            .into_iter()
            .map(|f| GetResponse {
                served_by: node_id,
                ..get_response(f, read.read_ts, shard)
            })
            .collect();
        Ok(BatchGetResponse {
            results,
            read_ts: read.read_ts.0,
            snapshot: None,
            served_by: node_id,
            lock: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(ms: u64) -> Timestamp {
        Timestamp::from_physical_ms(ms)
    }

    fn staleness(max: u64, exact: u64, as_of: u64) -> Staleness {
        Staleness {
            max_staleness_ms: max,
            exact_staleness_ms: exact,
            as_of_ts: as_of,
        }
    }

    /// Each staleness field fits one consistency; two at once, or a field with another
    /// consistency, is INVALID_ARGUMENT.
    #[test]
    fn staleness_fields_are_checked_against_the_consistency() {
        let bounded = ReadConsistency::BoundedStaleness as i32;
        let exact = ReadConsistency::ExactStaleness as i32;
        let linearizable = ReadConsistency::Linearizable as i32;
        assert_eq!(stale_mode(linearizable, None).unwrap(), None);
        assert_eq!(
            stale_mode(linearizable, Some(&staleness(0, 0, 0))).unwrap(),
            None
        );
        assert_eq!(
            stale_mode(bounded, Some(&staleness(5_000, 0, 0))).unwrap(),
            Some(StaleMode::Bounded { max_ms: 5_000 })
        );
        assert_eq!(
            stale_mode(exact, Some(&staleness(0, 4_000, 0))).unwrap(),
            Some(StaleMode::Exact { ms: 4_000 })
        );
        assert_eq!(
            stale_mode(exact, Some(&staleness(0, 0, 77))).unwrap(),
            Some(StaleMode::AsOf(Timestamp(77)))
        );
        for (consistency, s) in [
            (exact, staleness(0, 4_000, 77)),
            (bounded, staleness(5_000, 4_000, 0)),
            (bounded, staleness(0, 4_000, 0)),
            (exact, staleness(5_000, 0, 0)),
            (linearizable, staleness(5_000, 0, 0)),
            (bounded, staleness(MAX_STALENESS_MS + 1, 0, 0)),
            (exact, staleness(0, 0, u64::MAX)),
        ] {
            let e = stale_mode(consistency, Some(&s)).unwrap_err();
            assert!(matches!(e, ServerError::InvalidArgument(_)), "{s:?}: {e}");
        }
        assert!(
            stale_mode(exact, None).is_err(),
            "EXACT_STALENESS needs a field"
        );
        assert!(
            stale_mode(bounded, None).is_err(),
            "BOUNDED_STALENESS needs its bound"
        );
    }

    /// A follower serves at or below its closed timestamp, within the bound on its own clock,
    /// waits when the closed timestamp is about to cover the read, and redirects otherwise.
    #[test]
    fn a_follower_serves_waits_or_redirects() {
        let now = ts(100_000);
        let closed = ts(97_000);
        let decide = |mode| decide(mode, now, closed, 400);
        assert_eq!(
            decide(StaleMode::Bounded { max_ms: 3_000 }),
            Decision::Serve(closed)
        );
        assert_eq!(
            decide(StaleMode::Bounded { max_ms: 2_999 }),
            Decision::Redirect,
            "bound exceeded"
        );
        assert_eq!(
            decide(StaleMode::Exact { ms: 5_000 }),
            Decision::Serve(ts(95_000))
        );
        assert_eq!(
            decide(StaleMode::Exact { ms: 2_800 }),
            Decision::Wait,
            "closes within 400 ms"
        );
        assert_eq!(
            decide(StaleMode::Exact { ms: 1_000 }),
            Decision::Redirect,
            "too fresh"
        );
        assert_eq!(
            decide(StaleMode::AsOf(ts(96_000))),
            Decision::Serve(ts(96_000))
        );
        assert_eq!(
            decide(StaleMode::AsOf(ts(100_500))),
            Decision::Redirect,
            "ahead of the clock"
        );
        assert_eq!(
            super::decide(
                StaleMode::Bounded { max_ms: 60_000 },
                now,
                Timestamp::ZERO,
                400
            ),
            Decision::Redirect,
            "nothing closed yet"
        );
    }
}
