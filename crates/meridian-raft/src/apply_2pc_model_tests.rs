//! A model of the whole multi-shard transaction protocol over two shards, run against the real
//! apply code, whose every interleaving is explored (see the comment below).

use super::tests::{b, id, put, raise, resolve, Shard, SHARD, TXN_TS};
use super::*;
use crate::types::Command;
use meridian_storage::Engine;

// A model of the whole protocol: one transaction writing `a` (shard A, its anchor) and `b`
// (shard B); its coordinator, which may die at any point; a reader that meets a lock and
// recovers the transaction; the coordinator's own recovery when a prepare fails; and copies of
// either prepare delivered at any time (a retried attempt); and GC on either shard in its two
// halves, each at any time: its threshold rises above the transaction's start (from then on
// the shard refuses its prepares), and later its finished records and markers are collected. Every interleaving of their steps is run against the real apply
// code, each distinct state once; at the end of each, readers recover whatever locks are left,
// and then: no lock may remain; the transaction must be atomic (both keys written at one
// timestamp, or neither); a commit the coordinator acknowledged (or learnt from its recovery)
// must be visible at its timestamp, and one it reported aborted must not be (one it was told
// was forgotten it reports as ambiguous); the anchor's record must only move forward (absent,
// staging, decided, collected), checked after every step.

/// One step of one actor: a Raft entry applied on one shard (or the coordinator's own moves).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    /// The coordinator's prepares (in either order).
    PrepareA,
    PrepareB,
    /// Both prepares answered "prepared": the coordinator acknowledges the commit (no entry).
    Ack,
    /// After the acknowledgement: the explicit commit at the anchor, then B's resolution,
    /// then finishing the record.
    CommitA,
    ResolveB,
    FinishA,
    /// The coordinator stops for good.
    Die,
    /// A recovery's step: by the reader (`false`) or by the coordinator whose prepare failed.
    Recover(bool, RecoverStep),
    /// Another copy of a prepare, delivered now.
    LatePrepareA,
    LatePrepareB,
    /// GC on a shard in its two halves, each at any time: the threshold rises above the
    /// transaction's start (a version GC page), then the finished records below it go.
    RaiseA,
    RaiseB,
    CollectA,
    CollectB,
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
    /// Committed: finish the record (B is resolved).
    Finish,
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
    /// GC collects the anchor's record even if committed and not finished.
    EagerGc,
}

/// One recovery's progress: the anchor's first answer, B's answer, the decision.
#[derive(Clone, Debug, Default)]
struct Recovery {
    query: Option<CommandResult>,
    prevent: Option<CommandResult>,
    decided: Option<CommandResult>,
    resolved: bool,
    finished: bool,
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
        if self.resolved && matches!(self.settled(), Some(Decision::Commit(_))) && !self.finished {
            steps.push(RecoverStep::Finish);
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
    finished_a: bool,
    /// Per shard: the threshold raised, the records collected.
    gc: [(bool, bool); 2],
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
        txn_ts: TXN_TS,
        rank: meridian_types::TxnRank::default(),
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
            finished_a: false,
            gc: [(false, false); 2],
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
        when(live && self.resolved_b && !self.finished_a, Step::FinishA);
        let coordinator_done = self.finished_a || self.recoveries[1].resolved;
        when(live && !coordinator_done, Step::Die);
        when(!self.late[0], Step::LatePrepareA);
        when(!self.late[1], Step::LatePrepareB);
        when(!self.gc[0].0, Step::RaiseA);
        when(!self.gc[1].0, Step::RaiseB);
        when(self.gc[0].0 && !self.gc[0].1, Step::CollectA);
        when(self.gc[1].0 && !self.gc[1].1, Step::CollectB);
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
            RecoverStep::Finish => {
                self.anchor(Decision::Finish);
                self.recoveries[i].finished = true;
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
            Step::FinishA => {
                self.anchor(Decision::Finish);
                self.finished_a = true;
            }
            Step::RaiseA | Step::RaiseB => {
                let i = usize::from(step == Step::RaiseB);
                let shard = if i == 0 { &mut self.a } else { &mut self.b };
                raise(shard, TXN_TS + 1);
                self.gc[i].0 = true;
            }
            Step::CollectA | Step::CollectB => {
                let i = usize::from(step == Step::CollectB);
                if i == 0 && self.flaw == Flaw::EagerGc {
                    let key = keys::txn_key(SHARD, TxnKeyKind::Record, 9, MODEL_TXN);
                    if matches!(record_of(&self.a), Some(TxnStatus::Committed(_))) {
                        let mut batch = meridian_storage::WriteBatch::default();
                        batch.delete(Cf::Data, key);
                        self.a.engine.write(batch, false).expect("write");
                    }
                }
                let shard = if i == 0 { &mut self.a } else { &mut self.b };
                shard.one(Command::GcRecords { from: None });
                self.gc[i].1 = true;
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
        let forgotten = [&self.recoveries[1].query, &self.recoveries[1].decided]
            .into_iter()
            .flatten()
            .any(|r| r.status == Some(TxnStatus::Forgotten));
        let reported = match (self.acked, self.recoveries[1].settled()) {
            (Some(c), _) | (None, Some(Decision::Commit(c))) => Some(Some(c)),
            // Forgotten: the coordinator reports the commit as ambiguous.
            (None, Some(_)) if forgotten => None,
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
        self.check_history()
    }

    /// The anchor's record along this run: absent, staging, decided, then (once decided)
    /// collected; never backwards, and a decision never changes.
    fn check_history(&self) -> Result<(), String> {
        let ranks = self.ranks();
        for (pair, rank) in self.records.windows(2).zip(ranks.windows(2)) {
            let moved_back = rank[1] < rank[0];
            let changed_final = rank[0] == 2 && rank[1] == 2 && pair[0] != pair[1];
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

impl Model {
    /// [`Model::check_history`]'s rank of the anchor's record after each step.
    fn ranks(&self) -> Vec<u8> {
        let mut ranks: Vec<u8> = Vec::new();
        for r in &self.records {
            let before = ranks.last().copied().unwrap_or(0);
            ranks.push(match r {
                None if before >= 2 => 3,
                None => 0,
                Some(TxnStatus::Staging) => 1,
                Some(_) => 2,
            });
        }
        ranks
    }

    /// Everything the rest of a run depends on: both shards' stored state, every actor's
    /// answers so far, and the record's rank (runs that reach the same state continue alike).
    fn fingerprint(&self) -> u64 {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        for shard in [&self.a, &self.b] {
            for item in shard.engine.scan(Cf::Data, &[], None, false) {
                let (k, v) = item.expect("scan");
                (k.to_vec(), v.to_vec()).hash(&mut h);
            }
            shard.floor.hash(&mut h);
        }
        format!(
            "{:?} {:?} {:?} {} {} {:?} {} {:?} {:?} {:?}",
            self.prepared,
            self.acked,
            self.committed_a,
            self.resolved_b,
            self.finished_a,
            self.gc,
            self.dead,
            self.recoveries,
            self.late,
            self.ranks().last()
        )
        .hash(&mut h);
        h.finish()
    }
}

fn record_of(shard: &Shard) -> Option<TxnStatus> {
    let key = keys::txn_key(SHARD, TxnKeyKind::Record, 9, MODEL_TXN);
    shard
        .engine
        .get(Cf::Data, &key)
        .expect("read")
        .map(|raw| codec::decode::<TxnRecord>(&raw).expect("a record").status)
}

/// Runs every interleaving, each distinct state once (runs that reach the same state go on
/// alike); returns how many distinct states there were and the first broken property.
fn explore(flaw: Flaw) -> (usize, Option<(Vec<Step>, String)>) {
    fn replay(steps: &[Step], flaw: Flaw) -> Model {
        let mut m = Model::new(flaw);
        for s in steps {
            m.step(*s);
        }
        m
    }
    let mut stack = vec![Vec::<Step>::new()];
    let mut seen = std::collections::HashSet::new();
    while let Some(prefix) = stack.pop() {
        let mut m = replay(&prefix, flaw);
        if let Err(broken) = m.check_history() {
            return (seen.len(), Some((prefix, broken)));
        }
        if !seen.insert(m.fingerprint()) {
            continue;
        }
        let next = m.enabled();
        if next.is_empty() {
            m.settle();
            if let Err(broken) = m.check() {
                return (seen.len(), Some((prefix, broken)));
            }
            continue;
        }
        for s in next {
            let mut longer = prefix.clone();
            longer.push(s);
            stack.push(longer);
        }
    }
    (seen.len(), None)
}

#[test]
fn every_interleaving_of_coordinator_recovery_and_late_prepares_is_atomic() {
    let (states, broken) = explore(Flaw::None);
    assert!(broken.is_none(), "{broken:?}");
    assert!(states > 1_000, "only {states} states explored");
    eprintln!("{states} distinct states explored");
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

#[test]
fn the_model_catches_gc_that_collects_a_committed_record_before_it_is_finished() {
    let (_, broken) = explore(Flaw::EagerGc);
    let (steps, what) = broken.expect("the negative control must break atomicity");
    assert!(what.contains("not atomic"), "{steps:?}: {what}");
}
