//! Snapshots of a shard's state machine.
//!
//! # Snapshots are files
//! A snapshot is the shard's data written into one SST file (RocksDB `SstFileWriter`): two
//! ranges of `Cf::Data`, its shard-local keys (prepared locks, transaction records, GC
//! threshold) and its span's MVCC versions (`meridian_storage::keys`) — plus the Raft meta, the
//! version floor and the dedup table; installing one deletes both ranges (the other shards'
//! keys between them are untouched) and ingests the file. The file is what travels over the
//! network (see `network`), in checksummed chunks, never as one in-memory blob.
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

use super::persist::{load_locks, put_dedup_entry, put_state};
use super::{blocking, io_err, merge_floor, refuse_if_retired, Inner, ShardStateMachine};
use crate::dedup::{DedupEntry, DedupTable};
use crate::types::{codec, SnapshotMeta, TypeConfig};
use meridian_storage::keys::{self, MetaKind, Span};
use meridian_storage::{Cf, Engine, WriteBatch};
use meridian_types::ShardId;
use openraft::RaftSnapshotBuilder;
use serde::{Deserialize, Serialize};
use std::io;
use std::path::PathBuf;
use std::sync::atomic::Ordering;

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
pub(super) struct SnapshotRecord {
    pub(super) meta: SnapshotMeta,
    pub(super) file: SnapshotFile,
}

impl ShardStateMachine {
    /// openraft's `install_snapshot`: the three steps above, under the state's lock.
    pub(super) async fn install(
        &self,
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

    /// openraft's `get_current_snapshot`: the last one built or installed.
    pub(super) async fn current(&self) -> Option<crate::types::Snapshot> {
        let inner = self.inner.lock().await;
        inner.current.as_ref().map(|r| crate::types::Snapshot {
            meta: r.meta.clone(),
            snapshot: r.file.clone(),
        })
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

pub(super) fn replace_data(inner: &Inner, file: &SnapshotFile) -> io::Result<()> {
    replace_data_with(&*inner.engine, inner.shard, &inner.span, file)
}

/// Step 3 of an install (blocking): the shard's state becomes the snapshot's, synced, and the
/// marker goes in the same batch. Returns the previous snapshot's file for the caller to delete.
pub(super) fn finish_install(
    inner: &mut Inner,
    record: SnapshotRecord,
) -> io::Result<Option<PathBuf>> {
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
