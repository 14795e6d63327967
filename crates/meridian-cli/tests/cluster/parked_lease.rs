//! Cluster test: the records of parked leases (meridian-raft `parked_lease`) travel and age as
//! the rules say, on real processes. Nothing serves reads from them yet; the metric
//! `meridian_raft_parked_leases` shows, per node, the quiesced groups it leads whose lease
//! would hold.
//!
//! 1. Idle, every group parks, and every group's leader holds its parked lease: the tokens its
//!    followers gave with their parking (`Quiesce` replies) match the ones their ping answers
//!    carry.
//! 2. The two other nodes are frozen (SIGSTOP). The remaining node's leases end within the
//!    lease window (0.9 × `election_timeout_max`) by age alone: its groups stay parked, as
//!    nothing wakes a parked leader whose followers are silent.
//! 3. Continued, the frozen nodes count a lapse of the remaining node (silent past
//!    `election_timeout_max` from their view; `meridian_raft_ping_lapses_total`), and it one
//!    of each of them: their answers carry it, so the old leases cannot come back; the
//!    groups wake, park again with new tokens, and every group holds a lease again.

use crate::common::*;
use nix::sys::signal::Signal;
use std::time::{Duration, Instant};

const BASE_PORT: u16 = 26_800;
const SHARDS: u32 = 4;
/// The cluster's `election_timeout_max`: twice the minimum the local cluster sets (600 ms).
const ELECTION_TIMEOUT_MAX: Duration = Duration::from_millis(1_200);

fn metrics_port(node: u64) -> u16 {
    BASE_PORT + 50 + node as u16
}

/// One of `node`'s metrics, read now.
fn metric(node: u64, name: &str) -> u64 {
    sample(&scrape_metrics(metrics_port(node)), name) as u64
}

fn parked_leases(node: u64) -> u64 {
    metric(node, "meridian_raft_parked_leases")
}

fn lapses(node: u64) -> u64 {
    metric(node, "meridian_raft_ping_lapses_total")
}

/// Waits until `node` has counted at least `at_least` lapses in all.
async fn wait_lapses(node: u64, at_least: u64) {
    let what = format!("node {node}, at least {at_least} lapses");
    wait_for(
        &what,
        Duration::from_secs(10),
        || lapses(node),
        |n| *n >= at_least,
    )
    .await;
}

/// Waits until the three nodes together hold a parked lease for every group; the count
/// per node.
async fn wait_every_group_leased(within: Duration) -> Vec<u64> {
    let groups = u64::from(SHARDS) + 1;
    let what = format!("parked leases per node, {groups} in all");
    let per_node = || (1..=3).map(parked_leases).collect::<Vec<u64>>();
    wait_for(&what, within, per_node, |c| c.iter().sum::<u64>() == groups).await
}

#[test]
fn parked_leases_hold_while_followers_answer_and_end_when_they_fall_silent() {
    run_scenario(scenario());
}

async fn scenario() {
    let dir = tempfile::tempdir().unwrap();
    let cluster =
        start_cluster_with_args(BASE_PORT, dir.path(), SHARDS, &metrics_flags(metrics_port));
    cluster.wait_ready(READY_TIMEOUT).await.expect("ready");
    let nodes = cluster.node_ids();

    // 1. Every group parks, and its leader's lease holds.
    wait_all_quiesced(&cluster, &nodes).await;
    let counts = wait_every_group_leased(Duration::from_secs(30)).await;
    let (keeper, held) = (1..=3u64)
        .map(|n| (n, counts[n as usize - 1]))
        .max_by_key(|(_, c)| *c)
        .unwrap();
    assert!(held > 0, "some node leads a parked group");

    // 2. Freeze the other two: the keeper's leases end by age, within the lease window (and
    //    a ping period and a scrape).
    let others: Vec<u64> = nodes.iter().copied().filter(|n| *n != keeper).collect();
    let lapses_before: std::collections::HashMap<u64, u64> =
        others.iter().map(|n| (*n, lapses(*n))).collect();
    let keeper_lapses_before = lapses(keeper);
    for n in &others {
        cluster.kill(*n, Signal::SIGSTOP).expect("SIGSTOP");
    }
    let frozen_at = Instant::now();
    let what = format!("node {keeper}, parked leases once its followers are silent");
    let leases = || parked_leases(keeper);
    wait_for(&what, ELECTION_TIMEOUT_MAX * 2, leases, |n| *n == 0).await;
    let ended_after = frozen_at.elapsed();
    assert!(
        ended_after >= ELECTION_TIMEOUT_MAX * 9 / 10 - Duration::from_millis(300),
        "the leases lasted {ended_after:?}: answers count for 0.9 × election_timeout_max after their pings' send"
    );
    // Past election_timeout_max from the followers' view, so they count a lapse.
    tokio::time::sleep(ELECTION_TIMEOUT_MAX + Duration::from_millis(500)).await;

    // 3. Continue them: each counts a lapse of the keeper at its first ping (so the keeper's
    //    old leases cannot come back), the groups wake (the followers found the keeper
    //    silent), park again with new tokens, and every group holds a lease again.
    for n in &others {
        cluster.kill(*n, Signal::SIGCONT).expect("SIGCONT");
    }
    for n in &others {
        wait_lapses(*n, lapses_before[n] + 1).await;
    }
    // The keeper did not hear the frozen nodes' pings either: one lapse for each.
    wait_lapses(keeper, keeper_lapses_before + 2).await;
    wait_all_quiesced(&cluster, &nodes).await;
    wait_every_group_leased(Duration::from_secs(30)).await;

    assert_no_panics(&cluster, &nodes);
    cluster.stop_all(Duration::from_secs(10));
}
