//! Cluster test: closed timestamps reach every replica of idle, quiesced shards through the
//! node-level side channel — fresh (about `closed_ts_lag_ms` behind the clock) and advancing —
//! without waking a single group; and a write's entry carries one to the followers of an
//! awake shard.

use crate::common::*;
use bytes::Bytes;
use meridian_client::fetch_status;
use meridian_client::proto::StatusResponse;
use meridian_types::Timestamp;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

const SHARDS: u32 = 4;
const LAG_MS: u64 = 1_000;
const STATUS_TIMEOUT: Duration = Duration::from_secs(2);
const QUIESCE_TIMEOUT: Duration = Duration::from_secs(60);
/// How far behind the clock a replica's closed timestamp may be: the lag, a few publication
/// intervals (200 ms) and a loaded 2-core machine's scheduling.
const CLOSED_BEHIND_MAX_MS: u64 = LAG_MS + 2_000;

#[test]
fn idle_quiesced_shards_keep_fresh_closed_timestamps_without_waking() {
    run_scenario(scenario());
}

async fn statuses(cluster: &meridian_cli::LocalCluster) -> Vec<StatusResponse> {
    let mut out = Vec::new();
    for id in cluster.node_ids() {
        let addr = cluster.client_addr(id).expect("node address");
        if let Ok(s) = fetch_status(&addr, STATUS_TIMEOUT).await {
            out.push(s);
        }
    }
    out
}

/// Every data replica's `(quiesced, closed_ts)`, by `(node, shard)`, from the nodes' own
/// reports.
fn replicas(statuses: &[StatusResponse]) -> BTreeMap<(u64, u64), (bool, u64)> {
    statuses
        .iter()
        .flat_map(|s| {
            s.shards
                .iter()
                .filter(move |sh| sh.shard_id != 0 && sh.replicas.contains(&s.answering_node))
                .map(move |sh| ((s.answering_node, sh.shard_id), (sh.quiesced, sh.closed_ts)))
        })
        .collect()
}

async fn wait_all_quiesced(cluster: &meridian_cli::LocalCluster) {
    let started = Instant::now();
    loop {
        let all = replicas(&statuses(cluster).await);
        if all.len() == 3 * SHARDS as usize && all.values().all(|(q, _)| *q) {
            return;
        }
        assert!(
            started.elapsed() < QUIESCE_TIMEOUT,
            "not every data replica quiesced after {QUIESCE_TIMEOUT:?}: {all:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn scenario() {
    let dir = tempfile::tempdir().unwrap();
    let lag = LAG_MS.to_string();
    let args: &[&str] = &["--closed-ts-lag-ms", &lag];
    let cluster = start_cluster(
        26_000,
        dir.path(),
        SHARDS,
        &[(1, args), (2, args), (3, args)],
    );
    cluster
        .wait_ready(READY_TIMEOUT)
        .await
        .expect("cluster ready");

    // A write wakes one shard; its entry carries a closed timestamp to the followers.
    let client = connect_client(cluster.endpoints()).await;
    let commit_ts = client
        .put(Bytes::from_static(b"k"), Bytes::from_static(b"v"))
        .await
        .expect("write");
    eprintln!("wrote at {commit_ts}");

    wait_all_quiesced(&cluster).await;
    // Sampled a few times, a second apart: every replica (leaders and followers) has a closed
    // timestamp at most CLOSED_BEHIND_MAX_MS behind the clock, it advances, and every replica
    // stays quiesced throughout (the side channel wakes nothing).
    let mut last: BTreeMap<(u64, u64), u64> = BTreeMap::new();
    for round in 0..4 {
        let sampled_at_ms = now_ms();
        let all = replicas(&statuses(&cluster).await);
        assert_eq!(all.len(), 3 * SHARDS as usize, "every node answers");
        for (&(node, shard), &(quiesced, closed)) in &all {
            assert!(
                quiesced,
                "round {round}: node {node}'s shard {shard} was woken"
            );
            let behind_ms = sampled_at_ms.saturating_sub(Timestamp(closed).physical_ms());
            assert!(
                closed != 0 && behind_ms <= CLOSED_BEHIND_MAX_MS,
                "round {round}: node {node}'s shard {shard} closed at {} ({behind_ms} ms behind)",
                Timestamp(closed)
            );
            if let Some(before) = last.get(&(node, shard)) {
                assert!(
                    closed > *before,
                    "round {round}: node {node}'s shard {shard} did not advance"
                );
            }
            last.insert((node, shard), closed);
        }
        eprintln!(
            "round {round}: closed timestamps {:?} ms behind",
            all.values()
                .map(|(_, c)| sampled_at_ms.saturating_sub(Timestamp(*c).physical_ms()))
                .collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    for id in cluster.node_ids() {
        let log = cluster.log_contents(id).unwrap();
        assert!(!log.contains("panicked"), "node {id} panicked:\n{log}");
    }
}
