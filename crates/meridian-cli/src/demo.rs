//! `meridian demo`: a local multi-region cluster, sample data, a mixed workload, a report.
//!
//! ```text
//!  start N child nodes (LocalCluster) ─► wait for every shard to have a leader
//!    ─► load --keys keys (batch_put, per-shard parallel) ─► --duration-secs of
//!       50% get / 40% put / 5% scan / 5% batch_get from --concurrency tasks
//!    ─► throughput and p50/p99 per operation
//!    ─► --bank-secs of transactions (see `demo_bank`) ─► cluster status ─► stop nodes, clean up
//! ```
//!
//! Shutdown is ordered on every path — success, error, Ctrl-C, SIGTERM: the demo's own work is
//! dropped first (aborting its tasks), then every node gets SIGTERM and a bounded wait before
//! SIGKILL, and only then is the data directory removed. A panic still reaches
//! `LocalCluster`'s `Drop`, which kills the nodes.
//!
//! # Not done yet
//! - Every node runs on this host, so "regions" are labels only: there is no WAN latency.

use crate::commands::gather_cluster_view;
use crate::local_cluster::{LocalCluster, LocalClusterConfig};
use anyhow::{anyhow, bail, Context};
use bytes::Bytes;
use futures::StreamExt;
use hdrhistogram::Histogram;
use meridian_client::{Client, ClientConfig, ShardMap};
use meridian_types::limits::MAX_VALUE_BYTES;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::signal::unix::{signal, SignalKind};

/// Most keys the demo loads.
pub const MAX_DEMO_KEYS: usize = 10_000_000;
/// Most concurrent workload tasks.
pub const MAX_DEMO_CONCURRENCY: usize = 4_096;
/// Longest workload.
pub const MAX_DEMO_DURATION_SECS: u64 = 24 * 3600;
/// Keys per batch_put while loading.
const LOAD_BATCH_KEYS: usize = 200;
/// Batches loading concurrently.
const LOAD_PARALLEL_BATCHES: usize = 8;
/// Rows per workload scan.
const SCAN_ROWS: u32 = 20;
/// Keys per workload batch_get.
const BATCH_GET_KEYS: usize = 10;
/// How long nodes get to stop after SIGTERM.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest latency recorded, in microseconds (longer ones saturate).
const MAX_LATENCY_US: u64 = 60_000_000;

/// Flags of `meridian demo`.
#[derive(Clone, Debug, clap::Args)]
pub struct DemoArgs {
    /// Nodes to start; regions us-east, eu-west, ap-south are assigned in turn.
    #[arg(long, default_value_t = 3)]
    pub nodes: usize,
    /// Node i listens on base+i (client API) and base+100+i (Raft).
    #[arg(long, default_value_t = 17_000)]
    pub base_port: u16,
    /// Keys loaded before the workload.
    #[arg(long, default_value_t = 10_000)]
    pub keys: usize,
    /// Length of the mixed workload.
    #[arg(long, default_value_t = 10)]
    pub duration_secs: u64,
    /// Concurrent workload tasks.
    #[arg(long, default_value_t = 32)]
    pub concurrency: usize,
    /// Directory for node data and logs (default: a fresh temporary directory). A directory you
    /// pass is never deleted.
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Keep the temporary data directory (and node logs) after the demo.
    #[arg(long)]
    pub keep_data: bool,
    /// Data shards the cluster is pre-split into.
    #[arg(long, default_value_t = 8)]
    pub shards: u32,
    /// Size of each value written, in bytes.
    #[arg(long, default_value_t = 100)]
    pub value_bytes: usize,
    /// How long to wait for every shard to elect a leader, in seconds.
    #[arg(long, default_value_t = 60)]
    pub ready_timeout_secs: u64,
    /// Seed of the workload's random choices.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Length of the bank phase after the mixed workload (transactions: transfers within a
    /// shard and between two shards, read-only sums across all shards, the total checked at
    /// the end); 0 skips it.
    #[arg(long, default_value_t = 5)]
    pub bank_secs: u64,
}

impl DemoArgs {
    fn validate(&self) -> anyhow::Result<()> {
        if self.keys == 0 || self.keys > MAX_DEMO_KEYS {
            bail!("--keys must be in 1..={MAX_DEMO_KEYS}");
        }
        if self.concurrency == 0 || self.concurrency > MAX_DEMO_CONCURRENCY {
            bail!("--concurrency must be in 1..={MAX_DEMO_CONCURRENCY}");
        }
        if self.duration_secs > MAX_DEMO_DURATION_SECS || self.bank_secs > MAX_DEMO_DURATION_SECS {
            bail!("--duration-secs and --bank-secs must be at most {MAX_DEMO_DURATION_SECS}");
        }
        if self.value_bytes > MAX_VALUE_BYTES {
            bail!("--value-bytes must be at most MAX_VALUE_BYTES ({MAX_VALUE_BYTES})");
        }
        Ok(())
    }
}

/// `count` keys spread round-robin over the map's data shards: key `i` is
/// `<start of shard i mod n>user<i, 8 digits>` (shards with an open start use no prefix, or a
/// 0x00 byte if plain names would fall outside them).
pub fn keys_across_shards(map: &ShardMap, count: usize) -> Vec<Bytes> {
    named_keys_across_shards(map, count, "user")
}

/// [`keys_across_shards`] with another stem than `user`.
pub fn named_keys_across_shards(map: &ShardMap, count: usize, stem: &str) -> Vec<Bytes> {
    let shards = map.shards();
    (0..count)
        .map(|i| {
            let name = format!("{stem}{i:08}");
            let Some(shard) = shards.get(i % shards.len().max(1)) else {
                return Bytes::from(name);
            };
            let candidates = [
                [shard.start.as_ref(), name.as_bytes()].concat(),
                [b"\x00".as_ref(), name.as_bytes()].concat(),
            ];
            let chosen = candidates
                .iter()
                .find(|k| shard.contains(k))
                .unwrap_or(&candidates[0]);
            Bytes::from(chosen.clone())
        })
        .collect()
}

/// Runs the demo; see the module docs.
pub async fn run(args: DemoArgs) -> anyhow::Result<()> {
    args.validate()?;
    let binary = std::env::current_exe().context("locating the meridian binary")?;
    let (data_dir, temp_dir) = match &args.data_dir {
        Some(dir) => (dir.clone(), None),
        None => {
            let temp = tempfile::Builder::new()
                .prefix("meridian-demo-")
                .tempdir()
                .context("creating a temporary data directory")?;
            (temp.path().to_path_buf(), Some(temp))
        }
    };
    println!(
        "Meridian demo: {} nodes, {} data shards, data in {}",
        args.nodes,
        args.shards,
        data_dir.display()
    );
    let config = LocalClusterConfig::new(binary, args.nodes, args.base_port, &data_dir)
        .common_args(["--initial-shards".to_string(), args.shards.to_string()]);
    let cluster = LocalCluster::start(config)?;
    for node_id in cluster.node_ids() {
        let spec = cluster.spec(node_id)?;
        println!(
            "  node {}  {:<9} client {}  raft {}  log {}",
            spec.node_id,
            format!("{}/{}", spec.region, spec.zone),
            spec.client_addr,
            spec.peer_addr,
            spec.log_path.display()
        );
    }

    let mut terminate =
        signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let outcome = tokio::select! {
        result = demo_body(&cluster, &args) => result,
        _ = tokio::signal::ctrl_c() => Err(anyhow!("interrupted (Ctrl-C)")),
        _ = terminate.recv() => Err(anyhow!("terminated (SIGTERM)")),
    };
    if let Err(error) = &outcome {
        eprintln!("demo failed: {error:#}");
    }

    println!(
        "\nStopping nodes (SIGTERM, SIGKILL after {} s)...",
        STOP_TIMEOUT.as_secs()
    );
    let killed = cluster.stop_all(STOP_TIMEOUT);
    if killed.is_empty() {
        println!("  all nodes stopped cleanly");
    } else {
        println!("  nodes {killed:?} did not stop in time and were killed");
    }
    drop(cluster);
    match temp_dir {
        Some(temp) if args.keep_data => println!("Data and logs kept in {}", temp.keep().display()),
        Some(temp) => {
            let path = temp.path().to_path_buf();
            temp.close()
                .with_context(|| format!("removing {}", path.display()))?;
            println!("Removed {}", path.display());
        }
        None => println!("Data and logs left in {}", data_dir.display()),
    }
    outcome
}

async fn demo_body(cluster: &LocalCluster, args: &DemoArgs) -> anyhow::Result<()> {
    println!("\nWaiting for every shard to elect a leader...");
    let started = Instant::now();
    cluster
        .wait_ready_with_progress(
            Duration::from_secs(args.ready_timeout_secs),
            |led, total| {
                println!(
                    "  {led}/{total} shards have a leader ({:.1} s)",
                    started.elapsed().as_secs_f64()
                )
            },
        )
        .await?;

    let client = Client::connect(ClientConfig::new(cluster.endpoints()))
        .await
        .context("connecting the demo client")?;
    let keys = Arc::new(keys_across_shards(&client.shard_map(), args.keys));

    load(&client, &keys, args).await?;
    let report = run_workload(&client, &keys, args).await;
    print!("{}", report.render());
    if args.bank_secs > 0 {
        crate::demo_bank::run(&client, args).await?;
    }

    println!("\nCluster status:");
    print!("{}", gather_cluster_view(&client).await?.render());
    if report.total_errors() > 0 {
        println!(
            "\n(note: {} operations failed; see above)",
            report.total_errors()
        );
    }
    Ok(())
}

async fn load(client: &Client, keys: &[Bytes], args: &DemoArgs) -> anyhow::Result<()> {
    println!(
        "\nLoading {} keys ({} B values)...",
        keys.len(),
        args.value_bytes
    );
    let started = Instant::now();
    let value = Bytes::from(vec![b'v'; args.value_bytes]);
    let mut done = 0usize;
    let mut next_report = keys.len() / 10;
    let mut batches = futures::stream::iter(keys.chunks(LOAD_BATCH_KEYS))
        .map(|chunk| {
            let entries: Vec<(Bytes, Bytes)> =
                chunk.iter().map(|k| (k.clone(), value.clone())).collect();
            async move { client.batch_put(entries).await.map(|_| chunk.len()) }
        })
        .buffer_unordered(LOAD_PARALLEL_BATCHES);
    while let Some(result) = batches.next().await {
        done += result.context("loading sample data")?;
        if done >= next_report {
            println!(
                "  {done}/{} keys ({:.0}%)",
                keys.len(),
                done as f64 * 100.0 / keys.len() as f64
            );
            next_report = done + keys.len() / 10;
        }
    }
    let secs = started.elapsed().as_secs_f64();
    println!(
        "  loaded {} keys in {secs:.2} s ({:.0} keys/s)",
        keys.len(),
        keys.len() as f64 / secs.max(1e-9)
    );
    Ok(())
}

/// A workload operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Op {
    Get,
    Put,
    Scan,
    BatchGet,
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::Get => "get",
            Op::Put => "put",
            Op::Scan => "scan",
            Op::BatchGet => "batch_get",
        }
    }

    /// 50% get, 40% put, 5% scan, 5% batch_get.
    fn pick(rng: &mut impl Rng) -> Op {
        match rng.gen_range(0..100) {
            0..50 => Op::Get,
            50..90 => Op::Put,
            90..95 => Op::Scan,
            _ => Op::BatchGet,
        }
    }
}

/// Latency histogram (µs) and error count of one operation (also used by `demo_bank`).
pub struct OpStats {
    pub latency_us: Histogram<u64>,
    pub errors: u64,
    pub first_error: Option<String>,
}

impl OpStats {
    pub(crate) fn new() -> OpStats {
        OpStats {
            latency_us: Histogram::new_with_bounds(1, MAX_LATENCY_US, 3)
                .expect("constant histogram bounds are valid"),
            errors: 0,
            first_error: None,
        }
    }

    pub(crate) fn merge(&mut self, other: OpStats) {
        // Same bounds on both sides, so addition cannot fail.
        let _ = self.latency_us.add(&other.latency_us);
        self.errors += other.errors;
        if self.first_error.is_none() {
            self.first_error = other.first_error;
        }
    }
}

/// The workload's results.
pub struct Report {
    pub elapsed: Duration,
    pub concurrency: usize,
    pub ops: BTreeMap<Op, OpStats>,
}

impl Report {
    fn total_errors(&self) -> u64 {
        self.ops.values().map(|s| s.errors).sum()
    }

    pub fn render(&self) -> String {
        let secs = self.elapsed.as_secs_f64().max(1e-9);
        let ms = |us: u64| format!("{:.3}", us as f64 / 1000.0);
        let mut table = crate::display::Table::new([
            "OP", "OK", "OPS/S", "P50 MS", "P99 MS", "MAX MS", "ERRORS",
        ]);
        let mut total_ok = 0;
        for (op, stats) in &self.ops {
            let h = &stats.latency_us;
            total_ok += h.len();
            table.row([
                op.name().to_string(),
                h.len().to_string(),
                format!("{:.0}", h.len() as f64 / secs),
                ms(h.value_at_quantile(0.50)),
                ms(h.value_at_quantile(0.99)),
                ms(h.max()),
                stats.errors.to_string(),
            ]);
        }
        table.row([
            "total".to_string(),
            total_ok.to_string(),
            format!("{:.0}", total_ok as f64 / secs),
            String::new(),
            String::new(),
            String::new(),
            self.total_errors().to_string(),
        ]);
        let mut out = format!(
            "\nWorkload: {} tasks for {:.1} s (50% get, 40% put, 5% scan of {SCAN_ROWS}, 5% batch_get of {BATCH_GET_KEYS})\n",
            self.concurrency,
            self.elapsed.as_secs_f64()
        );
        out.push_str(&table.render());
        for (op, stats) in &self.ops {
            if let Some(error) = &stats.first_error {
                out.push_str(&format!("  first {} error: {error}\n", op.name()));
            }
        }
        out
    }
}

async fn run_workload(client: &Client, keys: &Arc<Vec<Bytes>>, args: &DemoArgs) -> Report {
    println!(
        "\nRunning the mixed workload for {} s with {} tasks...",
        args.duration_secs, args.concurrency
    );
    let started = Instant::now();
    let stop_at = started + Duration::from_secs(args.duration_secs);
    let value_bytes = args.value_bytes;
    let mut tasks = tokio::task::JoinSet::new();
    for task in 0..args.concurrency {
        let client = client.clone();
        let keys = Arc::clone(keys);
        let seed = args.seed.wrapping_add(task as u64);
        tasks.spawn(async move { worker(client, keys, seed, stop_at, value_bytes).await });
    }
    let mut ops: BTreeMap<Op, OpStats> = BTreeMap::new();
    while let Some(joined) = tasks.join_next().await {
        // A worker cannot panic short of a bug; its stats are then simply missing.
        if let Ok(stats) = joined {
            for (op, s) in stats {
                ops.entry(op).or_insert_with(OpStats::new).merge(s);
            }
        }
    }
    Report {
        elapsed: started.elapsed(),
        concurrency: args.concurrency,
        ops,
    }
}

async fn worker(
    client: Client,
    keys: Arc<Vec<Bytes>>,
    seed: u64,
    stop_at: Instant,
    value_bytes: usize,
) -> BTreeMap<Op, OpStats> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut stats: BTreeMap<Op, OpStats> = BTreeMap::new();
    let mut sequence = 0u64;
    while Instant::now() < stop_at {
        let op = Op::pick(&mut rng);
        let key = keys[rng.gen_range(0..keys.len())].clone();
        let began = Instant::now();
        let result: Result<(), meridian_client::Error> = match op {
            Op::Get => client.get(key).await.map(|_| ()),
            Op::Put => {
                sequence += 1;
                let mut value = format!("w{seed}-{sequence}-").into_bytes();
                value.resize(value_bytes.max(value.len()), b'x');
                client.put(key, value).await.map(|_| ())
            }
            Op::Scan => client.scan(key, None, SCAN_ROWS, false).await.map(|_| ()),
            Op::BatchGet => {
                let batch: Vec<Bytes> = (0..BATCH_GET_KEYS)
                    .map(|_| keys[rng.gen_range(0..keys.len())].clone())
                    .collect();
                client.batch_get(batch).await.map(|_| ())
            }
        };
        let micros = u64::try_from(began.elapsed().as_micros()).unwrap_or(u64::MAX);
        let entry = stats.entry(op).or_insert_with(OpStats::new);
        match result {
            Ok(()) => entry.latency_us.saturating_record(micros.max(1)),
            Err(error) => {
                entry.errors += 1;
                if entry.first_error.is_none() {
                    entry.first_error = Some(error.to_string());
                }
            }
        }
    }
    stats
}

#[cfg(test)]
mod tests {
    use super::*;
    use meridian_client::ShardRoute;

    /// Demo keys land round-robin in every shard, including open-ended ones.
    #[test]
    fn keys_cover_every_shard() {
        let shard = |id, start: &'static [u8], end: &'static [u8]| ShardRoute {
            shard_id: id,
            start: Bytes::from_static(start),
            end: Bytes::from_static(end),
            replicas: vec![1],
            leader_id: None,
            generation: 1,
        };
        let map = ShardMap::new(
            "c",
            [
                shard(1, b"", b"\x40"),
                shard(2, b"\x40", b"\x80"),
                shard(3, b"\x80", b""),
            ],
            [],
        );
        let keys = keys_across_shards(&map, 9);
        for (i, key) in keys.iter().enumerate() {
            assert_eq!(
                map.shard_for_key(key).unwrap().shard_id,
                (i % 3) as u64 + 1,
                "{key:?}"
            );
        }
        assert_eq!(
            keys_across_shards(&ShardMap::default(), 2)[1],
            Bytes::from("user00000001")
        );
    }

    /// The operation mix is roughly 50/40/5/5.
    #[test]
    fn op_mix() {
        let mut rng = StdRng::seed_from_u64(1);
        let mut counts: BTreeMap<Op, u32> = BTreeMap::new();
        for _ in 0..10_000 {
            *counts.entry(Op::pick(&mut rng)).or_default() += 1;
        }
        assert!((4_700..5_300).contains(&counts[&Op::Get]));
        assert!((3_700..4_300).contains(&counts[&Op::Put]));
        assert!((350..650).contains(&counts[&Op::Scan]));
        assert!((350..650).contains(&counts[&Op::BatchGet]));
    }
}
