//! Bounded exponential backoff with jitter.
//!
//! The ceiling doubles from `initial` after every failure and is capped at `max`; the delay is
//! drawn uniformly from `[ceiling / 2, ceiling]` ("equal jitter"), so concurrent callers that
//! failed together spread out, yet every delay is at least half the ceiling and progress keeps
//! a predictable pace.
//!
//! # Invariants
//! - `initial / 2 <= delay <= max` for every delay.
//! - The randomness comes from the caller's RNG, so tests can seed it.

use rand::Rng;
use std::time::Duration;

/// Doublings after which the ceiling stops growing (2^20 × 1 ms is already ~17 min).
const MAX_DOUBLINGS: u32 = 20;

#[derive(Clone, Debug)]
pub(crate) struct Backoff {
    initial: Duration,
    max: Duration,
    failures: u32,
}

impl Backoff {
    pub(crate) fn new(initial: Duration, max: Duration) -> Backoff {
        debug_assert!(initial <= max, "validated by ClientConfig::validate");
        Backoff {
            initial,
            max,
            failures: 0,
        }
    }

    /// The ceiling of the next delay: `initial × 2^failures`, capped at `max`.
    pub(crate) fn ceiling(&self) -> Duration {
        let factor = 1u32 << self.failures.min(MAX_DOUBLINGS);
        self.initial.saturating_mul(factor).min(self.max)
    }

    /// The next delay; each call counts one more failure.
    pub(crate) fn next_delay(&mut self, rng: &mut impl Rng) -> Duration {
        let ceiling = self.ceiling();
        self.failures = self.failures.saturating_add(1);
        let floor = ceiling / 2;
        let spread_ns = u64::try_from((ceiling - floor).as_nanos()).unwrap_or(u64::MAX);
        floor + Duration::from_nanos(rng.gen_range(0..=spread_ns))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    /// Delays stay within [initial/2, max] and the ceiling doubles until capped.
    #[test]
    fn delays_are_bounded_and_grow() {
        let initial = Duration::from_millis(20);
        let max = Duration::from_secs(1);
        let mut rng = StdRng::seed_from_u64(7);
        let mut backoff = Backoff::new(initial, max);
        let mut expected_ceiling = initial;
        for _ in 0..100 {
            assert_eq!(backoff.ceiling(), expected_ceiling);
            let delay = backoff.next_delay(&mut rng);
            assert!(delay >= expected_ceiling / 2, "{delay:?}");
            assert!(delay <= expected_ceiling, "{delay:?}");
            assert!(delay >= initial / 2 && delay <= max);
            expected_ceiling = (expected_ceiling * 2).min(max);
        }
        assert_eq!(backoff.ceiling(), max);
    }

    /// Jitter actually varies the delays.
    #[test]
    fn jitter_spreads_delays() {
        let mut rng = StdRng::seed_from_u64(1);
        let delays: std::collections::BTreeSet<Duration> = (0..50)
            .map(|_| {
                let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(1));
                backoff.next_delay(&mut rng)
            })
            .collect();
        assert!(delays.len() > 10);
    }

    /// Huge failure counts neither overflow nor exceed max.
    #[test]
    fn no_overflow() {
        let mut backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(30));
        backoff.failures = u32::MAX - 1;
        let mut rng = StdRng::seed_from_u64(3);
        assert!(backoff.next_delay(&mut rng) <= Duration::from_secs(30));
        assert!(backoff.next_delay(&mut rng) <= Duration::from_secs(30));
    }
}
