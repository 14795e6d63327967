//! Cluster test: leaders follow their shard's home region (`--home-regions`).
//!
//! Three nodes in us-east, eu-west and ap-south; every data shard homed in eu-west (node 2).
//! 1. After bootstrap every data shard is led by node 2 (its replica bootstraps the group).
//! 2. SIGKILL node 2: the others elect leaders among themselves.
//! 3. Restart node 2: every data shard's leadership comes back to it, by the leader-follow
//!    loop's transfers. Quiescence is off, so live leaders keep heartbeating and the restarted
//!    node cannot win an election on its own: without the loop the leaders would stay where
//!    the failover put them. A value written while node 2 was down is still read afterwards.

mod common;

use common::*;
use meridian_client::fetch_status;
use nix::sys::signal::Signal;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

const BASE_PORT: u16 = 25_400;
const SHARDS: u32 = 4;
const HOME_NODE: u64 = 2;
/// Bound on leadership reaching the wanted nodes.
const CONVERGE_TIMEOUT: Duration = Duration::from_secs(90);

#[test]
fn leaders_return_to_the_home_region_after_a_restart() {
    run_scenario(scenario());
}

/// Data shard id → leader, as the first of `nodes` that answers sees it.
async fn leaders(cluster: &meridian_cli::LocalCluster, nodes: &[u64]) -> BTreeMap<u64, u64> {
    for id in nodes {
        let Ok(addr) = cluster.client_addr(*id) else {
            continue;
        };
        if let Ok(status) = fetch_status(&addr, Duration::from_secs(2)).await {
            return status
                .shards
                .iter()
                .filter(|s| s.shard_id != 0)
                .map(|s| (s.shard_id, s.leader_id))
                .collect();
        }
    }
    BTreeMap::new()
}

/// Waits until `want` holds for every data shard's leader; returns how long it took.
async fn wait_leaders(
    cluster: &meridian_cli::LocalCluster,
    nodes: &[u64],
    what: &str,
    want: impl Fn(u64) -> bool,
) -> Duration {
    let started = Instant::now();
    loop {
        let seen = leaders(cluster, nodes).await;
        if seen.len() == SHARDS as usize && seen.values().all(|l| want(*l)) {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < CONVERGE_TIMEOUT,
            "{what}: leaders after {CONVERGE_TIMEOUT:?}: {seen:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn scenario() {
    let dir = tempfile::tempdir().unwrap();
    // Quiescence off: live leaders heartbeat, so the restarted node 2 does not win elections
    // on its own (its pre-votes are refused) and only the leader-follow loop can bring
    // leadership home.
    let home: &[&str] = &["--home-regions", "=eu-west", "--quiesce", "false"];
    let per_node: Vec<(u64, &[&str])> = (1..=3).map(|id| (id, home)).collect();
    let cluster = start_cluster(BASE_PORT, dir.path(), SHARDS, &per_node);
    cluster
        .wait_ready(READY_TIMEOUT)
        .await
        .expect("cluster ready");
    let status = fetch_status(&cluster.client_addr(1).unwrap(), Duration::from_secs(2))
        .await
        .expect("status");
    for shard in status.shards.iter().filter(|s| s.shard_id != 0) {
        assert_eq!(shard.home_region, "eu-west", "shard {}", shard.shard_id);
        assert_eq!(shard.replicas[0], HOME_NODE, "home replica first");
    }

    let took = wait_leaders(&cluster, &[1, 2, 3], "after bootstrap", |l| l == HOME_NODE).await;
    eprintln!("every data shard led from eu-west {took:?} after ready");

    cluster.kill(HOME_NODE, Signal::SIGKILL).expect("kill");
    let took = wait_leaders(&cluster, &[1, 3], "after the kill", |l| {
        l != 0 && l != HOME_NODE
    })
    .await;
    eprintln!("failover to the other regions took {took:?}");
    let client = connect_client(vec![cluster.client_addr(1).unwrap()]).await;
    client
        .put("user1home", "written while eu-west was down")
        .await
        .expect("put");

    cluster.restart(HOME_NODE).expect("restart");
    let took = wait_leaders(&cluster, &[1, 3], "after the restart", |l| l == HOME_NODE).await;
    eprintln!("leadership back in eu-west {took:?} after the restart");
    assert_eq!(
        client.get("user1home").await.expect("get").as_deref(),
        Some(&b"written while eu-west was down"[..])
    );
    let log = cluster.log_contents(1).unwrap() + &cluster.log_contents(3).unwrap();
    assert!(
        log.contains("handing leadership to the shard's home region"),
        "the move home was the leader-follow loop's"
    );
}
