//! What a comparison records: one [`PhaseRecord`] per load or workload run (its status, the
//! flattened [`OperationSummary`] of each operation kind, the full report), gathered in the
//! [`Comparison`] that `results.json` serializes.

use std::path::PathBuf;

use serde::Serialize;

use super::economy;
use super::{RunContext, WorkloadId};
use crate::cli::{self, PhaseOutcome};
use crate::client::Phase;
use crate::db::DriverKind;
use crate::report::Report;

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
    pub(super) fn pending(
        store: DriverKind,
        workload: WorkloadId,
        phase: Phase,
        data_set: u32,
    ) -> Self {
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

    pub(super) fn complete(&mut self, outcome: PhaseOutcome) {
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

    pub(super) fn fail(&mut self, error: &anyhow::Error) {
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

    pub(super) fn record_mut(
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
