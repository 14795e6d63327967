//! `meridian-ycsb economy`: YCSB+T's closed-economy workload (Dey et al., 2014).
//!
//! ```text
//!  open recordcount accounts (totalcash / recordcount each, untimed)
//!    ─► threads run operationcount operations: readproportion read-only transactions over 1–2
//!       accounts, the rest transfers (read two accounts, move 1..=maxtransfer, never below 0)
//!    ─► validation: sum every account; [VALIDATION] Total / Expected / Status PASSED|FAILED
//! ```
//!
//! Accounts are chosen by `requestdistribution` (`uniform` or `zipfian`, YCSB's constants).
//! Output follows YCSB's text report: `[OVERALL]` runtime and throughput, per operation
//! (`[TRANSFER]`, `[READ-ONLY]`) operations, average, p50/p95/p99 and max latency in µs,
//! `[<OP>-FAILED]` counts, retries (attempts beyond the first, summed), then the validation.
//! A failed validation makes the command exit non-zero.
//!
//! Properties (`bench/workloads/closedeconomy`): `recordcount`, `operationcount`, `totalcash`,
//! `readproportion`, `maxtransfer`, `requestdistribution`, `threadcount`, `accountspread`
//! (`oneshard`: every account under one prefix, so in one Meridian shard; `shards`: spread over
//! the key space, so most Meridian transfers are two-phase commits across two shards),
//! `lockwait` and `earlylocks` (Meridian only, see [`EconomyConfig`]). `meridian-ycsb
//! economy-compare` runs it on each store side by side (see [`compare`]), and `meridian-ycsb
//! compare` after each store's YCSB workloads.

pub mod compare;
pub mod drivers;

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use hdrhistogram::Histogram;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::cli::{driver_name, PhaseArgs, MAX_TIMEOUT_MS};
use crate::db::DriverOptions;
use crate::generator::{UniformLongGenerator, ZipfianGenerator};
use crate::properties::Properties;

/// Most accounts accepted.
pub const MAX_ACCOUNTS: u64 = 10_000_000;
/// Most client threads accepted.
pub const MAX_THREADS: usize = 4_096;

/// The workload's settings.
#[derive(Debug, Clone)]
pub struct EconomyConfig {
    pub accounts: u64,
    pub operations: u64,
    pub total_cash: i64,
    pub read_proportion: f64,
    pub max_transfer: i64,
    pub zipfian: bool,
    pub threads: usize,
    /// `accountspread=shards`: account keys spread over the key space (YCSB-style hashed
    /// numbers) instead of sharing the `economy/` prefix (`oneshard`, the default).
    pub spread: bool,
    /// `lockwait=nowait`: Meridian's multi-shard commits fail at once on another
    /// transaction's lock (`TxnOptions::no_wait`) instead of wound-wait (`woundwait`, the
    /// default). Other stores ignore it.
    pub no_wait: bool,
    /// `earlylocks=on`: a Meridian transfer reads both accounts with
    /// `Txn::batch_get_for_update` under `TxnOptions::early_locks` (the shard leader locks
    /// them as it reads); `off` (the default) reads them with a plain `batch_get`. Other stores
    /// ignore it.
    pub early_locks: bool,
}

impl EconomyConfig {
    pub fn from_properties(p: &Properties, threads: Option<usize>) -> anyhow::Result<Self> {
        let accounts: u64 = p.parse_or("recordcount", 1_000u64, "account count")?;
        let config = EconomyConfig {
            accounts,
            operations: p.parse_or("operationcount", 10_000u64, "operation count")?,
            total_cash: p.parse_or("totalcash", accounts as i64 * 1_000, "amount")?,
            read_proportion: p.parse_or("readproportion", 0.5f64, "proportion")?,
            max_transfer: p.parse_or("maxtransfer", 100i64, "amount")?,
            zipfian: match p.get_or("requestdistribution", "uniform") {
                "uniform" => false,
                "zipfian" => true,
                other => bail!("requestdistribution {other:?}: want uniform or zipfian"),
            },
            threads: match threads {
                Some(t) => t,
                None => p.parse_or("threadcount", 1usize, "thread count")?,
            },
            spread: match p.get_or("accountspread", "oneshard") {
                "oneshard" => false,
                "shards" => true,
                other => bail!("accountspread {other:?}: want oneshard or shards"),
            },
            no_wait: match p.get_or("lockwait", "woundwait") {
                "woundwait" => false,
                "nowait" => true,
                other => bail!("lockwait {other:?}: want woundwait or nowait"),
            },
            early_locks: match p.get_or("earlylocks", "off") {
                "off" => false,
                "on" => true,
                other => bail!("earlylocks {other:?}: want on or off"),
            },
        };
        if !(2..=MAX_ACCOUNTS).contains(&config.accounts) {
            bail!("recordcount must be 2..={MAX_ACCOUNTS}");
        }
        if config.total_cash < 0 || config.total_cash % config.accounts as i64 != 0 {
            bail!("totalcash must be a non-negative multiple of recordcount");
        }
        if !(0.0..=1.0).contains(&config.read_proportion) {
            bail!("readproportion must be within 0..=1");
        }
        if config.max_transfer < 1 {
            bail!("maxtransfer must be at least 1");
        }
        if !(1..=MAX_THREADS).contains(&config.threads) {
            bail!("threads must be 1..={MAX_THREADS}");
        }
        Ok(config)
    }

    /// The key of account `n`: `economy/user<n>` (one shard: the prefix sorts together), or
    /// with `spread` `user<19 digits>-<n>`, the digits a hash of `n` spread evenly over the
    /// range Meridian's default split points divide (`user100000…` to `user922337…`).
    pub fn account(&self, n: u64) -> String {
        if !self.spread {
            return format!("economy/user{n:010}");
        }
        const LOW: u64 = 1_000_000_000_000_000_000;
        const SPAN: u64 = 8_223_372_036_854_775_807; // up to 2^63 - 1
        let mut h = n.wrapping_add(0x9e37_79b9_7f4a_7c15);
        h = (h ^ (h >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        h = (h ^ (h >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        h ^= h >> 31;
        format!("user{}-{n}", LOW + h % SPAN)
    }
}

/// One operation's measurements.
struct OpStats {
    latency_us: Histogram<u64>,
    failed: u64,
    first_error: Option<String>,
    /// Attempts beyond the first, over the successful operations.
    retries: u64,
}

impl OpStats {
    fn new() -> OpStats {
        OpStats {
            // 1 µs .. 10 min, 3 significant digits (longer latencies saturate).
            latency_us: Histogram::new_with_bounds(1, 600_000_000, 3)
                .expect("constant histogram bounds are valid"),
            failed: 0,
            first_error: None,
            retries: 0,
        }
    }

    fn merge(&mut self, other: OpStats) {
        // Same bounds on both sides: adding cannot fail.
        let _ = self.latency_us.add(&other.latency_us);
        self.failed += other.failed;
        self.retries += other.retries;
        if self.first_error.is_none() {
            self.first_error = other.first_error;
        }
    }

    fn record(&mut self, began: Instant, outcome: Result<u32, crate::db::DbError>) {
        match outcome {
            Ok(attempts) => {
                let us = u64::try_from(began.elapsed().as_micros()).unwrap_or(u64::MAX);
                self.latency_us.saturating_record(us.max(1));
                self.retries += u64::from(attempts.saturating_sub(1));
            }
            Err(e) => {
                self.failed += 1;
                self.first_error.get_or_insert_with(|| e.to_string());
            }
        }
    }

    fn render(&self, name: &str, secs: f64, out: &mut String) {
        let h = &self.latency_us;
        out.push_str(&format!("[{name}], Operations, {}\n", h.len()));
        out.push_str(&format!(
            "[{name}], Throughput(ops/sec), {:.1}\n",
            h.len() as f64 / secs
        ));
        if !h.is_empty() {
            out.push_str(&format!("[{name}], AverageLatency(us), {:.1}\n", h.mean()));
            for q in [50u32, 95, 99] {
                let v = h.value_at_quantile(f64::from(q) / 100.0);
                out.push_str(&format!("[{name}], {q}thPercentileLatency(us), {v}\n"));
            }
            out.push_str(&format!("[{name}], MaxLatency(us), {}\n", h.max()));
        }
        out.push_str(&format!("[{name}], Retries, {}\n", self.retries));
        out.push_str(&format!("[{name}-FAILED], Operations, {}\n", self.failed));
        if let Some(e) = &self.first_error {
            out.push_str(&format!("[{name}-FAILED], FirstError, {e}\n"));
        }
    }
}

/// Picks accounts.
enum Chooser {
    Uniform(UniformLongGenerator),
    Zipfian(ZipfianGenerator),
}

impl Chooser {
    fn new(config: &EconomyConfig) -> Chooser {
        if config.zipfian {
            Chooser::Zipfian(ZipfianGenerator::new(0, config.accounts - 1))
        } else {
            Chooser::Uniform(UniformLongGenerator::new(0, config.accounts - 1))
        }
    }

    fn next(&mut self, rng: &mut StdRng) -> u64 {
        match self {
            Chooser::Uniform(g) => g.next_value(rng),
            Chooser::Zipfian(g) => g.next_value(rng),
        }
    }

    /// Two distinct accounts.
    fn pair(&mut self, rng: &mut StdRng, accounts: u64) -> (u64, u64) {
        let a = self.next(rng);
        let mut b = self.next(rng);
        for _ in 0..100 {
            if b != a {
                break;
            }
            b = self.next(rng);
        }
        if b == a {
            b = (a + 1) % accounts;
        }
        (a, b)
    }
}

async fn worker(
    economy: Arc<dyn drivers::Economy>,
    config: Arc<EconomyConfig>,
    operations: u64,
    seed: u64,
) -> (OpStats, OpStats) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut chooser = Chooser::new(&config);
    let (mut transfers, mut reads) = (OpStats::new(), OpStats::new());
    for _ in 0..operations {
        let began = Instant::now();
        if rng.gen_bool(config.read_proportion) {
            let n = rng.gen_range(1..=2);
            let accounts: Vec<String> = if n == 1 {
                vec![config.account(chooser.next(&mut rng))]
            } else {
                let (a, b) = chooser.pair(&mut rng, config.accounts);
                vec![config.account(a), config.account(b)]
            };
            let outcome = economy.read(&accounts).await.map(|(_, attempts)| attempts);
            reads.record(began, outcome);
        } else {
            let (a, b) = chooser.pair(&mut rng, config.accounts);
            let amount = rng.gen_range(1..=config.max_transfer);
            let outcome = economy
                .transfer(&config.account(a), &config.account(b), amount)
                .await;
            transfers.record(began, outcome);
        }
    }
    (transfers, reads)
}

/// What one economy run measured.
pub struct EconomyResult {
    /// The YCSB-style text report.
    pub text: String,
    pub seconds: f64,
    pub transfers: Summary,
    pub reads: Summary,
    pub total: i64,
    pub expected: i64,
}

impl EconomyResult {
    pub fn passed(&self) -> bool {
        self.total == self.expected
    }
}

/// One operation's figures.
#[derive(Debug, Clone, Copy, Default)]
pub struct Summary {
    pub committed: u64,
    pub failed: u64,
    pub retries: u64,
    pub p50_us: u64,
    pub p99_us: u64,
}

impl OpStats {
    fn summary(&self) -> Summary {
        let h = &self.latency_us;
        Summary {
            committed: h.len(),
            failed: self.failed,
            retries: self.retries,
            p50_us: h.value_at_quantile(0.50),
            p99_us: h.value_at_quantile(0.99),
        }
    }
}

/// The settings of `args` (workload files, then `-p` overrides) and its driver options.
pub fn settings(args: &PhaseArgs) -> anyhow::Result<(EconomyConfig, u64, DriverOptions)> {
    let mut properties = Properties::new();
    for file in &args.workload_files {
        properties.merge_file(file)?;
    }
    for assignment in &args.overrides {
        properties.merge_override(assignment)?;
    }
    let config = EconomyConfig::from_properties(&properties, args.threads)?;
    let seed: u64 = properties.parse_or("seed", rand::random::<u64>(), "seed")?;
    if args.timeout_ms == 0 || args.timeout_ms > MAX_TIMEOUT_MS {
        bail!("--timeout-ms must be between 1 and {MAX_TIMEOUT_MS}");
    }
    let options = DriverOptions {
        endpoints: args.endpoints.clone(),
        data_dir: args.data_dir.clone(),
        timeout: Duration::from_millis(args.timeout_ms),
        sync_writes: args.sync_writes,
    };
    Ok((config, seed, options))
}

/// `meridian-ycsb economy`: runs the workload against `--db`, prints the report, and fails if
/// the validation fails.
pub async fn run(args: &PhaseArgs) -> anyhow::Result<String> {
    let (config, seed, options) = settings(args)?;
    let economy = drivers::open(args.db, &options, &config)
        .await
        .with_context(|| format!("opening the {} economy driver", driver_name(args.db)))?;
    eprintln!("economy: {}", driver_name(args.db));
    let result = run_economy(&config, economy, seed).await?;
    print!("{}", result.text);
    if !result.passed() {
        bail!(
            "closed-economy validation FAILED: total {}, expected {}",
            result.total,
            result.expected
        );
    }
    Ok(result.text)
}

/// Opens the accounts, runs the operations, validates.
pub async fn run_economy(
    config: &EconomyConfig,
    economy: Arc<dyn drivers::Economy>,
    seed: u64,
) -> anyhow::Result<EconomyResult> {
    let config = Arc::new(config.clone());
    let balance = config.total_cash / config.accounts as i64;
    let accounts: Vec<(String, i64)> = (0..config.accounts)
        .map(|n| (config.account(n), balance))
        .collect();
    eprintln!("economy: opening {} accounts of {balance}", config.accounts);
    economy
        .open_accounts(&accounts)
        .await
        .context("opening the accounts")?;
    eprintln!(
        "economy: {} operations on {} threads ({:.0}% read-only)",
        config.operations,
        config.threads,
        config.read_proportion * 100.0
    );
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    let threads = config.threads as u64;
    for t in 0..threads {
        let share = config.operations / threads + u64::from(t < config.operations % threads);
        tasks.spawn(worker(
            economy.clone(),
            config.clone(),
            share,
            seed.wrapping_add(t),
        ));
    }
    let (mut transfers, mut reads) = (OpStats::new(), OpStats::new());
    while let Some(joined) = tasks.join_next().await {
        let (t, r) = joined.context("an economy thread panicked")?;
        transfers.merge(t);
        reads.merge(r);
    }
    let seconds = started.elapsed().as_secs_f64().max(1e-9);

    // Validation: sum every account, after every thread finished.
    let names: Vec<String> = accounts.into_iter().map(|(a, _)| a).collect();
    let mut total = 0i64;
    for chunk in names.chunks(1_000) {
        let (balances, _) = economy.read(chunk).await.context("validation read")?;
        total += balances.iter().sum::<i64>();
    }
    let committed = transfers.latency_us.len() + reads.latency_us.len();
    let mut text = format!(
        "[OVERALL], RunTime(ms), {:.0}\n[OVERALL], Throughput(ops/sec), {:.1}\n",
        seconds * 1_000.0,
        committed as f64 / seconds
    );
    transfers.render("TRANSFER", seconds, &mut text);
    reads.render("READ-ONLY", seconds, &mut text);
    text.push_str(&format!("[VALIDATION], Total, {total}\n"));
    text.push_str(&format!("[VALIDATION], Expected, {}\n", config.total_cash));
    let status = if total == config.total_cash {
        "PASSED"
    } else {
        "FAILED"
    };
    text.push_str(&format!("[VALIDATION], Status, {status}\n"));
    Ok(EconomyResult {
        text,
        seconds,
        transfers: transfers.summary(),
        reads: reads.summary(),
        total,
        expected: config.total_cash,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(text: &str) -> anyhow::Result<EconomyConfig> {
        EconomyConfig::from_properties(&Properties::parse(text).unwrap(), None)
    }

    #[test]
    fn properties_are_checked() {
        let c = config("recordcount=10\ntotalcash=1000\nrequestdistribution=zipfian").unwrap();
        assert_eq!((c.accounts, c.total_cash, c.zipfian), (10, 1000, true));
        assert!(config("recordcount=1").is_err());
        assert!(config("recordcount=10\ntotalcash=1001").is_err());
        assert!(config("readproportion=1.5").is_err());
        assert!(config("requestdistribution=hotspot").is_err());
        assert!(config("maxtransfer=0").is_err());
        assert!(config("accountspread=everywhere").is_err());
        assert!(config("earlylocks=maybe").is_err());
        assert!(config("earlylocks=on").unwrap().early_locks);
        assert!(
            !config("recordcount=10").unwrap().early_locks,
            "off unless asked"
        );
    }

    #[test]
    fn spread_accounts_cover_the_default_shards_and_stay_distinct() {
        let one = config("recordcount=100").unwrap();
        assert!((0..100).all(|n| one.account(n).starts_with("economy/")));
        let spread = config("recordcount=1000\ntotalcash=1000\naccountspread=shards").unwrap();
        let keys: std::collections::BTreeSet<String> =
            (0..1000).map(|n| spread.account(n)).collect();
        assert_eq!(keys.len(), 1000);
        // The default 8-shard split points: user203292, user306584, ... user819045.
        let splits: Vec<String> = (1..8u64)
            .map(|i| format!("user{}", 100_000 + (922_337 - 100_000) * i / 8))
            .collect();
        let mut per_shard = [0usize; 8];
        for key in &keys {
            per_shard[splits.iter().filter(|s| key.as_str() >= s.as_str()).count()] += 1;
        }
        assert!(per_shard.iter().all(|&n| n > 60), "{per_shard:?}");
    }

    #[test]
    fn pairs_are_distinct() {
        let c = config("recordcount=2").unwrap();
        let mut chooser = Chooser::new(&c);
        let mut rng = StdRng::seed_from_u64(1);
        for _ in 0..100 {
            let (a, b) = chooser.pair(&mut rng, 2);
            assert_ne!(a, b);
            assert!(a < 2 && b < 2);
        }
    }
}
