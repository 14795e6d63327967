//! One proxied connection: connect to the target, then pump bytes both ways with a delay.
//!
//! Each direction is a reader and a writer joined in the connection's task:
//!
//! ```text
//!   source ──read──► [reserve budget] ──(release_at, bytes)──► bounded queue ──► sleep_until
//!                                                                                    │
//!   sink ◄──────────────────────────────── write_all, give the budget back ◄─────────┘
//! ```
//!
//! Invariants:
//! - Order: a chunk's release time is `max(previous release, arrival + delay + jitter sample)`,
//!   and one writer releases chunks in queue order, so bytes are never reordered.
//! - Memory: the reader reserves budget before every read and the writer returns it after the
//!   write, so at most `max_in_flight_bytes` bytes sit in one direction; when the budget is spent
//!   the reader stops reading and the source's TCP window closes (back-pressure).
//! - Deadline: the connect to the target is bounded by `connect_timeout`.
//! - Faults: a separate watcher ends the connection (with RST) on `reset`, on shutdown, and on
//!   heal after a `drop` under [`HealPolicy::Close`]; while dropped, readers and writers wait.

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, watch, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tracing::{debug, warn};

use crate::link::{HealPolicy, LinkState, Mode, Shared};

/// Largest single read; also the unit of budget reserved before each read.
pub const MAX_CHUNK_BYTES: usize = 64 * 1024;
/// Bound on queued chunks per direction, on top of the byte budget, so a stream of one-byte
/// writes cannot grow the queue's bookkeeping without limit.
pub const MAX_QUEUED_CHUNKS: usize = 4096;

/// When a chunk may leave: never before the one ahead of it, never before its own delay.
pub fn release_time(previous_release: Instant, arrival: Instant, delay: Duration) -> Instant {
    previous_release.max(arrival + delay)
}

/// Why a connection was ended by its link rather than by its peers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum KillReason {
    Reset,
    HealAfterDrop,
    Shutdown,
}

/// What a connection that started under `start` may do in `state`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Verdict {
    Pass,
    Hold,
    Kill(KillReason),
}

fn verdict(state: &LinkState, start: &LinkState, policy: HealPolicy) -> Verdict {
    if state.mode == Mode::Shutdown {
        return Verdict::Kill(KillReason::Shutdown);
    }
    if state.reset_epoch != start.reset_epoch || state.mode == Mode::Reset {
        return Verdict::Kill(KillReason::Reset);
    }
    if state.mode == Mode::Dropped {
        return Verdict::Hold;
    }
    if state.drop_epoch != start.drop_epoch && policy == HealPolicy::Close {
        return Verdict::Kill(KillReason::HealAfterDrop);
    }
    Verdict::Pass
}

/// A connection's view of its link's state.
#[derive(Clone)]
struct Gate {
    state: watch::Receiver<LinkState>,
    start: LinkState,
    policy: HealPolicy,
}

impl Gate {
    /// Waits until bytes may pass. A `Kill` never becomes `Pass` again, so this never returns
    /// after a kill; the watcher, polled first, ends the connection instead.
    async fn wait_pass(&mut self) -> io::Result<()> {
        let (start, policy) = (self.start, self.policy);
        self.state
            .wait_for(|state| verdict(state, &start, policy) == Verdict::Pass)
            .await
            .map(|_| ())
            .map_err(|_| io::Error::other("link stopped"))
    }

    async fn until_killed(mut self) -> KillReason {
        let (start, policy) = (self.start, self.policy);
        let mut reason = KillReason::Shutdown;
        let _ = self
            .state
            .wait_for(|state| match verdict(state, &start, policy) {
                Verdict::Kill(why) => {
                    reason = why;
                    true
                }
                Verdict::Pass | Verdict::Hold => false,
            })
            .await;
        reason
    }

    fn delays(&self) -> (Duration, Duration) {
        let state = self.state.borrow();
        (state.one_way_delay, state.jitter)
    }
}

/// Serves one accepted connection until both directions end or the link ends it.
pub(crate) async fn serve_connection(
    mut inbound: TcpStream,
    peer: SocketAddr,
    connection_seq: u64,
    shared: Arc<Shared>,
    state: watch::Receiver<LinkState>,
    // The state at accept time: a drop or reset after it concerns this connection.
    start: LinkState,
    _slot: OwnedSemaphorePermit,
) {
    let stats = &shared.stats;
    stats.connections_active.fetch_add(1, Ordering::Relaxed);
    let _active = DecrementOnDrop(&stats.connections_active);
    let name = shared.spec.name.as_str();
    let gate = Gate {
        start,
        state,
        policy: shared.options.heal_policy,
    };
    let mut watcher = std::pin::pin!(gate.clone().until_killed());
    let connect = tokio::time::timeout(
        shared.options.connect_timeout,
        TcpStream::connect(shared.spec.target),
    );
    let mut outbound = tokio::select! {
        biased;
        reason = &mut watcher => {
            debug!(link = name, %peer, ?reason, "connection ended while connecting");
            let _ = inbound.set_zero_linger();
            return;
        }
        connected = connect => match connected {
            Ok(Ok(stream)) => stream,
            Ok(Err(error)) => {
                stats.connect_failures.fetch_add(1, Ordering::Relaxed);
                warn!(link = name, %peer, target = %shared.spec.target, %error, "connect to target failed");
                return;
            }
            Err(_elapsed) => {
                stats.connect_failures.fetch_add(1, Ordering::Relaxed);
                warn!(link = name, %peer, target = %shared.spec.target,
                    timeout_ms = shared.options.connect_timeout.as_millis() as u64,
                    "connect to target timed out");
                return;
            }
        },
    };
    // The proxy already holds whole chunks; Nagle would only add its own delay on top.
    let _ = inbound.set_nodelay(true);
    let _ = outbound.set_nodelay(true);
    debug!(link = name, %peer, connection = connection_seq, "connection open");

    let killed = {
        let (client_read, client_write) = inbound.split();
        let (target_read, target_write) = outbound.split();
        let seed = shared.options.seed ^ connection_seq.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let forward = pump(client_read, target_write, gate.clone(), &shared, seed);
        let backward = pump(target_read, client_write, gate, &shared, seed ^ 1);
        tokio::select! {
            biased;
            reason = &mut watcher => Some(reason),
            result = async { tokio::try_join!(forward, backward) } => {
                if let Err(error) = result {
                    debug!(link = name, %peer, connection = connection_seq, %error, "connection failed");
                }
                None
            }
        }
    };
    if let Some(reason) = killed {
        // RST on both sides: the peers see the connection die, not a clean end of stream.
        let _ = inbound.set_zero_linger();
        let _ = outbound.set_zero_linger();
        debug!(link = name, %peer, connection = connection_seq, ?reason, "connection closed by the link");
    } else {
        debug!(link = name, %peer, connection = connection_seq, "connection closed by its peers");
    }
}

/// A chunk in the queue; an empty `bytes` is the end-of-stream marker (FIN to forward).
struct Chunk {
    release_at: Instant,
    bytes: Vec<u8>,
}

/// Moves one direction until end of stream (forwarded as a half-close) or an I/O error.
async fn pump<R, W>(
    mut source: R,
    mut sink: W,
    gate: Gate,
    shared: &Shared,
    seed: u64,
) -> io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let max_in_flight = shared.options.max_in_flight_bytes;
    let reserve_bytes = MAX_CHUNK_BYTES.min(max_in_flight);
    let budget = Semaphore::new(max_in_flight);
    let queued = AtomicU64::new(0);
    let stats = &shared.stats;
    let (sender, mut receiver) = mpsc::channel::<Chunk>(MAX_QUEUED_CHUNKS);
    let mut read_gate = gate.clone();
    let mut write_gate = gate;

    let read_side = async {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut scratch = vec![0u8; reserve_bytes];
        let mut previous_release = Instant::now();
        loop {
            read_gate.wait_pass().await?;
            let reservation = budget
                .acquire_many(reserve_bytes as u32)
                .await
                .map_err(|_| io::Error::other("budget closed"))?;
            reservation.forget();
            let read = source.read(&mut scratch).await?;
            budget.add_permits(reserve_bytes - read);
            let (delay, jitter) = read_gate.delays();
            let sample = if jitter.is_zero() {
                Duration::ZERO
            } else {
                Duration::from_micros(rng.gen_range(0..=jitter.as_micros() as u64))
            };
            let release_at = release_time(previous_release, Instant::now(), delay + sample);
            previous_release = release_at;
            let in_direction = queued.fetch_add(read as u64, Ordering::Relaxed) + read as u64;
            debug_assert!(in_direction as usize <= max_in_flight);
            stats.queued_bytes.fetch_add(read as u64, Ordering::Relaxed);
            stats
                .queued_bytes_peak_per_direction
                .fetch_max(in_direction, Ordering::Relaxed);
            let bytes = scratch[..read].to_vec();
            sender
                .send(Chunk { release_at, bytes })
                .await
                .map_err(|_| io::Error::other("writer gone"))?;
            if read == 0 {
                return Ok::<(), io::Error>(());
            }
        }
    };

    let write_side = async {
        while let Some(chunk) = receiver.recv().await {
            // The timer rounds up to whole milliseconds; a chunk already due must not wait.
            if chunk.release_at > Instant::now() {
                tokio::time::sleep_until(chunk.release_at).await;
            }
            write_gate.wait_pass().await?;
            if chunk.bytes.is_empty() {
                sink.shutdown().await?;
                return Ok(());
            }
            sink.write_all(&chunk.bytes).await?;
            let written = chunk.bytes.len();
            budget.add_permits(written);
            queued.fetch_sub(written as u64, Ordering::Relaxed);
            stats
                .queued_bytes
                .fetch_sub(written as u64, Ordering::Relaxed);
            stats
                .bytes_forwarded
                .fetch_add(written as u64, Ordering::Relaxed);
        }
        Ok(())
    };

    let result = tokio::try_join!(read_side, write_side).map(|_| ());
    // Whatever was still queued when the direction ended is gone; keep the link total honest.
    stats
        .queued_bytes
        .fetch_sub(queued.load(Ordering::Relaxed), Ordering::Relaxed);
    result
}

struct DecrementOnDrop<'a>(&'a AtomicU64);

impl Drop for DecrementOnDrop<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(mode: Mode, drop_epoch: u64, reset_epoch: u64) -> LinkState {
        LinkState {
            mode,
            one_way_delay: Duration::ZERO,
            jitter: Duration::ZERO,
            drop_epoch,
            reset_epoch,
        }
    }

    /// Release times never go backwards and never come before arrival + delay, whatever jitter.
    #[test]
    fn release_times_are_monotonic_and_respect_the_delay() {
        let mut rng = StdRng::seed_from_u64(7);
        let base = Instant::now();
        let mut previous = base;
        for step in 0..10_000u64 {
            let arrival = base + Duration::from_micros(step * 50);
            let delay =
                Duration::from_millis(10) + Duration::from_micros(rng.gen_range(0..=20_000));
            let release = release_time(previous, arrival, delay);
            assert!(release >= previous, "release went backwards at step {step}");
            assert!(release >= arrival + delay, "released early at step {step}");
            previous = release;
        }
    }

    /// The verdict table: drop holds, reset and shutdown kill, heal depends on the policy.
    #[test]
    fn verdicts_follow_the_fault_state_machine() {
        let start = state(Mode::Normal, 0, 0);
        let close = HealPolicy::Close;
        let resume = HealPolicy::Resume;
        assert_eq!(verdict(&start, &start, close), Verdict::Pass);
        assert_eq!(
            verdict(&state(Mode::Dropped, 1, 0), &start, close),
            Verdict::Hold
        );
        let healed = state(Mode::Normal, 1, 0);
        assert_eq!(
            verdict(&healed, &start, close),
            Verdict::Kill(KillReason::HealAfterDrop)
        );
        assert_eq!(verdict(&healed, &start, resume), Verdict::Pass);
        // A reset that was healed before the connection looked still kills it.
        assert_eq!(
            verdict(&state(Mode::Normal, 0, 1), &start, resume),
            Verdict::Kill(KillReason::Reset)
        );
        assert_eq!(
            verdict(&state(Mode::Shutdown, 0, 0), &start, resume),
            Verdict::Kill(KillReason::Shutdown)
        );
        // A connection accepted after a heal does not count the old drop against itself.
        let later = state(Mode::Normal, 3, 2);
        assert_eq!(verdict(&later, &later, close), Verdict::Pass);
    }
}
