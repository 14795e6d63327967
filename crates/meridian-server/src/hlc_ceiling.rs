//! A persisted upper bound on every HLC timestamp this node has issued, so a restart never
//! issues a smaller one.
//!
//! # Why
//! The HLC lives in memory. If a node restarts with its physical clock behind where it was
//! (a clock step back, an NTP correction, a restart on a host with a slower clock), it could
//! hand out timestamps below ones it handed out before the restart: a write could commit "in
//! the past" of a read that was already served. The per-shard version floor protects versions
//! of one shard (apply raises timestamps above it) and reads (they read at or above it), but
//! not timestamps the node gave out for other purposes — and transactions will depend on it.
//!
//! # How
//! A background task persists `ceiling = max(HLC now, physical now) + max_offset + LEAD` every
//! [`CEILING_INTERVAL`] (an unsynced write followed by a WAL sync, which does not hold up other
//! writers). Between two persists the HLC can advance by the elapsed physical time plus a merge
//! of a peer timestamp at most `max_offset` ahead, both covered by the margin. On start the
//! node reads the ceiling and waits until its physical clock has passed it
//! ([`wait_past_ceiling`]): about `max_offset + LEAD` after a crash and immediate restart with
//! an unchanged clock, nothing after a longer outage. A ceiling further ahead than a clock
//! that went back by up to `max_offset` explains means the node cannot safely wait it out: it
//! refuses to start and says by how much.
//!
//! # Issuing is gated on it
//! A persist that stalls (a disk stall) must not let the clock run past the last persisted
//! ceiling: [`CeilingGate`] holds the last ceiling that reached the disk, and the `Kv` service
//! hands out no timestamp at or above it — neither a write's (refused before it is proposed)
//! nor a read's — answering `UNAVAILABLE` until the keeper catches up.

use meridian_storage::{keys, Cf, Engine, WriteBatch};
use meridian_types::{Clock, Timestamp};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The last ceiling known to be on disk; no timestamp at or above it may be handed out.
#[derive(Debug, Default)]
pub struct CeilingGate {
    ms: AtomicU64,
}

impl CeilingGate {
    /// Records a persisted ceiling (in ms); never lowers it.
    pub fn persisted(&self, ceiling_ms: u64) {
        self.ms.fetch_max(ceiling_ms, Ordering::AcqRel);
    }

    /// Whether `ts` may be handed out: strictly below the last persisted ceiling.
    pub fn admits(&self, ts: Timestamp) -> bool {
        ts < Timestamp::from_physical_ms(self.ms.load(Ordering::Acquire))
    }
}

/// How often the ceiling is persisted.
pub const CEILING_INTERVAL: Duration = Duration::from_millis(250);
/// How far past the current clock (plus `max_offset`) the ceiling is set; larger than
/// [`CEILING_INTERVAL`] so a persist that runs late is still covered.
pub const CEILING_LEAD: Duration = Duration::from_millis(500);

/// Reads the persisted ceiling, in milliseconds since the Unix epoch.
pub fn read_ceiling_ms(engine: &dyn Engine) -> anyhow::Result<Option<u64>> {
    match engine.get(Cf::RaftMeta, keys::HLC_CEILING_KEY)? {
        None => Ok(None),
        Some(raw) => {
            let bytes: [u8; 8] = raw.as_slice().try_into().map_err(|_| {
                anyhow::anyhow!("HLC ceiling of {} bytes in storage, want 8", raw.len())
            })?;
            Ok(Some(u64::from_be_bytes(bytes)))
        }
    }
}

/// Persists a new ceiling above every timestamp `clock` can issue before the next persist.
pub fn persist_ceiling(engine: &dyn Engine, clock: &Clock) -> anyhow::Result<u64> {
    let now_ms = clock
        .now()
        .physical_ms()
        .max(clock.physical_now().physical_ms());
    let ceiling_ms =
        now_ms + clock.max_offset().as_millis() as u64 + CEILING_LEAD.as_millis() as u64;
    let mut batch = WriteBatch::new();
    batch.put(
        Cf::RaftMeta,
        keys::HLC_CEILING_KEY.to_vec(),
        ceiling_ms.to_be_bytes().to_vec(),
    );
    engine.write(batch, false)?;
    engine.sync_wal()?;
    Ok(ceiling_ms)
}

/// Waits until `clock`'s physical time has passed the persisted ceiling (see the module docs);
/// returns how long it waited. Refuses when the ceiling is further ahead than a crash and
/// immediate restart can explain.
pub async fn wait_past_ceiling(engine: &dyn Engine, clock: &Clock) -> anyhow::Result<Duration> {
    let Some(ceiling_ms) = read_ceiling_ms(engine)? else {
        return Ok(Duration::ZERO);
    };
    let ceiling = Timestamp::from_physical_ms(ceiling_ms);
    let ahead_ms = ceiling_ms.saturating_sub(clock.physical_now().physical_ms());
    // The ceiling is at most 2 x max_offset + LEAD past the old physical clock (the HLC may run
    // max_offset ahead of it), and a restarted clock may legitimately be up to max_offset
    // behind the old one.
    let explainable_ms =
        (clock.max_offset() * 3 + CEILING_LEAD + CEILING_INTERVAL).as_millis() as u64;
    if ahead_ms > explainable_ms {
        anyhow::bail!(
            "this node issued HLC timestamps up to {ahead_ms} ms ahead of its clock now: the clock \
             went back since the node last ran by more than max_offset allows; fix the clock (or \
             wait {ahead_ms} ms) before starting the node"
        );
    }
    let started = std::time::Instant::now();
    if ahead_ms > 0 {
        tracing::info!(
            wait_ms = ahead_ms,
            "waiting for the clock to pass the HLC ceiling persisted before the restart"
        );
    }
    // Bounded: at most explainable_ms of physical time, checked every few milliseconds.
    while clock.physical_now() <= ceiling {
        let left = ceiling_ms.saturating_sub(clock.physical_now().physical_ms());
        tokio::time::sleep(Duration::from_millis(left.clamp(1, 50))).await;
    }
    Ok(started.elapsed())
}

/// Persists the ceiling every [`CEILING_INTERVAL`] until the node stops, opening `gate` to
/// each one that reached the disk.
pub fn spawn_keeper(
    engine: Arc<dyn Engine>,
    clock: Arc<Clock>,
    gate: Arc<CeilingGate>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut interval = tokio::time::interval(CEILING_INTERVAL);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            interval.tick().await;
            let (engine, clock) = (engine.clone(), clock.clone());
            let result =
                tokio::task::spawn_blocking(move || persist_ceiling(&*engine, &clock)).await;
            match result {
                Ok(Ok(ceiling_ms)) => gate.persisted(ceiling_ms),
                Ok(Err(e)) => tracing::error!(error = %e, "persisting the HLC ceiling failed"),
                Err(e) => tracing::error!(error = %e, "HLC ceiling task failed"),
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use meridian_storage::MemoryEngine;

    fn clock() -> Clock {
        Clock::new(Duration::from_millis(500))
    }

    fn write_ceiling(engine: &dyn Engine, ms: u64) {
        let mut batch = WriteBatch::new();
        batch.put(
            Cf::RaftMeta,
            keys::HLC_CEILING_KEY.to_vec(),
            ms.to_be_bytes().to_vec(),
        );
        engine.write(batch, true).unwrap();
    }

    #[tokio::test]
    async fn a_restart_waits_until_the_clock_passes_the_persisted_ceiling() {
        let engine = MemoryEngine::new();
        let clock = clock();
        let ceiling_ms = clock.physical_now().physical_ms() + 300;
        write_ceiling(&engine, ceiling_ms);
        let waited = wait_past_ceiling(&engine, &clock).await.unwrap();
        assert!(
            waited >= Duration::from_millis(250),
            "waited only {waited:?}"
        );
        // In timestamp terms, not whole milliseconds: the wait ends as soon as the clock is
        // past the ceiling, which may be within the ceiling's own millisecond.
        assert!(
            clock.now() > Timestamp::from_physical_ms(ceiling_ms),
            "every timestamp issued after the wait is above the ceiling"
        );
    }

    #[test]
    fn the_gate_admits_only_timestamps_below_the_last_persisted_ceiling() {
        let engine = MemoryEngine::new();
        let clock = clock();
        let gate = CeilingGate::default();
        assert!(
            !gate.admits(clock.now()),
            "nothing persisted yet: nothing admitted"
        );
        let ceiling_ms = persist_ceiling(&engine, &clock).unwrap();
        gate.persisted(ceiling_ms);
        assert!(gate.admits(clock.now()));
        // A stalled keeper: the clock (or a merged peer timestamp) reaches the ceiling.
        let at = Timestamp::from_physical_ms(ceiling_ms);
        assert!(!gate.admits(at) && gate.admits(Timestamp(at.0 - 1)));
        gate.persisted(ceiling_ms - 1_000);
        assert!(
            gate.admits(Timestamp(at.0 - 1)),
            "a late, lower ceiling never lowers it"
        );
    }

    #[tokio::test]
    async fn a_clock_far_behind_the_ceiling_refuses_to_start() {
        let engine = MemoryEngine::new();
        let clock = clock();
        write_ceiling(&engine, clock.physical_now().physical_ms() + 60_000);
        let error = wait_past_ceiling(&engine, &clock).await.unwrap_err();
        assert!(error.to_string().contains("clock went back"), "{error}");
    }

    #[tokio::test]
    async fn the_persisted_ceiling_covers_the_clock_and_a_fresh_node_does_not_wait() {
        let engine = MemoryEngine::new();
        let clock = clock();
        assert_eq!(
            wait_past_ceiling(&engine, &clock).await.unwrap(),
            Duration::ZERO
        );
        let ceiling_ms = persist_ceiling(&engine, &clock).unwrap();
        assert_eq!(read_ceiling_ms(&engine).unwrap(), Some(ceiling_ms));
        assert!(ceiling_ms >= clock.now().physical_ms() + 500 + 400);
    }
}
