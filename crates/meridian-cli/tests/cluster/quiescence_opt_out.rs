//! Cluster test: a node started with `--quiesce false` does not park its replicas, not even
//! on a peer's `Quiesce` request. Its quiescence loop does not run, so a replica of it that
//! parked would have nobody to wake it when its leader's node dies (the dead-leader watchdog
//! is part of that loop) and nobody to retry the release of its promise. So with one such node
//! in a 3-node cluster (every shard has a replica there), no shard quiesces, whichever node
//! leads it: neither node 3's replicas nor any leader parks (a follower elsewhere may park
//! for a moment, until its leader's failed round wakes it), and the leaders back off after
//! each refused round rather than asking again once per idle threshold.

use crate::common::*;
use std::time::{Duration, Instant};

const SHARDS: u32 = 4;
/// How long the cluster is watched: a normal loopback cluster quiesces every shard within a
/// few seconds (election_timeout_max 1.2 s, then one quiesce round).
const WATCH: Duration = Duration::from_secs(15);
/// Node 3's metrics port.
const METRICS_PORT: u16 = 15_590;
/// Most quiesce rounds a shard led elsewhere may ask node 3 for during [`WATCH`]: each refusal
/// doubles the leader's idle threshold (1.2, 2.4, 4.8, 9.6 s), so about 3 rounds; retrying
/// once per threshold would be about 10.
const MAX_ROUNDS_PER_SHARD: f64 = 5.0;

#[test]
fn a_node_that_does_not_quiesce_parks_no_replica_of_a_peers_shard() {
    run_scenario(scenario());
}

async fn scenario() {
    let dir = tempfile::tempdir().unwrap();
    let metrics = format!("127.0.0.1:{METRICS_PORT}");
    let node3: &[&str] = &["--quiesce", "false", "--metrics-addr", &metrics];
    let cluster = start_cluster(15_500, dir.path(), SHARDS, &[(3, node3)]);
    cluster
        .wait_ready(READY_TIMEOUT)
        .await
        .expect("cluster ready");
    let nodes = cluster.node_ids();
    let started = Instant::now();
    let mut led_elsewhere = 0;
    while started.elapsed() < WATCH {
        let statuses = node_statuses(&cluster, &nodes).await;
        // Shards whose leader is not node 3: their leaders run quiesce rounds, and node 3's
        // replica must refuse them.
        led_elsewhere = led_elsewhere.max(statuses.iter().find(|s| s.answering_node == 1).map_or(
            0,
            |s| {
                s.shards
                    .iter()
                    .filter(|sh| sh.leader_id != 0 && sh.leader_id != 3)
                    .count()
            },
        ));
        // A follower on nodes 1-2 may park for a moment (a leader's round asks every follower
        // and gives up when node 3 refuses); node 3's replicas and every leader must not.
        let which: Vec<String> = statuses
            .iter()
            .flat_map(|s| {
                s.shards
                    .iter()
                    .filter(|sh| sh.quiesced && sh.replicas.contains(&s.answering_node))
                    .filter(|sh| s.answering_node == 3 || sh.leader_id == s.answering_node)
                    .map(move |sh| {
                        format!(
                            "shard {} on n{} (leader n{}, replicas {:?})",
                            sh.shard_id, s.answering_node, sh.leader_id, sh.replicas
                        )
                    })
            })
            .collect();
        assert!(
            which.is_empty(),
            "quiesced {:?} after the cluster was ready, with node 3 running --quiesce false: \
             {which:?}",
            started.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        led_elsewhere > 0,
        "every shard was led by node 3: nothing asked it to park"
    );
    // Their leaders back off after each refusal instead of asking again every threshold.
    let asked = sample(
        &scrape_metrics(METRICS_PORT),
        "meridian_raft_messages_received_total{type=\"quiesce\"}",
    );
    eprintln!(
        "{led_elsewhere} shards led by nodes 1-2 stayed awake for {WATCH:?}; node 3 refused \
         {asked} quiesce requests"
    );
    assert!(
        asked <= MAX_ROUNDS_PER_SHARD * led_elsewhere as f64,
        "node 3 was asked to park {asked} times in {WATCH:?} for {led_elsewhere} shards: their \
         leaders do not back off"
    );
}
