//! Counters that hand out key numbers: YCSB's `CounterGenerator` and
//! `AcknowledgedCounterGenerator`.
//!
//! The load phase takes key numbers from a plain [`CounterGenerator`]. The run phase takes the
//! numbers of new keys (the INSERT operation) from an [`AcknowledgedCounter`], whose
//! [`AcknowledgedCounter::last_value`] is the highest key number below which *every* insert has
//! been acknowledged. Reads, updates and scans only choose keys at or below that limit, so they
//! never ask for a key whose insert has not finished (or failed: YCSB acknowledges failed inserts
//! too, and so does this port, so a failed insert shows up later as a NOT_FOUND read).
//!
//! Invariants:
//! - `limit` only grows, and only over a contiguous run of acknowledged numbers;
//! - at most [`ACK_WINDOW_SIZE`] numbers can be outstanding (handed out, not yet acknowledged
//!   while an earlier one still is); one more is an error, as in YCSB.
//!
//! Difference from YCSB: YCSB advances the limit only if it wins a `tryLock`, so an acknowledgement
//! can sit in the window until the next one arrives. This port always takes the lock (held for a
//! few loads and stores), so the limit is always as far as it can be.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// Number of outstanding (handed out, not yet contiguous-acknowledged) insert key numbers the
/// acknowledged counter tracks. YCSB uses 2^20.
pub const ACK_WINDOW_SIZE: u64 = 1 << 20;

/// A shared, monotonically increasing counter (YCSB `CounterGenerator`).
#[derive(Debug)]
pub struct CounterGenerator {
    next: AtomicU64,
}

impl CounterGenerator {
    /// A counter whose first value is `start`.
    pub fn new(start: u64) -> Self {
        Self {
            next: AtomicU64::new(start),
        }
    }

    /// Hands out the next number.
    pub fn next_value(&self) -> u64 {
        self.next.fetch_add(1, Ordering::Relaxed)
    }

    /// The last number handed out (`start - 1` before the first call, saturating at 0).
    pub fn last_value(&self) -> u64 {
        self.next.load(Ordering::Relaxed).saturating_sub(1)
    }
}

/// Errors from [`AcknowledgedCounter::acknowledge`].
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AcknowledgeError {
    /// More than [`ACK_WINDOW_SIZE`] inserts are outstanding.
    #[error("too many unacknowledged insertion keys (window of {ACK_WINDOW_SIZE}) at key number {key_number}")]
    WindowFull { key_number: u64 },
    /// The number was never handed out or is already below the limit.
    #[error("key number {key_number} was not outstanding (limit {limit})")]
    NotOutstanding { key_number: u64, limit: u64 },
}

struct AckWindow {
    /// `slots[n % ACK_WINDOW_SIZE]` is true when `n` is acknowledged but not yet under `limit`.
    slots: Vec<bool>,
}

impl std::fmt::Debug for AckWindow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // A million flags are useless in a debug print; count the pending ones instead.
        let pending = self.slots.iter().filter(|slot| **slot).count();
        f.debug_struct("AckWindow")
            .field("pending", &pending)
            .finish()
    }
}

/// YCSB's `AcknowledgedCounterGenerator`: a counter plus the highest contiguously acknowledged
/// value.
#[derive(Debug)]
pub struct AcknowledgedCounter {
    counter: CounterGenerator,
    /// Highest key number `n` such that every number in `[start, n]` is acknowledged, plus one
    /// (stored off by one so that "none yet" is representable with `start == 0`).
    limit_plus_one: AtomicU64,
    window: Mutex<AckWindow>,
}

impl AcknowledgedCounter {
    /// A counter whose first value is `start`; every number below `start` counts as
    /// acknowledged (they were loaded).
    pub fn new(start: u64) -> Self {
        Self {
            counter: CounterGenerator::new(start),
            limit_plus_one: AtomicU64::new(start),
            window: Mutex::new(AckWindow {
                slots: vec![false; ACK_WINDOW_SIZE as usize],
            }),
        }
    }

    /// Hands out the next number to insert.
    pub fn next_value(&self) -> u64 {
        self.counter.next_value()
    }

    /// The highest acknowledged number below which all are acknowledged, or `None` if none is.
    pub fn last_value(&self) -> Option<u64> {
        self.limit_plus_one.load(Ordering::Acquire).checked_sub(1)
    }

    /// Marks `key_number` as inserted (successfully or not) and advances the limit over any
    /// contiguous run of acknowledged numbers.
    pub fn acknowledge(&self, key_number: u64) -> Result<(), AcknowledgeError> {
        let mut window = self
            .window
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let first_unacked = self.limit_plus_one.load(Ordering::Acquire);
        if key_number < first_unacked {
            return Err(AcknowledgeError::NotOutstanding {
                key_number,
                limit: first_unacked,
            });
        }
        if key_number - first_unacked >= ACK_WINDOW_SIZE {
            return Err(AcknowledgeError::WindowFull { key_number });
        }
        let slot = (key_number % ACK_WINDOW_SIZE) as usize;
        if window.slots[slot] {
            return Err(AcknowledgeError::NotOutstanding {
                key_number,
                limit: first_unacked,
            });
        }
        window.slots[slot] = true;
        // Move the contiguous acknowledged prefix under the limit; at most one pass over the
        // window because every set slot lies within ACK_WINDOW_SIZE of the limit.
        let mut next = first_unacked;
        loop {
            let slot = (next % ACK_WINDOW_SIZE) as usize;
            if !window.slots[slot] {
                break;
            }
            window.slots[slot] = false;
            next += 1;
        }
        self.limit_plus_one.store(next, Ordering::Release);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A counter hands out consecutive numbers from its start.
    #[test]
    fn counter_counts_from_start() {
        let counter = CounterGenerator::new(5);
        assert_eq!(counter.next_value(), 5);
        assert_eq!(counter.next_value(), 6);
        assert_eq!(counter.last_value(), 6);
    }

    /// The limit advances only over contiguous acknowledgements.
    #[test]
    fn limit_waits_for_gaps() {
        let counter = AcknowledgedCounter::new(10);
        assert_eq!(counter.last_value(), Some(9));
        let a = counter.next_value();
        let b = counter.next_value();
        let c = counter.next_value();
        counter.acknowledge(c).unwrap();
        assert_eq!(counter.last_value(), Some(9));
        counter.acknowledge(a).unwrap();
        assert_eq!(counter.last_value(), Some(10));
        counter.acknowledge(b).unwrap();
        assert_eq!(counter.last_value(), Some(12));
    }

    /// Acknowledging twice, or a number below the limit, is an error.
    #[test]
    fn double_ack_is_rejected() {
        let counter = AcknowledgedCounter::new(0);
        assert_eq!(counter.last_value(), None);
        let a = counter.next_value();
        counter.acknowledge(a).unwrap();
        assert!(counter.acknowledge(a).is_err());
    }

    /// An acknowledgement a whole window ahead of the limit is refused.
    #[test]
    fn window_overflow_is_an_error() {
        let counter = AcknowledgedCounter::new(0);
        assert_eq!(
            counter.acknowledge(ACK_WINDOW_SIZE),
            Err(AcknowledgeError::WindowFull {
                key_number: ACK_WINDOW_SIZE
            })
        );
    }
}
