//! `meridian-ycsb bulk-load`: writes a YCSB table's records into a Meridian cluster in large
//! per-shard batches, for experiments that need a big data set in place (restart time against
//! data size, `bench/scripts/restart-data-size.sh`) rather than a measured `load`.
//!
//! - **Same records as `load`.** Keys are `CoreWorkload::key_name` of the key numbers
//!   `insertstart .. insertstart + insertcount` (hashed or ordered, zero padding, as `load`
//!   names them) and values are `build_values` encoded with the shared [`crate::record`]
//!   encoding, so `run` works on a bulk-loaded table exactly as on a loaded one.
//! - **Not a YCSB measurement.** It reports records per second and nothing per operation:
//!   one `batch_put` carries up to [`MAX_BATCH_KEYS`] records, which the client splits by
//!   shard, each shard's part one Raft entry. YCSB's `load` inserts one record per call.
//! - **Durability is the cluster's**: a batch is counted once `batch_put` returned, i.e. each
//!   shard's part was committed by a quorum. A failed batch stops the load with the key numbers
//!   it covered and how many records were written before it (the client has already retried
//!   what it may); `batch_put` is atomic per shard only, so part of that batch may be written.
//!   Running the same command again rewrites the same keys (new versions, same shape).
//! - Workers (`--concurrency`) take the next chunk of `--batch` key numbers from one counter,
//!   in any order; a chunk whose records pass `MAX_BATCH_BYTES` goes out as several
//!   `batch_put`s. Values come from a generator seeded per chunk, so the same seed writes the
//!   same values whatever the concurrency. Progress goes to stderr every `--status-interval`
//!   seconds.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use bytes::Bytes;
use meridian_client::limits::{MAX_BATCH_BYTES, MAX_BATCH_KEYS};
use meridian_client::Client;
use rand::rngs::StdRng;
use rand::SeedableRng;

use crate::cli::MAX_TIMEOUT_MS;
use crate::db::meridian::{connect, meridian_key};
use crate::db::DriverOptions;
use crate::properties::Properties;
use crate::record;
use crate::workload::CoreWorkload;

/// Most batches in flight at once.
pub const MAX_CONCURRENCY: usize = 256;

/// `bulk-load`'s arguments.
#[derive(Debug, Clone, clap::Args)]
pub struct BulkLoadArgs {
    /// Workload properties file (Java properties format); repeat to layer files.
    #[arg(short = 'P', value_name = "FILE")]
    pub workload_files: Vec<std::path::PathBuf>,
    /// Property override `key=value`, applied after all files; repeatable.
    #[arg(short = 'p', value_name = "KEY=VALUE")]
    pub overrides: Vec<String>,
    /// Meridian client endpoints, comma separated (`host:port`).
    #[arg(long, value_delimiter = ',', required = true)]
    pub endpoints: Vec<String>,
    /// Records per `batch_put` (1..=1000, the client's `MAX_BATCH_KEYS`); a batch is also cut
    /// before it would carry more than `MAX_BATCH_BYTES` (8 MiB) of keys and values.
    #[arg(long, default_value_t = MAX_BATCH_KEYS)]
    pub batch: usize,
    /// Batches in flight at once (1..=256).
    #[arg(long, default_value_t = 16)]
    pub concurrency: usize,
    /// Deadline of each `batch_put` in milliseconds, retries included.
    #[arg(long, default_value_t = 60_000)]
    pub timeout_ms: u64,
    /// Seconds between progress lines on stderr.
    #[arg(long, default_value_t = 10)]
    pub status_interval: u64,
    /// Seed of the record values (property `seed` if set, else 0): the same seed and range
    /// write the same values, whatever `--concurrency`.
    #[arg(long)]
    pub seed: Option<u64>,
}

/// What a finished bulk load wrote.
#[derive(Debug, Clone, PartialEq)]
pub struct BulkLoadSummary {
    pub records: u64,
    pub elapsed: Duration,
}

impl BulkLoadSummary {
    /// The one-line report `bulk-load` prints.
    pub fn render(&self) -> String {
        let secs = self.elapsed.as_secs_f64();
        let rate = if secs > 0.0 {
            self.records as f64 / secs
        } else {
            0.0
        };
        format!(
            "[BULK-LOAD], Records, {}\n[BULK-LOAD], RunTime(ms), {}\n[BULK-LOAD], Records/sec, {:.0}\n",
            self.records,
            self.elapsed.as_millis(),
            rate
        )
    }
}

/// Checks the numeric arguments; the error names the flag.
pub fn validate(args: &BulkLoadArgs) -> anyhow::Result<()> {
    if args.batch == 0 || args.batch > MAX_BATCH_KEYS {
        bail!("--batch must be between 1 and {MAX_BATCH_KEYS}");
    }
    if args.concurrency == 0 || args.concurrency > MAX_CONCURRENCY {
        bail!("--concurrency must be between 1 and {MAX_CONCURRENCY}");
    }
    if args.timeout_ms == 0 || args.timeout_ms > MAX_TIMEOUT_MS {
        bail!("--timeout-ms must be between 1 and {MAX_TIMEOUT_MS}");
    }
    Ok(())
}

/// The chunk of key numbers starting at `start`, at most `batch` long, inside `range`.
pub fn chunk(range: &std::ops::Range<u64>, start: u64, batch: usize) -> std::ops::Range<u64> {
    let begin = start.clamp(range.start, range.end);
    begin..begin.saturating_add(batch as u64).min(range.end)
}

/// Runs `bulk-load`: returns the summary (also printed to stdout).
pub async fn run(args: &BulkLoadArgs) -> anyhow::Result<BulkLoadSummary> {
    validate(args)?;
    let mut properties = Properties::new();
    for file in &args.workload_files {
        properties.merge_file(file)?;
    }
    for assignment in &args.overrides {
        properties.merge_override(assignment)?;
    }
    let seed = match args.seed {
        Some(seed) => seed,
        None => properties.parse_or("seed", 0u64, "non-negative integer")?,
    };
    let workload = Arc::new(CoreWorkload::new(&properties)?);
    let range = workload.insert_range();
    if range.is_empty() {
        bail!("nothing to load: set recordcount (or insertstart/insertcount)");
    }
    let options = DriverOptions {
        endpoints: args.endpoints.clone(),
        data_dir: None,
        timeout: Duration::from_millis(args.timeout_ms),
        sync_writes: false,
    };
    let client = connect(&options)
        .await
        .map_err(|e| anyhow::anyhow!("connecting to Meridian: {e}"))?;

    let next = Arc::new(AtomicU64::new(range.start));
    let written = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..args.concurrency {
        let (client, workload, next, written) = (
            client.clone(),
            workload.clone(),
            next.clone(),
            written.clone(),
        );
        let (range, batch) = (range.clone(), args.batch);
        workers.spawn(async move {
            load_chunks(&client, &workload, seed, &range, batch, &next, &written).await
        });
    }

    let total = range.end - range.start;
    let interval = Duration::from_secs(args.status_interval.max(1));
    let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
    let mut failure: Option<anyhow::Error> = None;
    loop {
        tokio::select! {
            joined = workers.join_next() => match joined {
                None => break,
                Some(Ok(Ok(()))) => {}
                Some(Ok(Err(error))) => {
                    failure.get_or_insert(error);
                    workers.abort_all();
                }
                Some(Err(join)) if join.is_cancelled() => {}
                Some(Err(join)) => {
                    failure.get_or_insert(anyhow::anyhow!("a loader task failed: {join}"));
                    workers.abort_all();
                }
            },
            _ = ticker.tick() => {
                let done = written.load(Ordering::Relaxed);
                let secs = started.elapsed().as_secs_f64();
                eprintln!(
                    "{:.0} sec: {done} of {total} records ({:.1}%), {:.0} records/sec",
                    secs,
                    100.0 * done as f64 / total as f64,
                    done as f64 / secs.max(1e-9)
                );
            }
        }
    }
    let records = written.load(Ordering::Relaxed);
    if let Some(error) = failure {
        return Err(error.context(format!(
            "bulk load stopped after {records} of {total} records were acknowledged"
        )));
    }
    let summary = BulkLoadSummary {
        records,
        elapsed: started.elapsed(),
    };
    print!("{}", summary.render());
    Ok(summary)
}

/// One worker: takes chunks from `next` until the range is used up. Each chunk's values come
/// from a generator seeded with `seed` and the chunk's first key number, so a key's value does
/// not depend on which worker wrote it.
async fn load_chunks(
    client: &Client,
    workload: &CoreWorkload,
    seed: u64,
    range: &std::ops::Range<u64>,
    batch: usize,
    next: &AtomicU64,
    written: &AtomicU64,
) -> anyhow::Result<()> {
    let table = workload.table().to_string();
    loop {
        let start = next.fetch_add(batch as u64, Ordering::Relaxed);
        let keys = chunk(range, start, batch);
        if keys.is_empty() {
            return Ok(());
        }
        let mut state = workload.thread_state(StdRng::seed_from_u64(seed ^ keys.start));
        let mut entries: Vec<(Bytes, Bytes)> = Vec::with_capacity((keys.end - keys.start) as usize);
        let mut bytes = 0usize;
        let mut first = keys.start;
        for number in keys.clone() {
            let key = meridian_key(&table, &workload.key_name(number));
            let value = Bytes::from(record::encode(&workload.build_values(&mut state))?);
            let size = key.len() + value.len();
            // A batch_put carries at most MAX_BATCH_BYTES of keys and values: send what is
            // gathered before this record would pass it.
            if !entries.is_empty() && bytes + size > MAX_BATCH_BYTES {
                put(client, std::mem::take(&mut entries), first..number, written).await?;
                bytes = 0;
                first = number;
            }
            bytes += size;
            entries.push((key, value));
        }
        put(client, entries, first..keys.end, written).await?;
    }
}

/// Writes `entries` (the records of key numbers `numbers`) and counts them once acknowledged.
async fn put(
    client: &Client,
    entries: Vec<(Bytes, Bytes)>,
    numbers: std::ops::Range<u64>,
    written: &AtomicU64,
) -> anyhow::Result<()> {
    let count = entries.len() as u64;
    client.batch_put(entries).await.with_context(|| {
        format!(
            "batch_put of key numbers {}..{} failed (part of it may be written)",
            numbers.start, numbers.end
        )
    })?;
    written.fetch_add(count, Ordering::Relaxed);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args() -> BulkLoadArgs {
        BulkLoadArgs {
            workload_files: Vec::new(),
            overrides: Vec::new(),
            endpoints: vec!["127.0.0.1:1".into()],
            batch: 10,
            concurrency: 2,
            timeout_ms: 1_000,
            status_interval: 1,
            seed: None,
        }
    }

    #[test]
    fn chunks_cover_the_range_once() {
        let range = 5..28;
        let mut seen = Vec::new();
        let mut start = range.start;
        loop {
            let keys = chunk(&range, start, 10);
            if keys.is_empty() {
                break;
            }
            seen.extend(keys);
            start += 10;
        }
        assert_eq!(seen, (5..28).collect::<Vec<_>>());
        // A counter that ran past the end (other workers) yields nothing.
        assert!(chunk(&range, 1_000, 10).is_empty());
        assert!(chunk(&range, u64::MAX - 3, 10).is_empty());
    }

    #[test]
    fn bad_numbers_are_refused_with_the_flag_named() {
        assert!(validate(&args()).is_ok());
        for (a, flag) in [
            (BulkLoadArgs { batch: 0, ..args() }, "--batch"),
            (
                BulkLoadArgs {
                    batch: MAX_BATCH_KEYS + 1,
                    ..args()
                },
                "--batch",
            ),
            (
                BulkLoadArgs {
                    concurrency: 0,
                    ..args()
                },
                "--concurrency",
            ),
            (
                BulkLoadArgs {
                    concurrency: MAX_CONCURRENCY + 1,
                    ..args()
                },
                "--concurrency",
            ),
            (
                BulkLoadArgs {
                    timeout_ms: 0,
                    ..args()
                },
                "--timeout-ms",
            ),
        ] {
            let error = validate(&a).unwrap_err().to_string();
            assert!(error.contains(flag), "{error}");
        }
    }

    #[test]
    fn the_summary_reports_records_and_rate() {
        let text = BulkLoadSummary {
            records: 2_000,
            elapsed: Duration::from_millis(500),
        }
        .render();
        assert!(text.contains("[BULK-LOAD], Records, 2000"), "{text}");
        assert!(text.contains("[BULK-LOAD], Records/sec, 4000"), "{text}");
    }
}
