//! Cluster test: a node's groups elect only once a quorum of their members answers pings
//! (see `meridian-server`'s `founding`), at a cluster's first start and at a restart of the
//! whole cluster.
//!
//! 1. First start: node 1 starts alone (nodes 2 and 3 are stopped with SIGSTOP as soon as
//!    they are spawned, and continued `HOLD` later). Meanwhile node 1 must not campaign: its
//!    log names no vote or pre-vote that failed or timed out (openraft logs each as "while
//!    requesting ..."). Before the change it logged several per group it places first (those
//!    initialized at once and elected). Once the peers run, every shard has a leader.
//! 2. Restart: all three nodes stop; node 1 starts again alone for `HOLD` (its groups are
//!    formed, so only their election timers could campaign): again no failed vote in its
//!    log; then nodes 2 and 3 start and every shard has a leader.
//! 3. A changed map: one shard's replica on node 3 is removed and added back (map version 3,
//!    so no group is a founding one and the voters come from the replicas' stored
//!    memberships), then the restart of step 2 again. Before the fix, a replica's voters were
//!    read from its metrics, empty until its Raft core ran, so with a changed map every group
//!    was released at once and node 1 campaigned alone.

use crate::common::*;
use nix::sys::signal::Signal;
use std::time::Duration;

const BASE_PORT: u16 = 30_450;
const SHARDS: u32 = 8;
/// Longer than an election timeout (600 ms to 3 s in local clusters): without the wait, the
/// groups node 1 places first elect at once at a first start, and every group after a
/// timeout.
const HOLD: Duration = Duration::from_secs(4);
const STOP_TIMEOUT: Duration = Duration::from_secs(20);

#[test]
fn elections_wait_for_a_quorum_to_answer() {
    run_scenario(scenario());
}

/// Node `node`'s log lines (all its runs) that name a failed vote or pre-vote.
fn failed_votes(cluster: &meridian_cli::LocalCluster, node: u64) -> Vec<String> {
    cluster
        .log_contents(node)
        .expect("the node's log")
        .lines()
        .filter(|l| l.contains("while requesting"))
        .map(str::to_string)
        .collect()
}

fn assert_no_campaign(held: &[String], when: &str) {
    assert!(
        held.is_empty(),
        "{when}: node 1 campaigned while no quorum answered: {} failed votes, first {:?}",
        held.len(),
        held.first()
    );
}

async fn all_led(cluster: &meridian_cli::LocalCluster) {
    let status = cluster.wait_ready(READY_TIMEOUT).await.expect("ready");
    assert!(
        status.shards.iter().all(|s| s.leader_id != 0),
        "every shard has a leader: {:?}",
        status.shards
    );
}

async fn scenario() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = start_cluster(BASE_PORT, dir.path(), SHARDS, &[]);
    for node in [2, 3] {
        cluster.kill(node, Signal::SIGSTOP).expect("SIGSTOP");
    }
    tokio::time::sleep(HOLD).await;
    let first_start = failed_votes(&cluster, 1);
    for node in [2, 3] {
        cluster.kill(node, Signal::SIGCONT).expect("SIGCONT");
    }
    assert_no_campaign(&first_start, "first start");
    all_led(&cluster).await;

    restart_with_node_1_alone(&cluster, "restart").await;

    let status = cluster.wait_ready(READY_TIMEOUT).await.expect("ready");
    let shard = status
        .shards
        .iter()
        .find(|s| s.shard_id != 0 && s.leader_id != 3)
        .expect("a data shard node 3 does not lead")
        .shard_id;
    let client = connect_client((1..=3).map(|n| cluster.client_addr(n).unwrap()).collect()).await;
    client.remove_replica(shard, 3).await.expect("remove");
    let back = client.add_replica(shard, 3).await.expect("add back");
    assert!(back.map_version > 1, "the map changed: {back:?}");
    drop(client);
    restart_with_node_1_alone(&cluster, "restart after a map change").await;
    drop(cluster);
}

/// Stops every node, starts node 1 alone for `HOLD` (asserting it campaigned in no group),
/// then the others, and waits until every shard has a leader.
async fn restart_with_node_1_alone(cluster: &meridian_cli::LocalCluster, when: &str) {
    let stuck = cluster.stop_all(STOP_TIMEOUT);
    assert!(stuck.is_empty(), "nodes {stuck:?} did not stop");
    let before = failed_votes(cluster, 1).len();
    cluster.restart(1).expect("restart node 1");
    tokio::time::sleep(HOLD).await;
    let alone = failed_votes(cluster, 1).split_off(before);
    for node in [2, 3] {
        cluster.restart(node).expect("restart");
    }
    assert_no_campaign(&alone, when);
    all_led(cluster).await;
}
