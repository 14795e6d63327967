//! `meridian-ycsb economy-compare`: the closed economy on each store, fresh, side by side.
//!
//! Each store is started fresh as `compare` starts it (3-node Meridian, 3-member etcd,
//! embedded RocksDB; see `compare::stores`), gets the same workload and seed, and is stopped.
//! The result is a markdown table (committed transactions/s, p50/p99 per operation, retries,
//! failures, validation) printed to stdout and, with `--out FILE`, written there too.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context};

use super::{drivers, run_economy, EconomyConfig, EconomyResult};
use crate::cli::driver_name;
use crate::compare::stores::{self, RunningStore, StoreConfig};
use crate::db::{DriverKind, DriverOptions};
use crate::properties::Properties;

/// Options of `economy-compare`.
#[derive(Debug, Clone, clap::Args)]
pub struct EconomyCompareArgs {
    /// Workload properties file; repeat to layer files.
    #[arg(short = 'P', value_name = "FILE")]
    pub workload_files: Vec<PathBuf>,
    /// Property override `key=value`; repeatable.
    #[arg(short = 'p', value_name = "KEY=VALUE")]
    pub overrides: Vec<String>,
    /// Client threads per store.
    #[arg(long, default_value_t = 64)]
    pub threads: usize,
    /// Stores to run, in order.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "meridian,etcd,rocksdb"
    )]
    pub stores: Vec<DriverKind>,
    /// Meridian nodes listen on base+1..3 (clients) and base+101..103 (Raft).
    #[arg(long, default_value_t = 27_000)]
    pub base_port: u16,
    /// etcd members listen on base+1..3 (clients) and base+PEER_OFFSET+1..3.
    #[arg(long, default_value_t = 23_850)]
    pub etcd_base_port: u16,
    /// Deadline of each call, in milliseconds.
    #[arg(long, default_value_t = 10_000)]
    pub timeout_ms: u64,
    /// Also write the markdown table here.
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// The header of the table [`row`] fills.
pub const TABLE_HEADER: &str = "| store | txn/s | transfers/s | transfer p50 / p99 ms | read-only/s | read-only p50 / p99 ms | retries / failed | validation |\n\
     |---|---:|---:|---:|---:|---:|---:|---|\n";

/// One store's row of the table.
pub fn row(kind: DriverKind, r: &EconomyResult) -> String {
    let ms = |us: u64| format!("{:.1}", us as f64 / 1000.0);
    let per_s = |n: u64| format!("{:.0}", n as f64 / r.seconds);
    format!(
        "| {} | {} | {} | {} / {} | {} | {} / {} | {} / {} | {} |",
        driver_name(kind),
        per_s(r.transfers.committed + r.reads.committed),
        per_s(r.transfers.committed),
        ms(r.transfers.p50_us),
        ms(r.transfers.p99_us),
        per_s(r.reads.committed),
        ms(r.reads.p50_us),
        ms(r.reads.p99_us),
        r.transfers.retries + r.reads.retries,
        r.transfers.failed + r.reads.failed,
        if r.passed() { "PASSED" } else { "FAILED" },
    )
}

/// One line naming the run's settings.
pub fn describe(config: &EconomyConfig, seed: u64) -> String {
    format!(
        "Closed economy: {} accounts, {} operations, {:.0}% read-only, {} distribution, accounts {}, {} threads, Meridian early locks {}, seed {seed}",
        config.accounts,
        config.operations,
        config.read_proportion * 100.0,
        if config.zipfian { "zipfian" } else { "uniform" },
        if config.spread { "spread over the shards" } else { "in one shard" },
        config.threads,
        if config.early_locks { "on" } else { "off" },
    )
}

/// Starts `kind` fresh as `store` says, runs the closed economy on it, stops it.
pub async fn run_on_store(
    kind: DriverKind,
    store: &StoreConfig,
    timeout: Duration,
    config: &EconomyConfig,
    seed: u64,
) -> anyhow::Result<EconomyResult> {
    eprintln!("economy: starting {}", driver_name(kind));
    let running = RunningStore::start(kind, store).await?;
    let options = DriverOptions {
        endpoints: running.endpoints(),
        data_dir: Some(store.data_dir.clone()),
        timeout,
        sync_writes: true,
    };
    let result = match drivers::open(kind, &options, config).await {
        Ok(economy) => run_economy(config, economy, seed).await,
        Err(error) => Err(anyhow::Error::new(error).context("opening the driver")),
    };
    running.stop()?;
    result.with_context(|| format!("{} economy run", driver_name(kind)))
}

/// Runs the closed economy on every store; fails if any validation failed.
pub async fn run(args: EconomyCompareArgs) -> anyhow::Result<String> {
    let mut properties = Properties::new();
    for file in &args.workload_files {
        properties.merge_file(file)?;
    }
    for assignment in &args.overrides {
        properties.merge_override(assignment)?;
    }
    let config = EconomyConfig::from_properties(&properties, Some(args.threads))?;
    let seed: u64 = properties.parse_or("seed", rand::random::<u64>(), "seed")?;
    let work = tempfile::Builder::new()
        .prefix("meridian-economy-")
        .tempdir()
        .context("creating a temporary data directory")?;
    let mut table = format!("{}\n\n{TABLE_HEADER}", describe(&config, seed));
    let mut failed = Vec::new();
    for kind in &args.stores {
        let store_config = StoreConfig {
            meridian_bin: match kind {
                DriverKind::Meridian => Some(stores::locate_meridian(None)?),
                _ => None,
            },
            etcd_bin: match kind {
                DriverKind::Etcd => Some(stores::locate_etcd(None)?),
                _ => None,
            },
            meridian_base_port: args.base_port,
            etcd_base_port: args.etcd_base_port,
            data_dir: work.path().join(driver_name(*kind)),
            ready_timeout: Duration::from_secs(120),
        };
        let timeout = Duration::from_millis(args.timeout_ms);
        let result = run_on_store(*kind, &store_config, timeout, &config, seed).await?;
        eprint!("{}", result.text);
        if !result.passed() {
            failed.push(driver_name(*kind));
        }
        table.push_str(&row(*kind, &result));
        table.push('\n');
    }
    print!("{table}");
    if let Some(path) = &args.out {
        std::fs::write(path, &table).with_context(|| format!("writing {}", path.display()))?;
    }
    if !failed.is_empty() {
        bail!("closed-economy validation FAILED on {failed:?}");
    }
    Ok(table)
}
