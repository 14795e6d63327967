//! Apply's part of multi-shard transactions: prepare, decide, prevent and resolve (see `locks`
//! for the protocol), and the lock checks every other write goes through.
//!
//! # Timestamps
//! A prepare takes the next version timestamp of the shard (`max(proposed, floor + 1)`, as a
//! write does), so it is above every version the shard holds. A commit writes the intents at
//! exactly the decided timestamp `C` (the same on every participant, so a snapshot read sees
//! all of the transaction or none of it) and raises the floor to `C`. That keeps each key's
//! versions increasing: the locked keys got no version since the prepare, and `C` is at least
//! the prepare timestamp. Locks whose prepare timestamp is above `C` cannot belong to the
//! decision (the coordinator took `C` as the largest prepare timestamp it was answered): they
//! come from a prepare that arrived after its transaction was decided, and are dropped.

use crate::apply::{rejected, ApplyBatch};
use crate::locks::{Decision, LockInfo, TxnId, TxnLocks, TxnStatus, MAX_PREPARED_TXNS_PER_SHARD};
use crate::txn_check::first_conflict;
use crate::types::{codec, CommandResult, RangeCheck, ReadCheck};
use bytes::Bytes;
use meridian_storage::keys::{self, TxnKeyKind};
use meridian_storage::Cf;
use std::io;

fn locked(lock: LockInfo) -> CommandResult {
    CommandResult {
        locked: Some(lock),
        ..Default::default()
    }
}

fn status(status: Option<TxnStatus>) -> CommandResult {
    CommandResult {
        commit_ts: match status {
            Some(TxnStatus::Committed(c)) => c,
            _ => 0,
        },
        status,
        ..Default::default()
    }
}

impl ApplyBatch<'_> {
    /// The result for a write of `keys` that meets a lock, if one does.
    pub(crate) fn write_blocked<'k>(
        &self,
        mut keys: impl Iterator<Item = &'k Bytes>,
    ) -> Option<CommandResult> {
        if self.locks.is_empty() {
            return None;
        }
        keys.find_map(|k| self.locks.blocks_write(k, None))
            .map(locked)
    }

    /// The result for a transaction (`me`, if prepared under an id) whose reads, ranges or
    /// writes meet another transaction's lock, if one does.
    pub(crate) fn txn_blocked(
        &self,
        me: Option<&TxnId>,
        reads: &[ReadCheck],
        ranges: &[RangeCheck],
        writes: &[(Bytes, Option<Bytes>)],
    ) -> Option<CommandResult> {
        if self.locks.is_empty() {
            return None;
        }
        let lock = writes
            .iter()
            .find_map(|(k, _)| self.locks.blocks_write(k, me))
            .or_else(|| {
                reads
                    .iter()
                    .find_map(|r| self.locks.write_intent(&r.key, me, u64::MAX))
            })
            .or_else(|| {
                ranges.iter().find_map(|r| {
                    self.locks
                        .write_intent_in(&r.start, r.end.as_deref(), me, u64::MAX)
                })
            });
        lock.map(locked)
    }

    pub(crate) fn prepare(
        &mut self,
        ts: u64,
        txn: TxnId,
        (anchor, is_anchor, participants): (Bytes, bool, Vec<Bytes>),
        reads: Vec<ReadCheck>,
        ranges: Vec<RangeCheck>,
        writes: Vec<(Bytes, Option<Bytes>)>,
    ) -> io::Result<CommandResult> {
        if let Some(existing) = self.locks.get(&txn) {
            // A retried prepare: the first one's answer.
            return Ok(CommandResult {
                commit_ts: existing.prepare_ts,
                ..Default::default()
            });
        }
        if let Some(decided) = self.record(&txn)? {
            // On the anchor: aborted by a recovery before this prepare arrived, or decided
            // already. Elsewhere: prevented by a recovery. Lock nothing.
            return Ok(status(Some(decided)));
        }
        if let Some(blocked) = self.txn_blocked(Some(&txn), &reads, &ranges, &writes) {
            return Ok(blocked);
        }
        let first_key = || {
            writes
                .first()
                .map(|w| w.0.clone())
                .or_else(|| reads.first().map(|r| r.key.clone()))
                .or_else(|| ranges.first().map(|r| r.start.clone()))
                .unwrap_or_default()
        };
        if self.locks.len() >= MAX_PREPARED_TXNS_PER_SHARD {
            return Ok(CommandResult {
                conflict: Some(first_key()),
                ..Default::default()
            });
        }
        if let Some(key) = first_conflict(&*self, &reads, &ranges)? {
            return Ok(CommandResult {
                conflict: Some(key),
                ..Default::default()
            });
        }
        let prepare_ts = match self.next_ts(ts) {
            Ok(ts) => ts,
            Err(result) => return Ok(*result),
        };
        let written: std::collections::HashSet<&Bytes> = writes.iter().map(|w| &w.0).collect();
        let locks = TxnLocks {
            anchor,
            prepare_ts,
            reads: reads
                .iter()
                .map(|r| r.key.clone())
                .filter(|k| !written.contains(k))
                .collect(),
            ranges: ranges.into_iter().map(|r| (r.start, r.end)).collect(),
            writes,
            participants: if is_anchor { participants } else { Vec::new() },
        };
        self.batch.put(
            Cf::Data,
            keys::txn_key(self.shard, TxnKeyKind::Locks, txn.client_id, txn.seq),
            codec::encode(&locks)?,
        );
        self.locks.insert(txn, locks);
        if is_anchor {
            self.put_record(txn, TxnStatus::Staging)?;
        }
        Ok(CommandResult {
            commit_ts: prepare_ts,
            ..Default::default()
        })
    }

    pub(crate) fn resolve(
        &mut self,
        txn: TxnId,
        anchor: bool,
        decision: Decision,
    ) -> io::Result<CommandResult> {
        if !anchor {
            if self.record(&txn)? == Some(TxnStatus::Staging) {
                // The anchor's own shard, undecided: resolving its locks here would leave a
                // staging record whose participants nobody can find (see `locks`).
                return Ok(rejected(
                    "the transaction is staging here: decide it at the anchor first".into(),
                ));
            }
            return Ok(match decision {
                Decision::Commit(c) => {
                    self.resolve_locks(&txn, Some(c))?;
                    self.mark(txn, TxnStatus::Committed(c))?;
                    CommandResult {
                        commit_ts: c,
                        ..Default::default()
                    }
                }
                Decision::Abort => {
                    self.resolve_locks(&txn, None)?;
                    self.mark(txn, TxnStatus::Aborted)?;
                    CommandResult::default()
                }
                Decision::Prevent => self.prevent(txn)?,
                Decision::AbortStaging => rejected("only an anchor aborts a record".into()),
            });
        }
        let record = self.record(&txn)?;
        let after = match (decision, record) {
            (Decision::Prevent, _) => {
                return Ok(rejected("the anchor is never prevented".into()));
            }
            // Decided already: the decision stands, whatever is asked now.
            (_, Some(done @ (TxnStatus::Committed(_) | TxnStatus::Aborted))) => Some(done),
            (Decision::Commit(c), Some(TxnStatus::Staging)) => {
                let prepared = self.locks.get(&txn).map_or(0, |l| l.prepare_ts);
                if c < prepared {
                    return Ok(rejected(format!(
                        "commit timestamp {c} is below the anchor's prepare timestamp {prepared}"
                    )));
                }
                self.put_record(txn, TxnStatus::Committed(c))?;
                self.resolve_locks(&txn, Some(c))?;
                Some(TxnStatus::Committed(c))
            }
            // Never prepared here: nothing to commit.
            (Decision::Commit(_), None) => None,
            (Decision::Abort, Some(TxnStatus::Staging)) => {
                // Maybe implicitly committed: the recovery must check the participants.
                let locks = self.locks.get(&txn);
                return Ok(CommandResult {
                    status: Some(TxnStatus::Staging),
                    commit_ts: locks.map_or(0, |l| l.prepare_ts),
                    participants: locks.map(|l| l.participants.clone()).unwrap_or_default(),
                    ..Default::default()
                });
            }
            (Decision::Abort | Decision::AbortStaging, Some(TxnStatus::Staging) | None) => {
                self.put_record(txn, TxnStatus::Aborted)?;
                self.resolve_locks(&txn, None)?;
                Some(TxnStatus::Aborted)
            }
        };
        Ok(status(after))
    }

    /// [`Decision::Prevent`] on a participant other than the anchor: reports the prepare if
    /// the transaction holds locks here, else makes sure it never will.
    fn prevent(&mut self, txn: TxnId) -> io::Result<CommandResult> {
        if let Some(locks) = self.locks.get(&txn) {
            return Ok(CommandResult {
                status: Some(TxnStatus::Staging),
                commit_ts: locks.prepare_ts,
                ..Default::default()
            });
        }
        Ok(status(Some(self.mark(txn, TxnStatus::Aborted)?)))
    }

    /// Leaves `outcome` as `txn`'s marker on this participant unless it has a record already
    /// (on the anchor's shard, the record itself), so that a prepare delivered late answers it
    /// and locks nothing (see `locks`); returns the record that stands.
    fn mark(&mut self, txn: TxnId, outcome: TxnStatus) -> io::Result<TxnStatus> {
        if let Some(existing) = self.record(&txn)? {
            return Ok(existing);
        }
        self.put_record(txn, outcome)?;
        Ok(outcome)
    }

    /// Drops `txn`'s locks; on a commit at `c`, its intents become versions at exactly `c`.
    fn resolve_locks(&mut self, txn: &TxnId, commit: Option<u64>) -> io::Result<()> {
        let Some(locks) = self.locks.remove(txn) else {
            return Ok(());
        };
        self.batch.delete(
            Cf::Data,
            keys::txn_key(self.shard, TxnKeyKind::Locks, txn.client_id, txn.seq),
        );
        let Some(c) = commit.filter(|c| *c >= locks.prepare_ts) else {
            if commit.is_some() {
                tracing::warn!(shard = %self.shard, ?txn, prepare_ts = locks.prepare_ts, "dropped locks prepared after their transaction was decided");
            }
            return Ok(());
        };
        *self.version_floor = (*self.version_floor).max(c);
        // Under the table's write guard, like the data (see `resolutions`).
        self.locks.resolutions.record(locks.prepare_ts, c);
        for (key, value) in locks.writes {
            self.put(key, c, value);
        }
        Ok(())
    }

    /// `txn`'s record on this shard, as of this command.
    pub(crate) fn record(&self, txn: &TxnId) -> io::Result<Option<TxnStatus>> {
        if let Some(written) = self.records.get(txn) {
            return Ok(Some(*written));
        }
        let key = keys::txn_key(self.shard, TxnKeyKind::Record, txn.client_id, txn.seq);
        match self
            .engine
            .get(Cf::Data, &key)
            .map_err(|e| io::Error::other(format!("shard {}: txn record: {e}", self.shard)))?
        {
            Some(raw) => Ok(Some(codec::decode(&raw)?)),
            None => Ok(None),
        }
    }

    fn put_record(&mut self, txn: TxnId, record: TxnStatus) -> io::Result<()> {
        let key = keys::txn_key(self.shard, TxnKeyKind::Record, txn.client_id, txn.seq);
        self.batch.put(Cf::Data, key, codec::encode(&record)?);
        self.records.insert(txn, record);
        Ok(())
    }
}

#[cfg(test)]
#[path = "apply_2pc_tests.rs"]
mod tests;
