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
//! its members would have written as consecutive entries (`tests/raft/batch_apply.rs` checks it).
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
#[path = "apply_tests.rs"]
mod tests;
