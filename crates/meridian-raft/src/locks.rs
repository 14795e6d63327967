//! Prepared locks and transaction records: the replicated state of multi-shard transactions.
//!
//! # What
//! A transaction that writes more than one shard (or, when serializable, reads a shard it does
//! not write) commits by a *parallel commit* over Raft (the client coordinates, see
//! `meridian-client`'s `txn_2pc`; CockroachDB's parallel commits, fitted to this store):
//!
//! 1. **Prepare**, on every participant shard in parallel ([`crate::Command::Prepare`]): apply
//!    checks the transaction's reads of that shard still hold (as a one-shard commit does,
//!    see `txn_check`) and that no other transaction holds a conflicting lock; then it records
//!    the transaction's [`TxnLocks`] — write intents (the values to write), read locks on the
//!    keys it read and on the ranges it scanned — at a *prepare timestamp* above every version
//!    of the shard (it raises the shard's version floor). The participant that owns the
//!    transaction's *anchor* key (its first written key) also writes the transaction's record,
//!    [`TxnStatus::Staging`], and keeps the list of the other participants (a key of each) in
//!    its locks.
//! 2. **Implicit commit.** A transaction whose record is `Staging` and whose every participant
//!    holds its prepared locks *is committed*, at `C`, the largest prepare timestamp. The
//!    coordinator acknowledges the commit as soon as every prepare answered: one consensus
//!    round.
//! 3. **Explicit commit**, after the acknowledgement, on the anchor ([`crate::Command::Resolve`]
//!    with `anchor`): `Staging` becomes `Committed(C)`. Only then are the other participants
//!    **resolved**: their intents become versions at exactly `C` and their locks go. Then the
//!    record is **finished** ([`Decision::Finish`]); it stays until GC collects it (see "Why
//!    records and markers stay" and "Collecting records").
//!
//! # Recovery
//! Anyone who meets a lock for too long (its coordinator may be gone) asks the anchor to abort
//! ([`Decision::Abort`]): an absent record becomes an `Aborted` tombstone (so a prepare that
//! arrives later fails), a decided record answers its decision, and a `Staging` record answers
//! `Staging` with its participants and is left alone: it may be implicitly committed. The
//! recoverer then sends [`Decision::Prevent`] to every other participant: one that holds the
//! transaction's locks answers its prepare timestamp; one that does not writes an `Aborted`
//! marker for the transaction, which every later prepare of it meets and fails on. If every
//! participant was prepared, the recoverer commits at the largest prepare timestamp (the same
//! `C` the coordinator computed); if one was prevented, the transaction can never be
//! implicitly committed, and the recoverer aborts the record ([`Decision::AbortStaging`]).
//! Either way the anchor's Raft log orders the decision against the coordinator's own: the
//! first wins, and a decided record never changes.
//!
//! This is safe because a participant's locks outlive the `Staging` record: they go only by
//! resolution, which only follows a decision at the anchor. So while the record is `Staging`,
//! "no locks here" means "never prepared here", and the marker makes it "never will be".

//! # Why records and markers stay
//! A prepare can arrive twice: the client retries an attempt whose answer it lost, and the
//! first may still be in flight. If the anchor forgot the record, a late prepare there would
//! write a fresh `Staging` record, and late prepares on every participant would make the
//! transaction *implicitly committed again*, at a new timestamp: its writes would reappear
//! over newer ones. So a decided record is kept (until no prepare of it can apply: see the next
//! section), and a prepare that finds it locks nothing.
//! Likewise, resolving a participant leaves a marker of the outcome there: otherwise the
//! coordinator's own second prepare, landing after a recovery committed and resolved the
//! transaction, would lock again above the commit timestamp, and the coordinator would
//! acknowledge the commit at a timestamp it did not commit at (the model test in
//! `apply_2pc_model_tests` found this). With the marker, that prepare answers the decision.
//!
//! # Collecting records
//! Records and markers exist only to turn away late prepares, so they can go once no prepare
//! of their transaction can apply any more. Every prepare carries the transaction's *start
//! timestamp* `txn_ts` (its attempt's read timestamp), the same on every participant, and
//! apply refuses a prepare whose `txn_ts` is below the shard's GC threshold (reads below it
//! are refused already; such an attempt could not have read anyway). A record or marker
//! keeps `txn_ts`, and [`crate::Command::GcRecords`] deletes it once `txn_ts` is below the
//! threshold *and* it is finished:
//! - a marker, or an aborted record, is finished when written: once it is gone, a prepare is
//!   refused, a `Prevent` answers "aborted" (right: the anchor either decided already, or can
//!   now never be implicitly committed), and an `Abort` at the anchor answers
//!   [`TxnStatus::Forgotten`], which a reader that met a lock treats as aborted;
//! - a committed anchor record is finished only by [`Decision::Finish`], sent after every
//!   other participant was resolved (by the coordinator, or by a recovery, which finds the
//!   participants in the record). Collected earlier, a participant still locked would be
//!   settled as aborted against a missing record, and the transaction would lose its writes
//!   there. With the rule, a missing record below the threshold means aborted, or committed
//!   with no lock left anywhere: a lock someone still meets is an aborted transaction's.
//!
//! A coordinator that is answered `Forgotten` (its own commit took longer than the GC TTL)
//! cannot tell the two apart and reports the commit as ambiguous.
//!
//! # Why locks, and who waits
//! Between prepare and resolve, the participant must not let anything break what prepare
//! checked: another write to a read or written key (or a new key in a scanned range) would
//! slip under the transaction's commit timestamp. So writes (`Write`, `Cas`, one-shard `Txn`,
//! other prepares) that touch a locked key answer *locked* and write nothing; readers that
//! meet a write intent they might have to see answer *locked* too. The client waits for the
//! lock to go and, if it stays past a timeout (the coordinator may have died), aborts the
//! transaction at its anchor and resolves the lock itself. Read locks are shared. Each lock
//! keeps its transaction's rank ([`TxnLocks::rank`], and [`LockInfo::rank`] in the answer),
//! so that a *prepare* that meets it can follow wound-wait (see `meridian_types::txn_rank`):
//! a senior prepare recovers the holder at once instead of waiting. The rank decides nothing
//! here: apply answers *locked* the same way whoever asks.
//!
//! # Where
//! Both live in the shard's *transaction region* of `Cf::Data` (`keys::txn_key`): shard-local
//! keys (`01 ‖ shard ‖ …`) that every snapshot of the shard carries and a snapshot install
//! replaces, and that no user key can meet (user keys live in their own keyspace). The locks are also held in memory ([`LockTable`], rebuilt from
//! RocksDB at open and after an install) for the read and write paths to check cheaply.
//!
//! # Invariants
//! - A key has at most one write intent, and never a write intent and another transaction's
//!   read lock at once; no write to a locked key applies.
//! - A prepare timestamp is above every version of its shard when it applies, and a commit
//!   timestamp is at least every participant's prepare timestamp, so a committed intent is
//!   newer than every version of its key.
//! - A transaction is committed iff its anchor's record says `Committed`, or says `Staging`
//!   while every participant holds its locks; a record moves only from `Staging` to a
//!   decision, and a decision never changes.
//! - No participant is resolved while the record is `Staging`.
//!
//! # Not done yet
//! - A committed record whose coordinator died before finishing it stays until a recovery
//!   finishes it. Recoveries happen when a reader meets one of its locks, or when a shard
//!   leader's sweeper (`meridian-server`'s `sweeper`) finds its locks old; a record whose
//!   participants were all resolved has no lock left to find: the record GC pass reports it
//!   (`GcRecordsResult::stuck`) once its transaction started below the GC threshold, and the
//!   sweeper finishes it then.
//! - Finishing costs one more Raft entry on the anchor per multi-shard transaction (not yet
//!   batched with other transactions' entries).
//! - A coordinator that dies after its acknowledgement leaves its locks until readers meet
//!   them (each waits `LOCK_RECOVER_AFTER`, then recovers the transaction) or the sweeper
//!   settles them (`txn_sweep_after_ms` after the prepare).
//! - Pushes: a reader that meets a lock waits, and recovers the holder only after a timeout;
//!   it never moves the holder's timestamp.

use crate::types::RequestId;
use bytes::Bytes;
use meridian_types::TxnRank;
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
    /// The transaction's start timestamp (its attempt's read timestamp), the same in every
    /// prepare of it: what GC compares with the shard's threshold (see "Collecting records").
    pub txn_ts: u64,
    /// The transaction's rank in lock conflicts (see `meridian_types::txn_rank`).
    pub rank: TxnRank,
    /// Write intents: the value each key gets on commit (`None` = delete).
    pub writes: Vec<(Bytes, Option<Bytes>)>,
    /// Keys read (and not written): read locks.
    pub reads: Vec<Bytes>,
    /// Ranges scanned, `[start, end)` (`None` = to the shard's end): read locks.
    pub ranges: Vec<(Bytes, Option<Bytes>)>,
    /// On the anchor's shard only: a key of every other participant shard (what a recovery
    /// must check, see the module docs). Empty elsewhere.
    pub participants: Vec<Bytes>,
}

/// A transaction record's state, on the anchor's shard.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum TxnStatus {
    /// Prepared on the anchor; committed iff every participant is prepared (see the module
    /// docs). On a participant other than the anchor, a record is only ever a *marker* of
    /// the outcome: `Aborted` written by [`Decision::Prevent`], or the decision a resolution
    /// applied.
    Staging,
    Committed(u64),
    Aborted,
    /// Only ever an answer, never stored: no record, and the transaction started below the
    /// shard's GC threshold, so none can be written any more. The transaction was aborted, or
    /// committed and finished (every participant resolved): a lock of it that someone still
    /// meets belongs to an aborted one (see "Collecting records").
    Forgotten,
}

/// What a shard stores under a transaction's record key: on the anchor, the record; on
/// another participant, a marker of the outcome (see the module docs).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TxnRecord {
    pub status: TxnStatus,
    /// The transaction's start timestamp (see [`TxnLocks::txn_ts`]).
    pub txn_ts: u64,
    /// Nothing depends on this record but late prepares: GC may delete it once `txn_ts` is
    /// below the shard's threshold. True for markers and aborted records; a committed anchor
    /// record becomes finished by [`Decision::Finish`], once every participant is resolved.
    pub finished: bool,
    /// On the anchor: a key of every other participant shard (kept after the decision, so a
    /// recovery that finds the record committed but unfinished can resolve and finish it).
    pub participants: Vec<Bytes>,
}

/// What a [`crate::Command::Resolve`] asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Decision {
    /// Commit at this timestamp (on the anchor: decide it, if still staging).
    Commit(u64),
    /// Abort. On the anchor: an absent record becomes `Aborted`; a `Staging` one is left as it
    /// is (it may be implicitly committed: see the module docs) and answered with its
    /// participants.
    Abort,
    /// Anchor only: abort even a `Staging` record. Sent only after a [`Decision::Prevent`] on
    /// one of its participants answered that it was not prepared.
    AbortStaging,
    /// Not on the anchor: answer the transaction's prepare timestamp here if it holds locks;
    /// otherwise write an `Aborted` marker so that it never will.
    Prevent,
    /// Anchor only: the record is committed and every other participant is resolved; GC may
    /// collect it once it is old enough. Appended last (bincode variant indices).
    Finish,
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
    /// The transaction's start timestamp: a recovery sends it with every resolve.
    pub txn_ts: u64,
    /// The holder's rank: a senior prepare wounds it, a junior one waits.
    pub rank: TxnRank,
}

#[derive(Clone, Debug, Default)]
struct KeyLocks {
    writer: Option<TxnId>,
    readers: Vec<TxnId>,
}

/// Every prepared transaction's locks on one shard, indexed by key, and the commits the
/// replica resolved lately (kept here so that they change under the same guard).
#[derive(Debug, Default)]
pub struct LockTable {
    txns: HashMap<TxnId, TxnLocks>,
    keys: BTreeMap<Bytes, KeyLocks>,
    /// See `resolutions`.
    pub resolutions: crate::resolutions::Resolutions,
    /// The shard's GC threshold ([`crate::Command::Gc`]): versions only reads below it could
    /// see may be gone, so readers refuse timestamps below it. Kept here (and persisted in the
    /// transaction region) so that it changes under the same guard as the data it describes.
    pub gc_threshold: u64,
    /// The replica's closed timestamp (see `closed_ts`): readers at or below it need no
    /// leader. Kept here so that it rises under the same guard as the data it covers; not
    /// persisted (a restart starts at 0), carried across a snapshot install.
    pub closed: crate::closed_ts::ClosedState,
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
            txn_ts: locks.txn_ts,
            rank: locks.rank,
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
    /// or below `max_prepare_ts` (`None` for an empty range, `end <= start`).
    pub fn write_intent_in(
        &self,
        start: &[u8],
        end: Option<&[u8]>,
        me: Option<&TxnId>,
        max_prepare_ts: u64,
    ) -> Option<LockInfo> {
        use std::ops::Bound;
        let upper = match end {
            // An empty range (BTreeMap::range would panic on start > end).
            Some(e) if start >= e => return None,
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
            txn_ts: 5,
            rank: TxnRank::default(),
            writes: writes.iter().map(|k| (b(k), Some(b("v")))).collect(),
            reads: reads.iter().map(|k| b(k)).collect(),
            ranges: ranges.iter().map(|(s, e)| (b(s), e.map(b))).collect(),
            participants: vec![],
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

    /// One step of the property test: insert `txn`'s locks (if apply would admit them) or
    /// remove them.
    #[derive(Clone, Debug)]
    enum Op {
        Insert {
            txn: u64,
            writes: Vec<usize>,
            reads: Vec<usize>,
            range: Option<(usize, Option<usize>)>,
            prepare_ts: u64,
        },
        Remove(u64),
    }

    const KEYS: [&str; 6] = ["a", "b", "c", "d", "e", "f"];

    fn op() -> impl proptest::strategy::Strategy<Value = Op> {
        use proptest::prelude::*;
        let keys = || proptest::collection::vec(0..KEYS.len(), 0..3);
        prop_oneof![
            (
                1..5u64,
                keys(),
                keys(),
                proptest::option::of((0..KEYS.len(), proptest::option::of(0..KEYS.len()))),
                1..20u64
            )
                .prop_map(|(txn, writes, reads, range, prepare_ts)| Op::Insert {
                    txn,
                    writes,
                    reads,
                    range,
                    prepare_ts,
                }),
            (1..5u64).prop_map(Op::Remove),
        ]
    }

    /// The naive model: every transaction's locks in a list, every question answered by
    /// looking at all of them.
    struct Model(Vec<(TxnId, TxnLocks)>);

    impl Model {
        fn others<'a>(
            &'a self,
            me: Option<&'a TxnId>,
        ) -> impl Iterator<Item = &'a (TxnId, TxnLocks)> {
            self.0.iter().filter(move |(t, _)| Some(t) != me)
        }

        fn blocks_write(&self, key: &Bytes, me: Option<&TxnId>) -> bool {
            self.others(me).any(|(_, l)| {
                l.writes.iter().any(|(k, _)| k == key)
                    || l.reads.contains(key)
                    || l.ranges
                        .iter()
                        .any(|(s, e)| key >= s && e.as_ref().is_none_or(|e| key < e))
            })
        }

        /// The smallest key in `[start, end)` with another transaction's intent prepared at
        /// or below `max`.
        fn first_intent(
            &self,
            start: &[u8],
            end: Option<&[u8]>,
            me: Option<&TxnId>,
            max: u64,
        ) -> Option<Bytes> {
            self.others(me)
                .filter(|(_, l)| l.prepare_ts <= max)
                .flat_map(|(_, l)| l.writes.iter().map(|(k, _)| k.clone()))
                .filter(|k| &k[..] >= start && end.is_none_or(|e| &k[..] < e))
                .min()
        }

        fn intent_on(&self, key: &Bytes, me: Option<&TxnId>, max: u64) -> bool {
            self.first_intent(key, None, me, max).as_ref() == Some(key)
        }
    }

    proptest::proptest! {
        /// The lock table answers every question as a naive scan of all locks does, over
        /// random sequences of prepares (admitted only if apply would admit them) and removals.
        #[test]
        fn the_lock_table_agrees_with_a_naive_model(ops in proptest::collection::vec(op(), 1..40)) {
            let mut table = LockTable::new();
            let mut model = Model(Vec::new());
            for op in ops {
                match op {
                    Op::Insert { txn, writes, reads, range, prepare_ts } => {
                        let txn = id(txn);
                        if table.get(&txn).is_some() {
                            continue;
                        }
                        let mut writes: Vec<Bytes> = writes.into_iter().map(|i| b(KEYS[i])).collect();
                        writes.sort();
                        writes.dedup();
                        let reads: Vec<Bytes> = reads
                            .into_iter()
                            .map(|i| b(KEYS[i]))
                            .filter(|k| !writes.contains(k))
                            .collect();
                        let ranges: Vec<(Bytes, Option<Bytes>)> = range
                            .filter(|(s, e)| e.is_none_or(|e| e > *s))
                            .map(|(s, e)| (b(KEYS[s]), e.map(|e| b(KEYS[e]))))
                            .into_iter()
                            .collect();
                        // What apply checks before it locks anything.
                        let admitted = !writes.iter().any(|k| model.blocks_write(k, Some(&txn)))
                            && !reads.iter().any(|k| model.intent_on(k, Some(&txn), u64::MAX))
                            && ranges.iter().all(|(s, e)| model.first_intent(s, e.as_deref(), Some(&txn), u64::MAX).is_none());
                        if !admitted {
                            continue;
                        }
                        let locks = TxnLocks {
                            anchor: b("anchor"),
                            prepare_ts,
                            txn_ts: 1,
                            rank: TxnRank::default(),
                            writes: writes.into_iter().map(|k| (k, Some(b("v")))).collect(),
                            reads,
                            ranges,
                            participants: vec![],
                        };
                        table.insert(txn, locks.clone());
                        model.0.push((txn, locks));
                    }
                    Op::Remove(txn) => {
                        let txn = id(txn);
                        let removed = table.remove(&txn);
                        let position = model.0.iter().position(|(t, _)| *t == txn);
                        proptest::prop_assert_eq!(removed.is_some(), position.is_some());
                        if let Some(i) = position {
                            model.0.remove(i);
                        }
                    }
                }
                proptest::prop_assert_eq!(table.len(), model.0.len());
                for me in [None, Some(id(1)), Some(id(2))] {
                    for key in KEYS {
                        let key = b(key);
                        proptest::prop_assert_eq!(
                            table.blocks_write(&key, me.as_ref()).is_some(),
                            model.blocks_write(&key, me.as_ref()),
                            "blocks_write({:?}, {:?})", key, me
                        );
                        for max in [0, 5, 10, u64::MAX] {
                            let point = model.intent_on(&key, me.as_ref(), max).then(|| key.clone());
                            proptest::prop_assert_eq!(
                                table.write_intent(&key, me.as_ref(), max).map(|l| l.key),
                                point
                            );
                            for end in [None, Some(b("d"))] {
                                proptest::prop_assert_eq!(
                                    table.write_intent_in(&key, end.as_deref(), me.as_ref(), max).map(|l| l.key),
                                    model.first_intent(&key, end.as_deref(), me.as_ref(), max)
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}
