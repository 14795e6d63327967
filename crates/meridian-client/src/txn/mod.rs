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

mod options;
mod run;

pub use options::{CommitInfo, Isolation, TxnOptions, WOUND_WAIT_FROM_ATTEMPT};
pub use run::TxnBody;

use crate::client::Route;
use crate::early_lock::{released_by_commit, Locked};
use crate::error::{Error, Result};
use crate::locks::LockPolicy;
use crate::snapshot::{SnapRead, SnapshotState};
use crate::txn_commit::{first_send, outcome, plan, send_commit, CommitParts, Plan, ScannedRange};
use crate::{validate, Client, KeyValue};
use bytes::Bytes;
use meridian_proto::kv as proto;
use meridian_types::limits::{MAX_BATCH_BYTES, MAX_BATCH_KEYS, MAX_SCAN_LIMIT, MAX_TXN_READ_KEYS};
use meridian_types::{Timestamp, TxnRank};
use std::collections::{BTreeMap, BTreeSet};

/// Most times a commit regroups its checks after `WRONG_SHARD` (a stale shard map).
const MAX_REGROUPS: u32 = 3;

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
