//! Command line of `meridian-ycsb`: parses arguments, opens the driver, runs the phase, prints
//! the report (text to stdout, optionally JSON to a file); or, with `compare`, runs every
//! store through every workload ([`crate::compare`]).
//!
//! `run_cli` is the whole binary; `main.rs` only builds the runtime and maps the result to an
//! exit code, so tests drive exactly the binary's code path by passing argument lists.
//! [`execute_phase`] is one `load` or `run` without the printing; `compare` calls it for every
//! phase, so a comparison measures exactly what the single-phase commands measure.

use std::ffi::OsString;
use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};

use crate::client::{self, ClientConfig, Outcome, Phase};
use crate::compare::{self, CompareArgs, Comparison};
use crate::db::{self, DriverKind, DriverOptions};
use crate::properties::Properties;
use crate::report::Report;

/// Largest per-call deadline accepted, in milliseconds.
pub const MAX_TIMEOUT_MS: u64 = 600_000;

/// YCSB core workload benchmark for Meridian, etcd and embedded RocksDB.
#[derive(Debug, Parser)]
#[command(name = "meridian-ycsb", version, about)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

/// The phase to run.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Insert `recordcount` records (YCSB `load`).
    Load(PhaseArgs),
    /// Run `operationcount` operations of the workload mix (YCSB `run`).
    Run(PhaseArgs),
    /// Write `recordcount` records into Meridian in per-shard batches, fast: the same keys and
    /// record encoding as `load`, but not a YCSB measurement (records/s only).
    BulkLoad(crate::bulk_load::BulkLoadArgs),
    /// Start each store fresh (3-node Meridian, 3-member etcd, embedded RocksDB), load it, run
    /// workloads A, B, C, F, D, reload and run E, and write a side-by-side report.
    Compare(CompareArgs),
    /// YCSB+T's closed economy: open accounts, run transfers and read-only transactions,
    /// validate the total (`-P bench/workloads/closedeconomy`; exits non-zero if it FAILED).
    Economy(PhaseArgs),
    /// The closed economy on each store (3-node Meridian, 3-member etcd, embedded RocksDB),
    /// started fresh, side by side; prints a markdown table.
    EconomyCompare(crate::economy::compare::EconomyCompareArgs),
    /// Three regions behind emulated WAN delays: per-region write, read, follower-read and
    /// transaction latency, the LINE test (move and kill the metadata leader), and the same
    /// transactions with a central timestamp oracle (see bench/README.md, "Geo").
    Geo(crate::geo::args::GeoArgs),
}

/// Options shared by both phases.
#[derive(Debug, Clone, clap::Args)]
pub struct PhaseArgs {
    /// Workload properties file (Java properties format); repeat to layer files.
    #[arg(short = 'P', value_name = "FILE")]
    pub workload_files: Vec<PathBuf>,
    /// Property override `key=value`, applied after all files; repeatable.
    #[arg(short = 'p', value_name = "KEY=VALUE")]
    pub overrides: Vec<String>,
    /// Client threads (default: property `threadcount`, else 1).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Target total throughput in ops/s, spread evenly over the threads (default: property
    /// `target`, else unthrottled).
    #[arg(long)]
    pub target: Option<f64>,
    /// Seconds between status lines.
    #[arg(long, default_value_t = 10)]
    pub status_interval: u64,
    /// Database driver.
    #[arg(long, value_enum)]
    pub db: DriverKind,
    /// Server endpoints for etcd / meridian, comma separated (e.g. http://127.0.0.1:2379).
    #[arg(long, value_delimiter = ',')]
    pub endpoints: Vec<String>,
    /// Data directory for the embedded rocksdb driver.
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Deadline of each database call in milliseconds (etcd, meridian).
    #[arg(long, default_value_t = 10_000)]
    pub timeout_ms: u64,
    /// Make rocksdb fsync its WAL on every write (default: WAL on, no fsync).
    #[arg(long)]
    pub sync_writes: bool,
    /// Also write the report as JSON to this file.
    #[arg(long)]
    pub json_out: Option<PathBuf>,
}

/// The JSON report: the run's context and the same numbers as the text report.
#[derive(Debug, serde::Serialize)]
pub struct JsonReport<'a> {
    pub tool: &'static str,
    pub phase: Phase,
    pub db: String,
    pub threads: usize,
    pub target_ops_per_sec: Option<f64>,
    pub seed: u64,
    pub properties: std::collections::BTreeMap<String, String>,
    #[serde(flatten)]
    pub report: &'a Report,
}

/// What one invocation produced.
#[derive(Debug)]
pub enum CliOutcome {
    /// `load` or `run`: the phase's report (also printed to stdout).
    Phase(Report),
    /// `compare`: every phase of every store (also written to `--out`).
    Comparison(Box<Comparison>),
    /// `economy`: the text report (also printed to stdout).
    Economy(String),
    /// `geo`: the report was written to `--out` and printed.
    Geo,
    /// `bulk-load`: what it wrote (also printed to stdout).
    BulkLoad(crate::bulk_load::BulkLoadSummary),
}

impl CliOutcome {
    /// The report of a `load` or `run`; `None` for `compare`.
    pub fn into_report(self) -> Option<Report> {
        match self {
            CliOutcome::Phase(report) => Some(report),
            CliOutcome::Comparison(_)
            | CliOutcome::Economy(_)
            | CliOutcome::Geo
            | CliOutcome::BulkLoad(_) => None,
        }
    }
}

/// One finished `load` or `run` with the context its JSON report carries.
#[derive(Debug, Clone)]
pub struct PhaseOutcome {
    pub phase: Phase,
    pub db: DriverKind,
    pub threads: usize,
    pub target_ops_per_sec: Option<f64>,
    pub seed: u64,
    pub properties: Properties,
    pub report: Report,
}

impl PhaseOutcome {
    /// The `--json-out` form of this phase.
    pub fn json(&self) -> JsonReport<'_> {
        JsonReport {
            tool: "meridian-ycsb",
            phase: self.phase,
            db: driver_name(self.db).to_string(),
            threads: self.threads,
            target_ops_per_sec: self.target_ops_per_sec,
            seed: self.seed,
            properties: client::properties_map(&self.properties),
            report: &self.report,
        }
    }
}

/// The lower-case name of a driver, as `--db` spells it.
pub fn driver_name(kind: DriverKind) -> &'static str {
    match kind {
        DriverKind::Meridian => "meridian",
        DriverKind::Etcd => "etcd",
        DriverKind::Rocksdb => "rocksdb",
    }
}

/// Parses `args` (including the program name) and runs the command. A `load` or `run` prints
/// its text report to stdout and returns it.
pub async fn run_cli<I, T>(args: I) -> anyhow::Result<CliOutcome>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let cli = Cli::try_parse_from(args)?;
    let (phase, args) = match cli.command {
        Command::Load(args) => (Phase::Load, args),
        Command::Run(args) => (Phase::Run, args),
        Command::Compare(args) => {
            let comparison = compare::run(args).await?;
            return Ok(CliOutcome::Comparison(Box::new(comparison)));
        }
        Command::Economy(args) => {
            let text = crate::economy::run(&args).await?;
            return Ok(CliOutcome::Economy(text));
        }
        Command::EconomyCompare(args) => {
            let text = crate::economy::compare::run(args).await?;
            return Ok(CliOutcome::Economy(text));
        }
        Command::Geo(args) => {
            crate::geo::run(args).await?;
            return Ok(CliOutcome::Geo);
        }
        Command::BulkLoad(args) => {
            let summary = crate::bulk_load::run(&args).await?;
            return Ok(CliOutcome::BulkLoad(summary));
        }
    };
    let outcome = execute_phase(phase, &args, Properties::new()).await?;
    let text = outcome.report.render_text();
    {
        let mut stdout = std::io::stdout().lock();
        stdout.write_all(text.as_bytes())?;
        stdout.flush()?;
    }
    if let Some(path) = &args.json_out {
        let body = serde_json::to_string_pretty(&outcome.json())?;
        std::fs::write(path, body + "\n").with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(CliOutcome::Phase(outcome.report))
}

/// Runs one phase as `load` / `run` do, without printing the report or writing `--json-out`.
/// `base` properties come first, then `args`' workload files, then its `-p` overrides (the
/// comparison passes the built-in workload text as `base`).
pub async fn execute_phase(
    phase: Phase,
    args: &PhaseArgs,
    base: Properties,
) -> anyhow::Result<PhaseOutcome> {
    let mut properties = base;
    for file in &args.workload_files {
        properties.merge_file(file)?;
    }
    for assignment in &args.overrides {
        properties.merge_override(assignment)?;
    }
    let threads = match args.threads {
        Some(threads) => threads,
        None => properties.parse_or("threadcount", 1usize, "thread count")?,
    };
    let target = match args.target {
        Some(target) => Some(target),
        None => match properties.get("target") {
            None => None,
            Some(_) => Some(properties.parse_or("target", 0.0f64, "number")?).filter(|t| *t > 0.0),
        },
    };
    if args.timeout_ms == 0 || args.timeout_ms > MAX_TIMEOUT_MS {
        anyhow::bail!("--timeout-ms must be between 1 and {MAX_TIMEOUT_MS}");
    }
    let driver_options = DriverOptions {
        endpoints: args.endpoints.clone(),
        data_dir: args.data_dir.clone(),
        timeout: Duration::from_millis(args.timeout_ms),
        sync_writes: args.sync_writes,
    };
    let driver = db::open(args.db, &driver_options)
        .await
        .with_context(|| format!("opening the {} driver", driver_name(args.db)))?;
    let config = ClientConfig {
        phase,
        properties,
        threads,
        target_ops_per_sec: target,
        status_interval: Duration::from_secs(args.status_interval),
    };
    let Outcome { report, seed } = client::run_phase(&config, driver).await?;
    Ok(PhaseOutcome {
        phase,
        db: args.db,
        threads,
        target_ops_per_sec: target,
        seed,
        properties: config.properties,
        report,
    })
}
