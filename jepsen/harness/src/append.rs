//! The list-append workload's clients: transactions of appends and reads, for the Elle-style
//! serializability checker (`meridian_jepsen::checker::append`).
//!
//! # Keys
//! [`KEYS_PER_SHARD`] keys in every data shard (`<shard start>jepsen-l<s>-<j>`), each holding a
//! comma-separated list of integers (absent = empty). Values come from one counter shared by
//! all clients, so every appended value is unique.
//!
//! # Transactions
//! - read-write (3 in 4): 1–4 micro-operations, each an append of a fresh value or a read of
//!   the whole list, on the keys of one shard (a one-shard commit) or, half of the time, on
//!   the keys of two shards (a two-phase commit);
//! - read-only (1 in 4): a read of every key of every shard, one transaction across the shards.
//!
//! Each runs in `Client::txn`; the micro-operations the committed attempt performed (with the
//! lists it read) are the completion. Outcomes as for bank transfers: `Ok` if committed,
//! `Error::Ambiguous` or no answer → `Info`, other errors → `Fail`.

use crate::workload::{retry_final, Recorder, CALL_TIMEOUT};
use bytes::Bytes;
use meridian_client::{Client, Error as ClientError, ShardMap, Txn, TxnOptions};
use meridian_jepsen::checker::append::{txn_value, Micro};
use meridian_jepsen::history::{OpFn, OpKind};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The workload's key in the history.
pub const APPEND_KEY: &str = "append";
/// Keys in each data shard.
pub const KEYS_PER_SHARD: usize = 3;
/// Most micro-operations of a read-write transaction.
const MAX_MICRO_OPS: usize = 4;
/// The harness's own bound around a transaction.
const TXN_BOUND: Duration = Duration::from_secs(15);
/// Most think time between a client's transactions.
const MAX_THINK_MS: u64 = 10;

/// The keys, grouped by shard (each group full).
pub fn keys(map: &ShardMap) -> Vec<Vec<String>> {
    let mut groups = Vec::new();
    for (s, shard) in map.shards().iter().enumerate() {
        let start = std::str::from_utf8(&shard.start).unwrap_or("");
        let group: Vec<String> = (0..KEYS_PER_SHARD)
            .map(|j| format!("{start}jepsen-l{s}-{j}"))
            .filter(|k| shard.contains(k.as_bytes()))
            .collect();
        if group.len() == KEYS_PER_SHARD {
            groups.push(group);
        }
    }
    groups
}

fn parse_list(value: Option<Bytes>) -> Result<Vec<u64>, ClientError> {
    let value = value.unwrap_or_default();
    let text = std::str::from_utf8(&value).map_err(|_| ClientError::InvalidArgument {
        message: "a list is not UTF-8".into(),
    })?;
    if text.is_empty() {
        return Ok(Vec::new());
    }
    text.split(',')
        .map(|x| x.parse().ok())
        .collect::<Option<Vec<u64>>>()
        .ok_or_else(|| ClientError::InvalidArgument {
            message: format!("{text:?} is not a list of integers"),
        })
}

fn render_list(list: &[u64]) -> String {
    list.iter()
        .map(u64::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

/// Performs `plan` inside `txn`; returns the micro-operations with what they read.
async fn perform(txn: &mut Txn, plan: &[Micro]) -> Result<Vec<Micro>, ClientError> {
    let mut done = Vec::with_capacity(plan.len());
    for m in plan {
        match m {
            Micro::Append(k, v) => {
                let mut list = parse_list(txn.get(k.clone()).await?)?;
                list.push(*v);
                txn.put(k.clone(), render_list(&list))?;
                done.push(m.clone());
            }
            Micro::Read(k, _) => {
                let list = parse_list(txn.get(k.clone()).await?)?;
                done.push(Micro::Read(k.clone(), Some(list)));
            }
        }
    }
    Ok(done)
}

/// Runs `plan` as one transaction and records it.
/// With `linearizable`, the commit waits out the clock uncertainty (see
/// `TxnOptions::linearizable`).
async fn run_txn(
    client: &Client,
    recorder: &Recorder,
    plan: Vec<Micro>,
    process: u64,
    linearizable: bool,
) -> bool {
    recorder.record(
        process,
        OpKind::Invoke,
        OpFn::Txn,
        APPEND_KEY,
        txn_value(&plan),
        None,
        None,
    );
    let plan = Arc::new(plan);
    let options = TxnOptions {
        deadline: Some(CALL_TIMEOUT * 2),
        linearizable,
        ..TxnOptions::default()
    };
    let call = client.txn(options, {
        let plan = plan.clone();
        move |txn| {
            let plan = plan.clone();
            Box::pin(async move { perform(txn, &plan).await })
        }
    });
    let (kind, value, error) = match tokio::time::timeout(TXN_BOUND, call).await {
        Ok(Ok((done, _))) => (OpKind::Ok, txn_value(&done), None),
        Ok(Err(e @ ClientError::Ambiguous { .. })) => {
            (OpKind::Info, txn_value(&plan), Some(e.to_string()))
        }
        Ok(Err(e)) => (OpKind::Fail, txn_value(&plan), Some(e.to_string())),
        Err(_) => (
            OpKind::Info,
            txn_value(&plan),
            Some(format!("no answer within the harness bound {TXN_BOUND:?}")),
        ),
    };
    let ok = kind == OpKind::Ok;
    recorder.record(process, kind, OpFn::Txn, APPEND_KEY, value, error, None);
    ok
}

fn read_everything(groups: &[Vec<String>]) -> Vec<Micro> {
    groups
        .iter()
        .flatten()
        .map(|k| Micro::Read(k.clone(), None))
        .collect()
}

/// One list-append client until `until`; `linearizable` as for `run_txn`.
pub async fn append_client(
    client: Client,
    recorder: Arc<Recorder>,
    groups: Arc<Vec<Vec<String>>>,
    next: Arc<AtomicU64>,
    (process, seed): (u64, u64),
    linearizable: bool,
    until: Instant,
) {
    let mut rng = StdRng::seed_from_u64(seed.wrapping_add(process));
    while Instant::now() < until {
        let plan = if rng.gen_range(0..4) == 0 {
            read_everything(&groups)
        } else {
            let first = rng.gen_range(0..groups.len());
            // Half the time a second shard's keys too (a two-phase commit if both are written).
            let second = match groups.len() > 1 && rng.gen_bool(0.5) {
                true => (first + rng.gen_range(1..groups.len())) % groups.len(),
                false => first,
            };
            let pool: Vec<&String> = groups[first].iter().chain(&groups[second]).collect();
            (0..rng.gen_range(1..=MAX_MICRO_OPS))
                .map(|_| {
                    let key = pool[rng.gen_range(0..pool.len())].clone();
                    if rng.gen_bool(0.5) {
                        Micro::Append(key, next.fetch_add(1, Ordering::SeqCst))
                    } else {
                        Micro::Read(key, None)
                    }
                })
                .collect()
        };
        run_txn(&client, &recorder, plan, process, linearizable).await;
        tokio::time::sleep(Duration::from_millis(rng.gen_range(0..=MAX_THINK_MS))).await;
    }
}

/// The final read of every key after healing: retried until one succeeds (bounded).
pub async fn final_read(
    client: &Client,
    recorder: &Recorder,
    groups: &[Vec<String>],
    process: u64,
) -> bool {
    // Read-only: nothing to commit-wait for.
    retry_final(|| run_txn(client, recorder, read_everything(groups), process, false)).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_round_trip_and_garbage_is_refused() {
        assert_eq!(parse_list(None).unwrap(), Vec::<u64>::new());
        let list = vec![3, 1, 4];
        assert_eq!(
            parse_list(Some(Bytes::from(render_list(&list)))).unwrap(),
            list
        );
        assert!(parse_list(Some(Bytes::from_static(b"1,x"))).is_err());
    }
}
