//! Cluster test of commit-wait (`TxnOptions::linearizable`): with one node's clock 300 ms
//! ahead (max offset 500 ms), a transaction that commits on that node's shard and returns is
//! followed by one on another node's shard. Without commit-wait the second is often stamped
//! *below* the first (a causal reverse: a snapshot between them sees the second and not the
//! first); with it, never. The same for a read-only transaction that reads the first one's
//! write before the first one's own commit-wait is over (here: the first one does not wait at
//! all): without commit-wait of its own, the transaction begun after it returned is often
//! stamped below what it read; with it, never.
//!
//! Replication factor 1, so each shard lives on one node and nothing replicates the first
//! commit to the second shard's node: with 3 replicas on 3 nodes the first commit's Raft
//! append would carry its timestamp to every node's HLC before it is acknowledged, and the
//! control could not fire. Pings still carry the fast clock now and then, so the control
//! counts reverses over several pairs and needs only one.

use crate::common::*;
use bytes::Bytes;
use meridian_cli::demo::keys_across_shards;
use meridian_client::{fetch_status, Client, Timestamp, TxnOptions};
use std::time::{Duration, Instant};

const FAST_NODE: u64 = 2;
const PAIRS: usize = 6;

#[test]
fn commit_wait_orders_a_later_transaction_on_a_slower_node_above() {
    run_scenario(scenario());
}

async fn scenario() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("rf1.toml");
    std::fs::write(&config, "[cluster]\nreplication_factor = 1\n").unwrap();
    let config = config.to_str().unwrap();
    let cluster = start_cluster(
        32_200,
        dir.path(),
        6,
        &[
            (1, &["--config", config, "--max-offset-ms", "500"]),
            (
                FAST_NODE,
                &[
                    "--config",
                    config,
                    "--max-offset-ms",
                    "500",
                    "--clock-offset-ms",
                    "300",
                ],
            ),
            (3, &["--config", config, "--max-offset-ms", "500"]),
        ],
    );
    wait_every_shard_led(&cluster).await;
    let client = connect_client(cluster.endpoints()).await;
    client.refresh_shard_map().await.expect("shard map");
    let map = client.shard_map();
    let keys = keys_across_shards(&map, map.shards().len());
    // One key per shard, by the node holding it.
    let on = |node: u64| -> Vec<Bytes> {
        keys.iter()
            .filter(|k| {
                let shard = map.shards().iter().find(|s| s.contains(k)).expect("routed");
                shard.replicas == [node]
            })
            .cloned()
            .collect()
    };
    let (fast, slow, third) = (on(FAST_NODE), on(1), on(3));
    assert!(
        !fast.is_empty() && !slow.is_empty() && !third.is_empty(),
        "every node should hold a shard: {:?}",
        map.shards()
    );
    // A one-shard commit on the fast node, and a multi-shard one whose other participant is
    // on node 3 (the fast node's prepare sets the commit timestamp).
    let one_shard = vec![fast[0].clone()];
    let two_shards = vec![fast[0].clone(), third[0].clone()];
    for (name, first_keys) in [("one-shard", &one_shard), ("multi-shard", &two_shards)] {
        let reverses = pairs(&client, first_keys, &slow[0], false).await;
        eprintln!("{name}, no commit-wait: {reverses} of {PAIRS} pairs reversed");
        assert!(
            reverses > 0,
            "control: without commit-wait no pair was reversed, so this test cannot tell \
             commit-wait works ({name})"
        );
        let started = Instant::now();
        let reverses = pairs(&client, first_keys, &slow[0], true).await;
        eprintln!(
            "{name}, commit-wait: {reverses} of {PAIRS} pairs reversed ({:?} a pair)",
            started.elapsed() / PAIRS as u32
        );
        assert_eq!(reverses, 0, "{name}: commit-wait let a later commit below");
    }
    let reverses = reader_pairs(&client, &fast[0], &slow[0], false).await;
    eprintln!("read-only, no commit-wait: {reverses} of {PAIRS} pairs reversed");
    assert!(
        reverses > 0,
        "control: without the reader's commit-wait no pair was reversed (read-only)"
    );
    let started = Instant::now();
    let reverses = reader_pairs(&client, &fast[0], &slow[0], true).await;
    eprintln!(
        "read-only, commit-wait: {reverses} of {PAIRS} pairs reversed ({:?} a pair)",
        started.elapsed() / PAIRS as u32
    );
    assert_eq!(
        reverses, 0,
        "a read-only commit-wait let a later commit below what it read"
    );
    cluster.stop_all(Duration::from_secs(20));
}

/// Runs PAIRS pairs: a transaction writing `first_keys` (with commit-wait if `linearizable`),
/// then, once it returned, one writing `second_key`. Returns how many second commits were
/// stamped below their first.
async fn pairs(
    client: &Client,
    first_keys: &[Bytes],
    second_key: &Bytes,
    linearizable: bool,
) -> usize {
    let mut reverses = 0;
    for i in 0..PAIRS {
        let options = TxnOptions {
            linearizable,
            ..TxnOptions::default()
        };
        let first = put_all(client, first_keys, i, options).await;
        let second = put_all(
            client,
            std::slice::from_ref(second_key),
            i,
            TxnOptions::default(),
        )
        .await;
        if second < first {
            reverses += 1;
        }
        // Apart, so that pings between pairs land at different points of each pair.
        tokio::time::sleep(Duration::from_millis(37)).await;
    }
    reverses
}

/// `LocalCluster::wait_ready` asks one node, which knows the leaders of its own shards only
/// when each shard has one replica: this asks every node and counts a shard led if any does.
async fn wait_every_shard_led(cluster: &meridian_cli::LocalCluster) {
    let give_up = Instant::now() + READY_TIMEOUT;
    loop {
        let mut led = std::collections::BTreeSet::new();
        let mut total = 0;
        for node in 1..=3 {
            let addr = cluster.client_addr(node).expect("address");
            if let Ok(status) = fetch_status(&addr, Duration::from_secs(2)).await {
                total = total.max(status.shards.len());
                led.extend(
                    status
                        .shards
                        .iter()
                        .filter(|s| s.leader_id == node)
                        .map(|s| s.shard_id),
                );
            }
        }
        if total > 1 && led.len() == total {
            return;
        }
        assert!(
            Instant::now() < give_up,
            "{} of {total} shards led after {READY_TIMEOUT:?}",
            led.len()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Runs PAIRS times: a write of `fast_key` without commit-wait, a read-only transaction (with
/// commit-wait if `linearizable`) that reads it, then, once that returned, a write of
/// `slow_key`. Returns how many of those were stamped below the version the reader saw.
async fn reader_pairs(
    client: &Client,
    fast_key: &Bytes,
    slow_key: &Bytes,
    linearizable: bool,
) -> usize {
    let mut reverses = 0;
    for i in 0..PAIRS {
        let seen = put_all(
            client,
            std::slice::from_ref(fast_key),
            i,
            TxnOptions::default(),
        )
        .await;
        let options = TxnOptions {
            linearizable,
            ..TxnOptions::default()
        };
        let key = fast_key.clone();
        let (value, info) = client
            .txn(options, move |txn| {
                let key = key.clone();
                Box::pin(async move { txn.get(key).await })
            })
            .await
            .expect("read-only transaction");
        assert_eq!(value.as_deref(), Some(format!("v{i}").as_bytes()));
        assert_eq!(info.commit_ts, None, "read-only");
        let later = put_all(
            client,
            std::slice::from_ref(slow_key),
            i,
            TxnOptions::default(),
        )
        .await;
        if later < seen {
            reverses += 1;
        }
        tokio::time::sleep(Duration::from_millis(37)).await;
    }
    reverses
}

async fn put_all(client: &Client, keys: &[Bytes], i: usize, options: TxnOptions) -> Timestamp {
    let keys = keys.to_vec();
    let ((), info) = client
        .txn(options, move |txn| {
            let keys = keys.clone();
            Box::pin(async move {
                for key in keys {
                    txn.put(key, format!("v{i}"))?;
                }
                Ok::<_, meridian_client::Error>(())
            })
        })
        .await
        .expect("commit");
    info.commit_ts
        .expect("a writing transaction has a commit timestamp")
}
