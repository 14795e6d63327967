//! The database driver interface (YCSB's `DB` class) and the driver registry.
//!
//! A driver is opened once per benchmark run ([`Db`]) and hands each client thread its own
//! [`DbThread`], as YCSB gives each thread its own `DB` instance: per-thread state such as a
//! connection or a scratch buffer lives there, shared state (a RocksDB handle, a connection
//! pool) in the [`Db`].
//!
//! Every driver stores a record as one key, `"<table>/<key>"` ([`storage_key`]), whose value is
//! the [`crate::record`] encoding of all its fields. An update is a read-modify-write of that
//! value inside the driver (get, decode, merge the changed fields, encode, put); each driver says
//! how it keeps that atomic against concurrent updates of the same key.
//!
//! Outcomes map onto YCSB's status names in the report: `Ok` is `OK`, a missing record
//! ([`DbError::NotFound`], or `Ok(None)` from `read`) is `NOT_FOUND`, anything else `ERROR`.
//!
//! Drivers: [`rocksdb`] (embedded), [`etcd`] (v3 gRPC API), [`meridian`] (`meridian-client`).

pub mod etcd;
pub mod meridian;
pub mod rocksdb;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::record::{Record, RecordError};

/// Separator between the table name and the record key in a storage key.
pub const TABLE_SEPARATOR: u8 = b'/';

/// Compare-and-swap attempts an update makes before it gives up (etcd and Meridian drivers).
pub const MAX_UPDATE_ATTEMPTS: u32 = 16;

/// Errors a driver returns.
#[derive(Debug, thiserror::Error)]
pub enum DbError {
    /// The record does not exist (YCSB `NOT_FOUND`).
    #[error("record not found")]
    NotFound,
    /// The call did not finish within the driver's deadline.
    #[error("operation timed out after {timeout_ms} ms")]
    Timeout { timeout_ms: u64 },
    /// A stored value is not a valid record.
    #[error("stored record is malformed: {0}")]
    Record(RecordError),
    /// A conditional update lost to concurrent writers too many times.
    #[error("update of {key} lost {attempts} compare-and-swap races")]
    Contended { key: String, attempts: u32 },
    /// The backend failed.
    #[error("{0}")]
    Backend(String),
}

// Not `#[from]`: that would also make the record error the `source`, and error chains printed
// with `{:#}` would repeat it.
impl From<RecordError> for DbError {
    fn from(error: RecordError) -> Self {
        DbError::Record(error)
    }
}

impl DbError {
    /// The YCSB status name reported for this error.
    pub fn status_name(&self) -> &'static str {
        match self {
            DbError::NotFound => "NOT_FOUND",
            _ => "ERROR",
        }
    }
}

/// Shared state of one driver for a benchmark run.
#[async_trait]
pub trait Db: Send + Sync {
    /// Per-thread state for one client thread.
    async fn new_thread(&self) -> Result<Box<dyn DbThread>, DbError>;

    /// Called once after all threads finished (flush, close).
    async fn close(&self) -> Result<(), DbError> {
        Ok(())
    }
}

/// One client thread's view of the driver (YCSB's `DB` instance).
#[async_trait]
pub trait DbThread: Send {
    /// Reads a record; `fields` limits the returned fields (`None`: all). `Ok(None)` when absent.
    async fn read(
        &mut self,
        table: &str,
        key: &str,
        fields: Option<&[String]>,
    ) -> Result<Option<Record>, DbError>;

    /// Reads up to `count` records in key order starting at `start_key` (inclusive).
    async fn scan(
        &mut self,
        table: &str,
        start_key: &str,
        count: usize,
        fields: Option<&[String]>,
    ) -> Result<Vec<Record>, DbError>;

    /// Replaces the given fields of an existing record, keeping the others.
    /// [`DbError::NotFound`] when the record does not exist.
    async fn update(&mut self, table: &str, key: &str, values: &Record) -> Result<(), DbError>;

    /// Writes a whole record (overwriting any existing one).
    async fn insert(&mut self, table: &str, key: &str, values: &Record) -> Result<(), DbError>;

    /// Deletes a record.
    async fn delete(&mut self, table: &str, key: &str) -> Result<(), DbError>;

    /// Called once when the thread is done.
    async fn cleanup(&mut self) -> Result<(), DbError> {
        Ok(())
    }
}

/// Which driver to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DriverKind {
    Meridian,
    Etcd,
    Rocksdb,
}

/// Driver options from the command line.
#[derive(Debug, Clone)]
pub struct DriverOptions {
    /// Server endpoints (etcd, meridian).
    pub endpoints: Vec<String>,
    /// Data directory (rocksdb).
    pub data_dir: Option<PathBuf>,
    /// Deadline for each call (etcd, meridian).
    pub timeout: Duration,
    /// Whether writes wait for the disk (rocksdb `sync`; etcd always syncs).
    pub sync_writes: bool,
}

/// Opens the chosen driver.
pub async fn open(kind: DriverKind, options: &DriverOptions) -> Result<Arc<dyn Db>, DbError> {
    match kind {
        DriverKind::Rocksdb => Ok(Arc::new(rocksdb::RocksDb::open(options)?)),
        DriverKind::Etcd => Ok(Arc::new(etcd::EtcdDb::open(options).await?)),
        DriverKind::Meridian => meridian::open(options).await,
    }
}

/// The storage key of record `key` in `table`: `table ‖ '/' ‖ key`.
pub fn storage_key(table: &str, key: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(table.len() + 1 + key.len());
    out.extend_from_slice(table.as_bytes());
    out.push(TABLE_SEPARATOR);
    out.extend_from_slice(key.as_bytes());
    out
}

/// The first storage key after every key of `table` (exclusive upper bound of a table scan).
pub fn table_end_key(table: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(table.len() + 1);
    out.extend_from_slice(table.as_bytes());
    out.push(TABLE_SEPARATOR + 1);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Table keys sort between the table's prefix and its end key.
    #[test]
    fn storage_keys_sort_inside_table_bounds() {
        let key = storage_key("usertable", "user123");
        assert_eq!(key, b"usertable/user123".to_vec());
        assert!(key.as_slice() < table_end_key("usertable").as_slice());
        assert!(storage_key("usertable", "").as_slice() < key.as_slice());
        assert!(table_end_key("usertable").as_slice() < storage_key("usertablf", "").as_slice());
    }
}
