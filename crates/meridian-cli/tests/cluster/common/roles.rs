//! A shard's group roles as its leader reports them, for the placement tests.

use meridian_cli::LocalCluster;
use meridian_client::{fetch_status, proto::ShardInfo};
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

/// Shard `shard` as node `node` sees it (its status), if the node answers within 2 s.
pub async fn shard_info_at(cluster: &LocalCluster, node: u64, shard: u64) -> Option<ShardInfo> {
    let status = fetch_status(&cluster.client_addr(node).ok()?, Duration::from_secs(2))
        .await
        .ok()?;
    status.shards.into_iter().find(|s| s.shard_id == shard)
}

/// Waits, at most `timeout`, until shard `shard`'s leader (asked through `nodes`) reports
/// voters `voters` and learners `learners`, not joint; returns that view.
pub async fn wait_shard_roles(
    cluster: &LocalCluster,
    shard: u64,
    nodes: &[u64],
    (voters, learners): (&[u64], &[u64]),
    timeout: Duration,
) -> ShardInfo {
    let want = |ids: &[u64]| ids.iter().copied().collect::<BTreeSet<u64>>();
    let started = Instant::now();
    let mut last = None;
    loop {
        for node in nodes {
            let Some(seen) = shard_info_at(cluster, *node, shard).await else {
                continue;
            };
            let leader = seen.leader_id;
            if leader == 0 || !nodes.contains(&leader) {
                continue;
            }
            let Some(at_leader) = shard_info_at(cluster, leader, shard).await else {
                continue;
            };
            let roles = (
                want(&at_leader.voters),
                want(&at_leader.learners),
                at_leader.joint,
            );
            if roles == (want(voters), want(learners), false) {
                return at_leader;
            }
            last = Some(roles);
            break;
        }
        assert!(
            started.elapsed() < timeout,
            "voters {voters:?} and learners {learners:?} not reached after {timeout:?}; last \
             seen (voters, learners, joint): {last:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
