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
use crate::types::{Command, CommandResult, Expect, MAX_COMMAND_TS};
use bytes::Bytes;
use meridian_storage::{mvcc, Engine, WriteBatch};
use meridian_types::{ShardId, Timestamp};
use std::collections::HashMap;
use std::io;

/// The newest state of a key written earlier in this batch: `(version_ts, value)`, `None` for
/// a delete.
type KeyState = Option<(u64, Bytes)>;

/// One apply call's work in progress over a shard's replicated state.
pub(crate) struct ApplyBatch<'a> {
    pub shard: ShardId,
    pub engine: &'a dyn Engine,
    pub version_floor: &'a mut u64,
    pub dedup: &'a mut DedupTable,
    pub batch: WriteBatch,
    pub changes: DedupChanges,
    pending: HashMap<Bytes, KeyState>,
}

impl<'a> ApplyBatch<'a> {
    pub fn new(
        shard: ShardId,
        engine: &'a dyn Engine,
        version_floor: &'a mut u64,
        dedup: &'a mut DedupTable,
    ) -> ApplyBatch<'a> {
        ApplyBatch {
            shard,
            engine,
            version_floor,
            dedup,
            batch: WriteBatch::new(),
            changes: DedupChanges::default(),
            pending: HashMap::new(),
        }
    }

    /// Applies one command to the batch; never panics on any command a peer can send.
    pub fn apply(&mut self, cmd: Command) -> io::Result<CommandResult> {
        if let Err(reason) = cmd.validate() {
            tracing::warn!(shard = %self.shard, %reason, "rejected a committed command at apply");
            return Ok(rejected(reason));
        }
        match cmd {
            Command::Write {
                ts,
                puts,
                deletes,
                request,
            } => {
                if let Some(done) = request.and_then(|id| self.duplicate(id)) {
                    return Ok(done);
                }
                let ts = match self.next_ts(ts) {
                    Ok(ts) => ts,
                    Err(result) => return Ok(result),
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
                let current = self.current(&key)?;
                if !holds(&expect, &current) {
                    return Ok(CommandResult {
                        mismatch: Some(current),
                        ..Default::default()
                    });
                }
                let ts = match self.next_ts(ts) {
                    Ok(ts) => ts,
                    Err(result) => return Ok(result),
                };
                self.put(key, ts, value);
                Ok(self.committed(request, ts))
            }
        }
    }

    fn duplicate(&self, id: crate::types::RequestId) -> Option<CommandResult> {
        self.dedup.get(&id).map(|commit_ts| CommandResult {
            commit_ts,
            duplicate: true,
            ..Default::default()
        })
    }

    /// The write's version timestamp (raising the floor), or the rejection if none is left.
    fn next_ts(&mut self, proposed: u64) -> Result<u64, CommandResult> {
        let ts = proposed.max(self.version_floor.saturating_add(1));
        if ts > MAX_COMMAND_TS {
            return Err(rejected(format!(
                "shard version floor {} leaves no timestamp below MAX_COMMAND_TS",
                self.version_floor
            )));
        }
        *self.version_floor = ts;
        Ok(ts)
    }

    /// Writes a version of `key` (`None` = tombstone) and remembers it for later CASes.
    fn put(&mut self, key: Bytes, ts: u64, value: Option<Bytes>) {
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

fn holds(expect: &Expect, current: &KeyState) -> bool {
    expect.holds(current.as_ref().map(|(ts, v)| (*ts, v.as_ref())))
}

fn rejected(reason: String) -> CommandResult {
    CommandResult {
        rejected: Some(reason),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::RequestId;
    use meridian_storage::MemoryEngine;

    const SHARD: ShardId = ShardId(3);

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
        let (mut floor, mut dedup) = (0u64, DedupTable::new());
        let mut results = Vec::new();
        for group in groups {
            let mut work = ApplyBatch::new(SHARD, engine, &mut floor, &mut dedup);
            for cmd in group {
                results.push(work.apply(cmd).expect("apply"));
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
        let (mut floor, mut dedup) = (0u64, DedupTable::new());
        let mut work = ApplyBatch::new(SHARD, &engine, &mut floor, &mut dedup);
        let first = work.apply(with_id(10, Expect::Absent, "a")).unwrap();
        // Another client's write, then the retry of the first swap: answered from the table.
        work.apply(put(11, "k", "z")).unwrap();
        let retry = work.apply(with_id(12, Expect::Absent, "a")).unwrap();
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
        let mut work = ApplyBatch::new(SHARD, &engine, &mut floor, &mut dedup);
        let cmd = |ts| Command::Cas {
            ts,
            key: b("k"),
            expect: Expect::Value(b("y")),
            value: Some(b("w")),
            request: Some(other),
        };
        let miss = work.apply(cmd(20)).unwrap();
        assert_eq!(miss.mismatch, Some(Some((11, b("z")))));
        work.apply(put(21, "k", "y")).unwrap();
        let hit = work.apply(cmd(22)).unwrap();
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
}
