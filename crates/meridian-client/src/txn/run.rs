//! The entry points of a transaction on [`Client`]: [`Client::txn`] and its retry loop,
//! [`Client::begin`] and [`Client::begin_with`]; and [`TxnBody`], the closure type.

use super::{wall_ts, CommitInfo, Isolation, Txn, TxnOptions, WOUND_WAIT_FROM_ATTEMPT};
use crate::early_lock::{Locked, ReleaseOnDrop};
use crate::error::Error;
use crate::snapshot::SnapshotState;
use crate::Client;
use meridian_proto::kv as proto;
use meridian_types::{TxnPriority, TxnRank};
use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::pin::Pin;
use std::time::Instant;

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
