//! Cluster test: wound-wait keeps a large transaction from starving behind a stream of small
//! ones, on a real 3-node cluster with 4 shards.
//!
//! `WRITERS` tasks run small multi-shard transactions without pause, each writing two of the
//! `HOT` keys (spread over the four shards), so at any moment many of those keys are locked
//! by a prepared transaction. Meanwhile one large transaction writes every hot key:
//!
//! 1. By default its first two attempts fail at once on a lock, like any transaction's; from
//!    the third on it follows wound-wait, senior to every small transaction that began after
//!    its first attempt: its prepares wound the small transactions' locks they meet, and small
//!    prepares (from their third attempt) that meet its locks wait. It must commit within
//!    `MAX_ATTEMPTS`, and the client must report wounds (else the run did not exercise them).
//! 2. The control, on the same cluster under the same load: the same transaction with
//!    `no_wait` (a prepare that meets a lock fails at once) must exhaust its `MAX_ATTEMPTS`
//!    with a conflict. Without the control, step 1 could pass on a cluster where the small
//!    transactions never held a lock it could meet.
//!
//! Afterwards every hot key is read (no lock is left for good) and the small transactions
//! must have committed throughout (they were not starved either).

use crate::common::*;
use bytes::Bytes;
use meridian_client::{Client, Error, TxnOptions};
use rand::{Rng, SeedableRng};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const BASE_PORT: u16 = 31_000;
const SHARDS: u32 = 4;
/// Hot keys per shard.
const PER_SHARD: usize = 4;
const WRITERS: usize = 6;
const MAX_ATTEMPTS: u32 = 8;

#[test]
fn wound_wait_lets_a_large_transaction_commit_against_a_stream_of_small_ones() {
    run_scenario(scenario());
}

/// `PER_SHARD` keys on each of `SHARDS` shards, grouped by shard.
fn hot_keys(client: &Client) -> Vec<Vec<Bytes>> {
    let mut by_shard: std::collections::BTreeMap<u64, Vec<Bytes>> = Default::default();
    // Default split points divide the `user…` range (YCSB keys) as well as the rest.
    let prefixes = (b'a'..=b'z')
        .map(|c| (c as char).to_string())
        .chain((0..10).map(|d| format!("user{d}")));
    for prefix in prefixes {
        for i in 0..PER_SHARD {
            let key = Bytes::from(format!("{prefix}/hot/{i}"));
            let shard = client.route(&key).expect("routable").shard_id;
            let keys = by_shard.entry(shard).or_default();
            if keys.len() < PER_SHARD {
                keys.push(key);
            }
        }
    }
    let groups: Vec<Vec<Bytes>> = by_shard
        .into_values()
        .filter(|keys| keys.len() == PER_SHARD)
        .collect();
    assert_eq!(groups.len(), SHARDS as usize, "hot keys on every shard");
    groups
}

/// Writes `value` to every key in `keys` in one transaction.
async fn write_all(
    client: &Client,
    options: TxnOptions,
    keys: Vec<Bytes>,
    value: String,
) -> Result<u32, Error> {
    let (_, info) = client
        .txn(options, move |txn| {
            let (keys, value) = (keys.clone(), value.clone());
            Box::pin(async move {
                for key in keys {
                    txn.put(key, value.clone())?;
                }
                Ok::<_, Error>(())
            })
        })
        .await?;
    Ok(info.attempts)
}

/// One small writer: two hot keys of different shards per transaction, until `stop`.
async fn small_writer(
    client: Client,
    groups: Arc<Vec<Vec<Bytes>>>,
    seed: u64,
    stop: Arc<AtomicBool>,
    committed: Arc<AtomicU64>,
) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let a = rng.gen_range(0..groups.len());
        let b = (a + rng.gen_range(1..groups.len())) % groups.len();
        let keys = vec![
            groups[a][rng.gen_range(0..PER_SHARD)].clone(),
            groups[b][rng.gen_range(0..PER_SHARD)].clone(),
        ];
        n += 1;
        let options = TxnOptions {
            deadline: Some(Duration::from_secs(10)),
            ..TxnOptions::default()
        };
        if write_all(&client, options, keys, format!("small-{seed}-{n}"))
            .await
            .is_ok()
        {
            committed.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Runs the large transaction against the small writers' load; its result and duration.
async fn large(client: &Client, keys: Vec<Bytes>, no_wait: bool) -> (Result<u32, Error>, Duration) {
    let options = TxnOptions {
        max_attempts: MAX_ATTEMPTS,
        deadline: Some(Duration::from_secs(30)),
        no_wait,
        ..TxnOptions::default()
    };
    let started = Instant::now();
    let result = write_all(client, options, keys, format!("large-{no_wait}")).await;
    (result, started.elapsed())
}

async fn scenario() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = start_cluster(BASE_PORT, dir.path(), SHARDS, &[]);
    cluster
        .wait_ready(READY_TIMEOUT)
        .await
        .expect("cluster ready");
    let client = connect_client(cluster.endpoints()).await;
    let groups = Arc::new(hot_keys(&client));
    let all: Vec<Bytes> = groups.iter().flatten().cloned().collect();

    let stop = Arc::new(AtomicBool::new(false));
    let committed = Arc::new(AtomicU64::new(0));
    let mut writers = Vec::new();
    for seed in 0..WRITERS as u64 {
        // A client each: the large transaction's client counts only its own wounds.
        let writer_client = connect_client(cluster.endpoints()).await;
        writers.push(tokio::spawn(small_writer(
            writer_client,
            groups.clone(),
            seed,
            stop.clone(),
            committed.clone(),
        )));
    }
    // Let the load build up.
    let warm = Instant::now();
    while committed.load(Ordering::Relaxed) < 20 && warm.elapsed() < Duration::from_secs(30) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        committed.load(Ordering::Relaxed) >= 20,
        "the small writers commit"
    );

    // 1. Wound-wait.
    let before = committed.load(Ordering::Relaxed);
    let (result, took) = large(&client, all.clone(), false).await;
    let wounds = client.wounds();
    eprintln!("wound-wait: {result:?} in {took:?}, {wounds} wounds");
    let attempts = result.expect("the large transaction commits under wound-wait");
    assert!(attempts <= MAX_ATTEMPTS);
    assert!(
        wounds > 0,
        "the large transaction met small ones' locks and wounded them"
    );

    // 2. The control: no wound-wait, same load.
    let (control, took) = large(&client, all.clone(), true).await;
    eprintln!("no_wait control: {control:?} in {took:?}");
    assert!(
        matches!(control, Err(Error::TxnConflict { .. })),
        "without wound-wait the large transaction loses every attempt: {control:?}"
    );
    assert_eq!(client.wounds(), wounds, "no_wait never wounds");

    stop.store(true, Ordering::Relaxed);
    for writer in writers {
        writer.await.expect("writer task");
    }
    let during = committed.load(Ordering::Relaxed) - before;
    eprintln!("small transactions committed while the large ones ran: {during}");
    assert!(during > 0, "the small transactions kept committing");

    // No lock is left behind: every hot key reads (a read meeting a lock would wait, then
    // recover it; a call that cannot finish fails).
    for key in &all {
        let value = client.get(key.clone()).await.expect("read a hot key");
        assert!(value.is_some(), "{key:?} was written");
    }
}
