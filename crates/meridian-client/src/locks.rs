//! Waiting out other transactions' locks, and resolving the locks whose coordinator is gone.
//!
//! A multi-shard transaction holds *prepared locks* between its prepare and its resolution
//! (see `txn_2pc` and `meridian-raft`'s `locks`). A request that meets one gets `LOCKED` with
//! the lock and did nothing. The retry loop (`Client::call_with`) then:
//!
//! - polls: backs off briefly ([`LOCK_POLL_INITIAL`] doubling to [`LOCK_POLL_MAX`], not the
//!   call's own backoff) and sends the request again — a live coordinator resolves its locks
//!   within a few consensus rounds;
//! - after [`LOCK_RECOVER_AFTER`] of meeting the same transaction's locks, *recovers* it (see
//!   `txn_recover`: the transaction ends committed if every participant had prepared, aborted
//!   otherwise, and the anchor's Raft log orders that against the coordinator's own decision),
//!   then resolves the lock it met as the recovery settled it. A recovery can abort a slow but
//!   live coordinator's transaction before its last prepare lands; its commit then fails as a
//!   conflict and it runs again. Never the other way round: nothing committed is undone.
//!
//! Lock waits do not count against `max_attempts`; the call's deadline bounds them.
//!
//! Three policies:
//! - reads (snapshot reads included), writes and one-shard commits hold no locks of their
//!   own: they wait and retry ([`LockPolicy::Wait`]);
//! - a prepare holds the locks of its transaction's other prepares, so waiting could
//!   deadlock; from its transaction's third attempt on (`WOUND_WAIT_FROM_ATTEMPT`) it
//!   follows **wound-wait** ([`LockPolicy::WoundWait`], see
//!   `meridian_types::txn_rank`): it *wounds* a holder it outranks — recovers the holder's
//!   transaction at once, which aborts it unless every participant had prepared already (then
//!   it is committed and resolved), resolves the lock and sends the prepare again — and waits
//!   for a holder that outranks it, as above. Waits go only from junior to senior, so none
//!   form a cycle. A transaction keeps its rank across attempts, so a loser grows senior;
//! - resolves, the prepares of a transaction's first two attempts, and those of transactions
//!   run with [`TxnOptions::no_wait`], fail at once ([`LockPolicy::Fail`]); such a
//!   transaction aborts and runs again after a backoff. Under ordinary contention that is
//!   cheaper than wounding (a recovery: several consensus rounds), and a transaction that
//!   keeps losing switches to wound-wait.
//!
//! [`TxnOptions::no_wait`]: crate::TxnOptions::no_wait

use crate::backoff::Backoff;
use crate::client::{kv_client, request, Deadline, Route};
use crate::error::{Error, LockInfo, Result};
use crate::routing::Routed;
use crate::txn_recover::Settled;
use crate::Client;
use bytes::Bytes;
use meridian_proto::kv::{self as proto, resolve_request};
use meridian_types::TxnRank;
use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, Instant};

/// How long the same transaction's locks are waited for before recovering it.
pub const LOCK_RECOVER_AFTER: Duration = Duration::from_millis(1_000);
/// First and longest pause between polls of a lock.
pub const LOCK_POLL_INITIAL: Duration = Duration::from_millis(1);
pub const LOCK_POLL_MAX: Duration = Duration::from_millis(50);

/// What the retry loop does on `LOCKED`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LockPolicy {
    /// Wait the lock out, then send the request again.
    Wait,
    /// Fail at once.
    Fail,
    /// A prepare of this transaction (its id and rank): wound a holder it outranks, wait for
    /// one that outranks it (see the module docs).
    WoundWait(proto::WriteId, TxnRank),
}

impl LockPolicy {
    /// True if this policy wounds the holder of `lock` rather than waiting for it.
    fn wounds(self, lock: &LockInfo) -> bool {
        match self {
            LockPolicy::WoundWait(me, rank) => rank.is_senior_to(
                (me.client_id, me.seq),
                lock.rank,
                (lock.txn.client_id, lock.txn.seq),
            ),
            LockPolicy::Wait | LockPolicy::Fail => false,
        }
    }
}

/// One call's waiting on locks.
pub(crate) struct LockWait {
    /// The transaction whose locks are being waited for, since when.
    waiting_for: Option<(proto::WriteId, Instant)>,
    /// The last transaction this call wounded: met again right after, it is waited for.
    wounded: Option<proto::WriteId>,
    poll: Backoff,
}

impl LockWait {
    pub(crate) fn new() -> LockWait {
        LockWait {
            waiting_for: None,
            wounded: None,
            poll: Backoff::new(LOCK_POLL_INITIAL, LOCK_POLL_MAX),
        }
    }

    /// Notes that `lock` was met now; true when its transaction is due for recovery.
    fn due(&mut self, lock: &LockInfo) -> bool {
        match &self.waiting_for {
            Some((txn, since)) if *txn == lock.txn => since.elapsed() >= LOCK_RECOVER_AFTER,
            _ => {
                self.waiting_for = Some((lock.txn, Instant::now()));
                false
            }
        }
    }
}

/// The decision sent by a [`Client::resolve_txn`] (see `meridian-raft`'s `locks`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Resolution {
    Commit(u64),
    Abort,
    /// Anchor only, after a successful `Prevent`: abort even a staging record.
    AbortStaging,
    /// Not the anchor: report this shard's prepare, or make sure it never happens.
    Prevent,
    /// Anchor only, once every other participant is resolved as committed: the record may
    /// be collected (see `meridian-raft`'s `locks`).
    Finish,
}

impl Client {
    /// Handles one `LOCKED` answer inside the retry loop under `policy` (not `Fail`): wounds
    /// the holder if `policy` outranks it, else recovers the holder's transaction if due and
    /// sleeps one poll (or fails with `DeadlineExceeded` if the deadline is nearer).
    pub(crate) async fn wait_for_lock(
        &self,
        wait: &mut LockWait,
        lock: &LockInfo,
        policy: LockPolicy,
        deadline: &Deadline,
    ) -> Result<()> {
        if policy.wounds(lock) && wait.wounded != Some(lock.txn) {
            wait.wounded = Some(lock.txn);
            tracing::debug!(txn = ?lock.txn, key = ?lock.key, "wounding a junior transaction's lock");
            match self.recover_lock(lock, deadline).await {
                // Its lock is resolved: send the request again at once.
                Ok(()) => {
                    self.note_wound();
                    return Ok(());
                }
                Err(error) => tracing::debug!(%error, "wounding failed; waiting instead"),
            }
        }
        if wait.due(lock) {
            tracing::info!(txn = ?lock.txn, key = ?lock.key, "recovering a transaction whose lock outlived {LOCK_RECOVER_AFTER:?}");
            if let Err(error) = self.recover_lock(lock, deadline).await {
                tracing::debug!(%error, "lock recovery failed; waiting on");
            }
            wait.waiting_for = None;
        }
        let delay = self.jittered(&mut wait.poll);
        if delay >= deadline.remaining() {
            return Err(deadline.exceeded(0, Some(Error::Locked { lock: lock.clone() })));
        }
        tokio::time::sleep(delay).await;
        Ok(())
    }

    /// Recovers `lock`'s transaction (see `txn_recover`), then resolves `lock`'s shard as it
    /// settled. Boxed: it runs inside the retry loop it calls.
    pub(crate) fn recover_lock<'a>(
        &'a self,
        lock: &'a LockInfo,
        deadline: &'a Deadline,
    ) -> Pin<Box<dyn Future<Output = Result<()>> + Send + 'a>> {
        Box::pin(async move {
            let txn = (lock.txn, lock.txn_ts);
            let resolution = match self.recover_txn(txn, &lock.anchor, deadline).await? {
                Settled::Committed(c) => Resolution::Commit(c),
                // A lock of a forgotten transaction is an aborted one's (see `txn_recover`).
                Settled::Aborted | Settled::Forgotten => Resolution::Abort,
            };
            self.resolve_txn(&lock.key, txn, false, resolution, deadline)
                .await?;
            Ok(())
        })
    }

    /// One `Kv.Resolve` on the shard owning `key`, retried like a read (it is idempotent).
    /// `txn` is the transaction's id and start timestamp.
    pub(crate) async fn resolve_txn(
        &self,
        key: &Bytes,
        (txn, txn_ts): (proto::WriteId, u64),
        anchor: bool,
        resolution: Resolution,
        deadline: &Deadline,
    ) -> Result<proto::ResolveResponse> {
        let message = proto::ResolveRequest {
            txn: Some(txn),
            key: key.clone(),
            anchor,
            decision: Some(match resolution {
                Resolution::Commit(c) => resolve_request::Decision::CommitTs(c),
                Resolution::Abort => resolve_request::Decision::Abort(true),
                Resolution::AbortStaging => resolve_request::Decision::AbortStaging(true),
                Resolution::Prevent => resolve_request::Decision::Prevent(true),
                Resolution::Finish => resolve_request::Decision::Finish(true),
            }),
            route: None,
            txn_ts,
        };
        self.call_with(
            Route::Key(key),
            deadline,
            LockPolicy::Fail,
            |channel, timeout, route| {
                let message = message.routed(route);
                async move {
                    kv_client(channel)
                        .resolve(request(message, timeout))
                        .await
                        .map(|r| r.into_inner())
                }
            },
        )
        .await
    }

    /// `Kv.CommitWait` on `ts` (see [`TxnOptions::linearizable`](crate::TxnOptions::linearizable)):
    /// returns once a node's physical clock is `max_offset` past `ts`, so every clock has
    /// passed it. Asked of the first shard's leader (any node would do), retried like a read.
    pub(crate) async fn commit_wait(&self, ts: u64, deadline: &Deadline) -> Result<()> {
        self.call_with(
            Route::Key(b""),
            deadline,
            LockPolicy::Fail,
            |channel, timeout, _route| async move {
                kv_client(channel)
                    .commit_wait(request(proto::CommitWaitRequest { ts }, timeout))
                    .await
                    .map(|_| ())
            },
        )
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lock(seq: u64) -> LockInfo {
        LockInfo {
            key: Bytes::from_static(b"k"),
            txn: proto::WriteId { client_id: 1, seq },
            anchor: Bytes::from_static(b"a"),
            prepare_ts: 5,
            write: true,
            txn_ts: 3,
            rank: TxnRank::new(meridian_types::TxnPriority::Normal, 7),
        }
    }

    #[test]
    fn only_a_senior_prepare_wounds_and_only_under_wound_wait() {
        let holder = lock(1); // normal priority, age 7, id (1, 1)
        let me = proto::WriteId {
            client_id: 2,
            seq: 1,
        };
        let normal = |age| TxnRank::new(meridian_types::TxnPriority::Normal, age);
        assert!(
            LockPolicy::WoundWait(me, normal(6)).wounds(&holder),
            "older wounds"
        );
        assert!(
            !LockPolicy::WoundWait(me, normal(8)).wounds(&holder),
            "younger waits"
        );
        assert!(
            !LockPolicy::WoundWait(me, normal(7)).wounds(&holder),
            "same age: the lower id (the holder's) is senior"
        );
        let high = TxnRank::new(meridian_types::TxnPriority::High, 99);
        assert!(
            LockPolicy::WoundWait(me, high).wounds(&holder),
            "priority first"
        );
        assert!(!LockPolicy::Wait.wounds(&holder));
        assert!(!LockPolicy::Fail.wounds(&holder));
    }

    #[test]
    fn recovery_is_due_only_after_waiting_for_the_same_transaction() {
        let mut wait = LockWait::new();
        assert!(!wait.due(&lock(1)), "first sight");
        assert!(!wait.due(&lock(1)), "not long enough yet");
        wait.waiting_for = Some((lock(1).txn, Instant::now() - LOCK_RECOVER_AFTER));
        assert!(!wait.due(&lock(2)), "another transaction starts a new wait");
        wait.waiting_for = Some((lock(2).txn, Instant::now() - LOCK_RECOVER_AFTER));
        assert!(wait.due(&lock(2)));
    }
}
