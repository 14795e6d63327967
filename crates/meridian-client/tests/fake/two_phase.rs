//! A minimal parallel-commit participant for the fake, off unless a test sets
//! `World::two_phase`: enough to drive a coordinator into its recovery and see what it sends.
//!
//! - A prepare stages the transaction on its shard at a new tick and answers it committed,
//!   except on the shards in [`TwoPhase::lose_reply_on`]: there it is staged but every answer
//!   is lost (UNAVAILABLE), as when a leader's reply never arrives.
//! - `Kv.Resolve` answers from what was staged: on the anchor, an abort finds the record
//!   STAGING (with its participants) or, if the coordinator's prepare never came, makes a
//!   tombstone; a prevent finds a prepared participant STAGING at its prepare timestamp, or
//!   prevents it; a commit decides (or resolves) at its timestamp; a finish answers the
//!   decision. Intents are not turned into versions: the store is not written.
//! - `Kv.CommitWait` is recorded, and fails if [`TwoPhase::fail_commit_wait`] is set.
//!
//! One transaction at a time: the fake keeps no per-transaction table.

use super::error;
use bytes::Bytes;
use meridian_client::proto::{resolve_request::Decision, *};
use std::collections::{BTreeMap, BTreeSet};
use tonic::Status;

#[derive(Default, Debug)]
pub struct TwoPhase {
    /// Shards whose prepares are staged but never answered.
    pub lose_reply_on: BTreeSet<u64>,
    /// Per shard: the prepare timestamp and (on the anchor) the other participants' keys.
    pub staged: BTreeMap<u64, (u64, Vec<Bytes>)>,
    /// The anchor's decision: `Some(commit_ts)` once committed, `Some(0)` once aborted.
    pub decided: Option<u64>,
    /// Every resolve served: (shard, what it asked).
    pub resolves: Vec<(u64, &'static str)>,
    /// The timestamp of every `Kv.CommitWait` served.
    pub commit_waits: Vec<u64>,
    pub fail_commit_wait: bool,
}

impl TwoPhase {
    /// A prepare on `shard` at `ts`: staged, then answered or lost.
    pub fn prepare(
        &mut self,
        shard: u64,
        ts: u64,
        prepare: &TxnPrepare,
    ) -> Result<CommitResponse, Status> {
        self.staged
            .insert(shard, (ts, prepare.participants.clone()));
        if self.lose_reply_on.contains(&shard) {
            return Err(error(
                "UNAVAILABLE",
                "the fake lost the prepare's reply",
                None,
            ));
        }
        Ok(CommitResponse {
            committed: true,
            commit_ts: ts,
            shard_id: shard,
            ..Default::default()
        })
    }

    /// A resolve of the transaction on `shard` (see the module docs).
    pub fn resolve(&mut self, shard: u64, request: &ResolveRequest) -> ResolveResponse {
        let answer = |state: TxnState, commit_ts: u64, participants: Vec<Bytes>| ResolveResponse {
            state: state as i32,
            commit_ts,
            shard_id: shard,
            participants,
        };
        let staged = self.staged.get(&shard).cloned();
        let (what, response) = match request.decision {
            Some(Decision::Abort(_)) if request.anchor => (
                "abort",
                match (self.decided, staged) {
                    (Some(0), _) => answer(TxnState::Aborted, 0, Vec::new()),
                    (Some(c), _) => answer(TxnState::Committed, c, Vec::new()),
                    (None, Some((ts, others))) => answer(TxnState::Staging, ts, others),
                    (None, None) => {
                        self.decided = Some(0);
                        answer(TxnState::Aborted, 0, Vec::new())
                    }
                },
            ),
            Some(Decision::Prevent(_)) => (
                "prevent",
                match staged {
                    Some((ts, _)) => answer(TxnState::Staging, ts, Vec::new()),
                    None => answer(TxnState::Aborted, 0, Vec::new()),
                },
            ),
            Some(Decision::CommitTs(c)) => {
                // A decided record never changes.
                let c = match request.anchor {
                    true => *self.decided.get_or_insert(c),
                    false => c,
                };
                let response = match c {
                    0 => answer(TxnState::Aborted, 0, Vec::new()),
                    c => answer(TxnState::Committed, c, Vec::new()),
                };
                ("commit", response)
            }
            Some(Decision::Finish(_)) => (
                "finish",
                match self.decided {
                    Some(c) if c > 0 => answer(TxnState::Committed, c, Vec::new()),
                    _ => answer(TxnState::Aborted, 0, Vec::new()),
                },
            ),
            Some(Decision::AbortStaging(_)) => {
                self.decided.get_or_insert(0);
                ("abort_staging", answer(TxnState::Aborted, 0, Vec::new()))
            }
            Some(Decision::Abort(_)) | None => ("abort", answer(TxnState::Aborted, 0, Vec::new())),
        };
        self.resolves.push((shard, what));
        response
    }

    /// A `Kv.CommitWait` on `ts`.
    pub fn commit_wait(&mut self, ts: u64) -> Result<CommitWaitResponse, Status> {
        self.commit_waits.push(ts);
        if self.fail_commit_wait {
            return Err(error("UNAVAILABLE", "the fake's commit-wait failed", None));
        }
        Ok(CommitWaitResponse {})
    }
}
