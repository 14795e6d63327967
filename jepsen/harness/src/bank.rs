//! The bank workload's clients: accounts spread over the shards, transfers, reads of all.
//!
//! # Accounts
//! [`ACCOUNTS_PER_SHARD`] accounts in every data shard (keys `<shard start>jepsen-acct<s>-<j>`),
//! [`INITIAL_BALANCE`] each, written before the workload starts. Transfers move money between
//! two accounts: half of them of one shard (a one-shard commit, one Raft entry), half of two
//! shards (a two-phase commit); reads take every account of every shard in one read-only
//! transaction (one snapshot `BatchGet` per shard, all at one timestamp), or, half of the
//! time, as stale reads in one `Client::stale_snapshot`: the first account at [`STALENESS`]
//! behind the serving replica's clock (`ReadConsistency::ExactStaleness`, served by a replica in
//! the client's region whose closed timestamp covers it, often a follower), the others at
//! exactly that read timestamp (`ReadConsistency::AsOf`). A stale read is a snapshot at one
//! timestamp too, so the checker holds it to the same rules (a missing account included); its
//! op names the nodes that served it. Stale reads start [`STALE_READS_AFTER`] into the run, when their timestamps are surely
//! past the accounts' opening.
//!
//! # Outcomes
//! - transfer (`Client::txn`: read both, move `min(amount, balance)`, write both; half of
//!   them read both with `Txn::get_for_update` under `TxnOptions::early_locks`, noted as
//!   `early_locks` in the op, which the checker ignores): `Ok` if it
//!   committed; `Error::Ambiguous` or no answer within the harness bound → `Info`; any other
//!   error (conflicts past the attempts, unavailable shards) → `Fail` (nothing was written).
//! - read (`read_all` of the bank, value `{account: balance}`): `Ok` with the balances if the
//!   read-only transaction committed (or every stale read was answered); any error → `Fail`.

use crate::workload::{retry_final, Recorder, CALL_TIMEOUT};
use bytes::Bytes;
use meridian_client::{Client, Error as ClientError, ShardMap, TxnOptions};
use meridian_jepsen::checker::bank::BankModel;
use meridian_jepsen::history::{OpFn, OpKind};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Map, Value};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The bank's key in the history.
pub const BANK_KEY: &str = "bank";
/// Accounts opened in each data shard.
pub const ACCOUNTS_PER_SHARD: usize = 2;
/// Every account's opening balance.
pub const INITIAL_BALANCE: i64 = 100;
/// Largest amount one transfer asks to move.
const MAX_TRANSFER: i64 = 20;
/// The harness's own bound around a transaction (several client calls).
const TXN_BOUND: Duration = Duration::from_secs(15);
/// Share of transfers between accounts of two shards (two-phase commits).
const CROSS_SHARD_SHARE: f64 = 0.5;
/// Share of transfers that read their accounts with early locks (`TxnOptions::early_locks`).
const EARLY_LOCK_SHARE: f64 = 0.5;
/// Share of operations that are reads of every account.
const READ_SHARE: f64 = 0.3;
/// Share of reads served as stale reads (follower reads) rather than a transaction.
const STALE_READ_SHARE: f64 = 0.5;
/// How far behind its clock a stale read reads: above the nodes' closed-timestamp lag
/// (`cluster::CLOSED_TS_LAG_MS`), so a follower can usually serve it.
pub const STALENESS: Duration = Duration::from_millis(1_500);
/// How long after the accounts are opened stale reads start: their staleness plus the ±2 s
/// clock jumps of the `clock` and `all` nemeses plus `max_offset`, so every stale read's
/// timestamp is past the opening and must see every account.
const STALE_READS_AFTER: Duration = STALENESS.saturating_add(Duration::from_secs(3));
/// Most think time between a client's operations.
const MAX_THINK_MS: u64 = 10;
/// Attempts at opening the accounts.
const OPEN_ATTEMPTS: u32 = 5;

/// The accounts, grouped by shard (each group non-empty).
pub fn accounts(map: &ShardMap) -> Vec<Vec<String>> {
    let mut groups = Vec::new();
    for (s, shard) in map.shards().iter().enumerate() {
        let group: Vec<String> = (0..ACCOUNTS_PER_SHARD)
            .map(|j| {
                let start = std::str::from_utf8(&shard.start).unwrap_or("");
                format!("{start}jepsen-acct{s}-{j}")
            })
            .filter(|k| shard.contains(k.as_bytes()))
            .collect();
        if group.len() == ACCOUNTS_PER_SHARD {
            groups.push(group);
        }
    }
    groups
}

/// What the checker must find in every read.
pub fn model(accounts: &[String]) -> BankModel {
    BankModel {
        key: BANK_KEY.into(),
        accounts: accounts.iter().cloned().collect(),
        total: INITIAL_BALANCE * accounts.len() as i64,
    }
}

/// Opens every account (one `batch_put`, retried within the client's deadline).
pub async fn open(client: &Client, groups: &[Vec<String>]) -> anyhow::Result<()> {
    let entries: Vec<(String, String)> = groups
        .iter()
        .flatten()
        .map(|k| (k.clone(), INITIAL_BALANCE.to_string()))
        .collect();
    let mut attempt = 1;
    loop {
        match client.batch_put(entries.clone()).await {
            Ok(()) => return Ok(()),
            Err(e) if attempt < OPEN_ATTEMPTS => {
                eprintln!("  opening the accounts failed (retrying): {e}");
                attempt += 1;
            }
            Err(e) => return Err(anyhow::anyhow!("opening the accounts: {e}")),
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

fn balance(value: Option<Bytes>) -> Result<i64, ClientError> {
    let text = value.unwrap_or_default();
    std::str::from_utf8(&text)
        .ok()
        .and_then(|t| t.parse().ok())
        .ok_or_else(|| ClientError::InvalidArgument {
            message: format!("an account holds {text:?}, not a balance"),
        })
}

fn options() -> TxnOptions {
    TxnOptions {
        deadline: Some(CALL_TIMEOUT * 2),
        ..TxnOptions::default()
    }
}

/// Reads every account in one read-only transaction.
async fn read_all(client: &Client, accounts: Arc<Vec<String>>) -> Result<Value, ClientError> {
    let (balances, _) = client
        .txn(options(), move |txn| {
            let accounts = accounts.clone();
            Box::pin(async move {
                let values = txn.batch_get(accounts.iter().cloned()).await?;
                let mut balances = Map::new();
                for (account, value) in accounts.iter().zip(values) {
                    balances.insert(account.clone(), json!(balance(value)?));
                }
                Ok::<_, ClientError>(balances)
            })
        })
        .await?;
    Ok(Value::Object(balances))
}

/// Reads every account as stale reads at one timestamp (see the module docs); the balances
/// and the nodes that served them.
async fn read_all_stale(
    client: &Client,
    accounts: &[String],
) -> Result<(Value, String), ClientError> {
    let mut balances = Map::new();
    let mut served_by = std::collections::BTreeSet::new();
    let mut snapshot = client.stale_snapshot(STALENESS);
    let reads = snapshot.batch_get(accounts.iter().cloned()).await?;
    for (account, read) in accounts.iter().zip(reads) {
        served_by.insert(format!("n{}", read.served_by));
        // A missing account is left out for the checker to flag: stale reads start only once
        // their timestamps are past the opening (`STALE_READS_AFTER`).
        if read.value.is_some() {
            balances.insert(account.clone(), json!(balance(read.value)?));
        }
    }
    let nodes: Vec<String> = served_by.into_iter().collect();
    Ok((Value::Object(balances), nodes.join(",")))
}

/// One transfer; with `early_locks`, both accounts are read for update with early locks
/// (`TxnOptions::early_locks`), which correctness must not depend on.
async fn transfer(
    client: &Client,
    from: String,
    to: String,
    want: i64,
    early_locks: bool,
) -> Result<(), ClientError> {
    let options = TxnOptions {
        early_locks,
        ..options()
    };
    client
        .txn(options, move |txn| {
            let (from, to) = (from.clone(), to.clone());
            Box::pin(async move {
                let (a, b) = match early_locks {
                    true => (
                        txn.get_for_update(from.clone()).await?,
                        txn.get_for_update(to.clone()).await?,
                    ),
                    false => (txn.get(from.clone()).await?, txn.get(to.clone()).await?),
                };
                let (a, b) = (balance(a)?, balance(b)?);
                let amount = want.min(a);
                txn.put(from, (a - amount).to_string())?;
                txn.put(to, (b + amount).to_string())?;
                Ok::<_, ClientError>(())
            })
        })
        .await
        .map(|_| ())
}

/// Records one read of every account by `process` (stale reads if `stale`); returns whether
/// it succeeded.
pub async fn record_read(
    client: &Client,
    recorder: &Recorder,
    accounts: &Arc<Vec<String>>,
    process: u64,
    stale: bool,
) -> bool {
    recorder.record(
        process,
        OpKind::Invoke,
        OpFn::ReadAll,
        BANK_KEY,
        Value::Null,
        None,
        None,
    );
    let read = async {
        match stale {
            true => read_all_stale(client, accounts)
                .await
                .map(|(v, n)| (v, Some(n))),
            false => read_all(client, accounts.clone()).await.map(|v| (v, None)),
        }
    };
    let result = tokio::time::timeout(TXN_BOUND, read).await;
    let (kind, value, error, node) = match result {
        Ok(Ok((balances, node))) => (OpKind::Ok, balances, None, node),
        Ok(Err(e)) => (OpKind::Fail, Value::Null, Some(e.to_string()), None),
        Err(_) => (
            OpKind::Fail,
            Value::Null,
            Some("harness bound".into()),
            None,
        ),
    };
    let ok = kind == OpKind::Ok;
    recorder.record(process, kind, OpFn::ReadAll, BANK_KEY, value, error, node);
    ok
}

/// Two distinct accounts: of one shard, or (half of the time, given two shards) of two.
fn pick_pair(rng: &mut StdRng, groups: &[Vec<String>]) -> (String, String) {
    let first = rng.gen_range(0..groups.len());
    let second = match groups.len() > 1 && rng.gen_bool(CROSS_SHARD_SHARE) {
        true => (first + rng.gen_range(1..groups.len())) % groups.len(),
        false => first,
    };
    let from = rng.gen_range(0..groups[first].len());
    let to = match second == first {
        true => (from + rng.gen_range(1..groups[first].len())) % groups[first].len(),
        false => rng.gen_range(0..groups[second].len()),
    };
    (groups[first][from].clone(), groups[second][to].clone())
}

/// One bank client until `until`.
pub async fn bank_client(
    client: Client,
    recorder: Arc<Recorder>,
    groups: Arc<Vec<Vec<String>>>,
    process: u64,
    seed: u64,
    until: Instant,
) {
    let mut rng = StdRng::seed_from_u64(seed.wrapping_add(process));
    let all: Arc<Vec<String>> = Arc::new(groups.iter().flatten().cloned().collect());
    // Clients start right after the accounts are opened.
    let stale_from = Instant::now() + STALE_READS_AFTER;
    while Instant::now() < until {
        if rng.gen_bool(READ_SHARE) {
            let stale = rng.gen_bool(STALE_READ_SHARE) && Instant::now() >= stale_from;
            record_read(&client, &recorder, &all, process, stale).await;
        } else {
            let (from, to) = pick_pair(&mut rng, &groups);
            let want = rng.gen_range(1..=MAX_TRANSFER);
            let early_locks = rng.gen_bool(EARLY_LOCK_SHARE);
            let logged =
                json!({"from": from, "to": to, "amount": want, "early_locks": early_locks});
            recorder.record(
                process,
                OpKind::Invoke,
                OpFn::Transfer,
                BANK_KEY,
                logged.clone(),
                None,
                None,
            );
            let result =
                tokio::time::timeout(TXN_BOUND, transfer(&client, from, to, want, early_locks))
                    .await;
            let (kind, error) = match result {
                Ok(Ok(())) => (OpKind::Ok, None),
                Ok(Err(e @ ClientError::Ambiguous { .. })) => (OpKind::Info, Some(e.to_string())),
                Ok(Err(e)) => (OpKind::Fail, Some(e.to_string())),
                Err(_) => (
                    OpKind::Info,
                    Some(format!("no answer within the harness bound {TXN_BOUND:?}")),
                ),
            };
            recorder.record(process, kind, OpFn::Transfer, BANK_KEY, logged, error, None);
        }
        tokio::time::sleep(Duration::from_millis(rng.gen_range(0..=MAX_THINK_MS))).await;
    }
}

/// The final read of every account after healing: retried until one succeeds (bounded).
pub async fn final_read(
    client: &Client,
    recorder: &Recorder,
    groups: &[Vec<String>],
    process: u64,
) -> bool {
    let all: Arc<Vec<String>> = Arc::new(groups.iter().flatten().cloned().collect());
    retry_final(|| record_read(client, recorder, &all, process, false)).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use meridian_client::ShardRoute;

    #[test]
    fn accounts_land_in_their_shards() {
        let shard = |id, start: &'static str, end: &'static str| ShardRoute {
            shard_id: id,
            start: Bytes::from(start),
            end: Bytes::from(end),
            replicas: vec![1, 2, 3],
            leader_id: None,
            generation: 1,
        };
        let map = ShardMap::new("c", [shard(1, "", "user3"), shard(2, "user3", "")], []);
        let groups = accounts(&map);
        assert_eq!(
            groups,
            vec![
                vec!["jepsen-acct0-0".to_string(), "jepsen-acct0-1".into()],
                vec![
                    "user3jepsen-acct1-0".to_string(),
                    "user3jepsen-acct1-1".into()
                ],
            ]
        );
        let all: Vec<String> = groups.concat();
        assert_eq!(model(&all).total, 400);
    }

    #[test]
    fn transfers_pair_distinct_accounts_within_and_across_shards() {
        let groups: Vec<Vec<String>> = (0..3)
            .map(|s| (0..2).map(|j| format!("s{s}-{j}")).collect())
            .collect();
        let shard_of = |k: &str| k[1..2].to_string();
        let mut rng = StdRng::seed_from_u64(3);
        let (mut within, mut across) = (0, 0);
        for _ in 0..200 {
            let (from, to) = pick_pair(&mut rng, &groups);
            assert_ne!(from, to);
            match shard_of(&from) == shard_of(&to) {
                true => within += 1,
                false => across += 1,
            }
        }
        assert!(
            within > 50 && across > 50,
            "{within} within, {across} across"
        );
    }
}
