//! The in-memory end of one shard's Raft log: the entries appended but not yet written to
//! RocksDB, and the written ones apply has not read yet.
//!
//! # Why keep written entries
//! openraft requires an appended entry to be readable as soon as `append` returns, before the
//! node's log writer has written it, so unwritten entries were always held here. They used to
//! leave the moment the writer had written them. But every entry is read at least twice after
//! that: by the leader's replication to each follower, and by apply (on every replica) once
//! it commits, which comes after the write on the leader (the quorum waits for the fsync)
//! and usually after it on a follower too. Each of those reads went to the blocking pool (a
//! thread hand-off each way) and through a RocksDB iterator. Now an entry stays until apply
//! has read it or the tail holds more than [`MAX_CACHED_ENTRIES`] entries or
//! [`MAX_CACHED_BYTES`] (then written entries leave from the front), and a read whose first
//! index is held here, or lies past the last, is answered on the caller's task, with no
//! hand-off.
//!
//! # Invariants
//! - The entries form a suffix of the log, contiguous by index: appends come in index order,
//!   truncations cut the end, purges and evictions cut the front.
//! - The written entries are a prefix of them (the writer writes in queue order; an entry that
//!   a truncation replaced is the new entry, unwritten, whatever the writer did with the old).
//! - Only written entries are evicted, so every entry appended is here, in RocksDB, or both,
//!   at every moment; an entry below this suffix is read from RocksDB (see `log_store`).
//! - `bytes` is the sum of the held entries' encoded sizes.
//!
//! # Not done yet
//! - The bounds are per shard: a node of a thousand shards whose apply stalls could hold
//!   a thousand times [`MAX_CACHED_BYTES`] of written entries (unwritten ones are held in any
//!   case, as before).
//! - Entries are kept decoded; replication encodes each again for every follower.

use crate::types::{Entry, LogId};
use meridian_types::ShardId;
use std::collections::BTreeMap;
use std::io;
use std::ops::Bound;

/// Past this many entries in a shard's tail (written or not), its written entries leave from
/// the front even if apply has not read them. Unwritten entries are kept whatever the count.
pub const MAX_CACHED_ENTRIES: usize = 1_024;

/// Past this many encoded bytes in a shard's tail (written or not), its written entries leave
/// from the front even if apply has not read them. Unwritten entries are kept whatever their
/// size.
pub const MAX_CACHED_BYTES: usize = 1024 * 1024;

/// How much one read may return: entries and encoded bytes (at least one entry regardless).
#[derive(Clone, Copy, Debug)]
pub(crate) struct ReadLimit {
    pub entries: usize,
    pub bytes: usize,
}

impl ReadLimit {
    /// Whether `out` (holding `bytes`) may take one more entry of `next` bytes.
    pub fn admits(limit: Option<ReadLimit>, out: &[Entry], bytes: usize, next: usize) -> bool {
        match limit {
            None => true,
            Some(_) if out.is_empty() => true,
            Some(l) => out.len() < l.entries && bytes.saturating_add(next) <= l.bytes,
        }
    }
}

struct Held {
    entry: Entry,
    /// Encoded size.
    bytes: usize,
    /// In RocksDB (its write has landed).
    written: bool,
}

/// What this store holds in memory; see the module docs.
#[derive(Default)]
pub(crate) struct Tail {
    entries: BTreeMap<u64, Held>,
    bytes: usize,
    /// First indexes of truncations queued but not yet written: RocksDB entries at or above
    /// the lowest are stale.
    truncations_pending: Vec<u64>,
    /// Bumped by every truncation (see `log_store`'s module docs).
    pub generation: u64,
    /// The last purged log id, once this process has purged (RocksDB's copy may lag).
    pub last_purged: Option<LogId>,
    /// Apply has read every entry below this index.
    applied_below: u64,
}

impl Tail {
    pub fn stale_from(&self) -> Option<u64> {
        self.truncations_pending.iter().copied().min()
    }

    pub fn first_index(&self) -> Option<u64> {
        self.entries.keys().next().copied()
    }

    pub fn last_index(&self) -> Option<u64> {
        self.entries.keys().next_back().copied()
    }

    /// Encoded bytes held (written or not).
    #[cfg(test)]
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Holds an appended entry of `bytes` encoded bytes (not written yet).
    pub fn push(&mut self, entry: Entry, bytes: usize) {
        let index = entry.log_id.index;
        let held = Held {
            entry,
            bytes,
            written: false,
        };
        if let Some(old) = self.entries.insert(index, held) {
            self.bytes -= old.bytes;
        }
        self.bytes += bytes;
        self.evict();
    }

    /// The writer has written these appends: they may go once apply has read them (or the
    /// bounds need the room), unless a truncation and a new append have put another entry at
    /// their index since (that one has its own write queued).
    pub fn written(&mut self, ids: &[LogId]) {
        for id in ids {
            if let Some(held) = self.entries.get_mut(&id.index) {
                if held.entry.log_id == *id {
                    held.written = true;
                }
            }
        }
        self.evict();
    }

    /// Apply has read every entry below `index`.
    pub fn applied_below(&mut self, index: u64) {
        self.applied_below = self.applied_below.max(index);
        self.evict();
    }

    /// Drops the entries from `from` on; RocksDB's from there are stale until the truncation
    /// is written ([`Tail::truncation_written`]).
    pub fn truncate(&mut self, from: u64) {
        // Raft never truncates an applied entry; were it to, the new entries there must not
        // count as applied.
        debug_assert!(from >= self.applied_below, "truncating applied entries");
        self.applied_below = self.applied_below.min(from);
        let cut = self.entries.split_off(&from);
        self.bytes -= cut.values().map(|h| h.bytes).sum::<usize>();
        self.truncations_pending.push(from);
        self.generation += 1;
    }

    pub fn truncation_written(&mut self, from: u64) {
        if let Some(i) = self.truncations_pending.iter().position(|f| *f == from) {
            self.truncations_pending.swap_remove(i);
        }
    }

    /// Drops the entries up to and including `log_id`.
    pub fn purge(&mut self, log_id: LogId) {
        let kept = self.entries.split_off(&(log_id.index + 1));
        let dropped = std::mem::replace(&mut self.entries, kept);
        self.bytes -= dropped.values().map(|h| h.bytes).sum::<usize>();
        self.last_purged = Some(log_id);
    }

    /// Drops written entries from the front while apply has read them or the bounds are
    /// exceeded.
    fn evict(&mut self) {
        loop {
            let over = self.entries.len() > MAX_CACHED_ENTRIES || self.bytes > MAX_CACHED_BYTES;
            let Some(first) = self.entries.first_entry() else {
                return;
            };
            let held = first.get();
            if !held.written || !(over || *first.key() < self.applied_below) {
                return;
            }
            self.bytes -= held.bytes;
            first.remove();
        }
    }

    /// Copies of the held entries in `[first, end)`.
    pub fn copy_range(&self, first: u64, end: Option<u64>) -> BTreeMap<u64, Entry> {
        let end = end.map_or(Bound::Unbounded, Bound::Excluded);
        self.entries
            .range((Bound::Included(first), end))
            .map(|(i, h)| (*i, h.entry.clone()))
            .collect()
    }

    /// The read of `[first, end)` within `limit`, if it can be answered from memory alone:
    /// `first` is held (or lies past the last entry held), so RocksDB has nothing to add.
    /// Returns the entries and whether the limit cut the read short, as `read_range` does.
    pub fn read(
        &self,
        shard: ShardId,
        first: u64,
        end: Option<u64>,
        limit: Option<ReadLimit>,
    ) -> Option<io::Result<(Vec<Entry>, bool)>> {
        if self.first_index()? > first {
            return None;
        }
        let end = end.map_or(Bound::Unbounded, Bound::Excluded);
        let mut out: Vec<Entry> = Vec::new();
        let mut bytes = 0usize;
        for (index, held) in self.entries.range((Bound::Included(first), end)) {
            if !ReadLimit::admits(limit, &out, bytes, held.bytes) {
                return Some(Ok((out, true)));
            }
            if let Some(prev) = out.last() {
                if *index != prev.log_id.index + 1 {
                    return Some(Err(hole(shard, prev.log_id.index, *index)));
                }
            }
            bytes = bytes.saturating_add(held.bytes);
            out.push(held.entry.clone());
        }
        Some(Ok((out, false)))
    }
}

pub(crate) fn hole(shard: ShardId, prev: u64, next: u64) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!(
            "shard {shard}: the raft log has a hole: entry {} is missing (entry {prev} is followed by {next})",
            prev + 1
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::TypeConfig;
    use crate::Command;
    use openraft::EntryPayload;

    fn entry(term: u64, index: u64) -> Entry {
        Entry {
            log_id: openraft::testing::log_id::<TypeConfig>(term, 1, index),
            payload: EntryPayload::Normal(Command::Write {
                ts: index,
                puts: Vec::new(),
                deletes: Vec::new(),
                request: None,
            }),
        }
    }

    fn held(tail: &Tail) -> Vec<u64> {
        tail.entries.keys().copied().collect()
    }

    fn push_run(tail: &mut Tail, term: u64, range: std::ops::RangeInclusive<u64>, bytes: usize) {
        for i in range {
            tail.push(entry(term, i), bytes);
        }
    }

    fn ids(term: u64, range: std::ops::RangeInclusive<u64>) -> Vec<LogId> {
        range.map(|i| entry(term, i).log_id).collect()
    }

    /// Written entries stay until apply has read them; unwritten ones stay whatever apply
    /// says.
    #[test]
    fn written_entries_leave_once_applied() {
        let mut tail = Tail::default();
        push_run(&mut tail, 1, 1..=10, 100);
        tail.applied_below(8);
        assert_eq!(
            held(&tail),
            (1..=10).collect::<Vec<_>>(),
            "nothing written yet"
        );
        tail.written(&ids(1, 1..=5));
        assert_eq!(held(&tail), (6..=10).collect::<Vec<_>>());
        tail.written(&ids(1, 6..=10));
        assert_eq!(held(&tail), vec![8, 9, 10], "7 and below were applied");
        assert_eq!(tail.bytes(), 300);
        tail.applied_below(11);
        assert!(held(&tail).is_empty());
        assert_eq!(tail.bytes(), 0);
    }

    /// The bounds evict written entries from the front, never unwritten ones.
    #[test]
    fn bounds_evict_only_written_entries() {
        let mut tail = Tail::default();
        let n = MAX_CACHED_ENTRIES as u64 + 100;
        push_run(&mut tail, 1, 1..=n, 10);
        assert_eq!(held(&tail).len() as u64, n, "unwritten: all kept");
        tail.written(&ids(1, 1..=n));
        assert_eq!(held(&tail).len(), MAX_CACHED_ENTRIES);
        assert_eq!(held(&tail)[0], 101);

        let mut tail = Tail::default();
        let big = MAX_CACHED_BYTES / 4;
        push_run(&mut tail, 1, 1..=8, big);
        tail.written(&ids(1, 1..=8));
        assert_eq!(held(&tail), vec![5, 6, 7, 8], "at most MAX_CACHED_BYTES");
        assert_eq!(tail.bytes(), 4 * big);
    }

    /// A write of an entry a truncation replaced does not mark its replacement written.
    #[test]
    fn a_replaced_entry_is_not_marked_written_by_the_old_write() {
        let mut tail = Tail::default();
        push_run(&mut tail, 1, 1..=6, 10);
        tail.truncate(4);
        assert_eq!(tail.stale_from(), Some(4));
        push_run(&mut tail, 2, 4..=5, 10);
        tail.written(&ids(1, 1..=6));
        tail.applied_below(100);
        assert_eq!(
            held(&tail),
            vec![4, 5],
            "term 2's entries are not written yet"
        );
        assert_eq!(tail.bytes(), 20);
        tail.truncation_written(4);
        assert_eq!(tail.stale_from(), None);
    }

    /// A truncation of written entries apply has not read drops them and their bytes; the
    /// entries appended in their place stay until written.
    #[test]
    fn truncating_written_entries_drops_them_and_their_bytes() {
        let mut tail = Tail::default();
        push_run(&mut tail, 1, 1..=8, 10);
        tail.written(&ids(1, 1..=8));
        tail.applied_below(4);
        assert_eq!(held(&tail), (4..=8).collect::<Vec<_>>());
        tail.truncate(6);
        assert_eq!(held(&tail), vec![4, 5]);
        assert_eq!(tail.bytes(), 20);
        push_run(&mut tail, 2, 6..=7, 30);
        assert_eq!(tail.bytes(), 80);
        tail.applied_below(8);
        assert_eq!(
            held(&tail),
            vec![6, 7],
            "4 and 5 applied; 6 and 7 not written"
        );
        tail.written(&ids(2, 6..=7));
        assert!(held(&tail).is_empty());
        assert_eq!(tail.bytes(), 0);
    }

    /// Entries apply read before their write landed (a follower) leave once written; a burst
    /// of unwritten entries pushes written ones out past the bound.
    #[test]
    fn applied_before_written_and_bursts_of_unwritten_entries() {
        let mut tail = Tail::default();
        push_run(&mut tail, 1, 1..=3, 10);
        tail.applied_below(4);
        assert_eq!(held(&tail), vec![1, 2, 3]);
        tail.written(&ids(1, 1..=3));
        assert!(held(&tail).is_empty());

        let mut tail = Tail::default();
        push_run(&mut tail, 1, 1..=10, 10);
        tail.written(&ids(1, 1..=10));
        let n = MAX_CACHED_ENTRIES as u64;
        push_run(&mut tail, 1, 11..=n + 5, 10);
        assert_eq!(held(&tail).len(), MAX_CACHED_ENTRIES);
        assert_eq!(held(&tail)[0], 6, "written 1..=5 made room");
    }

    /// A purge of entries not yet written drops them; their write's hook then finds nothing.
    #[test]
    fn a_purge_before_the_write_lands() {
        let mut tail = Tail::default();
        push_run(&mut tail, 1, 1..=5, 10);
        tail.purge(entry(1, 3).log_id);
        assert_eq!(held(&tail), vec![4, 5]);
        tail.written(&ids(1, 1..=5));
        tail.applied_below(5);
        assert_eq!(held(&tail), vec![5]);
        assert_eq!(tail.bytes(), 10);
        assert_eq!(tail.last_purged, Some(entry(1, 3).log_id));
    }

    /// Reads answer from memory only when their first index is held (or lies past the end).
    #[test]
    fn reads_from_memory_start_at_a_held_index() {
        let mut tail = Tail::default();
        let shard = ShardId(1);
        assert!(tail.read(shard, 1, None, None).is_none(), "nothing held");
        push_run(&mut tail, 1, 5..=9, 10);
        assert!(tail.read(shard, 4, None, None).is_none(), "4 is in RocksDB");
        let (got, cut) = tail.read(shard, 6, Some(9), None).unwrap().unwrap();
        assert_eq!(
            got.iter().map(|e| e.log_id.index).collect::<Vec<_>>(),
            vec![6, 7, 8]
        );
        assert!(!cut);
        let limit = ReadLimit {
            entries: 2,
            bytes: usize::MAX,
        };
        let (got, cut) = tail.read(shard, 5, None, Some(limit)).unwrap().unwrap();
        assert_eq!(got.len(), 2);
        assert!(cut);
        let (got, cut) = tail.read(shard, 12, None, None).unwrap().unwrap();
        assert!(got.is_empty() && !cut, "past the end: nothing appended yet");
        tail.purge(entry(1, 6).log_id);
        assert!(tail.read(shard, 6, None, None).is_none(), "purged");
        assert_eq!(tail.bytes(), 30);
    }
}
