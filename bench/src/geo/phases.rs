//! One measured phase: every region's client group runs one kind of operation at once.
//!
//! Each region runs `--ops` operations with `--concurrency` workers (a shared counter hands
//! out operation numbers), after a short unmeasured warm-up (connections, a new leader's first
//! writes). Latency is the wall time of one client call, retries included; an operation that
//! fails is counted, not timed.

use super::topology::{key, region_of, KEYS_PER_SHARD, REGIONS};
use meridian_client::{Client, Error, ReadConsistency, TxnOptions};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Bound of a follower read's staleness (the cluster closes timestamps 3 s behind).
pub const MAX_STALENESS: Duration = Duration::from_secs(10);
/// Unmeasured operations per worker before a phase.
const WARMUP_PER_WORKER: usize = 2;

/// What a phase runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Op {
    /// A put of a key homed in the client's region.
    Write,
    /// A linearizable get of a key homed in the client's region.
    Read,
    /// A bounded-staleness get of a key homed in the next region, from the nearest replica.
    FollowerRead,
    /// A transaction reading and writing one key homed in the client's region (one shard).
    Txn1pc,
    /// A transaction reading and writing two keys on the region's two shards.
    Txn2Shard,
}

impl Op {
    pub fn name(self) -> &'static str {
        match self {
            Op::Write => "write",
            Op::Read => "read",
            Op::FollowerRead => "follower-read",
            Op::Txn1pc => "txn-1pc",
            Op::Txn2Shard => "txn-2shard",
        }
    }
}

/// One operation's measurement.
#[derive(Clone, Copy, Debug)]
struct Sample {
    ms: f64,
    /// Follower reads: how far behind the client's clock the read was served.
    staleness_ms: Option<f64>,
    /// Follower reads: served by the client's own region's node.
    local: Option<bool>,
}

/// A region's figures for one phase.
#[derive(Clone, Debug, Default, Serialize)]
pub struct RegionStats {
    pub region: String,
    pub count: usize,
    pub errors: usize,
    pub first_error: Option<String>,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub mean_ms: f64,
    pub max_ms: f64,
    pub staleness_p50_ms: Option<f64>,
    pub staleness_p99_ms: Option<f64>,
    /// Follower reads served by the region's own node, in percent.
    pub local_pct: Option<f64>,
}

/// The `p`-quantile (0 < p ≤ 1) of sorted values, nearest rank.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (p * sorted.len() as f64).ceil().max(1.0) as usize;
    sorted[rank.min(sorted.len()) - 1]
}

fn stats(
    region: &str,
    samples: &[Sample],
    errors: usize,
    first_error: Option<String>,
) -> RegionStats {
    let mut ms: Vec<f64> = samples.iter().map(|s| s.ms).collect();
    ms.sort_by(f64::total_cmp);
    let mut stale: Vec<f64> = samples.iter().filter_map(|s| s.staleness_ms).collect();
    stale.sort_by(f64::total_cmp);
    let locals: Vec<bool> = samples.iter().filter_map(|s| s.local).collect();
    RegionStats {
        region: region.to_string(),
        count: ms.len(),
        errors,
        first_error,
        p50_ms: percentile(&ms, 0.50),
        p99_ms: percentile(&ms, 0.99),
        mean_ms: if ms.is_empty() {
            0.0
        } else {
            ms.iter().sum::<f64>() / ms.len() as f64
        },
        max_ms: ms.last().copied().unwrap_or(0.0),
        staleness_p50_ms: (!stale.is_empty()).then(|| percentile(&stale, 0.50)),
        staleness_p99_ms: (!stale.is_empty()).then(|| percentile(&stale, 0.99)),
        local_pct: (!locals.is_empty())
            .then(|| 100.0 * locals.iter().filter(|l| **l).count() as f64 / locals.len() as f64),
    }
}

fn now_ms() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64() * 1_000.0)
}

/// Runs one operation of `op` from `region`; `n` picks the key.
async fn one(client: &Client, region: &str, op: Op, n: u64) -> Result<Sample, Error> {
    let started = Instant::now();
    let mut sample = Sample {
        ms: 0.0,
        staleness_ms: None,
        local: None,
    };
    match op {
        Op::Write => {
            client.put(key(region, 'a', n), format!("v{n}")).await?;
        }
        Op::Read => {
            client.get(key(region, 'a', n)).await?;
        }
        Op::FollowerRead => {
            let index = REGIONS.iter().position(|r| *r == region).unwrap_or(0);
            let other = REGIONS[(index + 1) % REGIONS.len()];
            let read = client
                .get_with(
                    key(other, 'a', n),
                    ReadConsistency::BoundedStaleness {
                        max_staleness: MAX_STALENESS,
                    },
                )
                .await?;
            sample.staleness_ms = Some((now_ms() - read.read_ts.physical_ms() as f64).max(0.0));
            sample.local = Some(region_of(read.served_by) == region && read.served_by != 0);
        }
        Op::Txn1pc | Op::Txn2Shard => {
            let mut keys = vec![key(region, 'a', n)];
            if op == Op::Txn2Shard {
                keys.push(key(region, 'b', n));
            }
            client
                .txn(TxnOptions::default(), |txn| {
                    let keys = keys.clone();
                    Box::pin(async move {
                        for key in keys {
                            let count: u64 = txn.get_str(key.clone()).await?.parse().unwrap_or(0);
                            txn.put(key, (count + 1).to_string())?;
                        }
                        Ok::<_, Error>(())
                    })
                })
                .await?;
        }
    }
    sample.ms = started.elapsed().as_secs_f64() * 1_000.0;
    Ok(sample)
}

/// Runs `op` from every region in `regions` at once; returns their figures in that order.
pub async fn run(
    clients: &BTreeMap<String, Client>,
    regions: &[&str],
    op: Op,
    ops: usize,
    concurrency: usize,
    seed: u64,
) -> Vec<RegionStats> {
    // Every worker of every region is its own task, so all regions run at once.
    let mut groups = Vec::new();
    for (g, region) in regions.iter().enumerate() {
        let next = Arc::new(AtomicUsize::new(0));
        let workers: Vec<_> = (0..concurrency)
            .map(|w| {
                let client = clients[*region].clone();
                let region = region.to_string();
                let next = next.clone();
                let worker_seed = seed ^ ((g as u64) << 32) ^ (w as u64 + 1);
                tokio::spawn(async move {
                    let mut rng = StdRng::seed_from_u64(worker_seed);
                    for _ in 0..WARMUP_PER_WORKER {
                        let _ = one(&client, &region, op, rng.gen_range(0..KEYS_PER_SHARD)).await;
                    }
                    let mut samples = Vec::new();
                    let mut errors = Vec::new();
                    while next.fetch_add(1, Ordering::Relaxed) < ops {
                        match one(&client, &region, op, rng.gen_range(0..KEYS_PER_SHARD)).await {
                            Ok(sample) => samples.push(sample),
                            Err(error) => errors.push(error.to_string()),
                        }
                    }
                    (samples, errors)
                })
            })
            .collect();
        groups.push((region.to_string(), workers));
    }
    let mut out = Vec::new();
    for (region, workers) in groups {
        let mut samples = Vec::new();
        let mut errors = Vec::new();
        for worker in workers {
            match worker.await {
                Ok((s, e)) => {
                    samples.extend(s);
                    errors.extend(e);
                }
                Err(panic) => errors.push(format!("worker failed: {panic}")),
            }
        }
        out.push(stats(
            &region,
            &samples,
            errors.len(),
            errors.into_iter().next(),
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 0.50), 50.0);
        assert_eq!(percentile(&v, 0.99), 99.0);
        assert_eq!(percentile(&v, 1.0), 100.0);
        assert_eq!(percentile(&[7.0], 0.99), 7.0);
        assert_eq!(percentile(&[], 0.5), 0.0);
    }
}
