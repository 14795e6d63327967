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
use crate::locks::{
    Decision, LockInfo, TxnId, TxnLocks, TxnRecord, TxnStatus, MAX_PREPARED_TXNS_PER_SHARD,
};
use crate::txn_check::first_conflict;
use crate::types::{codec, CommandResult, GcRecordsResult, RangeCheck, ReadCheck, StuckRecord};
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
        (txn, txn_ts, rank): (TxnId, u64, meridian_types::TxnRank),
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
            return Ok(status(Some(decided.status)));
        }
        if txn_ts < self.locks.gc_threshold {
            // Its record or marker here may have been collected: it must never lock again.
            // Answered like a prevented prepare (the coordinator settles the transaction).
            tracing::debug!(shard = %self.shard, ?txn, txn_ts, threshold = self.locks.gc_threshold, "refused a prepare below the GC threshold");
            return Ok(status(Some(TxnStatus::Aborted)));
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
            txn_ts,
            rank,
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
        if is_anchor {
            self.put_record(
                txn,
                TxnRecord {
                    status: TxnStatus::Staging,
                    txn_ts,
                    finished: false,
                    participants: locks.participants.clone(),
                },
            )?;
        }
        self.locks.insert(txn, locks);
        Ok(CommandResult {
            commit_ts: prepare_ts,
            ..Default::default()
        })
    }

    pub(crate) fn resolve(
        &mut self,
        (txn, txn_ts): (TxnId, u64),
        anchor: bool,
        decision: Decision,
    ) -> io::Result<CommandResult> {
        let record = self.record(&txn)?;
        if !anchor {
            if record
                .as_ref()
                .is_some_and(|r| r.status == TxnStatus::Staging)
            {
                // The anchor's own shard, undecided: resolving its locks here would leave a
                // staging record whose participants nobody can find (see `locks`).
                return Ok(rejected(
                    "the transaction is staging here: decide it at the anchor first".into(),
                ));
            }
            return Ok(match decision {
                Decision::Commit(c) => {
                    self.resolve_locks(&txn, Some(c))?;
                    self.mark((txn, txn_ts), TxnStatus::Committed(c))?;
                    CommandResult {
                        commit_ts: c,
                        ..Default::default()
                    }
                }
                Decision::Abort => {
                    self.resolve_locks(&txn, None)?;
                    self.mark((txn, txn_ts), TxnStatus::Aborted)?;
                    CommandResult::default()
                }
                Decision::Prevent => self.prevent((txn, txn_ts))?,
                Decision::AbortStaging | Decision::Finish => {
                    rejected(format!("only an anchor is sent {decision:?}"))
                }
            });
        }
        let Some(record) = record else {
            if txn_ts < self.locks.gc_threshold {
                // No prepare of it can apply here any more (see `prepare`): there is nothing
                // to decide, and a record written now would only wait to be collected.
                return Ok(status(Some(TxnStatus::Forgotten)));
            }
            return Ok(match decision {
                Decision::Abort | Decision::AbortStaging => {
                    // A tombstone, so that a prepare delivered later fails.
                    self.put_record(txn, decided(txn_ts, TxnStatus::Aborted, Vec::new()))?;
                    status(Some(TxnStatus::Aborted))
                }
                // Never prepared here: nothing to commit or finish.
                Decision::Commit(_) | Decision::Finish => status(None),
                Decision::Prevent => rejected("the anchor is never prevented".into()),
            });
        };
        let after = match (decision, record.status) {
            (Decision::Prevent, _) => {
                return Ok(rejected("the anchor is never prevented".into()));
            }
            (Decision::Finish, TxnStatus::Committed(_)) => {
                if !record.finished {
                    self.put_record(
                        txn,
                        TxnRecord {
                            finished: true,
                            ..record.clone()
                        },
                    )?;
                }
                record.status
            }
            (Decision::Finish, TxnStatus::Staging) => {
                return Ok(rejected(
                    "a staging transaction cannot be finished: commit it first".into(),
                ));
            }
            // Decided already: the decision stands, whatever is asked now.
            (_, done @ (TxnStatus::Committed(_) | TxnStatus::Aborted | TxnStatus::Forgotten)) => {
                if matches!(done, TxnStatus::Committed(_)) && !record.finished {
                    // Committed but not finished: whoever asks may have to resolve the
                    // participants (see `txn_recover`).
                    return Ok(CommandResult {
                        participants: record.participants,
                        ..status(Some(done))
                    });
                }
                done
            }
            (Decision::Commit(c), TxnStatus::Staging) => {
                let prepared = self.locks.get(&txn).map_or(0, |l| l.prepare_ts);
                if c < prepared {
                    return Ok(rejected(format!(
                        "commit timestamp {c} is below the anchor's prepare timestamp {prepared}"
                    )));
                }
                let committed = TxnStatus::Committed(c);
                self.put_record(txn, decided(record.txn_ts, committed, record.participants))?;
                self.resolve_locks(&txn, Some(c))?;
                committed
            }
            (Decision::Abort, TxnStatus::Staging) => {
                // Maybe implicitly committed: the recovery must check the participants.
                let locks = self.locks.get(&txn);
                return Ok(CommandResult {
                    status: Some(TxnStatus::Staging),
                    commit_ts: locks.map_or(0, |l| l.prepare_ts),
                    participants: record.participants,
                    ..Default::default()
                });
            }
            (Decision::AbortStaging, TxnStatus::Staging) => {
                self.put_record(txn, decided(record.txn_ts, TxnStatus::Aborted, Vec::new()))?;
                self.resolve_locks(&txn, None)?;
                TxnStatus::Aborted
            }
        };
        Ok(status(Some(after)))
    }

    /// [`Decision::Prevent`] on a participant other than the anchor: reports the prepare if
    /// the transaction holds locks here, else makes sure it never will.
    fn prevent(&mut self, (txn, txn_ts): (TxnId, u64)) -> io::Result<CommandResult> {
        if let Some(locks) = self.locks.get(&txn) {
            return Ok(CommandResult {
                status: Some(TxnStatus::Staging),
                commit_ts: locks.prepare_ts,
                ..Default::default()
            });
        }
        Ok(status(Some(self.mark((txn, txn_ts), TxnStatus::Aborted)?)))
    }

    /// Leaves `outcome` as `txn`'s marker on this participant unless it has a record already
    /// (on the anchor's shard, the record itself), so that a prepare delivered late answers it
    /// and locks nothing (see `locks`); returns the outcome that stands. Below the GC
    /// threshold no prepare of `txn` can apply here, so no marker is needed.
    fn mark(&mut self, (txn, txn_ts): (TxnId, u64), outcome: TxnStatus) -> io::Result<TxnStatus> {
        if let Some(existing) = self.record(&txn)? {
            return Ok(existing.status);
        }
        if txn_ts >= self.locks.gc_threshold {
            self.put_record(txn, decided(txn_ts, outcome, Vec::new()))?;
        }
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

    /// `txn`'s record (or marker) on this shard, as of this command.
    pub(crate) fn record(&self, txn: &TxnId) -> io::Result<Option<TxnRecord>> {
        if let Some(written) = self.records.get(txn) {
            return Ok(Some(written.clone()));
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

    fn put_record(&mut self, txn: TxnId, record: TxnRecord) -> io::Result<()> {
        let key = keys::txn_key(self.shard, TxnKeyKind::Record, txn.client_id, txn.seq);
        self.batch.put(Cf::Data, key, codec::encode(&record)?);
        self.records.insert(txn, record);
        Ok(())
    }

    /// One page of [`crate::Command::GcRecords`] (see [`records_page`]) at the shard's GC
    /// threshold. Runs at the start of a batch of its own (see `state_machine`), so the engine
    /// holds every earlier entry's records.
    pub(crate) fn gc_records(&mut self, from: Option<TxnId>) -> io::Result<CommandResult> {
        let threshold = self.locks.gc_threshold;
        let page = records_page(self.engine, self.shard, threshold, from, &mut self.batch)?;
        Ok(CommandResult {
            gc_records: Some(page),
            ..Default::default()
        })
    }
}

/// One page of the transaction-record GC: adds to `batch` the deletes of the finished records
/// and markers of transactions that started below `threshold`, from after `from`, and reports
/// the committed records still unfinished there (for the sweeper). Reads `engine` only: the
/// leader's survey (`gc_survey`) runs it with a batch it drops.
pub(crate) fn records_page(
    engine: &dyn meridian_storage::Engine,
    shard: meridian_types::ShardId,
    threshold: u64,
    from: Option<TxnId>,
    batch: &mut meridian_storage::WriteBatch,
) -> io::Result<GcRecordsResult> {
    let (start, end) = keys::txn_kind_range(shard, TxnKeyKind::Record);
    let start = match from {
        // The key right after `from`'s.
        Some(id) => {
            let mut k = keys::txn_key(shard, TxnKeyKind::Record, id.client_id, id.seq);
            k.push(0);
            k
        }
        None => start,
    };
    let mut page = GcRecordsResult::default();
    let mut last = None;
    for item in engine.scan(Cf::Data, &start, Some(&end), false) {
        let (key, raw) =
            item.map_err(|e| io::Error::other(format!("shard {shard}: txn records: {e}")))?;
        if page.examined >= RECORDS_PER_GC_PAGE {
            page.resume = last;
            break;
        }
        page.examined += 1;
        let (_, client_id, seq) = keys::decode_txn_key(&key).map_err(io::Error::other)?;
        last = Some(TxnId { client_id, seq });
        let record: TxnRecord = codec::decode(&raw)?;
        if record.txn_ts >= threshold {
            continue;
        }
        if record.finished {
            batch.delete(Cf::Data, key.to_vec());
            page.deleted += 1;
        } else if let TxnStatus::Committed(commit_ts) = record.status {
            if page.stuck.len() < STUCK_PER_GC_PAGE {
                page.stuck.push(StuckRecord {
                    txn: TxnId { client_id, seq },
                    txn_ts: record.txn_ts,
                    commit_ts,
                });
            }
        }
    }
    Ok(page)
}

/// Most records and markers one [`crate::Command::GcRecords`] page examines.
pub const RECORDS_PER_GC_PAGE: u64 = 4_096;
/// Most stuck records one page reports ([`crate::types::GcRecordsResult::stuck`]); a later
/// pass reports the rest.
pub const STUCK_PER_GC_PAGE: usize = 16;

/// A decided record or marker: finished unless it is a committed anchor record (`participants`
/// non-empty), which [`Decision::Finish`] finishes once they are resolved.
fn decided(txn_ts: u64, status: TxnStatus, participants: Vec<Bytes>) -> TxnRecord {
    let finished = !matches!(status, TxnStatus::Committed(_)) || participants.is_empty();
    TxnRecord {
        status,
        txn_ts,
        finished,
        participants,
    }
}

#[cfg(test)]
#[path = "apply_2pc_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "apply_2pc_model_tests.rs"]
mod model_tests;
