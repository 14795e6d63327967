//! Cluster test: followers that hear their leader rest (their election tickers off, meridian-raft
//! `rest`), and a dead leader is still replaced: the node loop turns the survivors' tickers back
//! on before an election could be due, and openraft's own timers elect.
//!
//! Quiescence is off, so every group stays awake and only resting stops follower ticks:
//! - after a few writes, followers on every node report resting (`meridian_raft_followers_resting`);
//! - SIGKILL the node that leads the most shards, with no client traffic: every shard has a live
//!   leader again (a ticker that never came back would leave its shard leaderless), and every
//!   shard takes writes.
//!
//! The same run with `--rest-followers false` is the control: no follower rests (the gauge's
//! control), and its failover time is printed beside the resting run's.

use crate::common::*;
use bytes::Bytes;
use meridian_cli::demo::keys_across_shards;
use std::time::Duration;

const BASE_PORT: u16 = 19_100;
const SHARDS: u32 = 12;
/// Bound on every shard having a live leader again (the election timeout is 0.6–1.2 s).
const FAILOVER_TIMEOUT: Duration = Duration::from_secs(30);

fn metrics_port(base: u16, node: u64) -> u16 {
    base + 50 + node as u16
}

#[test]
fn resting_followers_still_replace_a_dead_leader() {
    run_scenario(scenario());
}

/// Starts a 3-node cluster with quiescence off, `--rest-followers rest`, writes to every shard
/// and returns it with the resting followers each node reports a second later.
async fn cluster_after_writes(
    base: u16,
    dir: &std::path::Path,
    rest: bool,
) -> (meridian_cli::LocalCluster, Vec<f64>, Vec<Bytes>) {
    let flags: Vec<Vec<String>> = (1..=3)
        .map(|n| {
            [
                "--quiesce",
                "false",
                "--rest-followers",
                if rest { "true" } else { "false" },
                "--metrics-addr",
                &format!("127.0.0.1:{}", metrics_port(base, n)),
            ]
            .map(String::from)
            .to_vec()
        })
        .collect();
    let cluster = start_cluster_with_args(base, dir, SHARDS, &flags);
    cluster.wait_ready(READY_TIMEOUT).await.expect("ready");
    let client = connect_client(cluster.endpoints()).await;
    let keys = keys_across_shards(&client.shard_map(), SHARDS as usize);
    for key in &keys {
        client
            .put(key.clone(), Bytes::from_static(b"v1"))
            .await
            .expect("put");
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let resting = (1..=3)
        .map(|n| {
            let m = scrape_metrics(metrics_port(base, n));
            let awake = sample(&m, "meridian_raft_groups{state=\"awake\"}");
            let led = sample(&m, "meridian_raft_groups_led");
            let resting = sample(&m, "meridian_raft_followers_resting");
            eprintln!(
                "node {n} (rest {rest}): {awake} awake groups, leads {led}, {resting} resting"
            );
            resting
        })
        .collect();
    (cluster, resting, keys)
}

async fn scenario() {
    // The control first: with resting off, no follower rests; its failover time is printed
    // beside the resting run's (a figure to compare, not asserted).
    let without = kill_the_busiest_leader(BASE_PORT + 200, false).await;
    let with = kill_the_busiest_leader(BASE_PORT, true).await;
    eprintln!("every shard led again {without:?} after SIGKILL with followers ticking, {with:?} with them resting");
}

/// One cluster (`rest`: `--rest-followers`): checks the resting gauge, SIGKILLs the node that
/// leads the most shards, waits for every shard to have a live leader and writes to each;
/// returns how long the leaders took.
async fn kill_the_busiest_leader(base: u16, rest: bool) -> Duration {
    let dir = tempfile::tempdir().unwrap();
    let (cluster, resting, keys) = cluster_after_writes(base, dir.path(), rest).await;
    let total: f64 = resting.iter().sum();
    if rest {
        // 13 groups (12 data shards and the metadata shard) with two followers each: 26
        // follower replicas. One whose heartbeat came late may be ticking at a scrape.
        assert!(
            total >= 13.0,
            "most of the 26 follower replicas rest, got {resting:?}"
        );
    } else {
        assert_eq!(total, 0.0, "--rest-followers false: no follower rests");
    }

    let (victim, orphaned, survivors, took) = kill_busiest_leader(&cluster, FAILOVER_TIMEOUT).await;
    eprintln!(
        "rest {rest}: node {victim} led {orphaned} awake shards; all had live leaders {took:?} \
         after SIGKILL, with no client traffic"
    );

    let client = connect_to(&cluster, &survivors).await;
    put_every_key(&client, &keys, b"v2", "after failover").await;
    assert_no_panics(&cluster, &survivors);
    took
}
