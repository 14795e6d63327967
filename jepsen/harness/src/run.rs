//! One run, start to finish: set up, run the workload and the nemesis, heal, recover, read
//! back, stop every process, check, write the run directory, summarize.
//!
//! Everything that starts node processes runs in the future that `main` blocks on, i.e. on
//! the main thread (see `nemesis.rs` for why). SIGINT/SIGTERM abandon the cluster phase: the
//! clients are aborted, every node is continued (SIGCONT) and stopped, the nftables table is
//! deleted, and what was recorded so far is written with `"valid": "unknown"`.

use crate::args::{RunConfig, Workload};
use crate::check::{self, ControlOutcome, Verdict};
use crate::clocks::FakeClocks;
use crate::cluster::{self, READY_TIMEOUT};
use crate::nemesis::{FaultTools, IntervalRecord, Nemesis, NemesisLog, NodeExit};
use crate::nft::{NftLayout, NftTable};
use crate::output;
use crate::plan::{self, Step};
use crate::power::{self, PowerSupply};
use crate::replicas;
use crate::workload::{self, Recorder};
use crate::{append, bank};
use meridian_cli::LocalCluster;
use meridian_jepsen::checker::Validity;
use meridian_jepsen::timeline::NemesisInterval;
use nix::sys::signal::Signal;
use serde_json::json;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Exit statuses.
pub const EXIT_VALID: u8 = 0;
pub const EXIT_INVALID: u8 = 1;
pub const EXIT_HARNESS: u8 = 3;
pub const EXIT_INTERRUPTED: u8 = 130;

/// What the cluster phase produced.
#[derive(Default)]
struct Collected {
    keys: Vec<String>,
    plan: Vec<Step>,
    intervals: Vec<IntervalRecord>,
    exits: Vec<NodeExit>,
    errors: Vec<String>,
    recovery_ms: Option<u64>,
    final_read_ok: bool,
    workload_ms: u64,
    /// Set workload: the set's shard and which replicas converged (see `replicas`).
    converged: Option<replicas::Converged>,
    /// Register workload: per key, its shard and which replicas converged.
    register_converged: Vec<(String, replicas::Converged)>,
    /// Per node, the reads it served on parked leases (`meridian_raft_parked_reads_total`,
    /// read after the heal: since the node's last start), `None` if it did not answer.
    parked_reads: std::collections::BTreeMap<String, Option<u64>>,
}

async fn shutdown_signal() -> &'static str {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    tokio::select! {
        _ = tokio::signal::ctrl_c() => "SIGINT",
        _ = async {
            match term.as_mut() {
                Some(t) => { t.recv().await; }
                None => std::future::pending::<()>().await,
            }
        } => "SIGTERM",
    }
}

/// Runs one test; returns the exit status.
pub async fn run(cfg: RunConfig, meridian: PathBuf) -> anyhow::Result<u8> {
    let t0 = Instant::now();
    cluster::ensure_ports_free(cfg.base_port, cfg.nodes)?;
    let store = cfg.store.clone().unwrap_or_else(output::default_store);
    let dir = output::create_run_dir(&store, cfg.workload.name(), cfg.nemesis.name())?;
    let data_dir = cluster::make_data_dir(cfg.base_port)?;
    eprintln!(
        "meridian-jepsen: {}{} × {}, {} s, {} clients, {} nodes, {} shards, seed {}{}",
        cfg.workload.name(),
        if cfg.linearizable {
            " (commit-wait)"
        } else {
            ""
        },
        cfg.nemesis.name(),
        cfg.time_limit_s,
        cfg.concurrency,
        cfg.nodes,
        cfg.shards,
        cfg.seed,
        if cfg.seed_given { "" } else { " (random)" },
    );
    eprintln!("  run directory {}", dir.display());
    let nft = if cfg.nemesis.partitions() {
        Some(Arc::new(NftTable::create(NftLayout::new(
            cfg.base_port,
            cfg.nodes,
        ))?))
    } else {
        None
    };
    // Power-loss runs put every node's data directory on a lazyfs mount (see `power`).
    let power = if cfg.nemesis.cuts_power() {
        let lazyfs = power::default_lazyfs_binary(&meridian);
        Some(Arc::new(PowerSupply::start(
            &lazyfs,
            &data_dir,
            cfg.nodes,
            nft.is_some(),
        )?))
    } else {
        None
    };
    // Clock jumps and strobes move running nodes' wall clocks through libfaketime (`clocks`).
    let clocks = if cfg.nemesis.jumps_clocks() {
        Some(Arc::new(FakeClocks::create(
            &data_dir.join("clock"),
            cfg.nodes,
        )?))
    } else {
        None
    };
    let cluster = Arc::new(cluster::start(
        &meridian,
        cfg.nodes,
        cfg.base_port,
        &data_dir,
        cfg.shards,
        nft.is_some(),
        clocks.as_deref(),
    )?);
    let recorder = Arc::new(Recorder::new(Instant::now()));
    let mut collected = Collected::default();
    let nemesis_log = Arc::new(Mutex::new(NemesisLog::default()));
    let mut phase_error = None;
    let tools = FaultTools {
        nft: nft.clone(),
        power: power.clone(),
        clocks,
    };
    let interrupted = tokio::select! {
        result = cluster_phase(&cfg, &cluster, tools, &recorder, &nemesis_log, &mut collected) => {
            if let Err(e) = result {
                eprintln!("meridian-jepsen: harness failure: {e:#}");
                phase_error = Some(format!("{e:#}"));
            }
            None
        }
        signal = shutdown_signal() => Some(signal),
    };
    if let Some(signal) = interrupted {
        eprintln!("meridian-jepsen: interrupted by {signal}; stopping the cluster");
    }
    {
        let mut log = nemesis_log.lock().unwrap_or_else(|p| p.into_inner());
        collected.intervals = std::mem::take(&mut log.intervals);
        for interval in collected.intervals.iter_mut().filter(|i| !i.healed) {
            interval.end_ns = recorder.now_ns();
            interval
                .notes
                .push("interrupted while active; healed by the harness's cleanup".into());
        }
        collected.exits = std::mem::take(&mut log.exits);
    }
    // Stop everything we started, whatever happened above.
    for node in cluster.node_ids() {
        if let Ok(Some(_)) = cluster.pid(node) {
            let _ = cluster.kill(node, Signal::SIGCONT);
        }
    }
    let forced = cluster.stop_all(Duration::from_secs(20));
    if !forced.is_empty() {
        collected.errors.push(format!(
            "nodes {forced:?} ignored SIGTERM and were SIGKILLed"
        ));
    }
    drop(nft); // deletes the nftables table (the nemesis held the only other reference)
    let logs: Vec<(u64, PathBuf)> = cluster
        .node_ids()
        .into_iter()
        .filter_map(|n| cluster.log_path(n).ok().map(|p| (n, p)))
        .collect();
    collected.errors.extend(output::copy_logs(&dir, &logs));
    // Evidence of clock fencing: peers' rejections of a node beyond max_offset.
    let fencing: std::collections::BTreeMap<String, usize> = cluster
        .node_ids()
        .into_iter()
        .map(|n| {
            let log = cluster.log_contents(n).unwrap_or_default();
            (format!("n{n}"), log.matches("beyond max_offset").count())
        })
        .collect();
    drop(cluster);

    // A write-gap run exists to check reads served on parked leases: one that served none
    // checked nothing it was asked to (a harness failure, recorded in results.json).
    if cfg.write_gap.is_some()
        && interrupted.is_none()
        && phase_error.is_none()
        && collected.parked_reads.values().flatten().sum::<u64>() == 0
    {
        phase_error = Some(
            "--write-gap-ms was given, but no node reports a read served on a parked lease: the \
             run did not exercise them"
                .into(),
        );
    }
    let history = recorder.snapshot();
    let real_time = if cfg.nemesis.skews_clocks() && !cfg.linearizable {
        meridian_jepsen::checker::append::RealTime::PerKey
    } else {
        meridian_jepsen::checker::append::RealTime::Strict
    };
    let mut verdict = match interrupted {
        Some(_) => None,
        None => Some(check::check(
            cfg.workload,
            &history,
            &collected.keys,
            real_time,
        )?),
    };
    // Every replica of the set's shard must hold every acknowledged add, not only the one
    // that served the final read (see `replicas`).
    if let (Some(v), Some(converged)) = (verdict.as_mut(), collected.converged.clone()) {
        let mut held = std::collections::BTreeMap::new();
        for node in &converged.nodes {
            let db = data_dir.join(format!("node{node}")).join("db");
            match replicas::read_replica(&db, converged.shard, (&converged.start, &converged.end)) {
                Ok(elements) => {
                    held.insert(*node, elements);
                }
                Err(e) => collected
                    .errors
                    .push(format!("replica check: reading n{node}: {e:#}")),
            }
        }
        let result =
            replicas::check_replicas(&replicas::acknowledged(&history), &held, &converged.lagging);
        v.results.push(result);
        v.valid = meridian_jepsen::checker::overall(&v.results);
    }
    // Replicas of each register key's shard that applied the same log must agree on its value.
    if let (Some(v), false) = (verdict.as_mut(), collected.register_converged.is_empty()) {
        let mut values = std::collections::BTreeMap::new();
        let mut lagging = std::collections::BTreeMap::new();
        for (key, converged) in &collected.register_converged {
            let mut held = std::collections::BTreeMap::new();
            for node in &converged.nodes {
                let db = data_dir.join(format!("node{node}")).join("db");
                match replicas::read_register(&db, converged.shard, key) {
                    Ok(value) => {
                        held.insert(*node, value);
                    }
                    Err(e) => collected
                        .errors
                        .push(format!("replica check: reading {key} on n{node}: {e:#}")),
                }
            }
            values.insert(key.clone(), held);
            lagging.insert(key.clone(), converged.lagging.clone());
        }
        v.results
            .push(replicas::check_register_replicas(&values, &lagging));
        v.valid = meridian_jepsen::checker::overall(&v.results);
    }
    let control = match (cfg.negative_control, &verdict) {
        (Some(control), Some(_)) => Some(check::run_control(
            cfg.workload,
            control,
            &history,
            &collected.keys,
            cfg.seed,
            real_time,
        )?),
        _ => None,
    };
    let reported: Option<&Verdict> = match &control {
        Some(c) => c.mutated.as_ref(),
        None => verdict.as_ref(),
    };
    // A harness failure makes a clean verdict meaningless, but an anomaly found is still real.
    let valid = match (reported.map(|v| v.valid), &phase_error) {
        (Some(Validity::False), _) => Validity::False,
        (Some(v), None) => v,
        _ => Validity::Unknown,
    };
    let counts = check::op_counts(&history);
    let (ok, fail, info) = check::totals(&counts);
    let intervals: Vec<NemesisInterval> = collected
        .intervals
        .iter()
        .map(|i| NemesisInterval {
            start_ns: i.start_ns,
            end_ns: i.end_ns,
            label: i.label.clone(),
        })
        .collect();
    let results = json!({
        "valid": valid,
        "history_valid": verdict.as_ref().map(|v| v.valid),
        "interrupted": interrupted,
        "workload": cfg.workload.name(),
        "nemesis": cfg.nemesis.name(),
        "seed": cfg.seed,
        "seed_given": cfg.seed_given,
        "time_limit_s": cfg.time_limit_s,
        "concurrency": cfg.concurrency,
        "nodes": cfg.nodes,
        "shards": cfg.shards,
        "linearizable": cfg.linearizable,
        "base_port": cfg.base_port,
        "keys": collected.keys,
        "negative_control": control,
        "anomalies": reported.map(|v| v.results.iter().flat_map(|r| r.anomalies.clone()).collect::<Vec<_>>()),
        "checkers": reported.map(|v| v.results.clone()),
        "ops_checked": reported.map(|v| v.ops_checked),
        "check_ms": reported.map(|v| v.check_ms),
        "ops": counts,
        "ops_total": {"ok": ok, "fail": fail, "info": info, "events": history.len()},
        "nemesis_schedule": collected.plan,
        "nemesis_intervals": collected.intervals,
        "node_exits": collected.exits,
        "beyond_max_offset_log_lines": fencing,
        "harness_failure": phase_error,
        "errors": collected.errors,
        "recovery_ms": collected.recovery_ms,
        "parked_reads": collected.parked_reads,
        "write_gap_ms": cfg.write_gap.map(|g| g.as_millis() as u64),
        "final_read_ok": collected.final_read_ok,
        "workload_ms": collected.workload_ms,
        "total_ms": t0.elapsed().as_millis() as u64,
        "data_dir": data_dir,
    });
    let title = format!(
        "{} × {} — seed {} — {}",
        cfg.workload.name(),
        cfg.nemesis.name(),
        cfg.seed,
        dir.file_name()
            .map(|n| n.to_string_lossy().to_string())
            .unwrap_or_default()
    );
    output::write_run(&dir, &history, &intervals, &title, &results)?;

    let mut status = summarize(
        &dir,
        &collected,
        verdict.as_ref(),
        control.as_ref(),
        interrupted,
        (ok, fail, info),
    );
    if let Some(e) = &phase_error {
        if status == EXIT_VALID || valid != Validity::False {
            eprintln!("HARNESS FAILURE: {e}");
            status = EXIT_HARNESS;
        }
    }
    // The replica checks above read the nodes' RocksDB through the mounts; now release them
    // (lazyfs writes back what it holds) before the data directory goes.
    if let Some(power) = power {
        for e in power.shutdown() {
            eprintln!("meridian-jepsen: {e}");
        }
    }
    if cfg.nemesis.jumps_clocks() {
        crate::clocks::sweep_dead_shm();
    }
    if status == EXIT_VALID {
        let _ = std::fs::remove_dir_all(&data_dir);
    } else {
        eprintln!(
            "  node data kept in {}{}",
            data_dir.display(),
            if cfg.nemesis.cuts_power() {
                " (under backing/: the lazyfs mounts are gone)"
            } else {
                ""
            }
        );
    }
    eprintln!("  took {:.1} s", t0.elapsed().as_secs_f64());
    Ok(status)
}

/// Waits for the cluster, runs the workload with the nemesis, heals, recovers, reads back.
async fn cluster_phase(
    cfg: &RunConfig,
    cluster: &Arc<LocalCluster>,
    tools: FaultTools,
    recorder: &Arc<Recorder>,
    nemesis_log: &Arc<Mutex<NemesisLog>>,
    out: &mut Collected,
) -> anyhow::Result<()> {
    let ready_at = Instant::now();
    cluster.wait_ready(READY_TIMEOUT).await?;
    eprintln!(
        "  cluster ready in {:.1} s",
        ready_at.elapsed().as_secs_f64()
    );
    let endpoints = cluster.endpoints();
    let nemesis_client = workload::connect(&endpoints, cfg.seed, 1_000_000)
        .await
        .ok();
    let mut bank_groups = Vec::new();
    out.keys = match cfg.workload {
        Workload::Register => {
            let client = workload::connect(&endpoints, cfg.seed, 1_000_001).await?;
            workload::register_keys(&client.shard_map(), cfg.keys)
        }
        Workload::Bank => {
            let client = workload::connect(&endpoints, cfg.seed, 1_000_001).await?;
            bank_groups = bank::accounts(&client.shard_map());
            anyhow::ensure!(
                !bank_groups.is_empty(),
                "no shard can hold the bank's accounts"
            );
            bank::open(&client, &bank_groups).await?;
            bank_groups.concat()
        }
        _ => vec![workload::set_key(0)],
    };
    let bank_groups = Arc::new(bank_groups);
    let append_groups = Arc::new(match cfg.workload {
        Workload::Append => {
            let client = workload::connect(&endpoints, cfg.seed, 1_000_001).await?;
            let groups = append::keys(&client.shard_map());
            anyhow::ensure!(!groups.is_empty(), "no shard can hold the append keys");
            out.keys = groups.concat();
            groups
        }
        _ => Vec::new(),
    });
    let time_limit = Duration::from_secs(cfg.time_limit_s);
    out.plan = plan::plan(
        cfg.nemesis,
        cfg.nodes,
        out.keys.len(),
        time_limit.as_millis() as u64,
        cfg.seed,
    );
    let mut clients = Vec::new();
    for process in 0..cfg.concurrency as u64 {
        clients.push(workload::connect(&endpoints, cfg.seed, process).await?);
    }

    // History time 0 = the workload's start (nemesis intervals use the same clock).
    recorder.restart_clock();
    let started = recorder.start();
    let until = started + time_limit;
    let mut tasks = tokio::task::JoinSet::new();
    let keys = Arc::new(out.keys.clone());
    let next = Arc::new(AtomicU64::new(0));
    let write_gap = cfg
        .write_gap
        .map(|gap| Arc::new(workload::WriteGap::new(gap)));
    for (process, client) in clients.into_iter().enumerate() {
        let (recorder, process) = (recorder.clone(), process as u64);
        match cfg.workload {
            Workload::Register => tasks.spawn(workload::register_client(
                client,
                recorder,
                keys.clone(),
                (process, cfg.seed),
                write_gap.clone(),
                until,
            )),
            Workload::Append => tasks.spawn(append::append_client(
                client,
                recorder,
                append_groups.clone(),
                next.clone(),
                (process, cfg.seed),
                cfg.linearizable,
                until,
            )),
            Workload::Bank => tasks.spawn(bank::bank_client(
                client,
                recorder,
                bank_groups.clone(),
                process,
                cfg.seed,
                until,
            )),
            _ => tasks.spawn(workload::set_client(
                client,
                recorder,
                next.clone(),
                process,
                cfg.seed,
                until,
            )),
        };
    }
    let mut nemesis = Nemesis::new(
        cluster.clone(),
        tools,
        nemesis_client,
        out.keys.clone(),
        recorder.start(),
        cfg.seed,
        nemesis_log.clone(),
    );
    let mut task_errors = Vec::new();
    let plan = out.plan.clone();
    tokio::join!(nemesis.run(&plan, until), async {
        while let Some(joined) = tasks.join_next().await {
            if let Err(e) = joined {
                task_errors.push(format!("client task: {e}"));
            }
        }
    });
    out.errors.extend(task_errors);
    out.workload_ms = started.elapsed().as_millis() as u64;
    eprintln!(
        "  workload done after {:.1} s; healing",
        started.elapsed().as_secs_f64()
    );

    // Heal everything and wait for every shard to have a leader again.
    let recover_at = Instant::now();
    for attempt in 0..3 {
        nemesis.heal(&mut out.errors).await;
        match cluster.wait_ready(READY_TIMEOUT).await {
            Ok(_) => {
                out.recovery_ms = Some(recover_at.elapsed().as_millis() as u64);
                break;
            }
            Err(e) => out
                .errors
                .push(format!("recovery attempt {}: {e:#}", attempt + 1)),
        }
    }
    drop(nemesis);
    for node in cluster.node_ids() {
        let port = cluster::metrics_port(cfg.base_port, node);
        let served = crate::status::metric_sum(port, "meridian_raft_parked_reads_total").await;
        out.parked_reads.insert(format!("n{node}"), served);
    }

    // Final reads, by a process of their own.
    let process = cfg.concurrency as u64;
    let client = workload::connect(&endpoints, cfg.seed, process).await?;
    out.final_read_ok = match cfg.workload {
        Workload::Register => {
            workload::final_register_reads(&client, recorder, &out.keys, process).await
                == out.keys.len()
        }
        Workload::Bank => bank::final_read(&client, recorder, &bank_groups, process).await,
        Workload::Append => append::final_read(&client, recorder, &append_groups, process).await,
        _ => workload::final_set_read(&client, recorder, process).await,
    };
    if cfg.workload == Workload::Set {
        match replicas::wait_converged(cluster).await {
            Ok(converged) => out.converged = Some(converged),
            Err(e) => out.errors.push(format!("replica check: {e:#}")),
        }
    }
    if cfg.workload == Workload::Register {
        for key in out.keys.clone() {
            match replicas::wait_converged_for(cluster, key.as_bytes()).await {
                Ok(converged) => out.register_converged.push((key, converged)),
                Err(e) => out.errors.push(format!("replica check: {e:#}")),
            }
        }
    }
    Ok(())
}

/// Prints the summary; returns the exit status.
fn summarize(
    dir: &Path,
    collected: &Collected,
    verdict: Option<&Verdict>,
    control: Option<&ControlOutcome>,
    interrupted: Option<&str>,
    (ok, fail, info): (usize, usize, usize),
) -> u8 {
    eprintln!("  ops: {ok} ok, {fail} fail, {info} info");
    eprintln!(
        "  nemesis: {} fault(s){}",
        collected.intervals.len(),
        collected
            .intervals
            .iter()
            .map(|i| format!(
                "\n    {:>6.1}–{:<6.1} s  {}{}",
                i.start_ns as f64 / 1e9,
                i.end_ns as f64 / 1e9,
                i.label,
                i.notes
                    .iter()
                    .map(|n| format!("\n                      {n}"))
                    .collect::<String>()
            ))
            .collect::<String>()
    );
    for exit in &collected.exits {
        eprintln!(
            "  node n{} exited on its own at {:.1} s: {}",
            exit.node,
            exit.time_ns as f64 / 1e9,
            exit.status
        );
    }
    if !collected.parked_reads.is_empty() {
        eprintln!(
            "  reads served on parked leases (since each node's last start): {}",
            collected
                .parked_reads
                .iter()
                .map(|(node, n)| match n {
                    Some(n) => format!("{node} {n}"),
                    None => format!("{node} ?"),
                })
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    for e in &collected.errors {
        eprintln!("  harness error: {e}");
    }
    eprintln!("  results: {}", dir.display());
    if let Some(signal) = interrupted {
        eprintln!("INTERRUPTED by {signal}: history not checked");
        return EXIT_INTERRUPTED;
    }
    let Some(verdict) = verdict else {
        return EXIT_HARNESS;
    };
    let describe = |v: &Verdict| {
        for r in &v.results {
            eprintln!(
                "  checker {}: {} ops checked in {} ms: {}",
                r.checker,
                v.ops_checked,
                v.check_ms,
                serde_json::to_string(&r.valid).unwrap_or_default()
            );
            for a in r.anomalies.iter().take(5) {
                eprintln!(
                    "    anomaly {} {:?} ops {:?}: {}",
                    a.kind, a.key, a.ops, a.message
                );
            }
            if r.anomalies.len() > 5 {
                eprintln!("    ... {} more in results.json", r.anomalies.len() - 5);
            }
        }
    };
    describe(verdict);
    if let Some(control) = control {
        eprintln!(
            "  negative control {}: {}",
            control.control, control.description
        );
        if let Some(m) = &control.mutated {
            describe(m);
        }
        if !control.fired {
            eprintln!(
                "FAIL: negative control did not fire ({} left the history valid)",
                control.control
            );
            return EXIT_INVALID;
        }
        if verdict.valid != Validity::True {
            eprintln!("FAIL: negative control fired, but the unmutated history is not valid");
            return EXIT_INVALID;
        }
        eprintln!(
            "OK: negative control {} fired (mutated history invalid; real history valid)",
            control.control
        );
        return EXIT_VALID;
    }
    let harness_trouble = !collected.final_read_ok || collected.recovery_ms.is_none();
    match verdict.valid {
        Validity::True => {
            if harness_trouble {
                eprintln!("VALID (note: recovery or the final read had trouble; see errors)");
            } else {
                eprintln!("VALID");
            }
            EXIT_VALID
        }
        Validity::False => {
            eprintln!("INVALID: anomalies found (see results.json)");
            EXIT_INVALID
        }
        Validity::Unknown => {
            eprintln!("UNKNOWN: the checker could not decide (search budget exhausted); treated as a failure");
            EXIT_INVALID
        }
    }
}
