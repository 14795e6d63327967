//! `meridian-ycsb compare`: one command for the side-by-side comparison of Meridian, etcd and
//! embedded RocksDB on YCSB workloads A-F.
//!
//! ```text
//!  for each store, one after the other (2 cores: never two stores at once)
//!    data set 1: start fresh ─► load --records ─► A ─► B ─► C ─► F ─► D ─► stop
//!    data set 2: start fresh ─► load --records ─► E ─────────────────────► stop
//!  then for each store: start fresh ─► closed economy (transactions) ─► validate ─► stop
//!  ─► <out>/results.json, results.md, chart.svg, <store>-<workload>.txt, <store>-economy.txt
//! ```
//!
//! E runs on a fresh reload because D inserts records and E's scans would see them (YCSB's
//! recommended order). Every phase goes through [`crate::cli::execute_phase`], the function
//! behind `load` and `run`, with the built-in workload files and the same `--threads` and
//! `--operations` for every store, so a comparison measures exactly what the single commands do.
//!
//! Stores ([`stores`]):
//! - **meridian**: a 3-node cluster of `meridian start` processes on loopback
//!   (`meridian_cli::LocalCluster`, loopback Raft timings, default shard layout). A write is
//!   acknowledged after a quorum has fsynced it (Raft log group commit).
//! - **etcd**: a 3-member cluster of `etcd` processes on loopback ([`etcd_cluster`]), default
//!   durability (each member fsyncs its WAL before acknowledging), 8 GiB backend quota.
//! - **rocksdb**: the embedded driver on a fresh directory, WAL on but no fsync per write: the
//!   storage engine's own ceiling, with neither replication nor durability.
//!
//! # Failure and cleanup
//! - A phase that fails (the client returns an error, the store cannot start, a server process
//!   dies) ends its data set: the store is stopped, the failure is recorded on that phase, the
//!   data set's later phases are recorded as skipped, and the comparison goes on with the next
//!   data set. Single operations that fail are counted in the report (`Return=ERROR`), not fatal.
//! - Results are written even after a failure or an interruption; [`run`] then returns an error
//!   so the exit status is non-zero.
//! - Every server process is owned by a guard that SIGKILLs and reaps it on drop, and is started
//!   with `PR_SET_PDEATHSIG` and in its own process group. Ctrl-C and SIGTERM are raced against
//!   the work: the work is dropped (its guards kill the servers) and the partial results are
//!   written. Start servers only from the thread that drives [`run`] (the main or test thread):
//!   the death signal fires when the spawning *thread* exits.
//!
//! # Not done yet
//! - One machine: clients and all three replicas share the cores, so these are loopback numbers,
//!   not a WAN deployment's.
//! - No warm-up phase and a single repetition; run it again to see the noise.

pub mod chart;
pub mod context;
pub mod economy;
pub mod etcd_cluster;
pub mod markdown;
pub mod stores;

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context};
use serde::Serialize;

use crate::cli::{self, PhaseArgs, PhaseOutcome};
use crate::client::Phase;
use crate::db::DriverKind;
use crate::properties::Properties;
use crate::report::Report;

pub use context::RunContext;

/// Most records or operations per phase accepted.
pub const MAX_COUNT: u64 = 1_000_000_000;
/// Most client threads accepted (also `client::MAX_THREADS`).
pub const MAX_THREADS: usize = crate::client::MAX_THREADS;
/// Ports a Meridian cluster of 3 uses above `--base-port` (clients +1..3, Raft +101..103).
pub const MERIDIAN_PORT_SPAN: u16 = 104;
/// Ports the etcd cluster uses above `--etcd-base-port` (clients +1..3, peers +11..13).
pub const ETCD_PORT_SPAN: u16 = 14;
/// Default distance of etcd's ports above `--base-port`.
pub const ETCD_PORT_OFFSET: u16 = 200;
/// Percentiles every phase reports; the tables quote p50 and p99.
pub const PERCENTILES: &str = "50,95,99";

/// Flags of `meridian-ycsb compare`.
#[derive(Debug, Clone, clap::Args)]
pub struct CompareArgs {
    /// Records loaded into each store (YCSB `recordcount`).
    #[arg(long, default_value_t = 100_000)]
    pub records: u64,
    /// Operations of each workload run (YCSB `operationcount`).
    #[arg(long, default_value_t = 100_000)]
    pub operations: u64,
    /// Client threads, the same for every store and phase.
    #[arg(long, default_value_t = 64)]
    pub threads: usize,
    /// Stores to compare, in this order.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "meridian,etcd,rocksdb"
    )]
    pub stores: Vec<DriverKind>,
    /// Workloads to run; they always run in YCSB's order A, B, C, F, D, then E on a reload.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "a,b,c,f,d,e")]
    pub workloads: Vec<WorkloadId>,
    /// Transactions of the closed-economy phase per store (YCSB+T, see `economy`; default:
    /// --operations; 0 skips it).
    #[arg(long)]
    pub economy_operations: Option<u64>,
    /// Output directory (default: bench/results/<UTC date> in the repository).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// The `meridian` binary (default: `meridian` next to this executable).
    #[arg(long)]
    pub meridian_bin: Option<PathBuf>,
    /// The `etcd` binary (default: `etcd` on PATH).
    #[arg(long)]
    pub etcd_bin: Option<PathBuf>,
    /// Meridian node i listens on base+i (clients) and base+100+i (Raft).
    #[arg(long, default_value_t = 27_000)]
    pub base_port: u16,
    /// etcd member i listens on base+i (clients) and base+10+i (peers) (default: --base-port
    /// + 200).
    #[arg(long)]
    pub etcd_base_port: Option<u16>,
    /// Where the stores keep their data (default: a fresh temporary directory).
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Keep the stores' data and server logs after the comparison.
    #[arg(long)]
    pub keep_data: bool,
    /// Deadline of each database call in milliseconds (etcd, meridian).
    #[arg(long, default_value_t = 10_000)]
    pub timeout_ms: u64,
    /// How long a cluster may take to become ready, in seconds.
    #[arg(long, default_value_t = 120)]
    pub ready_timeout_secs: u64,
    /// Seconds between status lines during a run.
    #[arg(long, default_value_t = 10)]
    pub status_interval: u64,
}

/// A YCSB core workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, clap::ValueEnum)]
pub enum WorkloadId {
    A,
    B,
    C,
    D,
    E,
    F,
}

/// YCSB's recommended order on one data set; E follows on a fresh reload.
pub const RUN_ORDER: [WorkloadId; 6] = [
    WorkloadId::A,
    WorkloadId::B,
    WorkloadId::C,
    WorkloadId::F,
    WorkloadId::D,
    WorkloadId::E,
];

impl WorkloadId {
    /// The lower-case letter used in file names and JSON.
    pub fn letter(self) -> &'static str {
        match self {
            WorkloadId::A => "a",
            WorkloadId::B => "b",
            WorkloadId::C => "c",
            WorkloadId::D => "d",
            WorkloadId::E => "e",
            WorkloadId::F => "f",
        }
    }

    /// The workload file (`bench/workloads/workload<letter>`), compiled in so the comparison
    /// runs from any directory.
    pub fn properties_text(self) -> &'static str {
        match self {
            WorkloadId::A => include_str!("../../workloads/workloada"),
            WorkloadId::B => include_str!("../../workloads/workloadb"),
            WorkloadId::C => include_str!("../../workloads/workloadc"),
            WorkloadId::D => include_str!("../../workloads/workloadd"),
            WorkloadId::E => include_str!("../../workloads/workloade"),
            WorkloadId::F => include_str!("../../workloads/workloadf"),
        }
    }

    /// One line on what the workload does.
    pub fn mix(self) -> &'static str {
        match self {
            WorkloadId::A => "50% read, 50% update, zipfian",
            WorkloadId::B => "95% read, 5% update, zipfian",
            WorkloadId::C => "100% read, zipfian",
            WorkloadId::D => "95% read, 5% insert, latest",
            WorkloadId::E => "95% scan (1-100 records), 5% insert, zipfian",
            WorkloadId::F => "50% read, 50% read-modify-write, zipfian",
        }
    }

    /// The operation whose p99 the chart and ratio table quote as the read side.
    pub fn main_read_op(self) -> &'static str {
        match self {
            WorkloadId::E => "SCAN",
            _ => "READ",
        }
    }

    /// The write operation of the mix, if it has one.
    pub fn main_write_op(self) -> Option<&'static str> {
        match self {
            WorkloadId::A | WorkloadId::B => Some("UPDATE"),
            WorkloadId::C => None,
            WorkloadId::D | WorkloadId::E => Some("INSERT"),
            WorkloadId::F => Some("READ-MODIFY-WRITE"),
        }
    }
}

impl fmt::Display for WorkloadId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.letter().to_uppercase())
    }
}

/// How a phase ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PhaseStatus {
    /// Finished; its report is complete (single operations may still have failed).
    Ok,
    /// Could not finish: see `error`.
    Failed,
    /// Not run (an earlier phase of its data set failed, or the comparison was interrupted).
    Skipped,
}

/// One operation kind's numbers in a phase, flattened for readers of `results.json`.
#[derive(Debug, Clone, Serialize)]
pub struct OperationSummary {
    pub name: String,
    pub operations: u64,
    pub average_latency_us: f64,
    pub min_latency_us: u64,
    pub p50_latency_us: Option<u64>,
    pub p95_latency_us: Option<u64>,
    pub p99_latency_us: Option<u64>,
    pub max_latency_us: u64,
    pub ok: u64,
    pub not_found: u64,
    pub errors: u64,
}

/// One phase (a load or a workload run) of one store.
#[derive(Debug, Clone, Serialize)]
pub struct PhaseRecord {
    pub store: String,
    /// `a`..`f` for a run; for a load, the workload whose data set it loads.
    pub workload: String,
    pub phase: Phase,
    /// 1: the data set of A, B, C, F, D; 2: the reload for E.
    pub data_set: u32,
    pub status: PhaseStatus,
    pub error: Option<String>,
    pub runtime_ms: Option<u64>,
    pub throughput_ops_per_sec: Option<f64>,
    /// Failed operations (`Return=ERROR`) over all operation kinds.
    pub error_count: u64,
    /// Reads of missing records (`Return=NOT_FOUND`).
    pub not_found_count: u64,
    pub operations: Vec<OperationSummary>,
    /// The YCSB text report next to `results.json`.
    pub text_report_file: Option<String>,
    /// The `--json-out` form of the phase: context, properties, seed and the full report.
    pub report: Option<serde_json::Value>,
    #[serde(skip)]
    pub outcome: Option<PhaseOutcome>,
}

impl PhaseRecord {
    fn pending(store: DriverKind, workload: WorkloadId, phase: Phase, data_set: u32) -> Self {
        PhaseRecord {
            store: cli::driver_name(store).to_string(),
            workload: workload.letter().to_string(),
            phase,
            data_set,
            status: PhaseStatus::Skipped,
            error: Some("not run".to_string()),
            runtime_ms: None,
            throughput_ops_per_sec: None,
            error_count: 0,
            not_found_count: 0,
            operations: Vec::new(),
            text_report_file: None,
            report: None,
            outcome: None,
        }
    }

    /// The finished report, when the phase completed.
    pub fn report(&self) -> Option<&Report> {
        self.outcome.as_ref().map(|outcome| &outcome.report)
    }

    /// The operation summary called `name`.
    pub fn operation(&self, name: &str) -> Option<&OperationSummary> {
        self.operations.iter().find(|entry| entry.name == name)
    }

    /// The phase's name in file names and progress lines: `a`..`f`, `load`, `load-e`.
    pub fn file_stem(&self) -> String {
        match self.phase {
            Phase::Run => format!("{}-{}", self.store, self.workload),
            Phase::Load if self.data_set == 1 => format!("{}-load", self.store),
            Phase::Load => format!("{}-load-{}", self.store, self.workload),
        }
    }

    fn complete(&mut self, outcome: PhaseOutcome) {
        let report = &outcome.report;
        self.status = PhaseStatus::Ok;
        self.error = None;
        self.runtime_ms = Some(report.runtime_ms);
        self.throughput_ops_per_sec = Some(report.throughput_ops_per_sec);
        self.operations = summarize(report);
        self.error_count = report
            .operations
            .iter()
            .filter(|entry| !entry.name.starts_with("Intended-"))
            .map(|entry| count_status(entry, "ERROR"))
            .sum();
        self.not_found_count = report
            .operations
            .iter()
            .filter(|entry| !entry.name.starts_with("Intended-"))
            .map(|entry| count_status(entry, "NOT_FOUND"))
            .sum();
        self.report = serde_json::to_value(outcome.json()).ok();
        self.outcome = Some(outcome);
    }

    fn fail(&mut self, error: &anyhow::Error) {
        self.status = PhaseStatus::Failed;
        self.error = Some(format!("{error:#}"));
    }
}

fn count_status(entry: &crate::report::OperationReport, status: &str) -> u64 {
    entry
        .return_counts
        .iter()
        .filter(|count| count.status == status)
        .map(|count| count.count)
        .sum()
}

fn percentile(entry: &crate::report::OperationReport, wanted: f64) -> Option<u64> {
    entry
        .percentiles
        .iter()
        .find(|p| (p.percentile - wanted).abs() < 1e-9)
        .map(|p| p.latency_us)
}

/// Flattens a report's operation kinds (without the `-FAILED` and `Intended-` variants, whose
/// counts already show up as errors).
fn summarize(report: &Report) -> Vec<OperationSummary> {
    report
        .operations
        .iter()
        .filter(|entry| !entry.name.ends_with("-FAILED") && !entry.name.starts_with("Intended-"))
        .map(|entry| OperationSummary {
            name: entry.name.clone(),
            operations: entry.operations,
            average_latency_us: entry.average_latency_us,
            min_latency_us: entry.min_latency_us,
            p50_latency_us: percentile(entry, 50.0),
            p95_latency_us: percentile(entry, 95.0),
            p99_latency_us: percentile(entry, 99.0),
            max_latency_us: entry.max_latency_us,
            ok: count_status(entry, "OK"),
            not_found: count_status(entry, "NOT_FOUND"),
            errors: count_status(entry, "ERROR"),
        })
        .collect()
}

/// Everything a comparison produced; `results.json` is this, serialized.
#[derive(Debug, Clone, Serialize)]
pub struct Comparison {
    pub context: RunContext,
    /// Load phases, two per store when E is among the workloads (one otherwise).
    pub loads: Vec<PhaseRecord>,
    /// Workload runs: one per store and workload.
    pub phases: Vec<PhaseRecord>,
    /// The closed-economy phase's settings (`None`: skipped) and its runs, one per store.
    pub economy_setup: Option<String>,
    pub economy: Vec<economy::EconomyRecord>,
    #[serde(skip)]
    pub out_dir: PathBuf,
}

impl Comparison {
    /// The run of `workload` on `store`.
    pub fn phase(&self, store: DriverKind, workload: WorkloadId) -> Option<&PhaseRecord> {
        let store = cli::driver_name(store);
        self.phases
            .iter()
            .find(|p| p.store == store && p.workload == workload.letter())
    }

    /// Phases (loads and runs) that failed.
    pub fn failures(&self) -> impl Iterator<Item = &PhaseRecord> {
        self.loads
            .iter()
            .chain(&self.phases)
            .filter(|p| p.status == PhaseStatus::Failed)
    }

    fn record_mut(
        &mut self,
        store: DriverKind,
        workload: WorkloadId,
        phase: Phase,
        data_set: u32,
    ) -> &mut PhaseRecord {
        let store = cli::driver_name(store);
        let list = match phase {
            Phase::Load => &mut self.loads,
            Phase::Run => &mut self.phases,
        };
        list.iter_mut()
            .find(|p| p.store == store && p.workload == workload.letter() && p.data_set == data_set)
            .expect("every phase of the plan was recorded as pending up front")
    }
}

/// One data set of one store: a fresh start, a load, the workloads, a stop.
#[derive(Debug, Clone)]
struct DataSet {
    index: u32,
    workloads: Vec<WorkloadId>,
}

/// The validated arguments.
struct Plan {
    args: CompareArgs,
    stores: Vec<DriverKind>,
    data_sets: Vec<DataSet>,
    etcd_base_port: u16,
    meridian_bin: Option<PathBuf>,
    etcd_bin: Option<PathBuf>,
    out_dir: PathBuf,
    work_dir: PathBuf,
}

impl Plan {
    fn phase_count(&self) -> usize {
        self.stores.len()
            * self
                .data_sets
                .iter()
                .map(|set| set.workloads.len() + 1)
                .sum::<usize>()
    }
}

/// Runs the comparison (see the module docs) and writes its results to the output directory.
/// Returns an error, after writing what it has, if any phase failed or it was interrupted.
pub async fn run(args: CompareArgs) -> anyhow::Result<Comparison> {
    let (stores, data_sets) = validate(&args)?;
    let etcd_base_port = match args.etcd_base_port {
        Some(port) => port,
        None => args
            .base_port
            .checked_add(ETCD_PORT_OFFSET)
            .with_context(|| {
                format!(
                    "--base-port {} leaves no room for etcd's ports; pass --etcd-base-port",
                    args.base_port
                )
            })?,
    };
    check_port_ranges(args.base_port, etcd_base_port, &stores)?;
    let meridian_bin = if stores.contains(&DriverKind::Meridian) {
        Some(stores::locate_meridian(args.meridian_bin.as_deref())?)
    } else {
        None
    };
    let etcd_bin = if stores.contains(&DriverKind::Etcd) {
        Some(stores::locate_etcd(args.etcd_bin.as_deref())?)
    } else {
        None
    };
    let started = context::utc_now();
    let repo_root = context::find_repo_root();
    let out_dir = match &args.out {
        Some(dir) => dir.clone(),
        None => match &repo_root {
            Some(root) => root.join("bench").join("results").join(&started.date),
            None => bail!(
                "cannot find the Meridian repository (a directory with bench/Cargo.toml) above \
                 this executable or the current directory; pass --out DIR"
            ),
        },
    };
    std::fs::create_dir_all(&out_dir)
        .with_context(|| format!("creating the output directory {}", out_dir.display()))?;
    let (work_dir, temp_dir) = match &args.data_dir {
        Some(dir) => {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("creating the data directory {}", dir.display()))?;
            (dir.clone(), None)
        }
        None => {
            let temp = tempfile::Builder::new()
                .prefix("meridian-compare-")
                .tempdir()
                .context("creating a temporary data directory")?;
            (temp.path().to_path_buf(), Some(temp))
        }
    };

    let context = RunContext::gather(
        &args,
        &stores,
        &data_sets
            .iter()
            .flat_map(|set| set.workloads.iter().copied())
            .collect::<Vec<_>>(),
        &started,
        repo_root.as_deref(),
        meridian_bin.as_deref(),
        etcd_bin.as_deref(),
        &work_dir,
    );
    let mut comparison = Comparison {
        context,
        loads: Vec::new(),
        phases: Vec::new(),
        economy_setup: None,
        economy: Vec::new(),
        out_dir: out_dir.clone(),
    };
    for store in &stores {
        for set in &data_sets {
            let load_for = set.workloads[0];
            comparison.loads.push(PhaseRecord::pending(
                *store,
                load_for,
                Phase::Load,
                set.index,
            ));
            for workload in &set.workloads {
                comparison.phases.push(PhaseRecord::pending(
                    *store,
                    *workload,
                    Phase::Run,
                    set.index,
                ));
            }
        }
    }
    let plan = Plan {
        args,
        stores,
        data_sets,
        etcd_base_port,
        meridian_bin,
        etcd_bin,
        out_dir,
        work_dir,
    };
    progress(&format!(
        "{} stores, workloads {}, {} records, {} operations, {} threads; results in {}, data in {}",
        plan.stores.len(),
        comparison.context.workloads.join(","),
        plan.args.records,
        plan.args.operations,
        plan.args.threads,
        plan.out_dir.display(),
        plan.work_dir.display()
    ));

    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("installing the SIGTERM handler")?;
    // Dropping the work future drops every store guard in it, which kills the servers.
    let interruption = tokio::select! {
        () = run_all(&plan, &mut comparison) => None,
        _ = tokio::signal::ctrl_c() => Some("interrupted (Ctrl-C)"),
        _ = terminate.recv() => Some("terminated (SIGTERM)"),
    };
    if let Some(reason) = interruption {
        progress(&format!(
            "{reason}: servers stopped, writing partial results"
        ));
        for record in comparison
            .loads
            .iter_mut()
            .chain(comparison.phases.iter_mut())
        {
            if record.status == PhaseStatus::Skipped {
                record.error = Some(reason.to_string());
            }
        }
    }
    comparison.context.finish();

    let written = write_results(&comparison);
    match (temp_dir, plan.args.keep_data) {
        (Some(temp), true) => progress(&format!("data and logs kept in {}", temp.keep().display())),
        (Some(temp), false) => {
            let path = temp.path().to_path_buf();
            if let Err(error) = temp.close() {
                eprintln!(
                    "meridian-ycsb compare: could not remove {}: {error}",
                    path.display()
                );
            }
        }
        (None, _) => progress(&format!(
            "data and logs left in {}",
            plan.work_dir.display()
        )),
    }
    written?;
    progress(&format!("results written to {}", plan.out_dir.display()));

    if let Some(reason) = interruption {
        bail!("{reason}; partial results in {}", plan.out_dir.display());
    }
    let failures: Vec<String> = comparison
        .failures()
        .map(|p| {
            format!(
                "{}: {}",
                p.file_stem(),
                p.error.as_deref().unwrap_or("failed")
            )
        })
        .chain(
            comparison
                .economy
                .iter()
                .filter(|e| e.status != "ok")
                .map(|e| {
                    format!(
                        "{}-economy: {}",
                        e.store,
                        e.error.as_deref().unwrap_or("failed")
                    )
                }),
        )
        .collect();
    if !failures.is_empty() {
        bail!(
            "{} phase(s) failed (results in {}):\n  {}",
            failures.len(),
            plan.out_dir.display(),
            failures.join("\n  ")
        );
    }
    Ok(comparison)
}

/// Checks counts and limits; returns the stores (deduplicated, in the given order) and the data
/// sets (workloads in YCSB's order, E on its own).
fn validate(args: &CompareArgs) -> anyhow::Result<(Vec<DriverKind>, Vec<DataSet>)> {
    if args.records == 0 || args.records > MAX_COUNT {
        bail!("--records must be in 1..={MAX_COUNT}");
    }
    if args.operations == 0 || args.operations > MAX_COUNT {
        bail!("--operations must be in 1..={MAX_COUNT}");
    }
    if args.economy_operations.is_some_and(|n| n > MAX_COUNT) {
        bail!("--economy-operations must be in 0..={MAX_COUNT}");
    }
    if args.threads == 0 || args.threads > MAX_THREADS {
        bail!("--threads must be in 1..={MAX_THREADS}");
    }
    if args.timeout_ms == 0 || args.timeout_ms > cli::MAX_TIMEOUT_MS {
        bail!("--timeout-ms must be in 1..={}", cli::MAX_TIMEOUT_MS);
    }
    if args.ready_timeout_secs == 0 {
        bail!("--ready-timeout-secs must be at least 1");
    }
    let mut stores = Vec::new();
    for store in &args.stores {
        if !stores.contains(store) {
            stores.push(*store);
        }
    }
    if stores.is_empty() {
        bail!("--stores is empty");
    }
    let mut data_sets = Vec::new();
    let first: Vec<WorkloadId> = RUN_ORDER
        .iter()
        .copied()
        .filter(|w| *w != WorkloadId::E && args.workloads.contains(w))
        .collect();
    if !first.is_empty() {
        data_sets.push(DataSet {
            index: 1,
            workloads: first,
        });
    }
    if args.workloads.contains(&WorkloadId::E) {
        data_sets.push(DataSet {
            index: 2,
            workloads: vec![WorkloadId::E],
        });
    }
    if data_sets.is_empty() {
        bail!("--workloads is empty");
    }
    Ok((stores, data_sets))
}

/// The two port ranges must fit in u16 and not overlap.
fn check_port_ranges(
    meridian_base: u16,
    etcd_base: u16,
    stores: &[DriverKind],
) -> anyhow::Result<()> {
    let meridian_end = u32::from(meridian_base) + u32::from(MERIDIAN_PORT_SPAN);
    let etcd_end = u32::from(etcd_base) + u32::from(ETCD_PORT_SPAN);
    if stores.contains(&DriverKind::Meridian) && meridian_end > u32::from(u16::MAX) {
        bail!("--base-port {meridian_base} leaves no room for Meridian's ports");
    }
    if stores.contains(&DriverKind::Etcd) && etcd_end > u32::from(u16::MAX) {
        bail!("--etcd-base-port {etcd_base} leaves no room for etcd's ports");
    }
    let overlap = u32::from(meridian_base) < etcd_end && u32::from(etcd_base) < meridian_end;
    if overlap && stores.contains(&DriverKind::Meridian) && stores.contains(&DriverKind::Etcd) {
        bail!(
            "Meridian's ports {meridian_base}..{meridian_end} and etcd's {etcd_base}..{etcd_end} \
             overlap; pick another --etcd-base-port"
        );
    }
    Ok(())
}

/// A progress line on stderr.
fn progress(message: &str) {
    eprintln!("[compare] {message}");
}

/// Runs every store's data sets in turn. Never fails: failures are recorded on their phases.
async fn run_all(plan: &Plan, comparison: &mut Comparison) {
    let total = plan.phase_count();
    let mut phases_before = 0usize;
    for store in &plan.stores {
        for set in &plan.data_sets {
            // Numbering stays right when a data set ends early.
            let mut step = phases_before;
            if let Err(error) = run_data_set(plan, *store, set, comparison, &mut step, total).await
            {
                let name = cli::driver_name(*store);
                progress(&format!("{name}: data set {} failed: {error:#}", set.index));
                let failed: Vec<String> = comparison
                    .failures()
                    .filter(|p| p.store == name && p.data_set == set.index)
                    .map(PhaseRecord::file_stem)
                    .collect();
                let reason = format!("{} failed", failed.join(", "));
                for record in comparison
                    .loads
                    .iter_mut()
                    .chain(comparison.phases.iter_mut())
                {
                    if record.store == name
                        && record.data_set == set.index
                        && record.status == PhaseStatus::Skipped
                    {
                        record.error = Some(reason.clone());
                    }
                }
            }
            phases_before += set.workloads.len() + 1;
        }
    }
    let operations = plan.args.economy_operations.unwrap_or(plan.args.operations);
    if operations > 0 {
        let setup = economy::run(plan, operations, &mut comparison.economy).await;
        comparison.economy_setup = Some(setup);
    }
}

/// Starts `store` fresh, loads it, runs the data set's workloads and stops it. The first
/// failure is recorded on its phase and ends the data set.
async fn run_data_set(
    plan: &Plan,
    store: DriverKind,
    set: &DataSet,
    comparison: &mut Comparison,
    step: &mut usize,
    total: usize,
) -> anyhow::Result<()> {
    let name = cli::driver_name(store);
    let store_dir = plan.work_dir.join(format!("{name}-{}", set.index));
    if store_dir.exists() {
        std::fs::remove_dir_all(&store_dir)
            .with_context(|| format!("removing the old data in {}", store_dir.display()))?;
    }
    let load_for = set.workloads[0];
    progress(&format!("{name}: starting fresh (data set {})", set.index));
    let config = stores::StoreConfig {
        meridian_bin: plan.meridian_bin.clone(),
        etcd_bin: plan.etcd_bin.clone(),
        meridian_base_port: plan.args.base_port,
        etcd_base_port: plan.etcd_base_port,
        data_dir: store_dir.clone(),
        ready_timeout: Duration::from_secs(plan.args.ready_timeout_secs),
    };
    let mut running = match stores::RunningStore::start(store, &config).await {
        Ok(running) => running,
        Err(error) => {
            let error = error.context(format!("starting {name}"));
            comparison
                .record_mut(store, load_for, Phase::Load, set.index)
                .fail(&error);
            return Err(error);
        }
    };
    progress(&format!("{name}: ready ({})", running.describe()));

    let mut result = Ok(());
    let phases = std::iter::once((Phase::Load, load_for))
        .chain(set.workloads.iter().map(|w| (Phase::Run, *w)));
    for (phase, workload) in phases {
        *step += 1;
        let what = match phase {
            Phase::Load => format!("load {} records", plan.args.records),
            Phase::Run => format!("workload {workload} ({})", workload.mix()),
        };
        progress(&format!(
            "[{step}/{total}] {name}: {what}, {} threads",
            plan.args.threads
        ));
        let outcome = run_phase(plan, &running, phase, workload).await;
        // A server that died mid-phase makes the phase's numbers meaningless.
        let outcome = outcome.and_then(|outcome| {
            running.check_alive()?;
            Ok(outcome)
        });
        let record = comparison.record_mut(store, workload, phase, set.index);
        match outcome {
            Ok(outcome) => {
                let text = outcome.report.render_text();
                let file = format!("{}.txt", record.file_stem());
                record.complete(outcome);
                record.text_report_file = Some(file.clone());
                let path = plan.out_dir.join(&file);
                if let Err(error) = std::fs::write(&path, text) {
                    eprintln!("meridian-ycsb compare: writing {}: {error}", path.display());
                }
                progress(&format!(
                    "{name}: {what}: {:.0} ops/s, {} errors",
                    record.throughput_ops_per_sec.unwrap_or_default(),
                    record.error_count
                ));
            }
            Err(error) => {
                record.fail(&error);
                progress(&format!("{name}: {what} failed: {error:#}"));
                result = Err(error);
                break;
            }
        }
    }

    progress(&format!("{name}: stopping"));
    let stopped = running.stop();
    if let Err(error) = &stopped {
        progress(&format!("{name}: {error:#}"));
    }
    if !plan.args.keep_data {
        if let Err(error) = std::fs::remove_dir_all(&store_dir) {
            eprintln!(
                "meridian-ycsb compare: could not remove {}: {error}",
                store_dir.display()
            );
        }
    }
    result
}

/// One load or run through the same code path as `meridian-ycsb load|run`.
async fn run_phase(
    plan: &Plan,
    running: &stores::RunningStore,
    phase: Phase,
    workload: WorkloadId,
) -> anyhow::Result<PhaseOutcome> {
    let base = Properties::parse(workload.properties_text())
        .with_context(|| format!("built-in workload{}", workload.letter()))?;
    let args = PhaseArgs {
        workload_files: Vec::new(),
        overrides: vec![
            format!("recordcount={}", plan.args.records),
            format!("operationcount={}", plan.args.operations),
            format!("hdrhistogram.percentiles={PERCENTILES}"),
        ],
        threads: Some(plan.args.threads),
        target: None,
        status_interval: plan.args.status_interval,
        db: running.kind(),
        endpoints: running.endpoints(),
        data_dir: running.rocksdb_dir(),
        timeout_ms: plan.args.timeout_ms,
        sync_writes: false,
        json_out: None,
    };
    cli::execute_phase(phase, &args, base).await
}

/// Writes results.json, results.md and chart.svg.
fn write_results(comparison: &Comparison) -> anyhow::Result<()> {
    let dir = &comparison.out_dir;
    let json = serde_json::to_string_pretty(comparison).context("serializing results.json")?;
    write_file(&dir.join("results.json"), &(json + "\n"))?;
    write_file(&dir.join("results.md"), &markdown::render(comparison))?;
    write_file(&dir.join("chart.svg"), &chart::render(comparison))?;
    Ok(())
}

fn write_file(path: &Path, text: &str) -> anyhow::Result<()> {
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn parse(extra: &[&str]) -> CompareArgs {
        #[derive(Parser)]
        struct Wrapper {
            #[command(flatten)]
            args: CompareArgs,
        }
        let mut argv = vec!["compare"];
        argv.extend_from_slice(extra);
        Wrapper::try_parse_from(argv).expect("parses").args
    }

    /// Defaults: all stores, A B C F D on one data set and E on a reload.
    #[test]
    fn default_plan() {
        let args = parse(&[]);
        assert_eq!(
            (args.records, args.operations, args.threads),
            (100_000, 100_000, 64)
        );
        let (stores, sets) = validate(&args).unwrap();
        assert_eq!(
            stores,
            vec![DriverKind::Meridian, DriverKind::Etcd, DriverKind::Rocksdb]
        );
        assert_eq!(sets.len(), 2);
        assert_eq!(
            sets[0].workloads,
            vec![
                WorkloadId::A,
                WorkloadId::B,
                WorkloadId::C,
                WorkloadId::F,
                WorkloadId::D
            ]
        );
        assert_eq!(sets[1].workloads, vec![WorkloadId::E]);
    }

    /// Any order given runs in YCSB's order; duplicates collapse; no E means no reload.
    #[test]
    fn workloads_are_reordered() {
        let args = parse(&["--workloads", "d,a,d", "--stores", "rocksdb,rocksdb"]);
        let (stores, sets) = validate(&args).unwrap();
        assert_eq!(stores, vec![DriverKind::Rocksdb]);
        assert_eq!(sets.len(), 1);
        assert_eq!(sets[0].workloads, vec![WorkloadId::A, WorkloadId::D]);
        let only_e = parse(&["--workloads", "e"]);
        let (_, sets) = validate(&only_e).unwrap();
        assert_eq!(sets.len(), 1);
        assert_eq!(sets[0].index, 2);
    }

    /// Zero counts and overlapping port ranges are refused with a clear message.
    #[test]
    fn bad_arguments() {
        assert!(validate(&parse(&["--records", "0"])).is_err());
        assert!(validate(&parse(&["--threads", "0"])).is_err());
        let both = [DriverKind::Meridian, DriverKind::Etcd];
        let error = check_port_ranges(27_000, 27_050, &both).unwrap_err();
        assert!(error.to_string().contains("overlap"), "{error}");
        assert!(check_port_ranges(27_000, 27_200, &both).is_ok());
        assert!(check_port_ranges(27_000, 27_050, &[DriverKind::Etcd]).is_ok());
        assert!(check_port_ranges(65_500, 20_000, &both).is_err());
    }

    /// The compiled-in workload files parse and carry the expected mixes.
    #[test]
    fn built_in_workloads_parse() {
        for workload in RUN_ORDER {
            let properties = Properties::parse(workload.properties_text()).unwrap();
            assert_eq!(properties.get("recordcount"), Some("100000"), "{workload}");
        }
        let e = Properties::parse(WorkloadId::E.properties_text()).unwrap();
        assert_eq!(e.get("scanproportion"), Some("0.95"));
    }
}
