//! Cluster test: early locks (`TxnOptions::early_locks`) turn lost races on hot keys into
//! waits, and correctness does not depend on them.
//!
//! A 3-node cluster with one data shard. `TASKS` tasks run `TRANSFERS` transfers between
//! `ACCOUNTS` accounts (random pairs, so every account is hot): read both with
//! `Txn::batch_get_for_update`, write both. Twice, on fresh accounts: first without early
//! locks, then with them.
//! - Both runs keep the total (a serializable read of every account at the end), and no
//!   transfer fails.
//! - With locks, the extra attempts (retries) are at most a quarter of those without. The run
//!   without locks is the control: it shows the workload does contend (it must retry at
//!   least `MIN_CONTROL_RETRIES` times), so the comparison can fail.
//! - The leader's metrics show keys granted after a wait and locks released by commits with
//!   locks on, and no lock asked for with them off.
//! - A locking read at a given timestamp of a key written again since (more than
//!   `max_offset` later, so not uncertain) answers that version as uncertain and no value,
//!   so the transaction restarts there rather than commit to fail; the same read without the
//!   lock, the control, answers the old value.
//! - A third run with locks moves the shard's leadership to the next node every `MOVE_EVERY`
//!   while it runs (at least `MIN_MOVES` moves): locks held and waits queued at a deposed
//!   leader must cost only retries. It keeps the total, no transfer fails, and no waiter is
//!   left on any node. (Moves every 300 ms starved every transfer, with or without locks: a
//!   new leader issues no timestamp until `max_offset`, 500 ms, after its term began, see
//!   `meridian-raft`'s `issued`; with `--max-offset-ms 100` they went on.)

use crate::common::*;
use meridian_client::{proto, Client, Error, TxnOptions};
use rand::{Rng, SeedableRng};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const BASE_PORT: u16 = 30_300;
const SHARDS: u32 = 1;
const ACCOUNTS: usize = 10;
const OPENING: i64 = 1_000;
const TASKS: usize = 32;
const TRANSFERS: usize = 2_000;
const MAX_ATTEMPTS: u32 = 64;
const MIN_CONTROL_RETRIES: u64 = 200;
const MOVE_EVERY: Duration = Duration::from_secs(1);
const MIN_MOVES: u64 = 3;

#[test]
fn early_locks_turn_retries_into_waits_and_keep_the_total() {
    run_scenario(scenario());
}

fn metrics_port(node: u64) -> u16 {
    BASE_PORT + 50 + node as u16
}

fn account(run: &str, i: usize) -> String {
    format!("early/{run}/acct{i:02}")
}

/// Sums every node's samples of `name` (only the leader serves locks).
fn total(name: &str) -> f64 {
    (1..=3)
        .map(|n| sample(&scrape_metrics(metrics_port(n)), name))
        .sum()
}

fn parse(value: Option<bytes::Bytes>) -> Result<i64, Error> {
    value
        .as_deref()
        .and_then(|v| std::str::from_utf8(v).ok())
        .and_then(|t| t.parse().ok())
        .ok_or_else(|| Error::InvalidArgument {
            message: format!("{value:?} is not a balance"),
        })
}

/// One transfer; returns its attempts.
async fn transfer(
    client: &Client,
    early_locks: bool,
    from: String,
    to: String,
    amount: i64,
) -> Result<u32, Error> {
    let options = TxnOptions {
        early_locks,
        max_attempts: MAX_ATTEMPTS,
        deadline: Some(Duration::from_secs(60)),
        ..TxnOptions::default()
    };
    let (_, info) = client
        .txn(options, move |txn| {
            let (from, to) = (from.clone(), to.clone());
            Box::pin(async move {
                let mut values = txn.batch_get_for_update([from.clone(), to.clone()]).await?;
                let b = parse(values.pop().flatten())?;
                let a = parse(values.pop().flatten())?;
                let moved = amount.min(a);
                txn.put(from, (a - moved).to_string())?;
                txn.put(to, (b + moved).to_string())?;
                Ok::<_, Error>(())
            })
        })
        .await?;
    Ok(info.attempts)
}

/// Runs the transfers of one run; returns (retries, failures, elapsed).
async fn run(client: Arc<Client>, name: &'static str, early_locks: bool) -> (u64, u64, Duration) {
    let entries: Vec<(String, String)> = (0..ACCOUNTS)
        .map(|i| (account(name, i), OPENING.to_string()))
        .collect();
    client.batch_put(entries).await.expect("opening balances");
    let (retries, failures) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for t in 0..TASKS {
        let (client, retries, failures) = (client.clone(), retries.clone(), failures.clone());
        tasks.push(tokio::spawn(async move {
            let mut rng = rand::rngs::StdRng::seed_from_u64(t as u64);
            for _ in (t..TRANSFERS).step_by(TASKS) {
                let a = rng.gen_range(0..ACCOUNTS);
                let b = (a + rng.gen_range(1..ACCOUNTS)) % ACCOUNTS;
                let amount = rng.gen_range(1..=10);
                match transfer(
                    &client,
                    early_locks,
                    account(name, a),
                    account(name, b),
                    amount,
                )
                .await
                {
                    Ok(attempts) => {
                        retries.fetch_add(u64::from(attempts - 1), Ordering::Relaxed);
                    }
                    Err(e) => {
                        eprintln!("{name}: a transfer failed: {e}");
                        failures.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }));
    }
    for task in tasks {
        task.await.expect("a transfer task");
    }
    let elapsed = started.elapsed();
    let keys: Vec<String> = (0..ACCOUNTS).map(|i| account(name, i)).collect();
    let (sum, _) = client
        .txn(TxnOptions::default(), move |txn| {
            let keys = keys.clone();
            Box::pin(async move {
                let mut sum = 0;
                for value in txn.batch_get(keys).await? {
                    sum += parse(value)?;
                }
                Ok::<_, Error>(sum)
            })
        })
        .await
        .expect("the sum");
    assert_eq!(sum, OPENING * ACCOUNTS as i64, "{name}: the total moved");
    let retries = retries.load(Ordering::Relaxed);
    let failures = failures.load(Ordering::Relaxed);
    eprintln!("{name}: {TRANSFERS} transfers in {elapsed:?}, {retries} retries, {failures} failed");
    (retries, failures, elapsed)
}

/// A raw snapshot `BatchGet` of `key` at `read_ts` at the shard's leader, locking or not.
async fn raw_read(
    client: &Client,
    cluster: &meridian_cli::LocalCluster,
    key: &str,
    read_ts: u64,
    lock: bool,
) -> proto::BatchGetResponse {
    let status = client.status().await.expect("status");
    let shard = client.route(key.as_bytes()).expect("routable").shard_id;
    let leader = status
        .shards
        .iter()
        .find(|s| s.shard_id == shard)
        .map(|s| s.leader_id)
        .expect("the shard");
    let addr = cluster.client_addr(leader).expect("leader address");
    let mut kv = proto::kv_client::KvClient::connect(format!("http://{addr}"))
        .await
        .expect("connect to the leader");
    let request = proto::BatchGetRequest {
        keys: vec![bytes::Bytes::from(key.to_string())],
        snapshot: Some(proto::TxnSnapshot {
            read_ts,
            ..Default::default()
        }),
        lock: lock.then_some(proto::LockRequest {
            owner: Some(proto::WriteId {
                client_id: 77,
                seq: 1,
            }),
            priority: 2,
            age_ts: read_ts,
            wait_ms: 0,
        }),
        ..Default::default()
    };
    kv.batch_get(request).await.expect("batch_get").into_inner()
}

/// A locking read at an old timestamp restarts at the key's newer version (see the docs).
async fn refresh(client: &Client, cluster: &meridian_cli::LocalCluster) {
    let key = "early/refresh";
    let old = client.put(key, "old").await.expect("put");
    tokio::time::sleep(Duration::from_millis(700)).await; // past max_offset (500 ms)
    let new = client.put(key, "new").await.expect("put");
    let plain = raw_read(client, cluster, key, old.0, false).await;
    assert_eq!(
        plain.snapshot.as_ref().unwrap().uncertain_ts,
        0,
        "the control is certain"
    );
    assert_eq!(&plain.results[0].value[..], b"old");
    let locking = raw_read(client, cluster, key, old.0, true).await;
    assert_eq!(locking.snapshot.as_ref().unwrap().uncertain_ts, new.0);
    assert!(locking.results.is_empty(), "no value with a restart");
    assert_eq!(locking.lock.expect("a lock reply").held, vec![true]);
}

/// Runs the transfers of `run` with locks while a task hands the shard's leadership to the
/// next node every `MOVE_EVERY`; returns the run's failures and the moves made.
async fn run_moving_leader(client: Arc<Client>) -> (u64, u64) {
    let shard = client
        .route(account("moving", 0).as_bytes())
        .expect("routable")
        .shard_id;
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (mover_client, mover_stop) = (client.clone(), stop.clone());
    let mover = tokio::spawn(async move {
        let mut moves = 0u64;
        while !mover_stop.load(Ordering::SeqCst) {
            let Ok(status) = mover_client.status().await else {
                tokio::time::sleep(MOVE_EVERY).await;
                continue;
            };
            let Some(leader) = status
                .shards
                .iter()
                .find(|s| s.shard_id == shard)
                .map(|s| s.leader_id)
                .filter(|&l| l != 0)
            else {
                tokio::time::sleep(MOVE_EVERY).await;
                continue;
            };
            match mover_client.transfer_leader(shard, leader % 3 + 1).await {
                Ok(_) => moves += 1,
                Err(e) => eprintln!("moving: a leader transfer failed: {e}"),
            }
            tokio::time::sleep(MOVE_EVERY).await;
        }
        moves
    });
    let (_, failures, _) = run(client, "moving", true).await;
    stop.store(true, Ordering::SeqCst);
    let moves = mover.await.expect("the mover");
    eprintln!(
        "moving: {moves} leader moves, {} tables cleared for a newer term",
        total("meridian_early_lock_table_clears_total")
    );
    (failures, moves)
}

/// Waits (bounded) until no node has a lock waiter: a deposed leader's waits end by their
/// own deadline (at most `EARLY_LOCK_WAIT_MAX_MS`).
async fn no_waiters_left() {
    for _ in 0..50 {
        if total("meridian_early_lock_waiters") == 0.0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!(
        "{} lock waiters left behind",
        total("meridian_early_lock_waiters")
    );
}

async fn scenario() {
    let dir = tempfile::tempdir().unwrap();
    let flags = metrics_flags(metrics_port);
    let cluster = start_cluster_with_args(BASE_PORT, dir.path(), SHARDS, &flags);
    cluster.wait_ready(READY_TIMEOUT).await.expect("ready");
    let client = Arc::new(connect_client(cluster.endpoints()).await);

    let (off_retries, off_failures, _) = run(client.clone(), "off", false).await;
    let asked = |result: &str| {
        total(&format!(
            "meridian_early_lock_keys_total{{result=\"{result}\"}}"
        ))
    };
    let asked_off: f64 = ["free", "own", "wound", "waited", "not_held"]
        .iter()
        .map(|r| asked(r))
        .sum();
    assert_eq!(asked_off, 0.0, "no lock is asked for with early locks off");
    assert_eq!(off_failures, 0, "no transfer failed without locks");
    assert!(
        off_retries >= MIN_CONTROL_RETRIES,
        "the control contends too little to show anything: {off_retries} retries"
    );

    let (on_retries, on_failures, _) = run(client.clone(), "on", true).await;
    assert_eq!(on_failures, 0, "no transfer failed with locks");
    assert!(
        on_retries * 4 <= off_retries,
        "early locks should cut retries to a quarter: {on_retries} with, {off_retries} without"
    );
    assert!(asked("waited") > 0.0, "some lock was granted after a wait");
    assert!(
        total("meridian_early_lock_releases_total{by=\"commit\"}") > 0.0,
        "commits released their locks"
    );
    assert_eq!(
        total("meridian_early_lock_waiters"),
        0.0,
        "no waiter left behind"
    );
    refresh(&client, &cluster).await;
    assert!(total("meridian_early_lock_refreshes_total") >= 1.0);

    let (moving_failures, moves) = run_moving_leader(client.clone()).await;
    assert!(
        moves >= MIN_MOVES,
        "the leader moved too little to show anything: {moves} moves"
    );
    assert_eq!(
        moving_failures, 0,
        "no transfer failed while the leader moved"
    );
    no_waiters_left().await;
    drop(cluster);
}
