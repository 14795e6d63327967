//! The clients: history recording, the register and set workloads, and the final reads.
//!
//! # Recording
//! [`Recorder`] appends every invoke and completion to one [`History`] under a lock, taking the
//! monotonic time (ns since the run's start) *inside* the lock, so the vector order is the real
//! time order the checkers rely on. Each client task is one process (id = task index) with its
//! own [`Client`] (its own write-id space); the final reads use process id = concurrency.
//! `node` on a completion is the client's cached leader for the key's shard after the call —
//! who most likely served it, not a guarantee.
//!
//! # Outcomes
//! - register write (`put` of `"<process>-<counter>"`): `Ok`; `Error::Ambiguous` → `Info`
//!   (may or may not have been applied); any other error → `Fail` (the client guarantees
//!   nothing was proposed). A call still running at the harness's own bound → `Info`.
//! - register read (`get`): `Ok` with the value (null = absent); any error → `Fail`.
//! - register cas (`compare_and_swap` from the value this client last saw to a fresh unique
//!   value, recorded as `cas [expected, new]`): `Ok` if it swapped; a mismatch → `Fail`
//!   (nothing written); otherwise as a write.
//! - set add (`put set/<x:010> = x`, recorded as `add x` on set `"set"`): as a write.
//! - set final read: a paged scan of `set/`..`set0` after healing, recorded as `read_all`;
//!   retried (bounded) until one succeeds.

use bytes::Bytes;
use meridian_client::{CasOutcome, Client, ClientConfig, Error as ClientError, Expect, ShardMap};
use meridian_jepsen::history::{History, Op, OpFn, OpKind};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Budget of one client call, retries included.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(4);
/// Timeout of one attempt.
pub const RPC_TIMEOUT: Duration = Duration::from_secs(1);
/// The harness's own bound around a call (the client should end first).
const OP_BOUND: Duration = Duration::from_secs(10);
/// Most think time between a client's operations.
const MAX_THINK_MS: u64 = 10;
/// The set's key prefix and the name of the set in the history.
pub const SET_PREFIX: &str = "set/";
pub const SET_NAME: &str = "set";
/// Final-read attempts and their overall bound.
const FINAL_ATTEMPTS: usize = 30;
const FINAL_BOUND: Duration = Duration::from_secs(90);
/// Rows per scan call of the final read (MAX_SCAN_LIMIT).
const SCAN_PAGE: u32 = 10_000;

/// Runs one final-read `attempt` until it succeeds, at most [`FINAL_ATTEMPTS`] times a second
/// apart (the bank and append workloads' final reads); returns whether one did.
pub async fn retry_final<F, Fut>(mut attempt: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    for _ in 0..FINAL_ATTEMPTS {
        if attempt().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(1_000)).await;
    }
    false
}

/// The shared, ordered history of a run.
pub struct Recorder {
    start: Mutex<Instant>,
    history: Mutex<History>,
}

impl Recorder {
    pub fn new(start: Instant) -> Recorder {
        Recorder {
            start: Mutex::new(start),
            history: Mutex::new(History::new()),
        }
    }

    /// Time 0 of the history.
    pub fn start(&self) -> Instant {
        *self.start.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Moves time 0 to now; only before anything is recorded.
    pub fn restart_clock(&self) {
        let history = self.history.lock().unwrap_or_else(|p| p.into_inner());
        assert!(history.is_empty(), "restart_clock after recording");
        *self.start.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
    }

    /// Nanoseconds since the run's start.
    pub fn now_ns(&self) -> u64 {
        u64::try_from(self.start().elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    #[allow(clippy::too_many_arguments)]
    pub fn record(
        &self,
        process: u64,
        kind: OpKind,
        f: OpFn,
        key: &str,
        value: Value,
        error: Option<String>,
        node: Option<String>,
    ) {
        let mut op = Op::new(process, kind, f, Some(key), value);
        op.error = error;
        op.node = node;
        op.wall_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let mut history = self.history.lock().unwrap_or_else(|p| p.into_inner());
        op.time_ns = self.now_ns();
        history.push(op);
    }

    pub fn snapshot(&self) -> History {
        self.history
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

/// A client for process `process`, with bounded timeouts and a seeded backoff jitter.
pub async fn connect(endpoints: &[String], seed: u64, process: u64) -> anyhow::Result<Client> {
    let mut config = ClientConfig::new(endpoints.to_vec());
    config.call_timeout = CALL_TIMEOUT;
    config.rpc_timeout = RPC_TIMEOUT;
    config.connect_timeout = Duration::from_secs(1);
    config.jitter_seed = Some(seed.wrapping_add(process));
    // Clients sit in the nodes' regions in turn: stale reads go to the replica in theirs.
    let regions = meridian_cli::local_cluster::REGIONS;
    config.region = Some(regions[process as usize % regions.len()].to_string());
    let mut last = None;
    for _ in 0..5 {
        match Client::connect(config.clone()).await {
            Ok(client) => return Ok(client),
            Err(e) => last = Some(e),
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Err(anyhow::anyhow!(
        "client {process} could not connect: {}",
        last.map_or_else(|| "no attempt".into(), |e| e.to_string())
    ))
}

/// `count` register keys, spread over the shards (key i in shard i mod shards).
pub fn register_keys(map: &ShardMap, count: usize) -> Vec<String> {
    let shards = map.shards();
    (0..count)
        .map(|i| {
            let fallback = format!("jepsen-r{i}");
            let Some(shard) = shards.get(i % shards.len().max(1)) else {
                return fallback;
            };
            match std::str::from_utf8(&shard.start) {
                Ok(start) => {
                    let key = format!("{start}jepsen-r{i}");
                    if shard.contains(key.as_bytes()) {
                        key
                    } else {
                        fallback
                    }
                }
                Err(_) => fallback,
            }
        })
        .collect()
}

/// The storage key of set element `x`.
pub fn set_key(x: u64) -> String {
    format!("{SET_PREFIX}{x:010}")
}

fn text(bytes: &Bytes) -> Value {
    match std::str::from_utf8(bytes) {
        Ok(s) => Value::String(s.to_string()),
        Err(_) => Value::String(format!("<non-utf8 {:?}>", bytes.escape_ascii().to_string())),
    }
}

fn leader_of(client: &Client, key: &str) -> Option<String> {
    client
        .route(key.as_bytes())
        .and_then(|r| r.leader_id)
        .map(|n| format!("n{n}"))
}

/// The completion of a write-like call: Ok, Info (ambiguous or unbounded) or Fail.
fn write_outcome<T>(
    result: Result<Result<T, ClientError>, tokio::time::error::Elapsed>,
) -> (OpKind, Option<String>) {
    match result {
        Ok(Ok(_)) => (OpKind::Ok, None),
        Ok(Err(e @ ClientError::Ambiguous { .. })) => (OpKind::Info, Some(e.to_string())),
        Ok(Err(e)) => (OpKind::Fail, Some(e.to_string())),
        Err(_) => (
            OpKind::Info,
            Some(format!("no answer within the harness bound {OP_BOUND:?}")),
        ),
    }
}

/// The completion of a compare-and-swap: `Ok` if it swapped, `Fail` if the condition did not
/// hold (nothing written) or the call failed before reaching Raft, `Info` if unknown.
fn cas_outcome(
    result: Result<Result<CasOutcome, ClientError>, tokio::time::error::Elapsed>,
) -> (OpKind, Option<String>) {
    match result {
        Ok(Ok(CasOutcome::Mismatch { current })) => (
            OpKind::Fail,
            Some(format!(
                "condition did not hold; current {:?}",
                current.map(|v| text(&v.value))
            )),
        ),
        other => write_outcome(other),
    }
}

/// Register keys written at most once per `gap` (`--write-gap-ms`), shared by every client:
/// between two writes a key's shard has only reads, so it quiesces and serves them on its
/// parked lease.
pub struct WriteGap {
    gap: Duration,
    last_write: std::sync::Mutex<std::collections::HashMap<String, Instant>>,
}

impl WriteGap {
    pub fn new(gap: Duration) -> WriteGap {
        WriteGap {
            gap,
            last_write: Default::default(),
        }
    }

    /// Whether the caller may write `key` at `now`; if so, the key's next write is `gap` away.
    pub fn claim(&self, key: &str, now: Instant) -> bool {
        let mut last = self.last_write.lock().unwrap_or_else(|p| p.into_inner());
        match last.get(key) {
            Some(at) if now.saturating_duration_since(*at) < self.gap => false,
            _ => {
                last.insert(key.to_string(), now);
                true
            }
        }
    }
}

/// One register client until `until`: half reads (with a `write_gap`, every op on a key whose
/// last write is younger than the gap); of the rest, a compare-and-swap from the
/// value this client last saw for the key (when it saw one) half the time, else a blind write.
/// Every written value is unique (`"<process>-<counter>"`), as the checker's pruning and the
/// stale-read control need.
pub async fn register_client(
    client: Client,
    recorder: Arc<Recorder>,
    keys: Arc<Vec<String>>,
    (process, seed): (u64, u64),
    write_gap: Option<Arc<WriteGap>>,
    until: Instant,
) {
    let mut rng = StdRng::seed_from_u64(seed.wrapping_add(process));
    let mut counter = 0u64;
    let mut last_seen: std::collections::HashMap<String, String> = Default::default();
    while Instant::now() < until {
        let key = keys[rng.gen_range(0..keys.len())].as_str();
        let read = match &write_gap {
            Some(gap) => !gap.claim(key, Instant::now()),
            None => rng.gen_bool(0.5),
        };
        if read {
            recorder.record(
                process,
                OpKind::Invoke,
                OpFn::Read,
                key,
                Value::Null,
                None,
                None,
            );
            let result = tokio::time::timeout(OP_BOUND, client.get(key.to_string())).await;
            let (kind, value, error) = match result {
                Ok(Ok(value)) => (OpKind::Ok, value.as_ref().map_or(Value::Null, text), None),
                Ok(Err(e)) => (OpKind::Fail, Value::Null, Some(e.to_string())),
                Err(_) => (OpKind::Fail, Value::Null, Some("harness bound".into())),
            };
            if let Value::String(seen) = &value {
                last_seen.insert(key.to_string(), seen.clone());
            }
            let node = leader_of(&client, key);
            recorder.record(process, kind, OpFn::Read, key, value, error, node);
        } else {
            counter += 1;
            let value = format!("{process}-{counter}");
            let expected = last_seen.get(key).cloned().filter(|_| rng.gen_bool(0.5));
            let (f, logged) = match &expected {
                Some(e) => (OpFn::Cas, json!([e, value])),
                None => (OpFn::Write, json!(value)),
            };
            recorder.record(process, OpKind::Invoke, f, key, logged.clone(), None, None);
            let (kind, error) = match expected {
                Some(e) => {
                    let call = client.compare_and_swap(
                        key.to_string(),
                        Expect::Value(Bytes::from(e)),
                        Some(Bytes::from(value.clone())),
                    );
                    cas_outcome(tokio::time::timeout(OP_BOUND, call).await)
                }
                None => {
                    let call = client.put(key.to_string(), value.clone());
                    write_outcome(tokio::time::timeout(OP_BOUND, call).await)
                }
            };
            if kind == OpKind::Ok {
                last_seen.insert(key.to_string(), value);
            }
            let node = leader_of(&client, key);
            recorder.record(process, kind, f, key, logged, error, node);
        }
        tokio::time::sleep(Duration::from_millis(rng.gen_range(0..=MAX_THINK_MS))).await;
    }
}

/// One set client until `until`; elements come from the shared counter `next`.
pub async fn set_client(
    client: Client,
    recorder: Arc<Recorder>,
    next: Arc<AtomicU64>,
    process: u64,
    seed: u64,
    until: Instant,
) {
    let mut rng = StdRng::seed_from_u64(seed.wrapping_add(process));
    while Instant::now() < until {
        let x = next.fetch_add(1, Ordering::SeqCst);
        let key = set_key(x);
        recorder.record(
            process,
            OpKind::Invoke,
            OpFn::Add,
            SET_NAME,
            json!(x),
            None,
            None,
        );
        let result = tokio::time::timeout(OP_BOUND, client.put(key.clone(), x.to_string())).await;
        let (kind, error) = write_outcome(result);
        let node = leader_of(&client, &key);
        recorder.record(process, kind, OpFn::Add, SET_NAME, json!(x), error, node);
        tokio::time::sleep(Duration::from_millis(rng.gen_range(0..=MAX_THINK_MS))).await;
    }
}

/// Final reads of every register key (one successful read each, bounded retries).
pub async fn final_register_reads(
    client: &Client,
    recorder: &Recorder,
    keys: &[String],
    process: u64,
) -> usize {
    let give_up = Instant::now() + FINAL_BOUND;
    let mut done = 0;
    for key in keys {
        for _ in 0..FINAL_ATTEMPTS {
            if Instant::now() >= give_up {
                break;
            }
            recorder.record(
                process,
                OpKind::Invoke,
                OpFn::Read,
                key,
                Value::Null,
                None,
                None,
            );
            let result = tokio::time::timeout(OP_BOUND, client.get(key.clone())).await;
            let node = leader_of(client, key);
            match result {
                Ok(Ok(value)) => {
                    let value = value.as_ref().map_or(Value::Null, text);
                    recorder.record(process, OpKind::Ok, OpFn::Read, key, value, None, node);
                    done += 1;
                    break;
                }
                other => {
                    let error = match other {
                        Ok(Err(e)) => e.to_string(),
                        _ => "harness bound".into(),
                    };
                    recorder.record(
                        process,
                        OpKind::Fail,
                        OpFn::Read,
                        key,
                        Value::Null,
                        Some(error),
                        node,
                    );
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            }
        }
    }
    done
}

/// Every row of the set, paging past SCAN_PAGE rows.
async fn scan_set(client: &Client) -> Result<Vec<Value>, String> {
    let end = Bytes::from_static(b"set0"); // '/' + 1: the end of the "set/" prefix
    let mut start = Bytes::from_static(SET_PREFIX.as_bytes());
    let mut elements = Vec::new();
    for _ in 0..10_000 {
        let rows = client
            .scan(start.clone(), Some(end.clone()), SCAN_PAGE, false)
            .await
            .map_err(|e| e.to_string())?;
        let full = rows.len() == SCAN_PAGE as usize;
        for row in &rows {
            elements.push(element_of(&row.key, &row.value));
        }
        match rows.last() {
            Some(last) if full => start = Bytes::from([last.key.as_ref(), &b"\0"[..]].concat()),
            _ => return Ok(elements),
        }
    }
    Err("scan did not end after 10,000 pages".into())
}

/// The set element a row holds: its value as an integer, if the row is well formed (key
/// `set/<x:010>`, value `x`); otherwise a string describing it, which the checker will report
/// as an unexpected element.
pub fn element_of(key: &[u8], value: &[u8]) -> Value {
    let parsed = std::str::from_utf8(value)
        .ok()
        .and_then(|v| v.parse::<u64>().ok());
    match parsed {
        Some(x) if set_key(x).as_bytes() == key => json!(x),
        _ => json!(format!(
            "malformed row {} = {}",
            key.escape_ascii(),
            value.escape_ascii()
        )),
    }
}

/// The final read of the set: retried until one scan succeeds (bounded). Returns whether one did.
pub async fn final_set_read(client: &Client, recorder: &Recorder, process: u64) -> bool {
    let give_up = Instant::now() + FINAL_BOUND;
    for _ in 0..FINAL_ATTEMPTS {
        if Instant::now() >= give_up {
            break;
        }
        recorder.record(
            process,
            OpKind::Invoke,
            OpFn::ReadAll,
            SET_NAME,
            Value::Null,
            None,
            None,
        );
        let result = tokio::time::timeout(Duration::from_secs(30), scan_set(client)).await;
        match result {
            Ok(Ok(elements)) => {
                let value = Value::Array(elements);
                recorder.record(
                    process,
                    OpKind::Ok,
                    OpFn::ReadAll,
                    SET_NAME,
                    value,
                    None,
                    None,
                );
                return true;
            }
            Ok(Err(_)) | Err(_) => {
                let error = match result {
                    Ok(Err(e)) => e,
                    _ => "scan took over 30 s".into(),
                };
                recorder.record(
                    process,
                    OpKind::Fail,
                    OpFn::ReadAll,
                    SET_NAME,
                    Value::Null,
                    Some(error),
                    None,
                );
                tokio::time::sleep(Duration::from_millis(1_000)).await;
            }
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use meridian_client::ShardRoute;

    /// Register keys land in distinct shards, inside them.
    #[test]
    fn register_keys_spread_over_shards() {
        let shard = |id, start: &'static str, end: &'static str| ShardRoute {
            shard_id: id,
            start: Bytes::from(start),
            end: Bytes::from(end),
            replicas: vec![1, 2, 3],
            leader_id: None,
            generation: 1,
        };
        let map = ShardMap::new(
            "c",
            [
                shard(1, "", "user3"),
                shard(2, "user3", "user6"),
                shard(3, "user6", ""),
            ],
            [],
        );
        let keys = register_keys(&map, 4);
        assert_eq!(
            keys,
            ["jepsen-r0", "user3jepsen-r1", "user6jepsen-r2", "jepsen-r3"]
        );
        let shards: Vec<u64> = keys
            .iter()
            .map(|k| map.shard_for_key(k.as_bytes()).unwrap().shard_id)
            .collect();
        assert_eq!(shards, [1, 2, 3, 1]);
        assert_eq!(
            register_keys(&ShardMap::default(), 2),
            ["jepsen-r0", "jepsen-r1"]
        );
    }

    /// Well-formed rows become integers; anything else a descriptive string.
    #[test]
    fn set_rows_to_elements() {
        assert_eq!(set_key(42), "set/0000000042");
        assert_eq!(element_of(b"set/0000000042", b"42"), json!(42));
        assert!(element_of(b"set/0000000042", b"43").is_string());
        assert!(element_of(b"set/0000000042", b"x").is_string());
    }

    /// A key is written once per gap, whoever asks; keys are independent.
    #[test]
    fn write_gap_allows_one_write_per_gap_per_key() {
        let gap = WriteGap::new(Duration::from_secs(5));
        let t = Instant::now();
        assert!(gap.claim("a", t));
        assert!(!gap.claim("a", t + Duration::from_secs(1)));
        assert!(gap.claim("b", t + Duration::from_secs(1)));
        assert!(!gap.claim("a", t + Duration::from_millis(4_999)));
        assert!(gap.claim("a", t + Duration::from_secs(5)));
        assert!(!gap.claim("a", t + Duration::from_secs(6)));
    }

    /// The recorder keeps indices and times in order.
    #[test]
    fn recorder_orders_events() {
        let r = Recorder::new(Instant::now());
        r.record(
            0,
            OpKind::Invoke,
            OpFn::Write,
            "k",
            json!("0-1"),
            None,
            None,
        );
        r.record(
            0,
            OpKind::Ok,
            OpFn::Write,
            "k",
            json!("0-1"),
            None,
            Some("n1".into()),
        );
        let h = r.snapshot();
        h.validate().unwrap();
        assert!(h.ops[0].time_ns <= h.ops[1].time_ns);
        assert_eq!(h.ops[1].node.as_deref(), Some("n1"));
    }
}
