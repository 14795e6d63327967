//! Cluster test: transaction records and markers are collected, on a real 3-node cluster with
//! 4 shards and a 2 s GC TTL.
//!
//! 1. `TRANSFERS` transfers between two accounts on different shards run as multi-shard
//!    transactions (parallel commit): each leaves a record on its anchor's shard and a marker
//!    on the other (see `meridian-raft`'s `locks`).
//! 2. Once the leaders' GC passes report at least two records or markers deleted per transfer,
//!    the balances are read back: the sum holds and every transfer is there.
//! 3. Every node is stopped and its RocksDB opened directly: no replica holds a record or a
//!    marker any more (and no prepared lock). The control: the same transfers on a cluster
//!    with GC off (`--gc-ttl-ms 0`) keep at least two per transfer on every replica; without
//!    the control the zero could come from records never being written.

use crate::common::*;
use meridian_client::{Client, TxnOptions};
use meridian_storage::{keys, Cf, Engine, EngineOptions, RocksEngine};
use std::path::Path;
use std::time::Duration;

const BASE_PORT: u16 = 28_000;
const CONTROL_PORT: u16 = 28_200;
const TRANSFERS: u64 = 20;
const SHARDS: u32 = 4;
/// Bound on the GC passes having collected every record after the TTL.
const GC_TIMEOUT: Duration = Duration::from_secs(60);

#[test]
fn finished_transaction_records_and_markers_are_collected() {
    run_scenario(scenario());
}

/// Records and markers (`Record` kind) and prepared locks (`Locks` kind) in a stopped node's
/// RocksDB, all shards.
fn stored_txn_keys(data_dir: &Path) -> (usize, usize) {
    let engine = RocksEngine::open(&data_dir.join("db"), &EngineOptions::default())
        .expect("opening a stopped node's RocksDB");
    let (mut records, mut locks) = (0, 0);
    for item in engine.scan(Cf::Data, &[], None, false) {
        let (k, _) = item.expect("scan");
        match keys::decode_txn_key(&k) {
            Ok((keys::TxnKeyKind::Record, _, _)) => records += 1,
            Ok((keys::TxnKeyKind::Locks, _, _)) => locks += 1,
            Err(_) => {}
        }
    }
    (records, locks)
}

/// Two account keys on different shards (split points divide the keyspace by its first
/// bytes).
fn accounts(client: &Client) -> (String, String) {
    let candidates = ["a", "g", "m", "s", "user1", "user5", "user9", "zzz"];
    let first = format!("{}/acct", candidates[0]);
    let shard = client.route(first.as_bytes()).expect("routable").shard_id;
    let second = candidates
        .iter()
        .map(|c| format!("{c}/acct"))
        .find(|k| client.route(k.as_bytes()).expect("routable").shard_id != shard)
        .expect("an account on another shard");
    (first, second)
}

/// Step 1 on a fresh cluster with `gc_args`: the transfers, each read-modify-write of both
/// accounts (so each one's start timestamp is its read timestamp).
async fn transfer(port: u16, dir: &Path, gc_args: &[&str]) -> (meridian_cli::LocalCluster, Client) {
    let per_node: Vec<(u64, &[&str])> = (1..=3).map(|id| (id, gc_args)).collect();
    let cluster = start_cluster(port, dir, SHARDS, &per_node);
    cluster
        .wait_ready(READY_TIMEOUT)
        .await
        .expect("cluster ready");
    let client = connect_client(cluster.endpoints()).await;
    let (from, to) = accounts(&client);
    for _ in 0..TRANSFERS {
        let (from, to) = (from.clone(), to.clone());
        client
            .txn(TxnOptions::default(), move |txn| {
                let (from, to) = (from.clone(), to.clone());
                Box::pin(async move {
                    let a: i64 = txn.get_str(from.clone()).await?.parse().unwrap_or(0);
                    let b: i64 = txn.get_str(to.clone()).await?.parse().unwrap_or(0);
                    txn.put(from.clone(), (a - 1).to_string())?;
                    txn.put(to.clone(), (b + 1).to_string())?;
                    Ok::<_, meridian_client::Error>(())
                })
            })
            .await
            .expect("transfer");
    }
    let balance = |key: String| {
        let client = client.clone();
        async move {
            let raw = client.get(key).await.expect("get").expect("present");
            String::from_utf8_lossy(&raw)
                .parse::<i64>()
                .expect("a number")
        }
    };
    assert_eq!(balance(from).await, -(TRANSFERS as i64));
    assert_eq!(balance(to).await, TRANSFERS as i64);
    (cluster, client)
}

async fn scenario() {
    let dir = tempfile::tempdir().unwrap();
    let gc_args = ["--gc-ttl-ms", "2000", "--gc-interval-ms", "300"];
    let (cluster, client) = transfer(BASE_PORT, dir.path(), &gc_args).await;

    // 2. The leaders' passes: a record and a marker per transfer.
    let want = 2 * TRANSFERS;
    wait_for_gc_total(&cluster, "records_deleted", want, GC_TIMEOUT).await;
    let (from, to) = accounts(&client);
    let sum: i64 = [from, to]
        .into_iter()
        .map(|k| client.get(k))
        .collect::<futures::future::JoinAll<_>>()
        .await
        .into_iter()
        .map(|r| {
            let raw = r.expect("get").expect("present");
            String::from_utf8_lossy(&raw)
                .parse::<i64>()
                .expect("a number")
        })
        .sum();
    assert_eq!(sum, 0, "the transfers' total after GC");

    // 3. Nothing of them is left on any replica.
    cluster.stop_all(Duration::from_secs(20));
    for id in cluster.node_ids() {
        let data = &cluster.spec(id).expect("spec").data_dir;
        assert_eq!(stored_txn_keys(data), (0, 0), "node {id}: (records, locks)");
    }
    drop(cluster);

    // The control: GC off keeps a record and a marker per transfer.
    let control_dir = tempfile::tempdir().unwrap();
    let (control, _client) =
        transfer(CONTROL_PORT, control_dir.path(), &["--gc-ttl-ms", "0"]).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    control.stop_all(Duration::from_secs(20));
    for id in control.node_ids() {
        let data = &control.spec(id).expect("spec").data_dir;
        let (records, _) = stored_txn_keys(data);
        assert!(
            records as u64 >= want,
            "control node {id}: {records} records and markers, want at least {want}"
        );
    }
}
