//! A shard's write-dedup table: which request ids it has applied, and at what timestamp.
//!
//! # Why
//! A client cannot always learn whether a write committed: the leader may lose leadership after
//! appending it (openraft's `LogEntryDiscarded`: "commit status unknown"), the connection may
//! drop after the proposal, a deadline may pass. Retrying such a write blindly can apply it
//! twice, around another client's write to the same key (readers see v1, v2, v1), or let a
//! retried delete erase a later put. So every write carries a [`RequestId`] that stays the same
//! across its retries, and apply consults this table: an id already applied is answered with
//! the first application's commit timestamp and writes nothing (Raft dissertation §6.3, client
//! sessions; CockroachDB and TiKV deduplicate the same way inside the replicated state).
//!
//! # Determinism
//! The table is replicated state: every replica must make the same decisions from the same log.
//! So it changes only in apply, and expiry is driven by the *applied entry's* timestamp, never
//! by a local clock: an entry expires once a later write of the shard carries a timestamp
//! [`DEDUP_WINDOW_MS`] past it. It travels with snapshots (`SnapshotFile::dedup`).
//!
//! # Bounds
//! - At most [`MAX_DEDUP_ENTRIES_PER_SHARD`] entries; the oldest are evicted first.
//! - A client never sends an attempt later than [`MAX_WRITE_RETRY_MS`] after the first
//!   ([`DEDUP_WINDOW_MS`] is four times that), so a retry finds its id in the table.
//! - Not handled yet: a shard that applies more than [`MAX_DEDUP_ENTRIES_PER_SHARD`] writes
//!   within one window evicts ids before their window ends, and a retry of an evicted id would
//!   be applied again. At today's per-shard write rates (hundreds per second) the table holds
//!   several windows' worth.
//!
//! # Invariants
//! - `by_id` and `by_age` hold the same entries.
//! - Every change to the table is mirrored in the [`DedupChanges`] handed to the caller, which
//!   writes them in the same RocksDB batch as the data and the applied index.
//!
//! [`DEDUP_WINDOW_MS`]: meridian_types::limits::DEDUP_WINDOW_MS
//! [`MAX_DEDUP_ENTRIES_PER_SHARD`]: meridian_types::limits::MAX_DEDUP_ENTRIES_PER_SHARD
//! [`MAX_WRITE_RETRY_MS`]: meridian_types::limits::MAX_WRITE_RETRY_MS

use crate::types::RequestId;
use meridian_types::limits::{DEDUP_WINDOW_MS, MAX_DEDUP_ENTRIES_PER_SHARD};
use meridian_types::Timestamp;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeSet, HashMap};

/// One remembered write.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DedupEntry {
    pub id: RequestId,
    pub commit_ts: u64,
}

/// One change to persist.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DedupOp {
    Put(DedupEntry),
    Delete(RequestId),
}

/// Changes to persist, in the order they happened (an id removed and inserted again in one
/// batch must end up present).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct DedupChanges {
    pub ops: Vec<DedupOp>,
}

/// The table (see the module docs).
#[derive(Clone, Debug, Default)]
pub struct DedupTable {
    by_id: HashMap<RequestId, u64>,
    by_age: BTreeSet<(u64, RequestId)>,
    capacity: usize,
}

impl DedupTable {
    pub fn new() -> DedupTable {
        DedupTable::with_capacity(MAX_DEDUP_ENTRIES_PER_SHARD)
    }

    /// A table holding at most `capacity` entries (tests use small ones).
    pub fn with_capacity(capacity: usize) -> DedupTable {
        assert!(capacity > 0, "a dedup table needs room for one entry");
        DedupTable {
            by_id: HashMap::new(),
            by_age: BTreeSet::new(),
            capacity,
        }
    }

    /// Rebuilds a table from persisted or shipped entries.
    pub fn from_entries(entries: impl IntoIterator<Item = DedupEntry>) -> DedupTable {
        let mut table = DedupTable::new();
        for e in entries {
            table.by_id.insert(e.id, e.commit_ts);
            table.by_age.insert((e.commit_ts, e.id));
        }
        table
    }

    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }

    /// The commit timestamp `id` was applied at, if it is remembered.
    pub fn get(&self, id: &RequestId) -> Option<u64> {
        self.by_id.get(id).copied()
    }

    /// Every entry, oldest first (for snapshots).
    pub fn entries(&self) -> Vec<DedupEntry> {
        self.by_age
            .iter()
            .map(|(commit_ts, id)| DedupEntry {
                id: *id,
                commit_ts: *commit_ts,
            })
            .collect()
    }

    /// Records that `id` was applied at `commit_ts`, first expiring entries older than the
    /// window before `commit_ts` and evicting the oldest if the table is full.
    pub fn insert(&mut self, id: RequestId, commit_ts: u64, changes: &mut DedupChanges) {
        self.expire(commit_ts, changes);
        while self.by_id.len() >= self.capacity {
            let oldest = *self.by_age.iter().next().expect("a full table has entries");
            self.remove(oldest, changes);
        }
        if let Some(previous) = self.by_id.insert(id, commit_ts) {
            // Apply never inserts an id it found; keep the sets in step regardless.
            self.by_age.remove(&(previous, id));
        }
        self.by_age.insert((commit_ts, id));
        changes.ops.push(DedupOp::Put(DedupEntry { id, commit_ts }));
    }

    /// Drops every entry whose timestamp is more than the window below `now_ts`.
    pub fn expire(&mut self, now_ts: u64, changes: &mut DedupChanges) {
        let now_ms = Timestamp(now_ts).physical_ms();
        let cutoff_ms = now_ms.saturating_sub(DEDUP_WINDOW_MS);
        while let Some(&(ts, id)) = self.by_age.iter().next() {
            if Timestamp(ts).physical_ms() >= cutoff_ms {
                break;
            }
            self.remove((ts, id), changes);
        }
    }

    fn remove(&mut self, (ts, id): (u64, RequestId), changes: &mut DedupChanges) {
        self.by_age.remove(&(ts, id));
        self.by_id.remove(&id);
        changes.ops.push(DedupOp::Delete(id));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn id(client_id: u64, seq: u64) -> RequestId {
        RequestId { client_id, seq }
    }

    fn at_ms(ms: u64) -> u64 {
        Timestamp::from_physical_ms(ms).0
    }

    #[test]
    fn remembers_applied_ids_until_the_window_passes() {
        let mut table = DedupTable::new();
        let mut changes = DedupChanges::default();
        table.insert(id(1, 1), at_ms(1_000), &mut changes);
        assert_eq!(table.get(&id(1, 1)), Some(at_ms(1_000)));
        // Still remembered just inside the window.
        table.insert(id(1, 2), at_ms(1_000 + DEDUP_WINDOW_MS), &mut changes);
        assert_eq!(table.get(&id(1, 1)), Some(at_ms(1_000)));
        // A write past the window expires it, and the change is recorded for persistence.
        table.insert(id(2, 1), at_ms(1_001 + DEDUP_WINDOW_MS), &mut changes);
        assert_eq!(table.get(&id(1, 1)), None);
        assert!(changes.ops.contains(&DedupOp::Delete(id(1, 1))));
        let puts = changes
            .ops
            .iter()
            .filter(|op| matches!(op, DedupOp::Put(_)))
            .count();
        assert_eq!(puts, 3);
    }

    #[test]
    fn a_full_table_evicts_the_oldest_first() {
        let mut table = DedupTable::with_capacity(2);
        let mut changes = DedupChanges::default();
        table.insert(id(1, 1), at_ms(10), &mut changes);
        table.insert(id(1, 2), at_ms(20), &mut changes);
        table.insert(id(1, 3), at_ms(30), &mut changes);
        assert_eq!(table.len(), 2);
        assert_eq!(table.get(&id(1, 1)), None);
        let deletes: Vec<_> = changes
            .ops
            .iter()
            .filter(|op| matches!(op, DedupOp::Delete(_)))
            .collect();
        assert_eq!(deletes, vec![&DedupOp::Delete(id(1, 1))]);
    }

    proptest! {
        /// Replaying the same inserts on two tables (two replicas) gives the same entries, and
        /// a table rebuilt from a snapshot of one answers like the original.
        #[test]
        fn replicas_and_snapshots_agree(ops in proptest::collection::vec((0u64..4, 0u64..50, 0u64..400_000), 1..200)) {
            let mut a = DedupTable::with_capacity(64);
            let mut b = DedupTable::with_capacity(64);
            let mut ts_ms = 0u64;
            for (client, seq, step_ms) in ops {
                ts_ms += step_ms / 100;
                let (mut ca, mut cb) = (DedupChanges::default(), DedupChanges::default());
                if a.get(&id(client, seq)).is_none() {
                    a.insert(id(client, seq), at_ms(ts_ms), &mut ca);
                    b.insert(id(client, seq), at_ms(ts_ms), &mut cb);
                }
                prop_assert_eq!(ca, cb);
                prop_assert!(a.len() <= 64);
            }
            prop_assert_eq!(a.entries(), b.entries());
            let restored = DedupTable::from_entries(a.entries());
            for e in a.entries() {
                prop_assert_eq!(restored.get(&e.id), Some(e.commit_ts));
            }
        }
    }
}
