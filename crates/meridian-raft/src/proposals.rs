//! Proposal coalescing: under load, a shard leader's writes ride in one Raft entry.
//!
//! # Why
//! Every `client_write` costs openraft one API message and one engine round (a log append
//! handed to the log writer, replication woken, the commit tracked, an apply call answered),
//! and costs this node a task and its hand-offs. The write-path profile of #8 found the node
//! CPU-bound at ~12 context switches per insert with no hot function: the cost is per entry,
//! not per byte. So a leader keeps at most `limit` entries of a shard in flight (`client_write`
//! calls not yet answered); a proposal that finds them all busy waits in the shard's queue, and
//! when an in-flight entry settles, the task that sent it takes what waits (up to
//! [`MAX_PROPOSAL_BATCH`] members and [`MAX_COALESCED_BYTES`] encoded) and proposes it as ONE
//! entry, a [`Command::Batch`] (group commit). A proposal that finds a slot free starts a
//! sender at once, which proposes it with whatever else waits by then (alone and unwrapped, as
//! before coalescing, if nothing does): without load coalescing adds no delay and changes no
//! entry; under load a waiting proposal waits for an in-flight entry to settle (for more than
//! one only if more than one entry's worth waits ahead of it).
//!
//! # Invariants
//! - Each member keeps its own fence (the `Closed` wrapper with the term its timestamp was
//!   issued in) and apply treats it as if it had its own entry at that place in the log, in
//!   queue order (see `apply`): its check (CAS, transaction reads, locks), its dedup and its
//!   verdict are its own. One member's mismatch, conflict, lock, fence or rejection touches no
//!   other member.
//! - The entry commits whole or not at all. An error of the entry itself is every member's
//!   error, with the same meaning: [`ProposeError::NotLeader`] and [`ProposeError::Busy`]
//!   were not proposed (safe to send again); [`ProposeError::Discarded`] and
//!   [`ProposeError::Failed`] may have committed.
//! - A member's `keep` (the server's issued timestamp and admission permit) is dropped only
//!   once its entry's outcome is known, even if the request that proposed it went away: the
//!   issued timestamp must stay tracked while the write may still land (see `issued`).
//! - Bounded: at most [`MAX_QUEUED`] proposals wait per shard; another is refused at once
//!   ([`ProposeError::Busy`], not proposed). The node's admission control bounds them first.
//!
//! # Compatibility
//! A node from before [`Command::Batch`] cannot decode it. A rolling upgrade from such a
//! version runs with coalescing off (`proposals_in_flight = 0`: every proposal alone, as
//! before) until every node runs this one.
//!
//! Every data command the `Kv` service proposes is coalesced: `Write`, `Cas`, `Txn`, and a
//! 2PC `Prepare` or `Resolve` (apply handles each member as it handles consecutive entries of
//! one apply call, which already share one RocksDB batch). GC pages never are (each starts an
//! apply batch of its own), nor is what a peer forwards to the metadata shard.
//!
//! # Not done yet
//! - The limit is static (a node setting), not adapted to the shard's load or round trip.

use crate::types::{Command, CommandResult, NodeId, Raft, MAX_PROPOSAL_BATCH};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::oneshot;

/// The most encoded bytes of members one coalesced entry carries (a member larger than this
/// goes alone, as before coalescing): well under the largest message, so a few such entries
/// fit one append (see `log_store::MAX_BYTES_PER_READ`).
pub const MAX_COALESCED_BYTES: usize = 1024 * 1024;

/// The most proposals waiting in one shard's queue.
pub const MAX_QUEUED: usize = 4_096;

/// Entries a shard leader keeps in flight before it queues (a node's default; 0 = coalescing
/// off, every proposal its own entry).
pub const DEFAULT_IN_FLIGHT: usize = 2;

/// Why a proposal has no result.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProposeError {
    /// Not proposed: this node does not lead the shard (the leader, if known).
    NotLeader(Option<NodeId>),
    /// Not proposed: [`MAX_QUEUED`] proposals already wait for this shard.
    Busy,
    /// Appended, then the leader changed before it committed: it may still commit.
    Discarded,
    /// Anything else (openraft stopped, a storage error): it may have committed.
    Failed(String),
}

pub type Proposed = Result<CommandResult, ProposeError>;

/// What a proposal keeps alive until its outcome is known (see the module's invariants).
pub type Keep = Box<dyn std::any::Any + Send>;

/// Node-wide counters: `proposals / entries` is the coalescing factor.
#[derive(Debug, Default)]
pub struct ProposeStats {
    /// Proposals handed to openraft (alone or as batch members).
    pub proposals: AtomicU64,
    /// Entries they went out in.
    pub entries: AtomicU64,
    /// Proposals refused because the queue was full.
    pub refused: AtomicU64,
}

struct Waiting {
    cmd: Command,
    bytes: usize,
    reply: oneshot::Sender<Proposed>,
    keep: Keep,
}

#[derive(Default)]
struct Queue {
    waiting: VecDeque<Waiting>,
    /// Tasks sending entries of this shard (each keeps one `client_write` in flight).
    senders: usize,
}

/// One shard's proposal queue (see the module docs).
pub struct Proposer {
    raft: Raft,
    /// The node's setting: entries in flight before proposals queue (0: never queue).
    limit: Arc<AtomicUsize>,
    stats: Arc<ProposeStats>,
    queue: Mutex<Queue>,
}

impl Proposer {
    pub fn new(raft: Raft, limit: Arc<AtomicUsize>, stats: Arc<ProposeStats>) -> Proposer {
        Proposer {
            raft,
            limit,
            stats,
            queue: Mutex::new(Queue::default()),
        }
    }

    /// Proposes `cmd` (already fenced by the caller) and answers when its entry's outcome is
    /// known; `keep` is dropped then, not before, whether or not the answer is still wanted.
    pub fn propose(self: &Arc<Self>, cmd: Command, keep: Keep) -> oneshot::Receiver<Proposed> {
        let (reply, answer) = oneshot::channel();
        let limit = self.limit.load(Ordering::Relaxed);
        if limit == 0 || !coalescable(&cmd) {
            let me = self.clone();
            let alone = Waiting {
                cmd,
                bytes: 0,
                reply,
                keep,
            };
            tokio::spawn(async move { me.send(vec![alone]).await });
            return answer;
        }
        let bytes = crate::types::codec::encoded_len(&cmd);
        let start = {
            let mut queue = self.lock();
            if queue.waiting.len() >= MAX_QUEUED {
                drop(queue);
                self.stats.refused.fetch_add(1, Ordering::Relaxed);
                let _ = reply.send(Err(ProposeError::Busy));
                return answer;
            }
            queue.waiting.push_back(Waiting {
                cmd,
                bytes,
                reply,
                keep,
            });
            let start = queue.senders < limit;
            if start {
                queue.senders += 1;
            }
            start
        };
        if start {
            let me = self.clone();
            tokio::spawn(async move { me.drain().await });
        }
        answer
    }

    /// A sender task: proposes what waits, one entry at a time, until nothing does.
    async fn drain(self: Arc<Self>) {
        let mut ending = SenderEnd {
            proposer: self.clone(),
            counted: true,
        };
        loop {
            let batch = {
                let mut queue = self.lock();
                let batch = take_batch(&mut queue.waiting);
                if batch.is_empty() {
                    // Under the lock: a proposal queued after this sees one sender fewer and
                    // starts another, so nothing is left waiting with no sender.
                    queue.senders -= 1;
                    ending.counted = false;
                    return;
                }
                batch
            };
            self.send(batch).await;
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Proposes `batch` as one entry (a lone member unwrapped) and answers each member.
    async fn send(&self, batch: Vec<Waiting>) {
        use openraft::errors::{ClientWriteError, RaftError};
        let count = batch.len();
        let mut cmds = Vec::with_capacity(count);
        let mut waiters = Vec::with_capacity(count);
        for w in batch {
            cmds.push(w.cmd);
            waiters.push((w.reply, w.keep));
        }
        let entry = if count == 1 {
            cmds.pop().expect("one command")
        } else {
            Command::Batch { cmds }
        };
        self.stats
            .proposals
            .fetch_add(count as u64, Ordering::Relaxed);
        self.stats.entries.fetch_add(1, Ordering::Relaxed);
        let written = self.raft.client_write(entry).await;
        let answers: Vec<Proposed> = match written {
            Ok(resp) => split(resp.data, count),
            Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f))) => {
                vec![Err(ProposeError::NotLeader(f.leader_id)); count]
            }
            Err(RaftError::APIError(ClientWriteError::LogEntryDiscarded(_))) => {
                vec![Err(ProposeError::Discarded); count]
            }
            Err(e) => vec![Err(ProposeError::Failed(e.to_string())); count],
        };
        for ((reply, keep), answer) in waiters.into_iter().zip(answers) {
            drop(keep);
            let _ = reply.send(answer);
        }
    }
}

/// A sender task's end that `drain` did not reach itself: it panicked, or its task was
/// dropped (the runtime shutting down). Its place is given back, and if proposals wait with
/// no sender left, another is started (or, with no runtime to start it on, they are answered
/// as failed), so no proposal waits forever and no place leaks. The batch it was sending, if
/// any, is answered by its dropped reply channels (the caller's "may have committed").
struct SenderEnd {
    proposer: Arc<Proposer>,
    counted: bool,
}

impl Drop for SenderEnd {
    fn drop(&mut self) {
        if !self.counted {
            return;
        }
        let orphans = {
            let mut queue = self.proposer.lock();
            queue.senders -= 1;
            if queue.waiting.is_empty() || queue.senders > 0 {
                return;
            }
            match tokio::runtime::Handle::try_current() {
                Ok(runtime) => {
                    queue.senders += 1;
                    let proposer = self.proposer.clone();
                    runtime.spawn(async move { proposer.drain().await });
                    return;
                }
                Err(_) => std::mem::take(&mut queue.waiting),
            }
        };
        for w in orphans {
            let _ = w.reply.send(Err(ProposeError::Failed(
                "the proposal sender ended".into(),
            )));
        }
    }
}

/// Each member's answer from the entry's result (`count` members; 1 = sent unwrapped).
fn split(result: CommandResult, count: usize) -> Vec<Proposed> {
    if count == 1 {
        return vec![Ok(result)];
    }
    if let Some(reason) = result.rejected {
        // The batch's shape was refused at apply (a bug here): nothing of it was written.
        let each = CommandResult {
            rejected: Some(reason),
            ..Default::default()
        };
        return vec![Ok(each); count];
    }
    if result.batch.len() != count {
        let what = format!(
            "a batch of {count} answered with {} results",
            result.batch.len()
        );
        return vec![Err(ProposeError::Failed(what)); count];
    }
    result.batch.into_iter().map(Ok).collect()
}

/// Takes the longest prefix of `waiting` that fits one entry: at least one proposal, then up
/// to [`MAX_PROPOSAL_BATCH`] members and [`MAX_COALESCED_BYTES`].
fn take_batch(waiting: &mut VecDeque<Waiting>) -> Vec<Waiting> {
    let mut batch = Vec::new();
    let mut bytes = 0usize;
    while let Some(next) = waiting.front() {
        let full = batch.len() >= MAX_PROPOSAL_BATCH
            || (!batch.is_empty() && bytes.saturating_add(next.bytes) > MAX_COALESCED_BYTES);
        if full {
            break;
        }
        bytes = bytes.saturating_add(next.bytes);
        batch.push(waiting.pop_front().expect("front exists"));
    }
    batch
}

/// Whether `cmd` may be coalesced: a fenced data command, the shape [`Command::validate`]
/// accepts in a batch.
fn coalescable(cmd: &Command) -> bool {
    match cmd {
        Command::Closed { cmd: inner, .. } | Command::Fenced { cmd: inner, .. } => matches!(
            **inner,
            Command::Write { .. }
                | Command::Cas { .. }
                | Command::Txn { .. }
                | Command::Prepare { .. }
                | Command::Resolve { .. }
        ),
        _ => false,
    }
}

#[cfg(test)]
#[path = "proposals_tests.rs"]
pub(crate) mod tests;
