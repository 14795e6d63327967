//! Who gives way when two multi-shard transactions want the same lock: *wound-wait*.
//!
//! Every multi-shard transaction carries a [`TxnRank`] in its prepares, and every prepared
//! lock keeps it (see `meridian-raft`'s `locks`), so a prepare that meets another
//! transaction's lock learns the holder's rank from the answer. Then (see `meridian-client`'s
//! `locks`):
//!
//! - the **senior** of the two *wounds* the holder: it recovers the holder's transaction at
//!   once (aborting it unless every participant had already prepared, in which case it is
//!   committed and its locks are resolved) and sends its prepare again;
//! - the **junior** *waits* for the holder's lock to go, as a plain write does.
//!
//! Waits only ever go from junior to senior, so no cycle of waits (deadlock) can form. Rank
//! is a total order: priority first ([`TxnPriority`]), then age (the timestamp of the
//! transaction's *first* attempt: older is senior), then the transaction id. A transaction
//! keeps its rank across attempts, so one that keeps losing grows older than every newcomer
//! and eventually wins every conflict of its priority (no starvation within a priority).

use serde::{Deserialize, Serialize};

/// A transaction's priority: a higher one wins lock conflicts whatever its age.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub enum TxnPriority {
    Low,
    #[default]
    Normal,
    High,
}

impl TxnPriority {
    /// The value sent on the wire (`TxnPrepare.priority`).
    pub fn as_u32(self) -> u32 {
        match self {
            TxnPriority::Low => 1,
            TxnPriority::Normal => 2,
            TxnPriority::High => 3,
        }
    }
}

/// A transaction's rank in lock conflicts (see the module docs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TxnRank {
    /// [`TxnPriority::as_u32`], or any value another client sent: higher wins.
    pub priority: u32,
    /// The HLC timestamp of the transaction's first attempt: lower (older) wins.
    pub age_ts: u64,
}

impl TxnRank {
    pub fn new(priority: TxnPriority, age_ts: u64) -> TxnRank {
        TxnRank {
            priority: priority.as_u32(),
            age_ts,
        }
    }

    /// True if the transaction `me` (its id as `(client id, sequence)`) of this rank is
    /// senior to `other` of rank `theirs`: higher priority, else older, else the lower id. A
    /// transaction is never senior to itself.
    pub fn is_senior_to(self, me: (u64, u64), theirs: TxnRank, other: (u64, u64)) -> bool {
        let key = |rank: TxnRank, id: (u64, u64)| {
            (std::cmp::Reverse(rank.priority), rank.age_ts, id.0, id.1)
        };
        key(self, me) < key(theirs, other)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn priority_beats_age_and_age_beats_id() {
        let old_low = TxnRank::new(TxnPriority::Low, 10);
        let young_high = TxnRank::new(TxnPriority::High, 99);
        assert!(young_high.is_senior_to((9, 9), old_low, (1, 1)));
        assert!(!old_low.is_senior_to((1, 1), young_high, (9, 9)));

        let old = TxnRank::new(TxnPriority::Normal, 10);
        let young = TxnRank::new(TxnPriority::Normal, 11);
        assert!(old.is_senior_to((9, 9), young, (1, 1)));
        assert!(!young.is_senior_to((1, 1), old, (9, 9)));

        // Same rank: the lower id.
        assert!(old.is_senior_to((1, 5), old, (2, 0)));
        assert!(!old.is_senior_to((2, 0), old, (1, 5)));
        assert!(
            !old.is_senior_to((1, 5), old, (1, 5)),
            "never senior to itself"
        );
    }

    proptest! {
        /// A strict total order on distinct transactions: exactly one of two is senior, and
        /// seniority is transitive (so waits, which go junior to senior, form no cycle).
        #[test]
        fn seniority_is_a_strict_total_order(
            a in (0u32..4, 0u64..4, 0u64..3, 0u64..3),
            b in (0u32..4, 0u64..4, 0u64..3, 0u64..3),
            c in (0u32..4, 0u64..4, 0u64..3, 0u64..3),
        ) {
            let rank = |t: (u32, u64, u64, u64)| (TxnRank { priority: t.0, age_ts: t.1 }, (t.2, t.3));
            let (ra, ia) = rank(a);
            let (rb, ib) = rank(b);
            let (rc, ic) = rank(c);
            if ia != ib {
                prop_assert!(ra.is_senior_to(ia, rb, ib) != rb.is_senior_to(ib, ra, ia));
            }
            if ra.is_senior_to(ia, rb, ib) && rb.is_senior_to(ib, rc, ic) {
                prop_assert!(ra.is_senior_to(ia, rc, ic));
            }
        }
    }
}
