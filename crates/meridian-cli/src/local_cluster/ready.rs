//! Readiness of a local cluster: a shard counts as led when the newest leader the nodes' status
//! answers name is a running node registered with its client address.

use super::{LocalCluster, POLL_INTERVAL};
use anyhow::bail;
use meridian_client::proto::StatusResponse;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// Timeout of one readiness `Status` request.
const STATUS_TIMEOUT: Duration = Duration::from_secs(1);
/// Lines of a node's log quoted when it dies unexpectedly.
const LOG_TAIL_LINES: usize = 20;

/// Every shard's leader as the nodes' status answers name it: `shard -> (leader, term)`.
///
/// Answers may disagree while a leadership changes hands (a node that has not heard of the
/// new term still names the old leader): the highest term wins. The shard counts as led only
/// when that newest leader is `running` and registered with a client address in the answer
/// naming it (clients cannot route to it otherwise): an older answer naming a running node
/// does not stand in for a newer leader that has died.
fn merged_leaders(views: &[StatusResponse], running: &[u64]) -> BTreeMap<u64, (u64, u64)> {
    // shard -> (term, leader, registered)
    let mut newest: BTreeMap<u64, (u64, u64, bool)> = BTreeMap::new();
    for status in views {
        let registered = |id: u64| {
            status
                .nodes
                .iter()
                .any(|n| n.node_id == id && !n.client_addr.is_empty())
        };
        for s in status.shards.iter().filter(|s| s.leader_id != 0) {
            let seen = (s.term, s.leader_id, registered(s.leader_id));
            let entry = newest.entry(s.shard_id).or_insert(seen);
            if s.term > entry.0 {
                *entry = seen;
            }
        }
    }
    newest
        .into_iter()
        .filter(|(_, (_, leader, registered))| *registered && running.contains(leader))
        .map(|(shard, (term, leader, _))| (shard, (leader, term)))
        .collect()
}

impl LocalCluster {
    /// One readiness probe: the best `Status` among running nodes and how many of its shards
    /// (metadata included) have a leader that is a running node registered with its client
    /// address.
    pub async fn probe(&self) -> Option<(StatusResponse, usize, usize)> {
        let running: Vec<u64> = self
            .node_ids()
            .into_iter()
            .filter(|id| self.is_running(*id).unwrap_or(false))
            .collect();
        // Each node reports leaders only for the shards it hosts (with more nodes than the
        // replication factor, no node may host them all): a shard counts as led if any node
        // names a running, registered leader for it, and the returned status (the node that
        // answered with the most shards) takes those leaders where they are newer than its own
        // (a higher term) or its own is not running.
        let mut views: Vec<StatusResponse> = Vec::new();
        for node_id in &running {
            let Ok(address) = self.client_addr(*node_id) else {
                continue;
            };
            if let Ok(status) = meridian_client::fetch_status(&address, STATUS_TIMEOUT).await {
                views.push(status);
            }
        }
        let leaders = merged_leaders(&views, &running);
        let mut best = views.into_iter().max_by_key(|s| s.shards.len())?;
        for s in &mut best.shards {
            if let Some((leader, term)) = leaders.get(&s.shard_id) {
                if !running.contains(&s.leader_id) || *term > s.term {
                    (s.leader_id, s.term) = (*leader, *term);
                }
            }
        }
        let total = best.shards.len();
        let led = best
            .shards
            .iter()
            .filter(|s| leaders.contains_key(&s.shard_id))
            .count();
        Some((best, led, total))
    }

    /// An error quoting the log of the first node found to have exited, if any.
    fn fail_on_exit(&self) -> anyhow::Result<()> {
        if let Some((node_id, status)) = self.exited_nodes().into_iter().next() {
            bail!(
                "node {node_id} exited ({status}) while waiting for the cluster; last log lines of {}:\n{}",
                self.log_path(node_id)?.display(),
                self.log_tail(node_id, LOG_TAIL_LINES)
            );
        }
        Ok(())
    }

    /// Waits until some node reports every shard (metadata and data, at least one data shard)
    /// led by a running node. Fails early, quoting its log, if a node exits.
    pub async fn wait_ready(&self, timeout: Duration) -> anyhow::Result<StatusResponse> {
        self.wait_ready_with_progress(timeout, |_, _| {}).await
    }

    /// [`LocalCluster::wait_ready`], calling `progress(led, total)` whenever the count changes.
    pub async fn wait_ready_with_progress(
        &self,
        timeout: Duration,
        mut progress: impl FnMut(usize, usize),
    ) -> anyhow::Result<StatusResponse> {
        let give_up = Instant::now() + timeout;
        let mut reported = None;
        loop {
            self.fail_on_exit()?;
            let probe = self.probe().await;
            if let Some((status, led, total)) = probe {
                if reported != Some((led, total)) {
                    progress(led, total);
                    reported = Some((led, total));
                }
                // Re-check exits: a node that died meanwhile must not count as ready.
                if total > 1 && led == total {
                    self.fail_on_exit()?;
                    return Ok(status);
                }
            }
            if Instant::now() >= give_up {
                let (led, total) = reported.unwrap_or((0, 0));
                bail!(
                    "cluster not ready after {} s: {led}/{total} shards have a leader (logs in {})",
                    timeout.as_secs(),
                    self.data_dir.display()
                );
            }
            tokio::time::sleep(POLL_INTERVAL).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use meridian_client::proto::{NodeInfo, ShardInfo};

    fn view(leaders: &[(u64, u64, u64)]) -> StatusResponse {
        StatusResponse {
            nodes: (1..=3)
                .map(|node_id| NodeInfo {
                    node_id,
                    client_addr: format!("127.0.0.1:{}", 7000 + node_id),
                    ..Default::default()
                })
                .collect(),
            shards: leaders
                .iter()
                .map(|&(shard_id, leader_id, term)| ShardInfo {
                    shard_id,
                    leader_id,
                    term,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn merged_leaders_take_the_highest_term() {
        // Node A still names node 1 (term 3) for shard 5; node B has seen node 2 win term 4.
        let stale = view(&[(5, 1, 3), (6, 3, 2)]);
        let fresh = view(&[(5, 2, 4)]);
        for views in [vec![stale.clone(), fresh.clone()], vec![fresh, stale]] {
            let merged = merged_leaders(&views, &[1, 2, 3]);
            assert_eq!(merged.get(&5), Some(&(2, 4)), "{merged:?}");
            assert_eq!(merged.get(&6), Some(&(3, 2)), "{merged:?}");
        }
        // The newest leader is not running: the shard has no leader, though an older answer
        // names a running node.
        let merged = merged_leaders(&[view(&[(5, 1, 3)]), view(&[(5, 2, 4)])], &[1, 3]);
        assert_eq!(merged.get(&5), None, "{merged:?}");
        // No answer names a leader (0): nothing.
        assert!(merged_leaders(&[view(&[(7, 0, 5)])], &[1, 2, 3]).is_empty());
    }
}
