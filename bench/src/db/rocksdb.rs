//! Embedded RocksDB driver: the storage limit that the replicated stores are compared with.
//!
//! One `DB` per benchmark run in `--data-dir`, shared by all client threads. Each record is one
//! key (see [`super::storage_key`]) holding the [`crate::record`] encoding.
//!
//! - Durability: the WAL is on; writes do not fsync unless `sync_writes` is set (RocksDB's own
//!   default, and what YCSB's RocksDB binding does), so this measures the engine, not the disk.
//! - Option objects: `Options`, the point-read `ReadOptions` and the `WriteOptions` are built once
//!   at open and reused by every call. Scans build a `ReadOptions` per iterator because the
//!   `rocksdb` crate moves it into the iterator (and frees it when the iterator drops).
//! - Blocking: every RocksDB call runs in `tokio::task::spawn_blocking`, never on the reactor.
//! - Atomic updates: an update is get → decode → merge → encode → put. To keep concurrent updates
//!   of one key from losing each other's fields, writers of a key hold one of
//!   [`UPDATE_LOCK_STRIPES`] mutexes chosen by the key's hash for the duration of the
//!   read-modify-write (inserts and deletes take it too). Readers take no lock.
//!
//! Not done: column families per table (tables are key prefixes), tuning beyond the defaults
//! plus LZ4 compression (the only codec the workspace builds RocksDB with).

use std::hash::{Hash, Hasher};
use std::path::Path;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use rocksdb::{DBCompressionType, Direction, IteratorMode, Options, ReadOptions, WriteOptions, DB};

use super::{storage_key, table_end_key, Db, DbError, DbThread, DriverOptions};
use crate::record::{self, Record};

/// Number of mutexes that serialise writers of the same key.
pub const UPDATE_LOCK_STRIPES: usize = 1024;

struct Shared {
    db: DB,
    point_read_options: ReadOptions,
    write_options: WriteOptions,
    update_locks: Vec<Mutex<()>>,
}

impl Shared {
    fn lock_for(&self, key: &[u8]) -> std::sync::MutexGuard<'_, ()> {
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        key.hash(&mut hasher);
        let stripe = (hasher.finish() % UPDATE_LOCK_STRIPES as u64) as usize;
        // A poisoned stripe only means another thread panicked mid-update; the data is in
        // RocksDB, not behind the mutex, so carrying on is safe.
        self.update_locks[stripe]
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// The embedded RocksDB driver.
pub struct RocksDb {
    shared: Arc<Shared>,
}

impl RocksDb {
    /// Opens (creating if needed) the database in `options.data_dir`.
    pub fn open(options: &DriverOptions) -> Result<Self, DbError> {
        let data_dir = options.data_dir.as_deref().ok_or_else(|| {
            DbError::Backend("the rocksdb driver needs --data-dir <DIR>".to_string())
        })?;
        Self::open_at(data_dir, options.sync_writes)
    }

    fn open_at(data_dir: &Path, sync_writes: bool) -> Result<Self, DbError> {
        let mut db_options = Options::default();
        db_options.create_if_missing(true);
        db_options.set_compression_type(DBCompressionType::Lz4);
        let db = DB::open(&db_options, data_dir).map_err(|error| {
            DbError::Backend(format!(
                "cannot open rocksdb at {}: {error}",
                data_dir.display()
            ))
        })?;
        let mut write_options = WriteOptions::default();
        write_options.set_sync(sync_writes);
        write_options.disable_wal(false);
        Ok(Self {
            shared: Arc::new(Shared {
                db,
                point_read_options: ReadOptions::default(),
                write_options,
                update_locks: (0..UPDATE_LOCK_STRIPES).map(|_| Mutex::new(())).collect(),
            }),
        })
    }
}

#[async_trait]
impl Db for RocksDb {
    async fn new_thread(&self) -> Result<Box<dyn DbThread>, DbError> {
        Ok(Box::new(RocksDbThread {
            shared: Arc::clone(&self.shared),
        }))
    }

    async fn close(&self) -> Result<(), DbError> {
        let shared = Arc::clone(&self.shared);
        blocking(move || shared.db.flush_wal(true).map_err(backend)).await
    }
}

struct RocksDbThread {
    shared: Arc<Shared>,
}

fn backend(error: rocksdb::Error) -> DbError {
    DbError::Backend(format!("rocksdb: {error}"))
}

async fn blocking<T, F>(work: F) -> Result<T, DbError>
where
    F: FnOnce() -> Result<T, DbError> + Send + 'static,
    T: Send + 'static,
{
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|error| DbError::Backend(format!("rocksdb worker failed: {error}")))?
}

#[async_trait]
impl DbThread for RocksDbThread {
    async fn read(
        &mut self,
        table: &str,
        key: &str,
        fields: Option<&[String]>,
    ) -> Result<Option<Record>, DbError> {
        let shared = Arc::clone(&self.shared);
        let key = storage_key(table, key);
        let fields = fields.map(<[String]>::to_vec);
        blocking(move || {
            let value = shared
                .db
                .get_pinned_opt(&key, &shared.point_read_options)
                .map_err(backend)?;
            match value {
                None => Ok(None),
                Some(bytes) => Ok(Some(record::decode(&bytes, fields.as_deref())?)),
            }
        })
        .await
    }

    async fn scan(
        &mut self,
        table: &str,
        start_key: &str,
        count: usize,
        fields: Option<&[String]>,
    ) -> Result<Vec<Record>, DbError> {
        let shared = Arc::clone(&self.shared);
        let start = storage_key(table, start_key);
        let end = table_end_key(table);
        let fields = fields.map(<[String]>::to_vec);
        blocking(move || {
            let mut scan_options = ReadOptions::default();
            scan_options.set_iterate_upper_bound(end);
            let iterator = shared.db.iterator_opt(
                IteratorMode::From(start.as_slice(), Direction::Forward),
                scan_options,
            );
            let mut records = Vec::with_capacity(count);
            for item in iterator.take(count) {
                let (_, value) = item.map_err(backend)?;
                records.push(record::decode(&value, fields.as_deref())?);
            }
            Ok(records)
        })
        .await
    }

    async fn update(&mut self, table: &str, key: &str, values: &Record) -> Result<(), DbError> {
        let shared = Arc::clone(&self.shared);
        let key = storage_key(table, key);
        let values = values.clone();
        blocking(move || {
            let _guard = shared.lock_for(&key);
            let current = shared
                .db
                .get_pinned_opt(&key, &shared.point_read_options)
                .map_err(backend)?
                .ok_or(DbError::NotFound)?;
            let merged = record::merge_encoded(&current, &values)?;
            drop(current);
            shared
                .db
                .put_opt(&key, merged, &shared.write_options)
                .map_err(backend)
        })
        .await
    }

    async fn insert(&mut self, table: &str, key: &str, values: &Record) -> Result<(), DbError> {
        let shared = Arc::clone(&self.shared);
        let key = storage_key(table, key);
        let encoded = record::encode(values)?;
        blocking(move || {
            let _guard = shared.lock_for(&key);
            shared
                .db
                .put_opt(&key, encoded, &shared.write_options)
                .map_err(backend)
        })
        .await
    }

    async fn delete(&mut self, table: &str, key: &str) -> Result<(), DbError> {
        let shared = Arc::clone(&self.shared);
        let key = storage_key(table, key);
        blocking(move || {
            let _guard = shared.lock_for(&key);
            shared
                .db
                .delete_opt(&key, &shared.write_options)
                .map_err(backend)
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record_with(field: &str, value: &[u8]) -> Record {
        let mut record = Record::new();
        record.insert(field.to_string(), value.to_vec());
        record
    }

    /// Insert, read, update (keeping other fields), scan in key order and delete all work.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn crud_and_scan() {
        let dir = tempfile::tempdir().expect("temp dir");
        let db = RocksDb::open_at(dir.path(), false).expect("opens");
        let mut thread = db.new_thread().await.expect("thread");
        let mut full = record_with("field0", b"a");
        full.insert("field1".into(), b"b".to_vec());
        for key in ["user3", "user1", "user2"] {
            thread
                .insert("usertable", key, &full)
                .await
                .expect("insert");
        }
        thread
            .insert("othertable", "user0", &full)
            .await
            .expect("insert");
        thread
            .update("usertable", "user1", &record_with("field1", b"z"))
            .await
            .expect("update");
        let read = thread
            .read("usertable", "user1", None)
            .await
            .expect("read")
            .expect("present");
        assert_eq!(read["field0"], b"a".to_vec());
        assert_eq!(read["field1"], b"z".to_vec());
        let wanted = vec!["field1".to_string()];
        let scanned = thread
            .scan("usertable", "user1", 10, Some(&wanted))
            .await
            .expect("scan");
        assert_eq!(scanned.len(), 3, "scan stays inside the table");
        assert_eq!(scanned[0]["field1"], b"z".to_vec());
        assert_eq!(scanned[1]["field1"], b"b".to_vec());
        assert!(matches!(
            thread
                .update("usertable", "nobody", &full)
                .await
                .expect_err("missing"),
            DbError::NotFound
        ));
        thread.delete("usertable", "user1").await.expect("delete");
        assert!(thread
            .read("usertable", "user1", None)
            .await
            .expect("read")
            .is_none());
        db.close().await.expect("close");
    }
}
