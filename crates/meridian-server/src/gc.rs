//! The node's MVCC garbage collector: every `cluster.gc_interval_ms`, for each shard this node
//! leads, propose [`Command::Gc`] pages at the threshold `now - cluster.gc_ttl_ms` until a pass
//! over the shard is done.
//!
//! # Why the leader, and why through Raft
//! Which versions are garbage depends on the threshold, and readers must refuse timestamps
//! below it on every replica that serves reads. So the threshold is replicated state: a GC
//! page is a Raft command, applied in log order on every replica, which raises the shard's
//! threshold and deletes the same versions everywhere (`meridian_raft::state_machine`). Only
//! the leader proposes, so there is one pass per shard at a time.
//!
//! # What a read may still ask for
//! The threshold trails the leader's clock by the TTL (15 minutes by default, at least
//! `MIN_GC_TTL_OFFSETS × max_offset`), so a linearizable read, served at a clock reading at
//! most `max_offset` behind the leader's, is always above it. Only a transaction's snapshot
//! read older than the TTL can fall below: it fails with `BELOW_GC_THRESHOLD`.
//!
//! # When a shard is skipped
//! A shard whose newest version (its applied floor) is at or below its threshold holds no
//! garbage a later threshold could collect until it is written again: idle shards stay
//! quiesced. Otherwise a pass runs at most once per interval per shard.
//!
//! # Not done yet
//! - No statistics of garbage per shard (live vs. total bytes, as CockroachDB's MVCC stats):
//!   a shard written once is scanned whole once per interval until the threshold passes its
//!   newest write (TTL / interval passes, 15 by default).
//! - Passes are not throttled beyond one page in flight per shard and shards one at a time.
//! - Transaction records that recoveries left `Aborted` are not collected.

use crate::node::Node;
use meridian_raft::{Command, GcResult, ShardReplica};
use meridian_types::{ShardId, Timestamp};
use openraft::type_config::async_runtime::WatchReceiver;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

/// Most pages one pass proposes (a bound on a pass, at `GC_PAGE_ENTRIES` entries a page).
const MAX_PAGES_PER_PASS: u32 = 100_000;

/// The node's GC figures, for logs and tests.
#[derive(Debug, Default)]
pub struct GcStats {
    pub passes: AtomicU64,
    pub pages: AtomicU64,
    pub versions_deleted: AtomicU64,
    pub keys_deleted: AtomicU64,
}

/// Starts the node's GC loop; it ends when the node is dropped. `ttl_ms = 0` disables it.
pub(crate) fn spawn(node: &Arc<Node>) -> Option<tokio::task::JoinHandle<()>> {
    let ttl_ms = node.config.cluster.gc_ttl_ms;
    if ttl_ms == 0 {
        tracing::info!("MVCC garbage collection is off (cluster.gc_ttl_ms = 0)");
        return None;
    }
    let interval = Duration::from_millis(node.config.cluster.gc_interval_ms);
    let weak: Weak<Node> = Arc::downgrade(node);
    Some(tokio::spawn(async move {
        // Per shard, the threshold of the last pass this node finished as leader.
        let mut last: HashMap<ShardId, u64> = HashMap::new();
        loop {
            tokio::time::sleep(interval).await;
            let Some(node) = weak.upgrade() else { return };
            for replica in node.host.replicas() {
                let shard = replica.shard;
                let Some(target) = due(&node, &replica, ttl_ms, last.get(&shard).copied()) else {
                    continue;
                };
                match pass(&node, shard, target).await {
                    Ok(done) => {
                        last.insert(shard, done.threshold);
                    }
                    Err(e) => {
                        tracing::debug!(%shard, error = %e, "GC pass stopped; next interval retries")
                    }
                }
            }
        }
    }))
}

/// The threshold a pass over `replica` should use now, if one is due.
fn due(node: &Node, replica: &ShardReplica, ttl_ms: u64, last: Option<u64>) -> Option<u64> {
    let leader = replica.raft.metrics().borrow_watched().current_leader;
    if leader != Some(node.config.node_id) {
        return None;
    }
    let now_ms = node.clock.now().physical_ms();
    let target = Timestamp::from_physical_ms(now_ms.checked_sub(ttl_ms)?).0;
    let threshold = replica
        .sm
        .locks()
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .gc_threshold;
    let floor = replica.sm.applied_floor().0;
    let newer_than_last = last.is_none_or(|t| target > t);
    (floor > threshold && target > threshold && newer_than_last).then_some(target)
}

/// Proposes the pages of one pass over `shard` at `threshold`.
async fn pass(node: &Node, shard: ShardId, threshold: u64) -> anyhow::Result<GcResult> {
    let replica = node.replica(shard)?;
    let deadline = Duration::from_millis(node.config.raft.rpc_timeout_ms.max(1_000) * 5);
    let mut from = None;
    let mut total = GcResult::default();
    for _ in 0..MAX_PAGES_PER_PASS {
        let cmd = Command::Gc { threshold, from };
        let written = tokio::time::timeout(deadline, replica.raft.client_write(cmd))
            .await
            .map_err(|_| anyhow::anyhow!("a GC page was not applied within {deadline:?}"))?
            .map_err(|e| anyhow::anyhow!("proposing a GC page: {e}"))?;
        let page = written
            .data
            .gc
            .ok_or_else(|| anyhow::anyhow!("a GC page applied without a GC result"))?;
        node.gc_stats.pages.fetch_add(1, Ordering::Relaxed);
        node.gc_stats
            .versions_deleted
            .fetch_add(page.versions_deleted, Ordering::Relaxed);
        node.gc_stats
            .keys_deleted
            .fetch_add(page.keys_deleted, Ordering::Relaxed);
        total.threshold = page.threshold;
        total.versions_deleted += page.versions_deleted;
        total.keys_deleted += page.keys_deleted;
        total.examined += page.examined;
        from = page.resume;
        if from.is_none() {
            node.gc_stats.passes.fetch_add(1, Ordering::Relaxed);
            if total.versions_deleted > 0 {
                tracing::info!(
                    %shard,
                    threshold = %Timestamp(total.threshold),
                    examined = total.examined,
                    versions_deleted = total.versions_deleted,
                    keys_deleted = total.keys_deleted,
                    "GC pass done"
                );
            } else {
                tracing::debug!(%shard, examined = total.examined, "GC pass found no garbage");
            }
            return Ok(total);
        }
    }
    anyhow::bail!("a GC pass took more than {MAX_PAGES_PER_PASS} pages")
}
