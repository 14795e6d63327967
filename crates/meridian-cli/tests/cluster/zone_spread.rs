//! Cluster test: a removal that would crowd a zone of a zone-survival shard's home region is
//! refused when another removal would not (`removal_checks::zone_spread_refusal`).
//!
//! Five nodes, all in us-east: 1 and 4 in zone a, 2 and 5 in zone b, 3 in zone c; the data
//! shard is founded with `=us-east:zone`, so its three replicas are in zones a, b and c and
//! all vote.
//! 1. `add-replica` on the other zone-a node: four voters, two of them in zone a.
//! 2. Removing the zone-b replica would leave two of three in zone a (losing zone a would
//!    stop the writes) while removing either zone-a one would not, and zone b has another
//!    node that could take a replica: refused, naming both fixes. Before the check it went
//!    ahead.
//! 3. Removing the added zone-a replica, as the refusal says, goes ahead: the founding voters
//!    again.

use crate::common::*;
use meridian_cli::{LocalCluster, LocalClusterConfig};
use std::collections::BTreeSet;
use std::time::Duration;

const BASE_PORT: u16 = 16_200;
const NODES: u64 = 5;
const SHARD: u64 = 1;
/// Bound on the group reaching the voters wanted.
const CONVERGE_TIMEOUT: Duration = Duration::from_secs(60);

/// Each node's zone (every node is in us-east).
fn zone(node: u64) -> &'static str {
    match node {
        1 | 4 => "a",
        2 | 5 => "b",
        _ => "c",
    }
}

#[test]
fn a_removal_that_crowds_a_home_zone_is_refused() {
    run_scenario(scenario());
}

async fn scenario() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = LocalClusterConfig::new(binary(), NODES as usize, BASE_PORT, dir.path())
        .common_args(["--initial-shards", "1", "--home-regions", "=us-east:zone"]);
    for node in 1..=NODES {
        config = config.node_labels(node, "us-east", zone(node));
    }
    let cluster = LocalCluster::start(config).expect("spawning the cluster");
    eprintln!(
        "cluster at ports {BASE_PORT}+, logs in {}",
        dir.path().display()
    );
    let status = cluster
        .wait_ready(READY_TIMEOUT)
        .await
        .expect("cluster ready");
    let endpoints: Vec<String> = (1..=NODES)
        .map(|id| cluster.client_addr(id).unwrap())
        .collect();
    let founding = status
        .shards
        .iter()
        .find(|s| s.shard_id == SHARD)
        .expect("the data shard")
        .replicas
        .clone();
    let in_zone = |z: &str| *founding.iter().find(|n| zone(**n) == z).unwrap();
    let zones: BTreeSet<&str> = founding.iter().map(|n| zone(*n)).collect();
    assert_eq!(zones.len(), 3, "founding replicas {founding:?}");
    let (a, b) = (in_zone("a"), in_zone("b"));
    let other_a = if a == 1 { 4 } else { 1 };
    wait_voters(&cluster, &founding).await;

    // 1. A second replica in zone a.
    cli(
        &endpoints,
        &["cluster", "add-replica", "1", &other_a.to_string()],
    );
    let four: Vec<u64> = founding.iter().copied().chain([other_a]).collect();
    wait_voters(&cluster, &four).await;

    // 2. Removing zone b's replica would crowd zone a: refused.
    let said = cli_refused(
        [
            "cluster",
            "remove-replica",
            "1",
            &b.to_string(),
            "--endpoints",
            &endpoints.join(","),
        ]
        .map(String::from)
        .to_vec(),
    )
    .await;
    let (low, high) = (a.min(other_a), a.max(other_a));
    assert!(
        said.contains("would leave zone a with 2 of its 3 replicas in us-east")
            && said.contains(&format!(
                "Remove node {low}'s or node {high}'s replica instead"
            ))
            && said.contains("first add a replica on a node of us-east in zone b"),
        "{said}"
    );

    // 3. The fix it names goes ahead.
    cli(
        &endpoints,
        &["cluster", "remove-replica", "1", &other_a.to_string()],
    );
    wait_voters(&cluster, &founding).await;
    assert_no_panics(&cluster, &(1..=NODES).collect::<Vec<_>>());
}

/// Waits until the data shard's leader reports `voters` as its voters, no learners, and no
/// voter change half done.
async fn wait_voters(cluster: &LocalCluster, voters: &[u64]) {
    let nodes: Vec<u64> = (1..=NODES).collect();
    wait_shard_roles(cluster, SHARD, &nodes, (voters, &[]), CONVERGE_TIMEOUT).await;
}
