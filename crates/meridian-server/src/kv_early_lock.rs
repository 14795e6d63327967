//! Early locks on the shard leader: the server half of `docs/early-locking.md`.
//!
//! # What
//! A transaction that reads keys for update may ask the shard's leader to lock them as it
//! reads them (`BatchGetRequest.lock`). The leader keeps one [`EarlyLockTable`] per shard it
//! has served such a read for, in memory: the locks are not replicated and not persisted. A
//! request either holds a key at once, takes it from a junior holder (a *wound*), or waits in
//! the key's queue, in rank order, up to `min(wait_ms, EARLY_LOCK_WAIT_MAX_MS)`. A key not
//! granted by then is read unlocked: a locking read never fails because of a lock.
//!
//! # Why
//! Without it a transfer that loses a race on a hot key learns it at apply, after a replicated
//! entry, then sleeps in backoff while the key sits idle. With it the loser waits its turn and
//! reads the winner's write.
//!
//! # Invariants
//! - Nothing correct depends on these locks: apply never reads them, every commit is checked
//!   as before (`meridian_raft::txn_check`). A lost lock costs a retry, never a result.
//! - A table serves one leader term: the first locking read of a newer term clears it (every
//!   waiter is answered "not held"), and a request from a node that does not lead takes no
//!   lock. A node that lost leadership without seeing a newer term still answers locking
//!   reads from its table, but its read barrier then fails (`NOT_LEADER`).
//! - A lock is released only after its owner's commit (`CommitRequest.lock_owner`) returned
//!   from the local apply, so a waiter that then reads at a timestamp it lets the node pick
//!   sees that commit.
//! - A wound must cost the junior, not the senior: the junior read before the senior took
//!   its key, so if the junior committed first the senior's commit would fail its check. So
//!   the next commit of a wounded owner on the shard is refused as a conflict, before it is
//!   proposed ([`CommitStart::Wounded`]). That is safe only for a commit that cannot have
//!   applied already under another request, so only the *first send* of a write id
//!   (`CommitRequest.first_send`) is refused: no earlier send of it exists. A resend (the
//!   client's retry after a lost answer) may follow a first send that is still to apply, here
//!   or through another leader, whatever this node's table says, so it always goes on to Raft
//!   and the dedup table. Also, a commit whose handler ended without an answer (an error
//!   after proposing, a dropped request) drops its owner from the table: its locks and flag
//!   no longer mean anything.
//! - Every wait is bounded by the cap, every ticket is cancelled when its request ends (even a
//!   dropped one, by [`Waits`]' `Drop`), and a committing owner's mark is lifted when its
//!   commit ends however it ends ([`CommitGuard`]' `Drop`). An owner idle on a shard for
//!   `EARLY_LOCK_IDLE_MS` loses its locks there (checked before each acquire).
//! - Wait edges go from junior to senior or to an owner whose commit is in flight, never back
//!   (see `meridian_raft::early_locks`): no deadlock, across keys or shards.
//!
//! # Not done yet
//! - Tables are cleared lazily, at the first locking read of a newer term, not when the role
//!   watch sees the node stop leading or before a leadership transfer; the old leader's
//!   waiters wait out their cap there, and its locks go at the next sweep
//!   ([`EarlyLocks::sweep`], every half idle limit: idle owners expire, empty tables are
//!   dropped).
//! - An owner wounded and then restarted (an uncertain read) before it commits keeps its
//!   flag: that attempt's commit is refused too, one retry more than needed.
//! - The idle limit is a constant, not configuration.

use bytes::Bytes;
use meridian_proto::kv::LockReply;
use meridian_raft::early_locks::{Answer, EarlyLockTable, KeyOutcome, TicketId, TicketOutcome};
use meridian_raft::RequestId;
use meridian_types::limits::EARLY_LOCK_IDLE_MS;
use meridian_types::{ShardId, TxnRank};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// Node-wide counters of early locks, for the metrics.
#[derive(Debug, Default)]
pub struct EarlyLockStats {
    /// Keys granted at once: free, already held by the owner, or taken from a junior.
    pub free: AtomicU64,
    pub own: AtomicU64,
    pub wound: AtomicU64,
    /// Keys granted after a wait.
    pub waited: AtomicU64,
    /// Keys not held: refused at once, or a wait that ended without the lock.
    pub not_held: AtomicU64,
    /// Requests that waited, and their time waiting in microseconds.
    pub waits: AtomicU64,
    pub wait_us: AtomicU64,
    /// Tables cleared for a newer term.
    pub clears: AtomicU64,
    /// Owners whose locks a commit or prepare released, and `Kv.ReleaseLocks` calls.
    pub commit_releases: AtomicU64,
    /// Commits refused because a senior wounded their owner on the shard.
    pub wounded_commits: AtomicU64,
    pub request_releases: AtomicU64,
    /// Locking reads answered uncertain because a key changed after their `read_ts`.
    pub refreshes: AtomicU64,
}

fn bump(counter: &AtomicU64, by: u64) {
    counter.fetch_add(by, Ordering::Relaxed);
}

struct ShardLocks {
    table: EarlyLockTable,
    /// The waiting requests, by ticket.
    waiting: HashMap<TicketId, oneshot::Sender<TicketOutcome>>,
}

impl ShardLocks {
    fn deliver(&mut self, answers: Vec<Answer>) {
        for answer in answers {
            if let Some(tx) = self.waiting.remove(&answer.ticket) {
                let _ = tx.send(answer.outcome);
            }
        }
    }
}

/// The node's early lock tables, one per shard (see the module docs).
pub struct EarlyLocks {
    shards: Mutex<HashMap<ShardId, ShardLocks>>,
    epoch: Instant,
    idle_ms: u64,
    pub stats: EarlyLockStats,
}

impl Default for EarlyLocks {
    fn default() -> Self {
        EarlyLocks::new(EARLY_LOCK_IDLE_MS)
    }
}

impl EarlyLocks {
    pub fn new(idle_ms: u64) -> EarlyLocks {
        EarlyLocks {
            shards: Mutex::new(HashMap::new()),
            epoch: Instant::now(),
            idle_ms,
            stats: EarlyLockStats::default(),
        }
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// Runs `f` on `shard`'s table under the lock, creating it (closed) if `create`.
    fn with<R>(
        &self,
        shard: ShardId,
        create: bool,
        f: impl FnOnce(&mut ShardLocks) -> R,
    ) -> Option<R> {
        let mut shards = self.shards.lock().unwrap_or_else(|p| p.into_inner());
        if create {
            let entry = shards.entry(shard).or_insert_with(|| ShardLocks {
                table: EarlyLockTable::new(),
                waiting: HashMap::new(),
            });
            return Some(f(entry));
        }
        shards.get_mut(&shard).map(f)
    }

    /// Locks `keys` (sorted) for `owner` on `shard`, which this node leads in `term`, waiting
    /// at most `wait` for keys held by others. Returns the reply; `held` is per key.
    pub async fn acquire(
        &self,
        shard: ShardId,
        term: u64,
        owner: RequestId,
        rank: TxnRank,
        keys: &[Bytes],
        wait: Duration,
    ) -> LockReply {
        let now = self.now_ms();
        let (outcomes, tickets, wounded) = self
            .with(shard, true, |s| {
                if s.table.term().is_none_or(|t| t < term) {
                    if s.table.term().is_some() {
                        bump(&self.stats.clears, 1);
                    }
                    let answers = s.table.clear(term);
                    s.deliver(answers);
                }
                let answers = s.table.expire(now, self.idle_ms);
                s.deliver(answers);
                let outcomes = s.table.acquire(owner, rank, keys, now, term);
                let mut tickets = Vec::new();
                for (i, outcome) in outcomes.iter().enumerate() {
                    if let KeyOutcome::Waiting(ticket) = outcome {
                        let (tx, rx) = oneshot::channel();
                        s.waiting.insert(*ticket, tx);
                        tickets.push((i, *ticket, rx));
                    }
                }
                // Reported, and kept for the commit's refusal (see the module docs).
                let wounded = s.table.is_wounded(owner);
                (outcomes, tickets, wounded)
            })
            .expect("created");
        let mut held: Vec<bool> = outcomes.iter().map(|o| o.is_held()).collect();
        for outcome in &outcomes {
            bump(
                match outcome {
                    KeyOutcome::Free => &self.stats.free,
                    KeyOutcome::Own => &self.stats.own,
                    KeyOutcome::Wound(_) => &self.stats.wound,
                    KeyOutcome::Waiting(_) => continue,
                    KeyOutcome::NotHeld(_) => &self.stats.not_held,
                },
                1,
            );
        }
        let mut waited_us = 0;
        if !tickets.is_empty() {
            let started = Instant::now();
            let mut waits = Waits {
                locks: self,
                shard,
                tickets,
            };
            for (i, granted) in waits.wait(wait).await {
                held[i] = granted;
                bump(
                    if granted {
                        &self.stats.waited
                    } else {
                        &self.stats.not_held
                    },
                    1,
                );
            }
            waited_us = started.elapsed().as_micros() as u64;
            bump(&self.stats.waits, 1);
            bump(&self.stats.wait_us, waited_us);
        }
        LockReply {
            held,
            waited_us,
            wounded,
        }
    }

    /// `owner`'s commit on `shard` is about to be proposed: refused if it is `refusable` (the
    /// first send of its write id) and a senior wounded the owner there (the flag is
    /// consumed), else its locks stay put until the guard says how it ended (see the module
    /// docs for a guard dropped without an answer).
    pub fn begin_commit(
        &self,
        shard: ShardId,
        owner: RequestId,
        refusable: bool,
    ) -> CommitStart<'_> {
        let now = self.now_ms();
        let wounded = self.with(shard, false, |s| {
            if refusable && s.table.take_wounded(owner) {
                return true;
            }
            let answers = s.table.begin_commit(owner, now);
            s.deliver(answers);
            false
        });
        match wounded {
            None => CommitStart::Untracked,
            Some(true) => {
                bump(&self.stats.wounded_commits, 1);
                CommitStart::Wounded
            }
            Some(false) => CommitStart::Tracked(CommitGuard {
                locks: self,
                shard,
                owner,
                done: false,
            }),
        }
    }

    /// Releases everything `owner` holds on `shard`, ends its waits and forgets its wound
    /// flag; returns how many keys it held.
    pub fn release(&self, shard: ShardId, owner: RequestId) -> u32 {
        let now = self.now_ms();
        self.with(shard, false, |s| {
            let held = s.table.held(owner).len() as u32;
            let answers = s.table.release_owner(owner, now);
            s.deliver(answers);
            held
        })
        .unwrap_or(0)
    }

    /// Expires idle owners and old waits on every table, and drops the tables left empty (a
    /// shard this node no longer leads, or one split or retired, keeps nothing for long).
    pub fn sweep(&self) {
        let now = self.now_ms();
        let mut shards = self.shards.lock().unwrap_or_else(|p| p.into_inner());
        for s in shards.values_mut() {
            let answers = s.table.expire(now, self.idle_ms);
            s.deliver(answers);
        }
        shards.retain(|_, s| s.table.locks_held() > 0 || s.table.waiters() > 0);
    }

    /// Runs [`EarlyLocks::sweep`] every half idle limit while `node` lives.
    pub fn spawn_sweeper(node: std::sync::Weak<crate::node::Node>) {
        if tokio::runtime::Handle::try_current().is_err() {
            return;
        }
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(EARLY_LOCK_IDLE_MS / 2)).await;
                match node.upgrade() {
                    Some(node) => node.early_locks.sweep(),
                    None => return,
                }
            }
        });
    }

    /// Locks held and requests waiting, over every table.
    pub fn gauges(&self) -> (usize, usize) {
        let shards = self.shards.lock().unwrap_or_else(|p| p.into_inner());
        shards.values().fold((0, 0), |(held, waiting), s| {
            (held + s.table.locks_held(), waiting + s.table.waiters())
        })
    }
}

/// The tickets one request waits on; dropping it cancels those not yet answered.
struct Waits<'a> {
    locks: &'a EarlyLocks,
    shard: ShardId,
    /// (key index, ticket, where its answer comes).
    tickets: Vec<(usize, TicketId, oneshot::Receiver<TicketOutcome>)>,
}

impl Waits<'_> {
    /// Waits for every ticket, at most `wait`, then gives up on the rest. Returns, per key
    /// index, whether it was granted.
    async fn wait(&mut self, wait: Duration) -> Vec<(usize, bool)> {
        let mut answers: Vec<Option<TicketOutcome>> = vec![None; self.tickets.len()];
        let all = async {
            for (j, (_, _, rx)) in self.tickets.iter_mut().enumerate() {
                answers[j] = Some(rx.await.unwrap_or(TicketOutcome::NotHeld(
                    meridian_raft::early_locks::NotHeld::Cancelled,
                )));
            }
        };
        let _ = tokio::time::timeout(wait, all).await;
        self.cancel();
        self.tickets
            .iter_mut()
            .zip(answers)
            .map(|((i, _, rx), answer)| {
                // A ticket cancelled above was answered under the table's lock: its answer
                // (granted just before, or cancelled) is in its channel now.
                let answer = answer.or_else(|| rx.try_recv().ok());
                (*i, answer == Some(TicketOutcome::Granted))
            })
            .collect()
    }

    fn cancel(&mut self) {
        let tickets: Vec<TicketId> = self.tickets.iter().map(|(_, t, _)| *t).collect();
        self.locks.with(self.shard, false, |s| {
            for ticket in tickets {
                let answers = s.table.cancel(ticket);
                s.deliver(answers);
                s.waiting.remove(&ticket);
            }
        });
    }
}

impl Drop for Waits<'_> {
    fn drop(&mut self) {
        // A request dropped mid-wait (its client went away) leaves no waiter behind; after
        // `wait` this answers nothing.
        self.cancel();
    }
}

/// What [`EarlyLocks::begin_commit`] decided.
pub enum CommitStart<'a> {
    /// This node keeps no table for the shard: nothing to track.
    Untracked,
    /// Refuse the commit as a conflict: a senior took a lock of its owner here.
    Wounded,
    /// Go on; tell the guard how it ended.
    Tracked(CommitGuard<'a>),
}

/// Marks an owner's commit in flight on one shard (see [`EarlyLocks::begin_commit`]).
pub struct CommitGuard<'a> {
    locks: &'a EarlyLocks,
    shard: ShardId,
    owner: RequestId,
    done: bool,
}

impl CommitGuard<'_> {
    /// The commit ended: `applied` (committed, or a prepare that now guards the keys with its
    /// own locks) releases the owner's locks to their waiters; otherwise it keeps them for its
    /// next attempt.
    pub fn finish(mut self, applied: bool) {
        self.done = true;
        if applied {
            if self.locks.release(self.shard, self.owner) > 0 {
                bump(&self.locks.stats.commit_releases, 1);
            }
        } else {
            let now = self.locks.now_ms();
            self.locks.with(self.shard, false, |s| {
                let answers = s.table.end_commit(self.owner, now);
                s.deliver(answers);
            });
        }
    }
}

impl Drop for CommitGuard<'_> {
    fn drop(&mut self) {
        if !self.done {
            // No answer: the commit may still apply. Forget the owner, wound flag included,
            // so that a resend of it is never refused (see the module docs).
            self.locks.release(self.shard, self.owner);
        }
    }
}

#[cfg(test)]
#[path = "kv_early_lock_tests.rs"]
mod tests;
