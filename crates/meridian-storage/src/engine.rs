//! The storage engine trait: a small, blocking, column-family-aware key-value interface.
//!
//! Everything above this module (the Raft log store, the state machine, MVCC, transactions)
//! talks to an [`Engine`], never to RocksDB directly. Two engines implement it:
//! [`RocksEngine`](crate::RocksEngine) for real nodes and [`MemoryEngine`](crate::MemoryEngine)
//! for tests and deterministic simulation. Both pass the same conformance suite
//! (`crate::conformance`, behind the `testing` feature).
//!
//! ```text
//!   raft log store ──┐                 ┌── Cf::RaftLog     shard ‖ index
//!   state machine ───┼── Engine ──────►├── Cf::RaftMeta    shard ‖ kind, reserved keys
//!   mvcc / txn ──────┘   (this trait)  ├── Cf::Data        space ‖ key ‖ !ts (+ slot),
//!                                      │                   01 ‖ shard ‖ … (shard-local)
//!                                      ├── Cf::Intents     (reserved, unused)
//!                                      └── Cf::TxnRecords  (reserved, unused)
//! ```
//!
//! # Durability contract
//! - `write(batch, sync = true)` returns only after the batch **and every earlier write** are
//!   durable (the WAL is fsynced).
//! - `write(batch, sync = false)` is atomic and ordered but may be lost on a crash. After a
//!   crash, the writes that survive are a *prefix* of the write order: a lost write implies
//!   every later write is lost too (RocksDB has one WAL for all column families, so this
//!   holds across column families).
//! - A batch is all-or-nothing, across column families. The state machine relies on this to
//!   persist its applied index in the same batch as the data it applied.
//!
//! # Invariants
//! - Keys are compared as plain bytes; every column family is totally ordered by bytewise order.
//! - Engine calls block. Async callers use `spawn_blocking` or a dedicated pool.
//!
//! # Not done yet
//! - No engine-level snapshots (consistent multi-call reads): a `scan` iterator sees one
//!   point-in-time view, but two calls may see different states.
//! - No range-scoped compaction or size estimates (needed for size-based splits).

use crate::error::{Error, Result};
use crate::keys;
use std::path::Path;

/// Largest single key or value that a `WriteBatch` op or a snapshot file entry may carry.
/// Well above `meridian_types::limits::MAX_VALUE_BYTES` plus key overhead; it exists so a
/// corrupt length prefix cannot make a reader allocate unbounded memory.
pub const MAX_ENTRY_BYTES: usize = 64 * 1024 * 1024;

/// The column families of a node's single database. Every key in every family is prefixed by
/// its shard id (never one family per shard: that does not scale past hundreds of shards).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Cf {
    /// Raft log entries: [`keys::raft_log_key`].
    RaftLog,
    /// Raft hard state, applied state, membership, snapshot meta: [`keys::raft_meta_key`],
    /// plus node-wide reserved keys (format version, cluster id).
    RaftMeta,
    /// MVCC versions ([`keys::data_key`]) and latest-version slots ([`keys::data_slot_key`]).
    Data,
    /// Provisional transaction writes (intents).
    Intents,
    /// Transaction records.
    TxnRecords,
}

impl Cf {
    pub const ALL: [Cf; 5] = [
        Cf::RaftLog,
        Cf::RaftMeta,
        Cf::Data,
        Cf::Intents,
        Cf::TxnRecords,
    ];

    /// The RocksDB column family name. Stable: it is part of the on-disk format.
    pub fn name(self) -> &'static str {
        match self {
            Cf::RaftLog => "raft_log",
            Cf::RaftMeta => "raft_meta",
            Cf::Data => "data",
            Cf::Intents => "intents",
            Cf::TxnRecords => "txn_records",
        }
    }

    /// Dense index 0..5, for per-family arrays.
    pub fn index(self) -> usize {
        match self {
            Cf::RaftLog => 0,
            Cf::RaftMeta => 1,
            Cf::Data => 2,
            Cf::Intents => 3,
            Cf::TxnRecords => 4,
        }
    }
}

impl std::fmt::Display for Cf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A key and its value.
pub type KvPair = (Vec<u8>, Vec<u8>);

/// `[start, end)` of one column family's keys.
pub type KeyRange<'a> = (&'a [u8], &'a [u8]);

/// Refuses `ranges` unless they are ascending and disjoint (an empty range, `start >= end`,
/// is allowed anywhere and holds nothing).
pub fn check_ranges(ranges: &[KeyRange<'_>]) -> Result<()> {
    let mut previous_end: Option<&[u8]> = None;
    for &(start, end) in ranges.iter().filter(|(s, e)| s < e) {
        if previous_end.is_some_and(|p| start < p) {
            return Err(crate::error::Error::Io(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "key ranges must be ascending and disjoint",
            )));
        }
        previous_end = Some(end);
    }
    Ok(())
}

/// Whether `key` lies in one of `ranges`.
pub fn in_ranges(ranges: &[KeyRange<'_>], key: &[u8]) -> bool {
    ranges.iter().any(|&(s, e)| key >= s && key < e)
}

/// The iterator [`Engine::scan`] returns.
pub type KvIter<'a> = Box<dyn Iterator<Item = Result<KvPair>> + 'a>;

/// One operation of a [`WriteBatch`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BatchOp {
    Put {
        cf: Cf,
        key: Vec<u8>,
        value: Vec<u8>,
    },
    Delete {
        cf: Cf,
        key: Vec<u8>,
    },
    /// Deletes every key in `[start, end)`. Always `start < end` (empty ranges are dropped).
    DeleteRange {
        cf: Cf,
        start: Vec<u8>,
        end: Vec<u8>,
    },
}

/// An atomic batch of writes across column families, applied in insertion order.
#[derive(Default, Debug, Clone)]
pub struct WriteBatch {
    ops: Vec<BatchOp>,
    size_bytes: usize,
}

impl WriteBatch {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn put(&mut self, cf: Cf, key: impl Into<Vec<u8>>, value: impl Into<Vec<u8>>) {
        let (key, value) = (key.into(), value.into());
        self.size_bytes += key.len() + value.len();
        self.ops.push(BatchOp::Put { cf, key, value });
    }

    pub fn delete(&mut self, cf: Cf, key: impl Into<Vec<u8>>) {
        let key = key.into();
        self.size_bytes += key.len();
        self.ops.push(BatchOp::Delete { cf, key });
    }

    /// Deletes every key in `[start, end)`. An empty or inverted range (`start >= end`) is a
    /// no-op and is not recorded, so every engine treats it the same way.
    pub fn delete_range(&mut self, cf: Cf, start: impl Into<Vec<u8>>, end: impl Into<Vec<u8>>) {
        let (start, end) = (start.into(), end.into());
        if start >= end {
            return;
        }
        self.size_bytes += start.len() + end.len();
        self.ops.push(BatchOp::DeleteRange { cf, start, end });
    }

    /// Number of operations.
    pub fn len(&self) -> usize {
        self.ops.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// Sum of the key and value bytes of all operations (not the encoded RocksDB batch size).
    pub fn size_bytes(&self) -> usize {
        self.size_bytes
    }

    /// Appends `other`'s operations after this batch's.
    pub fn extend(&mut self, other: WriteBatch) {
        self.size_bytes += other.size_bytes;
        self.ops.extend(other.ops);
    }

    /// The operations in application order.
    pub fn ops(&self) -> &[BatchOp] {
        &self.ops
    }

    /// Takes the operations out of the batch.
    pub fn into_ops(self) -> Vec<BatchOp> {
        self.ops
    }
}

/// A blocking storage engine. Callers on async code call it from `spawn_blocking` or a
/// dedicated pool.
///
/// Durability contract: `write(batch, sync = true)` returns only after the batch and every
/// earlier write are durable (fsync); `write(batch, false)` is atomic and ordered but may be
/// lost on crash, and after a crash the surviving writes are a prefix of the write order. A
/// batch is all-or-nothing across column families.
/// Key the default [`Engine::sync_wal`] writes (node-wide, after every shard's keys).
pub const SYNC_MARKER_KEY: &[u8] = b"\xff\xff\xff\xff\xff\xff\xff\xffsync_marker";

pub trait Engine: Send + Sync + 'static {
    fn get(&self, cf: Cf, key: &[u8]) -> Result<Option<Vec<u8>>>;

    /// Values for `keys`, in the same order as `keys`. Uses RocksDB's batched MultiGet;
    /// callers should pass keys sorted ascending (the engine detects it and tells RocksDB,
    /// which then skips its own sort). Unsorted input and duplicates are allowed. MVCC point
    /// reads and BatchGet are served by this (exact latest-version slot keys, see `mvcc`).
    fn multi_get(&self, cf: Cf, keys: &[&[u8]]) -> Result<Vec<Option<Vec<u8>>>>;

    /// Key-ordered iteration over `[start, end)` (`end = None`: to the end of the family),
    /// ascending or (`reverse`) descending. The iterator sees one point-in-time view.
    fn scan<'a>(&'a self, cf: Cf, start: &[u8], end: Option<&[u8]>, reverse: bool) -> KvIter<'a>;

    /// Applies `batch` atomically; see the trait docs for what `sync` promises.
    fn write(&self, batch: WriteBatch, sync: bool) -> Result<()>;

    /// Flushes memtables and the WAL to disk (graceful shutdown, before snapshots).
    fn flush(&self) -> Result<()>;

    /// Makes every write issued so far durable (fsyncs the write-ahead log) without blocking
    /// writers that run concurrently. This is what group commit is built on: many unsynced
    /// writes, then one `sync_wal`. A `write(batch, sync = true)` would instead hold RocksDB's
    /// write queue for the whole fsync. The default issues a tiny synced write.
    fn sync_wal(&self) -> Result<()> {
        let mut marker = WriteBatch::new();
        marker.put(Cf::RaftMeta, SYNC_MARKER_KEY.to_vec(), Vec::new());
        self.write(marker, true)
    }

    /// Writes every key of `cf` in the `ranges` (each `[start, end)`, ascending and disjoint,
    /// see [`check_ranges`]) into one file at `path` (created or truncated) and returns the
    /// number of keys written. With 0 keys no file is created and `Ok(0)` is returned. The file
    /// format is engine-specific (an SST file for RocksDB); a file is only meant to be ingested
    /// by the same kind of engine. For file-based Raft snapshots (a shard's data span and its
    /// shard-local keys).
    fn export_sst(&self, cf: Cf, ranges: &[KeyRange<'_>], path: &Path) -> Result<u64>;

    /// Replaces `cf`'s `ranges` with the contents of the file at `path` (as written by
    /// `export_sst` for the same ranges); `path = None` just clears them. Keys between the
    /// ranges are untouched. The file must hold only keys inside the ranges. The caller must
    /// record "snapshot installed" (e.g. the applied state) only after this returns: a crash
    /// in the middle can leave the ranges cleared but not yet filled, and redoing the install
    /// fixes that.
    fn ingest_sst(&self, cf: Cf, ranges: &[KeyRange<'_>], path: Option<&Path>) -> Result<()>;

    /// For each `(start, end)` range, the first entry of `cf` in `[start, end)`, or `None`.
    /// MVCC batched reads use this (one seek per key) only for keys written after the read
    /// timestamp; RocksDB reuses one iterator for all.
    fn seek_first_many(&self, cf: Cf, ranges: &[(&[u8], &[u8])]) -> Result<Vec<Option<KvPair>>> {
        ranges
            .iter()
            .map(|(start, end)| self.scan(cf, start, Some(end), false).next().transpose())
            .collect()
    }

    /// The cluster id this data dir belongs to, if one was written. A node refuses to start
    /// on a data dir of another cluster.
    fn read_cluster_id(&self) -> Result<Option<String>> {
        match self.get(Cf::RaftMeta, keys::CLUSTER_ID_KEY)? {
            None => Ok(None),
            Some(raw) => String::from_utf8(raw)
                .map(Some)
                .map_err(|e| Error::corrupt("cluster id", e.to_string())),
        }
    }

    /// Records the cluster id (durably: a synced write). Overwrites any earlier id; the node
    /// checks `read_cluster_id` before calling this.
    fn write_cluster_id(&self, id: &str) -> Result<()> {
        let mut batch = WriteBatch::new();
        batch.put(Cf::RaftMeta, keys::CLUSTER_ID_KEY, id.as_bytes());
        self.write(batch, true)
    }
}

/// Tuning knobs of [`RocksEngine`](crate::RocksEngine). Everything else is fixed in code
/// (and explained there) so every node of a cluster behaves the same.
#[derive(Clone, Debug)]
pub struct EngineOptions {
    /// LRU block cache shared by all column families.
    pub block_cache_bytes: usize,
    /// Memtable size per column family before it is flushed to an SST file.
    pub write_buffer_bytes: usize,
    /// Most bytes of live WAL: past it, RocksDB flushes the families whose unflushed writes
    /// keep the oldest WAL file alive. A crash replays the whole live WAL on open, so this
    /// bounds that replay whatever the data size (see `rocks`).
    pub max_wal_bytes: u64,
}

impl Default for EngineOptions {
    /// Sized for a small node (and for many nodes on one test machine): 128 MiB of block
    /// cache, 32 MiB memtables, 128 MiB of live WAL.
    fn default() -> Self {
        EngineOptions {
            block_cache_bytes: 128 * 1024 * 1024,
            write_buffer_bytes: 32 * 1024 * 1024,
            max_wal_bytes: 128 * 1024 * 1024,
        }
    }
}
