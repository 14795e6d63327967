//! Settling a multi-shard transaction whose coordinator may be gone: the recovery half of
//! parallel commit (see `meridian-raft`'s `locks` for what each shard does).
//!
//! ```text
//!  anchor: Abort ──► no record: tombstone ──────────────────────────────► Aborted
//!     │             no record, started below the GC threshold ───────────► Forgotten
//!     │             decided: its decision ───────────────────────────────► Committed(C) / Aborted
//!     ▼ STAGING (+ participants, the anchor's prepare timestamp)
//!  every other participant: Prevent (in parallel)
//!     │ all prepared: C = the largest prepare timestamp ──► anchor: Commit(C) ──► Committed(C)
//!     │ one prevented: it can never prepare now ──────────► anchor: AbortStaging ──► Aborted
//! ```
//!
//! The anchor's answer is final in every branch: it is the record's state after this
//! recovery's entry, whichever of the coordinator and the recoverers got there first. A
//! recovery that cannot finish (a participant unavailable and none prevented) decides nothing
//! and fails; the transaction's fate is then unknown to this caller.
//!
//! A recovery that finds (or makes) the record committed but not *finished* resolves every
//! other participant at `C` and then finishes the record, so GC can collect it (a committed
//! record is kept until then: a participant still locked would otherwise be settled as
//! aborted against a collected record). `Forgotten` means aborted, or committed and finished:
//! a lock still met belongs to an aborted transaction, but a coordinator that gets it cannot
//! tell which.
//!
//! Both the readers that wait out a lock (`locks`) and a coordinator whose prepares did not all
//! succeed (`txn_2pc`) use it: the coordinator cannot simply abort, because a prepare it saw
//! fail may have an earlier attempt still in flight, and the transaction may be implicitly
//! committed after all.

use crate::client::Deadline;
use crate::error::{Error, LockInfo, Result};
use crate::locks::Resolution;
use crate::Client;
use bytes::Bytes;
use futures::StreamExt;
use meridian_proto::kv::{self as proto, TxnState};

/// How a recovery settled a transaction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Settled {
    Committed(u64),
    Aborted,
    /// Collected: aborted, or committed with every participant resolved (see the module docs).
    Forgotten,
}

/// The decision an anchor's answer states, if it states one.
fn decided(answer: &proto::ResolveResponse) -> Option<Settled> {
    match TxnState::try_from(answer.state) {
        Ok(TxnState::Committed) if answer.commit_ts > 0 => {
            Some(Settled::Committed(answer.commit_ts))
        }
        Ok(TxnState::Aborted) => Some(Settled::Aborted),
        Ok(TxnState::Forgotten) => Some(Settled::Forgotten),
        _ => None,
    }
}

impl Client {
    /// Settles `txn` (its id and start timestamp), whose record lives with `anchor`: commits
    /// it if it is implicitly committed, aborts it otherwise (see the module docs).
    pub(crate) async fn recover_txn(
        &self,
        txn: (proto::WriteId, u64),
        anchor: &Bytes,
        deadline: &Deadline,
    ) -> Result<Settled> {
        let first = self
            .resolve_txn(anchor, txn, true, Resolution::Abort, deadline)
            .await?;
        if TxnState::try_from(first.state) != Ok(TxnState::Staging) {
            // A tombstone (Aborted), a decision, or Forgotten; nothing else is answered to an
            // abort. A committed record still unfinished lists its participants.
            let settled = decided(&first).ok_or_else(|| Error::Internal {
                message: format!("an anchor answered an abort with {first:?}"),
            })?;
            if let Settled::Committed(c) = settled {
                self.finish_committed(txn, anchor, &first.participants, c, deadline)
                    .await;
            }
            return Ok(settled);
        }
        let parallel = self.config().max_parallel_shard_requests.max(1);
        let prevents: Vec<_> = first
            .participants
            .iter()
            .map(|key| self.resolve_txn(key, txn, false, Resolution::Prevent, deadline))
            .collect();
        let answers: Vec<Result<proto::ResolveResponse>> = futures::stream::iter(prevents)
            .buffered(parallel)
            .collect()
            .await;
        let (mut commit_ts, mut prevented, mut failed) = (first.commit_ts, false, None);
        for answer in answers {
            match answer {
                Ok(a) if TxnState::try_from(a.state) == Ok(TxnState::Staging) => {
                    commit_ts = commit_ts.max(a.commit_ts);
                }
                Ok(_) => prevented = true,
                Err(error) => failed = Some(error),
            }
        }
        let decision = match (prevented, failed) {
            (true, _) => Resolution::AbortStaging,
            (false, Some(error)) => return Err(error),
            (false, None) => Resolution::Commit(commit_ts),
        };
        let last = self
            .resolve_txn(anchor, txn, true, decision, deadline)
            .await?;
        let settled = decided(&last).ok_or_else(|| Error::Internal {
            message: format!("an anchor answered {decision:?} with {last:?}"),
        })?;
        if let Settled::Committed(c) = settled {
            self.finish_committed(txn, anchor, &first.participants, c, deadline)
                .await;
        }
        Ok(settled)
    }

    /// Settles the transaction holding `lock` as a reader that waited the lock out would: it
    /// recovers the transaction (committed if every participant had prepared, aborted
    /// otherwise; a committed one has its participants resolved and its record finished) and
    /// resolves `lock`'s shard as settled. For a node's sweeper (see `meridian-server`'s
    /// `sweeper`) and for tools; safe against a live coordinator, whose commit then fails as a
    /// conflict unless it was committed already. Within the client's `call_timeout`.
    pub async fn settle_lock(&self, lock: &LockInfo) -> Result<()> {
        self.recover_lock(lock, &self.deadline()).await
    }

    /// Finishes the record of a transaction (its id and start timestamp) committed on the
    /// shard of `anchor` (any key of that shard) that nothing leads to any more: a record a
    /// GC pass found committed but unfinished (see `meridian-raft`'s `StuckRecord`), whose
    /// coordinator stopped after resolving its locks. Runs a recovery, which resolves every
    /// other participant at the commit timestamp and finishes the record, so a later GC pass
    /// collects it. For a node's sweeper; `Ok(false)` if some participant or the anchor did
    /// not answer (the record stays unfinished; asking again is safe).
    pub async fn finish_stuck_record(
        &self,
        anchor: &Bytes,
        txn: proto::WriteId,
        txn_ts: u64,
    ) -> Result<bool> {
        let deadline = self.deadline();
        let first = self
            .resolve_txn(anchor, (txn, txn_ts), true, Resolution::Abort, &deadline)
            .await?;
        match decided(&first) {
            Some(Settled::Committed(c)) => Ok(self
                .finish_committed((txn, txn_ts), anchor, &first.participants, c, &deadline)
                .await),
            Some(_) => Ok(true),
            None => Err(Error::Internal {
                message: format!("an anchor answered a stuck record's abort with {first:?}"),
            }),
        }
    }

    /// For a transaction committed at `c`: resolves every participant in `others` at `c` and,
    /// if all of them answered, finishes the record at `anchor` so GC can collect it. Best
    /// effort: a failure leaves the record unfinished (and kept) for a later recovery; returns
    /// whether the record is finished.
    pub(crate) async fn finish_committed(
        &self,
        txn: (proto::WriteId, u64),
        anchor: &Bytes,
        others: &[Bytes],
        c: u64,
        deadline: &Deadline,
    ) -> bool {
        if others.is_empty() {
            return true;
        }
        let parallel = self.config().max_parallel_shard_requests.max(1);
        let resolves: Vec<_> = others
            .iter()
            .map(|key| self.resolve_txn(key, txn, false, Resolution::Commit(c), deadline))
            .collect();
        let answers: Vec<Result<proto::ResolveResponse>> = futures::stream::iter(resolves)
            .buffered(parallel)
            .collect()
            .await;
        if let Some(error) = answers.into_iter().find_map(Result::err) {
            tracing::debug!(%error, "resolving a participant failed; the record stays unfinished");
            return false;
        }
        if let Err(error) = self
            .resolve_txn(anchor, txn, true, Resolution::Finish, deadline)
            .await
        {
            tracing::debug!(%error, "finishing a committed record failed; it stays unfinished");
            return false;
        }
        true
    }
}
