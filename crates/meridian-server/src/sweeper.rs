//! The node's transaction sweeper: settles multi-shard transactions whose coordinator went
//! away after preparing, without waiting for a reader to meet their locks.
//!
//! # What
//! Every half `cluster.txn_sweep_after_ms` (0 = off), for each data shard this node leads,
//! every prepared transaction in the shard's lock table whose prepare timestamp is more than
//! `txn_sweep_after_ms` behind this node's clock is *settled*, at most [`SWEEP_BATCH`] per
//! shard per pass: recovered as a reader that waited its lock out would (see
//! `meridian-client`'s `txn_recover`) — committed if every participant had prepared, aborted
//! otherwise; a committed one has every participant resolved and its record finished, so GC
//! collects it — and the lock's shard resolved as settled.
//!
//! # Why
//! A coordinator normally resolves its locks within a few consensus rounds of its commit. One
//! that dies after its acknowledgement (or before deciding) leaves locks that every reader
//! meeting them waits out for `LOCK_RECOVER_AFTER` (1 s) before recovering the transaction
//! itself, and a committed record that stays unfinished (never collected) until then. The
//! sweeper bounds both by `txn_sweep_after_ms` without any reader.
//!
//! # How, and why it is safe
//! Recovery is a protocol over several shards' Raft logs (abort at the anchor, prevent on the
//! other participants, decide), so the sweeper runs the client's own code, through an
//! in-process [`meridian_client::Client`] that dials this node's client address. Recovery is
//! safe whoever runs it and whenever (see `meridian-raft`'s `locks`): it commits an implicitly
//! committed transaction at the timestamp its coordinator acknowledged, and it aborts only a
//! transaction that can no longer commit; a live but slow coordinator's commit then fails as a
//! conflict and its transaction runs again. The age (10 s by default) is far beyond a healthy
//! commit, even across regions.
//!
//! # Records nothing leads to
//! A committed record whose coordinator stopped after resolving every participant but before
//! finishing it holds no lock, so neither a reader nor the lock table leads to it. The GC pass
//! over the shard's records (`gc`) meets it anyway: once its transaction started below the
//! GC threshold, the pass reports it stuck (`meridian-raft`'s `StuckRecord`) and queues it
//! here ([`StuckQueue`], bounded); the next sweep finishes it (a recovery: every participant
//! resolved at the commit timestamp, the record finished), and the GC pass after that
//! collects it. No index by age is kept: the record GC's scan, which already reads every
//! record, is the index. Such a record is so finished within about `gc_ttl_ms` plus two GC
//! intervals, and meanwhile costs only its bytes.
//!
//! # Not done yet
//! - Settles run one at a time per node; a node that leads many shards with many abandoned
//!   transactions takes several passes.

use crate::node::Node;
use bytes::Bytes;
use meridian_client::{Client, ClientConfig, LockInfo};
use meridian_raft::locks::{TxnId, TxnLocks};
use meridian_raft::{ShardReplica, StuckRecord};
use meridian_types::{ShardId, Timestamp};
use openraft::type_config::async_runtime::WatchReceiver;
use std::collections::VecDeque;
use std::sync::Mutex;
use std::sync::{Arc, Weak};
use std::time::Duration;

/// Most transactions one pass settles per shard.
pub const SWEEP_BATCH: usize = 64;
/// Most stuck records queued for the sweeper; GC passes drop the others (a later pass meets
/// them again).
pub const MAX_STUCK_QUEUED: usize = 1_024;
/// The shortest pause between passes.
const MIN_INTERVAL: Duration = Duration::from_millis(100);

/// Starts the node's sweeper loop, which ends when the node is dropped (`txn_sweep_after_ms =
/// 0`: no loop).
pub(crate) fn spawn(node: &Arc<Node>) {
    let after_ms = node.config.cluster.txn_sweep_after_ms;
    if after_ms == 0 {
        tracing::info!("the transaction sweeper is off (cluster.txn_sweep_after_ms = 0)");
        return;
    }
    let interval = Duration::from_millis(after_ms / 2).max(MIN_INTERVAL);
    let weak: Weak<Node> = Arc::downgrade(node);
    tokio::spawn(async move {
        let mut client: Option<Client> = None;
        loop {
            tokio::time::sleep(interval).await;
            let Some(node) = weak.upgrade() else { return };
            if !node.stuck.is_empty() {
                if client.is_none() {
                    client = connect(&node).await;
                }
                if let Some(client) = &client {
                    finish_stuck(&node, client).await;
                }
            }
            for replica in node.host.replicas() {
                if replica.shard.is_meta() {
                    continue;
                }
                let due = due_locks(&node, &replica, after_ms);
                if due.is_empty() {
                    continue;
                }
                if client.is_none() {
                    client = connect(&node).await;
                }
                let Some(client) = &client else { break };
                for lock in due {
                    match client.settle_lock(&lock).await {
                        Ok(()) => {
                            tracing::info!(shard = %replica.shard, txn = ?lock.txn, "swept an abandoned transaction")
                        }
                        Err(error) => {
                            tracing::debug!(shard = %replica.shard, txn = ?lock.txn, %error, "settling an abandoned transaction failed; the next pass retries")
                        }
                    }
                }
            }
        }
    });
}

/// Stuck records (see the module docs) GC passes found, waiting for the sweeper.
#[derive(Default)]
pub struct StuckQueue(Mutex<VecDeque<(ShardId, StuckRecord)>>);

impl StuckQueue {
    /// Queues `found` (from a GC pass over `shard`), skipping those queued already, up to
    /// [`MAX_STUCK_QUEUED`].
    pub fn offer(&self, shard: ShardId, found: Vec<StuckRecord>) {
        let mut queue = self.0.lock().unwrap_or_else(|p| p.into_inner());
        for record in found {
            if queue.len() >= MAX_STUCK_QUEUED {
                return;
            }
            if !queue.iter().any(|(_, r)| r.txn == record.txn) {
                queue.push_back((shard, record));
            }
        }
    }

    pub fn len(&self) -> usize {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Takes up to `n` queued records.
    fn take(&self, n: usize) -> Vec<(ShardId, StuckRecord)> {
        let mut queue = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let n = n.min(queue.len());
        queue.drain(..n).collect()
    }
}

/// Finishes up to [`SWEEP_BATCH`] queued stuck records.
async fn finish_stuck(node: &Node, client: &Client) {
    for (shard, record) in node.stuck.take(SWEEP_BATCH) {
        let Some(desc) = node.map().get(shard).cloned() else {
            continue;
        };
        // Any key of the anchor's shard routes the recovery there; the first shard's range
        // starts at the empty key, which is not a key.
        let anchor = if desc.start.is_empty() {
            Bytes::from_static(b"\0")
        } else {
            Bytes::from(desc.start)
        };
        let txn = meridian_client::proto::WriteId {
            client_id: record.txn.client_id,
            seq: record.txn.seq,
        };
        match client
            .finish_stuck_record(&anchor, txn, record.txn_ts)
            .await
        {
            Ok(true) => {
                tracing::info!(%shard, txn = ?record.txn, commit_ts = %Timestamp(record.commit_ts), "finished a committed record nothing led to")
            }
            Ok(false) => {
                tracing::debug!(%shard, txn = ?record.txn, "a stuck record's participants did not all answer; a later GC pass finds it again")
            }
            Err(error) => {
                tracing::debug!(%shard, txn = ?record.txn, %error, "finishing a stuck record failed; a later GC pass finds it again")
            }
        }
    }
}

/// A client of this node's own client address (the cluster's other nodes are learnt from its
/// shard map); `None` if it cannot connect yet (the next pass retries).
async fn connect(node: &Node) -> Option<Client> {
    let mut addr = node.config.client_addr;
    if addr.ip().is_unspecified() {
        addr.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
    }
    let mut config = ClientConfig::new(vec![addr.to_string()]);
    config.region = Some(node.config.region.clone());
    match Client::connect(config).await {
        Ok(client) => Some(client),
        Err(error) => {
            tracing::debug!(%error, "the sweeper's client could not connect yet");
            None
        }
    }
}

/// The locks on `replica` older than `after_ms`, one per transaction, if this node leads it.
fn due_locks(node: &Node, replica: &ShardReplica, after_ms: u64) -> Vec<LockInfo> {
    let leader = replica.raft.metrics().borrow_watched().current_leader;
    if leader != Some(node.config.node_id) {
        return Vec::new();
    }
    let now_ms = node.clock.now().physical_ms();
    let Some(cutoff_ms) = now_ms.checked_sub(after_ms) else {
        return Vec::new();
    };
    let table = replica.sm.locks();
    let table = table.read().unwrap_or_else(|p| p.into_inner());
    table
        .txns()
        .filter(|(_, locks)| Timestamp(locks.prepare_ts).physical_ms() <= cutoff_ms)
        .filter_map(|(txn, locks)| lock_info(txn, locks))
        .take(SWEEP_BATCH)
        .collect()
}

/// A lock of `txn` as a reader would have met it: its first written key, else its first read
/// key, else the start of its first scanned range.
fn lock_info(txn: &TxnId, locks: &TxnLocks) -> Option<LockInfo> {
    let (key, write) = match (
        locks.writes.first(),
        locks.reads.first(),
        locks.ranges.first(),
    ) {
        (Some((key, _)), _, _) => (key.clone(), true),
        (None, Some(key), _) => (key.clone(), false),
        (None, None, Some((start, _))) => (start.clone(), false),
        (None, None, None) => return None,
    };
    Some(LockInfo {
        key,
        txn: meridian_client::proto::WriteId {
            client_id: txn.client_id,
            seq: txn.seq,
        },
        anchor: locks.anchor.clone(),
        prepare_ts: locks.prepare_ts,
        write,
        txn_ts: locks.txn_ts,
        rank: locks.rank,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use meridian_raft::RequestId;

    fn b(s: &str) -> Bytes {
        Bytes::copy_from_slice(s.as_bytes())
    }

    fn locks(writes: &[&str], reads: &[&str], ranges: &[&str]) -> TxnLocks {
        TxnLocks {
            anchor: b("anchor"),
            prepare_ts: 10,
            txn_ts: 5,
            rank: Default::default(),
            writes: writes.iter().map(|k| (b(k), Some(b("v")))).collect(),
            reads: reads.iter().map(|k| b(k)).collect(),
            ranges: ranges.iter().map(|s| (b(s), None)).collect(),
            participants: vec![],
        }
    }

    #[test]
    fn the_lock_met_is_a_written_key_else_a_read_key_else_a_range_start() {
        let txn = RequestId {
            client_id: 7,
            seq: 3,
        };
        let info = lock_info(&txn, &locks(&["w"], &["r"], &["s"])).unwrap();
        assert_eq!((info.key, info.write), (b("w"), true));
        assert_eq!((info.txn.client_id, info.txn.seq), (7, 3));
        assert_eq!(
            (info.anchor, info.prepare_ts, info.txn_ts),
            (b("anchor"), 10, 5)
        );
        let info = lock_info(&txn, &locks(&[], &["r"], &["s"])).unwrap();
        assert_eq!((info.key, info.write), (b("r"), false));
        let info = lock_info(&txn, &locks(&[], &[], &["s"])).unwrap();
        assert_eq!((info.key, info.write), (b("s"), false));
        assert!(lock_info(&txn, &locks(&[], &[], &[])).is_none());
    }

    #[test]
    fn the_stuck_queue_skips_repeats_and_is_bounded() {
        let stuck = |seq| StuckRecord {
            txn: RequestId { client_id: 1, seq },
            txn_ts: 5,
            commit_ts: 9,
        };
        let queue = StuckQueue::default();
        queue.offer(ShardId(1), vec![stuck(1), stuck(2)]);
        queue.offer(ShardId(1), vec![stuck(2), stuck(3)]);
        assert_eq!(
            queue.len(),
            3,
            "a record a later pass reports again is queued once"
        );
        let taken = queue.take(2);
        assert_eq!(
            taken.iter().map(|(_, r)| r.txn.seq).collect::<Vec<_>>(),
            [1, 2]
        );
        queue.offer(
            ShardId(2),
            (10..10 + MAX_STUCK_QUEUED as u64 * 2).map(stuck).collect(),
        );
        assert_eq!(queue.len(), MAX_STUCK_QUEUED);
    }
}
