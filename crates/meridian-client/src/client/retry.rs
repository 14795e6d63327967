//! The retry machinery (see the module docs of `client`): `Route`, `Deadline`, the
//! `call_with` / `read_call` / `write_call` family over one attempt loop, target resolution
//! and jittered backoff.

use super::{display_key, lock, Client, ATTEMPT_GRACE, MAX_IMMEDIATE_REDIRECTS};
use crate::backoff::Backoff;
use crate::error::{Error, Result};
use crate::locks::{LockPolicy, LockWait};
use crate::routing::{RoutingState, Target};
use crate::write_retry::WriteAttempts;
use meridian_proto::kv as proto;
use std::future::Future;
use std::time::{Duration, Instant};
use tonic::transport::Channel;

/// Where a shard request goes.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Route<'a> {
    /// The shard owning this key.
    Key(&'a [u8]),
    /// The shard owning the greatest key below this exclusive bound (empty = +inf).
    Below(&'a [u8]),
    /// This shard, as grouped by a batch; `WRONG_SHARD` ends the request so the batch regroups.
    Shard(u64),
}

/// One public call's time budget.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Deadline {
    started: Instant,
    at: Instant,
}

impl Deadline {
    pub(crate) fn after(budget: Duration) -> Deadline {
        let started = Instant::now();
        Deadline {
            started,
            at: started + budget,
        }
    }

    pub(crate) fn remaining(&self) -> Duration {
        self.at.saturating_duration_since(Instant::now())
    }

    pub(crate) fn exceeded(&self, attempts: u32, last: Option<Error>) -> Error {
        Error::DeadlineExceeded {
            elapsed_ms: u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX),
            attempts,
            last: last.map(Box::new),
        }
    }
}

impl Client {
    pub(crate) fn deadline(&self) -> Deadline {
        Deadline::after(self.inner.config.call_timeout)
    }

    pub(crate) fn backoff(&self) -> Backoff {
        Backoff::new(
            self.inner.config.backoff_initial,
            self.inner.config.backoff_max,
        )
    }

    /// The next delay of `backoff`, jittered with this client's random source.
    pub(crate) fn jittered(&self, backoff: &mut Backoff) -> Duration {
        backoff.next_delay(&mut *lock(&self.inner.rng))
    }

    /// Sleeps the next backoff delay, or fails with `DeadlineExceeded` when the retry after it
    /// could not start before the deadline.
    pub(crate) async fn back_off(
        &self,
        backoff: &mut Backoff,
        deadline: &Deadline,
        attempts: u32,
        last: &mut Option<Error>,
    ) -> Result<()> {
        let delay = self.jittered(backoff);
        if delay >= deadline.remaining() {
            return Err(deadline.exceeded(attempts, last.take()));
        }
        tokio::time::sleep(delay).await;
        Ok(())
    }

    /// Runs one request with routing, retries and backoff (see the `client` module docs), with
    /// the given answer to `LOCKED` (see `locks`).
    pub(crate) async fn call_with<T, F, Fut>(
        &self,
        route: Route<'_>,
        deadline: &Deadline,
        locks: LockPolicy,
        send: F,
    ) -> Result<T>
    where
        F: FnMut(Channel, Duration, Option<proto::Route>) -> Fut,
        Fut: Future<Output = std::result::Result<T, tonic::Status>>,
    {
        self.attempt_loop(route, deadline, None, locks, false, send)
            .await
    }

    /// Runs one read request like [`Client::call_with`] (waiting out locks); a stale `consistency` goes first to the
    /// nearest replica (in [`crate::ClientConfig::region`]) and to the leader if that one
    /// cannot serve it (see `stale`).
    pub(crate) async fn read_call<T, F, Fut>(
        &self,
        route: Route<'_>,
        deadline: &Deadline,
        consistency: crate::ReadConsistency,
        send: F,
    ) -> Result<T>
    where
        F: FnMut(Channel, Duration, Option<proto::Route>) -> Fut,
        Fut: Future<Output = std::result::Result<T, tonic::Status>>,
    {
        let nearest = consistency.is_stale() && self.inner.config.region.is_some();
        self.attempt_loop(route, deadline, None, LockPolicy::Wait, nearest, send)
            .await
    }

    /// Runs one write request (whose message carries its write id) like [`Client::call_with`], and
    /// reports a failure after a possible commit as [`Error::Ambiguous`].
    pub(crate) async fn write_call<T, F, Fut>(
        &self,
        route: Route<'_>,
        deadline: &Deadline,
        send: F,
    ) -> Result<T>
    where
        F: FnMut(Channel, Duration, Option<proto::Route>) -> Fut,
        Fut: Future<Output = std::result::Result<T, tonic::Status>>,
    {
        self.write_call_with(route, deadline, LockPolicy::Wait, send)
            .await
    }

    /// [`Client::write_call`] with another answer to `LOCKED` (see `locks`).
    pub(crate) async fn write_call_with<T, F, Fut>(
        &self,
        route: Route<'_>,
        deadline: &Deadline,
        locks: LockPolicy,
        send: F,
    ) -> Result<T>
    where
        F: FnMut(Channel, Duration, Option<proto::Route>) -> Fut,
        Fut: Future<Output = std::result::Result<T, tonic::Status>>,
    {
        let mut attempts = WriteAttempts::new();
        self.attempt_loop(route, deadline, Some(&mut attempts), locks, false, send)
            .await
            .map_err(|error| attempts.settle(error))
    }

    async fn attempt_loop<T, F, Fut>(
        &self,
        route: Route<'_>,
        deadline: &Deadline,
        mut write: Option<&mut WriteAttempts>,
        locks: LockPolicy,
        mut nearest: bool,
        mut send: F,
    ) -> Result<T>
    where
        F: FnMut(Channel, Duration, Option<proto::Route>) -> Fut,
        Fut: Future<Output = std::result::Result<T, tonic::Status>>,
    {
        let mut lock_wait = LockWait::new();
        let mut backoff = self.backoff();
        let mut last: Option<Error> = None;
        let mut redirects = 0u32;
        let mut attempts = 0u32;
        loop {
            if attempts >= self.inner.config.max_attempts {
                return Err(last.unwrap_or_else(|| Error::Unavailable {
                    message: "max_attempts reached".into(),
                }));
            }
            let remaining = deadline.remaining();
            if remaining.is_zero() {
                return Err(deadline.exceeded(attempts, last));
            }
            let (generation, target) = {
                let state = self.state();
                let region = self.inner.config.region.as_deref().filter(|_| nearest);
                (state.generation, resolve(&state, route, attempts, region))
            };
            attempts += 1;
            let target: Target = match target {
                Ok(target) => target,
                Err(error) => {
                    // A batch group whose shard left the map must regroup; anything else
                    // (e.g. replicas without a known address yet) is waited out here.
                    if matches!((route, &error), (Route::Shard(_), Error::WrongShard { .. })) {
                        return Err(error);
                    }
                    last = Some(error);
                    self.refresh_after_failure(generation, deadline, &mut last)
                        .await;
                    self.back_off(&mut backoff, deadline, attempts, &mut last)
                        .await?;
                    continue;
                }
            };
            let timeout = self.inner.config.rpc_timeout.min(remaining);
            if let Some(write) = write.as_deref_mut() {
                if !write.may_send() {
                    return Err(last.unwrap_or_else(|| Error::Unavailable {
                        message: "write retry horizon reached".into(),
                    }));
                }
                write.sending();
            }
            let error = match self.channel(&target.address) {
                Ok(channel) => {
                    match tokio::time::timeout(
                        timeout + ATTEMPT_GRACE,
                        send(channel, timeout, target.route()),
                    )
                    .await
                    {
                        Ok(Ok(value)) => return Ok(value),
                        Ok(Err(status)) => Error::from_status(&status, &target.address),
                        Err(_) => Error::Transport {
                            address: target.address.clone(),
                            message: format!("no answer within {} ms", timeout.as_millis()),
                        },
                    }
                }
                Err(error) => error,
            };
            if let Some(write) = write.as_deref_mut() {
                write.failed(&error);
            }
            tracing::debug!(
                shard_id = target.shard_id,
                node_id = target.node_id,
                attempt = attempts,
                %error,
                "shard request failed"
            );
            if nearest
                && matches!(
                    error,
                    Error::NotLeader { .. }
                        | Error::Locked { .. }
                        | Error::Unavailable { .. }
                        | Error::Transport { .. }
                )
            {
                // The nearest replica could not serve a stale read: the leader serves any,
                // and waits out a lock the follower met.
                nearest = false;
                if matches!(error, Error::Locked { .. }) {
                    last = Some(error);
                    continue;
                }
            }
            match &error {
                Error::NotLeader { leader, .. } => {
                    let follow = self.state_mut().note_not_leader(
                        target.shard_id,
                        target.node_id,
                        leader.as_ref(),
                        Instant::now(),
                    );
                    last = Some(error);
                    if follow && redirects < MAX_IMMEDIATE_REDIRECTS {
                        redirects += 1;
                        continue;
                    }
                }
                Error::WrongShard { .. } => {
                    if matches!(route, Route::Shard(_)) {
                        return Err(error);
                    }
                    last = Some(error);
                    self.refresh_after_failure(generation, deadline, &mut last)
                        .await;
                }
                // Ambiguous: the write may be in the log; resending it under the same write id is
                // deduplicated by the shard, so it is retried like Unavailable.
                Error::Unavailable { .. } | Error::Ambiguous { .. } => {
                    last = Some(error);
                    self.refresh_after_failure(generation, deadline, &mut last)
                        .await;
                }
                Error::Transport { .. } => {
                    self.state_mut()
                        .note_node_failure(target.node_id, Instant::now());
                    last = Some(error);
                    self.refresh_after_failure(generation, deadline, &mut last)
                        .await;
                }
                // Another transaction's lock: nothing was done; wait it out (see `locks`).
                Error::Locked { lock } if locks != LockPolicy::Fail => {
                    let lock = lock.clone();
                    // Lock waits are bounded by the deadline, not by max_attempts.
                    attempts -= 1;
                    last = Some(error);
                    self.wait_for_lock(&mut lock_wait, &lock, locks, deadline)
                        .await?;
                    continue;
                }
                _ => return Err(error),
            }
            redirects = 0;
            self.back_off(&mut backoff, deadline, attempts, &mut last)
                .await?;
        }
    }
}

/// The node to ask for `route` on attempt number `attempt` (a replica in `region` first, when
/// one is given), or why there is none.
fn resolve(
    state: &RoutingState,
    route: Route<'_>,
    attempt: u32,
    region: Option<&str>,
) -> Result<Target> {
    let shard_id = match route {
        Route::Key(key) => state
            .map
            .shard_for_key(key)
            .map(|s| s.shard_id)
            .ok_or_else(|| Error::WrongShard {
                message: format!("no shard in the cached map owns key {}", display_key(key)),
            })?,
        Route::Below(end) => state
            .map
            .shard_below(end)
            .map(|s| s.shard_id)
            .ok_or_else(|| Error::WrongShard {
                message: format!(
                    "no shard in the cached map owns keys below {}",
                    if end.is_empty() {
                        "+inf".to_string()
                    } else {
                        display_key(end)
                    }
                ),
            })?,
        Route::Shard(shard_id) => {
            if state.map.shard(shard_id).is_none() {
                return Err(Error::WrongShard {
                    message: format!("shard {shard_id} is no longer in the shard map"),
                });
            }
            shard_id
        }
    };
    let now = Instant::now();
    region
        .and_then(|region| crate::stale::nearest_target(state, shard_id, region, attempt, now))
        .or_else(|| state.target(shard_id, attempt, now))
        .ok_or_else(|| Error::Unavailable {
            message: format!("shard {shard_id} has no replica with a known address"),
        })
}
