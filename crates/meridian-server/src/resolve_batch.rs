//! Grouping the resolves that reach a shard's leader into few Raft entries.
//!
//! # Why
//! A multi-shard transaction is acknowledged after its prepares (one consensus round), and then
//! costs three more entries: the explicit commit on its anchor, the resolution of every other
//! participant, the finish on the anchor (see `meridian-raft`'s `locks`). Under load those
//! resolves are most of a shard's log, and every entry pays its own proposal, replication
//! message, fsync share and apply. Resolves carry no user data and answer only a status, so
//! many of them fit in one entry ([`Command::Resolves`]) at the cost of one.
//!
//! # How
//! A resolve that passed its checks (see `kv_txn`) joins its shard's queue with its admission
//! permit and waits for its own answer. While fewer than [`MAX_GROUPS_IN_FLIGHT`] groups of the
//! shard are in Raft, a flusher task takes up to [`MAX_RESOLVES_PER_ENTRY`] queued resolves
//! and proposes them as one entry; when a group settles it hands each resolve its own result
//! and takes the next group, until the queue is empty. So an idle shard proposes a lone
//! resolve at once (a group of one, as before), and a busy one groups whatever arrived while
//! its earlier groups were in Raft: the group size follows the load, with no timer.
//!
//! # Invariants
//! - A group applies exactly as its resolves would as consecutive entries, in queue order
//!   (`meridian-raft`'s `apply_2pc_tests` checks it), so grouping changes no outcome; the order
//!   between two resolves of one transaction is still set by their sender, who waits for the
//!   first before sending the second.
//! - Every queued resolve gets an answer: its group's result, or the error its group's proposal
//!   met (`NOT_LEADER` when nothing was proposed, `AMBIGUOUS` when it may have applied; a
//!   resolve is idempotent, so the client retries either). The flusher is a task of its own,
//!   so a client that goes away does not strand the others' answers.
//! - A queue is bounded by the node's admission budget: every queued resolve holds the permit
//!   it was admitted with until its group settles.
//!
//! # Not done yet
//! - The client still sends one `Resolve` call per resolve; only the entries are grouped.
//!   Grouping the calls too would also save their round trips.

use crate::admission::Admitted;
use crate::error::{Result, ServerError};
use crate::kv::KvService;
use meridian_raft::types::{ResolveItem, MAX_RESOLVES_PER_ENTRY};
use meridian_raft::{Command, CommandResult, ShardReplica};
use meridian_types::ShardId;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tokio::sync::oneshot;

/// Most groups of one shard in Raft at once: one proposes while the next fills.
pub const MAX_GROUPS_IN_FLIGHT: usize = 2;

/// One resolve waiting for its group.
struct Queued {
    item: ResolveItem,
    permit: Admitted,
    answer: oneshot::Sender<Result<CommandResult>>,
}

#[derive(Default)]
struct ShardQueue {
    waiting: Vec<Queued>,
    in_flight: usize,
}

/// The node's resolve queues, one per shard with resolves waiting or in flight.
#[derive(Default)]
pub struct ResolveQueues {
    shards: Mutex<HashMap<ShardId, ShardQueue>>,
}

impl ResolveQueues {
    /// Takes the next group of `shard` if one may go now (counting it in flight).
    fn next_group(&self, shard: ShardId, finished: bool) -> Option<Vec<Queued>> {
        let mut shards = self.shards.lock().unwrap_or_else(|p| p.into_inner());
        let queue = shards.entry(shard).or_default();
        if finished {
            queue.in_flight -= 1;
        }
        if queue.waiting.is_empty() || queue.in_flight >= MAX_GROUPS_IN_FLIGHT {
            if queue.in_flight == 0 && queue.waiting.is_empty() {
                shards.remove(&shard);
            }
            return None;
        }
        queue.in_flight += 1;
        let take = queue.waiting.len().min(MAX_RESOLVES_PER_ENTRY);
        Some(queue.waiting.drain(..take).collect())
    }

    fn push(&self, shard: ShardId, queued: Queued) {
        let mut shards = self.shards.lock().unwrap_or_else(|p| p.into_inner());
        shards.entry(shard).or_default().waiting.push(queued);
    }
}

impl KvService {
    /// Proposes `item` on `shard` in a group with whatever other resolves are waiting (see the
    /// module docs) and returns its own result.
    pub(crate) async fn propose_resolve(
        &self,
        shard: ShardId,
        replica: &Arc<ShardReplica>,
        item: ResolveItem,
        permit: Admitted,
    ) -> Result<CommandResult> {
        let (answer, answered) = oneshot::channel();
        self.resolves.push(
            shard,
            Queued {
                item,
                permit,
                answer,
            },
        );
        if let Some(group) = self.resolves.next_group(shard, false) {
            let service = self.clone();
            let replica = replica.clone();
            tokio::spawn(async move { service.flush_resolves(shard, replica, group).await });
        }
        answered.await.unwrap_or_else(|_| {
            Err(ServerError::Ambiguous(format!(
                "shard {shard}: the resolve's group ended without an answer"
            )))
        })
    }

    /// Proposes `group`, answers its resolves, and goes on with the shard's next group until
    /// none may go.
    async fn flush_resolves(
        &self,
        shard: ShardId,
        replica: Arc<ShardReplica>,
        mut group: Vec<Queued>,
    ) {
        loop {
            let mut permits = Vec::with_capacity(group.len());
            let mut answers = Vec::with_capacity(group.len());
            let mut items = Vec::with_capacity(group.len());
            for queued in group {
                permits.push(queued.permit);
                answers.push(queued.answer);
                items.push(queued.item);
            }
            let permit = permits.pop().expect("a group is never empty");
            let proposed = match items.len() {
                1 => {
                    let item = items.pop().expect("one item");
                    self.propose_for_result(shard, &replica, item.into_command(0), permit)
                        .await
                        .map(|result| vec![result])
                }
                n => self
                    .propose_for_result(shard, &replica, Command::Resolves { ts: 0, items }, permit)
                    .await
                    .and_then(|result| match result.batch.len() == n {
                        true => Ok(result.batch),
                        false => Err(ServerError::Internal(format!(
                            "shard {shard}: {n} resolves in one entry answered {} results",
                            result.batch.len()
                        ))),
                    }),
            };
            drop(permits);
            match proposed {
                Ok(results) => {
                    for (answer, result) in answers.into_iter().zip(results) {
                        let _ = answer.send(item_outcome(shard, result));
                    }
                }
                Err(error) => {
                    for answer in answers {
                        let _ = answer.send(Err(error.clone()));
                    }
                }
            }
            match self.resolves.next_group(shard, true) {
                Some(next) => group = next,
                None => return,
            }
        }
    }
}

/// One resolve's result inside a group, checked as `propose_for_result` checks a lone one.
fn item_outcome(shard: ShardId, result: CommandResult) -> Result<CommandResult> {
    match result.rejected {
        // The service checked the resolve, so only a bug lands here.
        Some(reason) => Err(ServerError::Internal(format!(
            "shard {shard}: resolve rejected at apply: {reason}"
        ))),
        None => Ok(result),
    }
}
