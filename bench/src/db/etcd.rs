//! etcd v3 driver (gRPC API through `etcd-client`), the replicated baseline.
//!
//! Each client thread opens its own connection (a `Client` over the given `--endpoints`; with
//! several endpoints the channel balances requests over them and followers forward writes to the
//! leader), as YCSB gives each thread its own binding instance.
//!
//! - Reads are etcd's default linearizable range reads.
//! - Scan = one range request from `table/start_key` to the end of the table with `limit =
//!   count`, sorted by key ascending (etcd's natural order, so no server-side sort is asked for).
//! - Update = get, merge the changed fields, then a transaction that puts the merged record only
//!   if the key's `mod_revision` is still the one read (compare-and-swap). If another writer got
//!   there first the update starts over, at most [`MAX_UPDATE_ATTEMPTS`] times, then fails as
//!   `ERROR` ([`DbError::Contended`]). So concurrent updates of one record never lose fields.
//! - Every call runs under the per-call deadline (`--timeout-ms`); a call that misses it is an
//!   `ERROR` of kind [`DbError::Timeout`].
//! - Durability is the server's: etcd fsyncs its WAL before acknowledging a write.
//!
//! Not done: TLS and authentication (loopback benchmarking only).

use std::time::Duration;

use async_trait::async_trait;
use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, GetOptions, KvClient, SortOrder, SortTarget, Txn,
    TxnOp,
};

use super::{
    storage_key, table_end_key, Db, DbError, DbThread, DriverOptions, MAX_UPDATE_ATTEMPTS,
};
use crate::record::{self, Record};

/// Largest number of records one scan may ask for (YCSB scans ask for at most `maxscanlength`).
pub const MAX_SCAN_RECORDS: usize = 10_000;

/// The etcd driver: endpoints and deadlines; connections are per thread.
pub struct EtcdDb {
    endpoints: Vec<String>,
    timeout: Duration,
}

impl EtcdDb {
    /// Checks the options and that the cluster answers.
    pub async fn open(options: &DriverOptions) -> Result<Self, DbError> {
        if options.endpoints.is_empty() {
            return Err(DbError::Backend(
                "the etcd driver needs --endpoints http://HOST:PORT[,...]".to_string(),
            ));
        }
        let db = Self {
            endpoints: options.endpoints.clone(),
            timeout: options.timeout,
        };
        // Fail early with a clear message rather than once per thread.
        let mut probe = db.connect().await?;
        let timeout = db.timeout;
        with_deadline(timeout, probe.get("meridian-bench-probe", None)).await?;
        Ok(db)
    }

    async fn connect(&self) -> Result<KvClient, DbError> {
        let connect_options = ConnectOptions::new()
            .with_connect_timeout(self.timeout)
            .with_timeout(self.timeout);
        let client = with_deadline(
            self.timeout,
            Client::connect(&self.endpoints, Some(connect_options)),
        )
        .await
        .map_err(|error| {
            DbError::Backend(format!(
                "cannot connect to etcd at {}: {error}",
                self.endpoints.join(",")
            ))
        })?;
        Ok(client.kv_client())
    }
}

/// Runs an etcd call under a deadline and maps its error.
pub(crate) async fn with_deadline<T>(
    timeout: Duration,
    call: impl std::future::Future<Output = Result<T, etcd_client::Error>>,
) -> Result<T, DbError> {
    match tokio::time::timeout(timeout, call).await {
        Err(_) => Err(DbError::Timeout {
            timeout_ms: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
        }),
        Ok(Err(error)) => Err(DbError::Backend(format!("etcd: {error}"))),
        Ok(Ok(value)) => Ok(value),
    }
}

#[async_trait]
impl Db for EtcdDb {
    async fn new_thread(&self) -> Result<Box<dyn DbThread>, DbError> {
        Ok(Box::new(EtcdThread {
            kv: self.connect().await?,
            timeout: self.timeout,
        }))
    }
}

struct EtcdThread {
    kv: KvClient,
    timeout: Duration,
}

#[async_trait]
impl DbThread for EtcdThread {
    async fn read(
        &mut self,
        table: &str,
        key: &str,
        fields: Option<&[String]>,
    ) -> Result<Option<Record>, DbError> {
        let response =
            with_deadline(self.timeout, self.kv.get(storage_key(table, key), None)).await?;
        match response.kvs().first() {
            None => Ok(None),
            Some(found) => Ok(Some(record::decode(found.value(), fields)?)),
        }
    }

    async fn scan(
        &mut self,
        table: &str,
        start_key: &str,
        count: usize,
        fields: Option<&[String]>,
    ) -> Result<Vec<Record>, DbError> {
        let limit = count.min(MAX_SCAN_RECORDS);
        let options = GetOptions::new()
            .with_range(table_end_key(table))
            .with_limit(limit as i64)
            .with_sort(SortTarget::Key, SortOrder::Ascend);
        let response = with_deadline(
            self.timeout,
            self.kv.get(storage_key(table, start_key), Some(options)),
        )
        .await?;
        response
            .kvs()
            .iter()
            .map(|found| record::decode(found.value(), fields).map_err(DbError::from))
            .collect()
    }

    async fn update(&mut self, table: &str, key: &str, values: &Record) -> Result<(), DbError> {
        let key_bytes = storage_key(table, key);
        for _ in 0..MAX_UPDATE_ATTEMPTS {
            let response =
                with_deadline(self.timeout, self.kv.get(key_bytes.clone(), None)).await?;
            let current = response.kvs().first().ok_or(DbError::NotFound)?;
            let revision = current.mod_revision();
            let merged = record::merge_encoded(current.value(), values)?;
            let swap = Txn::new()
                .when([Compare::mod_revision(
                    key_bytes.clone(),
                    CompareOp::Equal,
                    revision,
                )])
                .and_then([TxnOp::put(key_bytes.clone(), merged, None)]);
            let outcome = with_deadline(self.timeout, self.kv.txn(swap)).await?;
            if outcome.succeeded() {
                return Ok(());
            }
        }
        Err(DbError::Contended {
            key: key.to_string(),
            attempts: MAX_UPDATE_ATTEMPTS,
        })
    }

    async fn insert(&mut self, table: &str, key: &str, values: &Record) -> Result<(), DbError> {
        let encoded = record::encode(values)?;
        with_deadline(
            self.timeout,
            self.kv.put(storage_key(table, key), encoded, None),
        )
        .await?;
        Ok(())
    }

    async fn delete(&mut self, table: &str, key: &str) -> Result<(), DbError> {
        let response =
            with_deadline(self.timeout, self.kv.delete(storage_key(table, key), None)).await?;
        if response.deleted() == 0 {
            return Err(DbError::NotFound);
        }
        Ok(())
    }
}
