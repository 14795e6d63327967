//! The node's hybrid logical clock (HLC), built on `uhlc`.
//!
//! Every RPC between nodes carries the sender's HLC timestamp; the receiver calls
//! [`Clock::update`] before acting on the message, so causality is carried across nodes
//! without a timestamp oracle. A timestamp more than `max_offset` ahead of the receiver's
//! physical clock is rejected ([`ClockError::OffsetExceeded`]): accepting it would drag the
//! receiver's clock (and every version it writes) arbitrarily far into the future.
//!
//! # Injectable time
//! `uhlc` takes its physical clock as a plain `fn() -> NTP64`, so the offset a test gives a node
//! is process-wide: [`set_process_offset_ms`] shifts the physical clock of every `Clock` in this
//! process. Cluster tests run each node as its own process (`meridian start --clock-offset-ms`),
//! which is exactly the granularity a real skewed machine has.
//!
//! # Invariants
//! - `now()` is strictly increasing within a process.
//! - After `update(t)` succeeds, every later `now()` is greater than `t`.
//!
//! # Not done yet
//! - The high-water mark is not persisted: a restarted node relies on its physical clock and on
//!   the per-shard version floor applied by the state machine (see `meridian-raft`'s apply).
//! - Nothing here checks the clock against its peers: meridian-raft's `clock_fence` measures
//!   their offsets and stops a node that is out of step with a majority of the cluster.

use crate::Timestamp;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

/// Nanoseconds added to the system clock for every HLC in this process (tests only).
static PROCESS_OFFSET_NS: AtomicI64 = AtomicI64::new(0);

/// Shifts this process's physical clock by `offset_ms` (may be negative). For tests.
pub fn set_process_offset_ms(offset_ms: i64) {
    PROCESS_OFFSET_NS.store(offset_ms.saturating_mul(1_000_000), Ordering::SeqCst);
}

fn offset_clock() -> uhlc::NTP64 {
    let base = uhlc::system_time_clock();
    let offset_ns = PROCESS_OFFSET_NS.load(Ordering::Relaxed);
    if offset_ns == 0 {
        return base;
    }
    let shifted_ns = (base.as_nanos() as i128 + offset_ns as i128).max(0) as u64;
    uhlc::NTP64::from(Duration::from_nanos(shifted_ns))
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ClockError {
    #[error(
        "remote HLC timestamp {remote} is {ahead_ms} ms ahead of local clock, beyond max_offset {max_offset_ms} ms"
    )]
    OffsetExceeded {
        remote: Timestamp,
        ahead_ms: u64,
        max_offset_ms: u64,
    },
}

/// A node's HLC. Cheap to share behind an `Arc`.
pub struct Clock {
    hlc: uhlc::HLC,
    max_offset: Duration,
}

impl Clock {
    pub fn new(max_offset: Duration) -> Clock {
        let hlc = uhlc::HLCBuilder::new()
            .with_clock(offset_clock)
            .with_max_delta(max_offset)
            .build();
        Clock { hlc, max_offset }
    }

    pub fn max_offset(&self) -> Duration {
        self.max_offset
    }

    /// A fresh timestamp, greater than every earlier one and every timestamp seen by `update`.
    pub fn now(&self) -> Timestamp {
        Timestamp::from(*self.hlc.new_timestamp().get_time())
    }

    /// The physical clock alone (with the injected offset), without advancing the HLC.
    pub fn physical_now(&self) -> Timestamp {
        Timestamp::from(offset_clock())
    }

    /// Merges a timestamp received from another node. Zero means "no timestamp" and is ignored.
    pub fn update(&self, remote: Timestamp) -> Result<(), ClockError> {
        if remote == Timestamp::ZERO {
            return Ok(());
        }
        let ts = uhlc::Timestamp::new(remote.into(), *self.hlc.get_id());
        self.hlc.update_with_timestamp(&ts).map_err(|_| {
            let local_ms = self.physical_now().physical_ms();
            ClockError::OffsetExceeded {
                remote,
                ahead_ms: remote.physical_ms().saturating_sub(local_ms),
                max_offset_ms: self.max_offset.as_millis() as u64,
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn rejects_timestamps_beyond_max_offset() {
        let clock = Clock::new(Duration::from_millis(500));
        let far = Timestamp::from_physical_ms(clock.physical_now().physical_ms() + 5_000);
        let err = clock.update(far).unwrap_err();
        assert!(matches!(
            err,
            ClockError::OffsetExceeded {
                max_offset_ms: 500,
                ..
            }
        ));
        assert!(
            clock.now() < far,
            "a rejected timestamp must not move the clock"
        );
    }

    #[test]
    fn accepts_timestamps_within_max_offset_and_moves_past_them() {
        let clock = Clock::new(Duration::from_millis(500));
        let near = Timestamp::from_physical_ms(clock.physical_now().physical_ms() + 200);
        clock.update(near).unwrap();
        assert!(clock.now() > near);
    }

    proptest! {
        /// now() is strictly monotonic across any interleaving of updates from the past.
        #[test]
        fn now_is_strictly_monotonic(back_ms in proptest::collection::vec(0u64..10_000, 1..50)) {
            let clock = Clock::new(Duration::from_millis(500));
            let mut last = clock.now();
            for b in back_ms {
                let past = Timestamp::from_physical_ms(clock.physical_now().physical_ms().saturating_sub(b));
                clock.update(past).unwrap();
                let t = clock.now();
                prop_assert!(t > last);
                last = t;
            }
        }
    }
}
