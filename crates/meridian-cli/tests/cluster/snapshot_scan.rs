//! Cluster test: a scan across shards is one snapshot (the client's `multi` module).
//!
//! Three nodes, four shards, one key in each. A writer commits transactions that set all four
//! keys to the same new value; meanwhile scans of the four keys (forward and reverse, all
//! pages of every scan) must each find the four values equal: every page is read at one
//! timestamp, and a transaction is seen whole or not at all. When each page was read at its
//! own moment (before snapshot scans), a commit between two pages showed as a scan holding two
//! values.

use crate::common::*;
use bytes::Bytes;
use meridian_client::{Client, Error, TxnOptions};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const BASE_PORT: u16 = 16_300;
/// One key per shard of `--initial-shards 4` (splits user305584, user511168, user716752).
const KEYS: [&str; 4] = ["user1snap", "user4snap", "user6snap", "user8snap"];
/// How long the scans run against the writer.
const SCAN_FOR: Duration = Duration::from_secs(8);
/// Fewest scans that must have seen the writer's keys (the run would prove nothing otherwise).
const MIN_SCANS: usize = 50;

#[test]
fn a_scan_across_shards_is_one_snapshot() {
    run_scenario(scenario());
}

async fn scenario() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = start_cluster(BASE_PORT, dir.path(), 4, &[]);
    cluster
        .wait_ready(READY_TIMEOUT)
        .await
        .expect("cluster ready");
    let endpoints: Vec<String> = (1..=3).map(|id| cluster.client_addr(id).unwrap()).collect();
    let client = connect_client(endpoints).await;
    write_all(&client, 0).await.expect("the first write");

    let stop = Arc::new(AtomicBool::new(false));
    let committed = Arc::new(AtomicU64::new(0));
    let writer = tokio::spawn(writer(client.clone(), stop.clone(), committed.clone()));

    let started = Instant::now();
    let mut scans = 0usize;
    let mut states = Vec::new();
    while started.elapsed() < SCAN_FOR {
        let reverse = scans % 2 == 1;
        let rows = client
            .scan("user", Some(Bytes::from("userz")), 100, reverse)
            .await
            .expect("scan");
        let values: Vec<String> = rows
            .iter()
            .map(|r| String::from_utf8_lossy(&r.value).into_owned())
            .collect();
        assert_eq!(rows.len(), KEYS.len(), "scan {scans}: rows {values:?}");
        assert!(
            values.windows(2).all(|w| w[0] == w[1]),
            "scan {scans} (reverse {reverse}) saw two states of the writer's transactions: \
             {values:?} (keys {:?})",
            rows.iter().map(|r| r.key.clone()).collect::<Vec<_>>()
        );
        states.push(values[0].clone());
        scans += 1;
    }
    stop.store(true, Ordering::SeqCst);
    writer.await.unwrap();
    let commits = committed.load(Ordering::SeqCst);
    states.dedup();
    eprintln!(
        "{scans} scans in {SCAN_FOR:?}, {commits} transactions committed, {} distinct states seen",
        states.len()
    );
    assert!(scans >= MIN_SCANS, "only {scans} scans");
    assert!(
        states.len() > 1 && commits > 1,
        "the scans never saw the writer move on"
    );
    assert_no_panics(&cluster, &[1, 2, 3]);
}

/// Sets every key to `value` in one transaction.
async fn write_all(client: &Client, value: u64) -> Result<(), Error> {
    client
        .txn(TxnOptions::default(), |txn| {
            Box::pin(async move {
                for key in KEYS {
                    txn.put(key, value.to_string())?;
                }
                Ok::<_, Error>(())
            })
        })
        .await
        .map(|_| ())
}

async fn writer(client: Client, stop: Arc<AtomicBool>, committed: Arc<AtomicU64>) {
    let mut value = 0;
    while !stop.load(Ordering::SeqCst) {
        value += 1;
        match write_all(&client, value).await {
            Ok(()) => {
                committed.fetch_add(1, Ordering::SeqCst);
            }
            Err(e) => eprintln!("writer: transaction {value} failed: {e}"),
        }
    }
}
