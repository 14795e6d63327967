//! After a `set` run: every replica of the set's shard must hold every acknowledged add.
//!
//! The set checker sees only the replica that serves the final read. A replica whose state
//! machine diverged from its log — as one did that skipped committed entries while catching up
//! (jepsen/evidence, `set-clock-chain`) — passes that check as long as it never serves a read.
//! So after the final read the harness waits until every replica of the shard reports the same
//! applied index as the shard's last log index ([`wait_converged`]), stops the nodes, opens each
//! replica's RocksDB and reads the set's key range at the newest version ([`read_replica`]),
//! and [`check_replicas`] reports every acknowledged add a replica lacks as an anomaly of kind
//! `replica-lost`. Replicas that did not converge in time are not judged (reported, not failed).
//!
//! After a `register` run the same wait is made for each register key's shard, and then every
//! converged replica's newest value of the key is read back from its RocksDB:
//! [`check_register_replicas`] reports replicas that applied the same log but hold different
//! values (`replica-diverged`). It compares replicas with each other, not with the final read:
//! a write whose outcome was unknown may legitimately commit after the final read.
//!
//! Not done: shards other than the ones the workload's keys live in.

use crate::workload::{element_of, SET_NAME, SET_PREFIX};
use meridian_cli::LocalCluster;
use meridian_jepsen::checker::{Anomaly, CheckResult, Validity};
use meridian_jepsen::history::{History, OpFn, OpKind};
use meridian_storage::{mvcc, EngineOptions, RocksEngine};
use meridian_types::{ShardId, Timestamp};
use serde_json::json;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::{Duration, Instant};

/// Bound on the replicas converging after the final read.
const CONVERGE_TIMEOUT: Duration = Duration::from_secs(30);
/// Rows per page when reading a replica's RocksDB.
const PAGE_ROWS: usize = 10_000;
/// Most missing elements listed per replica in the anomaly message.
const LISTED: usize = 20;

/// The set's shard and the replicas whose state is comparable.
#[derive(Clone, Debug, Default)]
pub struct Converged {
    pub shard: u64,
    /// The shard's key range (`end` empty = to the end of the keyspace): data shards share one
    /// keyspace in storage, so a replica's rows are the ones in its range.
    pub start: Vec<u8>,
    pub end: Vec<u8>,
    /// Replicas (node ids) that reported the shard's last log index as applied.
    pub nodes: Vec<u64>,
    /// Replicas that did not get there within the bound, with what they reported.
    pub lagging: BTreeMap<u64, String>,
}

/// Waits (bounded) until every replica of the set's shard has applied the shard's whole log,
/// as each node reports its own replica.
pub async fn wait_converged(cluster: &LocalCluster) -> anyhow::Result<Converged> {
    wait_converged_for(cluster, SET_PREFIX.as_bytes()).await
}

/// [`wait_converged`] for the shard that owns `key`.
pub async fn wait_converged_for(cluster: &LocalCluster, key: &[u8]) -> anyhow::Result<Converged> {
    let started = Instant::now();
    loop {
        let mut reports: BTreeMap<u64, (u64, u64)> = BTreeMap::new();
        let mut shard = None;
        let mut range = (Vec::new(), Vec::new());
        let mut replicas: Vec<u64> = Vec::new();
        for node in cluster.node_ids() {
            let addr = cluster.client_addr(node)?;
            let Ok(status) = meridian_client::fetch_status(&addr, Duration::from_secs(2)).await
            else {
                continue;
            };
            let Some(info) = status.shards.iter().find(|s| {
                s.shard_id != 0
                    && s.start.as_ref() <= key
                    && (s.end.is_empty() || key < s.end.as_ref())
            }) else {
                continue;
            };
            shard = Some(info.shard_id);
            range = (info.start.to_vec(), info.end.to_vec());
            replicas = info.replicas.clone();
            if info.replicas.contains(&node) {
                reports.insert(node, (info.applied_index, info.last_log_index));
            }
        }
        let last = reports.values().map(|(_, l)| *l).max().unwrap_or(0);
        let done: Vec<u64> = reports
            .iter()
            .filter(|(_, (applied, _))| *applied == last && last > 0)
            .map(|(n, _)| *n)
            .collect();
        if let Some(shard) = shard {
            if done.len() == replicas.len() || started.elapsed() > CONVERGE_TIMEOUT {
                let lagging = replicas
                    .iter()
                    .filter(|n| !done.contains(n))
                    .map(|n| {
                        let seen = reports.get(n).map_or("no status".to_string(), |(a, _)| {
                            format!("applied {a} of {last}")
                        });
                        (*n, seen)
                    })
                    .collect();
                return Ok(Converged {
                    shard,
                    start: range.0,
                    end: range.1,
                    nodes: done,
                    lagging,
                });
            }
        } else if started.elapsed() > CONVERGE_TIMEOUT {
            anyhow::bail!(
                "no node reported the shard of {} within {CONVERGE_TIMEOUT:?}",
                key.escape_ascii()
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The set's elements in a stopped node's RocksDB (`db_dir`) within the shard's range
/// `[shard_start, shard_end)` (empty end = to the end), newest versions.
pub fn read_replica(
    db_dir: &Path,
    shard: u64,
    (shard_start, shard_end): (&[u8], &[u8]),
) -> anyhow::Result<BTreeSet<u64>> {
    let engine = RocksEngine::open(db_dir, &EngineOptions::default())?;
    let mut end = b"set0".to_vec(); // '/' + 1
    if !shard_end.is_empty() {
        end = end.min(shard_end.to_vec());
    }
    let mut start = SET_PREFIX.as_bytes().to_vec().max(shard_start.to_vec());
    let mut out = BTreeSet::new();
    loop {
        let page = mvcc::scan(
            &engine,
            ShardId(shard),
            &start,
            Some(&end),
            Timestamp::MAX,
            PAGE_ROWS,
            false,
        )?;
        for (key, _, value) in &page.rows {
            match element_of(key, value).as_u64() {
                Some(x) => {
                    out.insert(x);
                }
                None => anyhow::bail!(
                    "malformed set row {} in {}",
                    key.escape_ascii(),
                    db_dir.display()
                ),
            }
        }
        match page.resume_key {
            Some(next) => start = next,
            None => return Ok(out),
        }
    }
}

/// A register key's newest value in a stopped node's RocksDB (`None`: absent or deleted).
pub fn read_register(db_dir: &Path, shard: u64, key: &str) -> anyhow::Result<Option<String>> {
    let engine = RocksEngine::open(db_dir, &EngineOptions::default())?;
    let found = mvcc::get(&engine, ShardId(shard), key.as_bytes(), Timestamp::MAX)?;
    Ok(found.map(|(_, value)| String::from_utf8_lossy(&value).into_owned()))
}

/// Replicas that converged on a register key's shard must hold the same newest value of it.
/// `values`: per key, per node, what the replica holds.
pub fn check_register_replicas(
    values: &BTreeMap<String, BTreeMap<u64, Option<String>>>,
    lagging: &BTreeMap<String, BTreeMap<u64, String>>,
) -> CheckResult {
    let mut anomalies = Vec::new();
    let mut stats = serde_json::Map::new();
    for (key, held) in values {
        let distinct: BTreeSet<&Option<String>> = held.values().collect();
        stats.insert(
            key.clone(),
            json!({
                "replicas": held.len(),
                "values": held.iter().map(|(n, v)| (format!("n{n}"), json!(v))).collect::<serde_json::Map<_, _>>(),
                "not_judged": lagging.get(key).cloned().unwrap_or_default()
                    .into_iter().map(|(n, why)| (format!("n{n}"), json!(why))).collect::<serde_json::Map<_, _>>(),
            }),
        );
        if distinct.len() > 1 {
            anomalies.push(Anomaly {
                kind: "replica-diverged".into(),
                key: Some(key.clone()),
                ops: Vec::new(),
                message: format!(
                    "replicas that applied the same log hold different values of {key}: {}",
                    held.iter()
                        .map(|(n, v)| format!("n{n}={v:?}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            });
        }
    }
    replicas_result(anomalies, stats)
}

/// The `replicas` checker's result: valid iff no anomaly.
fn replicas_result(
    anomalies: Vec<Anomaly>,
    stats: serde_json::Map<String, serde_json::Value>,
) -> CheckResult {
    CheckResult {
        checker: "replicas".into(),
        valid: if anomalies.is_empty() {
            Validity::True
        } else {
            Validity::False
        },
        anomalies,
        stats: serde_json::Value::Object(stats),
    }
}

/// Adds acknowledged by the history (completed `Ok`).
pub fn acknowledged(history: &History) -> BTreeSet<u64> {
    history
        .ops
        .iter()
        .filter(|op| op.kind == OpKind::Ok && op.f == OpFn::Add)
        .filter_map(|op| op.value.as_u64())
        .collect()
}

/// Every acknowledged add must be on every judged replica.
pub fn check_replicas(
    acked: &BTreeSet<u64>,
    replicas: &BTreeMap<u64, BTreeSet<u64>>,
    lagging: &BTreeMap<u64, String>,
) -> CheckResult {
    let mut anomalies = Vec::new();
    let mut stats = serde_json::Map::new();
    for (node, held) in replicas {
        let missing: Vec<u64> = acked.difference(held).copied().collect();
        stats.insert(
            format!("n{node}"),
            json!({"elements": held.len(), "missing_acknowledged": missing.len()}),
        );
        if !missing.is_empty() {
            anomalies.push(Anomaly {
                kind: "replica-lost".into(),
                key: Some(SET_NAME.into()),
                ops: Vec::new(),
                message: format!(
                    "replica n{node} lacks {} acknowledged adds (first: {:?})",
                    missing.len(),
                    &missing[..missing.len().min(LISTED)]
                ),
            });
        }
    }
    for (node, why) in lagging {
        stats.insert(format!("n{node}"), json!({"not_judged": why}));
    }
    replicas_result(anomalies, stats)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(xs: &[u64]) -> BTreeSet<u64> {
        xs.iter().copied().collect()
    }

    #[test]
    fn replicas_holding_every_acknowledged_add_pass() {
        let acked = set(&[1, 2, 3]);
        // An unacknowledged add present on a replica is fine (it may have been applied).
        let replicas = BTreeMap::from([(1, set(&[1, 2, 3])), (2, set(&[1, 2, 3, 4]))]);
        let r = check_replicas(&acked, &replicas, &BTreeMap::new());
        assert_eq!(r.valid, Validity::True, "{:?}", r.anomalies);
    }

    /// The negative control: a replica missing acknowledged adds (as one that skipped
    /// committed entries did) is caught even though the other replicas hold them.
    #[test]
    fn a_replica_missing_acknowledged_adds_is_an_anomaly() {
        let acked = set(&[1, 2, 3, 4]);
        let replicas = BTreeMap::from([(1, set(&[1, 2, 3, 4])), (3, set(&[1, 4]))]);
        let r = check_replicas(&acked, &replicas, &BTreeMap::new());
        assert_eq!(r.valid, Validity::False);
        assert_eq!(r.anomalies.len(), 1);
        assert_eq!(r.anomalies[0].kind, "replica-lost");
        assert!(
            r.anomalies[0].message.contains("n3 lacks 2"),
            "{}",
            r.anomalies[0].message
        );
    }

    #[test]
    fn lagging_replicas_are_reported_not_judged() {
        let acked = set(&[1]);
        let lagging = BTreeMap::from([(2, "applied 5 of 9".to_string())]);
        let r = check_replicas(&acked, &BTreeMap::from([(1, set(&[1]))]), &lagging);
        assert_eq!(r.valid, Validity::True);
        assert!(r.stats["n2"]["not_judged"]
            .as_str()
            .unwrap()
            .contains("5 of 9"));
    }

    fn held(pairs: &[(u64, Option<&str>)]) -> BTreeMap<u64, Option<String>> {
        pairs
            .iter()
            .map(|(n, v)| (*n, v.map(str::to_string)))
            .collect()
    }

    #[test]
    fn register_replicas_that_agree_pass() {
        let values = BTreeMap::from([
            (
                "r0".to_string(),
                held(&[(1, Some("3-9")), (2, Some("3-9"))]),
            ),
            ("r1".to_string(), held(&[(1, None), (2, None), (3, None)])),
        ]);
        let r = check_register_replicas(&values, &BTreeMap::new());
        assert_eq!(r.valid, Validity::True, "{:?}", r.anomalies);
    }

    /// The negative control: one replica holding another value (or none) of a key is caught.
    #[test]
    fn a_register_replica_that_diverged_is_an_anomaly() {
        let values = BTreeMap::from([
            (
                "r0".to_string(),
                held(&[(1, Some("3-9")), (2, Some("2-4"))]),
            ),
            ("r1".to_string(), held(&[(1, Some("1-1")), (3, None)])),
            (
                "r2".to_string(),
                held(&[(1, Some("5-5")), (2, Some("5-5"))]),
            ),
        ]);
        let r = check_register_replicas(&values, &BTreeMap::new());
        assert_eq!(r.valid, Validity::False);
        let keys: Vec<_> = r.anomalies.iter().map(|a| a.key.clone().unwrap()).collect();
        assert_eq!(keys, ["r0", "r1"]);
        assert!(r.anomalies.iter().all(|a| a.kind == "replica-diverged"));
        assert!(
            r.anomalies[0].message.contains("n2=Some(\"2-4\")"),
            "{}",
            r.anomalies[0].message
        );
    }

    #[test]
    fn a_register_read_back_from_rocksdb_gives_the_newest_value() {
        use meridian_storage::{Engine, WriteBatch};
        let dir = tempfile::tempdir().unwrap();
        {
            let engine = RocksEngine::open(dir.path(), &EngineOptions::default()).unwrap();
            let mut batch = WriteBatch::new();
            mvcc::put(&mut batch, ShardId(1), b"r0", Timestamp(5), b"1-1");
            mvcc::put(&mut batch, ShardId(1), b"r0", Timestamp(6), b"2-2");
            mvcc::put(&mut batch, ShardId(1), b"r1", Timestamp(5), b"1-2");
            mvcc::delete(&mut batch, ShardId(1), b"r1", Timestamp(7));
            engine.write(batch, true).unwrap();
        }
        assert_eq!(
            read_register(dir.path(), 1, "r0").unwrap().as_deref(),
            Some("2-2")
        );
        assert_eq!(read_register(dir.path(), 1, "r1").unwrap(), None);
        assert_eq!(read_register(dir.path(), 1, "r9").unwrap(), None);
    }

    #[test]
    fn a_replica_read_back_from_rocksdb_gives_its_elements() {
        use meridian_storage::{Engine, WriteBatch};
        let dir = tempfile::tempdir().unwrap();
        {
            let engine = RocksEngine::open(dir.path(), &EngineOptions::default()).unwrap();
            let mut batch = WriteBatch::new();
            for x in [3u64, 7, 12_000] {
                let key = crate::workload::set_key(x);
                mvcc::put(
                    &mut batch,
                    ShardId(1),
                    key.as_bytes(),
                    Timestamp(5),
                    x.to_string().as_bytes(),
                );
            }
            // Another shard's rows (past the end of shard 1's range) are not this replica's.
            mvcc::put(
                &mut batch,
                ShardId(2),
                b"set/0000099999",
                Timestamp(5),
                b"99999",
            );
            engine.write(batch, true).unwrap();
        }
        assert_eq!(
            read_replica(dir.path(), 1, (b"", b"set/00000900")).unwrap(),
            set(&[3, 7, 12_000])
        );
    }
}
