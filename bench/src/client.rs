//! The client: runs the load or transaction phase over N client threads, throttled and
//! measured, and produces the [`Report`] (YCSB's `Client` and `ClientThread`).
//!
//! ```text
//!   CoreWorkload (shared counters)          Measurements (per-thread recorders)
//!        │                                          ▲
//!   thread 0..N: ThreadState ─► MeasuredDb ─► DbThread (driver)
//!        │ throttle: sleep until start + ops_done × tick
//!   status task: every --status-interval, a status line (run) or the progress bar (load)
//! ```
//!
//! - Operation counts: the run phase does `operationcount` operations, the load phase
//!   `insertcount` (or `recordcount`) inserts, split over the threads as YCSB does (`total /
//!   threads`, the first `total % threads` threads one more). `operationcount=0` runs until
//!   `maxexecutiontime` and is refused without it.
//! - Throttling (`--target`): each thread gets `target / threads` ops/s; after its k-th
//!   operation it sleeps until `thread_start + k × tick` and that deadline becomes the intended
//!   start of the next operation, so latency from the intended start exposes coordinated
//!   omission. Threads whose rate is at most 1000 ops/s first sleep a random fraction of a tick
//!   to spread their starts. The last 2 ms of each wait are an OS thread sleep, because tokio's
//!   timer alone would wake up to 1 ms late and inflate intended-start latencies.
//! - Timing: the clock starts after every thread has its driver state (connections open) and
//!   stops after every thread finished and cleaned up. YCSB starts it before the threads
//!   initialise their drivers; excluding connection setup is deliberate.
//! - Threads are tokio tasks on the runtime the caller provides.

use std::collections::BTreeMap;
use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context};
use indicatif::{ProgressBar, ProgressStyle};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::db::Db;
use crate::measurements::{decimal_2, MeasurementInterval, Measurements};
use crate::properties::Properties;
use crate::report::Report;
use crate::workload::{CoreWorkload, ThreadState};
use crate::wrapper::MeasuredDb;

/// Most client threads accepted.
pub const MAX_THREADS: usize = 4096;
/// How much earlier than the deadline the coarse (millisecond) tokio timer is asked to wake.
pub const TIMER_SLACK: Duration = Duration::from_millis(2);
/// How often the load progress bar is refreshed.
pub const PROGRESS_REFRESH_MS: u64 = 200;
/// Percentiles reported when `hdrhistogram.percentiles` is not set. YCSB's default is `95,99`;
/// the median is added because the comparison tables quote it.
pub const DEFAULT_PERCENTILES: &str = "50,95,99";

/// Which phase to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    Load,
    Run,
}

/// Everything the client needs besides the driver.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    pub phase: Phase,
    pub properties: Properties,
    pub threads: usize,
    pub target_ops_per_sec: Option<f64>,
    pub status_interval: Duration,
}

/// The result of a phase.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub report: Report,
    /// The base seed of the per-thread RNGs (set it with `-p seed=N` to repeat a run).
    pub seed: u64,
}

struct Shared {
    workload: CoreWorkload,
    phase: Phase,
    ops_done: AtomicU64,
    stop: AtomicBool,
}

/// Runs one phase against an opened driver.
pub async fn run_phase(config: &ClientConfig, db: Arc<dyn Db>) -> anyhow::Result<Outcome> {
    let properties = &config.properties;
    if config.threads == 0 || config.threads > MAX_THREADS {
        bail!("--threads must be between 1 and {MAX_THREADS}");
    }
    let workload = CoreWorkload::new(properties).context("workload properties")?;
    let total_ops: u64 = match config.phase {
        Phase::Run => {
            workload.validate_for_run()?;
            properties.parse_or("operationcount", 0, "non-negative integer")?
        }
        Phase::Load => match properties.get("insertcount") {
            Some(_) => properties.parse_or("insertcount", 0, "non-negative integer")?,
            None => properties.parse_or("recordcount", 0, "non-negative integer")?,
        },
    };
    let max_execution_time_secs: u64 =
        properties.parse_or("maxexecutiontime", 0, "non-negative integer")?;
    if total_ops == 0 && max_execution_time_secs == 0 {
        bail!(
            "operation count 0 means 'run until maxexecutiontime'; set maxexecutiontime or a count"
        );
    }
    let interval = match properties.get("measurement.interval") {
        Some(text) => MeasurementInterval::parse(text)
            .with_context(|| format!("measurement.interval={text} (op, intended, both)"))?,
        None if config.target_ops_per_sec.is_some() => MeasurementInterval::Both,
        None => MeasurementInterval::Op,
    };
    let percentiles =
        parse_percentiles(properties.get_or("hdrhistogram.percentiles", DEFAULT_PERCENTILES))?;
    let seed: u64 = match properties.get("seed") {
        Some(_) => properties.parse_or("seed", 0, "unsigned integer")?,
        None => rand::thread_rng().gen(),
    };
    let tick = match config.target_ops_per_sec {
        None => None,
        Some(target) if target.is_finite() && target > 0.0 => {
            let per_thread = target / config.threads as f64;
            Some(Duration::from_secs_f64(1.0 / per_thread))
        }
        Some(target) => bail!("--target {target} must be a positive number of ops/s"),
    };

    let measurements = Arc::new(Measurements::new(interval, percentiles));
    let shared = Arc::new(Shared {
        workload,
        phase: config.phase,
        ops_done: AtomicU64::new(0),
        stop: AtomicBool::new(false),
    });

    // Driver state for every thread first, so connection setup is not timed.
    let mut prepared = Vec::with_capacity(config.threads);
    for thread_id in 0..config.threads {
        let thread_db = db
            .new_thread()
            .await
            .with_context(|| format!("opening the driver for client thread {thread_id}"))?;
        let rng = StdRng::seed_from_u64(thread_seed(seed, thread_id));
        let state = shared.workload.thread_state(rng);
        let thread_ops = total_ops / config.threads as u64
            + u64::from((thread_id as u64) < total_ops % config.threads as u64);
        prepared.push((
            MeasuredDb::new(thread_db, measurements.recorder()),
            state,
            thread_ops,
        ));
    }

    eprintln!(
        "meridian-ycsb: {} phase, {} threads, {} operations{}",
        match config.phase {
            Phase::Load => "load",
            Phase::Run => "transaction",
        },
        config.threads,
        total_ops,
        config
            .target_ops_per_sec
            .map(|target| format!(", target {target} ops/s"))
            .unwrap_or_default()
    );
    let start = Instant::now();
    let mut handles = Vec::with_capacity(config.threads);
    for (db_thread, state, thread_ops) in prepared {
        let shared = Arc::clone(&shared);
        handles.push(tokio::spawn(client_thread(
            shared, db_thread, state, thread_ops, tick,
        )));
    }

    let finished = Arc::new(AtomicBool::new(false));
    let status = tokio::spawn(status_task(
        Arc::clone(&shared),
        Arc::clone(&measurements),
        Arc::clone(&finished),
        start,
        total_ops,
        config.status_interval,
    ));
    let deadline =
        (max_execution_time_secs > 0).then(|| start + Duration::from_secs(max_execution_time_secs));
    let stopper = deadline.map(|deadline| {
        let shared = Arc::clone(&shared);
        tokio::spawn(async move {
            tokio::time::sleep_until(deadline.into()).await;
            shared.stop.store(true, Ordering::Relaxed);
        })
    });

    let mut first_error = None;
    for handle in handles {
        match handle.await {
            Ok(Ok(())) => {}
            Ok(Err(error)) => {
                shared.stop.store(true, Ordering::Relaxed);
                first_error.get_or_insert(error);
            }
            Err(join_error) => {
                shared.stop.store(true, Ordering::Relaxed);
                first_error.get_or_insert(anyhow::anyhow!("client thread panicked: {join_error}"));
            }
        }
    }
    let runtime = start.elapsed();
    finished.store(true, Ordering::Relaxed);
    if let Some(stopper) = stopper {
        stopper.abort();
    }
    status.await.context("status task")?;
    db.close().await.context("closing the driver")?;
    if let Some(error) = first_error {
        return Err(error);
    }

    let runtime_ms = u64::try_from(runtime.as_millis()).unwrap_or(u64::MAX);
    let ops = shared.ops_done.load(Ordering::Relaxed);
    let throughput = if runtime_ms == 0 {
        f64::INFINITY
    } else {
        1000.0 * ops as f64 / runtime_ms as f64
    };
    Ok(Outcome {
        report: Report {
            runtime_ms,
            throughput_ops_per_sec: throughput,
            operations: measurements.report(),
        },
        seed,
    })
}

fn thread_seed(seed: u64, thread_id: usize) -> u64 {
    seed.wrapping_add((thread_id as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15))
}

fn parse_percentiles(text: &str) -> anyhow::Result<Vec<f64>> {
    text.split(',')
        .map(|item| {
            let value: f64 = item
                .trim()
                .parse()
                .with_context(|| format!("hdrhistogram.percentiles: {item:?} is not a number"))?;
            if !(0.0..=100.0).contains(&value) {
                bail!("hdrhistogram.percentiles: {value} is outside 0..100");
            }
            Ok(value)
        })
        .collect()
}

async fn client_thread(
    shared: Arc<Shared>,
    mut db: MeasuredDb,
    mut state: ThreadState,
    thread_ops: u64,
    tick: Option<Duration>,
) -> anyhow::Result<()> {
    if let Some(tick) = tick {
        if tick >= Duration::from_millis(1) {
            let delay = tick.mul_f64(rand::thread_rng().gen_range(0.0..1.0));
            tokio::time::sleep(delay).await;
        }
    }
    let thread_start = Instant::now();
    let mut done: u64 = 0;
    while (thread_ops == 0 || done < thread_ops) && !shared.stop.load(Ordering::Relaxed) {
        match shared.phase {
            Phase::Run => shared.workload.do_transaction(&mut db, &mut state).await?,
            Phase::Load => {
                if !shared.workload.do_insert(&mut db, &mut state).await {
                    break;
                }
            }
        }
        done += 1;
        shared.ops_done.fetch_add(1, Ordering::Relaxed);
        if let Some(tick) = tick {
            let deadline = thread_start + tick.mul_f64(done as f64);
            sleep_until_precise(deadline).await;
            db.set_intended_start(Some(deadline));
        }
    }
    db.set_intended_start(None);
    if let Err(error) = db.cleanup().await {
        eprintln!("client thread cleanup failed: {error}");
    }
    Ok(())
}

/// Sleeps until `deadline` with sub-millisecond precision.
///
/// Tokio's timer rounds deadlines up to whole milliseconds, which would make every throttled
/// operation start up to 1 ms late and show up as intended-start latency that the database did
/// not cause. So the coarse part of the wait is a tokio sleep that ends [`TIMER_SLACK`] early and
/// the rest an OS thread sleep on the blocking pool (tens of microseconds of precision, like the
/// `parkNanos` YCSB uses), which costs one blocking-pool hop per throttled operation.
async fn sleep_until_precise(deadline: Instant) {
    let now = Instant::now();
    if deadline <= now {
        return;
    }
    if deadline - now > TIMER_SLACK {
        tokio::time::sleep_until((deadline - TIMER_SLACK).into()).await;
    }
    let remaining = deadline.saturating_duration_since(Instant::now());
    if remaining.is_zero() {
        return;
    }
    if tokio::task::spawn_blocking(move || std::thread::sleep(remaining))
        .await
        .is_err()
    {
        // The blocking pool is shutting down; a coarse sleep is still correct, only later.
        tokio::time::sleep_until(deadline.into()).await;
    }
}

async fn status_task(
    shared: Arc<Shared>,
    measurements: Arc<Measurements>,
    finished: Arc<AtomicBool>,
    start: Instant,
    total_ops: u64,
    status_interval: Duration,
) {
    let bar = match shared.phase {
        Phase::Load => {
            let bar = ProgressBar::new(total_ops);
            bar.set_style(
                ProgressStyle::with_template(
                    "{elapsed_precise} [{bar:40}] {pos}/{len} inserts ({per_sec}, eta {eta})",
                )
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
            );
            (!bar.is_hidden()).then_some(bar)
        }
        Phase::Run => None,
    };
    let status_interval = status_interval.max(Duration::from_millis(100));
    let poll = Duration::from_millis(PROGRESS_REFRESH_MS);
    let mut last_status = start;
    let mut last_ops = 0;
    loop {
        tokio::time::sleep(poll).await;
        let done = finished.load(Ordering::Relaxed);
        let ops = shared.ops_done.load(Ordering::Relaxed);
        if let Some(bar) = &bar {
            bar.set_position(ops);
        }
        let now = Instant::now();
        if bar.is_none() && (done || now.duration_since(last_status) >= status_interval) {
            let line = status_line(
                start,
                last_status,
                now,
                ops,
                last_ops,
                total_ops,
                &measurements,
            );
            let mut stderr = std::io::stderr().lock();
            let _ = writeln!(stderr, "{line}");
            last_status = now;
            last_ops = ops;
        }
        if done {
            break;
        }
    }
    if let Some(bar) = bar {
        bar.finish();
    }
}

/// One YCSB status line:
/// `<date> <elapsed> sec: <ops> operations; <ops/s> current ops/sec; [est completion in ..] [READ: ...]`.
fn status_line(
    start: Instant,
    interval_start: Instant,
    now: Instant,
    ops: u64,
    interval_start_ops: u64,
    total_ops: u64,
    measurements: &Measurements,
) -> String {
    let elapsed = now.duration_since(start);
    let interval = now.duration_since(interval_start).as_secs_f64().max(1e-9);
    let current = (ops - interval_start_ops) as f64 / interval;
    let mut line = format!(
        "{} {} sec: {} operations; ",
        utc_timestamp(),
        elapsed.as_secs(),
        ops
    );
    if ops != 0 {
        line.push_str(&format!("{} current ops/sec; ", decimal_2(current)));
    }
    let remaining_ops = total_ops.saturating_sub(ops);
    if remaining_ops != 0 && ops != 0 {
        let overall = ops as f64 / elapsed.as_secs_f64().max(1e-9);
        let remaining_secs = (remaining_ops as f64 / overall).ceil() as u64;
        line.push_str(&format!(
            "est completion in {}",
            remaining_text(remaining_secs)
        ));
    }
    line.push_str(&measurements.interval_summary());
    line
}

/// YCSB's `RemainingFormatter`: days and hours, minutes under a day, seconds only under a minute.
fn remaining_text(seconds: u64) -> String {
    let mut out = String::new();
    let days = seconds / 86_400;
    let hours = seconds % 86_400 / 3_600;
    let minutes = seconds % 3_600 / 60;
    let plural =
        |count: u64, unit: &str| format!("{count} {unit}{} ", if count == 1 { "" } else { "s" });
    if days > 0 {
        out.push_str(&plural(days, "day"));
    }
    if hours > 0 {
        out.push_str(&plural(hours, "hour"));
    }
    if days < 1 && minutes > 0 {
        out.push_str(&plural(minutes, "minute"));
    }
    if out.is_empty() {
        out.push_str(&plural(seconds, "second"));
    }
    out
}

/// `yyyy-MM-dd HH:mm:ss:SSS` in UTC (YCSB prints local time; UTC avoids a time-zone database).
fn utc_timestamp() -> String {
    let since_epoch = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let secs = since_epoch.as_secs();
    let (year, month, day) = civil_from_days((secs / 86_400) as i64);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02}:{:03}",
        secs % 86_400 / 3_600,
        secs % 3_600 / 60,
        secs % 60,
        since_epoch.subsec_millis()
    )
}

/// Days since 1970-01-01 to (year, month, day), Howard Hinnant's civil-from-days algorithm.
pub fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z.rem_euclid(146_097);
    let year_of_era =
        (day_of_era - day_of_era / 1_460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_index = (5 * day_of_year + 2) / 153;
    let day = (day_of_year - (153 * month_index + 2) / 5 + 1) as u32;
    let month = if month_index < 10 {
        month_index + 3
    } else {
        month_index - 9
    } as u32;
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// Properties as a sorted map (for the JSON report).
pub fn properties_map(properties: &Properties) -> BTreeMap<String, String> {
    properties
        .iter()
        .map(|(key, value)| (key.to_string(), value.to_string()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Remaining-time text follows YCSB's granularity rules.
    #[test]
    fn remaining_text_granularity() {
        assert_eq!(remaining_text(1), "1 second ");
        assert_eq!(remaining_text(42), "42 seconds ");
        assert_eq!(remaining_text(61), "1 minute ");
        assert_eq!(remaining_text(3_720), "1 hour 2 minutes ");
        assert_eq!(remaining_text(90_000), "1 day 1 hour ");
    }

    /// Civil date conversion on known days.
    #[test]
    fn civil_dates() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(19_723), (2024, 1, 1));
        assert_eq!(civil_from_days(19_782), (2024, 2, 29));
    }

    /// Percentile lists parse and are range-checked.
    #[test]
    fn percentile_lists() {
        assert_eq!(
            parse_percentiles("50, 95,99.9").unwrap(),
            vec![50.0, 95.0, 99.9]
        );
        assert!(parse_percentiles("101").is_err());
        assert!(parse_percentiles("x").is_err());
    }
}
