//! Tests of apply's multi-shard transaction commands, one shard at a time (the model of the
//! whole protocol is in `apply_2pc_model_tests`).

use super::*;
use crate::dedup::DedupTable;
use crate::locks::LockTable;
use crate::types::{Command, RequestId};
use meridian_storage::{mvcc, Engine, MemoryEngine};
use meridian_types::{ShardId, Timestamp};

pub(super) const SHARD: ShardId = ShardId(5);
static WHOLE: meridian_storage::keys::Span = meridian_storage::keys::Span {
    space: meridian_storage::keys::Keyspace::User,
    start: Vec::new(),
    end: Vec::new(),
};

pub(super) fn b(s: &str) -> Bytes {
    Bytes::copy_from_slice(s.as_bytes())
}

pub(super) fn id(seq: u64) -> TxnId {
    RequestId { client_id: 9, seq }
}

/// A shard's replicated state across apply calls.
pub(super) struct Shard {
    pub(super) engine: MemoryEngine,
    pub(super) floor: u64,
    dedup: DedupTable,
    pub(super) locks: LockTable,
}

impl Shard {
    pub(super) fn new() -> Shard {
        Shard {
            engine: MemoryEngine::new(),
            floor: 0,
            dedup: DedupTable::new(),
            locks: LockTable::new(),
        }
    }

    /// Applies `cmds` as one batch.
    pub(super) fn apply(&mut self, cmds: Vec<Command>) -> Vec<CommandResult> {
        let mut work = ApplyBatch::new(
            SHARD,
            &WHOLE,
            &self.engine,
            &mut self.floor,
            &mut self.dedup,
            &mut self.locks,
        );
        let results = cmds
            .into_iter()
            .map(|c| work.apply(c, 1).expect("apply"))
            .collect();
        let batch = work.batch;
        self.engine.write(batch, false).expect("write");
        results
    }

    pub(super) fn one(&mut self, cmd: Command) -> CommandResult {
        self.apply(vec![cmd]).remove(0)
    }

    pub(super) fn latest(&self, key: &str) -> Option<(u64, Vec<u8>)> {
        mvcc::get(&self.engine, SHARD, key.as_bytes(), Timestamp::MAX)
            .unwrap()
            .map(|(ts, v)| (ts.0, v))
    }
}

pub(super) fn put(ts: u64, key: &str, value: &str) -> Command {
    Command::Write {
        ts,
        puts: vec![(b(key), b(value))],
        deletes: vec![],
        request: None,
    }
}

pub(super) fn prepare(
    ts: u64,
    txn: u64,
    is_anchor: bool,
    reads: &[(&str, Option<u64>)],
    writes: &[(&str, &str)],
) -> Command {
    Command::Prepare {
        ts,
        txn: id(txn),
        txn_ts: TXN_TS,
        rank: rank_of(txn),
        anchor: b("anchor"),
        is_anchor,
        reads: reads
            .iter()
            .map(|(k, v)| ReadCheck {
                key: b(k),
                version: *v,
            })
            .collect(),
        ranges: vec![],
        writes: writes.iter().map(|(k, v)| (b(k), Some(b(v)))).collect(),
        participants: match is_anchor {
            true => vec![b("other")],
            false => vec![],
        },
    }
}

/// Every test transaction's start timestamp.
pub(super) const TXN_TS: u64 = 3;

/// Test transaction `txn`'s rank: normal priority, first attempt at `100 + txn`.
pub(super) fn rank_of(txn: u64) -> meridian_types::TxnRank {
    meridian_types::TxnRank::new(meridian_types::TxnPriority::Normal, 100 + txn)
}

pub(super) fn resolve(txn: u64, anchor: bool, decision: Decision) -> Command {
    Command::Resolve {
        ts: 0,
        txn: id(txn),
        txn_ts: TXN_TS,
        anchor,
        decision,
    }
}

/// A GC page raising the threshold to `threshold` (deleting no versions the tests look at).
pub(super) fn raise(s: &mut Shard, threshold: u64) {
    s.one(Command::Gc {
        threshold,
        from: None,
    });
}

/// [`raise`], then one page of record collection.
pub(super) fn gc(s: &mut Shard, threshold: u64) -> crate::types::GcRecordsResult {
    raise(s, threshold);
    s.one(Command::GcRecords { from: None })
        .gc_records
        .expect("a record GC result")
}

/// What the leader's survey (`gc_survey`) says a pass at `threshold` would do.
fn survey(s: &Shard, threshold: u64) -> bool {
    crate::gc_survey::would_collect(&s.engine, SHARD, &WHOLE, s.locks.gc_threshold, threshold)
        .expect("survey")
}

/// The survey finds garbage exactly where a pass deletes versions: not in keys written once.
#[test]
fn the_gc_survey_finds_overwritten_and_deleted_versions_not_keys_written_once() {
    let mut s = Shard::new();
    assert!(!survey(&s, 100), "an empty shard");
    s.one(put(10, "a", "1"));
    s.one(put(11, "b", "1"));
    assert!(!survey(&s, 100), "one version per key: each is its keeper");
    s.one(put(20, "a", "2"));
    assert!(!survey(&s, 15), "the old version is still read at 15");
    assert!(survey(&s, 25), "below 25 only the newer version is read");
    let pass = s.one(Command::Gc {
        threshold: 25,
        from: None,
    });
    assert_eq!(
        pass.gc.map(|g| g.versions_deleted),
        Some(1),
        "the pass agrees"
    );
    assert!(!survey(&s, 30), "collected");
    s.one(Command::Write {
        ts: 40,
        puts: vec![],
        deletes: vec![b("b")],
        request: None,
    });
    assert!(!survey(&s, 35), "the delete is above 35");
    assert!(survey(&s, 45), "a tombstone below the threshold goes");
}

#[test]
fn a_prepared_write_blocks_other_writes_until_it_commits_at_exactly_the_decided_timestamp() {
    let mut s = Shard::new();
    assert_eq!(s.one(put(10, "a", "old")).commit_ts, 10);
    let p = s.one(prepare(
        5,
        1,
        false,
        &[("a", Some(10))],
        &[("a", "new"), ("b", "x")],
    ));
    assert_eq!(p.commit_ts, 11, "the prepare timestamp is above the floor");
    for key in ["a", "b"] {
        let r = s.one(put(20, key, "other"));
        let lock = r.locked.expect("locked");
        assert_eq!((lock.txn, lock.write, r.commit_ts), (id(1), true, 0));
        assert_eq!(lock.rank, rank_of(1), "the holder's rank, for wound-wait");
    }
    assert_eq!(
        s.latest("a"),
        Some((10, b"old".to_vec())),
        "nothing visible yet"
    );
    // Another shard's prepare timestamp was larger: the commit is at 40 here too.
    let r = s.one(resolve(1, false, Decision::Commit(40)));
    assert_eq!(r.commit_ts, 40);
    assert_eq!(s.latest("a"), Some((40, b"new".to_vec())));
    assert_eq!(s.latest("b"), Some((40, b"x".to_vec())));
    assert!(s.locks.is_empty());
    assert_eq!(s.floor, 40);
    assert_eq!(
        s.one(put(20, "a", "later")).commit_ts,
        41,
        "later writes go above"
    );
    // Resolving again is a no-op.
    assert_eq!(s.one(resolve(1, false, Decision::Commit(40))).commit_ts, 40);
    assert_eq!(s.latest("a"), Some((41, b"later".to_vec())));
}

#[test]
fn a_prepare_checks_its_reads_and_other_locks_and_a_retry_answers_the_first_prepare() {
    let mut s = Shard::new();
    s.one(put(10, "a", "v"));
    let stale = s.one(prepare(20, 1, false, &[("a", Some(9))], &[("c", "x")]));
    assert_eq!(stale.conflict, Some(b("a")));
    assert!(s.locks.is_empty());
    // Read locks are shared; a write to a read-locked key is locked.
    let r1 = s.one(prepare(20, 2, false, &[("a", Some(10))], &[("c", "x")]));
    let r2 = s.one(prepare(21, 3, false, &[("a", Some(10))], &[("d", "y")]));
    assert!(r1.locked.is_none() && r2.locked.is_none() && r2.conflict.is_none());
    let w = s.one(prepare(22, 4, false, &[], &[("a", "z")]));
    assert!(w.locked.is_some(), "{w:?}");
    let reader = s.one(prepare(22, 5, false, &[("c", None)], &[("e", "z")]));
    assert_eq!(
        reader.locked.map(|l| l.txn),
        Some(id(2)),
        "c is an intent of txn 2"
    );
    let again = s.one(prepare(30, 2, false, &[("a", Some(10))], &[("c", "x")]));
    assert_eq!(again.commit_ts, r1.commit_ts, "a retried prepare");
    assert_eq!(s.locks.len(), 2);
    s.one(resolve(2, false, Decision::Abort));
    s.one(resolve(3, false, Decision::Abort));
    assert!(s.locks.is_empty());
    assert_eq!(s.latest("c"), None, "aborted intents vanish");
    assert_eq!(s.one(put(30, "a", "w")).commit_ts, 30);
}

#[test]
fn the_anchor_record_is_staged_then_decided_once_and_kept() {
    let mut s = Shard::new();
    let p = s.one(prepare(10, 1, true, &[], &[("k", "v")]));
    assert_eq!(p.commit_ts, 10);
    // A plain abort leaves a staging record alone and answers what a recovery must check.
    let abort = s.one(resolve(1, true, Decision::Abort));
    assert_eq!(
        (abort.status, abort.commit_ts, abort.participants.clone()),
        (Some(TxnStatus::Staging), 10, vec![b("other")])
    );
    assert!(s.locks.get(&id(1)).is_some(), "still prepared");
    // A recovery that prevented a participant and the coordinator race: the first wins.
    let abort = s.one(resolve(1, true, Decision::AbortStaging));
    assert_eq!(abort.status, Some(TxnStatus::Aborted));
    let commit = s.one(resolve(1, true, Decision::Commit(12)));
    assert_eq!(
        (commit.status, commit.commit_ts),
        (Some(TxnStatus::Aborted), 0)
    );
    assert_eq!(s.latest("k"), None);
    // The other way round.
    s.one(prepare(20, 2, true, &[], &[("k", "w")]));
    let commit = s.one(resolve(2, true, Decision::Commit(25)));
    assert_eq!(commit.status, Some(TxnStatus::Committed(25)));
    assert_eq!(s.latest("k"), Some((25, b"w".to_vec())));
    for late in [Decision::Abort, Decision::AbortStaging] {
        let abort = s.one(resolve(2, true, late));
        assert_eq!(
            (abort.status, abort.commit_ts),
            (Some(TxnStatus::Committed(25)), 25)
        );
    }
    assert_eq!(s.latest("k"), Some((25, b"w".to_vec())));
    // The record is kept: a prepare delivered late locks nothing and stages nothing.
    let late = s.one(prepare(30, 2, true, &[], &[("k", "w")]));
    assert_eq!(late.status, Some(TxnStatus::Committed(25)));
    assert!(s.locks.is_empty());
    // A commit below the anchor's own prepare timestamp is refused.
    s.one(prepare(30, 3, true, &[], &[("m", "v")]));
    assert!(s
        .one(resolve(3, true, Decision::Commit(29)))
        .rejected
        .is_some());
    // The anchor's own shard is never resolved as a participant while the record is staging.
    for early in [Decision::Commit(31), Decision::Abort, Decision::Prevent] {
        assert!(
            s.one(resolve(3, false, early)).rejected.is_some(),
            "{early:?}"
        );
    }
    assert!(s.locks.get(&id(3)).is_some(), "still prepared");
    // Prevent is for the other participants, AbortStaging for the anchor.
    assert!(s
        .one(resolve(3, true, Decision::Prevent))
        .rejected
        .is_some());
    assert!(s
        .one(resolve(3, false, Decision::AbortStaging))
        .rejected
        .is_some());
}

#[test]
fn a_recovery_that_finds_no_record_leaves_a_tombstone_a_late_prepare_respects() {
    let mut s = Shard::new();
    let abort = s.one(resolve(1, true, Decision::Abort));
    assert_eq!(abort.status, Some(TxnStatus::Aborted));
    let late = s.one(prepare(10, 1, true, &[], &[("k", "v")]));
    assert_eq!(late.status, Some(TxnStatus::Aborted));
    assert!(s.locks.is_empty(), "nothing locked");
    // In one batch too: the record written earlier in the batch is seen.
    let r = s.apply(vec![
        resolve(2, true, Decision::Abort),
        prepare(11, 2, true, &[], &[("k", "v")]),
    ]);
    assert_eq!(r[1].status, Some(TxnStatus::Aborted));
    assert!(s.locks.is_empty());
}

#[test]
fn prevent_reports_a_prepare_or_makes_sure_it_never_happens() {
    let mut s = Shard::new();
    let p = s.one(prepare(10, 1, false, &[], &[("k", "v")]));
    let prepared = s.one(resolve(1, false, Decision::Prevent));
    assert_eq!(
        (prepared.status, prepared.commit_ts),
        (Some(TxnStatus::Staging), p.commit_ts)
    );
    assert!(
        s.locks.get(&id(1)).is_some(),
        "a prepared shard keeps its locks"
    );
    let prevented = s.one(resolve(2, false, Decision::Prevent));
    assert_eq!(prevented.status, Some(TxnStatus::Aborted));
    let late = s.one(prepare(20, 2, false, &[], &[("m", "v")]));
    assert_eq!(late.status, Some(TxnStatus::Aborted), "the prepare fails");
    assert!(s.locks.get(&id(2)).is_none());
    assert_eq!(
        s.one(resolve(2, false, Decision::Prevent)).status,
        Some(TxnStatus::Aborted),
        "again"
    );
    // In one batch: the marker written earlier in the batch is seen.
    let r = s.apply(vec![
        resolve(3, false, Decision::Prevent),
        prepare(21, 3, false, &[], &[("n", "v")]),
    ]);
    assert_eq!(r[1].status, Some(TxnStatus::Aborted));
    assert!(s.locks.get(&id(3)).is_none());
}

#[test]
fn locks_prepared_after_their_transaction_was_decided_are_dropped_not_committed() {
    let mut s = Shard::new();
    s.one(put(50, "x", "newer"));
    // A prepare that arrived after the decision (at 40) prepares above it.
    let p = s.one(prepare(10, 1, false, &[], &[("k", "late")]));
    assert!(p.commit_ts > 50);
    s.one(resolve(1, false, Decision::Commit(40)));
    assert!(s.locks.is_empty());
    assert_eq!(
        s.latest("k"),
        None,
        "never written below the shard's newer versions"
    );
    // The resolution left its marker: yet another copy answers the decision, locking nothing.
    let again = s.one(prepare(60, 1, false, &[], &[("k", "late")]));
    assert_eq!(
        (again.status, again.commit_ts),
        (Some(TxnStatus::Committed(40)), 40)
    );
    assert!(s.locks.is_empty());
}

#[test]
fn finished_records_and_markers_below_the_threshold_are_collected_and_stay_gone() {
    let record_count = |s: &Shard| {
        let (start, end) = keys::txn_kind_range(SHARD, TxnKeyKind::Record);
        s.engine.scan(Cf::Data, &start, Some(&end), false).count()
    };
    // The anchor: committed, so kept until finished.
    let mut a = Shard::new();
    for (txn, key) in [(1, "k"), (5, "j")] {
        let p = a.one(prepare(10, txn, true, &[], &[(key, "v")]));
        assert!(p.rejected.is_none() && p.commit_ts > 0, "{p:?}");
    }
    for txn in [1, 5] {
        let committed = a.one(resolve(txn, true, Decision::Commit(20)));
        assert_eq!(committed.status, Some(TxnStatus::Committed(20)));
    }
    let asked = a.one(resolve(1, true, Decision::Abort));
    assert_eq!(
        (asked.status, asked.participants.clone()),
        (Some(TxnStatus::Committed(20)), vec![b("other")]),
        "an unfinished record names the participants a recovery must resolve"
    );
    assert!(a
        .one(resolve(1, true, Decision::Finish))
        .participants
        .is_empty());
    // Finished but not below the threshold: kept, and nothing is reported stuck.
    assert!(!survey(&a, TXN_TS), "the survey agrees: nothing to do");
    let above = gc(&mut a, TXN_TS);
    assert_eq!((above.deleted, above.stuck.len()), (0, 0));
    // Below it: the finished one goes, the unfinished one (5) stays and is reported stuck.
    assert!(
        survey(&a, TXN_TS + 1),
        "the survey agrees: a record to delete"
    );
    let page = gc(&mut a, TXN_TS + 1);
    assert_eq!((page.examined, page.deleted), (2, 1));
    assert_eq!(record_count(&a), 1);
    assert_eq!(
        page.stuck,
        vec![crate::types::StuckRecord {
            txn: id(5),
            txn_ts: TXN_TS,
            commit_ts: 20,
        }]
    );
    assert_eq!(
        a.one(resolve(5, true, Decision::Abort)).status,
        Some(TxnStatus::Committed(20))
    );
    assert!(
        survey(&a, TXN_TS + 1),
        "the survey agrees: a stuck record to report"
    );
    a.one(resolve(5, true, Decision::Finish));
    let finished = gc(&mut a, TXN_TS + 1);
    assert_eq!((finished.deleted, finished.stuck.len()), (1, 0));
    assert_eq!(record_count(&a), 0);
    assert!(!survey(&a, TXN_TS + 1), "the survey agrees: nothing left");
    // Gone for good: a late prepare is refused, a recovery is told `Forgotten` and writes no
    // tombstone; the data stays.
    let late = a.one(prepare(20, 1, true, &[], &[("k", "late")]));
    assert_eq!(late.status, Some(TxnStatus::Aborted), "{late:?}");
    assert_eq!(record_count(&a), 0, "and stages nothing");
    assert!(a.locks.is_empty());
    for decision in [Decision::Abort, Decision::AbortStaging, Decision::Finish] {
        let r = a.one(resolve(1, true, decision));
        assert_eq!(r.status, Some(TxnStatus::Forgotten), "{decision:?}");
    }
    assert_eq!(record_count(&a), 0);
    assert_eq!(a.latest("k"), Some((20, b"v".to_vec())));
    // An aborted record is finished at once; a staging one never is.
    a.one(resolve(2, true, Decision::AbortStaging)); // below the threshold: nothing written
    assert_eq!(record_count(&a), 0);
    let young = Command::Prepare {
        ts: 30,
        txn: id(3),
        txn_ts: TXN_TS + 10,
        rank: rank_of(3),
        anchor: b("anchor"),
        is_anchor: true,
        reads: vec![],
        ranges: vec![],
        writes: vec![(b("m"), Some(b("v")))],
        participants: vec![b("other")],
    };
    assert!(a.one(young).rejected.is_none());
    let staging = gc(&mut a, TXN_TS + 20);
    assert_eq!(
        (staging.deleted, staging.stuck.len()),
        (0, 0),
        "staging: its locks lead to it"
    );
    assert!(a.locks.get(&id(3)).is_some());
    // A participant: its markers are finished; below the threshold none is written.
    let mut p = Shard::new();
    p.one(prepare(10, 1, false, &[], &[("q", "v")]));
    p.one(resolve(1, false, Decision::Commit(15)));
    p.one(resolve(2, false, Decision::Prevent));
    assert_eq!(record_count(&p), 2);
    let page = gc(&mut p, TXN_TS + 1);
    assert_eq!((page.examined, page.deleted), (2, 2));
    let again = p.one(resolve(4, false, Decision::Prevent));
    assert_eq!(again.status, Some(TxnStatus::Aborted));
    assert_eq!(record_count(&p), 0, "no marker needed below the threshold");
    let late = p.one(prepare(20, 2, false, &[], &[("q", "late")]));
    assert_eq!(late.status, Some(TxnStatus::Aborted), "{late:?}");
    assert!(p.locks.is_empty());
    assert_eq!(p.latest("q"), Some((15, b"v".to_vec())));
}

#[test]
fn one_shard_commits_and_cas_meet_locks_too() {
    let mut s = Shard::new();
    s.one(prepare(10, 1, false, &[("r", None)], &[("w", "v")]));
    let txn = Command::Txn {
        ts: 20,
        reads: vec![ReadCheck {
            key: b("w"),
            version: None,
        }],
        ranges: vec![],
        writes: vec![(b("z"), Some(b("1")))],
        request: None,
    };
    assert!(s.one(txn).locked.is_some(), "reads an intent");
    let cas = Command::Cas {
        ts: 21,
        key: b("r"),
        expect: crate::types::Expect::Absent,
        value: Some(b("1")),
        request: None,
    };
    assert!(s.one(cas).locked.is_some(), "writes a read-locked key");
    let scan = Command::Txn {
        ts: 22,
        reads: vec![],
        ranges: vec![RangeCheck {
            start: b("a"),
            end: None,
            rows: vec![],
        }],
        writes: vec![(b("q"), None)],
        request: None,
    };
    assert!(s.one(scan).locked.is_some(), "scans over an intent");
}
