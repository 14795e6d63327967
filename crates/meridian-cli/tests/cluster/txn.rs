//! Cluster test: transactions on a real 3-node cluster with 4 data shards.
//!
//! 1. The CLI's `kv txn`: a write transaction prints its commit timestamp, a read-only one
//!    prints what it read, a transaction writing two shards commits on both and leaves no
//!    lock behind when the CLI exits (raw reads of both keys at once meet none),
//!    `--isolation snapshot` commits and an unknown isolation is a usage error.
//! 2. Bank: 16 accounts, 4 on each of the 4 shards, a fixed total. Workers through different
//!    nodes run transfers between two accounts (read both, move an amount, never below zero),
//!    half of them between two shards (a parallel commit), and read-only transactions that sum
//!    all 16 accounts across the 4 shards.
//!    The leader of one shard is SIGKILLed in the middle. Every committed sum must equal the
//!    total, no balance may go negative, and the final sum must equal the total.
//! 3. Write skew, interleaved by hand, in one shard and across two: under snapshot isolation
//!    two transactions that read the same two keys and each write one both commit (the
//!    control); serializable ones do not, nor snapshot ones that read with `get_for_update`.
//! 4. Negative control: transfers done with plain gets and puts (no transaction) between two
//!    accounts lose updates, so the balances end away from their exact values. If they do
//!    not, the workload is too gentle to show anything and the test fails.

use crate::common::*;
use meridian_client::{Client, Error, Isolation, TxnOptions};
use rand::{Rng, SeedableRng};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const BASE_PORT: u16 = 24_200;
const WORKERS: usize = 8;
const TRANSFERS_PER_WORKER: usize = 40;
const KILL_AFTER_TRANSFERS: usize = 100;
const INITIAL_BALANCE: i64 = 100;
/// Moves each worker of the negative control makes.
const CONTROL_ROUNDS: usize = 30;
/// One prefix per shard of `--initial-shards 4` (splits user305584, user511168, user716752).
const SHARD_PREFIXES: [&str; 4] = ["user1acct", "user4acct", "user6acct", "user8acct"];
const ACCOUNTS_PER_SHARD: usize = 4;

fn account(shard: usize, i: usize) -> String {
    format!("{}{i}", SHARD_PREFIXES[shard])
}

fn all_accounts() -> Vec<String> {
    (0..SHARD_PREFIXES.len())
        .flat_map(|s| (0..ACCOUNTS_PER_SHARD).map(move |i| account(s, i)))
        .collect()
}

fn total() -> i64 {
    INITIAL_BALANCE * all_accounts().len() as i64
}

#[test]
fn transactions_on_a_cluster() {
    run_scenario(scenario());
}

fn cli(endpoints: &[String], args: &[&str]) -> std::process::Output {
    run_bounded(
        Command::new(binary())
            .args(["kv", "txn"])
            .args(args)
            .arg("--endpoints")
            .arg(endpoints.join(",")),
        Duration::from_secs(30),
    )
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

async fn check_cli(endpoints: &[String]) {
    let out = cli(
        endpoints,
        &["put user1cli/a 1", "put user1cli/b 2", "del user1cli/c"],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(text(&out.stdout).starts_with("OK commit_ts="), "{out:?}");

    let out = cli(endpoints, &["get user1cli/a", "get user8cli/x"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(
        text(&out.stdout),
        "user1cli/a\t1\nuser8cli/x\t(absent)\nOK read-only attempts=1\n"
    );

    let out = cli(endpoints, &["put user1cli/a 5", "put user8cli/a 6"]);
    assert_eq!(out.status.code(), Some(0), "two shards: {out:?}");
    assert!(text(&out.stdout).starts_with("OK commit_ts="), "{out:?}");
    // The CLI exits only after its commit's work in the background: neither key is left
    // locked (a lock left behind makes the next reader wait and recover the transaction).
    for key in ["user1cli/a", "user8cli/a"] {
        let read = raw_get(endpoints, key).await;
        assert!(
            read.is_ok(),
            "{key} right after a two-shard kv txn: {read:?}"
        );
    }
    let out = cli(endpoints, &["get user1cli/a", "get user8cli/a"]);
    assert!(
        text(&out.stdout).starts_with("user1cli/a\t5\nuser8cli/a\t6\n"),
        "both written: {out:?}"
    );

    let out = cli(
        endpoints,
        &[
            "--isolation",
            "snapshot",
            "get user1cli/a",
            "get user8cli/a for update",
            "put user1cli/s 1",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).starts_with("user1cli/a\t5\nuser8cli/a\t6\nOK commit_ts="),
        "{out:?}"
    );
    let out = cli(
        endpoints,
        &["--linearizable", "put user1cli/l 1", "put user8cli/l 1"],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(text(&out.stdout).starts_with("OK commit_ts="), "{out:?}");
    let out = cli(endpoints, &["--isolation", "repeatable", "get user1cli/a"]);
    assert_eq!(out.status.code(), Some(2), "bad isolation: {out:?}");

    let out = cli(endpoints, &["fetch user1cli/a"]);
    assert_eq!(out.status.code(), Some(1), "bad step: {out:?}");
    assert!(text(&out.stderr).contains("want `get KEY`"), "{out:?}");
}

fn balance(value: Option<bytes::Bytes>) -> i64 {
    let value = value.expect("every account exists");
    text(&value).parse().expect("a balance")
}

/// What the bank workers saw.
#[derive(Default, Debug)]
struct Tally {
    transfers: usize,
    /// Transfers between two shards that committed.
    cross_shard: usize,
    unknown: usize,
    sums: usize,
    attempts_over_one: usize,
}

async fn transfer(client: &Client, seed: u64) -> Result<(i64, u32, bool), Error> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let shard = rng.gen_range(0..SHARD_PREFIXES.len());
    // Every other transfer crosses to another shard.
    let to_shard = match seed % 2 {
        0 => shard,
        _ => (shard + rng.gen_range(1..SHARD_PREFIXES.len())) % SHARD_PREFIXES.len(),
    };
    let from = rng.gen_range(0..ACCOUNTS_PER_SHARD);
    let to = (from + rng.gen_range(1..ACCOUNTS_PER_SHARD)) % ACCOUNTS_PER_SHARD;
    let (from, to) = (account(shard, from), account(to_shard, to));
    let want = rng.gen_range(1..=30);
    let (moved, info) = client
        .txn(TxnOptions::default(), |txn| {
            let (from, to) = (from.clone(), to.clone());
            Box::pin(async move {
                let a = balance(txn.get(from.clone()).await?);
                let b = balance(txn.get(to.clone()).await?);
                let amount = want.min(a);
                txn.put(from, (a - amount).to_string())?;
                txn.put(to, (b + amount).to_string())?;
                Ok::<_, Error>(amount)
            })
        })
        .await?;
    Ok((moved, info.attempts, to_shard != shard))
}

async fn sum_all(client: &Client) -> Result<(Vec<i64>, u32), Error> {
    let (balances, info) = client
        .txn(TxnOptions::default(), |txn| {
            Box::pin(async move {
                let mut balances = Vec::new();
                for key in all_accounts() {
                    balances.push(balance(txn.get(key).await?));
                }
                Ok::<_, Error>(balances)
            })
        })
        .await?;
    assert!(info.commit_ts.is_none(), "a read-only transaction");
    Ok((balances, info.attempts))
}

async fn bank_worker(client: Client, worker: usize, done: Arc<AtomicUsize>) -> Tally {
    let mut tally = Tally::default();
    let give_up = Instant::now() + Duration::from_secs(240);
    let mut op = 0u64;
    while tally.transfers < TRANSFERS_PER_WORKER {
        assert!(Instant::now() < give_up, "transfers stalled");
        op += 1;
        match transfer(&client, (worker as u64) << 32 | op).await {
            Ok((_, attempts, cross_shard)) => {
                tally.transfers += 1;
                tally.cross_shard += usize::from(cross_shard);
                tally.attempts_over_one += usize::from(attempts > 1);
                done.fetch_add(1, Ordering::SeqCst);
            }
            Err(Error::Ambiguous { .. }) => tally.unknown += 1,
            Err(e) => eprintln!("worker {worker}: transfer failed (retrying): {e}"),
        }
        if op.is_multiple_of(4) {
            match sum_all(&client).await {
                Ok((balances, _)) => {
                    assert!(
                        balances.iter().all(|b| *b >= 0),
                        "negative balance: {balances:?}"
                    );
                    let sum: i64 = balances.iter().sum();
                    assert_eq!(sum, total(), "a committed read-only sum saw {balances:?}");
                    tally.sums += 1;
                }
                Err(e) => eprintln!("worker {worker}: sum failed (retrying): {e}"),
            }
        }
    }
    tally
}

/// Moves 1 from `keys[0]` to `keys[1]`, `rounds` times, with plain reads and writes. A lost
/// update leaves `keys[0]` too high or `keys[1]` too low; the two cannot cancel out.
async fn unprotected_worker(client: Client, keys: [String; 2], rounds: usize) {
    let [from, to] = keys;
    for _ in 0..rounds {
        let a = balance(client.get(from.clone()).await.expect("get"));
        let b = balance(client.get(to.clone()).await.expect("get"));
        client
            .put(from.clone(), (a - 1).to_string())
            .await
            .expect("put");
        client
            .put(to.clone(), (b + 1).to_string())
            .await
            .expect("put");
    }
}

/// Two on-call doctors, interleaved by hand: each reads both, then goes off call. Under
/// `Snapshot` both commit (write skew: nobody on call); under `Serializable`, or under
/// `Snapshot` with both keys read by `get_for_update`, the second conflicts. Each is run with
/// both doctors in one shard (a one-shard commit) and in two (a parallel commit whose other
/// participant is only read). The controls are the plain snapshot rounds: if they did not
/// skew, the workload would show nothing.
async fn write_skew(client: &Client) {
    let mut rounds = Vec::new();
    for two_shards in [false, true] {
        for (isolation, for_update) in [
            (Isolation::Snapshot, false),
            (Isolation::Serializable, false),
            (Isolation::Snapshot, true),
        ] {
            rounds.push((isolation, for_update, two_shards));
        }
    }
    for (round, (isolation, for_update, two_shards)) in rounds.into_iter().enumerate() {
        let y_prefix = if two_shards { "user4" } else { "user1" };
        let (x, y) = (
            format!("user1oncall{round}/x"),
            format!("{y_prefix}oncall{round}/y"),
        );
        assert_eq!(
            client.route(x.as_bytes()).unwrap().shard_id
                != client.route(y.as_bytes()).unwrap().shard_id,
            two_shards
        );
        client.put(x.clone(), "on").await.expect("put");
        client.put(y.clone(), "on").await.expect("put");
        let mut a = client.begin_with(isolation);
        let mut b = client.begin_with(isolation);
        for txn in [&mut a, &mut b] {
            for key in [&x, &y] {
                match for_update {
                    true => txn.get_for_update(key.clone()).await,
                    false => txn.get(key.clone()).await,
                }
                .expect("read");
            }
        }
        a.put(x.clone(), "off").unwrap();
        b.put(y.clone(), "off").unwrap();
        a.commit().await.expect("the first doctor goes off call");
        let second = b.commit().await;
        let on_call = [x, y].into_iter().map(|k| client.get(k));
        let on_call = futures::future::join_all(on_call)
            .await
            .into_iter()
            .filter(|v| v.as_ref().expect("get").as_deref() == Some(&b"on"[..]))
            .count();
        let case = format!("{isolation:?}, for update: {for_update}, two shards: {two_shards}");
        eprintln!("{case}: second commit {second:?}; doctors on call: {on_call}");
        match (isolation, for_update) {
            (Isolation::Snapshot, false) => assert!(
                second.is_ok() && on_call == 0,
                "control ({case}): snapshot isolation must show write skew"
            ),
            _ => assert!(
                matches!(second, Err(Error::TxnConflict { .. })) && on_call == 1,
                "{case}: no write skew"
            ),
        }
    }
}

async fn scenario() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = Arc::new(start_cluster(BASE_PORT, dir.path(), 4, &[]));
    cluster
        .wait_ready(READY_TIMEOUT)
        .await
        .expect("cluster ready");
    let endpoints = cluster.endpoints();
    check_cli(&endpoints).await;

    let client = connect_client(endpoints.clone()).await;
    write_skew(&client).await;
    let shards: std::collections::BTreeSet<u64> = all_accounts()
        .iter()
        .map(|k| client.route(k.as_bytes()).expect("routed").shard_id)
        .collect();
    assert_eq!(shards.len(), 4, "the accounts span 4 shards");
    for key in all_accounts() {
        client
            .put(key, INITIAL_BALANCE.to_string())
            .await
            .expect("open account");
    }

    // Negative control first, on its own two accounts (shard 4), while nothing else runs.
    let control = [account(3, 100), account(3, 101)];
    for key in &control {
        client
            .put(key.clone(), "1000")
            .await
            .expect("control account");
    }
    let mut set = tokio::task::JoinSet::new();
    for i in 0..WORKERS {
        let worker_client = connect_client(vec![endpoints[i % endpoints.len()].clone()]).await;
        set.spawn(unprotected_worker(
            worker_client,
            control.clone(),
            CONTROL_ROUNDS,
        ));
    }
    while let Some(r) = set.join_next().await {
        r.expect("control worker");
    }
    let from = balance(client.get(control[0].clone()).await.unwrap());
    let to = balance(client.get(control[1].clone()).await.unwrap());
    let moves = (WORKERS * CONTROL_ROUNDS) as i64;
    eprintln!(
        "control without transactions: {moves} moves of 1 left {from} and {to} (exact: {} and {}), total {}",
        1000 - moves,
        1000 + moves,
        from + to
    );
    assert_ne!(
        (from, to),
        (1000 - moves, 1000 + moves),
        "the control did not fire: plain read-modify-write lost no update"
    );

    let done = Arc::new(AtomicUsize::new(0));
    let killer = kill_leader_after(
        cluster.clone(),
        client.clone(),
        account(0, 0),
        done.clone(),
        KILL_AFTER_TRANSFERS,
    );
    let mut workers = tokio::task::JoinSet::new();
    for i in 0..WORKERS {
        let worker_client = connect_client(vec![
            endpoints[i % endpoints.len()].clone(),
            endpoints[(i + 1) % endpoints.len()].clone(),
        ])
        .await;
        workers.spawn(bank_worker(worker_client, i, done.clone()));
    }
    let mut sum = Tally::default();
    while let Some(tally) = workers.join_next().await {
        let tally = tally.expect("bank worker");
        sum.transfers += tally.transfers;
        sum.cross_shard += tally.cross_shard;
        sum.unknown += tally.unknown;
        sum.sums += tally.sums;
        sum.attempts_over_one += tally.attempts_over_one;
    }
    let killed = killer.await.expect("killer");
    cluster.restart(killed).expect("restart");

    let (balances, _) = sum_all(&client).await.expect("final sum");
    eprintln!("bank: {sum:?}; final balances {balances:?}");
    assert_eq!(balances.iter().sum::<i64>(), total(), "the final total");
    assert!(
        balances.iter().all(|b| *b >= 0),
        "negative balance: {balances:?}"
    );
    assert!(sum.sums > 0, "no read-only sum committed");
    assert!(
        sum.cross_shard > 0,
        "no transfer between two shards committed"
    );
    assert!(
        sum.attempts_over_one > 0,
        "no transfer ever conflicted: the workload shows nothing about conflicts"
    );
    cluster
        .wait_ready(READY_TIMEOUT)
        .await
        .expect("the restarted node rejoins");
}
