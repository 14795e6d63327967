//! The node's MVCC garbage collector: every `cluster.gc_interval_ms`, for each shard this node
//! leads that may hold garbage (below), propose [`Command::Gc`] pages at the threshold
//! `now - cluster.gc_ttl_ms` until a pass over the shard is done, then [`Command::GcRecords`]
//! pages over its transaction records
//! (the finished ones whose transaction started below the threshold go; see `meridian-raft`'s
//! `locks`). Committed records still unfinished below the threshold are queued for the
//! sweeper, which finishes them (see `sweeper`).
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
//! quiesced. Otherwise, at most once per interval, the leader first surveys its own replica
//! (`meridian-raft`'s `gc_survey`: the pass's own page functions, read-only) and proposes a
//! pass only if it would delete a version or a record, or report a stuck record, or if its
//! threshold would reach the shard's newest write: that *closing* pass raises the threshold
//! past it, which ends the surveys until the shard is written again. A shard written but
//! never overwritten (the metadata shard, most of the time) so appends one pass (two entries)
//! a TTL after its last write, where it used to append one every interval for the whole TTL.
//!
//! # Not done yet
//! - No statistics of garbage per shard (live vs. total bytes, as CockroachDB's MVCC stats):
//!   a shard written once is surveyed (scanned on its leader) once per interval until the
//!   closing pass (TTL / interval surveys, 15 by default), and a shard with garbage is read
//!   twice per pass on its leader (the survey, then the pass).
//! - Passes are not throttled beyond one page in flight per shard and shards one at a time.
//! - An idle shard's newest transaction records wait for its next write: a pass runs only
//!   while the shard has a version above its threshold, so a record whose transaction started
//!   above the shard's last write (a client or node clock ahead) is collected only after the
//!   shard is written again.

use crate::node::Node;
use meridian_raft::{Command, GcRecordsResult, GcResult, ShardReplica};
use meridian_types::{ShardId, Timestamp};
use openraft::type_config::async_runtime::WatchReceiver;
use std::sync::{Arc, Weak};
use std::time::Duration;

/// Most pages one pass proposes (a bound on a pass, at `GC_PAGE_ENTRIES` entries a page).
const MAX_PAGES_PER_PASS: u32 = 100_000;

/// Starts the node's GC loop, which ends when the node is dropped (`ttl_ms = 0`: no loop).
pub(crate) fn spawn(node: &Arc<Node>) {
    let ttl_ms = node.config.cluster.gc_ttl_ms;
    if ttl_ms == 0 {
        tracing::info!("MVCC garbage collection is off (cluster.gc_ttl_ms = 0)");
        return;
    }
    let interval = Duration::from_millis(node.config.cluster.gc_interval_ms);
    let weak: Weak<Node> = Arc::downgrade(node);
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(interval).await;
            let Some(node) = weak.upgrade() else { return };
            for replica in node.host.replicas() {
                let Some(target) = due(&node, &replica, ttl_ms) else {
                    continue;
                };
                let shard = replica.shard;
                // A threshold at or past the newest write ends the surveys until the next
                // write (`due`): that closing pass goes whatever a survey would say.
                let closing = target >= replica.sm.applied_floor().0;
                if !closing {
                    match replica.sm.gc_would_collect(target).await {
                        Ok(true) => {}
                        Ok(false) => {
                            tracing::debug!(%shard, "GC survey found no garbage; no pass proposed");
                            continue;
                        }
                        Err(e) => {
                            tracing::debug!(%shard, error = %e, "GC survey failed; next interval retries");
                            continue;
                        }
                    }
                }
                if let Err(e) = pass(&node, shard, target).await {
                    tracing::debug!(%shard, error = %e, "GC pass stopped; next interval retries");
                }
            }
        }
    });
}

/// The threshold a pass over `replica` should use now, if one is due: this node leads it, the
/// target is above its threshold, and it has a version above the threshold.
fn due(node: &Node, replica: &ShardReplica, ttl_ms: u64) -> Option<u64> {
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
    (floor > threshold && target > threshold).then_some(target)
}

/// Proposes the pages of one pass over `shard` at `threshold`.
async fn pass(node: &Node, shard: ShardId, threshold: u64) -> anyhow::Result<()> {
    let replica = node.replica(shard)?;
    let deadline = Duration::from_millis(node.config.raft.rpc_timeout_ms.max(1_000) * 5);
    let mut from = None;
    let mut total = GcResult::default();
    for _ in 0..MAX_PAGES_PER_PASS {
        let cmd = Command::Gc { threshold, from };
        node.wake_to_write(&replica).await;
        let written = tokio::time::timeout(deadline, replica.raft.client_write(cmd))
            .await
            .map_err(|_| anyhow::anyhow!("a GC page was not applied within {deadline:?}"))?
            .map_err(|e| anyhow::anyhow!("proposing a GC page: {e}"))?;
        let page = written
            .data
            .gc
            .ok_or_else(|| anyhow::anyhow!("a GC page applied without a GC result"))?;
        total.threshold = page.threshold;
        total.versions_deleted += page.versions_deleted;
        total.keys_deleted += page.keys_deleted;
        total.examined += page.examined;
        from = page.resume;
        if from.is_none() {
            let records = collect_records(&replica, deadline).await?;
            if !records.stuck.is_empty() {
                tracing::info!(%shard, stuck = records.stuck.len(), "committed records nothing leads to are still unfinished; queued for the sweeper");
                node.stuck.offer(shard, records.stuck.clone());
            }
            if total.versions_deleted > 0 || records.deleted > 0 {
                tracing::info!(
                    %shard,
                    threshold = %Timestamp(total.threshold),
                    examined = total.examined,
                    versions_deleted = total.versions_deleted,
                    keys_deleted = total.keys_deleted,
                    records_examined = records.examined,
                    records_deleted = records.deleted,
                    "GC pass done"
                );
            } else {
                tracing::debug!(%shard, examined = total.examined, records_examined = records.examined, "GC pass found no garbage");
            }
            return Ok(());
        }
    }
    anyhow::bail!("a GC pass took more than {MAX_PAGES_PER_PASS} pages")
}

/// The second half of a pass: proposes [`Command::GcRecords`] pages over the shard's
/// transaction records and markers (at the threshold the data pages left).
async fn collect_records(
    replica: &ShardReplica,
    deadline: Duration,
) -> anyhow::Result<GcRecordsResult> {
    let mut from = None;
    let mut total = GcRecordsResult::default();
    for _ in 0..MAX_PAGES_PER_PASS {
        let cmd = Command::GcRecords { from };
        // A leader's touch (GC runs on leaders): out of the parked state before proposing, and
        // its lease renewed if it lapsed (`meridian_raft::write_lease`).
        let _ = replica.touch();
        replica.renew_lapsed_lease().await;
        let written = tokio::time::timeout(deadline, replica.raft.client_write(cmd))
            .await
            .map_err(|_| anyhow::anyhow!("a record GC page was not applied within {deadline:?}"))?
            .map_err(|e| anyhow::anyhow!("proposing a record GC page: {e}"))?;
        let page = written
            .data
            .gc_records
            .ok_or_else(|| anyhow::anyhow!("a record GC page applied without its result"))?;
        total.examined += page.examined;
        total.deleted += page.deleted;
        if total.stuck.len() < crate::sweeper::MAX_STUCK_QUEUED {
            total.stuck.extend(page.stuck);
        }
        from = page.resume;
        if from.is_none() {
            return Ok(total);
        }
    }
    anyhow::bail!("a record GC pass took more than {MAX_PAGES_PER_PASS} pages")
}
