//! [`Client`]: routes each request to the leader of the key's shard and retries until the
//! call's deadline.
//!
//! # The retry loop
//! Every public call gets one deadline (`call_timeout`). Each shard request inside it runs
//! `Client::call_with`'s loop:
//!
//! ```text
//!  resolve target ──► send (timeout = min(rpc_timeout, time left)) ──► Ok ──► done
//!        ▲                    │
//!        │       NOT_LEADER + usable hint ──► record leader, retry at once (bounded)
//!        │       NOT_LEADER, no hint ───────► forget leader ─┐
//!        │       WRONG_SHARD, UNAVAILABLE ──► refresh map ────┼─► back off (jitter) ─┐
//!        │       transport error ───────────► suspect node,   │                      │
//!        │                                    refresh map ────┘                      │
//!        └───────────────────────────────────────────────────────────────────────────┘
//!        other errors: returned at once;  time left < next delay: DeadlineExceeded{last}
//! ```
//!
//! Map refreshes are single-flight: concurrent callers that saw the same map generation share
//! one `Cluster.Status` round. Calls over many keys (scans, batches) are in `multi`.
//!
//! # Invariants
//! - No lock is held across an `.await` except the refresh mutex, whose wait is bounded by the
//!   deadline.
//! - Every network call has a timeout no later than the call's deadline.
//!
//! # Writes are retried only with their write id
//! Each write call carries one [`WriteId`](meridian_proto::kv::WriteId) on all its attempts,
//! which the shard deduplicates, so the loop above is safe for writes too; `AMBIGUOUS` answers
//! are retried like `UNAVAILABLE`. A write call that gives up after an attempt that may have
//! reached Raft returns [`Error::Ambiguous`] ("outcome unknown"), never a plain error (see
//! `write_retry`).
//!
//! # Not done yet
//! - No follower or bounded-staleness reads; every read goes to the leader.
//! - The client does not send a causality token (`meridian-hlc`) yet.

use crate::backoff::Backoff;
use crate::config::{endpoint_uri, ClientConfig};
use crate::error::{Error, Result};
use crate::locks::{LockPolicy, LockWait};
use crate::routing::{Routed, RoutingState, ShardMap, ShardRoute, Target};
use crate::validate;
use crate::write_retry::{WriteAttempts, WriteIds};
use bytes::Bytes;
use meridian_proto::kv::{
    self as proto, cluster_client::ClusterClient, kv_client::KvClient, StatusResponse,
};
use meridian_types::limits::MAX_MESSAGE_BYTES;
use meridian_types::Timestamp;
use rand::rngs::StdRng;
use rand::SeedableRng;
use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, Instant};
use tonic::transport::{Channel, Endpoint};

/// Most `NOT_LEADER` redirects followed without backing off, per shard request.
pub const MAX_IMMEDIATE_REDIRECTS: u32 = 3;
/// Most pages one scan call fetches (each page makes progress, so this only guards bugs).
pub const MAX_SCAN_PAGES: usize = 4_096;
/// Most node channels kept open; beyond it the cache is reset (a cluster has far fewer nodes).
pub const MAX_CACHED_CHANNELS: usize = 1_024;
/// Extra time the client waits past an attempt's gRPC timeout before giving up on it locally.
pub(crate) const ATTEMPT_GRACE: Duration = Duration::from_millis(100);

/// A value and the HLC timestamp of the version it came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Versioned {
    pub value: Bytes,
    pub version_ts: Timestamp,
}

/// One row of a scan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyValue {
    pub key: Bytes,
    pub value: Bytes,
    pub version_ts: Timestamp,
}

/// An async Meridian client. Cheap to clone: clones share the routing cache and connections.
///
/// See the [crate docs](crate) for an example.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

struct Inner {
    config: ClientConfig,
    routing: RwLock<RoutingState>,
    channels: Mutex<HashMap<String, Channel>>,
    refresh_lock: tokio::sync::Mutex<()>,
    rng: Mutex<StdRng>,
    write_ids: WriteIds,
    /// Oracle mode only: the address that last answered `Cluster.Timestamp`.
    oracle: Mutex<Option<String>>,
    /// Locks of junior transactions this client's prepares wounded (see `locks`).
    wounds: std::sync::atomic::AtomicU64,
}

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

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding these locks cannot leave them inconsistent (single assignments).
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

pub(crate) fn kv_client(channel: Channel) -> KvClient<Channel> {
    KvClient::new(channel)
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES)
}

pub(crate) fn cluster_client(channel: Channel) -> ClusterClient<Channel> {
    ClusterClient::new(channel)
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES)
}

pub(crate) fn request<T>(message: T, timeout: Duration) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.set_timeout(timeout);
    request
}

pub(crate) fn display_key(key: &[u8]) -> String {
    const SHOWN: usize = 64;
    let shown = &key[..key.len().min(SHOWN)];
    let mut text: String = shown.escape_ascii().to_string();
    if key.len() > SHOWN {
        text.push('…');
    }
    text
}

/// Asks one node for `Cluster.Status` over a fresh connection, within `timeout`.
///
/// For tools that watch individual nodes (readiness checks, `meridian cluster status`); a
/// [`Client`] reuses its connections instead ([`Client::node_status`]).
pub async fn fetch_status(address: &str, timeout: Duration) -> Result<StatusResponse> {
    let transport = |message: String| Error::Transport {
        address: address.to_string(),
        message,
    };
    let endpoint = Endpoint::from_shared(endpoint_uri(address))
        .map_err(|e| transport(format!("invalid address: {e}")))?
        .connect_timeout(timeout)
        .timeout(timeout)
        .tcp_nodelay(true);
    let call = async {
        let channel = endpoint
            .connect()
            .await
            .map_err(|e| transport(format!("connect: {e}")))?;
        cluster_client(channel)
            .status(request(proto::StatusRequest {}, timeout))
            .await
            .map(|response| response.into_inner())
            .map_err(|status| Error::from_status(&status, address))
    };
    tokio::time::timeout(timeout + ATTEMPT_GRACE, call)
        .await
        .unwrap_or_else(|_| {
            Err(transport(format!(
                "no answer within {} ms",
                timeout.as_millis()
            )))
        })
}

impl Client {
    /// Validates `config` and fetches the shard map from the first seed that answers,
    /// retrying the seeds until `call_timeout`.
    pub async fn connect(config: ClientConfig) -> Result<Client> {
        config.validate()?;
        let rng = match config.jitter_seed {
            Some(seed) => StdRng::seed_from_u64(seed),
            None => StdRng::from_entropy(),
        };
        // Always from entropy, even with a jitter seed: two clients with one id would
        // deduplicate each other's writes.
        let write_ids = WriteIds::new(rand::random::<u64>());
        let client = Client {
            inner: Arc::new(Inner {
                config,
                routing: RwLock::new(RoutingState::default()),
                channels: Mutex::new(HashMap::new()),
                refresh_lock: tokio::sync::Mutex::new(()),
                rng: Mutex::new(rng),
                write_ids,
                oracle: Mutex::new(None),
                wounds: std::sync::atomic::AtomicU64::new(0),
            }),
        };
        client.status().await?;
        Ok(client)
    }

    /// The configuration this client was built with.
    pub fn config(&self) -> &ClientConfig {
        &self.inner.config
    }

    /// How many times this client's transactions *wounded* another transaction: a prepare
    /// met the lock of a transaction it outranks and recovered it (see [`crate::TxnOptions`]'s
    /// `priority`). Since the client was built; for metrics and tests.
    pub fn wounds(&self) -> u64 {
        self.inner.wounds.load(std::sync::atomic::Ordering::Relaxed)
    }

    pub(crate) fn note_wound(&self) {
        self.inner
            .wounds
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// A copy of the cached shard map (with the leaders learnt so far).
    pub fn shard_map(&self) -> ShardMap {
        self.state().map.clone()
    }

    /// The cached route of `key`: its shard and, if known, the shard's leader.
    pub fn route(&self, key: &[u8]) -> Option<ShardRoute> {
        self.state().map.shard_for_key(key).cloned()
    }

    /// Reads `key`'s latest value (linearizable by default). `None` if absent or deleted.
    pub async fn get(&self, key: impl Into<Bytes>) -> Result<Option<Bytes>> {
        Ok(self.get_versioned(key).await?.map(|v| v.value))
    }

    /// Like [`Client::get`], with the version's HLC timestamp.
    pub async fn get_versioned(&self, key: impl Into<Bytes>) -> Result<Option<Versioned>> {
        let consistency = self.inner.config.read_consistency;
        let response = self.get_call(key.into(), consistency).await?;
        Ok(response.found.then(|| Versioned {
            value: response.value,
            version_ts: Timestamp(response.version_ts),
        }))
    }

    /// One `Kv.Get` of `key` with `consistency`, routed (and retried) by `read_call`.
    pub(crate) async fn get_call(
        &self,
        key: Bytes,
        consistency: crate::ReadConsistency,
    ) -> Result<proto::GetResponse> {
        validate::key(&key)?;
        let deadline = self.deadline();
        let message = proto::GetRequest {
            key: key.clone(),
            consistency: consistency.to_proto(),
            route: None,
            staleness: consistency.staleness(),
        };
        self.read_call(
            Route::Key(&key),
            &deadline,
            consistency,
            |channel, timeout, route| {
                let message = message.routed(route);
                async move {
                    kv_client(channel)
                        .get(request(message, timeout))
                        .await
                        .map(|r| r.into_inner())
                }
            },
        )
        .await
    }

    /// Writes `value` under `key`; returns the new version's commit timestamp.
    pub async fn put(&self, key: impl Into<Bytes>, value: impl Into<Bytes>) -> Result<Timestamp> {
        let key: Bytes = key.into();
        let value: Bytes = value.into();
        validate::key(&key)?;
        validate::value(&value)?;
        let deadline = self.deadline();
        let message = proto::PutRequest {
            key: key.clone(),
            value,
            write_id: Some(self.inner.write_ids.next()),
            route: None,
        };
        let response = self
            .write_call(Route::Key(&key), &deadline, |channel, timeout, route| {
                let message = message.routed(route);
                async move {
                    kv_client(channel)
                        .put(request(message, timeout))
                        .await
                        .map(|r| r.into_inner())
                }
            })
            .await?;
        Ok(Timestamp(response.commit_ts))
    }

    /// Deletes `key` (writes a tombstone); returns the tombstone's commit timestamp.
    pub async fn delete(&self, key: impl Into<Bytes>) -> Result<Timestamp> {
        let key: Bytes = key.into();
        validate::key(&key)?;
        let deadline = self.deadline();
        let message = proto::DeleteRequest {
            key: key.clone(),
            write_id: Some(self.inner.write_ids.next()),
            route: None,
        };
        let response = self
            .write_call(Route::Key(&key), &deadline, |channel, timeout, route| {
                let message = message.routed(route);
                async move {
                    kv_client(channel)
                        .delete(request(message, timeout))
                        .await
                        .map(|r| r.into_inner())
                }
            })
            .await?;
        Ok(Timestamp(response.commit_ts))
    }

    /// The cluster's status from any node (trying known nodes, then seeds); also refreshes the
    /// cached shard map with it.
    pub async fn status(&self) -> Result<StatusResponse> {
        let deadline = self.deadline();
        let mut backoff = self.backoff();
        let mut rounds = 0u32;
        loop {
            rounds += 1;
            let mut last = match self.status_round(&deadline).await {
                Ok(status) => return Ok(status),
                Err(error) if error.is_retryable() || matches!(error, Error::NoSeeds) => {
                    Some(error)
                }
                Err(error) => return Err(error),
            };
            self.back_off(&mut backoff, &deadline, rounds, &mut last)
                .await?;
        }
    }

    /// Re-fetches the shard map now.
    pub async fn refresh_shard_map(&self) -> Result<()> {
        self.status().await.map(|_| ())
    }

    /// `Cluster.Status` from one particular node (one attempt, `rpc_timeout`); the cached map
    /// is not changed.
    pub async fn node_status(&self, address: &str) -> Result<StatusResponse> {
        self.status_from(address, self.inner.config.rpc_timeout)
            .await
    }

    // ---- internals ------------------------------------------------------------------------

    /// A fresh write id, sent unchanged on every attempt of one write call.
    pub(crate) fn next_write_id(&self) -> proto::WriteId {
        self.inner.write_ids.next()
    }

    /// Oracle mode's cached oracle address (see `oracle`).
    pub(crate) fn inner_oracle(&self) -> MutexGuard<'_, Option<String>> {
        lock(&self.inner.oracle)
    }

    pub(crate) fn deadline(&self) -> Deadline {
        Deadline::after(self.inner.config.call_timeout)
    }

    pub(crate) fn backoff(&self) -> Backoff {
        Backoff::new(
            self.inner.config.backoff_initial,
            self.inner.config.backoff_max,
        )
    }

    pub(crate) fn state(&self) -> RwLockReadGuard<'_, RoutingState> {
        self.inner
            .routing
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn state_mut(&self) -> RwLockWriteGuard<'_, RoutingState> {
        self.inner
            .routing
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub(crate) fn channel(&self, address: &str) -> Result<Channel> {
        let mut channels = lock(&self.inner.channels);
        if let Some(channel) = channels.get(address) {
            return Ok(channel.clone());
        }
        if channels.len() >= MAX_CACHED_CHANNELS {
            channels.clear();
        }
        let config = &self.inner.config;
        let target = config.dial.get(address).map_or(address, String::as_str);
        let endpoint = Endpoint::from_shared(endpoint_uri(target))
            .map_err(|e| Error::Transport {
                address: address.to_string(),
                message: format!("invalid address: {e}"),
            })?
            .connect_timeout(config.connect_timeout)
            .timeout(config.rpc_timeout)
            .tcp_nodelay(true)
            .http2_keep_alive_interval(Duration::from_secs(10))
            .keep_alive_timeout(Duration::from_secs(5));
        let channel = endpoint.connect_lazy();
        channels.insert(address.to_string(), channel.clone());
        Ok(channel)
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

    async fn status_from(&self, address: &str, timeout: Duration) -> Result<StatusResponse> {
        let channel = self.channel(address)?;
        let mut cluster = cluster_client(channel);
        let call = cluster.status(request(proto::StatusRequest {}, timeout));
        match tokio::time::timeout(timeout + ATTEMPT_GRACE, call).await {
            Ok(Ok(response)) => Ok(response.into_inner()),
            Ok(Err(status)) => Err(Error::from_status(&status, address)),
            Err(_) => Err(Error::Transport {
                address: address.to_string(),
                message: format!("no answer within {} ms", timeout.as_millis()),
            }),
        }
    }

    /// One pass over the refresh candidates; the first answer is installed and returned.
    async fn status_round(&self, deadline: &Deadline) -> Result<StatusResponse> {
        let candidates = self
            .state()
            .refresh_candidates(&self.inner.config.seeds, Instant::now());
        let mut last = None;
        for (node_id, address) in candidates {
            let remaining = deadline.remaining();
            if remaining.is_zero() {
                break;
            }
            let timeout = self.inner.config.rpc_timeout.min(remaining);
            match self.status_from(&address, timeout).await {
                Ok(status) => {
                    self.state_mut().install(ShardMap::from_status(&status));
                    return Ok(status);
                }
                Err(error) => {
                    tracing::debug!(%address, %error, "status request failed");
                    if let (Some(node_id), Error::Transport { .. }) = (node_id, &error) {
                        self.state_mut().note_node_failure(node_id, Instant::now());
                    }
                    last = Some(error);
                }
            }
        }
        Err(last.unwrap_or(Error::NoSeeds))
    }

    /// Refreshes the map unless someone installed a newer one since `seen_generation`.
    /// A failed refresh is recorded in `last` (the caller backs off and retries anyway).
    pub(crate) async fn refresh_after_failure(
        &self,
        seen_generation: u64,
        deadline: &Deadline,
        last: &mut Option<Error>,
    ) {
        let remaining = deadline.remaining();
        let Ok(_guard) = tokio::time::timeout(remaining, self.inner.refresh_lock.lock()).await
        else {
            return;
        };
        if self.state().generation != seen_generation {
            return;
        }
        if let Err(error) = self.status_round(deadline).await {
            tracing::debug!(%error, "shard map refresh failed");
            if last.is_none() {
                *last = Some(error);
            }
        }
    }

    /// Runs one request with routing, retries and backoff (see the module docs), with the
    /// given answer to `LOCKED` (see `locks`).
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
