//! Early locks, the client's half: locking reads, the owner, and the release.
//!
//! # What
//! With [`TxnOptions::early_locks`](crate::TxnOptions::early_locks), [`Txn::get_for_update`]
//! and [`Txn::batch_get_for_update`] read their keys with a lock request
//! (`BatchGetRequest.lock`): the shard leader locks each key before it reads it, making the
//! request wait, in rank order, for a key another transaction holds (at most
//! [`TxnOptions::lock_wait`](crate::TxnOptions::lock_wait), capped at
//! `EARLY_LOCK_WAIT_MAX_MS`). See `meridian-server`'s `kv_early_lock` and
//! `docs/early-locking.md`.
//!
//! # The owner and its shards
//! One [`Client::txn`] call is one owner: a write id taken once and the transaction's rank,
//! the same on every attempt, so a retry keeps (and re-enters) the locks its earlier attempts
//! took. [`Locked`] remembers the shards it sent a locking read to, with a key of each
//! (noted before the request is sent: one that fails may have taken locks). A commit or
//! prepare that carries the owner (`CommitRequest.lock_owner`) releases the locks on its
//! shard once applied; a committed one-shard commit takes its shard off the list. When the
//! call ends, however it ends (even a dropped future, [`ReleaseOnDrop`]), `Kv.ReleaseLocks`
//! goes to every shard left (without waiting for the answer, at most [`RELEASE_TIMEOUT`]): a
//! read-only run, a give-up, an error, a shard the commit did not write, and every shard of a
//! multi-shard commit (a prepare settled by a recovery may not have released).
//!
//! # What the locks do not do
//! Nothing correct depends on them: every commit is checked as before. A lock lost to a
//! leader change, a senior's wound or an idle expiry on the server costs a retry at most. A
//! key read with a lock at a timestamp already chosen, which changed after it, ends the
//! attempt as an uncertain read does: the next attempt reads at that version, keeping its
//! locks.
//!
//! # Not done yet
//! - The client ignores `LockReply.wounded`: the server refuses a wounded owner's next
//!   commit on the shard, which ends the attempt as a conflict.
//! - Scans take no locks.
//!
//! [`Txn::get_for_update`]: crate::Txn::get_for_update
//! [`Txn::batch_get_for_update`]: crate::Txn::batch_get_for_update

use crate::client::{kv_client, request, Deadline, Route};
use crate::locks::LockPolicy;
use crate::routing::Routed;
use crate::snapshot::SnapRead;
use crate::{Client, Txn};
use bytes::Bytes;
use meridian_proto::kv as proto;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How long a `Kv.ReleaseLocks` may take; its answer is not awaited by the transaction.
pub const RELEASE_TIMEOUT: Duration = Duration::from_secs(1);

/// The shards a transaction holds early locks on (by shard id), with a key of each; shared
/// by all its attempts.
pub(crate) type Locked = Arc<Mutex<BTreeMap<u64, Bytes>>>;

/// A locking read's request and where to note the shards it locked on.
#[derive(Clone, Copy)]
pub(crate) struct Locking<'a> {
    pub request: &'a proto::LockRequest,
    pub locked: &'a Locked,
}

impl Locking<'_> {
    /// A locking read of `key` goes to `shard`.
    pub fn sent_to(&self, shard: u64, key: &Bytes) {
        lock(self.locked)
            .entry(shard)
            .or_insert_with(|| key.clone());
    }
}

fn lock(locked: &Locked) -> std::sync::MutexGuard<'_, BTreeMap<u64, Bytes>> {
    locked.lock().unwrap_or_else(|p| p.into_inner())
}

/// Sends `Kv.ReleaseLocks` for what is left in `locked` when dropped: at the end of a
/// [`Client::txn`] call, or when its future is dropped (a caller's timeout).
pub(crate) struct ReleaseOnDrop {
    pub client: Client,
    pub owner: Option<proto::WriteId>,
    pub locked: Locked,
}

impl Drop for ReleaseOnDrop {
    fn drop(&mut self) {
        if tokio::runtime::Handle::try_current().is_ok() {
            self.client.release_early_locks(self.owner, &self.locked);
        }
    }
}

/// A one-shard commit carrying the owner applied on `shard`: its locks there are released.
pub(crate) fn released_by_commit(locked: &Locked, shard: u64) {
    lock(locked).remove(&shard);
}

impl Txn {
    /// With early locks on, reads those of `keys` this attempt has neither written nor locked
    /// yet with a lock request, into the read set (a key read before is read again, at the
    /// same timestamp: a newer version of it ends the attempt as an uncertain read). Does
    /// nothing without early locks.
    pub(crate) async fn lock_keys(&mut self, keys: &[Bytes]) -> crate::Result<()> {
        let Some(lock) = self.early else {
            return Ok(());
        };
        let mut todo: Vec<Bytes> = keys
            .iter()
            .filter(|k| !self.writes.contains_key(*k) && !self.locked_keys.contains(*k))
            .cloned()
            .collect();
        todo.sort();
        todo.dedup();
        if todo.is_empty() {
            return Ok(());
        }
        let unread = todo.iter().filter(|k| !self.reads.contains_key(*k)).count();
        self.check_read_budget(unread)?;
        self.check_not_restarting()?;
        let locking = Locking {
            request: &lock,
            locked: &self.locked,
        };
        match self
            .client
            .batch_get_locking(&todo, Some(&mut self.snapshot), Some(locking))
            .await?
        {
            SnapRead::Done(found) => {
                for (key, read) in todo.into_iter().zip(found) {
                    self.reads
                        .insert(key.clone(), read.map(|v| (v.value, v.version_ts.0)));
                    self.locked_keys.insert(key);
                }
                Ok(())
            }
            SnapRead::Uncertain(version_ts) => Err(self.uncertain(version_ts)),
        }
    }
}

impl Client {
    /// Sends `Kv.ReleaseLocks` for `owner` to every shard left in `locked`, in the
    /// background.
    pub(crate) fn release_early_locks(&self, owner: Option<proto::WriteId>, locked: &Locked) {
        let shards = std::mem::take(&mut *lock(locked));
        for (_, key) in shards {
            let client = self.clone();
            let message = proto::ReleaseLocksRequest {
                owner,
                key: key.clone(),
                route: None,
            };
            self.spawn_background("release early locks", async move {
                let deadline = Deadline::after(RELEASE_TIMEOUT);
                let released = client
                    .call_with(
                        Route::Key(&key),
                        &deadline,
                        LockPolicy::Fail,
                        |channel, timeout, route| {
                            let message = message.routed(route);
                            async move {
                                kv_client(channel)
                                    .release_locks(request(message, timeout))
                                    .await
                                    .map(|r| r.into_inner().released)
                            }
                        },
                    )
                    .await;
                if let Err(e) = released {
                    tracing::debug!(error = %e, "releasing early locks failed; they expire");
                }
            });
        }
    }
}
