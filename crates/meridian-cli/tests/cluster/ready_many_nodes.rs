//! Cluster test: `LocalCluster::wait_ready` with more nodes than the replication factor.
//!
//! Six nodes, replication factor 3, one data shard: placement puts the metadata group on three
//! nodes and the data shard on the other three, so no node hosts both and no single node's
//! status names both leaders. Readiness must combine the nodes' views (it used to take the
//! best single view, and reported "1/2 shards have a leader" until its timeout).

use crate::common::*;
use meridian_cli::{LocalCluster, LocalClusterConfig};

const BASE_PORT: u16 = 27_700;

#[test]
fn a_cluster_whose_shards_no_node_hosts_together_becomes_ready() {
    run_scenario(async {
        let dir = tempfile::tempdir().unwrap();
        let config = LocalClusterConfig::new(binary(), 6, BASE_PORT, dir.path())
            .common_args(["--initial-shards", "1"]);
        let cluster = LocalCluster::start(config).expect("spawning the cluster");
        let status = cluster
            .wait_ready(READY_TIMEOUT)
            .await
            .expect("cluster ready");
        let replicas = |id: u64| {
            status
                .shards
                .iter()
                .find(|s| s.shard_id == id)
                .map(|s| s.replicas.clone())
                .unwrap_or_default()
        };
        let (meta, data) = (replicas(0), replicas(1));
        assert!(
            meta.iter().all(|n| !data.contains(n)),
            "the scenario needs disjoint replica sets: metadata {meta:?}, data {data:?}"
        );
        for shard in &status.shards {
            assert!(
                shard.replicas.contains(&shard.leader_id),
                "shard {} has no leader among its replicas in the returned status: {}",
                shard.shard_id,
                shard.leader_id
            );
        }
    });
}
