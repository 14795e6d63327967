//! The closed-economy drivers: how each store runs a transfer and a read-only transaction.
//!
//! Every account is one key (named by `EconomyConfig::account`) whose value is its balance in
//! decimal.
//! - **meridian**: `Client::txn` (optimistic, serializable; see `meridian_client::txn`); a
//!   transfer reads both accounts with one `BatchGet` (a locking one, `batch_get_for_update`
//!   under `TxnOptions::early_locks`, with `earlylocks=on`). With `accountspread=oneshard` (the
//!   default) every account is in one shard, so transfers are one-shard commits (one Raft
//!   entry); with `accountspread=shards` the accounts spread over the shards, and a transfer
//!   between two shards is a two-phase commit. Read-only transactions are one snapshot
//!   `BatchGet` per shard and commit nothing.
//! - **etcd**: a transfer gets both accounts with their `mod_revision`s, then a `Txn` that
//!   puts both only if both revisions are unchanged, retried on conflict; a read-only
//!   transaction is one `Txn` of gets (one revision: a snapshot).
//! - **rocksdb**: an `OptimisticTransactionDB` with a snapshot per transaction:
//!   `get_for_update` both accounts, put both, commit (fsynced with `--sync-writes`); a
//!   `Busy`/`TryAgain` commit is a conflict and is retried. Read-only transactions read both
//!   accounts from one snapshot.
//!
//! A transfer returns how many attempts it took; it gives up after [`MAX_TXN_ATTEMPTS`]
//! conflicts (`DbError::Contended`).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;

use crate::db::{DbError, DriverKind, DriverOptions};

/// Conflicts a transfer retries before it fails (all three stores).
pub const MAX_TXN_ATTEMPTS: u32 = 16;
fn parse_balance(key: &str, value: Option<&[u8]>) -> Result<i64, DbError> {
    let value = value.ok_or(DbError::NotFound)?;
    std::str::from_utf8(value)
        .ok()
        .and_then(|t| t.parse().ok())
        .ok_or_else(|| DbError::Backend(format!("{key} holds {value:?}, not a balance")))
}

/// One store's closed-economy operations, shared by all threads.
#[async_trait]
pub trait Economy: Send + Sync {
    /// Writes every account's opening balance (not timed).
    async fn open_accounts(&self, accounts: &[(String, i64)]) -> Result<(), DbError>;
    /// Moves `min(amount, from's balance)` from `from` to `to` atomically; returns the attempts.
    async fn transfer(&self, from: &str, to: &str, amount: i64) -> Result<u32, DbError>;
    /// Reads `accounts` in one read-only transaction; returns the balances and the attempts.
    async fn read(&self, accounts: &[String]) -> Result<(Vec<i64>, u32), DbError>;
}

/// Opens the chosen store's economy driver.
/// Meridian's transactions follow `config.no_wait` and `config.early_locks` (see
/// `EconomyConfig`).
pub async fn open(
    kind: DriverKind,
    options: &DriverOptions,
    config: &super::EconomyConfig,
) -> Result<Arc<dyn Economy>, DbError> {
    match kind {
        DriverKind::Meridian => Ok(Arc::new(
            MeridianEconomy::open(options, config.no_wait, config.early_locks).await?,
        )),
        DriverKind::Etcd => Ok(Arc::new(EtcdEconomy::open(options).await?)),
        DriverKind::Rocksdb => Ok(Arc::new(RocksEconomy::open(options)?)),
    }
}

// ---- meridian ---------------------------------------------------------------------------

struct MeridianEconomy {
    client: meridian_client::Client,
    no_wait: bool,
    early_locks: bool,
}

fn meridian_error(e: meridian_client::Error) -> DbError {
    match e {
        meridian_client::Error::TxnConflict { key } => DbError::Contended {
            key: String::from_utf8_lossy(&key).into_owned(),
            attempts: MAX_TXN_ATTEMPTS,
        },
        meridian_client::Error::TxnUncertain { version_ts } => DbError::Contended {
            key: format!("(uncertain version at {version_ts})"),
            attempts: MAX_TXN_ATTEMPTS,
        },
        other => DbError::Backend(other.to_string()),
    }
}

impl MeridianEconomy {
    async fn open(
        options: &DriverOptions,
        no_wait: bool,
        early_locks: bool,
    ) -> Result<Self, DbError> {
        let client = crate::db::meridian::connect(options).await?;
        Ok(MeridianEconomy {
            client,
            no_wait,
            early_locks,
        })
    }

    fn options(&self) -> meridian_client::TxnOptions {
        meridian_client::TxnOptions {
            max_attempts: MAX_TXN_ATTEMPTS,
            no_wait: self.no_wait,
            early_locks: self.early_locks,
            ..meridian_client::TxnOptions::default()
        }
    }
}

fn meridian_balance(key: &str, value: Option<Bytes>) -> Result<i64, meridian_client::Error> {
    parse_balance(key, value.as_deref()).map_err(|e| meridian_client::Error::InvalidArgument {
        message: e.to_string(),
    })
}

#[async_trait]
impl Economy for MeridianEconomy {
    async fn open_accounts(&self, accounts: &[(String, i64)]) -> Result<(), DbError> {
        // 1,000 = meridian_types::limits::MAX_BATCH_KEYS.
        for chunk in accounts.chunks(1_000) {
            let entries: Vec<(String, String)> = chunk
                .iter()
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .collect();
            self.client
                .batch_put(entries)
                .await
                .map_err(meridian_error)?;
        }
        Ok(())
    }

    async fn transfer(&self, from: &str, to: &str, amount: i64) -> Result<u32, DbError> {
        let (from, to) = (from.to_string(), to.to_string());
        let early_locks = self.early_locks;
        let (_, info) = self
            .client
            .txn(self.options(), move |txn| {
                let (from, to) = (from.clone(), to.clone());
                Box::pin(async move {
                    // Both accounts in one BatchGet, as etcd reads both in one Txn; with
                    // early locks, a locking one (`batch_get` otherwise, the same reads).
                    let mut values = match early_locks {
                        true => txn.batch_get_for_update([from.clone(), to.clone()]).await?,
                        false => txn.batch_get([from.clone(), to.clone()]).await?,
                    };
                    let b = meridian_balance(&to, values.pop().flatten())?;
                    let a = meridian_balance(&from, values.pop().flatten())?;
                    let moved = amount.min(a);
                    txn.put(from, (a - moved).to_string())?;
                    txn.put(to, (b + moved).to_string())?;
                    Ok::<_, meridian_client::Error>(())
                })
            })
            .await
            .map_err(meridian_error)?;
        Ok(info.attempts)
    }

    async fn read(&self, accounts: &[String]) -> Result<(Vec<i64>, u32), DbError> {
        let keys: Arc<Vec<String>> = Arc::new(accounts.to_vec());
        let (balances, info) = self
            .client
            .txn(self.options(), move |txn| {
                let keys = keys.clone();
                Box::pin(async move {
                    let values = txn.batch_get(keys.iter().cloned()).await?;
                    keys.iter()
                        .zip(values)
                        .map(|(k, v)| meridian_balance(k, v))
                        .collect::<Result<Vec<i64>, _>>()
                })
            })
            .await
            .map_err(meridian_error)?;
        Ok((balances, info.attempts))
    }
}

// ---- etcd -------------------------------------------------------------------------------

struct EtcdEconomy {
    client: etcd_client::Client,
    timeout: Duration,
}

use crate::db::etcd::with_deadline as etcd_call;

impl EtcdEconomy {
    async fn open(options: &DriverOptions) -> Result<Self, DbError> {
        if options.endpoints.is_empty() {
            return Err(DbError::Backend(
                "etcd needs --endpoints http://HOST:PORT[,...]".into(),
            ));
        }
        let connect = etcd_client::ConnectOptions::new()
            .with_connect_timeout(options.timeout)
            .with_timeout(options.timeout);
        let client = etcd_call(
            options.timeout,
            etcd_client::Client::connect(&options.endpoints, Some(connect)),
        )
        .await?;
        Ok(EtcdEconomy {
            client,
            timeout: options.timeout,
        })
    }

    /// The balances and `mod_revision`s of `keys`, from one revision.
    async fn snapshot(&self, keys: &[String]) -> Result<Vec<(i64, i64)>, DbError> {
        use etcd_client::{Txn, TxnOp, TxnOpResponse};
        let ops: Vec<TxnOp> = keys.iter().map(|k| TxnOp::get(k.as_str(), None)).collect();
        let mut kv = self.client.kv_client();
        let response = etcd_call(self.timeout, kv.txn(Txn::new().and_then(ops))).await?;
        let mut out = Vec::with_capacity(keys.len());
        for (key, op) in keys.iter().zip(response.op_responses()) {
            let TxnOpResponse::Get(get) = op else {
                return Err(DbError::Backend(
                    "etcd: a get in a txn did not answer a get".into(),
                ));
            };
            let kv = get.kvs().first().ok_or(DbError::NotFound)?;
            out.push((parse_balance(key, Some(kv.value()))?, kv.mod_revision()));
        }
        Ok(out)
    }
}

#[async_trait]
impl Economy for EtcdEconomy {
    async fn open_accounts(&self, accounts: &[(String, i64)]) -> Result<(), DbError> {
        use etcd_client::{Txn, TxnOp};
        let mut kv = self.client.kv_client();
        // etcd's default --max-txn-ops is 128.
        for chunk in accounts.chunks(128) {
            let ops: Vec<TxnOp> = chunk
                .iter()
                .map(|(a, b)| TxnOp::put(a.to_string(), b.to_string(), None))
                .collect();
            etcd_call(self.timeout, kv.txn(Txn::new().and_then(ops))).await?;
        }
        Ok(())
    }

    async fn transfer(&self, from: &str, to: &str, amount: i64) -> Result<u32, DbError> {
        use etcd_client::{Compare, CompareOp, Txn, TxnOp};
        let keys = [from.to_string(), to.to_string()];
        let mut kv = self.client.kv_client();
        for attempt in 1..=MAX_TXN_ATTEMPTS {
            let seen = self.snapshot(&keys).await?;
            let ((a, rev_a), (b, rev_b)) = (seen[0], seen[1]);
            let moved = amount.min(a);
            let txn = Txn::new()
                .when([
                    Compare::mod_revision(keys[0].as_str(), CompareOp::Equal, rev_a),
                    Compare::mod_revision(keys[1].as_str(), CompareOp::Equal, rev_b),
                ])
                .and_then([
                    TxnOp::put(keys[0].as_str(), (a - moved).to_string(), None),
                    TxnOp::put(keys[1].as_str(), (b + moved).to_string(), None),
                ]);
            if etcd_call(self.timeout, kv.txn(txn)).await?.succeeded() {
                return Ok(attempt);
            }
        }
        Err(DbError::Contended {
            key: keys[0].clone(),
            attempts: MAX_TXN_ATTEMPTS,
        })
    }

    async fn read(&self, accounts: &[String]) -> Result<(Vec<i64>, u32), DbError> {
        let keys: Vec<String> = accounts.to_vec();
        let mut balances = Vec::with_capacity(keys.len());
        // One revision per txn; etcd caps a txn at 128 operations.
        for chunk in keys.chunks(128) {
            balances.extend(self.snapshot(chunk).await?.into_iter().map(|(b, _)| b));
        }
        Ok((balances, 1))
    }
}

// ---- rocksdb ----------------------------------------------------------------------------

type TxnDb = rocksdb::OptimisticTransactionDB<rocksdb::MultiThreaded>;

struct RocksEconomy {
    shared: Arc<Rocks>,
}

/// The database and the option objects every transaction reuses (built once at open).
struct Rocks {
    db: TxnDb,
    /// `sync` as `--sync-writes` says.
    write: rocksdb::WriteOptions,
    /// Transfers: conflicts checked against a snapshot taken when the transaction begins.
    snapshot_txn: rocksdb::OptimisticTransactionOptions,
}

fn rocks_error(e: rocksdb::Error) -> DbError {
    DbError::Backend(format!("rocksdb: {e}"))
}

impl RocksEconomy {
    fn open(options: &DriverOptions) -> Result<Self, DbError> {
        let dir = options
            .data_dir
            .as_deref()
            .ok_or_else(|| DbError::Backend("rocksdb needs --data-dir".into()))?;
        let mut opts = rocksdb::Options::default();
        opts.create_if_missing(true);
        let db = TxnDb::open(&opts, Path::new(dir).join("economy")).map_err(rocks_error)?;
        let mut write = rocksdb::WriteOptions::default();
        write.set_sync(options.sync_writes);
        let mut snapshot_txn = rocksdb::OptimisticTransactionOptions::default();
        snapshot_txn.set_snapshot(true);
        Ok(RocksEconomy {
            shared: Arc::new(Rocks {
                db,
                write,
                snapshot_txn,
            }),
        })
    }

    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Rocks) -> Result<T, DbError> + Send + 'static,
    ) -> Result<T, DbError> {
        let shared = self.shared.clone();
        tokio::task::spawn_blocking(move || f(&shared))
            .await
            .map_err(|e| DbError::Backend(format!("rocksdb task: {e}")))?
    }
}

#[async_trait]
impl Economy for RocksEconomy {
    async fn open_accounts(&self, accounts: &[(String, i64)]) -> Result<(), DbError> {
        let accounts = accounts.to_vec();
        self.blocking(move |rocks| {
            let txn = rocks.db.transaction_opt(&rocks.write, &Default::default());
            for (a, b) in &accounts {
                txn.put(a, b.to_string()).map_err(rocks_error)?;
            }
            txn.commit().map_err(rocks_error)
        })
        .await
    }

    async fn transfer(&self, from: &str, to: &str, amount: i64) -> Result<u32, DbError> {
        let keys = [from.to_string(), to.to_string()];
        self.blocking(move |rocks| {
            for attempt in 1..=MAX_TXN_ATTEMPTS {
                let txn = rocks.db.transaction_opt(&rocks.write, &rocks.snapshot_txn);
                let a = txn.get_for_update(&keys[0], true).map_err(rocks_error)?;
                let b = txn.get_for_update(&keys[1], true).map_err(rocks_error)?;
                let (a, b) = (
                    parse_balance(&keys[0], a.as_deref())?,
                    parse_balance(&keys[1], b.as_deref())?,
                );
                let moved = amount.min(a);
                txn.put(&keys[0], (a - moved).to_string())
                    .map_err(rocks_error)?;
                txn.put(&keys[1], (b + moved).to_string())
                    .map_err(rocks_error)?;
                match txn.commit() {
                    Ok(()) => return Ok(attempt),
                    Err(e)
                        if matches!(
                            e.kind(),
                            rocksdb::ErrorKind::Busy | rocksdb::ErrorKind::TryAgain
                        ) => {}
                    Err(e) => return Err(rocks_error(e)),
                }
            }
            Err(DbError::Contended {
                key: keys[0].clone(),
                attempts: MAX_TXN_ATTEMPTS,
            })
        })
        .await
    }

    async fn read(&self, accounts: &[String]) -> Result<(Vec<i64>, u32), DbError> {
        let keys: Vec<String> = accounts.to_vec();
        self.blocking(move |rocks| {
            let snapshot = rocks.db.snapshot();
            let balances = keys
                .iter()
                .map(|k| {
                    let value = snapshot.get(k).map_err(rocks_error)?;
                    parse_balance(k, value.as_deref())
                })
                .collect::<Result<Vec<i64>, DbError>>()?;
            Ok((balances, 1))
        })
        .await
    }
}
