//! The comparison itself: [`run`] plans it, runs every store's data sets and the closed economy
//! one store at a time (raced against Ctrl-C and SIGTERM), and writes the results.

use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Context};

use super::plan::{check_port_ranges, validate, DataSet, Plan};
use super::record::{Comparison, PhaseRecord, PhaseStatus};
use super::{chart, context, economy, markdown, stores};
use super::{CompareArgs, RunContext, WorkloadId, ETCD_PORT_OFFSET, PERCENTILES};
use crate::cli::{self, PhaseArgs, PhaseOutcome};
use crate::client::Phase;
use crate::db::DriverKind;
use crate::properties::Properties;

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

/// A progress line on stderr.
pub(super) fn progress(message: &str) {
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
