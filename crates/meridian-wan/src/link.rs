//! One proxy link: a listener that forwards every accepted connection to one target.
//!
//! A [`Link`] owns its listener task and publishes its run-time state (fault mode, delay,
//! jitter) on a `watch` channel that every connection of the link reads. Changing the state is
//! one `send_modify`; the connections react on their own (see `pipe.rs`):
//!
//! ```text
//!             drop                       heal
//!   Normal ─────────► Dropped ─────────────────────► Normal
//!     │  ▲               listener: stops accepting      (connections that lived through the
//!     │  │               (the kernel still queues       drop are closed when the policy is
//!     │  │heal           handshakes in the backlog)     `Close`, resumed when `Resume`)
//!     │  │               connections: frozen, both ways
//!     ▼  │ reset
//!    Reset: every connection closed with RST, listener closed (new connects are refused);
//!           heal rebinds the same address.
//! ```
//!
//! Invariants: at most `max_connections` connections per link (the excess is closed at once and
//! counted); the state machine never loses a `drop` or `reset` between two looks at the channel,
//! because each bumps an epoch counter that connections compare with the one they started under.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::info;

use crate::error::{check_token, WanError};
use crate::listener::{bind, run_listener};

/// Largest accepted one-way delay or jitter; larger values are almost surely typos.
pub const MAX_ONE_WAY_DELAY: Duration = Duration::from_secs(60);
/// Default cap on concurrent connections per link.
pub const DEFAULT_MAX_CONNECTIONS: usize = 512;
/// Default cap on bytes queued inside the proxy per direction per connection.
pub const DEFAULT_MAX_IN_FLIGHT_BYTES: usize = 8 * 1024 * 1024;
/// Smallest accepted in-flight bound: below one TCP segment the proxy would crawl.
pub const MIN_IN_FLIGHT_BYTES: usize = 4 * 1024;
/// Default deadline for the proxy's connect to the target.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// What a link does: where it listens, where it forwards, and how slow the way is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LinkSpec {
    /// Name used by the control protocol and in logs; no whitespace, ',' or '='.
    pub name: String,
    pub listen: SocketAddr,
    pub target: SocketAddr,
    /// Added to every chunk in each direction; the round trip pays it twice.
    pub one_way_delay: Duration,
    /// Each chunk also waits a uniform sample of `[0, jitter]`.
    pub jitter: Duration,
    /// `(from, to)` regions, for `drop-region`; `None` for ad-hoc links.
    pub regions: Option<(String, String)>,
}

impl LinkSpec {
    /// Checks the name and the delay bounds.
    pub fn validate(&self) -> Result<(), WanError> {
        let invalid = |reason: String| WanError::InvalidLink {
            name: self.name.clone(),
            reason,
        };
        check_token(&self.name).map_err(|reason| invalid(format!("name {reason}")))?;
        if self.one_way_delay > MAX_ONE_WAY_DELAY || self.jitter > MAX_ONE_WAY_DELAY {
            return Err(invalid(format!(
                "delay and jitter must be at most {} ms",
                MAX_ONE_WAY_DELAY.as_millis()
            )));
        }
        if let Some((from, to)) = &self.regions {
            for region in [from, to] {
                check_token(region).map_err(|reason| invalid(format!("region {reason}")))?;
            }
        }
        Ok(())
    }
}

/// What happens to connections that were black-holed by `drop` when the link heals.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum HealPolicy {
    /// Close them with RST: the peers see an error and reconnect (the default; it is what a
    /// long outage does to real TCP connections once retransmissions give up).
    Close,
    /// Let them carry on with the bytes queued during the outage (a short cut).
    Resume,
}

/// Limits and policies shared by every link of one emulator.
#[derive(Clone, Debug)]
pub struct LinkOptions {
    pub max_connections: usize,
    pub max_in_flight_bytes: usize,
    pub connect_timeout: Duration,
    pub heal_policy: HealPolicy,
    /// Seeds the jitter generators; each connection and direction derives its own stream.
    pub seed: u64,
}

impl Default for LinkOptions {
    fn default() -> Self {
        LinkOptions {
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_in_flight_bytes: DEFAULT_MAX_IN_FLIGHT_BYTES,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            heal_policy: HealPolicy::Close,
            seed: 0,
        }
    }
}

impl LinkOptions {
    fn validate(&self, name: &str) -> Result<(), WanError> {
        let invalid = |reason: String| WanError::InvalidLink {
            name: name.to_string(),
            reason,
        };
        if self.max_connections == 0 {
            return Err(invalid("max connections must be at least 1".into()));
        }
        if self.max_in_flight_bytes < MIN_IN_FLIGHT_BYTES
            || self.max_in_flight_bytes > u32::MAX as usize
        {
            return Err(invalid(format!(
                "max in-flight bytes must be in {MIN_IN_FLIGHT_BYTES}..={}",
                u32::MAX
            )));
        }
        if self.connect_timeout.is_zero() {
            return Err(invalid("connect timeout must be positive".into()));
        }
        Ok(())
    }
}

/// The fault mode of a link.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Normal,
    /// Black hole: nothing passes, nothing is closed.
    Dropped,
    /// Every connection closed, new ones refused.
    Reset,
    /// The link is gone; connections and the listener end.
    Shutdown,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Normal => "normal",
            Mode::Dropped => "dropped",
            Mode::Reset => "reset",
            Mode::Shutdown => "shutdown",
        }
    }
}

/// The run-time state every connection of a link watches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LinkState {
    pub mode: Mode,
    pub one_way_delay: Duration,
    pub jitter: Duration,
    /// Bumped by every `drop`, so a connection can tell it lived through one even if it never
    /// saw the `Dropped` value (watch channels keep only the latest value).
    pub drop_epoch: u64,
    /// Bumped by every `reset`, for the same reason.
    pub reset_epoch: u64,
}

/// Counters a link exposes; all monotonic except `connections_active` and `queued_bytes`.
#[derive(Debug, Default)]
pub struct LinkStats {
    pub connections_accepted: AtomicU64,
    pub connections_active: AtomicU64,
    pub connections_over_limit: AtomicU64,
    pub connect_failures: AtomicU64,
    pub bytes_forwarded: AtomicU64,
    /// Bytes currently read from a source and not yet written to the sink, all connections.
    pub queued_bytes: AtomicU64,
    /// Largest number of bytes ever queued in one direction of one connection.
    pub queued_bytes_peak_per_direction: AtomicU64,
}

/// A plain copy of [`LinkStats`] at one instant.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LinkStatsSnapshot {
    pub connections_accepted: u64,
    pub connections_active: u64,
    pub connections_over_limit: u64,
    pub connect_failures: u64,
    pub bytes_forwarded: u64,
    pub queued_bytes: u64,
    pub queued_bytes_peak_per_direction: u64,
}

impl LinkStats {
    pub fn snapshot(&self) -> LinkStatsSnapshot {
        let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        LinkStatsSnapshot {
            connections_accepted: load(&self.connections_accepted),
            connections_active: load(&self.connections_active),
            connections_over_limit: load(&self.connections_over_limit),
            connect_failures: load(&self.connect_failures),
            bytes_forwarded: load(&self.bytes_forwarded),
            queued_bytes: load(&self.queued_bytes),
            queued_bytes_peak_per_direction: load(&self.queued_bytes_peak_per_direction),
        }
    }
}

/// What the listener task and every connection task of one link share.
pub(crate) struct Shared {
    pub spec: LinkSpec,
    pub options: LinkOptions,
    pub stats: LinkStats,
}

/// A running link. Dropping it shuts the link and all its connections down.
pub struct Link {
    shared: Arc<Shared>,
    state: watch::Sender<LinkState>,
    local_addr: SocketAddr,
    listener_task: JoinHandle<()>,
}

impl Link {
    /// Binds the listen address and starts accepting.
    pub async fn start(spec: LinkSpec, options: LinkOptions) -> Result<Link, WanError> {
        spec.validate()?;
        options.validate(&spec.name)?;
        let listener = bind(spec.listen).map_err(|source| WanError::Bind {
            name: spec.name.clone(),
            addr: spec.listen,
            source,
        })?;
        let local_addr = listener.local_addr().map_err(|source| WanError::Bind {
            name: spec.name.clone(),
            addr: spec.listen,
            source,
        })?;
        let (state, state_rx) = watch::channel(LinkState {
            mode: Mode::Normal,
            one_way_delay: spec.one_way_delay,
            jitter: spec.jitter,
            drop_epoch: 0,
            reset_epoch: 0,
        });
        let shared = Arc::new(Shared {
            spec,
            options,
            stats: LinkStats::default(),
        });
        let listener_task = tokio::spawn(run_listener(
            listener,
            local_addr,
            Arc::clone(&shared),
            state_rx,
        ));
        info!(link = %shared.spec.name, listen = %local_addr, target = %shared.spec.target,
            one_way_ms = shared.spec.one_way_delay.as_secs_f64() * 1e3,
            jitter_ms = shared.spec.jitter.as_secs_f64() * 1e3, "link up");
        Ok(Link {
            shared,
            state,
            local_addr,
            listener_task,
        })
    }

    pub fn name(&self) -> &str {
        &self.shared.spec.name
    }

    pub fn spec(&self) -> &LinkSpec {
        &self.shared.spec
    }

    /// The bound address (differs from `spec().listen` when that used port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    pub fn state(&self) -> LinkState {
        *self.state.borrow()
    }

    pub fn stats(&self) -> LinkStatsSnapshot {
        self.shared.stats.snapshot()
    }

    /// Black-holes the link (the `drop` fault).
    pub fn black_hole(&self) {
        self.change(|state| {
            state.mode = Mode::Dropped;
            state.drop_epoch += 1;
        });
    }

    /// Closes every connection and refuses new ones (the `reset` fault).
    pub fn reset(&self) {
        self.change(|state| {
            state.mode = Mode::Reset;
            state.reset_epoch += 1;
        });
    }

    /// Ends a `drop` or `reset`; see [`HealPolicy`] for the black-holed connections.
    pub fn heal(&self) {
        self.change(|state| state.mode = Mode::Normal);
    }

    /// Changes the delay for chunks that arrive from now on; queued chunks keep their time.
    pub fn set_delay(&self, one_way_delay: Duration, jitter: Duration) -> Result<(), WanError> {
        if one_way_delay > MAX_ONE_WAY_DELAY || jitter > MAX_ONE_WAY_DELAY {
            return Err(WanError::InvalidLink {
                name: self.name().to_string(),
                reason: format!(
                    "delay and jitter must be at most {} ms",
                    MAX_ONE_WAY_DELAY.as_millis()
                ),
            });
        }
        self.change(|state| {
            state.one_way_delay = one_way_delay;
            state.jitter = jitter;
        });
        Ok(())
    }

    /// Stops the listener and ends every connection.
    pub fn shutdown(&self) {
        self.change(|state| state.mode = Mode::Shutdown);
    }

    fn change(&self, apply: impl FnOnce(&mut LinkState)) {
        self.state.send_modify(|state| {
            if state.mode != Mode::Shutdown {
                apply(state);
            }
        });
        let state = self.state();
        info!(link = %self.name(), state = state.mode.as_str(),
            one_way_ms = state.one_way_delay.as_secs_f64() * 1e3,
            jitter_ms = state.jitter.as_secs_f64() * 1e3, "link state changed");
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        // Connections notice the closed channel themselves; the listener may be parked in
        // `accept`, so it is stopped here too.
        self.listener_task.abort();
    }
}
