//! The replicated state's encoding in RocksDB (`Cf::RaftMeta` and the shard's transaction
//! region): the applied log id, membership and version floor, the write-dedup table, and the
//! prepared locks and GC threshold the lock table is rebuilt from.

use super::{io_err, Inner};
use crate::dedup::{DedupChanges, DedupEntry, DedupOp};
use crate::locks::LockTable;
use crate::types::codec;
use meridian_storage::keys::{self, MetaKind};
use meridian_storage::{Cf, Engine, WriteBatch};
use meridian_types::ShardId;
use std::io;

/// Reads one of the shard's Raft meta values (None: never written).
pub(super) fn read_meta<T: serde::de::DeserializeOwned>(
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

/// Adds the shard's applied log id, membership and version floor to `batch`.
pub(super) fn put_state(batch: &mut WriteBatch, inner: &Inner) -> io::Result<()> {
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

/// Rebuilds the in-memory lock table from the shard's transaction region; after a snapshot
/// install (`installed`), the recent resolutions are known only up to the installed floor.
pub(super) fn load_locks(inner: &Inner, installed: bool) -> io::Result<()> {
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

pub(super) fn read_dedup(engine: &dyn Engine, shard: ShardId) -> io::Result<Vec<DedupEntry>> {
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
pub(super) fn put_dedup_entry(batch: &mut WriteBatch, shard: ShardId, entry: &DedupEntry) {
    batch.put(
        Cf::RaftMeta,
        keys::dedup_key(shard, entry.id.client_id, entry.id.seq),
        entry.commit_ts.to_be_bytes().to_vec(),
    );
}

/// Adds the dedup table's changes to `batch`, in the order they happened.
pub(super) fn put_dedup_changes(batch: &mut WriteBatch, shard: ShardId, changes: DedupChanges) {
    for op in changes.ops {
        match op {
            DedupOp::Put(entry) => put_dedup_entry(batch, shard, &entry),
            DedupOp::Delete(id) => {
                batch.delete(Cf::RaftMeta, keys::dedup_key(shard, id.client_id, id.seq))
            }
        }
    }
}
