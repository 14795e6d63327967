//! A shard's replicated state machine: MVCC data in the node's shared RocksDB.
//!
//! # Apply
//! Each apply call turns a run of committed entries into ONE RocksDB write batch holding the new
//! MVCC versions *and* the shard's applied log id, membership and version floor. A batch is
//! atomic and RocksDB's single WAL keeps batches in order, so after a crash the applied index
//! on disk always matches the data on disk: an entry is never half-applied, never applied
//! twice, and anything lost is re-applied from the (fsynced) Raft log.
//!
//! # Version timestamps
//! The leader proposes each write with a timestamp from its HLC. Apply uses
//! `max(proposed, floor + 1)` where `floor` is the shard's highest applied version timestamp,
//! and then raises `floor`. Every replica computes the same value (it depends only on the log),
//! so versions of a shard are strictly increasing in log order even across leader changes and
//! clock skew within `max_offset`. Apply also merges `floor` into the node's HLC, so a node that
//! becomes leader proposes timestamps above everything it has applied, and a read served after
//! the apply at `clock.now()` sees every acknowledged write.
//!
//! A gap between the applied index and the next entry applied is logged as an error (it
//! means committed entries were skipped).
//!
//! # Bad commands and retried writes
//! Every command is re-validated here ([`Command::validate`]): one that fails is applied as a
//! deterministic rejection (nothing written, the applied index advances, the proposer gets the
//! reason), so no entry from a peer can make apply panic on every replay. A write carrying a
//! request id already in the shard's dedup table (see `dedup`) writes nothing and answers with
//! the first application's commit timestamp. The table's changes ride in the same batch. What
//! each command writes, compare-and-swap included, is `apply`'s concern.
//!
//! # Garbage collection
//! A [`Command::Gc`](crate::types::Command::Gc) raises the shard's GC threshold and deletes
//! one page of versions no read at or above it can see (`meridian_storage::gc`). It reads
//! RocksDB while it decides, so it must see every entry before it: apply writes the batch
//! before a GC entry first and starts a new one with it. The threshold lives in the lock
//! table (readers check it under the same guard as the locks) and in the shard's transaction
//! region, so it is restored at open and travels with snapshots. A
//! [`Command::GcRecords`](crate::types::Command::GcRecords) page (finished transaction records
//! below the threshold, see `locks`) reads RocksDB the same way and is applied alone in its
//! batch, so later entries see its deletes.
//!
//! # Closed timestamps
//! A [`Command::Closed`](crate::types::Command::Closed) entry carries its leader's closed
//! timestamp (see `closed_ts`). Apply folds the highest one of a run into the lock table's
//! [`ClosedState`](crate::closed_ts::ClosedState), with the run's last index, after the
//! batch is written and before the table's write guard is released: a reader holding the
//! read guard sees a closed timestamp only together with the data it covers. A snapshot
//! install rebuilds the lock table but keeps the closed state (an install only moves the
//! applied index forward). The side channel's offers go through
//! [`ShardStateMachine::offer_closed`].
//!
//! # Snapshots are files
//! A snapshot is the shard's data written into one SST file (RocksDB `SstFileWriter`): two
//! ranges of `Cf::Data`, its shard-local keys (prepared locks, transaction records, GC
//! threshold) and its span's MVCC versions (`meridian_storage::keys`) — plus the Raft meta, the
//! version floor and the dedup table; installing one deletes both ranges (the other shards'
//! keys between them are untouched) and ingests the file. The file is what travels over the network (see `network`), in
//! checksummed chunks, never as one in-memory blob.
//!
//! # Installing a snapshot is crash-atomic
//! Replacing the data ranges (synced range deletes, then an ingest) and recording the new
//! applied index cannot be one RocksDB batch. So install runs in three durable steps:
//! 1. a synced batch writes an install marker (the snapshot's meta and file);
//! 2. the ranges are cleared and the file ingested (the file is copied, never moved);
//! 3. a synced batch writes the applied index, membership, floor, dedup table and snapshot
//!    record, and deletes the marker.
//!
//! A crash after 1 leaves the marker: [`ShardStateMachine::open`] redoes 2 and 3 from it before
//! the shard serves, so the data and the applied index never disagree (a crash between 2 and 3
//! used to leave the new data under the old applied index, and replaying the log over it
//! rolled latest-version slots back). Snapshot files are deleted only after the record that
//! replaced them is synced.
//!
//! # Not done yet
//! - Building a snapshot holds the shard's state-machine lock (apply waits). A RocksDB snapshot
//!   (point-in-time iterator) would let apply continue while the file is written.

use crate::apply::ApplyBatch;
use crate::dedup::{DedupChanges, DedupEntry, DedupOp, DedupTable};
use crate::locks::LockTable;
use crate::types::{CommandResult, Entry, LogId, SnapshotMeta, StoredMembership, TypeConfig};
use futures::{Stream, TryStreamExt};
use meridian_storage::keys::{self, MetaKind, Span};
use meridian_storage::{Cf, Engine, WriteBatch};
use meridian_types::{Clock, ShardId, Timestamp};
use openraft::storage::{EntryResponder, RaftStateMachine};
use openraft::{EntryPayload, OptionalSend, RaftSnapshotBuilder};
use serde::{Deserialize, Serialize};
use std::io;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use crate::types::codec;

/// A snapshot's data: an SST file of the shard's MVCC range (None when the shard is empty), and
/// the replicated state that goes with it: the version floor and the write-dedup table.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotFile {
    pub path: Option<PathBuf>,
    pub version_floor: u64,
    pub dedup: Vec<DedupEntry>,
}

/// What is persisted about the current snapshot so it survives restarts.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct SnapshotRecord {
    meta: SnapshotMeta,
    file: SnapshotFile,
}

struct Inner {
    shard: ShardId,
    /// The user keys the shard owns (its data; see `meridian_storage::keys`).
    span: Span,
    engine: Arc<dyn Engine>,
    clock: Arc<Clock>,
    snapshot_dir: PathBuf,
    applied: Option<LogId>,
    membership: StoredMembership,
    version_floor: u64,
    dedup: DedupTable,
    current: Option<SnapshotRecord>,
    /// Also in `ShardStateMachine::locks`, for readers.
    locks: Arc<RwLock<LockTable>>,
    /// Set by [`ShardStateMachine::retire`]: nothing more is written.
    retired: bool,
}

/// Refuses a write to a retired replica's state (see [`ShardStateMachine::retire`]).
fn refuse_if_retired(inner: &Inner) -> io::Result<()> {
    if inner.retired {
        return Err(io_err(format!(
            "shard {}'s replica here was retired: its state is being deleted",
            inner.shard
        )));
    }
    Ok(())
}

/// Cheap to clone: clones share the state (the snapshot builder is a clone).
#[derive(Clone)]
pub struct ShardStateMachine {
    inner: Arc<tokio::sync::Mutex<Inner>>,
    shard: ShardId,
    /// `Inner::version_floor`, readable without the lock (reads use it as a lower bound).
    floor: Arc<AtomicU64>,
    /// The shard's prepared locks (see `locks`). Apply holds the write guard from its first
    /// command until its batch is in RocksDB, so a reader holding the read guard sees locks
    /// and data of the same applied state.
    locks: Arc<RwLock<LockTable>>,
}

fn io_err(e: impl std::fmt::Display) -> io::Error {
    io::Error::other(e.to_string())
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> io::Result<T> + Send + 'static,
) -> io::Result<T> {
    tokio::task::spawn_blocking(f).await.map_err(io_err)?
}

fn read_meta<T: serde::de::DeserializeOwned>(
    engine: &dyn Engine,
    shard: ShardId,
    kind: MetaKind,
) -> io::Result<Option<T>> {
    match engine
        .get(Cf::RaftMeta, &keys::raft_meta_key(shard, kind))
        .map_err(io_err)?
    {
        Some(b) => Ok(Some(codec::decode(&b)?)),
        None => Ok(None),
    }
}

impl ShardStateMachine {
    /// Loads the shard's applied state (blocking; call at startup). `span` is the user keys
    /// the shard owns: its snapshots carry them and apply refuses any other.
    pub fn open(
        shard: ShardId,
        span: Span,
        engine: Arc<dyn Engine>,
        clock: Arc<Clock>,
        snapshot_dir: PathBuf,
    ) -> io::Result<ShardStateMachine> {
        std::fs::create_dir_all(&snapshot_dir)?;
        let applied = read_meta::<Option<LogId>>(&*engine, shard, MetaKind::Applied)?.flatten();
        let membership = read_meta::<StoredMembership>(&*engine, shard, MetaKind::Membership)?
            .unwrap_or_default();
        let version_floor = read_meta::<u64>(&*engine, shard, MetaKind::VersionFloor)?.unwrap_or(0);
        let current = read_meta::<SnapshotRecord>(&*engine, shard, MetaKind::SnapshotMeta)?;
        let dedup = DedupTable::from_entries(read_dedup(&*engine, shard)?);
        let locks = Arc::new(RwLock::new(LockTable::new()));
        let mut inner = Inner {
            shard,
            span,
            engine,
            clock,
            snapshot_dir,
            applied,
            membership,
            version_floor,
            dedup,
            current,
            locks: locks.clone(),
            retired: false,
        };
        if let Some(marker) =
            read_meta::<SnapshotRecord>(&*inner.engine, shard, MetaKind::InstallMarker)?
        {
            tracing::warn!(%shard, index = ?marker.meta.last_log_id, "redoing an interrupted snapshot install");
            replace_data(&inner, &marker.file)?;
            if let Some(old) = finish_install(&mut inner, marker)? {
                let _ = std::fs::remove_file(old);
            }
        }
        merge_floor(&inner);
        load_locks(&inner, false)?;
        let floor = Arc::new(AtomicU64::new(inner.version_floor));
        Ok(ShardStateMachine {
            inner: Arc::new(tokio::sync::Mutex::new(inner)),
            shard,
            floor,
            locks,
        })
    }

    pub fn shard(&self) -> ShardId {
        self.shard
    }

    /// Applies committed `entries` as one apply call and returns their results: what
    /// openraft's `apply` does, for callers (tests) that have no responders to answer.
    pub async fn apply_for_results(&self, entries: Vec<Entry>) -> io::Result<Vec<CommandResult>> {
        let mut guard = self.inner.clone().lock_owned().await;
        refuse_if_retired(&guard)?;
        // Applying reads RocksDB (compare-and-swap conditions) and writes it: off the reactor,
        // in one blocking task per apply call.
        let (guard, results) = blocking(move || {
            let results = apply_entries(&mut guard, entries)?;
            Ok((guard, results))
        })
        .await?;
        merge_floor(&guard);
        self.floor.store(guard.version_floor, Ordering::Release);
        drop(guard);
        Ok(results)
    }

    /// Stops every later write of this state machine (apply, snapshot build or install): each
    /// then fails, writing nothing. Called when the replica is retired (`retire`), after its
    /// Raft shut down and before its state is deleted. openraft's shutdown does not wait for
    /// the state machine's worker, whose apply of entries already committed could otherwise
    /// land after the deletion and leave an applied index without the data before it (a
    /// replica added back then started from that index: in a Jepsen set × membership run the
    /// re-added node's replica lacked 1,891 acknowledged adds, while reads through the leader
    /// saw them all). Waits for a write in progress to end (each holds the state's lock).
    pub async fn retire(&self) {
        self.inner.lock().await.retired = true;
    }

    /// The shard's prepared locks and recent resolutions (`resolutions`): hold the read guard
    /// across a read of the shard's data so all are of one applied state.
    pub fn locks(&self) -> Arc<RwLock<LockTable>> {
        self.locks.clone()
    }

    /// This replica's closed timestamp (see `closed_ts`): its applied state is final at and
    /// below it.
    pub fn closed_ts(&self) -> u64 {
        let table = self.locks.read().unwrap_or_else(|p| p.into_inner());
        table.closed.ts()
    }

    /// A closed timestamp from the shard's leader's side channel: it counts once `index` is
    /// applied (see `closed_ts`).
    pub fn offer_closed(&self, index: u64, closed_ts: u64) {
        let mut table = self.locks.write().unwrap_or_else(|p| p.into_inner());
        table.closed.offer(index, closed_ts);
    }

    /// Directory incoming snapshot files are received into.
    pub async fn snapshot_dir(&self) -> PathBuf {
        self.inner.lock().await.snapshot_dir.clone()
    }

    /// The shard's highest applied version timestamp.
    pub async fn version_floor(&self) -> u64 {
        self.inner.lock().await.version_floor
    }

    /// Whether a GC pass at `threshold` would delete anything or report a stuck record, from
    /// this replica's applied state (`gc_survey`; blocking work on the blocking pool). The
    /// leader asks before proposing a pass.
    pub async fn gc_would_collect(&self, threshold: u64) -> io::Result<bool> {
        let (engine, shard, span) = {
            let inner = self.inner.lock().await;
            (inner.engine.clone(), inner.shard, inner.span.clone())
        };
        let current = self
            .locks
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .gc_threshold;
        blocking(move || {
            crate::gc_survey::would_collect(&*engine, shard, &span, current, threshold)
        })
        .await
    }

    /// The shard's highest applied version timestamp, without waiting for apply. A read served
    /// after applying up to its read index must read at or above this, whatever the local clock
    /// says (see `meridian-server`'s `Kv` service).
    pub fn applied_floor(&self) -> Timestamp {
        Timestamp(self.floor.load(Ordering::Acquire))
    }

    /// Test hook: runs the first two steps of a snapshot install (marker, data replaced) and
    /// stops as a crash there would, leaving the rest to [`ShardStateMachine::open`]'s redo.
    #[doc(hidden)]
    pub async fn install_snapshot_then_crash(
        &self,
        meta: &SnapshotMeta,
        snapshot: SnapshotFile,
    ) -> io::Result<()> {
        let inner = self.inner.lock().await;
        let record = SnapshotRecord {
            meta: meta.clone(),
            file: snapshot,
        };
        write_marker(&inner, &record).await?;
        let engine = inner.engine.clone();
        let (shard, span, file) = (inner.shard, inner.span.clone(), record.file.clone());
        blocking(move || replace_data_with(&*engine, shard, &span, &file)).await
    }
}

/// Rebuilds the in-memory lock table from the shard's transaction region; after a snapshot
/// install (`installed`), the recent resolutions are known only up to the installed floor.
fn load_locks(inner: &Inner, installed: bool) -> io::Result<()> {
    let (start, end) = keys::txn_kind_range(inner.shard, keys::TxnKeyKind::Locks);
    let mut table = LockTable::new();
    for item in inner.engine.scan(Cf::Data, &start, Some(&end), false) {
        let (k, v) = item.map_err(io_err)?;
        let (_, client_id, seq) = keys::decode_txn_key(&k).map_err(io_err)?;
        table.insert(
            crate::types::RequestId { client_id, seq },
            codec::decode(&v)?,
        );
    }
    table.gc_threshold = match inner
        .engine
        .get(Cf::Data, &keys::gc_threshold_key(inner.shard))
        .map_err(io_err)?
    {
        Some(raw) => u64::from_be_bytes(raw.as_slice().try_into().map_err(|_| {
            io_err(format!(
                "shard {}: GC threshold is {} bytes, want 8",
                inner.shard,
                raw.len()
            ))
        })?),
        None => 0,
    };
    let mut guard = inner.locks.write().unwrap_or_else(|p| p.into_inner());
    if installed {
        table.resolutions = std::mem::take(&mut guard.resolutions);
        table.resolutions.installed(inner.version_floor);
        // A closed timestamp is a promise about log indexes, and an install only moves the
        // applied index forward: what was closed stays closed (the table used to be replaced
        // whole, which would have dropped it).
        table.closed = std::mem::take(&mut guard.closed);
    }
    table
        .closed
        .on_applied(inner.applied.map_or(0, |id| id.index));
    *guard = table;
    Ok(())
}

fn read_dedup(engine: &dyn Engine, shard: ShardId) -> io::Result<Vec<DedupEntry>> {
    let (start, end) = keys::dedup_range(shard);
    let mut entries = Vec::new();
    for item in engine.scan(Cf::RaftMeta, &start, Some(&end), false) {
        let (k, v) = item.map_err(io_err)?;
        let (client_id, seq) = keys::decode_dedup_key(&k).map_err(io_err)?;
        let commit_ts = u64::from_be_bytes(
            v.as_slice()
                .try_into()
                .map_err(|_| io_err(format!("dedup entry of {} bytes, want 8", v.len())))?,
        );
        entries.push(DedupEntry {
            id: crate::types::RequestId { client_id, seq },
            commit_ts,
        });
    }
    Ok(entries)
}

/// Adds one dedup entry to `batch` (the encoding [`read_dedup`] reads back).
fn put_dedup_entry(batch: &mut WriteBatch, shard: ShardId, entry: &DedupEntry) {
    batch.put(
        Cf::RaftMeta,
        keys::dedup_key(shard, entry.id.client_id, entry.id.seq),
        entry.commit_ts.to_be_bytes().to_vec(),
    );
}

/// Adds the dedup table's changes to `batch`, in the order they happened.
fn put_dedup_changes(batch: &mut WriteBatch, shard: ShardId, changes: DedupChanges) {
    for op in changes.ops {
        match op {
            DedupOp::Put(entry) => put_dedup_entry(batch, shard, &entry),
            DedupOp::Delete(id) => {
                batch.delete(Cf::RaftMeta, keys::dedup_key(shard, id.client_id, id.seq))
            }
        }
    }
}

/// Merges the shard's floor into the node's HLC so timestamps it proposes next are above every
/// applied version. A floor beyond `max_offset` is refused by the clock: this node's clock is
/// far behind the shard's history. Reads stay correct (they read at `max(now, floor)`) and
/// apply raises proposed timestamps above the floor, but it is a clock fault worth an alarm.
fn merge_floor(inner: &Inner) {
    if inner.version_floor == 0 {
        return;
    }
    if let Err(e) = inner.clock.update(Timestamp(inner.version_floor)) {
        tracing::error!(shard = %inner.shard, error = %e, "local clock is behind the shard's applied versions by more than max_offset");
    }
}

/// Step 1 of an install: the synced marker.
async fn write_marker(inner: &Inner, record: &SnapshotRecord) -> io::Result<()> {
    let mut batch = WriteBatch::new();
    batch.put(
        Cf::RaftMeta,
        keys::raft_meta_key(inner.shard, MetaKind::InstallMarker),
        codec::encode(record)?,
    );
    let engine = inner.engine.clone();
    blocking(move || engine.write(batch, true).map_err(io_err)).await
}

/// The two `Cf::Data` ranges a snapshot of the shard holds, ascending: its shard-local keys
/// (transaction region, GC threshold) and its span's MVCC data.
pub(crate) fn snapshot_ranges(shard: ShardId, span: &Span) -> [(Vec<u8>, Vec<u8>); 2] {
    [keys::shard_local_range(shard), span.data_range()]
}

/// Step 2 of an install: the shard's snapshot ranges become the file's contents.
fn replace_data_with(
    engine: &dyn Engine,
    shard: ShardId,
    span: &Span,
    file: &SnapshotFile,
) -> io::Result<()> {
    if let Some(path) = &file.path {
        if !path.exists() {
            return Err(io_err(format!(
                "snapshot file {} of an install is missing; the shard cannot be restored from it",
                path.display()
            )));
        }
    }
    let ranges = snapshot_ranges(shard, span);
    let ranges = ranges.each_ref().map(|(s, e)| (s.as_slice(), e.as_slice()));
    engine
        .ingest_sst(Cf::Data, &ranges, file.path.as_deref())
        .map_err(io_err)
}

fn replace_data(inner: &Inner, file: &SnapshotFile) -> io::Result<()> {
    replace_data_with(&*inner.engine, inner.shard, &inner.span, file)
}

/// Step 3 of an install (blocking): the shard's state becomes the snapshot's, synced, and the
/// marker goes in the same batch. Returns the previous snapshot's file for the caller to delete.
fn finish_install(inner: &mut Inner, record: SnapshotRecord) -> io::Result<Option<PathBuf>> {
    inner.applied = record.meta.last_log_id;
    inner.membership = record.meta.last_membership.clone();
    inner.version_floor = inner.version_floor.max(record.file.version_floor);
    let mut batch = WriteBatch::new();
    let (start, end) = keys::dedup_range(inner.shard);
    batch.delete_range(Cf::RaftMeta, start, end);
    inner.dedup = DedupTable::from_entries(record.file.dedup.iter().copied());
    for entry in &record.file.dedup {
        put_dedup_entry(&mut batch, inner.shard, entry);
    }
    put_state(&mut batch, inner)?;
    batch.put(
        Cf::RaftMeta,
        keys::raft_meta_key(inner.shard, MetaKind::SnapshotMeta),
        codec::encode(&record)?,
    );
    batch.delete(
        Cf::RaftMeta,
        keys::raft_meta_key(inner.shard, MetaKind::InstallMarker),
    );
    inner.engine.write(batch, true).map_err(io_err)?;
    let new_path = record.file.path.clone();
    let previous = inner.current.replace(record).and_then(|r| r.file.path);
    Ok(previous.filter(|old| Some(old) != new_path.as_ref()))
}

/// Applies `entries` in order (blocking) and returns each entry's result: as ONE RocksDB batch
/// with the new applied state, except that a [`Command::Gc`] or [`Command::GcRecords`] starts
/// a batch of its own, so its page reads RocksDB with every earlier entry in it and every
/// replica, however it groups entries into apply calls, deletes the same versions; and a
/// `GcRecords` page ends its batch too, so what follows reads the records it deleted as gone
/// (a version GC page need not: what it deletes reads the same to every later command).
///
/// [`Command::Gc`]: crate::types::Command::Gc
/// [`Command::GcRecords`]: crate::types::Command::GcRecords
fn apply_entries(inner: &mut Inner, entries: Vec<Entry>) -> io::Result<Vec<CommandResult>> {
    let mut results = Vec::with_capacity(entries.len());
    let mut rest = entries.into_iter().peekable();
    while let Some(first) = rest.next() {
        // A record GC page is a run of its own: the entries after it must read the records
        // it deleted as gone (its deletes are only in its batch), on every replica alike.
        let alone = is_gc_records(&first);
        let mut run = vec![first];
        while let Some(next) = rest.next_if(|e| !alone && !is_gc(e)) {
            run.push(next);
        }
        results.extend(apply_run(inner, run)?);
    }
    Ok(results)
}

fn is_gc_records(entry: &Entry) -> bool {
    matches!(
        &entry.payload,
        EntryPayload::Normal(crate::types::Command::GcRecords { .. })
    )
}

fn is_gc(entry: &Entry) -> bool {
    matches!(
        &entry.payload,
        EntryPayload::Normal(
            crate::types::Command::Gc { .. } | crate::types::Command::GcRecords { .. }
        )
    )
}

/// [`apply_entries`] for a run of entries that holds no GC command but maybe its first.
fn apply_run(inner: &mut Inner, entries: Vec<Entry>) -> io::Result<Vec<CommandResult>> {
    let shard = inner.shard;
    let engine = inner.engine.clone();
    let locks = inner.locks.clone();
    let mut table = locks.write().unwrap_or_else(|p| p.into_inner());
    let mut work = ApplyBatch::new(
        shard,
        &inner.span,
        &*engine,
        &mut inner.version_floor,
        &mut inner.dedup,
        &mut table,
    );
    let mut results = Vec::with_capacity(entries.len());
    for entry in entries {
        // openraft marks the whole requested range applied, whatever the stream yielded: a gap
        // here means committed entries were skipped (as a short log read once did). openraft's
        // own storage suite applies non-consecutive entries, so this is an alarm, not an error.
        if let Some(applied) = inner.applied {
            if entry.log_id.index > applied.index + 1 {
                tracing::error!(
                    %shard,
                    applied = applied.index,
                    next = entry.log_id.index,
                    "apply skipped committed entries: the log reader returned a gap"
                );
            }
        }
        let mut result = CommandResult::default();
        match entry.payload {
            EntryPayload::Blank => {}
            EntryPayload::Normal(cmd) => result = work.apply(cmd, entry.log_id.leader_id.term)?,
            EntryPayload::Membership(m) => {
                inner.membership = StoredMembership::new(Some(entry.log_id), m);
            }
        }
        inner.applied = Some(entry.log_id);
        results.push(result);
    }
    let (mut batch, changes, closed) = (work.batch, work.changes, work.closed);
    put_dedup_changes(&mut batch, shard, changes);
    put_state(&mut batch, inner)?;
    engine.write(batch, false).map_err(io_err)?;
    // Still under the write guard: readers see the closed timestamp with the data it covers.
    table.closed.on_entry(closed);
    table
        .closed
        .on_applied(inner.applied.map_or(0, |id| id.index));
    drop(table);
    Ok(results)
}

fn put_state(batch: &mut WriteBatch, inner: &Inner) -> io::Result<()> {
    let shard = inner.shard;
    batch.put(
        Cf::RaftMeta,
        keys::raft_meta_key(shard, MetaKind::Applied),
        codec::encode(&inner.applied)?,
    );
    batch.put(
        Cf::RaftMeta,
        keys::raft_meta_key(shard, MetaKind::Membership),
        codec::encode(&inner.membership)?,
    );
    batch.put(
        Cf::RaftMeta,
        keys::raft_meta_key(shard, MetaKind::VersionFloor),
        codec::encode(&inner.version_floor)?,
    );
    Ok(())
}

impl RaftSnapshotBuilder<TypeConfig> for ShardStateMachine {
    type SnapshotData = SnapshotFile;

    async fn build_snapshot(&mut self) -> io::Result<crate::types::Snapshot> {
        let mut inner = self.inner.lock().await;
        refuse_if_retired(&inner)?;
        let shard = inner.shard;
        let last = inner.applied;
        let index = last.as_ref().map(|l| l.index).unwrap_or(0);
        let final_path = inner
            .snapshot_dir
            .join(format!("shard-{}-{index}.sst", shard.0));
        let tmp_path = inner
            .snapshot_dir
            .join(format!("shard-{}-{index}.sst.tmp", shard.0));
        let engine = inner.engine.clone();
        let ranges = snapshot_ranges(shard, &inner.span);
        let (tmp, fin) = (tmp_path.clone(), final_path.clone());
        let written = blocking(move || {
            let _ = std::fs::remove_file(&tmp);
            let ranges = ranges.each_ref().map(|(s, e)| (s.as_slice(), e.as_slice()));
            let n = engine.export_sst(Cf::Data, &ranges, &tmp).map_err(io_err)?;
            if n > 0 {
                std::fs::rename(&tmp, &fin)?;
            }
            Ok(n)
        })
        .await?;
        let file = SnapshotFile {
            path: (written > 0).then_some(final_path),
            version_floor: inner.version_floor,
            dedup: inner.dedup.entries(),
        };
        let meta = SnapshotMeta {
            last_log_id: last,
            last_membership: inner.membership.clone(),
        };
        let record = SnapshotRecord {
            meta: meta.clone(),
            file: file.clone(),
        };
        let mut batch = WriteBatch::new();
        batch.put(
            Cf::RaftMeta,
            keys::raft_meta_key(shard, MetaKind::SnapshotMeta),
            codec::encode(&record)?,
        );
        let engine = inner.engine.clone();
        // Synced before the previous file goes: a crash must not leave a record naming a
        // deleted file.
        blocking(move || engine.write(batch, true).map_err(io_err)).await?;
        let previous = inner.current.replace(record);
        if let Some(old) = previous.and_then(|r| r.file.path) {
            if Some(&old) != file.path.as_ref() {
                let _ = std::fs::remove_file(old);
            }
        }
        tracing::info!(%shard, index, keys = written, "built snapshot");
        Ok(crate::types::Snapshot {
            meta,
            snapshot: file,
        })
    }
}

impl RaftStateMachine<TypeConfig> for ShardStateMachine {
    type SnapshotData = SnapshotFile;
    type SnapshotBuilder = Self;

    async fn applied_state(&mut self) -> io::Result<(Option<LogId>, StoredMembership)> {
        let inner = self.inner.lock().await;
        Ok((inner.applied, inner.membership.clone()))
    }

    async fn apply<Strm>(&mut self, mut entries: Strm) -> io::Result<()>
    where
        Strm: Stream<Item = io::Result<EntryResponder<TypeConfig>>> + Unpin + OptionalSend,
    {
        let mut applying = Vec::new();
        let mut responders = Vec::new();
        while let Some((entry, responder)) = entries.try_next().await? {
            responders.push(responder);
            applying.push(entry);
        }
        let results = self.apply_for_results(applying).await?;
        for (responder, result) in responders.into_iter().zip(results) {
            if let Some(r) = responder {
                r.send(result);
            }
        }
        Ok(())
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta,
        snapshot: SnapshotFile,
    ) -> io::Result<()> {
        let mut guard = self.inner.clone().lock_owned().await;
        refuse_if_retired(&guard)?;
        let record = SnapshotRecord {
            meta: meta.clone(),
            file: snapshot,
        };
        write_marker(&guard, &record).await?;
        let (guard, previous) = tokio::task::spawn_blocking(move || {
            let inner: &mut Inner = &mut guard;
            replace_data(inner, &record.file)?;
            let previous = finish_install(inner, record)?;
            load_locks(inner, true)?;
            Ok::<_, io::Error>((guard, previous))
        })
        .await
        .map_err(io_err)??;
        merge_floor(&guard);
        self.floor.store(guard.version_floor, Ordering::Release);
        if let Some(old) = previous {
            let _ = std::fs::remove_file(old);
        }
        tracing::info!(shard = %guard.shard, applied = ?guard.applied, "installed snapshot");
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> io::Result<Option<crate::types::Snapshot>> {
        let inner = self.inner.lock().await;
        Ok(inner.current.as_ref().map(|r| crate::types::Snapshot {
            meta: r.meta.clone(),
            snapshot: r.file.clone(),
        }))
    }
}
