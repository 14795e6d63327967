//! The Meridian driver: a cluster reached through the `meridian-client` crate.
//!
//! - Keys: Meridian has one keyspace and no tables. Records of YCSB's default table
//!   `usertable` are stored under their bare key (`user6284…`), which is the shape the
//!   cluster's default pre-split points are laid out for; any other table is namespaced as
//!   `table/key` ([`super::storage_key`]). The value is the shared [`crate::record`] encoding.
//! - Reads are linearizable (the client's default): leader lease, or a ReadIndex round.
//! - Updates: optimistic read-modify-write, as the etcd driver does it: get the record with
//!   its version, merge the fields, and `compare_and_swap` on that version; if another update
//!   got there first the update starts over, at most [`MAX_UPDATE_ATTEMPTS`] times, then fails
//!   as `ERROR` ([`DbError::Contended`]). The shard checks the version when it applies the
//!   swap, so concurrent updates never lose fields, from any number of processes, and no lock
//!   in the benchmark process queues hot keys.
//! - Scans: `client.scan` from the start key, paging across shards, at one read timestamp.
//! - Every call has the client's per-call deadline (`--timeout-ms`), retries included.

use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use meridian_client::{CasOutcome, Client, ClientConfig, Expect};

use super::{storage_key, Db, DbError, DbThread, DriverOptions, MAX_UPDATE_ATTEMPTS};
use crate::record::{self, Record};

/// YCSB's default table, stored without a prefix.
pub const DEFAULT_TABLE: &str = "usertable";

struct Shared {
    client: Client,
}

pub struct MeridianDb {
    shared: Arc<Shared>,
}

/// The Meridian key of record `key` in `table`.
pub fn meridian_key(table: &str, key: &str) -> Bytes {
    if table == DEFAULT_TABLE {
        Bytes::copy_from_slice(key.as_bytes())
    } else {
        Bytes::from(storage_key(table, key))
    }
}

fn backend(e: meridian_client::Error) -> DbError {
    DbError::Backend(e.to_string())
}

/// Opens the Meridian driver against `--endpoints` (client addresses, `host:port`).
pub async fn open(options: &DriverOptions) -> Result<Arc<dyn Db>, DbError> {
    let client = connect(options).await?;
    Ok(Arc::new(MeridianDb {
        shared: Arc::new(Shared { client }),
    }))
}

/// A client for `--endpoints` with the driver's deadlines (also the economy driver's).
pub(crate) async fn connect(options: &DriverOptions) -> Result<Client, DbError> {
    if options.endpoints.is_empty() {
        return Err(DbError::Backend(
            "meridian driver needs --endpoints host:port[,...]".into(),
        ));
    }
    let seeds: Vec<String> = options
        .endpoints
        .iter()
        .map(|e| {
            e.trim_start_matches("http://")
                .trim_end_matches('/')
                .to_string()
        })
        .collect();
    let mut config = ClientConfig::new(seeds);
    config.call_timeout = options.timeout;
    config.rpc_timeout = options.timeout.min(config.rpc_timeout);
    Client::connect(config).await.map_err(backend)
}

#[async_trait]
impl Db for MeridianDb {
    async fn new_thread(&self) -> Result<Box<dyn DbThread>, DbError> {
        Ok(Box::new(MeridianThread {
            shared: Arc::clone(&self.shared),
        }))
    }
}

struct MeridianThread {
    shared: Arc<Shared>,
}

#[async_trait]
impl DbThread for MeridianThread {
    async fn read(
        &mut self,
        table: &str,
        key: &str,
        fields: Option<&[String]>,
    ) -> Result<Option<Record>, DbError> {
        match self
            .shared
            .client
            .get(meridian_key(table, key))
            .await
            .map_err(backend)?
        {
            None => Ok(None),
            Some(bytes) => Ok(Some(record::decode(&bytes, fields)?)),
        }
    }

    async fn scan(
        &mut self,
        table: &str,
        start_key: &str,
        count: usize,
        fields: Option<&[String]>,
    ) -> Result<Vec<Record>, DbError> {
        let start = meridian_key(table, start_key);
        // Bare keys of the default table run to the end of the keyspace; a namespaced table
        // stops at its prefix's end.
        let end = (table != DEFAULT_TABLE).then(|| Bytes::from(super::table_end_key(table)));
        let limit = u32::try_from(count.max(1)).unwrap_or(u32::MAX);
        let rows = self
            .shared
            .client
            .scan(start, end, limit, false)
            .await
            .map_err(backend)?;
        rows.iter()
            .map(|kv| Ok(record::decode(&kv.value, fields)?))
            .collect()
    }

    async fn update(&mut self, table: &str, key: &str, values: &Record) -> Result<(), DbError> {
        let storage = meridian_key(table, key);
        let client = &self.shared.client;
        let mut current = client
            .get_versioned(storage.clone())
            .await
            .map_err(backend)?
            .ok_or(DbError::NotFound)?;
        for _ in 0..MAX_UPDATE_ATTEMPTS {
            let merged = Bytes::from(record::merge_encoded(&current.value, values)?);
            let expect = Expect::Version(current.version_ts);
            match client
                .compare_and_swap(storage.clone(), expect, Some(merged))
                .await
                .map_err(backend)?
            {
                CasOutcome::Swapped { .. } => return Ok(()),
                // Another update won: merge into what it wrote (the mismatch carries it).
                CasOutcome::Mismatch { current: Some(now) } => current = now,
                CasOutcome::Mismatch { current: None } => return Err(DbError::NotFound),
            }
        }
        Err(DbError::Contended {
            key: key.to_string(),
            attempts: MAX_UPDATE_ATTEMPTS,
        })
    }

    async fn insert(&mut self, table: &str, key: &str, values: &Record) -> Result<(), DbError> {
        let key = meridian_key(table, key);
        let encoded = record::encode(values)?;
        self.shared
            .client
            .put(key, encoded)
            .await
            .map_err(backend)?;
        Ok(())
    }

    async fn delete(&mut self, table: &str, key: &str) -> Result<(), DbError> {
        let key = meridian_key(table, key);
        self.shared.client.delete(key).await.map_err(backend)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The default table maps to bare keys (matching the cluster's default split points).
    #[test]
    fn default_table_keys_are_bare() {
        assert_eq!(
            meridian_key("usertable", "user1"),
            Bytes::from_static(b"user1")
        );
        assert_eq!(
            meridian_key("other", "user1"),
            Bytes::from_static(b"other/user1")
        );
    }
}
