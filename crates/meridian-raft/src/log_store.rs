//! The Raft log of one shard, stored in the node's shared RocksDB.
//!
//! Entries live in the `raft_log` column family under `shard ‖ index` (big-endian), so one DB
//! serves every shard and a shard's log is a contiguous key range. The vote, the committed log
//! id and the last purged log id live in `raft_meta` under `shard ‖ kind`.
//!
//! # Writes never block Raft's core task
//! `append`, `truncate_after`, `purge` and `save_committed` queue their RocksDB batch on the
//! node's [`LogWriter`] and return at once; the writer thread merges every shard's queued
//! batches into one write and one fsync, and reports appends flushed after the fsync.
//! openraft requires appended entries to be readable as soon as `append` returns, so they also
//! go into this store's in-memory *tail* ([`crate::log_tail`]), which keeps them until the
//! writer has written them and apply has read them (within per-shard bounds).
//!
//! # Reads see the tail, then RocksDB
//! The tail is a suffix of the log (appends come in index order; evictions and purges cut its
//! front; a truncation cuts its end). A read whose first index the tail holds (or lies past
//! its last entry: nothing to read yet) is answered from it alone, on the caller's task (no
//! blocking-pool hand-off, no RocksDB iterator): the common case for replication and apply.
//! Any other read runs on the blocking pool, takes the tail's
//! entries of its range first, then reads from RocksDB only the part of the range below them.
//! Only written entries leave the tail, so every appended entry is in one or the other at any
//! moment of the read. Two
//! things could make the two halves disagree, and are handled:
//! - a truncation queued but not written: RocksDB still holds the truncated entries, so
//!   entries at or above a pending truncation's start are ignored in RocksDB;
//! - a truncation *during* the read (tail from before, RocksDB from after, a log that never
//!   existed): every truncation bumps a generation, and a read that saw it change retries.
//!
//! Durability: `save_vote` syncs before returning, as Raft requires (directly, not through the
//! queue). Truncation, purge and the committed mark are written unsynced: RocksDB's single WAL
//! keeps writes in order, so a later synced append makes them durable, and losing them in a
//! crash only resurrects entries this node never acknowledged (truncate), entries already
//! covered by a snapshot (purge), or an older committed mark (recovery then waits for the
//! cluster's commit).
//!
//! Reads of RocksDB and the vote run on tokio's blocking pool, never on the reactor. The
//! writer's statistics count which reads the tail answered (`LogWriterStats::log_reads_*`).

use crate::log_tail::{hole, ReadLimit, Tail};
use crate::log_writer::{LogWork, LogWriter};
use crate::types::{codec, Entry, IOFlushed, LogId, LogState, TypeConfig, Vote};
use meridian_storage::keys::{self, MetaKind};
use meridian_storage::{Cf, Engine, WriteBatch};
use meridian_types::ShardId;
use openraft::storage::RaftLogStorage;
use openraft::{OptionalSend, RaftLogReader};
use std::collections::BTreeMap;
use std::fmt::Debug;
use std::io;
use std::ops::{Bound, RangeBounds};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Most entries one replication read returns, and the piece size of apply reads (see
/// [`LogStore::entries_stream`]); `try_get_log_entries` is never cut short by it.
pub const MAX_ENTRIES_PER_READ: usize = 4_096;

/// Most encoded bytes one replication read (one AppendEntries) or apply piece holds, unless
/// its first entry alone is larger: a quarter of the largest message, so a read of large
/// entries (a big `BatchPut`, a coalesced entry of many writes) never makes an append the
/// transport cannot send.
pub const MAX_BYTES_PER_READ: usize = meridian_types::limits::MAX_MESSAGE_BYTES / 4;

const PIECE: ReadLimit = ReadLimit {
    entries: MAX_ENTRIES_PER_READ,
    bytes: MAX_BYTES_PER_READ,
};

/// Most times a read restarts because a truncation ran during it.
const MAX_READ_RETRIES: usize = 1_000;

#[derive(Clone)]
pub struct LogStore {
    shard: ShardId,
    engine: Arc<dyn Engine>,
    writer: Arc<LogWriter>,
    tail: Arc<std::sync::Mutex<Tail>>,
}

fn lock(tail: &std::sync::Mutex<Tail>) -> std::sync::MutexGuard<'_, Tail> {
    tail.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn io_err(e: impl std::fmt::Display) -> io::Error {
    io::Error::other(e.to_string())
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> io::Result<T> + Send + 'static,
) -> io::Result<T> {
    tokio::task::spawn_blocking(f).await.map_err(io_err)?
}

impl LogStore {
    pub fn new(shard: ShardId, engine: Arc<dyn Engine>, writer: Arc<LogWriter>) -> LogStore {
        LogStore {
            shard,
            engine,
            writer,
            tail: Arc::default(),
        }
    }

    /// Queues `batch` on the node's writer (no hook, no flush).
    async fn queue(&self, batch: WriteBatch) -> io::Result<()> {
        self.writer
            .submit(LogWork {
                batch,
                ..Default::default()
            })
            .await
    }

    async fn read_meta<T: serde::de::DeserializeOwned + Send + 'static>(
        &self,
        kind: MetaKind,
    ) -> io::Result<Option<T>> {
        let engine = self.engine.clone();
        let key = keys::raft_meta_key(self.shard, kind);
        blocking(
            move || match engine.get(Cf::RaftMeta, &key).map_err(io_err)? {
                Some(bytes) => Ok(Some(codec::decode(&bytes)?)),
                None => Ok(None),
            },
        )
        .await
    }

    async fn write(&self, batch: WriteBatch, sync: bool) -> io::Result<()> {
        let engine = self.engine.clone();
        blocking(move || engine.write(batch, sync).map_err(io_err)).await
    }

    fn meta_put<T: serde::Serialize>(
        &self,
        batch: &mut WriteBatch,
        kind: MetaKind,
        value: &T,
    ) -> io::Result<()> {
        batch.put(
            Cf::RaftMeta,
            keys::raft_meta_key(self.shard, kind),
            codec::encode(value)?,
        );
        Ok(())
    }

    /// Reads `[first, end)` within `limit` (see [`read_range`]): from the tail alone, on this
    /// task, when it holds `first`; else on the blocking pool from the tail and RocksDB.
    async fn read(
        &self,
        first: u64,
        end: Option<u64>,
        limit: Option<ReadLimit>,
    ) -> io::Result<(Vec<Entry>, bool)> {
        let stats = self.writer.stats();
        let from_memory = lock(&self.tail).read(self.shard, first, end, limit);
        if let Some(read) = from_memory {
            stats.log_reads_memory.fetch_add(1, Ordering::Relaxed);
            return read;
        }
        stats.log_reads_stored.fetch_add(1, Ordering::Relaxed);
        let (shard, engine, tail) = (self.shard, self.engine.clone(), self.tail.clone());
        blocking(move || read_range(&*engine, &tail, shard, first, end, limit)).await
    }

    /// The log's last entry: the tail's, else RocksDB's newest that no pending truncation
    /// covers.
    async fn last_entry(&self) -> io::Result<Option<Entry>> {
        let (shard, engine, tail) = (self.shard, self.engine.clone(), self.tail.clone());
        blocking(move || {
            let last_held = lock(&tail).last_index();
            consistent_read(
                &tail,
                last_held.unwrap_or(u64::MAX),
                None,
                |held, stale_from| {
                    if let Some((_, last)) = held.into_iter().next_back() {
                        return Ok(Some(last));
                    }
                    let (start, mut end) = keys::raft_log_range(shard);
                    if let Some(from) = stale_from {
                        end = keys::raft_log_key(shard, from);
                    }
                    let mut it = engine.scan(Cf::RaftLog, &start, Some(&end), true);
                    match it.next() {
                        Some(Ok((_, v))) => Ok(Some(codec::decode::<Entry>(&v)?)),
                        Some(Err(e)) => Err(io_err(e)),
                        None => Ok(None),
                    }
                },
            )
        })
        .await
    }
}

/// Runs `read` with a copy of the tail's entries in `[first, end)` and its stale-from index,
/// and retries it if a truncation ran meanwhile (see the module docs).
fn consistent_read<T>(
    tail: &std::sync::Mutex<Tail>,
    first: u64,
    end: Option<u64>,
    mut read: impl FnMut(BTreeMap<u64, Entry>, Option<u64>) -> io::Result<T>,
) -> io::Result<T> {
    for _ in 0..MAX_READ_RETRIES {
        let (held, stale_from, generation) = {
            let t = lock(tail);
            (t.copy_range(first, end), t.stale_from(), t.generation)
        };
        let result = read(held, stale_from)?;
        if lock(tail).generation == generation {
            return Ok(result);
        }
    }
    Err(io::Error::other(format!(
        "the raft log was truncated during {MAX_READ_RETRIES} reads in a row"
    )))
}

/// Reads the entries of `[first, end)` (`end` = `None`: to the end of the log), within
/// `limit`, from the tail and RocksDB (see the module docs); and whether the limit cut the
/// read short (more entries may follow). Absence is tolerated only before the first entry
/// found (purged) and after the last (not appended yet); a gap between two entries is an
/// error, never a short read.
fn read_range(
    engine: &dyn Engine,
    tail: &std::sync::Mutex<Tail>,
    shard: ShardId,
    first: u64,
    end: Option<u64>,
    limit: Option<ReadLimit>,
) -> io::Result<(Vec<Entry>, bool)> {
    consistent_read(tail, first, end, |held, stale_from| {
        // The tail is a suffix of the log: RocksDB supplies only what lies below its first
        // entry in range, and below the first pending truncation (the rest there is stale).
        let rocks_end = [end, stale_from, held.keys().next().copied()]
            .into_iter()
            .flatten()
            .min();
        let (mut out, mut bytes, cut) = match rocks_end {
            Some(e) if e <= first => (Vec::new(), 0, false),
            _ => read_written(engine, shard, first, rocks_end, limit)?,
        };
        if cut {
            return Ok((out, true));
        }
        for entry in held.into_values() {
            let size = limit.map_or(0, |_| codec::encoded_len(&entry));
            if !ReadLimit::admits(limit, &out, bytes, size) {
                return Ok((out, true));
            }
            bytes = bytes.saturating_add(size);
            if let Some(prev) = out.last() {
                if entry.log_id.index != prev.log_id.index + 1 {
                    return Err(hole(shard, prev.log_id.index, entry.log_id.index));
                }
            }
            out.push(entry);
        }
        Ok((out, false))
    })
}

/// The entries RocksDB holds in `[first, end)` within `limit`, checked for holes, with their
/// encoded bytes and whether the limit cut the read short.
fn read_written(
    engine: &dyn Engine,
    shard: ShardId,
    first: u64,
    end: Option<u64>,
    limit: Option<ReadLimit>,
) -> io::Result<(Vec<Entry>, usize, bool)> {
    let start_key = keys::raft_log_key(shard, first);
    let end_key = match end {
        Some(e) => keys::raft_log_key(shard, e),
        None => keys::raft_log_range(shard).1,
    };
    let mut out = Vec::new();
    let mut bytes = 0usize;
    let mut prev: Option<u64> = None;
    for item in engine.scan(Cf::RaftLog, &start_key, Some(&end_key), false) {
        let (k, v) = item.map_err(io_err)?;
        if !ReadLimit::admits(limit, &out, bytes, v.len()) {
            return Ok((out, bytes, true));
        }
        bytes = bytes.saturating_add(v.len());
        let (_, index) = keys::decode_raft_log_key(&k).map_err(io_err)?;
        let entry: Entry = codec::decode(&v)?;
        if entry.log_id.index != index {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "shard {shard}: log key index {index} holds entry {}",
                    entry.log_id.index
                ),
            ));
        }
        if let Some(p) = prev {
            if index != p + 1 {
                return Err(hole(shard, p, index));
            }
        }
        prev = Some(index);
        out.push(entry);
    }
    Ok((out, bytes, false))
}

fn bounds(range: &impl RangeBounds<u64>) -> (u64, Option<u64>) {
    let first = match range.start_bound() {
        Bound::Included(x) => *x,
        Bound::Excluded(x) => x.saturating_add(1),
        Bound::Unbounded => 0,
    };
    let end = match range.end_bound() {
        Bound::Included(x) => x.checked_add(1),
        Bound::Excluded(x) => Some(*x),
        Bound::Unbounded => None,
    };
    (first, end)
}

impl RaftLogReader<TypeConfig> for LogStore {
    /// Every entry of `range` the log holds (openraft's contract: never a short read — the apply
    /// path marks the whole range applied, so a short read would skip entries for good).
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> io::Result<Vec<Entry>> {
        let (first, end) = bounds(&range);
        self.read(first, end, None).await.map(|(e, _)| e)
    }

    /// Replication reads: at most [`MAX_ENTRIES_PER_READ`] entries and [`MAX_BYTES_PER_READ`],
    /// never none when the range holds some (openraft sends the rest in later requests).
    async fn limited_get_log_entries(&mut self, start: u64, end: u64) -> io::Result<Vec<Entry>> {
        self.read(start, Some(end), Some(PIECE))
            .await
            .map(|(e, _)| e)
    }

    /// The apply path: the whole range, read [`MAX_ENTRIES_PER_READ`] entries (or
    /// [`MAX_BYTES_PER_READ`]) at a time so a
    /// replica catching up on a long log does not hold it all in memory. Committed entries
    /// never change, so reading them in pieces sees the same log as one read would. What a
    /// piece returned may leave the tail (apply has it).
    async fn entries_stream<RB>(
        &mut self,
        range: RB,
    ) -> impl futures::Stream<Item = io::Result<Entry>> + OptionalSend
    where
        RB: RangeBounds<u64> + Clone + Debug + OptionalSend,
    {
        use futures::StreamExt;
        let (first, end) = bounds(&range);
        let (store, shard) = (self.clone(), self.shard);
        // State: the next index to read and whether it continues an earlier piece (then it
        // must be there: absence is tolerated only at the start of the whole range), or None
        // once done (or after an error).
        futures::stream::unfold(Some((first, false)), move |next| {
            let store = store.clone();
            async move {
                let (from, continued) = next?;
                if end.is_some_and(|e| from >= e) {
                    return None;
                }
                let read = store.read(from, end, Some(PIECE)).await;
                let read = read.and_then(|(chunk, cut)| match chunk.first() {
                    Some(e) if continued && e.log_id.index != from => Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!("shard {shard}: the raft log has a hole: entry {from} is missing"),
                    )),
                    _ => Ok((chunk, cut)),
                });
                match read {
                    Ok((chunk, _)) if chunk.is_empty() => None,
                    Ok((chunk, full)) => {
                        let after = chunk.last().map(|e| e.log_id.index + 1);
                        if let Some(after) = after {
                            lock(&store.tail).applied_below(after);
                        }
                        let items: Vec<io::Result<Entry>> = chunk.into_iter().map(Ok).collect();
                        let next = full.then_some(after).flatten().map(|a| (a, true));
                        Some((futures::stream::iter(items), next))
                    }
                    Err(e) => Some((futures::stream::iter(vec![Err(e)]), None)),
                }
            }
        })
        .flatten()
    }

    async fn read_vote(&mut self) -> io::Result<Option<Vote>> {
        self.read_meta(MetaKind::Vote).await
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> io::Result<LogState> {
        let purged_here = lock(&self.tail).last_purged;
        let last_purged: Option<LogId> = match purged_here {
            Some(p) => Some(p),
            None => self.read_meta(MetaKind::LastPurged).await?,
        };
        let last = self.last_entry().await?.map(|e| e.log_id);
        // A purge may be queued but not written: RocksDB can still show purged entries.
        Ok(LogState {
            last_log_id: last.max(last_purged),
            last_purged_log_id: last_purged,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> io::Result<()> {
        let mut batch = WriteBatch::new();
        self.meta_put(&mut batch, MetaKind::Vote, vote)?;
        self.write(batch, true).await
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> io::Result<()> {
        let mut batch = WriteBatch::new();
        self.meta_put(&mut batch, MetaKind::Committed, &committed)?;
        self.queue(batch).await
    }

    async fn read_committed(&mut self) -> io::Result<Option<LogId>> {
        Ok(self
            .read_meta::<Option<LogId>>(MetaKind::Committed)
            .await?
            .flatten())
    }

    async fn append<I>(&mut self, entries: I, callback: IOFlushed) -> io::Result<()>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut batch = WriteBatch::new();
        let mut appended = Vec::new();
        for entry in entries {
            let encoded = codec::encode(&entry)?;
            let bytes = encoded.len();
            batch.put(
                Cf::RaftLog,
                keys::raft_log_key(self.shard, entry.log_id.index),
                encoded,
            );
            appended.push((entry, bytes));
        }
        let ids: Vec<LogId> = appended.iter().map(|(e, _)| e.log_id).collect();
        {
            let mut tail = lock(&self.tail);
            for (entry, bytes) in appended {
                tail.push(entry, bytes);
            }
        }
        let tail = self.tail.clone();
        let written = Box::new(move || lock(&tail).written(&ids));
        self.writer
            .submit(LogWork {
                batch,
                written: Some(written),
                flushed: Some(callback),
            })
            .await
    }

    async fn truncate_after(&mut self, last_log_id: Option<LogId>) -> io::Result<()> {
        let from = last_log_id.map(|l| l.index + 1).unwrap_or(0);
        // Rare (only when a new leader's log conflicts with ours) and the first thing a
        // post-mortem of a lost write asks about.
        tracing::info!(shard = %self.shard, from, "truncating the raft log");
        let mut batch = WriteBatch::new();
        batch.delete_range(
            Cf::RaftLog,
            keys::raft_log_key(self.shard, from),
            keys::raft_log_range(self.shard).1,
        );
        lock(&self.tail).truncate(from);
        let tail = self.tail.clone();
        let written = Box::new(move || lock(&tail).truncation_written(from));
        self.writer
            .submit(LogWork {
                batch,
                written: Some(written),
                flushed: None,
            })
            .await
    }

    async fn purge(&mut self, log_id: LogId) -> io::Result<()> {
        let mut batch = WriteBatch::new();
        self.meta_put(&mut batch, MetaKind::LastPurged, &log_id)?;
        batch.delete_range(
            Cf::RaftLog,
            keys::raft_log_range(self.shard).0,
            keys::raft_log_key(self.shard, log_id.index + 1),
        );
        lock(&self.tail).purge(log_id);
        self.queue(batch).await
    }
}
