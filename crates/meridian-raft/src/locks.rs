//! Prepared locks and transaction records: the replicated state of multi-shard transactions.
//!
//! # What
//! A transaction that writes more than one shard (or, when serializable, reads a shard it does
//! not write) commits by two-phase commit over Raft (the client coordinates, see
//! `meridian-client`'s `txn_2pc`):
//!
//! 1. **Prepare**, on every participant shard in parallel ([`crate::Command::Prepare`]): apply
//!    checks the transaction's reads of that shard still hold (as a one-shard commit does,
//!    see `txn_check`) and that no other transaction holds a conflicting lock; then it records
//!    the transaction's [`TxnLocks`] — write intents (the values to write), read locks on the
//!    keys it read and on the ranges it scanned — at a *prepare timestamp* above every version
//!    of the shard (it raises the shard's version floor). The participant that owns the
//!    transaction's *anchor* key (its first written key) also writes the transaction's record,
//!    [`TxnStatus::Pending`].
//! 2. **Decide**, on the anchor only ([`crate::Command::Resolve`] with `anchor`): `Pending`
//!    becomes `Committed(C)`, `C` being the largest prepare timestamp of all participants. This
//!    one Raft entry is the commit point. Anyone may instead *abort* a transaction whose record
//!    is `Pending` or absent (an absent record becomes an `Aborted` tombstone, so a prepare that
//!    arrives later fails): whichever entry the anchor's log orders first wins.
//! 3. **Resolve**, on every other participant: the intents become versions at exactly `C`
//!    (commit) or vanish (abort), and the locks go. Then the coordinator *forgets* the record.
//!
//! # Why locks, and who waits
//! Between prepare and resolve, the participant must not let anything break what prepare
//! checked: another write to a read or written key (or a new key in a scanned range) would
//! slip under the transaction's commit timestamp. So writes (`Write`, `Cas`, one-shard `Txn`,
//! other prepares) that touch a locked key answer *locked* and write nothing; readers that
//! meet a write intent they might have to see answer *locked* too. The client waits for the
//! lock to go and, if it stays past a timeout (the coordinator may have died), aborts the
//! transaction at its anchor and resolves the lock itself. Read locks are shared.
//!
//! # Where
//! Both live in the shard's *transaction region* of `Cf::Data` (`keys::txn_key`): inside the
//! shard's data range, so snapshots carry them and a snapshot install replaces them, and no
//! user key can meet them. The locks are also held in memory ([`LockTable`], rebuilt from
//! RocksDB at open and after an install) for the read and write paths to check cheaply.
//!
//! # Invariants
//! - A key has at most one write intent, and never a write intent and another transaction's
//!   read lock at once; no write to a locked key applies.
//! - A prepare timestamp is above every version of its shard when it applies, and a commit
//!   timestamp is at least every participant's prepare timestamp, so a committed intent is
//!   newer than every version of its key.
//! - A transaction is committed iff its anchor's record says so; a record once `Committed` or
//!   `Aborted` never changes (until forgotten, which only the coordinator does, after it
//!   resolved every participant).
//!
//! # Not done yet
//! - Parallel commit (one consensus round): commit costs a prepare round, a decide round and
//!   a resolve round that runs after the acknowledgement.
//! - Records aborted by a recovery are kept forever (tombstones), as are the records of
//!   coordinators that died after deciding (their locks are resolved by readers one at a time).
//! - Wound-wait or priorities: a conflicting prepare fails at once and the transaction
//!   restarts with backoff.

use crate::types::RequestId;
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};

/// A transaction's id: its coordinator's client id and a sequence number it never reuses.
pub type TxnId = RequestId;

/// Most transactions prepared on one shard at once; a prepare beyond it fails as a conflict.
pub const MAX_PREPARED_TXNS_PER_SHARD: usize = 4_096;

/// One transaction's locks on one shard.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TxnLocks {
    /// The transaction's anchor key: its record lives on the shard that owns it.
    pub anchor: Bytes,
    /// The prepare timestamp on this shard: the commit timestamp is at least this.
    pub prepare_ts: u64,
    /// Write intents: the value each key gets on commit (`None` = delete).
    pub writes: Vec<(Bytes, Option<Bytes>)>,
    /// Keys read (and not written): read locks.
    pub reads: Vec<Bytes>,
    /// Ranges scanned, `[start, end)` (`None` = to the shard's end): read locks.
    pub ranges: Vec<(Bytes, Option<Bytes>)>,
}

/// A transaction record's state, on the anchor's shard.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum TxnStatus {
    Pending,
    Committed(u64),
    Aborted,
}

/// What a [`crate::Command::Resolve`] asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Decision {
    /// Commit at this timestamp (on the anchor: decide it, if still pending).
    Commit(u64),
    /// Abort (on the anchor: unless already committed).
    Abort,
    /// Anchor only: delete the record (the coordinator resolved every participant).
    Forget,
}

/// A lock someone met: whose it is and where its record lives.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockInfo {
    pub key: Bytes,
    pub txn: TxnId,
    pub anchor: Bytes,
    pub prepare_ts: u64,
    /// A write intent (else a read lock).
    pub write: bool,
}

#[derive(Clone, Debug, Default)]
struct KeyLocks {
    writer: Option<TxnId>,
    readers: Vec<TxnId>,
}

/// Every prepared transaction's locks on one shard, indexed by key.
#[derive(Debug, Default)]
pub struct LockTable {
    txns: HashMap<TxnId, TxnLocks>,
    keys: BTreeMap<Bytes, KeyLocks>,
}

impl LockTable {
    pub fn new() -> LockTable {
        LockTable::default()
    }

    pub fn is_empty(&self) -> bool {
        self.txns.is_empty()
    }

    pub fn len(&self) -> usize {
        self.txns.len()
    }

    pub fn get(&self, txn: &TxnId) -> Option<&TxnLocks> {
        self.txns.get(txn)
    }

    /// Every prepared transaction, for tests and metrics.
    pub fn txns(&self) -> impl Iterator<Item = (&TxnId, &TxnLocks)> {
        self.txns.iter()
    }

    /// Records `locks` of `txn` (replacing any it had).
    pub fn insert(&mut self, txn: TxnId, locks: TxnLocks) {
        self.remove(&txn);
        for (key, _) in &locks.writes {
            self.keys.entry(key.clone()).or_default().writer = Some(txn);
        }
        for key in &locks.reads {
            self.keys.entry(key.clone()).or_default().readers.push(txn);
        }
        self.txns.insert(txn, locks);
    }

    /// Drops `txn`'s locks and returns them.
    pub fn remove(&mut self, txn: &TxnId) -> Option<TxnLocks> {
        let locks = self.txns.remove(txn)?;
        let keys = locks
            .writes
            .iter()
            .map(|(k, _)| k)
            .chain(locks.reads.iter());
        for key in keys {
            if let Some(entry) = self.keys.get_mut(key) {
                if entry.writer == Some(*txn) {
                    entry.writer = None;
                }
                entry.readers.retain(|r| r != txn);
                if entry.writer.is_none() && entry.readers.is_empty() {
                    self.keys.remove(key);
                }
            }
        }
        Some(locks)
    }

    fn info(&self, key: &Bytes, txn: &TxnId, write: bool) -> LockInfo {
        let locks = &self.txns[txn];
        LockInfo {
            key: key.clone(),
            txn: *txn,
            anchor: locks.anchor.clone(),
            prepare_ts: locks.prepare_ts,
            write,
        }
    }

    /// A lock of a transaction other than `me` that forbids writing `key`: any lock on it, or
    /// a scanned range covering it.
    pub fn blocks_write(&self, key: &Bytes, me: Option<&TxnId>) -> Option<LockInfo> {
        let other = |t: &TxnId| Some(t) != me;
        if let Some(entry) = self.keys.get(key) {
            if let Some(w) = entry.writer.as_ref().filter(|t| other(t)) {
                return Some(self.info(key, w, true));
            }
            if let Some(r) = entry.readers.iter().find(|t| other(t)) {
                return Some(self.info(key, r, false));
            }
        }
        self.txns
            .iter()
            .filter(|(t, _)| other(t))
            .find_map(|(t, l)| {
                l.ranges
                    .iter()
                    .any(|(start, end)| key >= start && end.as_ref().is_none_or(|e| key < e))
                    .then(|| self.info(key, t, false))
            })
    }

    /// The write intent of a transaction other than `me` on `key` prepared at or below
    /// `max_prepare_ts`, if any (`u64::MAX`: any).
    pub fn write_intent(
        &self,
        key: &[u8],
        me: Option<&TxnId>,
        max_prepare_ts: u64,
    ) -> Option<LockInfo> {
        let (key, entry) = self.keys.get_key_value(key)?;
        let writer = entry.writer?;
        let info = (Some(&writer) != me).then(|| self.info(key, &writer, true))?;
        (info.prepare_ts <= max_prepare_ts).then_some(info)
    }

    /// The first write intent of a transaction other than `me` in `[start, end)` prepared at
    /// or below `max_prepare_ts`.
    pub fn write_intent_in(
        &self,
        start: &[u8],
        end: Option<&[u8]>,
        me: Option<&TxnId>,
        max_prepare_ts: u64,
    ) -> Option<LockInfo> {
        use std::ops::Bound;
        let upper = match end {
            Some(e) => Bound::Excluded(e),
            None => Bound::Unbounded,
        };
        self.keys
            .range::<[u8], _>((Bound::Included(start), upper))
            .find_map(|(key, entry)| {
                let w = entry.writer.filter(|t| Some(t) != me)?;
                let info = self.info(key, &w, true);
                (info.prepare_ts <= max_prepare_ts).then_some(info)
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(s: &str) -> Bytes {
        Bytes::copy_from_slice(s.as_bytes())
    }

    fn id(seq: u64) -> TxnId {
        RequestId { client_id: 1, seq }
    }

    fn locks(writes: &[&str], reads: &[&str], ranges: &[(&str, Option<&str>)]) -> TxnLocks {
        TxnLocks {
            anchor: b("anchor"),
            prepare_ts: 10,
            writes: writes.iter().map(|k| (b(k), Some(b("v")))).collect(),
            reads: reads.iter().map(|k| b(k)).collect(),
            ranges: ranges.iter().map(|(s, e)| (b(s), e.map(b))).collect(),
        }
    }

    #[test]
    fn writes_are_blocked_by_any_other_lock_reads_only_by_intents() {
        let mut t = LockTable::new();
        t.insert(id(1), locks(&["w"], &["r"], &[("m", Some("p"))]));
        for key in ["w", "r", "m", "o"] {
            let lock = t.blocks_write(&b(key), None).expect(key);
            assert_eq!(lock.txn, id(1));
            assert_eq!(lock.write, key == "w");
            assert!(t.blocks_write(&b(key), Some(&id(1))).is_none(), "own lock");
        }
        assert!(
            t.blocks_write(&b("p"), None).is_none(),
            "range end is exclusive"
        );
        assert!(t.blocks_write(&b("a"), None).is_none());
        assert!(t.write_intent(b"w", None, u64::MAX).is_some());
        assert!(t.write_intent(b"w", None, 10).is_some(), "prepared at 10");
        assert!(
            t.write_intent(b"w", None, 9).is_none(),
            "prepared above the bound"
        );
        assert!(
            t.write_intent(b"r", None, u64::MAX).is_none(),
            "read locks do not block reads"
        );
        assert_eq!(
            t.write_intent_in(b"a", Some(b"x"), None, u64::MAX)
                .unwrap()
                .key,
            b("w")
        );
        assert!(t.write_intent_in(b"a", Some(b"x"), None, 9).is_none());
        assert!(t
            .write_intent_in(b"a", Some(b"w"), None, u64::MAX)
            .is_none());
        assert!(t
            .write_intent_in(b"w", None, Some(&id(1)), u64::MAX)
            .is_none());
    }

    #[test]
    fn read_locks_are_shared_and_removal_leaves_the_others() {
        let mut t = LockTable::new();
        t.insert(id(1), locks(&[], &["k"], &[]));
        t.insert(id(2), locks(&["x"], &["k"], &[]));
        assert_eq!(t.len(), 2);
        assert_eq!(t.remove(&id(1)).unwrap().reads, vec![b("k")]);
        let lock = t.blocks_write(&b("k"), None).unwrap();
        assert_eq!(lock.txn, id(2));
        t.remove(&id(2));
        assert!(t.is_empty() && t.keys.is_empty());
        assert!(t.remove(&id(2)).is_none());
    }
}
