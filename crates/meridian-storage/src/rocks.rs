//! [`RocksEngine`]: the [`Engine`] on one RocksDB database with five column families.
//!
//! # Why it is configured this way
//! - **One database, five column families** shared by every shard (MVCC data keyed by user
//!   key, Raft state by shard id; see `keys`). One WAL means a batch is atomic across families
//!   and a crash loses only a suffix of the write order.
//! - **Option objects are built once** at open and kept in the struct: the `WriteOptions`
//!   (sync and non-sync), the point-read `ReadOptions`, the `FlushOptions`, the ingest options
//!   and the per-family `Options` (reused by the SST writer). Building them per call is what
//!   leaked native memory in Flipkart's deployment. The one exception is iterators: a RocksDB
//!   iterator *owns* its `ReadOptions` (the iterate bounds live there), so `scan` creates one
//!   per iterator and it is freed with the iterator.
//! - **Level compaction** with `max_background_jobs = 2` (this is a 2-core class machine),
//!   LZ4 everywhere, one LRU block cache shared by all families.
//! - **Bloom filters** (10 bits/key, full filters) on `data`, `intents` and `txn_records`.
//!   They speed up exact-key lookups: MVCC point reads and BatchGet get the key's
//!   latest-version slot, which holds the newest version's value (see `mvcc`), so a hit is one
//!   lookup and a miss costs a filter probe, not a seek. Only reads below a key's newest
//!   version still *seek* to `key ‖ !read_ts`, which whole-key filters cannot serve; a prefix
//!   extractor over `space ‖ encode_bytes(key)` would, see "not done yet".
//! - **MultiGet** ([`Engine::multi_get`]) is RocksDB's batched MultiGet. It checks whether the
//!   keys are sorted and, if so, passes `sorted_input = true` so RocksDB skips its own sort;
//!   MVCC always passes them sorted.
//! - **A bounded WAL, so the replay after a crash does not grow with the data.** RocksDB keeps every WAL file
//!   that holds an unflushed write of *any* family and replays them all when it opens after a
//!   crash. Raft metadata is written lightly among busy data writes, so by default its small
//!   memtable pinned the WAL up to 4 × the families' memtables (1.9 GB seen after a bulk load
//!   of 4M records; a SIGKILLed node holding 10M records took 6 s to serve again, 0.8 s at
//!   1M). `max_total_wal_size` = [`EngineOptions::max_wal_bytes`] (128 MiB by default) makes
//!   RocksDB flush the families that pin the oldest file once the WAL passes it. (Open still
//!   writes what it replayed to L0 files before it returns: `avoid_flush_during_recovery` is
//!   not exposed by the `rocksdb` crate.) Restart still grows with the data, less: 0.3 s at 1M
//!   records, 0.9–1.4 s at 10M (`bench/results/2026-12-05/restart-data-size.md`).
//! - **Format marker**: `open` writes (fresh dir) or checks (existing dir)
//!   [`STORAGE_FORMAT_VERSION`] under [`keys::FORMAT_VERSION_KEY`]. A directory with another
//!   version, or with data but no marker, is refused with [`Error::Incompatible`]: the node
//!   must be re-seeded rather than misread old bytes.
//!
//! # Not done yet
//! - No prefix extractor / prefix bloom for the MVCC seeks that remain (reads below a key's
//!   newest version, scans); it needs a custom `SliceTransform` that finds the end of the
//!   escaped user key.
//! - No checkpoints (`rocksdb::checkpoint`) for whole-node seeding; shard snapshots use
//!   `export_sst`.
//! - No periodic manual compaction, rate limiter or statistics export.

use crate::engine::{BatchOp, Cf, Engine, EngineOptions, KeyRange, KvIter, KvPair, WriteBatch};
use crate::error::{Error, Result};
use crate::keys;
use rocksdb::{
    BlockBasedOptions, Cache, ColumnFamily, ColumnFamilyDescriptor, DBCompactionStyle,
    DBCompressionType, FlushOptions, IngestExternalFileOptions, IteratorMode, Options, ReadOptions,
    SstFileWriter, WriteOptions, DB,
};
use std::path::{Path, PathBuf};

/// The on-disk format this build reads and writes. Bump it when any key layout, value
/// encoding or column family changes meaning.
///
/// History: 1 = versions only; 2 = every data key also has a latest-version slot
/// (`keys::data_slot_key`, value tag 3 = the newest version's timestamp) written with each
/// version; 3 = the slot also holds a copy of the newest version's value (tag 4 ‖ ts ‖
/// version encoding), so a read at or above it is one lookup. A version-1 dir has no slots,
/// so reads on it would miss every key; a version-2 dir's slots have no values. Both are
/// refused, not misread. 4 = Raft log entries carry a write's request id and results carry
/// dedup/rejection fields (a version-3 log would not decode), and shards keep write-dedup
/// entries and snapshot-install markers in `Cf::RaftMeta`. 5 = each shard's data range holds
/// a transaction region (prepared locks and transaction records), which a version-4 build
/// would misread as user keys. 6 = MVCC data is keyed by user key alone (`space ‖ key ‖ !ts`,
/// no shard id), the shard's transaction region and GC threshold are shard-local keys
/// (`01 ‖ shard ‖ …`); a version-5 directory's keys all begin with a shard id and would be
/// misread. 7 = prepared locks keep the transaction's start timestamp, and records and
/// markers are a `TxnRecord` (status, start timestamp, finished, participants), and the Raft
/// log's `Prepare` and `Resolve` commands carry the start timestamp: a version-6 build would
/// decode neither. 8 = prepared locks and the Raft log's `Prepare` carry the transaction's
/// rank (priority and age, for wound-wait); a version-7 build would decode neither.
pub const STORAGE_FORMAT_VERSION: u32 = 8;

/// Bloom filter bits per key on the point-lookup families.
const BLOOM_BITS_PER_KEY: f64 = 10.0;

/// Memory RocksDB holds, in bytes ([`RocksEngine::memory`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EngineMemory {
    /// Blocks in the shared LRU block cache (bounded by `EngineOptions::block_cache_bytes`).
    pub block_cache: u64,
    /// Of those, blocks pinned by readers (iterators, table readers).
    pub block_cache_pinned: u64,
    /// Active, immutable and pinned memtables of every family.
    pub memtables: u64,
    /// Open SST files' index and filter blocks, which are not charged to the block cache.
    pub table_readers: u64,
}

/// Background flush + compaction threads.
const MAX_BACKGROUND_JOBS: i32 = 2;

/// The RocksDB-backed engine. Cheap to share behind an `Arc`; all methods take `&self`.
pub struct RocksEngine {
    // Field order matters only for readability: rust-rocksdb keeps what the DB needs alive.
    db: DB,
    path: PathBuf,
    cf_opts: Vec<Options>,
    read_opts: ReadOptions,
    write_opts_sync: WriteOptions,
    write_opts_nosync: WriteOptions,
    flush_opts: FlushOptions,
    ingest_opts: IngestExternalFileOptions,
    block_cache: Cache,
}

impl std::fmt::Debug for RocksEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RocksEngine")
            .field("path", &self.path)
            .finish()
    }
}

fn cf_options(cf: Cf, opts: &EngineOptions, cache: &Cache) -> Options {
    let mut o = Options::default();
    o.set_compaction_style(DBCompactionStyle::Level);
    o.set_level_compaction_dynamic_level_bytes(true);
    o.set_compression_type(DBCompressionType::Lz4);
    o.set_write_buffer_size(opts.write_buffer_bytes);
    let mut table = BlockBasedOptions::default();
    table.set_block_cache(cache);
    match cf {
        Cf::Data | Cf::Intents | Cf::TxnRecords => {
            table.set_bloom_filter(BLOOM_BITS_PER_KEY, false);
            table.set_whole_key_filtering(true);
        }
        // Raft log and meta are read by exact key or by short scans of one shard; no filter.
        Cf::RaftLog | Cf::RaftMeta => {}
    }
    o.set_block_based_table_factory(&table);
    o
}

impl RocksEngine {
    /// Opens (creating if missing) the database in `dir` and checks its format version.
    pub fn open(dir: &Path, opts: &EngineOptions) -> Result<RocksEngine> {
        std::fs::create_dir_all(dir)?;
        let cache = Cache::new_lru_cache(opts.block_cache_bytes);
        let mut db_opts = Options::default();
        db_opts.create_if_missing(true);
        db_opts.create_missing_column_families(true);
        db_opts.set_max_background_jobs(MAX_BACKGROUND_JOBS);
        db_opts.set_max_total_wal_size(opts.max_wal_bytes);
        let cf_opts: Vec<Options> = Cf::ALL
            .iter()
            .map(|&cf| cf_options(cf, opts, &cache))
            .collect();
        let descriptors = Cf::ALL
            .iter()
            .zip(&cf_opts)
            .map(|(cf, o)| ColumnFamilyDescriptor::new(cf.name(), o.clone()));
        let db = DB::open_cf_descriptors(&db_opts, dir, descriptors)?;

        let mut write_opts_sync = WriteOptions::default();
        write_opts_sync.set_sync(true);
        let mut write_opts_nosync = WriteOptions::default();
        write_opts_nosync.set_sync(false);
        let mut flush_opts = FlushOptions::default();
        flush_opts.set_wait(true);
        let mut ingest_opts = IngestExternalFileOptions::default();
        // Copy, do not move: the snapshot file stays owned (and deleted) by its caller.
        ingest_opts.set_move_files(false);

        let engine = RocksEngine {
            db,
            path: dir.to_path_buf(),
            cf_opts,
            read_opts: ReadOptions::default(),
            write_opts_sync,
            write_opts_nosync,
            flush_opts,
            ingest_opts,
            block_cache: cache,
        };
        engine.check_format_version()?;
        tracing::info!(path = %dir.display(), version = STORAGE_FORMAT_VERSION, "opened storage");
        Ok(engine)
    }

    /// What RocksDB holds in memory, by kind, summed over the column families. A family
    /// whose property cannot be read counts 0.
    pub fn memory(&self) -> EngineMemory {
        let sum = |name: &rocksdb::properties::PropName| -> u64 {
            Cf::ALL
                .iter()
                .filter_map(|&cf| self.handle(cf).ok())
                .filter_map(|h| self.db.property_int_value_cf(h, name).ok().flatten())
                .sum()
        };
        EngineMemory {
            block_cache: self.block_cache.get_usage() as u64,
            block_cache_pinned: self.block_cache.get_pinned_usage() as u64,
            memtables: sum(rocksdb::properties::SIZE_ALL_MEM_TABLES),
            table_readers: sum(rocksdb::properties::ESTIMATE_TABLE_READERS_MEM),
        }
    }

    /// The data directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// See [`Engine::read_cluster_id`].
    pub fn read_cluster_id(&self) -> Result<Option<String>> {
        Engine::read_cluster_id(self)
    }

    /// See [`Engine::write_cluster_id`].
    pub fn write_cluster_id(&self, id: &str) -> Result<()> {
        Engine::write_cluster_id(self, id)
    }

    /// Writes the format marker into a fresh directory, or checks the one that is there.
    fn check_format_version(&self) -> Result<()> {
        match self.get(Cf::RaftMeta, keys::FORMAT_VERSION_KEY)? {
            Some(raw) => {
                let bytes: [u8; 4] = raw.as_slice().try_into().map_err(|_| {
                    Error::corrupt("format version", format!("{} bytes, want 4", raw.len()))
                })?;
                let found = u32::from_be_bytes(bytes);
                if found != STORAGE_FORMAT_VERSION {
                    return Err(Error::Incompatible(format!(
                        "on-disk format version {found}, this build reads {STORAGE_FORMAT_VERSION}"
                    )));
                }
                Ok(())
            }
            None => {
                for cf in Cf::ALL {
                    if self
                        .scan(cf, &[], None, false)
                        .next()
                        .transpose()?
                        .is_some()
                    {
                        return Err(Error::Incompatible(format!(
                            "column family {cf} holds data but the dir has no format marker"
                        )));
                    }
                }
                let mut batch = WriteBatch::new();
                batch.put(
                    Cf::RaftMeta,
                    keys::FORMAT_VERSION_KEY,
                    STORAGE_FORMAT_VERSION.to_be_bytes(),
                );
                self.write(batch, true)
            }
        }
    }

    fn handle(&self, cf: Cf) -> Result<&ColumnFamily> {
        self.db
            .cf_handle(cf.name())
            .ok_or_else(|| Error::Rocks(format!("column family {cf} missing after open")))
    }

    fn iter_opts(start: &[u8], end: Option<&[u8]>) -> ReadOptions {
        let mut ro = ReadOptions::default();
        ro.set_iterate_lower_bound(start.to_vec());
        if let Some(end) = end {
            ro.set_iterate_upper_bound(end.to_vec());
        }
        ro
    }
}

impl Engine for RocksEngine {
    fn get(&self, cf: Cf, key: &[u8]) -> Result<Option<Vec<u8>>> {
        let h = self.handle(cf)?;
        Ok(self
            .db
            .get_pinned_cf_opt(h, key, &self.read_opts)?
            .map(|v| v.to_vec()))
    }

    fn multi_get(&self, cf: Cf, keys: &[&[u8]]) -> Result<Vec<Option<Vec<u8>>>> {
        let h = self.handle(cf)?;
        // RocksDB only asserts sortedness in debug builds and otherwise trusts the flag, so
        // it must be exact: non-decreasing bytewise order (the default comparator; equal keys
        // are fine). Callers that sort (mvcc) get RocksDB's sort skipped.
        let sorted = keys.windows(2).all(|w| w[0] <= w[1]);
        self.db
            .batched_multi_get_cf_opt(h, keys.iter().copied(), sorted, &self.read_opts)
            .into_iter()
            .map(|r| r.map(|v| v.map(|v| v.to_vec())).map_err(Error::from))
            .collect()
    }

    fn scan<'a>(&'a self, cf: Cf, start: &[u8], end: Option<&[u8]>, reverse: bool) -> KvIter<'a> {
        let h = match self.handle(cf) {
            Ok(h) => h,
            Err(e) => return Box::new(std::iter::once(Err(e))),
        };
        if end.is_some_and(|end| end <= start) {
            return Box::new(std::iter::empty());
        }
        let mode = if reverse {
            IteratorMode::End
        } else {
            IteratorMode::Start
        };
        let iter = self
            .db
            .iterator_cf_opt(h, Self::iter_opts(start, end), mode);
        Box::new(iter.map(|r| {
            r.map(|(k, v)| (k.into_vec(), v.into_vec()))
                .map_err(Error::from)
        }))
    }

    fn write(&self, batch: WriteBatch, sync: bool) -> Result<()> {
        let mut wb = rocksdb::WriteBatch::default();
        for op in batch.into_ops() {
            match op {
                BatchOp::Put { cf, key, value } => wb.put_cf(self.handle(cf)?, key, value),
                BatchOp::Delete { cf, key } => wb.delete_cf(self.handle(cf)?, key),
                BatchOp::DeleteRange { cf, start, end } => {
                    wb.delete_range_cf(self.handle(cf)?, start, end)
                }
            }
        }
        let wo = if sync {
            &self.write_opts_sync
        } else {
            &self.write_opts_nosync
        };
        self.db.write_opt(wb, wo)?;
        Ok(())
    }

    fn sync_wal(&self) -> Result<()> {
        // FlushWAL(sync) fsyncs the WAL outside the write group, so concurrent unsynced writes
        // (other shards' appends and applies) keep flowing during the fsync.
        self.db.flush_wal(true)?;
        Ok(())
    }

    fn flush(&self) -> Result<()> {
        self.db.flush_wal(true)?;
        let handles = Cf::ALL
            .iter()
            .map(|&cf| self.handle(cf))
            .collect::<Result<Vec<_>>>()?;
        self.db.flush_cfs_opt(&handles, &self.flush_opts)?;
        Ok(())
    }

    fn export_sst(&self, cf: Cf, ranges: &[KeyRange<'_>], path: &Path) -> Result<u64> {
        crate::engine::check_ranges(ranges)?;
        let h = self.handle(cf)?;
        let mut writer: Option<SstFileWriter> = None;
        let mut written = 0u64;
        let result = (|| -> Result<()> {
            for &(start, end) in ranges.iter().filter(|(s, e)| s < e) {
                let mut ro = Self::iter_opts(start, Some(end));
                // A bulk export should not evict the foreground working set from the block
                // cache.
                ro.fill_cache(false);
                for item in self.db.iterator_cf_opt(h, ro, IteratorMode::Start) {
                    let (k, v) = item?;
                    let w = match &mut writer {
                        Some(w) => w,
                        None => {
                            let w = writer.insert(SstFileWriter::create(&self.cf_opts[cf.index()]));
                            w.open(path)?;
                            w
                        }
                    };
                    w.put(k, v)?;
                    written += 1;
                }
            }
            if let Some(w) = &mut writer {
                w.finish()?;
            }
            Ok(())
        })();
        if let Err(e) = result {
            // Best effort: do not leave a half-written file that looks like a snapshot.
            if writer.is_some() {
                let _ = std::fs::remove_file(path);
            }
            return Err(e);
        }
        Ok(written)
    }

    fn ingest_sst(&self, cf: Cf, ranges: &[KeyRange<'_>], path: Option<&Path>) -> Result<()> {
        crate::engine::check_ranges(ranges)?;
        let h = self.handle(cf)?;
        // Synced so the clear is durable before the ingested file (which gets a newer sequence
        // number than the range tombstones, so its keys survive the deletes).
        let mut clear = WriteBatch::new();
        for &(start, end) in ranges.iter().filter(|(s, e)| s < e) {
            clear.delete_range(cf, start, end);
        }
        self.write(clear, true)?;
        if let Some(path) = path {
            self.db
                .ingest_external_file_cf_opts(h, &self.ingest_opts, vec![path])?;
        }
        Ok(())
    }

    fn seek_first_many(&self, cf: Cf, ranges: &[(&[u8], &[u8])]) -> Result<Vec<Option<KvPair>>> {
        let h = self.handle(cf)?;
        // One unbounded raw iterator, re-seeked per range: avoids building an iterator (and
        // its memtable/SST cursors) per key.
        let mut iter = self.db.raw_iterator_cf_opt(h, ReadOptions::default());
        let mut out = Vec::with_capacity(ranges.len());
        for (start, end) in ranges {
            iter.seek(start);
            let found = match (iter.key(), iter.value()) {
                (Some(k), Some(v)) if k < *end => Some((k.to_vec(), v.to_vec())),
                _ => None,
            };
            iter.status()?;
            out.push(found);
        }
        Ok(out)
    }
}
