//! Retiring a replica: the shard map moved a shard away from this node, so its replica stops
//! and everything it stored is deleted.
//!
//! A replica's state is four key ranges of the node's one RocksDB: its span's MVCC data and its
//! shard-local keys (locks, records, GC threshold) in `Cf::Data`, its Raft log in `Cf::RaftLog`,
//! its vote, applied state, membership and dedup table in `Cf::RaftMeta`; plus its snapshot
//! files. Retiring stops the replica's Raft first, then its state machine (an apply, snapshot
//! build or install in progress ends, and every later one writes nothing: openraft's
//! shutdown does not stop the state machine's worker), then deletes the ranges in one batch
//! queued on the node's log writer, behind every log write of the shard queued before, so no
//! late append or apply can bring a piece back.
//!
//! # Invariants
//! - Only a shard this node hosts is retired, and the caller has seen a committed membership
//!   without this node (the map changes only after the change committed).
//! - Spans of data shards never overlap, so deleting this span's data touches no other replica.
//!
//! # Not done yet
//! - A crash between adopting the map that drops the replica and the deletion leaves its data
//!   behind (harmless: the replica is not opened again, and if the node is added back, Raft
//!   brings the old state up to date like a long-lagging follower). Nothing sweeps it yet.

use crate::host::MultiRaft;
use crate::log_writer::LogWork;
use meridian_storage::keys::{self, Span};
use meridian_storage::{Cf, WriteBatch};
use meridian_types::ShardId;

impl MultiRaft {
    /// Stops this node's replica of `shard` (which owned `span`) and deletes its state; a
    /// shard without a replica here is a no-op. Returns whether a replica was retired.
    pub async fn retire_shard(&self, shard: ShardId, span: &Span) -> Result<bool, String> {
        let Some(replica) = self.remove_replica(shard) else {
            return Ok(false);
        };
        if let Err(e) = replica.raft.shutdown().await {
            tracing::warn!(%shard, error = %e, "raft shutdown of a retired replica");
        }
        // openraft's shutdown leaves the state machine's worker running: an apply already
        // handed to it would write after the deletion below (see `ShardStateMachine::retire`).
        replica.sm.retire().await;
        let mut batch = WriteBatch::new();
        for (start, end) in crate::state_machine::snapshot_ranges(shard, span) {
            batch.delete_range(Cf::Data, start, end);
        }
        let (start, end) = keys::raft_log_range(shard);
        batch.delete_range(Cf::RaftLog, start, end);
        let (start, end) = keys::raft_meta_range(shard);
        batch.delete_range(Cf::RaftMeta, start, end);
        let (done, written) = tokio::sync::oneshot::channel();
        self.writer
            .submit(LogWork {
                batch,
                written: Some(Box::new(move || {
                    let _ = done.send(());
                })),
                flushed: None,
            })
            .await
            .map_err(|e| format!("queueing the deletion of shard {shard}'s replica: {e}"))?;
        written
            .await
            .map_err(|_| format!("the log writer stopped before deleting shard {shard}"))?;
        let dir = self
            .data_dir
            .join("snapshots")
            .join(format!("shard-{}", shard.0));
        match tokio::fs::remove_dir_all(&dir).await {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                tracing::warn!(%shard, error = %e, dir = %dir.display(), "removing a retired replica's snapshots")
            }
        }
        tracing::info!(%shard, "retired this node's replica: its data is deleted");
        Ok(true)
    }
}
