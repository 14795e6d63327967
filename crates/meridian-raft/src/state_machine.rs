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
//! # Snapshots are files
//! A snapshot is the shard's MVCC key range written into one SST file (RocksDB `SstFileWriter`)
//! plus the Raft meta; installing one deletes the range and ingests the file. The file is what
//! travels over the network (see `network`), in checksummed chunks, never as one in-memory blob.
//!
//! # Not done yet
//! - Building a snapshot holds the shard's state-machine lock (apply waits). A RocksDB snapshot
//!   (point-in-time iterator) would let apply continue while the file is written.
//! - Old MVCC versions are never garbage-collected.

use crate::types::{Command, CommandResult, LogId, SnapshotMeta, StoredMembership, TypeConfig};
use futures::{Stream, TryStreamExt};
use meridian_storage::keys::{self, MetaKind};
use meridian_storage::{mvcc, Cf, Engine, WriteBatch};
use meridian_types::{Clock, ShardId, Timestamp};
use openraft::storage::{EntryResponder, RaftStateMachine};
use openraft::{EntryPayload, OptionalSend, RaftSnapshotBuilder};
use serde::{Deserialize, Serialize};
use std::io;
use std::path::PathBuf;
use std::sync::Arc;

use crate::types::codec;

/// A snapshot's data: an SST file of the shard's MVCC range (None when the shard is empty), and
/// the version floor that goes with it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotFile {
    pub path: Option<PathBuf>,
    pub version_floor: u64,
}

/// What is persisted about the current snapshot so it survives restarts.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct SnapshotRecord {
    meta: SnapshotMeta,
    file: SnapshotFile,
}

struct Inner {
    shard: ShardId,
    engine: Arc<dyn Engine>,
    clock: Arc<Clock>,
    snapshot_dir: PathBuf,
    applied: Option<LogId>,
    membership: StoredMembership,
    version_floor: u64,
    current: Option<SnapshotRecord>,
}

/// Cheap to clone: clones share the state (the snapshot builder is a clone).
#[derive(Clone)]
pub struct ShardStateMachine {
    inner: Arc<tokio::sync::Mutex<Inner>>,
    shard: ShardId,
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
    /// Loads the shard's applied state (blocking; call at startup).
    pub fn open(
        shard: ShardId,
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
        if version_floor > 0 {
            let _ = clock.update(Timestamp(version_floor));
        }
        Ok(ShardStateMachine {
            inner: Arc::new(tokio::sync::Mutex::new(Inner {
                shard,
                engine,
                clock,
                snapshot_dir,
                applied,
                membership,
                version_floor,
                current,
            })),
            shard,
        })
    }

    pub fn shard(&self) -> ShardId {
        self.shard
    }

    /// Directory incoming snapshot files are received into.
    pub async fn snapshot_dir(&self) -> PathBuf {
        self.inner.lock().await.snapshot_dir.clone()
    }

    /// The shard's highest applied version timestamp.
    pub async fn version_floor(&self) -> u64 {
        self.inner.lock().await.version_floor
    }
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
        let (start, end) = keys::shard_data_range(shard);
        let (tmp, fin) = (tmp_path.clone(), final_path.clone());
        let written = blocking(move || {
            let _ = std::fs::remove_file(&tmp);
            let n = engine
                .export_range_sst(Cf::Data, &start, &end, &tmp)
                .map_err(io_err)?;
            if n > 0 {
                std::fs::rename(&tmp, &fin)?;
            }
            Ok(n)
        })
        .await?;
        let file = SnapshotFile {
            path: (written > 0).then_some(final_path),
            version_floor: inner.version_floor,
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
        blocking(move || engine.write(batch, false).map_err(io_err)).await?;
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
        let mut inner = self.inner.lock().await;
        let shard = inner.shard;
        let mut batch = WriteBatch::new();
        let mut replies = Vec::new();
        while let Some((entry, responder)) = entries.try_next().await? {
            let mut result = CommandResult::default();
            match entry.payload {
                EntryPayload::Blank => {}
                EntryPayload::Normal(Command::Write { ts, puts, deletes }) => {
                    let ts = ts.max(inner.version_floor.saturating_add(1));
                    inner.version_floor = ts;
                    for (k, v) in &puts {
                        mvcc::put(&mut batch, shard, k, Timestamp(ts), v);
                    }
                    for k in &deletes {
                        mvcc::delete(&mut batch, shard, k, Timestamp(ts));
                    }
                    result.commit_ts = ts;
                }
                EntryPayload::Membership(m) => {
                    inner.membership = StoredMembership::new(Some(entry.log_id), m);
                }
            }
            inner.applied = Some(entry.log_id);
            if let Some(r) = responder {
                replies.push((r, result));
            }
        }
        put_state(&mut batch, &inner)?;
        let engine = inner.engine.clone();
        blocking(move || engine.write(batch, false).map_err(io_err)).await?;
        // A floor beyond max_offset can only come from a leader whose clock was accepted
        // earlier; the entries are committed, so apply them regardless and keep our clock.
        let _ = inner.clock.update(Timestamp(inner.version_floor));
        drop(inner);
        for (r, result) in replies {
            r.send(result);
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
        let mut inner = self.inner.lock().await;
        let shard = inner.shard;
        let engine = inner.engine.clone();
        let (start, end) = keys::shard_data_range(shard);
        let path = snapshot.path.clone();
        blocking(move || {
            engine
                .ingest_range_sst(Cf::Data, &start, &end, path.as_deref())
                .map_err(io_err)
        })
        .await?;
        inner.applied = meta.last_log_id;
        inner.membership = meta.last_membership.clone();
        inner.version_floor = inner.version_floor.max(snapshot.version_floor);
        let record = SnapshotRecord {
            meta: meta.clone(),
            file: snapshot,
        };
        let mut batch = WriteBatch::new();
        put_state(&mut batch, &inner)?;
        batch.put(
            Cf::RaftMeta,
            keys::raft_meta_key(shard, MetaKind::SnapshotMeta),
            codec::encode(&record)?,
        );
        let engine = inner.engine.clone();
        blocking(move || engine.write(batch, true).map_err(io_err)).await?;
        let _ = inner.clock.update(Timestamp(inner.version_floor));
        if let Some(old) = inner.current.replace(record).and_then(|r| r.file.path) {
            let _ = std::fs::remove_file(old);
        }
        tracing::info!(%shard, applied = ?inner.applied, "installed snapshot");
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
