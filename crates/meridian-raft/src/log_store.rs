//! The Raft log of one shard, stored in the node's shared RocksDB.
//!
//! Entries live in the `raft_log` column family under `shard ‖ index` (big-endian), so one DB
//! serves every shard and a shard's log is a contiguous key range. The vote, the committed log
//! id and the last purged log id live in `raft_meta` under `shard ‖ kind`.
//!
//! Durability: `append` writes without syncing (so the entries are readable at once) and hands
//! its callback to the node's [`LogWriter`], which group-commits one fsync for all shards.
//! `save_vote` syncs before returning, as Raft requires. Truncation and purge are written
//! unsynced: RocksDB's single WAL keeps writes in order, so a later synced append makes them
//! durable, and losing them in a crash only resurrects entries this node never acknowledged
//! (truncate) or entries already covered by a snapshot (purge).
//!
//! All RocksDB calls run on tokio's blocking pool, never on the reactor.

use crate::log_writer::LogWriter;
use crate::types::{codec, Entry, IOFlushed, LogId, LogState, TypeConfig, Vote};
use meridian_storage::keys::{self, MetaKind};
use meridian_storage::{Cf, Engine, WriteBatch};
use meridian_types::ShardId;
use openraft::storage::RaftLogStorage;
use openraft::{OptionalSend, RaftLogReader};
use std::fmt::Debug;
use std::io;
use std::ops::{Bound, RangeBounds};
use std::sync::Arc;

/// Most entries one replication read returns, and the piece size of apply reads (see
/// [`LogStore::entries_stream`]); `try_get_log_entries` is never cut short by it.
pub const MAX_ENTRIES_PER_READ: usize = 4_096;

#[derive(Clone)]
pub struct LogStore {
    shard: ShardId,
    engine: Arc<dyn Engine>,
    writer: Arc<LogWriter>,
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
        }
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

    async fn last_entry(&self) -> io::Result<Option<Entry>> {
        let engine = self.engine.clone();
        let (start, end) = keys::raft_log_range(self.shard);
        blocking(move || {
            let mut it = engine.scan(Cf::RaftLog, &start, Some(&end), true);
            match it.next() {
                Some(Ok((_, v))) => Ok(Some(codec::decode::<Entry>(&v)?)),
                Some(Err(e)) => Err(io_err(e)),
                None => Ok(None),
            }
        })
        .await
    }
}

/// Reads the entries of `[first, end)` (`end` = `None`: to the end of the log), at most
/// `limit` of them. Absence is tolerated only before the first entry found (purged) and after
/// the last (not appended yet); a gap between two entries is an error, never a short read.
fn read_range(
    engine: &dyn Engine,
    shard: ShardId,
    first: u64,
    end: Option<u64>,
    limit: Option<usize>,
) -> io::Result<Vec<Entry>> {
    let start_key = keys::raft_log_key(shard, first);
    let end_key = match end {
        Some(e) => keys::raft_log_key(shard, e),
        None => keys::raft_log_range(shard).1,
    };
    let mut out: Vec<Entry> = Vec::new();
    for item in engine.scan(Cf::RaftLog, &start_key, Some(&end_key), false) {
        let (k, v) = item.map_err(io_err)?;
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
        if let Some(prev) = out.last() {
            if index != prev.log_id.index + 1 {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "shard {shard}: the raft log has a hole: entry {} is missing (entry {} is followed by {index})",
                        prev.log_id.index + 1,
                        prev.log_id.index
                    ),
                ));
            }
        }
        out.push(entry);
        if limit.is_some_and(|l| out.len() >= l) {
            break;
        }
    }
    Ok(out)
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
        let (shard, engine) = (self.shard, self.engine.clone());
        blocking(move || read_range(&*engine, shard, first, end, None)).await
    }

    /// Replication reads: at most [`MAX_ENTRIES_PER_READ`] entries, never none when the range
    /// holds some (openraft sends the rest in later requests).
    async fn limited_get_log_entries(&mut self, start: u64, end: u64) -> io::Result<Vec<Entry>> {
        let (shard, engine) = (self.shard, self.engine.clone());
        blocking(move || {
            read_range(
                &*engine,
                shard,
                start,
                Some(end),
                Some(MAX_ENTRIES_PER_READ),
            )
        })
        .await
    }

    /// The apply path: the whole range, read [`MAX_ENTRIES_PER_READ`] entries at a time so a
    /// replica catching up on a long log does not hold it all in memory. Committed entries
    /// never change, so reading them in pieces sees the same log as one read would.
    async fn entries_stream<RB>(
        &mut self,
        range: RB,
    ) -> impl futures::Stream<Item = io::Result<Entry>> + OptionalSend
    where
        RB: RangeBounds<u64> + Clone + Debug + OptionalSend,
    {
        use futures::StreamExt;
        let (first, end) = bounds(&range);
        let (shard, engine) = (self.shard, self.engine.clone());
        // State: the next index to read and whether it continues an earlier piece (then it
        // must be there: absence is tolerated only at the start of the whole range), or None
        // once done (or after an error).
        futures::stream::unfold(Some((first, false)), move |next| {
            let engine = engine.clone();
            async move {
                let (from, continued) = next?;
                if end.is_some_and(|e| from >= e) {
                    return None;
                }
                let read = blocking(move || {
                    read_range(&*engine, shard, from, end, Some(MAX_ENTRIES_PER_READ))
                })
                .await;
                let read = read.and_then(|chunk| match chunk.first() {
                    Some(e) if continued && e.log_id.index != from => Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!("shard {shard}: the raft log has a hole: entry {from} is missing"),
                    )),
                    _ => Ok(chunk),
                });
                match read {
                    Ok(chunk) if chunk.is_empty() => None,
                    Ok(chunk) => {
                        let after = chunk.last().map(|e| e.log_id.index + 1);
                        let full = chunk.len() >= MAX_ENTRIES_PER_READ;
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
        let last_purged: Option<LogId> = self.read_meta(MetaKind::LastPurged).await?;
        let last = self.last_entry().await?.map(|e| e.log_id);
        Ok(LogState {
            last_log_id: last.or(last_purged),
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
        self.write(batch, false).await
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
        for entry in entries {
            batch.put(
                Cf::RaftLog,
                keys::raft_log_key(self.shard, entry.log_id.index),
                codec::encode(&entry)?,
            );
        }
        self.write(batch, false).await?;
        self.writer.flush(callback).await
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
        self.write(batch, false).await
    }

    async fn purge(&mut self, log_id: LogId) -> io::Result<()> {
        let mut batch = WriteBatch::new();
        self.meta_put(&mut batch, MetaKind::LastPurged, &log_id)?;
        batch.delete_range(
            Cf::RaftLog,
            keys::raft_log_range(self.shard).0,
            keys::raft_log_key(self.shard, log_id.index + 1),
        );
        self.write(batch, false).await
    }
}
