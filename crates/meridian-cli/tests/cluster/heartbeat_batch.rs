//! Cluster test: heartbeats travel coalesced, one call per node pair carrying many groups'
//! heartbeats (meridian-raft `heartbeat_batch`), and they still do a heartbeat's job.
//!
//! Quiescence is off, so every group keeps heartbeating. Over a few idle seconds:
//! - every node receives heartbeats, in fewer calls than heartbeats, and none as append streams
//!   (each used to be a stream of its own);
//! - no follower starts an election (no vote requests), so the heartbeats arrive in time and
//!   their answers renew the leaders' leases;
//! - ReadIndex reads (a quorum round confirmed by an urgent heartbeat) and writes are served;
//! - a client configured with ReadIndex passes ReadIndex rounds, never the lease, in its
//!   transaction's snapshot read too (`meridian_read_barriers_total`).

use crate::common::*;
use bytes::Bytes;
use meridian_client::{Client, ClientConfig, ReadConsistency};
use std::collections::BTreeMap;
use std::time::Duration;

const BASE_PORT: u16 = 19_800;
const SHARDS: u32 = 12;

fn metrics_port(node: u64) -> u16 {
    BASE_PORT + 50 + node as u16
}

fn received(samples: &BTreeMap<String, f64>, kind: &str) -> f64 {
    sample(
        samples,
        &format!("meridian_raft_messages_received_total{{type=\"{kind}\"}}"),
    )
}

#[test]
fn heartbeats_travel_in_batches_and_keep_leaders() {
    run_scenario(scenario());
}

async fn scenario() {
    let dir = tempfile::tempdir().unwrap();
    let flags: Vec<Vec<String>> = (1..=3)
        .map(|n| {
            vec![
                "--quiesce".to_string(),
                "false".to_string(),
                "--metrics-addr".to_string(),
                format!("127.0.0.1:{}", metrics_port(n)),
            ]
        })
        .collect();
    let cluster = start_cluster_with_args(BASE_PORT, dir.path(), SHARDS, &flags);
    cluster.wait_ready(READY_TIMEOUT).await.expect("ready");
    let client = connect_client(cluster.endpoints()).await;
    // Every group has committed an entry of its leader's term, so nothing but heartbeats
    // needs to travel from here on.
    for i in 0..SHARDS * 8 {
        client
            .put(Bytes::from(format!("hb/{i:04}")), Bytes::from_static(b"v"))
            .await
            .expect("put");
    }
    tokio::time::sleep(Duration::from_secs(1)).await;

    let before: Vec<_> = (1..=3).map(|n| scrape_metrics(metrics_port(n))).collect();
    tokio::time::sleep(Duration::from_secs(4)).await;
    let after: Vec<_> = (1..=3).map(|n| scrape_metrics(metrics_port(n))).collect();

    for (i, (b, a)) in before.iter().zip(&after).enumerate() {
        let node = i + 1;
        let grew = |kind: &str| received(a, kind) - received(b, kind);
        let (heartbeats, batches) = (grew("heartbeat"), grew("heartbeat_batch"));
        eprintln!(
            "node {node}: {heartbeats} heartbeats in {batches} calls, {} streamed appends, {} votes",
            grew("streamed_append"),
            grew("vote") + grew("pre_vote")
        );
        // A follower of ~8 groups at a 100 ms interval: ~80 heartbeats a second.
        assert!(
            heartbeats >= 100.0,
            "node {node} receives its groups' heartbeats: {heartbeats} in 4 s"
        );
        assert!(
            batches < heartbeats,
            "node {node}: heartbeats arrive coalesced ({heartbeats} heartbeats in {batches} calls)"
        );
        assert!(
            grew("streamed_append") < heartbeats / 10.0,
            "node {node}: heartbeats no longer travel as append streams ({} streamed appends)",
            grew("streamed_append")
        );
        assert_eq!(
            grew("vote") + grew("pre_vote"),
            0.0,
            "node {node}: no follower missed its leader's heartbeats long enough to campaign"
        );
    }
    let led: f64 = after
        .iter()
        .map(|s| sample(s, "meridian_raft_groups_led"))
        .sum();
    assert_eq!(
        led,
        f64::from(SHARDS + 1),
        "every group still has one leader"
    );

    let mut took = Vec::new();
    for i in 0..SHARDS * 8 {
        let key = Bytes::from(format!("hb/{i:04}"));
        let start = std::time::Instant::now();
        let got = client
            .get_with(key.clone(), ReadConsistency::LinearizableReadIndex)
            .await
            .expect("ReadIndex get");
        took.push(start.elapsed());
        assert_eq!(got.value.as_deref(), Some(&b"v"[..]), "{key:?}");
    }
    took.sort();
    // A figure for the log, not an assertion: a ReadIndex round's heartbeat skips the linger.
    eprintln!(
        "ReadIndex gets: p50 {:?}, max {:?}",
        took[took.len() / 2],
        took[took.len() - 1]
    );
    // A client configured with ReadIndex: its transaction's snapshot read passes a ReadIndex
    // round on both sides of settling the shard's writes in flight, and never the lease.
    let barriers = |kind: &str| -> f64 {
        (1..=3)
            .map(|n| {
                let name = format!("meridian_read_barriers_total{{kind=\"{kind}\"}}");
                sample(&scrape_metrics(metrics_port(n)), &name)
            })
            .sum()
    };
    let (lease_before, rounds_before) = (barriers("lease"), barriers("read_index"));
    let mut config = ClientConfig::new(cluster.endpoints());
    config.read_consistency = ReadConsistency::LinearizableReadIndex;
    config.call_timeout = Duration::from_secs(20);
    let careful = Client::connect(config).await.expect("connecting");
    let mut txn = careful.begin();
    let got = txn
        .get(Bytes::from_static(b"hb/0000"))
        .await
        .expect("txn get");
    assert_eq!(got.as_deref(), Some(&b"v"[..]));
    txn.commit().await.expect("read-only commit");
    let lease = barriers("lease") - lease_before;
    let rounds = barriers("read_index") - rounds_before;
    eprintln!("a ReadIndex client's transaction read: {rounds} ReadIndex rounds, {lease} leases");
    assert_eq!(
        lease, 0.0,
        "no barrier of a ReadIndex client's read is the lease"
    );
    assert!(
        rounds >= 2.0,
        "a ReadIndex round before and after the settle: {rounds}"
    );

    client
        .put(Bytes::from_static(b"hb/last"), Bytes::from_static(b"w"))
        .await
        .expect("a write after the idle period");

    drop(client);
    cluster.stop_all(Duration::from_secs(10));
}
