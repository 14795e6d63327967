//! What each committed command writes: the pure-ish core of a shard's apply.
//!
//! [`ApplyBatch`] turns commands, in log order, into one RocksDB [`WriteBatch`] plus dedup
//! table changes; `state_machine` adds the applied index and writes it all atomically.
//!
//! # Timestamps
//! A write's version timestamp is `max(proposed, floor + 1)`, and the floor rises to it, so a
//! shard's versions strictly increase in log order on every replica (see `state_machine`).
//!
//! # Compare-and-swap reads inside apply
//! A [`Command::Cas`] must see the key as of its place in the log: everything applied before
//! it, including writes earlier in the *same* batch, which is not in RocksDB yet. So the batch
//! keeps `pending`, the newest state of each key it has written, and a CAS consults it before
//! RocksDB (one point read of the key's latest-version slot; `state_machine` runs the whole
//! apply on the blocking pool, never on the reactor). Every replica applies the same log to the
//! same state, so every replica reaches the same verdict.
//!
//! # Transaction commits
//! A [`Command::Txn`] is checked the same way, over its whole read set (see `txn_check`): the
//! batch is a [`LatestView`] whose point and range reads see `pending` over RocksDB. If every
//! read still holds, the writes apply at one timestamp; otherwise nothing is written and the
//! result names the conflicting key.
//!
//! # Coalesced entries
//! A [`Command::Batch`] (several proposals a leader put in one entry, see `proposals`) applies
//! each member in order through the same [`ApplyBatch::apply`], with the entry's term: a
//! member sees every earlier member in `pending`, is fenced, checked and deduplicated on its
//! own, and its result is its own ([`CommandResult::batch`]). So a batch writes exactly what
//! its members would have written as consecutive entries (`tests/batch_apply.rs` checks it).
//! Only the batch's shape (size, members that are fenced data commands, no nesting) can
//! refuse it whole.
//!
//! # Invariants
//! - A command that fails [`Command::validate`] writes nothing and advances nothing but the
//!   applied index (the caller's part).
//! - A command whose request id is in the dedup table writes nothing and answers with the first
//!   application's commit timestamp. Only writes that happened are remembered: a CAS mismatch
//!   is not, so its retry is evaluated afresh (it had no effect, so that is one linearizable
//!   outcome).
//! - A storage read error is returned, never turned into a verdict: it is a fault of this node,
//!   not a property of the command, and a verdict from it could differ between replicas.

use crate::dedup::{DedupChanges, DedupTable};
use crate::locks::{LockTable, TxnId, TxnRecord};
use crate::txn_check::{first_conflict, EngineView, LatestView};
use crate::types::{Command, CommandResult, Expect, GcResult, MAX_COMMAND_TS};
use bytes::Bytes;
use meridian_storage::keys::Span;
use meridian_storage::{gc, keys, mvcc, Cf, Engine, WriteBatch};
use meridian_types::{ShardId, Timestamp};
use std::collections::HashMap;
use std::io;

/// The newest state of a key written earlier in this batch: `(version_ts, value)`, `None` for
/// a delete.
type KeyState = Option<(u64, Bytes)>;

/// One apply call's work in progress over a shard's replicated state.
pub(crate) struct ApplyBatch<'a> {
    pub shard: ShardId,
    /// The user keys the shard owns: a command naming any other is rejected (`span_check`).
    pub span: &'a Span,
    pub engine: &'a dyn Engine,
    pub version_floor: &'a mut u64,
    pub dedup: &'a mut DedupTable,
    pub batch: WriteBatch,
    pub changes: DedupChanges,
    /// The shard's prepared locks, changed in place (the caller holds the table's write guard
    /// until the batch is in RocksDB, so readers never see the two disagree).
    pub locks: &'a mut LockTable,
    pub(crate) pending: HashMap<Bytes, KeyState>,
    /// Transaction records written in this batch, over RocksDB's.
    pub(crate) records: HashMap<TxnId, TxnRecord>,
    /// The highest closed timestamp a [`Command::Closed`] of this batch carried (0: none);
    /// the caller folds it into the lock table with the batch's last index once the batch is
    /// in RocksDB, so a reader never sees it without the data it covers.
    pub closed: u64,
}

impl<'a> ApplyBatch<'a> {
    pub fn new(
        shard: ShardId,
        span: &'a Span,
        engine: &'a dyn Engine,
        version_floor: &'a mut u64,
        dedup: &'a mut DedupTable,
        locks: &'a mut LockTable,
    ) -> ApplyBatch<'a> {
        ApplyBatch {
            shard,
            span,
            engine,
            version_floor,
            dedup,
            batch: WriteBatch::new(),
            changes: DedupChanges::default(),
            locks,
            pending: HashMap::new(),
            records: HashMap::new(),
            closed: 0,
        }
    }

    /// Applies one command, from an entry of `entry_term`, to the batch; never panics on any
    /// command a peer can send.
    pub fn apply(&mut self, cmd: Command, entry_term: u64) -> io::Result<CommandResult> {
        if let Err(reason) = cmd.validate() {
            tracing::warn!(shard = %self.shard, %reason, "rejected a committed command at apply");
            return Ok(rejected(reason));
        }
        if let Some(reason) = crate::span_check::outside_span(&cmd, self.span) {
            tracing::warn!(shard = %self.shard, %reason, "rejected a committed command at apply");
            return Ok(rejected(reason));
        }
        let cmd = match cmd {
            Command::Fenced { term, cmd } if term == entry_term => *cmd,
            // The closed timestamp counts whatever the command does next (a mismatch, a
            // lock): the leader's promise is about the log, not about this write.
            Command::Closed {
                term,
                closed_ts,
                cmd,
            } if term == entry_term => {
                self.closed = self.closed.max(closed_ts);
                *cmd
            }
            Command::Fenced { .. } | Command::Closed { .. } => {
                return Ok(CommandResult {
                    fenced: true,
                    ..Default::default()
                })
            }
            other => other,
        };
        match cmd {
            // Unreachable after the unwrap above (validate refuses nesting); answered like
            // any other invalid command rather than trusted.
            Command::Fenced { .. } | Command::Closed { .. } => {
                Ok(rejected("nested fenced command".into()))
            }
            Command::Write {
                ts,
                puts,
                deletes,
                request,
            } => {
                if let Some(done) = request.and_then(|id| self.duplicate(id)) {
                    return Ok(done);
                }
                if let Some(locked) =
                    self.write_blocked(puts.iter().map(|(k, _)| k).chain(&deletes))
                {
                    return Ok(locked);
                }
                let ts = match self.next_ts(ts) {
                    Ok(ts) => ts,
                    Err(result) => return Ok(*result),
                };
                for (k, v) in puts {
                    self.put(k, ts, Some(v));
                }
                for k in deletes {
                    self.put(k, ts, None);
                }
                Ok(self.committed(request, ts))
            }
            Command::Cas {
                ts,
                key,
                expect,
                value,
                request,
            } => {
                if let Some(done) = request.and_then(|id| self.duplicate(id)) {
                    return Ok(done);
                }
                if let Some(locked) = self.write_blocked(std::iter::once(&key)) {
                    return Ok(locked);
                }
                let current = self.current(&key)?;
                if !holds(&expect, &current) {
                    return Ok(CommandResult {
                        mismatch: Some(current),
                        ..Default::default()
                    });
                }
                let ts = match self.next_ts(ts) {
                    Ok(ts) => ts,
                    Err(result) => return Ok(*result),
                };
                self.put(key, ts, value);
                Ok(self.committed(request, ts))
            }
            Command::Txn {
                ts,
                reads,
                ranges,
                writes,
                request,
            } => {
                if let Some(done) = request.and_then(|id| self.duplicate(id)) {
                    return Ok(done);
                }
                if let Some(locked) = self.txn_blocked(None, &reads, &ranges, &writes) {
                    return Ok(locked);
                }
                if let Some(key) = first_conflict(&*self, &reads, &ranges)? {
                    return Ok(CommandResult {
                        conflict: Some(key),
                        ..Default::default()
                    });
                }
                let ts = match self.next_ts(ts) {
                    Ok(ts) => ts,
                    Err(result) => return Ok(*result),
                };
                for (key, value) in writes {
                    self.put(key, ts, value);
                }
                Ok(self.committed(request, ts))
            }
            Command::Prepare {
                ts,
                txn,
                txn_ts,
                rank,
                anchor,
                is_anchor,
                reads,
                ranges,
                writes,
                participants,
            } => self.prepare(
                ts,
                (txn, txn_ts, rank),
                (anchor, is_anchor, participants),
                reads,
                ranges,
                writes,
            ),
            Command::Resolve {
                txn,
                txn_ts,
                anchor,
                decision,
                ..
            } => self.resolve((txn, txn_ts), anchor, decision),
            Command::Gc { threshold, from } => self.gc(threshold, from),
            Command::GcRecords { from } => self.gc_records(from),
            // Each member as if it had its own entry here (validate refuses a nested batch, so
            // this recursion is one level deep).
            Command::Batch { cmds } => {
                let mut batch = Vec::with_capacity(cmds.len());
                for member in cmds {
                    batch.push(self.apply(member, entry_term)?);
                }
                Ok(CommandResult {
                    batch,
                    ..Default::default()
                })
            }
        }
    }

    /// One page of garbage collection (see [`Command::Gc`]). The threshold rises in the lock
    /// table, whose write guard the caller holds until the batch is in RocksDB: a reader
    /// (holding the read guard) sees either the old threshold with the old versions or the
    /// new threshold, and refuses timestamps below it.
    fn gc(&mut self, threshold: u64, from: Option<(Bytes, u64)>) -> io::Result<CommandResult> {
        if threshold > self.locks.gc_threshold {
            self.locks.gc_threshold = threshold;
            self.batch.put(
                Cf::Data,
                keys::gc_threshold_key(self.shard),
                threshold.to_be_bytes().to_vec(),
            );
        }
        let threshold = self.locks.gc_threshold;
        let from = from.map(|(key, ts)| gc::GcCursor {
            key: key.to_vec(),
            ts: Timestamp(ts),
        });
        let page = gc::gc_page(
            self.engine,
            &mut self.batch,
            self.span,
            Timestamp(threshold),
            from.as_ref(),
            gc::GC_PAGE_ENTRIES,
        )
        .map_err(|e| io::Error::other(format!("shard {}: GC read: {e}", self.shard)))?;
        Ok(CommandResult {
            gc: Some(GcResult {
                threshold,
                resume: page.resume.map(|c| (Bytes::from(c.key), c.ts.0)),
                versions_deleted: page.versions_deleted,
                keys_deleted: page.keys_deleted,
                examined: page.examined,
            }),
            ..Default::default()
        })
    }

    fn duplicate(&self, id: crate::types::RequestId) -> Option<CommandResult> {
        self.dedup.get(&id).map(|commit_ts| CommandResult {
            commit_ts,
            duplicate: true,
            ..Default::default()
        })
    }

    /// The write's version timestamp (raising the floor), or the rejection if none is left.
    /// (Boxed: a rejection is rare and `CommandResult` is large.)
    pub(crate) fn next_ts(&mut self, proposed: u64) -> Result<u64, Box<CommandResult>> {
        let ts = proposed.max(self.version_floor.saturating_add(1));
        if ts > MAX_COMMAND_TS {
            return Err(Box::new(rejected(format!(
                "shard version floor {} leaves no timestamp below MAX_COMMAND_TS",
                self.version_floor
            ))));
        }
        *self.version_floor = ts;
        Ok(ts)
    }

    /// Writes a version of `key` (`None` = tombstone) and remembers it for later CASes.
    pub(crate) fn put(&mut self, key: Bytes, ts: u64, value: Option<Bytes>) {
        match &value {
            Some(v) => mvcc::put(&mut self.batch, self.shard, &key, Timestamp(ts), v),
            None => mvcc::delete(&mut self.batch, self.shard, &key, Timestamp(ts)),
        }
        self.pending.insert(key, value.map(|v| (ts, v)));
    }

    fn committed(&mut self, request: Option<crate::types::RequestId>, ts: u64) -> CommandResult {
        if let Some(id) = request {
            self.dedup.insert(id, ts, &mut self.changes);
        }
        CommandResult {
            commit_ts: ts,
            ..Default::default()
        }
    }

    /// `key`'s newest state: this batch's last write of it, else RocksDB's latest version.
    fn current(&self, key: &Bytes) -> io::Result<KeyState> {
        if let Some(state) = self.pending.get(key) {
            return Ok(state.clone());
        }
        let found = mvcc::get(self.engine, self.shard, key, Timestamp::MAX)
            .map_err(|e| io::Error::other(format!("shard {}: CAS read: {e}", self.shard)))?;
        Ok(found.map(|(ts, v)| (ts.0, Bytes::from(v))))
    }
}

impl LatestView for ApplyBatch<'_> {
    fn latest(&self, key: &Bytes) -> io::Result<Option<u64>> {
        Ok(self.current(key)?.map(|(ts, _)| ts))
    }

    fn live_rows(
        &self,
        start: &Bytes,
        end: Option<&Bytes>,
        want: usize,
    ) -> io::Result<Vec<(Bytes, u64)>> {
        let inside = |key: &Bytes| key >= start && end.is_none_or(|end| key < end);
        let overlay: std::collections::BTreeMap<&Bytes, &KeyState> =
            self.pending.iter().filter(|(k, _)| inside(k)).collect();
        let committed = EngineView {
            engine: self.engine,
            shard: self.shard,
        };
        // Every pending delete may hide one committed row: read that many more.
        let mut rows: std::collections::BTreeMap<Bytes, u64> = committed
            .live_rows(start, end, want + overlay.len())?
            .into_iter()
            .collect();
        for (key, state) in overlay {
            match state {
                Some((ts, _)) => rows.insert(key.clone(), *ts),
                None => rows.remove(key),
            };
        }
        Ok(rows.into_iter().take(want).collect())
    }
}

fn holds(expect: &Expect, current: &KeyState) -> bool {
    expect.holds(current.as_ref().map(|(ts, v)| (*ts, v.as_ref())))
}

pub(crate) fn rejected(reason: String) -> CommandResult {
    CommandResult {
        rejected: Some(reason),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{RangeCheck, ReadCheck, RequestId};
    use meridian_storage::MemoryEngine;

    const SHARD: ShardId = ShardId(3);
    static WHOLE: Span = Span {
        space: keys::Keyspace::User,
        start: Vec::new(),
        end: Vec::new(),
    };

    /// Data shards share one keyspace, so apply is what keeps a command inside its shard:
    /// a write, a CAS or a commit naming a key of another span is rejected and writes nothing
    /// (here, before any of its keys, even those inside).
    #[test]
    fn a_command_outside_the_shards_span_is_rejected_and_writes_nothing() {
        let engine = MemoryEngine::new();
        let span = Span {
            space: keys::Keyspace::User,
            start: b"m".to_vec(),
            end: b"n".to_vec(),
        };
        let (mut floor, mut dedup, mut locks) = (0u64, DedupTable::new(), LockTable::new());
        let mut work = ApplyBatch::new(SHARD, &span, &engine, &mut floor, &mut dedup, &mut locks);
        let both = Command::Write {
            ts: 10,
            puts: vec![(b("m1"), b("inside")), (b("z"), b("outside"))],
            deletes: vec![],
            request: None,
        };
        let results = [
            work.apply(both, 1).unwrap(),
            work.apply(cas(11, "a", Expect::Absent, Some("x")), 1)
                .unwrap(),
            work.apply(put(12, "m2", "ok"), 1).unwrap(),
        ];
        engine.write(work.batch, false).unwrap();
        assert!(
            results[0]
                .rejected
                .as_deref()
                .is_some_and(|r| r.contains("span")),
            "{results:?}"
        );
        assert!(results[1].rejected.is_some(), "{results:?}");
        assert!(results[2].rejected.is_none(), "{results:?}");
        assert_eq!(latest(&engine, "m1"), None);
        assert_eq!(latest(&engine, "z"), None);
        assert_eq!(latest(&engine, "a"), None);
        assert_eq!(latest(&engine, "m2"), Some((12, b"ok".to_vec())));
    }

    fn b(s: &str) -> Bytes {
        Bytes::copy_from_slice(s.as_bytes())
    }

    fn put(ts: u64, key: &str, value: &str) -> Command {
        Command::Write {
            ts,
            puts: vec![(b(key), b(value))],
            deletes: vec![],
            request: None,
        }
    }

    fn cas(ts: u64, key: &str, expect: Expect, value: Option<&str>) -> Command {
        Command::Cas {
            ts,
            key: b(key),
            expect,
            value: value.map(b),
            request: None,
        }
    }

    /// Applies each group of commands as one batch (one apply call), committing between
    /// groups, and returns every command's result.
    fn run(engine: &MemoryEngine, groups: Vec<Vec<Command>>) -> Vec<CommandResult> {
        let (mut floor, mut dedup, mut locks) = (0u64, DedupTable::new(), LockTable::new());
        let mut results = Vec::new();
        for group in groups {
            let mut work =
                ApplyBatch::new(SHARD, &WHOLE, engine, &mut floor, &mut dedup, &mut locks);
            for cmd in group {
                results.push(work.apply(cmd, 1).expect("apply"));
            }
            engine.write(work.batch, false).expect("write");
        }
        results
    }

    fn latest(engine: &MemoryEngine, key: &str) -> Option<(u64, Vec<u8>)> {
        mvcc::get(engine, SHARD, key.as_bytes(), Timestamp::MAX)
            .unwrap()
            .map(|(ts, v)| (ts.0, v))
    }

    #[test]
    fn a_fenced_command_applies_only_in_the_term_it_was_issued_in() {
        let engine = MemoryEngine::new();
        let fenced = |term, ts, value: &str| Command::Fenced {
            term,
            cmd: Box::new(put(ts, "k", value)),
        };
        // `run` applies every entry as term 1.
        let r = run(
            &engine,
            vec![vec![fenced(2, 10, "stale"), fenced(1, 11, "ok")]],
        );
        assert!(r[0].fenced && r[0].commit_ts == 0, "{:?}", r[0]);
        assert!(!r[1].fenced && r[1].commit_ts == 11, "{:?}", r[1]);
        assert_eq!(latest(&engine, "k"), Some((11, b"ok".to_vec())));
        // Nesting is refused by validation, whatever the terms.
        let nested = Command::Fenced {
            term: 1,
            cmd: Box::new(fenced(1, 12, "inner")),
        };
        let r = run(&engine, vec![vec![nested]]);
        assert!(r[0].rejected.is_some(), "{:?}", r[0]);
        assert_eq!(latest(&engine, "k"), Some((11, b"ok".to_vec())));
    }

    #[test]
    fn each_condition_holds_only_on_its_state() {
        assert!(Expect::Absent.holds(None));
        assert!(!Expect::Absent.holds(Some((1, b"x"))));
        assert!(Expect::Version(5).holds(Some((5, b"x"))));
        assert!(!Expect::Version(5).holds(Some((6, b"x"))));
        assert!(!Expect::Version(5).holds(None));
        assert!(Expect::Value(b("x")).holds(Some((9, b"x"))));
        assert!(!Expect::Value(b("x")).holds(Some((9, b"y"))));
        // An empty value is a value, not absence.
        assert!(!Expect::Value(b("")).holds(None));
        assert!(Expect::Value(b("")).holds(Some((1, b""))));
    }

    #[test]
    fn a_cas_sees_the_writes_committed_before_it() {
        let engine = MemoryEngine::new();
        let r = run(
            &engine,
            vec![
                vec![put(10, "k", "a")],
                vec![
                    cas(20, "k", Expect::Absent, Some("x")),
                    cas(21, "k", Expect::Value(b("a")), Some("b")),
                ],
            ],
        );
        assert_eq!(r[0].commit_ts, 10);
        assert_eq!(
            r[1].mismatch,
            Some(Some((10, b("a")))),
            "k exists: not absent"
        );
        assert_eq!(r[1].commit_ts, 0);
        assert_eq!((r[2].mismatch.clone(), r[2].commit_ts), (None, 21));
        assert_eq!(latest(&engine, "k"), Some((21, b"b".to_vec())));
    }

    #[test]
    fn a_cas_sees_earlier_writes_of_its_own_batch() {
        // The batch is not in RocksDB until the end: without the pending overlay the second
        // CAS would read "a" from the engine and swap, losing the first swap.
        let engine = MemoryEngine::new();
        let r = run(
            &engine,
            vec![
                vec![put(10, "k", "a")],
                vec![
                    cas(20, "k", Expect::Value(b("a")), Some("b")),
                    cas(21, "k", Expect::Value(b("a")), Some("c")),
                    cas(22, "k", Expect::Version(20), None),
                    cas(23, "k", Expect::Absent, Some("d")),
                ],
            ],
        );
        assert!(r[1].mismatch.is_none());
        assert_eq!(r[2].mismatch, Some(Some((20, b("b")))));
        assert!(
            r[3].mismatch.is_none(),
            "version 20 is the newest: the delete swaps"
        );
        assert!(r[4].mismatch.is_none(), "deleted in this batch: absent");
        assert_eq!(latest(&engine, "k"), Some((23, b"d".to_vec())));
    }

    #[test]
    fn a_retried_swap_is_not_applied_twice_but_a_retried_mismatch_is_evaluated_again() {
        let engine = MemoryEngine::new();
        let id = RequestId {
            client_id: 7,
            seq: 1,
        };
        let with_id = |ts, expect, value: &str| Command::Cas {
            ts,
            key: b("k"),
            expect,
            value: Some(b(value)),
            request: Some(id),
        };
        let (mut floor, mut dedup, mut locks) = (0u64, DedupTable::new(), LockTable::new());
        let mut work = ApplyBatch::new(SHARD, &WHOLE, &engine, &mut floor, &mut dedup, &mut locks);
        let first = work.apply(with_id(10, Expect::Absent, "a"), 1).unwrap();
        // Another client's write, then the retry of the first swap: answered from the table.
        work.apply(put(11, "k", "z"), 1).unwrap();
        let retry = work.apply(with_id(12, Expect::Absent, "a"), 1).unwrap();
        assert_eq!((first.commit_ts, first.duplicate), (10, false));
        assert_eq!((retry.commit_ts, retry.duplicate), (10, true));
        assert!(retry.mismatch.is_none());
        engine.write(work.batch, false).unwrap();
        assert_eq!(latest(&engine, "k"), Some((11, b"z".to_vec())));

        // A mismatch is not remembered: the same id is evaluated again later.
        let other = RequestId {
            client_id: 7,
            seq: 2,
        };
        let mut work = ApplyBatch::new(SHARD, &WHOLE, &engine, &mut floor, &mut dedup, &mut locks);
        let cmd = |ts| Command::Cas {
            ts,
            key: b("k"),
            expect: Expect::Value(b("y")),
            value: Some(b("w")),
            request: Some(other),
        };
        let miss = work.apply(cmd(20), 1).unwrap();
        assert_eq!(miss.mismatch, Some(Some((11, b("z")))));
        work.apply(put(21, "k", "y"), 1).unwrap();
        let hit = work.apply(cmd(22), 1).unwrap();
        assert_eq!(
            (hit.commit_ts, hit.duplicate, hit.mismatch),
            (22, false, None)
        );
    }

    #[test]
    fn a_bad_cas_is_rejected_without_writing() {
        let engine = MemoryEngine::new();
        let r = run(
            &engine,
            vec![vec![
                cas(MAX_COMMAND_TS + 1, "k", Expect::Absent, Some("v")),
                cas(1, "", Expect::Absent, Some("v")),
            ]],
        );
        assert!(r.iter().all(|r| r.rejected.is_some()), "{r:?}");
        assert!(latest(&engine, "k").is_none());
    }

    fn txn(
        ts: u64,
        reads: Vec<(&str, Option<u64>)>,
        ranges: Vec<RangeCheck>,
        writes: Vec<(&str, Option<&str>)>,
    ) -> Command {
        Command::Txn {
            ts,
            reads: reads
                .into_iter()
                .map(|(k, version)| ReadCheck { key: b(k), version })
                .collect(),
            ranges,
            writes: writes.into_iter().map(|(k, v)| (b(k), v.map(b))).collect(),
            request: None,
        }
    }

    fn range(start: &str, end: Option<&str>, rows: Vec<(&str, u64)>) -> RangeCheck {
        RangeCheck {
            start: b(start),
            end: end.map(b),
            rows: rows.into_iter().map(|(k, ts)| (b(k), ts)).collect(),
        }
    }

    #[test]
    fn a_txn_commits_only_while_its_reads_hold() {
        let engine = MemoryEngine::new();
        let r = run(
            &engine,
            vec![
                vec![put(10, "a", "1"), put(11, "b", "2")],
                vec![
                    // Read a@10 and b@11 (and c absent): all hold, so both writes apply.
                    txn(
                        20,
                        vec![("a", Some(10)), ("b", Some(11)), ("c", None)],
                        vec![],
                        vec![("a", Some("0")), ("b", None)],
                    ),
                    // Read a@10 too, but a is now at 20 (same batch): conflict, nothing written.
                    txn(21, vec![("a", Some(10))], vec![], vec![("z", Some("x"))]),
                    // b was deleted by the first: reading it as absent holds.
                    txn(22, vec![("b", None)], vec![], vec![("c", Some("3"))]),
                ],
            ],
        );
        assert_eq!((r[2].commit_ts, r[2].conflict.clone()), (20, None));
        assert_eq!(r[3].conflict, Some(b("a")));
        assert_eq!(r[3].commit_ts, 0);
        assert_eq!((r[4].commit_ts, r[4].conflict.clone()), (22, None));
        assert_eq!(latest(&engine, "a"), Some((20, b"0".to_vec())));
        assert_eq!(latest(&engine, "b"), None);
        assert_eq!(
            latest(&engine, "z"),
            None,
            "the conflicting txn wrote nothing"
        );
        assert_eq!(latest(&engine, "c"), Some((22, b"3".to_vec())));
    }

    #[test]
    fn a_txn_that_read_an_absent_key_conflicts_with_its_creation() {
        let engine = MemoryEngine::new();
        let r = run(
            &engine,
            vec![
                vec![put(10, "k", "v")],
                vec![txn(
                    20,
                    vec![("k", None)],
                    vec![],
                    vec![("other", Some("x"))],
                )],
            ],
        );
        assert_eq!(r[1].conflict, Some(b("k")));
    }

    #[test]
    fn a_scanned_range_conflicts_with_phantoms_removals_and_changes() {
        let engine = MemoryEngine::new();
        run(
            &engine,
            vec![vec![
                put(10, "r/1", "a"),
                put(11, "r/3", "b"),
                put(12, "s", "out"),
            ]],
        );
        let seen = || range("r/", Some("r0"), vec![("r/1", 10), ("r/3", 11)]);
        let scan_then = |cmds: Vec<Command>| {
            let engine = MemoryEngine::new();
            run(
                &engine,
                vec![vec![
                    put(10, "r/1", "a"),
                    put(11, "r/3", "b"),
                    put(12, "s", "out"),
                ]],
            );
            let mut groups = vec![cmds];
            groups.push(vec![txn(30, vec![], vec![seen()], vec![("w", Some("x"))])]);
            run(&engine, groups).last().unwrap().conflict.clone()
        };
        // Unchanged range (a write outside it does not matter): commits.
        assert_eq!(scan_then(vec![put(20, "s", "moved")]), None);
        // A phantom inside the range, before, between or after the rows read.
        for key in ["r/0", "r/2", "r/9"] {
            assert_eq!(scan_then(vec![put(20, key, "new")]), Some(b("r/")), "{key}");
        }
        // A removed row and a changed row.
        assert_eq!(
            scan_then(vec![Command::Write {
                ts: 20,
                puts: vec![],
                deletes: vec![b("r/1")],
                request: None
            }]),
            Some(b("r/"))
        );
        assert_eq!(scan_then(vec![put(20, "r/3", "c")]), Some(b("r/")));
        // Writes earlier in the commit's own batch count too (the pending overlay).
        let r = run(
            &engine,
            vec![vec![
                put(20, "r/2", "new"),
                txn(21, vec![], vec![seen()], vec![("w", Some("x"))]),
            ]],
        );
        assert_eq!(r[1].conflict, Some(b("r/")));
        let r = run(
            &engine,
            vec![vec![
                Command::Write {
                    ts: 30,
                    puts: vec![],
                    deletes: vec![b("r/2")],
                    request: None,
                },
                txn(31, vec![], vec![seen()], vec![("w", Some("x"))]),
            ]],
        );
        assert_eq!(
            r[1].conflict, None,
            "the phantom was deleted again in the batch"
        );
    }

    #[test]
    fn a_retried_txn_commit_is_answered_from_the_dedup_table() {
        let engine = MemoryEngine::new();
        let id = RequestId {
            client_id: 5,
            seq: 9,
        };
        let with_id = |ts| Command::Txn {
            ts,
            reads: vec![ReadCheck {
                key: b("n"),
                version: None,
            }],
            ranges: vec![],
            writes: vec![(b("n"), Some(b("1")))],
            request: Some(id),
        };
        let r = run(&engine, vec![vec![with_id(10)], vec![with_id(20)]]);
        assert_eq!((r[0].commit_ts, r[0].duplicate), (10, false));
        // Without the table the retry would conflict (n now exists) and report a failure for
        // a commit that happened.
        assert_eq!(
            (r[1].commit_ts, r[1].duplicate, r[1].conflict.clone()),
            (10, true, None)
        );
    }

    #[test]
    fn a_txn_without_writes_or_over_its_limits_is_rejected() {
        let engine = MemoryEngine::new();
        let r = run(
            &engine,
            vec![vec![
                txn(10, vec![("a", None)], vec![], vec![]),
                txn(
                    10,
                    vec![],
                    vec![range("b", Some("a"), vec![])],
                    vec![("w", Some("x"))],
                ),
                txn(
                    10,
                    vec![],
                    vec![range("a", Some("b"), vec![("c", 1)])],
                    vec![("w", Some("x"))],
                ),
            ]],
        );
        assert!(r.iter().all(|r| r.rejected.is_some()), "{r:?}");
        assert!(latest(&engine, "w").is_none());
    }
}
