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
//! # Files
//! - `mod.rs` (this file): the state machine, its apply, and openraft's `RaftStateMachine`.
//! - `snapshot`: snapshots are SST files; building, installing (crash-atomic) and redoing
//!   an interrupted install.
//! - `persist`: the replicated state's RocksDB encoding (applied state, dedup table, locks).
//!
//! # Not done yet
//! - Building a snapshot holds the shard's state-machine lock (apply waits). A RocksDB snapshot
//!   (point-in-time iterator) would let apply continue while the file is written.

mod persist;
mod snapshot;

pub(crate) use snapshot::snapshot_ranges;
pub use snapshot::SnapshotFile;

use crate::apply::ApplyBatch;
use crate::dedup::DedupTable;
use crate::locks::LockTable;
use crate::types::{CommandResult, Entry, LogId, SnapshotMeta, StoredMembership, TypeConfig};
use futures::{Stream, TryStreamExt};
use meridian_storage::keys::{MetaKind, Span};
use meridian_storage::Engine;
use meridian_types::{Clock, ShardId, Timestamp};
use openraft::storage::{EntryResponder, RaftStateMachine};
use openraft::{EntryPayload, OptionalSend};
use persist::{load_locks, put_dedup_changes, put_state, read_dedup, read_meta};
use snapshot::{finish_install, replace_data, SnapshotRecord};
use std::io;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

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
        self.install(meta, snapshot).await
    }

    async fn get_current_snapshot(&mut self) -> io::Result<Option<crate::types::Snapshot>> {
        Ok(self.current().await)
    }
}
