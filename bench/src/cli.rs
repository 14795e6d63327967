//! Command line of `meridian-ycsb`: parses arguments, opens the driver, runs the phase, prints
//! the report (text to stdout, optionally JSON to a file).
//!
//! `run_cli` is the whole binary; `main.rs` only builds the runtime and maps the result to an
//! exit code, so tests drive exactly the binary's code path by passing argument lists.

use std::ffi::OsString;
use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};

use crate::client::{self, ClientConfig, Outcome, Phase};
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
}

/// Options shared by both phases.
#[derive(Debug, clap::Args)]
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

/// Parses `args` (including the program name) and runs the phase. Prints the text report to
/// stdout and returns it.
pub async fn run_cli<I, T>(args: I) -> anyhow::Result<Report>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let cli = Cli::try_parse_from(args)?;
    let (phase, args) = match cli.command {
        Command::Load(args) => (Phase::Load, args),
        Command::Run(args) => (Phase::Run, args),
    };
    let mut properties = Properties::new();
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
        .with_context(|| format!("opening the {:?} driver", args.db))?;
    let config = ClientConfig {
        phase,
        properties,
        threads,
        target_ops_per_sec: target,
        status_interval: Duration::from_secs(args.status_interval),
    };
    let Outcome { report, seed } = client::run_phase(&config, driver).await?;

    let text = report.render_text();
    {
        let mut stdout = std::io::stdout().lock();
        stdout.write_all(text.as_bytes())?;
        stdout.flush()?;
    }
    if let Some(path) = &args.json_out {
        let json = JsonReport {
            tool: "meridian-ycsb",
            phase,
            db: format!("{:?}", args.db).to_lowercase(),
            threads,
            target_ops_per_sec: target,
            seed,
            properties: client::properties_map(&config.properties),
            report: &report,
        };
        let body = serde_json::to_string_pretty(&json)?;
        std::fs::write(path, body + "\n").with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(report)
}
