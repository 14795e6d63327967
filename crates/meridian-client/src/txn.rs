//! Optimistic transactions: [`Client::txn`] and [`Txn`].
//!
//! # How a transaction runs
//! Every read of an attempt is a *snapshot read* at one timestamp, `read_ts`, on whichever
//! shards it touches: the first read lets its node pick `read_ts` (that node's clock), every
//! later one sends it. A shard answers a snapshot read only once its state at `read_ts` is
//! final — no write at or below `read_ts` can still be applied there (see `meridian-server`'s
//! `kv_snapshot`) — so all the reads of an attempt see one consistent snapshot. Each read is
//! remembered with the version it returned (the *read set*); writes are buffered in the client
//! (the *write buffer*; reads of a key it wrote return the buffered value, scans merge the
//! buffer). Nothing is sent for a write until commit.
//!
//! - **Read-only**: nothing to commit. The reads were one snapshot, so the transaction is
//!   serializable at `read_ts` without a commit round.
//! - **With writes, one shard**: the client sends the read set with the writes to the shard
//!   (`Kv.Commit`), and the shard applies the writes only if every read still holds — each key
//!   still at the version read, each scanned range still holding exactly the rows read —
//!   checked inside its state machine at the commit's place in the Raft log. So a committed
//!   transaction behaves as if it ran entirely at that point: **serializable**.
//! - **With writes, several shards** (writes on more than one shard, or reads on a shard it
//!   does not write): a parallel commit (`txn_2pc`). Every participant checks its part of the
//!   read set at its prepare and *locks* it (write intents, read locks on keys and scanned
//!   ranges) until it is resolved, so what it checked still holds when the transaction commits,
//!   at one timestamp on every shard: serializable too. Readers and writers that meet a lock
//!   wait for it (see `locks`). Under
//!   [`Isolation::Snapshot`] only the reads of the keys it writes are sent (keys written
//!   without being read are read at the snapshot first): first committer wins on every
//!   written key, so no lost update, but two transactions that read the same keys and write
//!   different ones can both commit (write skew).
//! - **[`Txn::get_for_update`]** reads a key that the commit checks under either isolation,
//!   as if the transaction wrote it: under `Snapshot`, reading the keys a decision depends on
//!   with it rules out write skew over them (as `SELECT ... FOR UPDATE` does under
//!   PostgreSQL's repeatable read); under `Serializable` it is a plain `get`. By default it
//!   does not lock the key early: the check happens at commit (or prepare), like every other.
//!   With [`TxnOptions::early_locks`] it (and [`Txn::batch_get_for_update`]) also asks the
//!   shard leader for a best-effort lock as it reads, so contending transactions wait their
//!   turn instead of losing at commit and retrying (see `early_lock`); the commit is checked
//!   all the same.
//!
//! On a conflict the *whole closure* runs again with an empty read set and write buffer (never
//! a replay of the old writes) at a new snapshot, after a jittered backoff, up to
//! [`TxnOptions::max_attempts`] and the deadline.
//!
//! # Clock uncertainty and real time
//! `read_ts` comes from one node's clock, and another node's clock may be ahead by up to
//! `max_offset`: a write acknowledged before the transaction began can carry a timestamp
//! above `read_ts`. A shard that finds a version within that window of `read_ts` (narrowed
//! per node by the first clock reading the transaction took there) answers "uncertain"
//! instead; the attempt ends ([`Error::TxnUncertain`] from the read) and the next attempt
//! reads at that version's timestamp. So, as long as the nodes' clocks stay within
//! `max_offset` of each other, a transaction sees every write acknowledged before it began
//! (no stale reads). What skewed clocks still allow is a *causal reverse* across shards (as in
//! CockroachDB): two writes to different shards that both finished after the transaction
//! began, the second stamped below the first by a slower clock, can be seen in the wrong
//! order. With clocks in step (one host) the history is strictly serializable.
//!
//! [`TxnOptions::linearizable`] closes that gap at a price: the commit's answer is held
//! until the answering node's physical clock is `max_offset` past the commit timestamp (a
//! *commit-wait*, as in Spanner and CockroachDB's `--linearizable`), so every clock has
//! passed it and any transaction that begins afterwards gets a larger timestamp. A history
//! in which every transaction uses it is strictly serializable while clocks stay within
//! `max_offset`. A read-only transaction with the option waits too, on its read
//! timestamp (`Kv.CommitWait`): a write is readable once applied, before its own wait ends,
//! and a reader that saw it and returned at once would let a transaction begun after it be
//! stamped below the write. Plain `put`/`delete`/`batch_put` never wait. In a multi-shard
//! commit each participant waits on its own prepare timestamp, so the one that set the commit
//! timestamp waits on it; a commit settled by a recovery waits with `Kv.CommitWait`.
//!
//! # What the closure may see
//! One attempt's reads are one snapshot, but an attempt that writes may still fail its commit
//! check, and an attempt can end at an uncertain read. The closure must not act on what it
//! read outside Meridian (print, send, write elsewhere) before [`Client::txn`] returns; the
//! value it returns is handed back only once the attempt committed. An error the closure
//! returns from an attempt that ended uncertain is dropped and the attempt runs again.
//!
//! # Limits and errors
//! - A one-shard commit is one Raft entry; a multi-shard one is acknowledged after one round
//!   (a prepare on every participant, in parallel), and the record's explicit commit and the
//!   participants' resolution follow the acknowledgement.
//! - A read that meets another transaction's lock waits for it to be resolved and reads again
//!   (see `locks`); the shard then counts the resolved version as uncertain if its commit
//!   timestamp is within the window (see `meridian-server`'s `kv_snapshot`).
//! - At most `MAX_BATCH_KEYS` writes of `MAX_BATCH_BYTES`, `MAX_TXN_READ_KEYS` keys read
//!   (counting scanned rows) and `MAX_TXN_RANGES` scanned ranges per shard: beyond them the
//!   call fails with [`Error::InvalidArgument`] and nothing is written.
//! - A commit whose outcome is unknown (the write call ended after an attempt that may have
//!   reached Raft) is [`Error::Ambiguous`], never retried as a new attempt: the commit carries
//!   a write id, so its own retries are deduplicated, but re-running the closure could apply
//!   the transaction twice.

use crate::client::Route;
use crate::early_lock::{released_by_commit, Locked, ReleaseOnDrop};
use crate::error::{Error, Result};
use crate::locks::LockPolicy;
use crate::snapshot::{SnapRead, SnapshotState};
use crate::txn_commit::{first_send, outcome, plan, send_commit, CommitParts, Plan, ScannedRange};
use crate::{validate, Client, KeyValue};
use bytes::Bytes;
use meridian_proto::kv as proto;
use meridian_types::limits::{
    DEFAULT_TXN_MAX_ATTEMPTS, EARLY_LOCK_WAIT_MAX_MS, MAX_BATCH_BYTES, MAX_BATCH_KEYS,
    MAX_SCAN_LIMIT, MAX_TXN_READ_KEYS,
};
use meridian_types::{Timestamp, TxnPriority, TxnRank};
use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, Instant};

/// Most times a commit regroups its checks after `WRONG_SHARD` (a stale shard map).
const MAX_REGROUPS: u32 = 3;

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

/// One attempt of a transaction: its read set and write buffer. See the
/// [module docs](crate::txn).
pub struct Txn {
    pub(crate) client: Client,
    /// Every key read, with what it read: `None` = absent.
    pub(crate) reads: BTreeMap<Bytes, Option<(Bytes, u64)>>,
    ranges: Vec<ScannedRange>,
    /// Keys read with [`Txn::get_for_update`]: checked at commit under either isolation.
    for_update: BTreeSet<Bytes>,
    /// The write buffer: `None` = delete.
    pub(crate) writes: BTreeMap<Bytes, Option<Bytes>>,
    write_bytes: usize,
    /// The attempt's snapshot timestamp and the transaction's clock readings.
    pub(crate) snapshot: SnapshotState,
    /// Set when a read was uncertain: the attempt is over, and the next one reads here.
    restart: Option<Timestamp>,
    isolation: Isolation,
    /// The transaction's rank in lock conflicts (kept across attempts), and whether this
    /// attempt's prepares follow wound-wait rather than fail at once (see
    /// [`TxnOptions::priority`]).
    rank: TxnRank,
    wound_wait: bool,
    /// [`TxnOptions::linearizable`].
    commit_wait: bool,
    /// With [`TxnOptions::early_locks`]: the lock request of every locking read (the owner is
    /// the same on every attempt), the shards locked (shared by the attempts), and the keys
    /// locked in this attempt.
    pub(crate) early: Option<proto::LockRequest>,
    pub(crate) locked: Locked,
    pub(crate) locked_keys: BTreeSet<Bytes>,
}

/// The closure type of [`Client::txn`]: it borrows the attempt's [`Txn`] for the future it
/// returns (`|txn| Box::pin(async move { ... })`). The future may borrow only the `Txn`:
/// anything else it uses it must own (clone an `Arc` or the values into it per attempt).
pub type TxnBody<'a, T, E> = Pin<Box<dyn Future<Output = std::result::Result<T, E>> + Send + 'a>>;

impl Client {
    /// Runs `body` as a serializable transaction, re-running it on conflicts (see the
    /// [module docs](crate::txn)). Returns what the committed attempt returned.
    ///
    /// ```no_run
    /// # async fn example(client: meridian_client::Client) -> Result<(), meridian_client::Error> {
    /// use meridian_client::TxnOptions;
    /// let (moved, info) = client
    ///     .txn(TxnOptions::default(), |txn| {
    ///         Box::pin(async move {
    ///             let a: i64 = txn.get_str("acct/a").await?.parse().unwrap_or(0);
    ///             let b: i64 = txn.get_str("acct/b").await?.parse().unwrap_or(0);
    ///             txn.put("acct/a", (a - 10).to_string())?;
    ///             txn.put("acct/b", (b + 10).to_string())?;
    ///             Ok::<_, meridian_client::Error>(10)
    ///         })
    ///     })
    ///     .await?;
    /// println!("moved {moved} at {:?} after {} attempts", info.commit_ts, info.attempts);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn txn<T, E, F>(
        &self,
        options: TxnOptions,
        body: F,
    ) -> std::result::Result<(T, CommitInfo), E>
    where
        F: for<'a> FnMut(&'a mut Txn) -> TxnBody<'a, T, E>,
        E: From<Error>,
    {
        // The transaction's age: its first attempt's, on every attempt (see `priority`).
        let rank = TxnRank::new(options.priority, wall_ts());
        let early = options.early_locks.then(|| proto::LockRequest {
            owner: Some(self.next_write_id()),
            priority: rank.priority,
            age_ts: rank.age_ts,
            wait_ms: options.lock_wait.as_millis().min(u128::from(u32::MAX)) as u32,
        });
        let locked = Locked::default();
        // Releases what is left when the call ends, however it ends (even dropped).
        let _release = early.as_ref().map(|e| ReleaseOnDrop {
            client: self.clone(),
            owner: e.owner,
            locked: locked.clone(),
        });
        self.txn_attempts(options, body, rank, early, locked).await
    }

    async fn txn_attempts<T, E, F>(
        &self,
        options: TxnOptions,
        mut body: F,
        rank: TxnRank,
        early: Option<proto::LockRequest>,
        locked: Locked,
    ) -> std::result::Result<(T, CommitInfo), E>
    where
        F: for<'a> FnMut(&'a mut Txn) -> TxnBody<'a, T, E>,
        E: From<Error>,
    {
        let budget = options.deadline.unwrap_or(self.config().call_timeout);
        let give_up = Instant::now() + budget;
        let mut backoff = crate::backoff::Backoff::new(
            options.backoff_initial,
            options.backoff_max.max(options.backoff_initial),
        );
        let mut attempt = 0u32;
        let mut snapshot = SnapshotState::default();
        loop {
            attempt += 1;
            if self.config().timestamp_oracle && snapshot.read_ts.is_none() {
                snapshot.read_ts = Some(self.oracle_timestamp().await?);
            }
            let mut txn = self.begin_at(snapshot, options.isolation);
            txn.rank = rank;
            txn.wound_wait = !options.no_wait && attempt >= WOUND_WAIT_FROM_ATTEMPT;
            txn.commit_wait = options.linearizable;
            txn.early = early;
            txn.locked = locked.clone();
            let value = body(&mut txn).await;
            snapshot = txn.snapshot.clone();
            if let Some(version_ts) = txn.restart {
                // The attempt ended at an uncertain read (whatever the closure made of it):
                // run it again at that version's timestamp, without backoff.
                if attempt >= options.max_attempts.max(1) || Instant::now() >= give_up {
                    return Err(Error::TxnUncertain { version_ts }.into());
                }
                tracing::debug!(attempt, %version_ts, "uncertain read; running the transaction again");
                snapshot = snapshot.next_attempt(Some(version_ts));
                continue;
            }
            let value = value?;
            snapshot = snapshot.next_attempt(None);
            match txn.commit().await {
                Ok(commit_ts) => {
                    return Ok((
                        value,
                        CommitInfo {
                            commit_ts,
                            attempts: attempt,
                        },
                    ))
                }
                Err(conflict @ Error::TxnConflict { .. }) => {
                    let delay = self.jittered(&mut backoff);
                    if attempt >= options.max_attempts.max(1) || Instant::now() + delay >= give_up {
                        return Err(conflict.into());
                    }
                    tracing::debug!(attempt, %conflict, "transaction conflict; running it again");
                    tokio::time::sleep(delay).await;
                }
                // A blind write's key, read at commit under snapshot isolation, was
                // uncertain: as for an uncertain read in the closure.
                Err(Error::TxnUncertain { version_ts })
                    if attempt < options.max_attempts.max(1) && Instant::now() < give_up =>
                {
                    snapshot = snapshot.next_attempt(Some(version_ts));
                }
                Err(other) => return Err(other.into()),
            }
        }
    }

    /// Starts one transaction attempt by hand; [`Txn::commit`] ends it. [`Client::txn`] is
    /// usually what you want: it re-runs the attempt on conflicts.
    pub fn begin(&self) -> Txn {
        self.begin_with(Isolation::Serializable)
    }

    /// [`Client::begin`] at another isolation level.
    pub fn begin_with(&self, isolation: Isolation) -> Txn {
        self.begin_at(SnapshotState::default(), isolation)
    }

    fn begin_at(&self, snapshot: SnapshotState, isolation: Isolation) -> Txn {
        Txn {
            client: self.clone(),
            reads: BTreeMap::new(),
            ranges: Vec::new(),
            for_update: BTreeSet::new(),
            writes: BTreeMap::new(),
            write_bytes: 0,
            snapshot,
            restart: None,
            isolation,
            rank: TxnRank::new(TxnPriority::Normal, wall_ts()),
            wound_wait: false,
            commit_wait: false,
            early: None,
            locked: Locked::default(),
            locked_keys: BTreeSet::new(),
        }
    }
}

impl Txn {
    /// Reads `key`: this transaction's own write if it wrote it, else the value it read
    /// before, else a snapshot read (remembered for the commit check).
    pub async fn get(&mut self, key: impl Into<Bytes>) -> Result<Option<Bytes>> {
        let key: Bytes = key.into();
        validate::key(&key)?;
        if let Some(written) = self.writes.get(&key) {
            return Ok(written.clone());
        }
        if let Some(read) = self.reads.get(&key) {
            return Ok(read.as_ref().map(|(value, _)| value.clone()));
        }
        self.check_read_budget(1)?;
        self.read_keys(vec![key.clone()]).await?;
        let read = self.reads.get(&key).cloned().flatten();
        Ok(read.map(|(value, _)| value))
    }

    /// [`Txn::get`], and the commit checks that `key` still holds what this transaction read
    /// of it under either isolation, as it checks a key it writes: under
    /// [`Isolation::Snapshot`] this rules out write skew over the keys read this way. Under
    /// `Snapshot` a key this transaction wrote before reading it is checked at its snapshot
    /// version, as every written key is; under `Serializable` such a key is not checked (its
    /// value here is this transaction's own write, which depends on no one). Nothing
    /// is locked before the commit, and a transaction that writes nothing commits nothing,
    /// so there it is a plain `get` (its reads are one snapshot either way), unless
    /// [`TxnOptions::early_locks`] is set: then the key, unless this transaction wrote it,
    /// is read again with an early lock if it was not locked yet in this attempt (see
    /// `early_lock`).
    pub async fn get_for_update(&mut self, key: impl Into<Bytes>) -> Result<Option<Bytes>> {
        let key: Bytes = key.into();
        validate::key(&key)?;
        self.lock_keys(std::slice::from_ref(&key)).await?;
        let value = self.get(key.clone()).await?;
        self.for_update.insert(key);
        Ok(value)
    }

    /// Snapshot-reads `keys` (sorted, not yet read) into the read set.
    pub(crate) async fn read_keys(&mut self, keys: Vec<Bytes>) -> Result<()> {
        self.check_not_restarting()?;
        match self
            .client
            .batch_get_at(&keys, Some(&mut self.snapshot))
            .await?
        {
            SnapRead::Done(found) => {
                for (key, read) in keys.into_iter().zip(found) {
                    self.reads
                        .insert(key, read.map(|v| (v.value, v.version_ts.0)));
                }
                Ok(())
            }
            SnapRead::Uncertain(version_ts) => Err(self.uncertain(version_ts)),
        }
    }

    /// Ends the attempt at an uncertain read of a version at `version_ts`.
    pub(crate) fn uncertain(&mut self, version_ts: Timestamp) -> Error {
        self.restart = Some(self.restart.map_or(version_ts, |t| t.max(version_ts)));
        Error::TxnUncertain { version_ts }
    }

    pub(crate) fn check_not_restarting(&self) -> Result<()> {
        match self.restart {
            Some(version_ts) => Err(Error::TxnUncertain { version_ts }),
            None => Ok(()),
        }
    }

    /// [`Txn::get`] for many keys at once (in input order): the keys not yet read are read
    /// with one `BatchGet` per shard, the shards concurrently.
    pub async fn batch_get<K: Into<Bytes>>(
        &mut self,
        keys: impl IntoIterator<Item = K>,
    ) -> Result<Vec<Option<Bytes>>> {
        let keys: Vec<Bytes> = keys.into_iter().map(Into::into).collect();
        let mut missing: Vec<Bytes> = keys
            .iter()
            .filter(|k| !self.writes.contains_key(*k) && !self.reads.contains_key(*k))
            .cloned()
            .collect();
        missing.sort();
        missing.dedup();
        if !missing.is_empty() {
            self.check_read_budget(missing.len())?;
            self.read_keys(missing).await?;
        }
        let mut out = Vec::with_capacity(keys.len());
        for key in keys {
            out.push(self.get(key).await?);
        }
        Ok(out)
    }

    /// [`Txn::batch_get`], and every key is read for update as by [`Txn::get_for_update`]:
    /// with [`TxnOptions::early_locks`], one locking `BatchGet` per shard.
    pub async fn batch_get_for_update<K: Into<Bytes>>(
        &mut self,
        keys: impl IntoIterator<Item = K>,
    ) -> Result<Vec<Option<Bytes>>> {
        let keys: Vec<Bytes> = keys.into_iter().map(Into::into).collect();
        for key in &keys {
            validate::key(key)?;
        }
        self.lock_keys(&keys).await?;
        let values = self.batch_get(keys.iter().cloned()).await?;
        self.for_update.extend(keys);
        Ok(values)
    }

    /// [`Txn::get`] as UTF-8 text, absent as the empty string.
    pub async fn get_str(&mut self, key: impl Into<Bytes>) -> Result<String> {
        let value = self.get(key).await?.unwrap_or_default();
        String::from_utf8(value.to_vec()).map_err(|_| Error::invalid("the value is not UTF-8 text"))
    }

    /// The live keys of `[start, end)` (`end = None`: to the end of the keyspace), ascending,
    /// at most `limit`, with this transaction's own writes merged in. The range read is
    /// remembered: a key inserted into it, removed from it or changed before the commit is a
    /// conflict (no phantoms). Rows of keys this transaction wrote carry version 0.
    pub async fn scan(
        &mut self,
        start: impl Into<Bytes>,
        end: Option<Bytes>,
        limit: u32,
    ) -> Result<Vec<KeyValue>> {
        let start: Bytes = start.into();
        validate::scan(&start, end.as_deref(), limit)?;
        let inside = |key: &Bytes| *key >= start && end.as_ref().is_none_or(|e| key < e);
        // Each buffered delete may hide one stored row: fetch that many more.
        let hidden = self
            .writes
            .iter()
            .filter(|(k, v)| v.is_none() && inside(k))
            .count() as u32;
        let fetch = limit.saturating_add(hidden);
        if fetch > MAX_SCAN_LIMIT {
            return Err(Error::invalid(format!(
                "scan limit {limit} plus {hidden} keys deleted in this transaction is over MAX_SCAN_LIMIT ({MAX_SCAN_LIMIT})"
            )));
        }
        self.check_read_budget(fetch as usize)?;
        self.check_not_restarting()?;
        let stored = match self
            .client
            .scan_pages(
                start.clone(),
                end.clone(),
                fetch,
                false,
                Some(&mut self.snapshot),
                None,
            )
            .await?
        {
            SnapRead::Done(rows) => rows,
            SnapRead::Uncertain(version_ts) => return Err(self.uncertain(version_ts)),
        };
        // What the read covers: all of the range, or (when the scan filled) up to its last row.
        let covered_end = match stored.last() {
            Some(last) if stored.len() as u32 == fetch => {
                let mut after = last.key.to_vec();
                after.push(0);
                Some(Bytes::from(after))
            }
            _ => end.clone(),
        };
        self.ranges.push(ScannedRange {
            start: start.clone(),
            end: covered_end.clone(),
            rows: stored
                .iter()
                .map(|row| (row.key.clone(), row.version_ts.0))
                .collect(),
        });
        let covered = |key: &Bytes| inside(key) && covered_end.as_ref().is_none_or(|e| key < e);
        let mut merged: BTreeMap<Bytes, KeyValue> = stored
            .into_iter()
            .map(|row| (row.key.clone(), row))
            .collect();
        for (key, write) in self.writes.iter().filter(|(k, _)| covered(k)) {
            match write {
                Some(value) => {
                    merged.insert(
                        key.clone(),
                        KeyValue {
                            key: key.clone(),
                            value: value.clone(),
                            version_ts: Timestamp(0),
                        },
                    );
                }
                None => {
                    merged.remove(key);
                }
            }
        }
        Ok(merged.into_values().take(limit as usize).collect())
    }

    /// Buffers a write of `value` under `key` (sent at commit).
    pub fn put(&mut self, key: impl Into<Bytes>, value: impl Into<Bytes>) -> Result<()> {
        let value: Bytes = value.into();
        validate::value(&value)?;
        self.buffer(key.into(), Some(value))
    }

    /// Buffers a delete of `key` (sent at commit).
    pub fn delete(&mut self, key: impl Into<Bytes>) -> Result<()> {
        self.buffer(key.into(), None)
    }

    fn buffer(&mut self, key: Bytes, value: Option<Bytes>) -> Result<()> {
        validate::key(&key)?;
        let size = |k: &Bytes, v: &Option<Bytes>| k.len() + v.as_ref().map_or(0, |v| v.len());
        let new_size = size(&key, &value);
        let old_size = self.writes.get(&key).map_or(0, |old| size(&key, old));
        let bytes = self.write_bytes - old_size + new_size;
        if bytes > MAX_BATCH_BYTES {
            return Err(Error::invalid(format!(
                "the transaction's writes would be {bytes} bytes, over MAX_BATCH_BYTES ({MAX_BATCH_BYTES})"
            )));
        }
        if !self.writes.contains_key(&key) && self.writes.len() >= MAX_BATCH_KEYS {
            return Err(Error::invalid(format!(
                "the transaction writes more than MAX_BATCH_KEYS ({MAX_BATCH_KEYS}) keys"
            )));
        }
        self.write_bytes = bytes;
        self.writes.insert(key, value);
        Ok(())
    }

    pub(crate) fn check_read_budget(&self, more: usize) -> Result<()> {
        let read = self.reads.len() + self.ranges.iter().map(|r| r.rows.len()).sum::<usize>();
        if read + more > MAX_TXN_READ_KEYS {
            return Err(Error::invalid(format!(
                "the transaction would read more than MAX_TXN_READ_KEYS ({MAX_TXN_READ_KEYS}) keys"
            )));
        }
        Ok(())
    }

    /// Commits this attempt: `Ok(Some(commit_ts))` after writes, `Ok(None)` for a read-only
    /// transaction (its reads were one snapshot: nothing to check), [`Error::TxnConflict`] if
    /// a read no longer held and [`Error::TxnUncertain`] if a read was uncertain (nothing was
    /// written in either case; run the transaction again).
    pub async fn commit(mut self) -> Result<Option<Timestamp>> {
        self.check_not_restarting()?;
        if self.writes.is_empty() {
            let read = !self.reads.is_empty() || !self.ranges.is_empty();
            if let Some(read_ts) = self.snapshot.read_ts.filter(|_| self.commit_wait && read) {
                // It may have read a write whose own commit-wait is still running: it must
                // not return (and let later transactions be stamped below) before that ends.
                self.client
                    .commit_wait(read_ts.0, &self.client.deadline())
                    .await?;
            }
            return Ok(None);
        }
        if self.isolation == Isolation::Snapshot {
            // First committer wins on every written key (and every key read for update):
            // read the ones not yet read (at the snapshot) so the commit can check them too.
            let mut blind: Vec<Bytes> = self
                .writes
                .keys()
                .chain(&self.for_update)
                .filter(|k| !self.reads.contains_key(*k))
                .cloned()
                .collect();
            blind.sort();
            blind.dedup();
            if !blind.is_empty() {
                self.read_keys(blind).await?;
            }
        }
        let mut regroups = 0;
        loop {
            match self.commit_writes().await {
                Err(Error::WrongShard { .. }) if regroups < MAX_REGROUPS => {
                    regroups += 1;
                    self.client.refresh_shard_map().await?;
                }
                other => return other.map(Some),
            }
        }
    }

    /// The attempt's start timestamp, which GC compares with its thresholds (see
    /// `meridian-raft`'s `locks`): its read timestamp, or for an attempt that read nothing, this
    /// machine's clock.
    fn start_ts(&self) -> u64 {
        match self.snapshot.read_ts {
            Some(ts) => ts.0,
            None => wall_ts(),
        }
    }

    /// With writes: one `Kv.Commit` with a write id if one shard holds everything, else
    /// parallel commit (`txn_2pc`).
    async fn commit_writes(&self) -> Result<Timestamp> {
        let parts = CommitParts {
            reads: &self.reads,
            ranges: &self.ranges,
            for_update: &self.for_update,
            writes: &self.writes,
            isolation: self.isolation,
            write_id: self.client.next_write_id(),
        };
        let txn_id = parts.write_id;
        // The cached map's lock is held for this statement only, never across an await.
        let plan = plan(&self.client.state().map, parts)?;
        match plan {
            Plan::One(shard, mut message) => {
                message.commit_wait = self.commit_wait;
                message.lock_owner = self.early.as_ref().and_then(|e| e.owner);
                let deadline = self.client.deadline();
                // Holding no locks of its own, a one-shard commit waits other transactions'
                // locks out like any write.
                let mut first = true;
                let response = self
                    .client
                    .write_call(Route::Shard(shard), &deadline, |channel, timeout, route| {
                        send_commit(channel, timeout, first_send(&message, route, &mut first))
                    })
                    .await?;
                let committed = outcome(response)?;
                released_by_commit(&self.locked, shard);
                Ok(committed)
            }
            Plan::Many { mut groups, anchor } => {
                // Each applied prepare releases the owner's locks on its shard; the shards stay
                // in `locked` all the same (a prepare settled by a recovery may not have
                // applied), so the call's end releases them again, for nothing at worst.
                let owner = self.early.as_ref().and_then(|e| e.owner);
                groups.values_mut().for_each(|m| m.lock_owner = owner);
                let txn = (txn_id, self.start_ts());
                let locks = match self.wound_wait {
                    true => LockPolicy::WoundWait(txn_id, self.rank),
                    false => LockPolicy::Fail,
                };
                let rules = crate::txn_2pc::Rules {
                    rank: self.rank,
                    locks,
                    commit_wait: self.commit_wait,
                };
                crate::txn_2pc::commit(&self.client, txn, rules, anchor, groups).await
            }
        }
    }
}

/// This machine's clock as an HLC timestamp (logical part 0).
fn wall_ts() -> u64 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_millis() as u64);
    Timestamp::from_physical_ms(now).0
}
