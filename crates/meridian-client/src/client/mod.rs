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
//! reached Raft returns [`Error::Ambiguous`](crate::Error::Ambiguous) ("outcome unknown"),
//! never a plain error (see `write_retry`).
//!
//! # Files
//! - `mod.rs` (this file): [`Client`] and its shared state, construction, accessors.
//! - `kv`: the single-key calls (`get`, `put`, `delete`) and their result types.
//! - `retry`: `Route`, `Deadline`, `Client::call_with`'s loop above, backoff.
//! - `conn`: channels, `Cluster.Status` ([`fetch_status`], `Client::status`) and the
//!   single-flight shard map refresh.
//! - `background`: the counted tasks calls leave running after they answer, and
//!   [`Client::settle_background`], which waits for them.
//!
//! # Not done yet
//! - Plain `get`s go to the leader; stale (follower) reads are `stale.rs`'s, asked for
//!   explicitly.
//! - The client does not send a causality token (`meridian-hlc`) yet.

mod background;
mod conn;
mod kv;
mod retry;

pub use background::MAX_BACKGROUND_TASKS;
pub use conn::fetch_status;
pub(crate) use conn::{cluster_client, kv_client, request};
pub use kv::{KeyValue, Versioned};
pub(crate) use retry::{Deadline, Route};

use crate::config::ClientConfig;
use crate::error::Result;
use crate::routing::{RoutingState, ShardMap, ShardRoute};
use crate::write_retry::WriteIds;
use meridian_proto::kv as proto;
use rand::rngs::StdRng;
use rand::SeedableRng;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Duration;
use tonic::transport::Channel;

/// Most `NOT_LEADER` redirects followed without backing off, per shard request.
pub const MAX_IMMEDIATE_REDIRECTS: u32 = 3;
/// Most pages one scan call fetches (each page makes progress, so this only guards bugs).
pub const MAX_SCAN_PAGES: usize = 4_096;
/// Most node channels kept open; beyond it the cache is reset (a cluster has far fewer nodes).
pub const MAX_CACHED_CHANNELS: usize = 1_024;
/// Extra time the client waits past an attempt's gRPC timeout before giving up on it locally.
pub(crate) const ATTEMPT_GRACE: Duration = Duration::from_millis(100);

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
    /// Work calls left running after they answered (see `background`).
    background: background::Background,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding these locks cannot leave them inconsistent (single assignments).
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
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
                background: background::Background::default(),
            }),
        };
        client.status().await?;
        Ok(client)
    }

    /// Waits, at most `timeout`, for the work this client's calls left running after they
    /// answered: a multi-shard commit resolving its other participants' locks and finishing
    /// its record, an aborted transaction releasing its early locks. Returns how many of those
    /// tasks still run (0: all done).
    ///
    /// A process should call it before it exits: work cut short is not lost (readers recover a
    /// transaction whose locks they meet, the nodes' sweeper settles the rest, early locks
    /// expire), but the next reader of those keys waits and recovers. The CLI does.
    pub async fn settle_background(&self, timeout: Duration) -> usize {
        self.inner.background.settle(timeout).await
    }

    /// Runs `work` in the background, counted for [`Client::settle_background`]; skips it
    /// when [`MAX_BACKGROUND_TASKS`] already run.
    pub(crate) fn spawn_background(
        &self,
        what: &'static str,
        work: impl std::future::Future<Output = ()> + Send + 'static,
    ) {
        self.inner.background.spawn(what, work);
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

    // ---- internals ------------------------------------------------------------------------

    /// A fresh write id, sent unchanged on every attempt of one write call.
    pub(crate) fn next_write_id(&self) -> proto::WriteId {
        self.inner.write_ids.next()
    }

    /// Oracle mode's cached oracle address (see `oracle`).
    pub(crate) fn inner_oracle(&self) -> MutexGuard<'_, Option<String>> {
        lock(&self.inner.oracle)
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
}
