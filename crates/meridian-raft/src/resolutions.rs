//! The multi-shard transactions a replica resolved lately, for snapshot reads' uncertainty.
//!
//! # Why
//! A snapshot read at `read_ts` treats a version above it as uncertain only up to the reading
//! of this node's clock that its transaction took first (`seen`, see `meridian-server`'s
//! `kv_snapshot`): a version stamped by this node's clock after that reading was written after
//! the transaction began, so it may be skipped. A resolved intent breaks that argument: its
//! version carries the transaction's commit timestamp `C`, which came from whichever
//! participant's clock was furthest ahead, and it is applied here whenever the resolution
//! arrives, possibly long after the transaction was acknowledged.
//!
//! The intent itself, though, was prepared here at `prepare_ts`, stamped by the clock of this
//! shard's leader of the time. If `prepare_ts <= seen`, the intent may predate the reader, and
//! so may the commit (the commit point comes after every prepare): the version must count as
//! uncertain up to `C`. If `prepare_ts > seen`, the prepare, hence the commit, came after the
//! reader's first look at this node, so skipping the version is safe. (A node that took over
//! the shard later has `seen` raised to its first barrier as leader, which is past every
//! prepare it applied before; see `kv_snapshot`.)
//!
//! # What
//! [`Resolutions`] keeps the `(prepare_ts, commit_ts)` of the last [`MAX_RECENT_RESOLUTIONS`]
//! commits resolved on this replica. It lives in the shard's `LockTable`, so apply updates it
//! under the same write guard as the locks and the data, and a reader sees all three as of one
//! applied state. When entries are dropped (too many, or a snapshot install brought versions
//! whose resolutions this replica never saw), reads below what was dropped fall back to the
//! coarse rule: widen to the largest commit timestamp this replica ever knew of.
//!
//! Each entry also keeps the largest commit timestamp recorded up to and including it (a
//! running maximum, so non-decreasing along the queue). [`Resolutions::widen`] scans from the
//! newest entry and stops at the first whose running maximum is at most `read_ts`: no entry
//! at or before it can have a commit above `read_ts`. A read at a recent timestamp looks at
//! the few entries resolved since, not at all [`MAX_RECENT_RESOLUTIONS`].
//!
//! # Invariants
//! - Every version this replica wrote from a resolution since it opened is either an entry,
//!   or has `commit_ts <= dropped_max`.
//! - Versions resolved before the replica opened are below its version floor, which its clock
//!   was merged with at open, so every later `seen` is above them.

use std::collections::VecDeque;

/// Most resolutions remembered per shard (about 32 bytes each).
pub const MAX_RECENT_RESOLUTIONS: usize = 4_096;

/// See the module docs.
#[derive(Debug, Default)]
pub struct Resolutions {
    /// `(prepare_ts, commit_ts, running max commit_ts)`, oldest first.
    recent: VecDeque<(u64, u64, u64)>,
    /// The largest commit timestamp no longer in `recent` (0: none dropped).
    dropped_max: u64,
    /// The largest commit timestamp ever recorded or dropped.
    max: u64,
}

impl Resolutions {
    /// Notes that an intent prepared at `prepare_ts` became a version at `commit_ts`.
    pub fn record(&mut self, prepare_ts: u64, commit_ts: u64) {
        self.max = self.max.max(commit_ts);
        self.recent.push_back((prepare_ts, commit_ts, self.max));
        while self.recent.len() > MAX_RECENT_RESOLUTIONS {
            if let Some((_, dropped, _)) = self.recent.pop_front() {
                self.dropped_max = self.dropped_max.max(dropped);
            }
        }
    }

    /// A snapshot install replaced the data: its versions may come from resolutions never
    /// recorded here, all at or below the installed version floor `floor`.
    pub fn installed(&mut self, floor: u64) {
        self.recent.clear();
        self.dropped_max = self.dropped_max.max(floor).max(self.max);
        self.max = self.max.max(floor);
    }

    /// How far a snapshot read at `read_ts` (uncertainty limit `limit`) whose transaction first
    /// saw this node at `seen` must widen its window: the largest commit timestamp in
    /// `(read_ts, limit]` of a resolution prepared at or before `seen`, if any.
    pub fn widen(&self, read_ts: u64, limit: u64, seen: u64) -> Option<u64> {
        if self.dropped_max > read_ts {
            // Something dropped may lie in the window: be coarse.
            return Some(self.max.min(limit)).filter(|c| *c > read_ts);
        }
        self.recent
            .iter()
            .rev()
            .take_while(|(_, _, running_max)| *running_max > read_ts)
            .filter(|(prepared, commit, _)| {
                *prepared <= seen && *commit > read_ts && *commit <= limit
            })
            .map(|(_, commit, _)| *commit)
            .max()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_intents_prepared_before_the_readers_first_look_widen_its_window() {
        let mut r = Resolutions::default();
        r.record(10, 40); // prepared before the reader saw this node at 20
        r.record(25, 35); // prepared after
        r.record(5, 15); // committed below the read
        r.record(8, 90); // beyond the limit
        assert_eq!(r.widen(30, 60, 20), Some(40));
        assert_eq!(r.widen(30, 60, 9), None, "prepared after a first look at 9");
        assert_eq!(r.widen(30, 60, 30), Some(40), "35 is also in, 40 is larger");
        assert_eq!(r.widen(45, 60, 100), None);
    }

    proptest::proptest! {
        /// The early stop changes nothing: `widen` answers what a scan of every entry would.
        #[test]
        fn widen_matches_a_full_scan(
            entries in proptest::collection::vec((0u64..200, 0u64..200), 0..300),
            read_ts in 0u64..200,
            window in 0u64..100,
            seen in 0u64..200,
        ) {
            let mut r = Resolutions::default();
            for (prepared, extra) in &entries {
                r.record(*prepared, prepared + extra);
            }
            let limit = read_ts + window;
            let full = entries
                .iter()
                .map(|(prepared, extra)| (*prepared, prepared + extra))
                .filter(|(p, c)| *p <= seen && *c > read_ts && *c <= limit)
                .map(|(_, c)| c)
                .max();
            proptest::prop_assert_eq!(r.widen(read_ts, limit, seen), full);
        }
    }

    #[test]
    fn dropped_entries_make_older_reads_coarse() {
        let mut r = Resolutions::default();
        r.record(1, 100);
        for i in 0..MAX_RECENT_RESOLUTIONS as u64 {
            r.record(200 + i, 300 + i);
        }
        let top = 300 + MAX_RECENT_RESOLUTIONS as u64 - 1;
        assert_eq!(
            r.widen(50, 1_000_000, 0),
            Some(top),
            "(1, 100) was dropped: coarse"
        );
        assert_eq!(
            r.widen(150, 1_000_000, 250),
            Some(300 + 50),
            "above what was dropped: exact"
        );
        let mut r = Resolutions::default();
        r.installed(500);
        assert_eq!(r.widen(400, 1_000, 0), Some(500), "an install is a drop");
        assert_eq!(r.widen(600, 1_000, 0), None);
    }
}
