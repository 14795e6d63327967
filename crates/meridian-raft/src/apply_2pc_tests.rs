//! Tests of apply's multi-shard transaction commands: one shard at a time, and a model of the
//! whole protocol over two shards whose every interleaving is explored.

use super::*;
use crate::dedup::DedupTable;
use crate::locks::LockTable;
use crate::types::{Command, RequestId};
use meridian_storage::{mvcc, Engine, MemoryEngine};
use meridian_types::{ShardId, Timestamp};

const SHARD: ShardId = ShardId(5);
static WHOLE: meridian_storage::keys::Span = meridian_storage::keys::Span {
    space: meridian_storage::keys::Keyspace::User,
    start: Vec::new(),
    end: Vec::new(),
};

fn b(s: &str) -> Bytes {
    Bytes::copy_from_slice(s.as_bytes())
}

fn id(seq: u64) -> TxnId {
    RequestId { client_id: 9, seq }
}

/// A shard's replicated state across apply calls.
struct Shard {
    engine: MemoryEngine,
    floor: u64,
    dedup: DedupTable,
    locks: LockTable,
}

impl Shard {
    fn new() -> Shard {
        Shard {
            engine: MemoryEngine::new(),
            floor: 0,
            dedup: DedupTable::new(),
            locks: LockTable::new(),
        }
    }

    /// Applies `cmds` as one batch.
    fn apply(&mut self, cmds: Vec<Command>) -> Vec<CommandResult> {
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

    fn one(&mut self, cmd: Command) -> CommandResult {
        self.apply(vec![cmd]).remove(0)
    }

    fn latest(&self, key: &str) -> Option<(u64, Vec<u8>)> {
        mvcc::get(&self.engine, SHARD, key.as_bytes(), Timestamp::MAX)
            .unwrap()
            .map(|(ts, v)| (ts.0, v))
    }
}

fn put(ts: u64, key: &str, value: &str) -> Command {
    Command::Write {
        ts,
        puts: vec![(b(key), b(value))],
        deletes: vec![],
        request: None,
    }
}

fn prepare(
    ts: u64,
    txn: u64,
    is_anchor: bool,
    reads: &[(&str, Option<u64>)],
    writes: &[(&str, &str)],
) -> Command {
    Command::Prepare {
        ts,
        txn: id(txn),
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

fn resolve(txn: u64, anchor: bool, decision: Decision) -> Command {
    Command::Resolve {
        ts: 0,
        txn: id(txn),
        anchor,
        decision,
    }
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

// ---------------------------------------------------------------------------------------------
// A model of the whole protocol: one transaction writing `a` (shard A, its anchor) and `b`
// (shard B); its coordinator, which may die at any point; a reader that meets a lock and
// recovers the transaction; the coordinator's own recovery when a prepare fails; and copies of
// either prepare delivered at any time (a retried attempt). Every interleaving of their steps
// is run against the real apply code; after each, readers recover whatever locks are left, and
// then: no lock may remain; the transaction must be atomic (both keys written at one
// timestamp, or neither); a commit the coordinator acknowledged (or learnt from its recovery)
// must be visible at its timestamp, and one it reported aborted must not be; the anchor's
// record must only move forward.

/// One step of one actor: a Raft entry applied on one shard (or the coordinator's own moves).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    /// The coordinator's prepares (in either order).
    PrepareA,
    PrepareB,
    /// Both prepares answered "prepared": the coordinator acknowledges the commit (no entry).
    Ack,
    /// After the acknowledgement: the explicit commit at the anchor, then B's resolution.
    CommitA,
    ResolveB,
    /// The coordinator stops for good.
    Die,
    /// A recovery's step: by the reader (`false`) or by the coordinator whose prepare failed.
    Recover(bool, RecoverStep),
    /// Another copy of a prepare, delivered now.
    LatePrepareA,
    LatePrepareB,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum RecoverStep {
    /// Abort at the anchor (which leaves a staging record alone).
    Query,
    /// The record is staging: prevent B.
    PreventB,
    /// Commit at the largest prepare timestamp, or abort the staging record.
    Decide,
    /// Resolve B as settled (the reader resolves the lock it met).
    ResolveB,
}

const MODEL_TXN: u64 = 1;

/// How the model's recoveries misbehave, for the negative controls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Flaw {
    None,
    /// The reader drops the lock it met as aborted without asking the anchor.
    BlindReader,
    /// Recoveries abort a staging record without preventing a participant first.
    HastyRecovery,
}

/// One recovery's progress: the anchor's first answer, B's answer, the decision.
#[derive(Clone, Default)]
struct Recovery {
    query: Option<CommandResult>,
    prevent: Option<CommandResult>,
    decided: Option<CommandResult>,
    resolved: bool,
}

impl Recovery {
    /// The decision it learnt, once it has one.
    fn settled(&self) -> Option<Decision> {
        let staged = |r: &CommandResult| r.status == Some(TxnStatus::Staging);
        match (&self.query, &self.decided) {
            (Some(q), _) if !staged(q) => Some(as_decided(q)),
            (_, Some(d)) => Some(as_decided(d)),
            _ => None,
        }
    }

    /// What it decides at the anchor after its query (and prevent): commit at the largest
    /// prepare timestamp if B was prepared, else abort the staging record.
    fn decision(&self) -> Decision {
        let query = self.query.as_ref().expect("queried");
        match &self.prevent {
            Some(p) if p.status == Some(TxnStatus::Staging) => {
                Decision::Commit(query.commit_ts.max(p.commit_ts))
            }
            _ => Decision::AbortStaging,
        }
    }

    fn enabled(&self, started: bool, flaw: Flaw) -> Vec<RecoverStep> {
        let staged = self
            .query
            .as_ref()
            .is_some_and(|q| q.status == Some(TxnStatus::Staging));
        let mut steps = Vec::new();
        if self.query.is_none() && started {
            steps.push(RecoverStep::Query);
        }
        if staged && self.prevent.is_none() && flaw != Flaw::HastyRecovery {
            steps.push(RecoverStep::PreventB);
        }
        if staged
            && self.decided.is_none()
            && (self.prevent.is_some() || flaw == Flaw::HastyRecovery)
        {
            steps.push(RecoverStep::Decide);
        }
        if self.settled().is_some() && !self.resolved {
            steps.push(RecoverStep::ResolveB);
        }
        steps
    }
}

/// A run of the model: both shards and what each actor has been answered.
struct Model {
    a: Shard,
    b: Shard,
    prepared: [Option<CommandResult>; 2],
    acked: Option<u64>,
    committed_a: Option<CommandResult>,
    resolved_b: bool,
    dead: bool,
    /// The reader's recovery and the coordinator's.
    recoveries: [Recovery; 2],
    late: [bool; 2],
    /// The anchor's record after every step.
    records: Vec<Option<TxnStatus>>,
    flaw: Flaw,
}

fn model_prepare(is_anchor: bool, ts: u64, key: &str) -> Command {
    Command::Prepare {
        ts,
        txn: id(MODEL_TXN),
        anchor: b("a"),
        is_anchor,
        reads: vec![],
        ranges: vec![],
        writes: vec![(b(key), Some(b("new")))],
        participants: match is_anchor {
            true => vec![b("b")],
            false => vec![],
        },
    }
}

/// The resolution a participant gets from the anchor's answer.
fn as_decided(anchor: &CommandResult) -> Decision {
    match anchor.status {
        Some(TxnStatus::Committed(c)) => Decision::Commit(c),
        _ => Decision::Abort,
    }
}

/// Whether the coordinator reads a prepare's answer as "prepared" (as the server's answer
/// does: a decision already made on the shard counts, at its timestamp).
fn prepared_ok(r: &CommandResult) -> bool {
    r.commit_ts > 0
        && r.locked.is_none()
        && r.conflict.is_none()
        && r.status != Some(TxnStatus::Aborted)
}

impl Model {
    fn new(flaw: Flaw) -> Model {
        let (mut a, mut b) = (Shard::new(), Shard::new());
        a.one(put(5, "a", "old"));
        // B's clock is ahead: the commit timestamp comes from B's prepare.
        b.one(put(30, "b", "old"));
        Model {
            a,
            b,
            prepared: [None, None],
            acked: None,
            committed_a: None,
            resolved_b: false,
            dead: false,
            recoveries: [Recovery::default(), Recovery::default()],
            late: [false, false],
            records: vec![],
            flaw,
        }
    }

    fn has_lock(shard: &Shard) -> bool {
        shard.locks.get(&id(MODEL_TXN)).is_some()
    }

    fn both_answered(&self) -> bool {
        self.prepared.iter().all(Option::is_some)
    }

    fn all_prepared(&self) -> bool {
        self.both_answered() && self.prepared.iter().flatten().all(prepared_ok)
    }

    fn enabled(&self) -> Vec<Step> {
        let mut steps = Vec::new();
        let live = !self.dead;
        let mut when = |cond: bool, step| {
            if cond {
                steps.push(step)
            }
        };
        when(live && self.prepared[0].is_none(), Step::PrepareA);
        when(live && self.prepared[1].is_none(), Step::PrepareB);
        when(
            live && self.all_prepared() && self.acked.is_none(),
            Step::Ack,
        );
        when(
            live && self.acked.is_some() && self.committed_a.is_none(),
            Step::CommitA,
        );
        let explicit = self
            .committed_a
            .as_ref()
            .is_some_and(|r| matches!(r.status, Some(TxnStatus::Committed(_))));
        when(live && explicit && !self.resolved_b, Step::ResolveB);
        let coordinator_done = self.resolved_b || self.recoveries[1].resolved;
        when(live && !coordinator_done, Step::Die);
        when(!self.late[0], Step::LatePrepareA);
        when(!self.late[1], Step::LatePrepareB);
        let locked = Self::has_lock(&self.a) || Self::has_lock(&self.b);
        for s in self.recoveries[0].enabled(locked, self.flaw) {
            steps.push(Step::Recover(false, s));
        }
        if live {
            let failed = self.both_answered() && !self.all_prepared();
            for s in self.recoveries[1].enabled(failed, self.flaw) {
                steps.push(Step::Recover(true, s));
            }
        }
        steps
    }

    fn anchor(&mut self, decision: Decision) -> CommandResult {
        self.a.one(resolve(MODEL_TXN, true, decision))
    }

    fn resolve_b(&mut self, decision: Decision) -> CommandResult {
        self.b.one(resolve(MODEL_TXN, false, decision))
    }

    fn recover(&mut self, coordinator: bool, step: RecoverStep) {
        let i = usize::from(coordinator);
        match step {
            RecoverStep::Query => {
                let answer = match (self.flaw, coordinator) {
                    (Flaw::BlindReader, false) => CommandResult {
                        status: Some(TxnStatus::Aborted),
                        ..Default::default()
                    },
                    _ => self.anchor(Decision::Abort),
                };
                self.recoveries[i].query = Some(answer);
            }
            RecoverStep::PreventB => {
                self.recoveries[i].prevent = Some(self.resolve_b(Decision::Prevent));
            }
            RecoverStep::Decide => {
                let decision = self.recoveries[i].decision();
                self.recoveries[i].decided = Some(self.anchor(decision));
            }
            RecoverStep::ResolveB => {
                let decision = self.recoveries[i].settled().expect("settled");
                self.resolve_b(decision);
                self.recoveries[i].resolved = true;
            }
        }
    }

    fn step(&mut self, step: Step) {
        match step {
            Step::PrepareA => self.prepared[0] = Some(self.a.one(model_prepare(true, 10, "a"))),
            Step::PrepareB => self.prepared[1] = Some(self.b.one(model_prepare(false, 20, "b"))),
            Step::Ack => {
                let c = self.prepared.iter().flatten().map(|r| r.commit_ts).max();
                self.acked = c;
            }
            Step::CommitA => {
                let c = self.acked.expect("acknowledged");
                self.committed_a = Some(self.anchor(Decision::Commit(c)));
            }
            Step::ResolveB => {
                let c = self.acked.expect("acknowledged");
                self.resolve_b(Decision::Commit(c));
                self.resolved_b = true;
            }
            Step::Die => self.dead = true,
            Step::Recover(coordinator, s) => self.recover(coordinator, s),
            Step::LatePrepareA => {
                self.a.one(model_prepare(true, 40, "a"));
                self.late[0] = true;
            }
            Step::LatePrepareB => {
                self.b.one(model_prepare(false, 40, "b"));
                self.late[1] = true;
            }
        }
        self.records.push(record_of(&self.a));
    }

    /// Correct readers recover whatever locks are left and resolve them as settled.
    fn settle(&mut self) {
        for _ in 0..4 {
            if !Self::has_lock(&self.a) && !Self::has_lock(&self.b) {
                return;
            }
            let mut r = Recovery::default();
            let flaw = match self.flaw {
                Flaw::BlindReader => Flaw::None,
                other => other,
            };
            r.query = Some(self.anchor(Decision::Abort));
            while r.settled().is_none() {
                if flaw != Flaw::HastyRecovery && r.prevent.is_none() {
                    r.prevent = Some(self.resolve_b(Decision::Prevent));
                    continue;
                }
                r.decided = Some(self.anchor(r.decision()));
            }
            let decision = r.settled().expect("settled");
            self.a.one(resolve(MODEL_TXN, false, decision));
            self.resolve_b(decision);
        }
    }

    /// Every property the protocol promises, for this run; `Err` names the one broken.
    fn check(&self) -> Result<(), String> {
        if Self::has_lock(&self.a) || Self::has_lock(&self.b) {
            return Err("a lock outlived its transaction".into());
        }
        let (va, vb) = (self.a.latest("a"), self.b.latest("b"));
        let new = |v: &Option<(u64, Vec<u8>)>| v.as_ref().is_some_and(|(_, v)| v == b"new");
        match (new(&va), new(&vb)) {
            (true, true) if va.as_ref().map(|v| v.0) == vb.as_ref().map(|v| v.0) => {}
            (false, false) => {}
            _ => return Err(format!("not atomic: a = {va:?}, b = {vb:?}")),
        }
        let reported = match (self.acked, self.recoveries[1].settled()) {
            (Some(c), _) | (None, Some(Decision::Commit(c))) => Some(Some(c)),
            (None, Some(_)) => Some(None),
            (None, None) => None,
        };
        match reported {
            Some(Some(c)) if va.as_ref().map(|v| v.0) != Some(c) || !new(&va) => {
                return Err(format!("acknowledged at {c} but not visible there: {va:?}"));
            }
            Some(None) if new(&va) => {
                return Err(format!("reported aborted but visible: {va:?}"));
            }
            _ => {}
        }
        let rank = |s: &Option<TxnStatus>| match s {
            None => 0,
            Some(TxnStatus::Staging) => 1,
            Some(_) => 2,
        };
        for pair in self.records.windows(2) {
            let moved_back = rank(&pair[1]) < rank(&pair[0]);
            let changed_final = rank(&pair[0]) == 2 && pair[0] != pair[1];
            if moved_back || changed_final {
                return Err(format!(
                    "the record went from {:?} to {:?}",
                    pair[0], pair[1]
                ));
            }
        }
        Ok(())
    }
}

fn record_of(shard: &Shard) -> Option<TxnStatus> {
    let key = keys::txn_key(SHARD, TxnKeyKind::Record, 9, MODEL_TXN);
    shard
        .engine
        .get(Cf::Data, &key)
        .expect("read")
        .map(|raw| codec::decode(&raw).expect("a record"))
}

/// Runs every interleaving; returns how many there were and the first broken property.
fn explore(flaw: Flaw) -> (usize, Option<(Vec<Step>, String)>) {
    fn replay(steps: &[Step], flaw: Flaw) -> Model {
        let mut m = Model::new(flaw);
        for s in steps {
            m.step(*s);
        }
        m
    }
    let (mut runs, mut stack) = (0usize, vec![Vec::<Step>::new()]);
    while let Some(prefix) = stack.pop() {
        let mut m = replay(&prefix, flaw);
        let next = m.enabled();
        if next.is_empty() {
            runs += 1;
            m.settle();
            if let Err(broken) = m.check() {
                return (runs, Some((prefix, broken)));
            }
            continue;
        }
        for s in next {
            let mut longer = prefix.clone();
            longer.push(s);
            stack.push(longer);
        }
    }
    (runs, None)
}

#[test]
fn every_interleaving_of_coordinator_recovery_and_late_prepares_is_atomic() {
    let (runs, broken) = explore(Flaw::None);
    assert!(broken.is_none(), "{broken:?}");
    assert!(runs > 1_000, "only {runs} interleavings explored");
    eprintln!("{runs} interleavings explored");
}

#[test]
fn the_model_catches_a_reader_that_drops_locks_without_asking_the_anchor() {
    let (_, broken) = explore(Flaw::BlindReader);
    let (steps, what) = broken.expect("the negative control must break atomicity");
    assert!(
        what.contains("not atomic") || what.contains("acknowledged"),
        "{steps:?}: {what}"
    );
}

#[test]
fn the_model_catches_a_recovery_that_aborts_a_staging_record_without_preventing() {
    let (_, broken) = explore(Flaw::HastyRecovery);
    let (steps, what) = broken.expect("the negative control must break a promise");
    assert!(
        what.contains("not atomic") || what.contains("acknowledged"),
        "{steps:?}: {what}"
    );
}
