//! `meridian-ycsb geo`: what a geo-distributed cluster costs each region, and the LINE test.
//!
//! # Why
//! Meridian exists to serve every region at local speed while replicas span regions, with no
//! timestamp oracle to cross an ocean for. The seed study (LINE's comparison of YugabyteDB and
//! TiDB) chose YugabyteDB because TiDB's oracle lives in one region: every transaction
//! elsewhere paid a WAN round trip, and when the oracle's leader moved, latency rose. This run
//! reproduces that comparison side by side on one machine.
//!
//! # What it runs
//! Three regions with one node each, or up to three (`--nodes-per-region`; `topology`), WAN
//! delays from `meridian-wan`'s links (us-east↔eu-west 80 ms, eu-west↔ap-south 130 ms,
//! us-east↔ap-south 200 ms round trips, times `--scale`), two data shards homed per region,
//! one client group per region. With `--survive zone` (three nodes per region) the data
//! shards keep their votes in their home regions, so writes commit there without a WAN round
//! trip. In order:
//!
//! 1. **HLC, metadata leader in us-east**: writes and linearizable reads of the region's own
//!    keys, follower reads (bounded staleness) of the next region's keys from the local
//!    replica.
//! 2. **Oracle, same placement**: one-shard and two-shard transactions on the region's keys,
//!    with every attempt's read timestamp fetched from the metadata shard's leader (the
//!    client's test-only oracle mode); then the same transactions with Meridian's own
//!    timestamps (HLC), right before the move they are compared with.
//! 3. **Metadata leader moved to ap-south** (the farthest region): transactions, HLC then
//!    oracle (the oracle moves with the leader, as TiDB's PD does).
//! 4. **ap-south's node SIGKILLed** while it leads the metadata shard: transactions from
//!    us-east and eu-west (ap-south has no node left), HLC.
//!
//! Around every phase the metadata shard's last log index and term are read on every node: a
//! transaction-path entry there would show up as an append. A new term shows an election
//! during the phase, whose leader appends one blank entry; that one is not counted against
//! transactions, and the report names the phase.
//!
//! # Verdicts (`report::checks`)
//! - Home-region write p50 ≤ the round trip to the nearest other region + 5 ms; local read and
//!   follower read p50 ≤ 2 ms.
//! - **LINE**: in 3 and 4, HLC transaction p50 within ±10% and p99 within ±20% of 2's HLC run.
//! - Transactions append nothing to the metadata shard's log.
//! - **Harness**: in 2 and 3, the oracle must cost every client outside its region at least
//!   half the round trip to it (p50 against HLC's; `report::HARNESS_RTT_FRACTION`). If it does not, the WAN or the oracle mode
//!   is broken, and the run exits non-zero; the other verdicts are reported, not enforced
//!   (timings on a 2-core machine are noisy).
//!
//! Output: `results.md`, `results.json` and `chart.svg` in `--out` (default
//! `bench/results/<UTC date>/geo/`); progress on stderr.
//!
//! # Not done yet
//! - The metadata shard keeps one replica per region whatever `--nodes-per-region` says, and
//!   phase 4 kills only the first ap-south node (with three per region, ap-south's clients
//!   still have two, but are not measured).
//! - The oracle mode fetches one timestamp per attempt; a TSO design also fetches a commit
//!   timestamp for writes, so the oracle rows understate its cost by one more round trip.
//! - Transaction records live on the transaction's first written shard (its region's here),
//!   not in separate txn-home shards.
//! - The client processes share the machine's two cores with the nodes and the WAN links.

pub mod args;
pub mod phases;
pub mod report;
pub mod topology;

use crate::compare::context::{find_repo_root, utc_now};
use crate::compare::stores::locate_meridian;
use anyhow::{bail, Context};
use args::GeoArgs;
use meridian_client::Client;
use nix::sys::signal::Signal;
use phases::Op;
use report::{GeoReport, PhaseResult, Scenario, Source};
use std::collections::BTreeMap;
use std::time::Duration;
use topology::{node_of, region_of, GeoCluster, REGIONS, RTT_MS};

/// Single-key operations, measured once.
const LOCAL_OPS: [Op; 3] = [Op::Write, Op::Read, Op::FollowerRead];
/// Operations of the LINE phases.
const TXN_OPS: [Op; 2] = [Op::Txn1pc, Op::Txn2Shard];

fn progress(message: &str) {
    eprintln!("[geo] {message}");
}

struct Run<'a> {
    geo: &'a GeoCluster,
    args: &'a GeoArgs,
    seed: u64,
    phases: Vec<PhaseResult>,
}

impl Run<'_> {
    async fn measure(
        &mut self,
        source: Source,
        scenario: Scenario,
        ops: &[Op],
        regions: &[&str],
    ) -> anyhow::Result<()> {
        let leader = self.geo.meta_leader().await?;
        let leader_region = match leader {
            0 => "none",
            id => region_of(id),
        }
        .to_string();
        self.geo.wait_meta_settled(Duration::from_secs(30)).await?;
        let clients: &BTreeMap<String, Client> = match source {
            Source::Hlc => &self.geo.clients,
            Source::Oracle => &self.geo.oracle_clients,
        };
        for op in ops {
            let before = self.geo.meta_log().await?;
            let seed = self.seed.wrapping_add(self.phases.len() as u64);
            let stats = phases::run(
                clients,
                regions,
                *op,
                self.args.ops,
                self.args.concurrency,
                seed,
            )
            .await;
            let after = self.geo.meta_log().await?;
            let grew = |field: fn(&(u64, u64)) -> u64| {
                after
                    .iter()
                    .filter_map(|(node, now)| {
                        before
                            .get(node)
                            .map(|b| field(now).saturating_sub(field(b)))
                    })
                    .max()
                    .unwrap_or(0)
            };
            let meta_appends = grew(|(index, _)| *index);
            let meta_new_terms = grew(|(_, term)| *term);
            let line: Vec<String> = stats
                .iter()
                .map(|s| {
                    format!(
                        "{} p50 {:.1} p99 {:.1} ms{}",
                        s.region,
                        s.p50_ms,
                        s.p99_ms,
                        if s.errors > 0 {
                            format!(" ({} errors)", s.errors)
                        } else {
                            String::new()
                        }
                    )
                })
                .collect();
            progress(&format!(
                "{} / {}: {}",
                scenario.label(source),
                op.name(),
                line.join(", ")
            ));
            self.phases.push(PhaseResult {
                source,
                scenario,
                meta_leader_region: leader_region.clone(),
                op: *op,
                regions: stats,
                meta_appends,
                meta_new_terms,
            });
        }
        Ok(())
    }
}

/// Runs the geo benchmark and writes its report.
pub async fn run(args: GeoArgs) -> anyhow::Result<()> {
    args.validate()?;
    let binary = locate_meridian(args.meridian_bin.as_deref())?;
    let started = utc_now();
    let out_dir = match &args.out {
        Some(dir) => dir.clone(),
        None => find_repo_root()
            .context("cannot find the repository (bench/Cargo.toml above here); pass --out DIR")?
            .join("bench/results")
            .join(&started.date)
            .join("geo"),
    };
    std::fs::create_dir_all(&out_dir).with_context(|| format!("creating {}", out_dir.display()))?;
    let (data_dir, temp) = match &args.data_dir {
        Some(dir) => (dir.clone(), None),
        None => {
            let temp = tempfile::Builder::new()
                .prefix("meridian-geo-")
                .tempdir()
                .context("creating a temporary data directory")?;
            (temp.path().to_path_buf(), Some(temp))
        }
    };
    let seed = args.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
    });
    let ready = Duration::from_secs(args.ready_timeout_secs);

    progress(&format!(
        "starting {} nodes ({} survival) and the WAN (scale {}), data in {}",
        3 * args.nodes_per_region,
        args.survive,
        args.scale,
        data_dir.display()
    ));
    let geo = GeoCluster::start(&binary, &data_dir, &args, ready).await?;
    progress("waiting for every shard to be led from its home region");
    geo.wait_leaders_home(ready).await?;
    geo.move_meta_leader(node_of("us-east")).await?;

    let mut run = Run {
        geo: &geo,
        args: &args,
        seed,
        phases: Vec::new(),
    };
    run.measure(Source::Hlc, Scenario::Base, &LOCAL_OPS, &REGIONS)
        .await?;
    // The oracle first, so HLC's transactions run right before the move they are compared
    // with (adjacent phases: the machine's noise drifts over minutes).
    run.measure(Source::Oracle, Scenario::Base, &TXN_OPS, &REGIONS)
        .await?;
    run.measure(Source::Hlc, Scenario::Base, &TXN_OPS, &REGIONS)
        .await?;

    progress("moving the metadata shard's leader to ap-south");
    geo.move_meta_leader(node_of("ap-south")).await?;
    run.measure(Source::Hlc, Scenario::MetaMoved, &TXN_OPS, &REGIONS)
        .await?;
    run.measure(Source::Oracle, Scenario::MetaMoved, &TXN_OPS, &REGIONS)
        .await?;

    progress("SIGKILL ap-south's node, the metadata shard's leader");
    let victim = node_of("ap-south");
    // SIGKILL reaps the process before returning.
    geo.cluster.kill(victim, Signal::SIGKILL)?;
    let leader = geo.wait_meta_leader_not(victim, ready).await?;
    progress(&format!("the metadata shard is led by node {leader} now"));
    run.measure(
        Source::Hlc,
        Scenario::MetaKilled,
        &TXN_OPS,
        &["us-east", "eu-west"],
    )
    .await?;
    let phases = run.phases;

    geo.cluster.stop_all(Duration::from_secs(10));
    let checks = report::checks(&phases, args.scale);
    let report = GeoReport {
        started_at_utc: started.date_time,
        finished_at_utc: utc_now().date_time,
        scale: args.scale,
        nodes_per_region: args.nodes_per_region,
        survival: args.survive.clone(),
        rtt_ms: RTT_MS
            .iter()
            .map(|(a, b, ms)| (a.to_string(), b.to_string(), ms * args.scale))
            .collect(),
        ops_per_region_per_phase: args.ops,
        concurrency_per_region: args.concurrency,
        seed,
        phases,
        checks,
    };
    let markdown = report::markdown(&report);
    std::fs::write(out_dir.join("results.md"), &markdown)?;
    std::fs::write(
        out_dir.join("results.json"),
        serde_json::to_string_pretty(&report)?,
    )?;
    std::fs::write(out_dir.join("chart.svg"), report::chart(&report))?;
    println!("{markdown}");
    progress(&format!("results in {}", out_dir.display()));
    if let (Some(temp), true) = (temp, args.keep_data) {
        progress(&format!("data and logs kept in {}", temp.keep().display()));
    }
    let broken: Vec<&str> = report
        .checks
        .iter()
        .filter(|c| c.harness && !c.pass)
        .map(|c| c.name.as_str())
        .collect();
    if !broken.is_empty() {
        bail!("the harness is broken (an oracle that costs no round trip): {broken:?}");
    }
    Ok(())
}
