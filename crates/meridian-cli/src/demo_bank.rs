//! The demo's bank phase: transactions on the demo cluster, with their invariant checked.
//!
//! ```text
//!  open ACCOUNTS_PER_SHARD accounts in every shard (INITIAL_BALANCE each)
//!    ─► --bank-secs of --concurrency tasks: 90% transfers (read both accounts, move up to
//!       MAX_TRANSFER, never below zero), half of them between two accounts of one shard (a
//!       one-shard commit, one Raft entry), half between accounts of two shards (a parallel
//!       commit); 10% read-only sums of every account (a transaction across all shards: one
//!       snapshot BatchGet per shard, all at one timestamp)
//!    ─► throughput and p50/p99 per kind, conflicts retried ─► a final sum must equal the total
//! ```
//!
//! Every committed sum must equal the total too: a sum that does not is reported as a
//! violation and fails the demo.

use crate::demo::{named_keys_across_shards, DemoArgs, OpStats};
use anyhow::{bail, Context};
use bytes::Bytes;
use meridian_client::{Client, Error, TxnOptions};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Accounts opened in each shard.
const ACCOUNTS_PER_SHARD: usize = 8;
/// Opening balance of every account.
const INITIAL_BALANCE: i64 = 1_000;
/// Largest amount one transfer moves.
const MAX_TRANSFER: i64 = 50;

/// The accounts, grouped by shard.
struct Bank {
    by_shard: Vec<Vec<Bytes>>,
}

impl Bank {
    fn all(&self) -> impl Iterator<Item = &Bytes> {
        self.by_shard.iter().flatten()
    }

    fn total(&self) -> i64 {
        INITIAL_BALANCE * self.all().count() as i64
    }
}

/// What one task saw.
struct Tally {
    transfers: OpStats,
    /// Transfers between accounts of two shards.
    cross: OpStats,
    sums: OpStats,
    /// Runs beyond the first, over all committed transactions.
    reruns: u64,
    /// Committed sums that did not equal the total.
    violations: Vec<i64>,
}

fn balance(value: Option<Bytes>) -> Result<i64, Error> {
    let text = value.unwrap_or_default();
    std::str::from_utf8(&text)
        .ok()
        .and_then(|t| t.parse().ok())
        .ok_or_else(|| Error::InvalidArgument {
            message: format!("account holds {text:?}, not a balance"),
        })
}

async fn sum(client: &Client, bank: &Arc<Bank>) -> Result<(i64, u32), Error> {
    let bank = bank.clone();
    let (total, info) = client
        .txn(TxnOptions::default(), move |txn| {
            let bank = bank.clone();
            Box::pin(async move {
                let mut total = 0;
                for value in txn.batch_get(bank.all().cloned()).await? {
                    total += balance(value)?;
                }
                Ok::<_, Error>(total)
            })
        })
        .await?;
    Ok((total, info.attempts))
}

async fn transfer(client: &Client, from: Bytes, to: Bytes, want: i64) -> Result<u32, Error> {
    let (_, info) = client
        .txn(TxnOptions::default(), move |txn| {
            let (from, to) = (from.clone(), to.clone());
            Box::pin(async move {
                let a = balance(txn.get(from.clone()).await?)?;
                let b = balance(txn.get(to.clone()).await?)?;
                let amount = want.min(a);
                txn.put(from, (a - amount).to_string())?;
                txn.put(to, (b + amount).to_string())?;
                Ok::<_, Error>(())
            })
        })
        .await?;
    Ok(info.attempts)
}

fn record(stats: &mut OpStats, began: Instant, result: Result<(), Error>) {
    match result {
        Ok(()) => {
            let micros = u64::try_from(began.elapsed().as_micros()).unwrap_or(u64::MAX);
            stats.latency_us.saturating_record(micros.max(1));
        }
        Err(error) => {
            stats.errors += 1;
            stats.first_error.get_or_insert_with(|| error.to_string());
        }
    }
}

async fn worker(client: Client, bank: Arc<Bank>, seed: u64, stop_at: Instant) -> Tally {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut tally = Tally {
        transfers: OpStats::new(),
        cross: OpStats::new(),
        sums: OpStats::new(),
        reruns: 0,
        violations: Vec::new(),
    };
    while Instant::now() < stop_at {
        let began = Instant::now();
        if rng.gen_range(0..10) == 0 {
            let result = sum(&client, &bank).await.map(|(total, attempts)| {
                tally.reruns += u64::from(attempts - 1);
                if total != bank.total() {
                    tally.violations.push(total);
                }
            });
            record(&mut tally.sums, began, result);
        } else {
            let shards = bank.by_shard.len();
            let first = rng.gen_range(0..shards);
            let second = match shards > 1 && rng.gen_bool(0.5) {
                true => (first + rng.gen_range(1..shards)) % shards,
                false => first,
            };
            let (a, b) = (&bank.by_shard[first], &bank.by_shard[second]);
            let from = rng.gen_range(0..a.len());
            let to = match first == second {
                true => (from + rng.gen_range(1..a.len())) % a.len(),
                false => rng.gen_range(0..b.len()),
            };
            let want = rng.gen_range(1..=MAX_TRANSFER);
            let result = transfer(&client, a[from].clone(), b[to].clone(), want)
                .await
                .map(|attempts| tally.reruns += u64::from(attempts - 1));
            let stats = match first == second {
                true => &mut tally.transfers,
                false => &mut tally.cross,
            };
            record(stats, began, result);
        }
    }
    tally
}

/// Runs the bank phase; fails if any committed sum or the final sum is not the total.
pub async fn run(client: &Client, args: &DemoArgs) -> anyhow::Result<()> {
    let map = client.shard_map();
    let shards = map.shards().len().max(1);
    let keys = named_keys_across_shards(&map, shards * ACCOUNTS_PER_SHARD, "bank");
    // Key i is in shard i mod shards.
    let mut by_shard = vec![Vec::new(); shards];
    for (i, key) in keys.into_iter().enumerate() {
        by_shard[i % shards].push(key);
    }
    let bank = Arc::new(Bank { by_shard });
    let count = bank.all().count();
    println!(
        "\nBank: {count} accounts ({ACCOUNTS_PER_SHARD} in each of {shards} shards), {INITIAL_BALANCE} each; \
         {} s of transactions with {} tasks...",
        args.bank_secs, args.concurrency
    );
    let opening: Vec<(Bytes, Bytes)> = bank
        .all()
        .map(|k| (k.clone(), Bytes::from(INITIAL_BALANCE.to_string())))
        .collect();
    client
        .batch_put(opening)
        .await
        .context("opening the accounts")?;

    let started = Instant::now();
    let stop_at = started + Duration::from_secs(args.bank_secs);
    let mut tasks = tokio::task::JoinSet::new();
    for task in 0..args.concurrency {
        let (client, bank) = (client.clone(), bank.clone());
        let seed = args.seed.wrapping_add(1_000_000 + task as u64);
        tasks.spawn(worker(client, bank, seed, stop_at));
    }
    let (mut transfers, mut cross, mut sums) = (OpStats::new(), OpStats::new(), OpStats::new());
    let (mut reruns, mut violations) = (0u64, Vec::new());
    while let Some(joined) = tasks.join_next().await {
        let tally = joined.context("a bank task panicked")?;
        transfers.merge(tally.transfers);
        cross.merge(tally.cross);
        sums.merge(tally.sums);
        reruns += tally.reruns;
        violations.extend(tally.violations);
    }
    let secs = started.elapsed().as_secs_f64().max(1e-9);
    let ms = |us: u64| format!("{:.3}", us as f64 / 1000.0);
    let mut table =
        crate::display::Table::new(["TXN", "COMMITTED", "TXN/S", "P50 MS", "P99 MS", "ERRORS"]);
    for (name, stats) in [
        ("transfer (1 shard)", &transfers),
        ("transfer (2 shards)", &cross),
        ("sum (all shards)", &sums),
    ] {
        let h = &stats.latency_us;
        table.row([
            name.to_string(),
            h.len().to_string(),
            format!("{:.0}", h.len() as f64 / secs),
            ms(h.value_at_quantile(0.50)),
            ms(h.value_at_quantile(0.99)),
            stats.errors.to_string(),
        ]);
    }
    print!("{}", table.render());
    println!("  conflicts: {reruns} re-runs of a transaction closure");
    for (name, stats) in [
        ("one-shard transfer", &transfers),
        ("two-shard transfer", &cross),
        ("sum", &sums),
    ] {
        if let Some(error) = &stats.first_error {
            println!("  first {name} error: {error}");
        }
    }
    let (final_total, _) = sum(client, &bank).await.context("the final sum")?;
    if !violations.is_empty() || final_total != bank.total() {
        bail!(
            "bank invariant violated: total {} expected; final sum {final_total}; committed sums that differed: {violations:?}",
            bank.total()
        );
    }
    println!(
        "  invariant holds: every committed sum and the final sum are {}",
        bank.total()
    );
    Ok(())
}
