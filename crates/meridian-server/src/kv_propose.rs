//! The write path of the `Kv` service: every proposal to a data shard goes through
//! [`KvService::propose_for_result`], which issues its timestamp (see `meridian_raft::issued`),
//! fences it to the leader's term together with the shard's closed timestamp (see
//! `meridian_raft::closed_ts`), keeps the timestamp and the request's admission permit until
//! the proposal settles, and maps Raft's answer to the service's errors (see `kv`'s module
//! docs: `NOT_LEADER` means not proposed, `AMBIGUOUS` may have committed).

use crate::admission::Admitted;
use crate::error::{Result, ServerError};
use crate::kv::KvService;
use meridian_raft::issued::{Footprint, IssueKind};
use meridian_raft::proposals::{ProposeError, MAX_QUEUED};
use meridian_raft::{Command, CommandResult, ShardReplica};
use meridian_types::{ShardId, Timestamp};
use openraft::type_config::async_runtime::WatchReceiver;

impl KvService {
    /// Proposes `cmd` and returns its commit timestamp.
    pub(crate) async fn propose(
        &self,
        shard: ShardId,
        replica: &ShardReplica,
        cmd: Command,
        permit: Admitted,
    ) -> Result<u64> {
        Ok(self
            .propose_for_result(shard, replica, cmd, permit)
            .await?
            .commit_ts)
    }

    /// Proposes `cmd` (its timestamp is replaced by one issued for this shard, see
    /// `meridian_raft::issued`) and returns what apply produced (a CAS may report a mismatch).
    /// The request's admission `permit` is held until the proposal settles, even if the request
    /// is dropped first.
    pub(crate) async fn propose_for_result(
        &self,
        shard: ShardId,
        replica: &ShardReplica,
        cmd: Command,
        permit: Admitted,
    ) -> Result<CommandResult> {
        // openraft refuses a write while the leader's quorum lease has lapsed (a quiesced
        // shard's parked leader, or one not yet confirmed since its election) until a quorum
        // round renews it. Renew it here, one round trip, instead of answering NOT_LEADER with
        // no hint and leaving the retry and its backoff to the client (see
        // `meridian_raft::write_lease`). Timestamps are issued only by a node that knows it
        // leads (see `issued`: a candidate must not issue before it was elected): the term and
        // leader are read after the renewal.
        replica.renew_lapsed_lease().await;
        let (term, leader) = {
            let metrics = replica.raft.metrics();
            let metrics = metrics.borrow_watched();
            (metrics.current_term, metrics.current_leader)
        };
        if leader != Some(self.node.config.node_id) {
            return Err(self.node.not_leader(shard, leader).await);
        }
        let issued = replica
            .issued
            .issue_for(&self.node.clock, term, issue_kind(&cmd))
            .await;
        self.check_ceiling(Timestamp(issued.ts))?;
        // Closed after this proposal's own timestamp was issued, so that timestamp is in
        // flight and the closed one is below it (see `meridian_raft::closed_ts`).
        let closed_ts = replica
            .issued
            .close(&self.node.clock, self.node.config.cluster.closed_ts_lag_ms);
        let cmd = Command::Closed {
            term,
            closed_ts,
            cmd: Box::new(cmd.with_ts(issued.ts)),
        };
        // The shard's proposer keeps the issued timestamp and the admission permit until the
        // proposal settles, so a request that is dropped (its client went away) neither
        // untracks a proposal still in the log nor frees its place in the node's budgets
        // early. Under load it coalesces this proposal with others of the shard into one
        // entry (see `meridian_raft::proposals`); each still answers for itself.
        self.node.touch(replica);
        let answer = replica
            .proposer
            .propose(cmd, Box::new((issued, permit)))
            .await
            .map_err(|_| ServerError::Ambiguous(format!("shard {shard}: proposal task ended")))?;
        match answer {
            // Issued in another term than it was appended in: not applied.
            Ok(result) if result.fenced => Err(self.node.not_leader(shard, None).await),
            // Another transaction's lock is in the way: nothing was written.
            Ok(result) if result.locked.is_some() => Err(ServerError::Locked(
                result.locked.expect("checked just above"),
            )),
            Ok(result) => match result.rejected {
                // The service validated the command, so only a bug lands here.
                Some(reason) => Err(ServerError::Internal(format!(
                    "shard {shard}: command rejected at apply: {reason}"
                ))),
                None => Ok(result),
            },
            // Rejected before its entry was appended: safe to send elsewhere.
            Err(ProposeError::NotLeader(leader)) => Err(self.node.not_leader(shard, leader).await),
            Err(ProposeError::Busy) => Err(ServerError::Unavailable(format!(
                "shard {shard}: {MAX_QUEUED} proposals already wait; not proposed"
            ))),
            Err(ProposeError::Discarded) => Err(ServerError::Ambiguous(format!(
                "shard {shard}: the leader changed after the write was appended; it may still commit"
            ))),
            Err(ProposeError::Failed(e)) => Err(ServerError::Ambiguous(format!("shard {shard}: {e}"))),
        }
    }

    /// Refuses to hand out `ts` unless it is below the last persisted HLC ceiling (see
    /// `hlc_ceiling`: a restart must never issue below a timestamp issued before it).
    pub(crate) fn check_ceiling(&self, ts: Timestamp) -> Result<()> {
        if self.node.ceiling.admits(ts) {
            return Ok(());
        }
        Err(ServerError::Unavailable(format!(
            "timestamp {ts} is not below the persisted HLC ceiling yet (a storage stall?)"
        )))
    }
}

/// What snapshot reads must wait for in `cmd` (see `meridian_raft::issued`): the user keys it
/// writes, or nothing for a resolution (its intents answer for it); anything else is assumed
/// to touch the whole shard.
fn issue_kind(cmd: &Command) -> IssueKind {
    let footprint = match cmd {
        Command::Resolve { .. } => return IssueKind::Resolution,
        Command::Write { puts, deletes, .. } => Footprint::keys(
            puts.iter()
                .map(|(key, _)| key.clone())
                .chain(deletes.iter().cloned()),
        ),
        Command::Cas { key, .. } => Footprint::keys([key.clone()]),
        Command::Txn { writes, .. } | Command::Prepare { writes, .. } => {
            Footprint::keys(writes.iter().map(|(key, _)| key.clone()))
        }
        _ => Footprint::All,
    };
    IssueKind::Write(footprint)
}
