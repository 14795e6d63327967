//! The options of [`Client::txn`](crate::Client::txn) and what it reports: [`Isolation`],
//! [`TxnOptions`], [`WOUND_WAIT_FROM_ATTEMPT`] and [`CommitInfo`].

use meridian_types::limits::{DEFAULT_TXN_MAX_ATTEMPTS, EARLY_LOCK_WAIT_MAX_MS};
use meridian_types::{Timestamp, TxnPriority};
use std::time::Duration;

/// What a transaction that writes is checked for at commit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Isolation {
    /// Every read and scanned range must still hold: no lost update, no write skew, no
    /// phantom.
    #[default]
    Serializable,
    /// Only the keys it writes must be unchanged since its snapshot (first committer wins): no
    /// lost update, but *write skew* is possible — two transactions that read overlapping keys
    /// and write different ones can both commit.
    Snapshot,
}

/// How [`Client::txn`] retries.
///
/// [`Client::txn`]: crate::Client::txn
#[derive(Clone, Debug)]
pub struct TxnOptions {
    /// What a transaction that writes is checked for (read-only ones read one snapshot either
    /// way).
    pub isolation: Isolation,
    /// Most attempts (runs of the closure); the last conflict is returned after them.
    pub max_attempts: u32,
    /// No new attempt starts once this much time has passed since the call began (`None`: the
    /// client's `call_timeout`). An attempt already running is not cut short: each of its
    /// reads and its commit has the client's own per-call deadline.
    pub deadline: Option<Duration>,
    /// Delay before the second attempt; it doubles per conflict up to `backoff_max`, each
    /// delay jittered over its upper half. Short by default: the transaction that won the
    /// conflict has already committed, so the next attempt usually reads its result.
    pub backoff_initial: Duration,
    pub backoff_max: Duration,
    /// Who gives way in a lock conflict between multi-shard commits from the
    /// [`WOUND_WAIT_FROM_ATTEMPT`]th attempt on (*wound-wait*, see `locks`): a higher
    /// priority wins; within a priority the transaction whose first attempt began earlier
    /// wins, and it keeps that age across attempts, so a transaction that keeps losing
    /// eventually wins. Earlier attempts fail at once on a lock, like `no_wait`: wounding
    /// costs a recovery, more than a retry under ordinary contention.
    pub priority: TxnPriority,
    /// Every attempt's multi-shard commit fails at once when it meets another
    /// transaction's lock (a conflict: the closure runs again after the backoff), never
    /// wounding or waiting. Off by default: without wound-wait a large transaction can lose
    /// every attempt to a stream of small ones.
    pub no_wait: bool,
    /// Commit-wait: the commit is acknowledged only once every node's clock (within
    /// `max_offset` of the others) has passed its commit timestamp, so any transaction that
    /// begins after this one returned — through any node, on any shard — commits at a larger
    /// timestamp. This rules out the *causal reverse* across shards that skewed clocks
    /// otherwise allow (see the [module docs](crate::txn)); a history where every
    /// transaction sets it is strictly serializable. It costs each writing commit between
    /// `max_offset` and `2 x max_offset` of latency (500–1,000 ms at the default), during
    /// which its locks are held; a read-only transaction that read anything waits about
    /// `max_offset` on its read timestamp. Off by default.
    pub linearizable: bool,
    /// [`Txn::get_for_update`] and [`Txn::batch_get_for_update`] take early locks: the shard
    /// leader locks the keys as it reads them, in memory, until this transaction's commit
    /// applies there (or it ends, or is idle for `EARLY_LOCK_IDLE_MS`). A transaction that
    /// finds a key locked waits for it, in rank order (see `priority`), at most `lock_wait`;
    /// then it reads unlocked. Best effort: correctness never depends on the locks (every
    /// commit is still checked), they only turn lost races on hot keys into waits. Off by
    /// default.
    ///
    /// [`Txn::get_for_update`]: crate::Txn::get_for_update
    /// [`Txn::batch_get_for_update`]: crate::Txn::batch_get_for_update
    pub early_locks: bool,
    /// Longest one locking read waits for locks others hold (capped by the server at
    /// `EARLY_LOCK_WAIT_MAX_MS`).
    pub lock_wait: Duration,
}

/// The first attempt of a transaction whose multi-shard commit follows wound-wait (see
/// [`TxnOptions::priority`]); earlier attempts fail at once on a lock.
pub const WOUND_WAIT_FROM_ATTEMPT: u32 = 3;

impl Default for TxnOptions {
    fn default() -> TxnOptions {
        TxnOptions {
            isolation: Isolation::Serializable,
            max_attempts: DEFAULT_TXN_MAX_ATTEMPTS,
            deadline: None,
            backoff_initial: Duration::from_millis(2),
            backoff_max: Duration::from_millis(100),
            priority: TxnPriority::Normal,
            no_wait: false,
            linearizable: false,
            early_locks: false,
            lock_wait: Duration::from_millis(EARLY_LOCK_WAIT_MAX_MS),
        }
    }
}

/// What a committed transaction did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CommitInfo {
    /// The commit timestamp of its writes; `None` for a read-only transaction.
    pub commit_ts: Option<Timestamp>,
    /// How many times the closure ran (1 = committed at the first attempt).
    pub attempts: u32,
}
