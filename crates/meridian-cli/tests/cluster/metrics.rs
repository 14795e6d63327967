//! Cluster test: every node serves its metrics on `--metrics-addr` (`GET /metrics`, Prometheus
//! text), and the figures move with the work: writes drive the log writer and the peer
//! appends, every shard is led by someone, and the idle cluster's groups quiesce.

use crate::common::*;
use bytes::Bytes;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

const BASE_PORT: u16 = 29_100;
const SHARDS: u32 = 4;

fn metrics_port(node: u64) -> u16 {
    BASE_PORT + 50 + node as u16
}

/// One HTTP/1.1 request to `node`'s metrics port; returns (status line, body).
fn http(node: u64, request: &str) -> (String, String) {
    metrics_http(metrics_port(node), request)
}

fn scrape(node: u64) -> BTreeMap<String, f64> {
    scrape_metrics(metrics_port(node))
}

#[test]
fn nodes_serve_metrics_that_follow_the_work() {
    run_scenario(scenario());
}

async fn scenario() {
    let dir = tempfile::tempdir().unwrap();
    let flags = metrics_flags(metrics_port);
    let cluster = start_cluster_with_args(BASE_PORT, dir.path(), SHARDS, &flags);
    cluster.wait_ready(READY_TIMEOUT).await.expect("ready");

    let before: Vec<_> = (1..=3).map(scrape).collect();
    for (i, samples) in before.iter().enumerate() {
        let node = i + 1;
        assert_eq!(
            sample(samples, "meridian_raft_groups{state=\"awake\"}")
                + sample(samples, "meridian_raft_groups{state=\"quiesced\"}"),
            f64::from(SHARDS + 1),
            "node {node} hosts every shard and the metadata shard"
        );
        assert!(sample(samples, "meridian_process_resident_memory_bytes") > 1e6);
        // The binary allocates with jemalloc and exports its figures, nested as they must be.
        let heap = |kind: &str| sample(samples, &format!("meridian_heap_bytes{{kind=\"{kind}\"}}"));
        let (allocated, active, resident) = (heap("allocated"), heap("active"), heap("resident"));
        assert!(
            allocated > 1e6 && active >= allocated && resident >= active && heap("metadata") > 0.0,
            "node {node}: heap allocated {allocated}, active {active}, resident {resident}"
        );
        // Every kind is exported; a node that has written its shards' state holds memtables.
        for kind in ["block_cache", "block_cache_pinned", "table_readers"] {
            assert!(
                samples.contains_key(&format!("meridian_storage_memory_bytes{{kind=\"{kind}\"}}"))
            );
        }
        assert!(sample(samples, "meridian_storage_memory_bytes{kind=\"memtables\"}") > 0.0);
        assert!(samples.contains_key(&format!(
            "meridian_node_info{{node_id=\"{node}\",region=\"{}\",zone=\"a\"}}",
            cluster.spec(node as u64).unwrap().region
        )));
    }

    let client = connect_client(cluster.endpoints()).await;
    for i in 0..200u32 {
        client
            .put(
                Bytes::from(format!("metrics/{i:04}")),
                Bytes::from(vec![b'v'; 100]),
            )
            .await
            .expect("put");
    }

    let after: Vec<_> = (1..=3).map(scrape).collect();
    let led: f64 = after
        .iter()
        .map(|s| sample(s, "meridian_raft_groups_led"))
        .sum();
    assert_eq!(led, f64::from(SHARDS + 1), "every group has one leader");
    // A leader keeps one replication stream to each follower, on connections of their own.
    let mut streams_in_cluster = 0.0;
    for (i, a) in after.iter().enumerate() {
        let node = i as u64 + 1;
        let (mut streams, mut connections) = (0.0, 0.0);
        for peer in (1..=3).filter(|&p| p != node) {
            streams += sample(
                a,
                &format!("meridian_peer_replication_streams{{peer=\"{peer}\"}}"),
            );
            connections += sample(
                a,
                &format!("meridian_peer_replication_connections{{peer=\"{peer}\"}}"),
            );
        }
        let led = sample(a, "meridian_raft_groups_led");
        eprintln!("node {node}: leads {led} groups, {streams} replication streams on {connections} connections");
        assert!(
            streams <= 2.0 * led && connections <= 2.0,
            "node {node}: {streams} streams on {connections} connections, leading {led} groups"
        );
        streams_in_cluster += streams;
    }
    assert!(streams_in_cluster > 0.0, "no replication stream is counted");
    for (i, (b, a)) in before.iter().zip(&after).enumerate() {
        let grew = |name: &str| sample(a, name) > sample(b, name);
        assert!(
            grew("meridian_log_writer_syncs_total"),
            "node {}: 200 writes replicated to every node sync its log",
            i + 1
        );
        assert!(grew("meridian_log_writer_flushes_total"));
        // Apply (every node) and replication (leaders) read new entries from the shards'
        // in-memory tails, not from RocksDB.
        let reads = |s: &BTreeMap<String, f64>, from: &str| {
            sample(
                s,
                &format!("meridian_raft_log_reads_total{{from=\"{from}\"}}"),
            )
        };
        let (memory, stored) = (
            reads(a, "memory") - reads(b, "memory"),
            reads(a, "rocksdb") - reads(b, "rocksdb"),
        );
        // A follower may apply several entries per read, so the floor is well below 200.
        eprintln!(
            "node {}: log reads from memory {memory}, from RocksDB {stored}",
            i + 1
        );
        assert!(
            memory >= 20.0 && memory > 10.0 * stored,
            "node {}: log reads from memory {memory}, from RocksDB {stored}",
            i + 1
        );
        assert!(sample(a, "meridian_process_cpu_seconds_total") > 0.0);
        assert!(sample(a, "meridian_requests_in_flight_limit") > 0.0);
    }
    let appends_received: f64 = after
        .iter()
        .zip(&before)
        .map(|(a, b)| {
            let total = |s: &BTreeMap<String, f64>| {
                sample(s, "meridian_raft_messages_received_total{type=\"append\"}")
                    + sample(
                        s,
                        "meridian_raft_messages_received_total{type=\"streamed_append\"}",
                    )
            };
            total(a) - total(b)
        })
        .sum();
    assert!(
        appends_received >= 200.0,
        "200 replicated writes reach the followers as appends: {appends_received}"
    );

    // Idle, the groups quiesce (bounded wait) and the gauge says so.
    let give_up = Instant::now() + Duration::from_secs(30);
    loop {
        let quiesced: f64 = (1..=3)
            .map(|n| sample(&scrape(n), "meridian_raft_groups{state=\"quiesced\"}"))
            .sum();
        if quiesced >= f64::from(SHARDS) {
            break;
        }
        assert!(
            Instant::now() < give_up,
            "idle groups did not show as quiesced: {quiesced}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    // Anything but GET /metrics is refused.
    assert_eq!(
        http(1, "GET / HTTP/1.1\r\n\r\n").0,
        "HTTP/1.1 404 Not Found"
    );
    assert_eq!(
        http(1, "POST /metrics HTTP/1.1\r\n\r\n").0,
        "HTTP/1.1 405 Method Not Allowed"
    );
    let huge = format!("GET /metrics HTTP/1.1\r\nX: {}\r\n\r\n", "a".repeat(10_000));
    assert_eq!(
        http(1, &huge).0,
        "HTTP/1.1 431 Request Header Fields Too Large"
    );

    drop(client);
    cluster.stop_all(Duration::from_secs(10));
}
