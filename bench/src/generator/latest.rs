//! YCSB's `SkewedLatestGenerator`: the "latest" request distribution (workload D).
//!
//! Recently inserted keys are the most popular: the generator draws a zipfian rank `r` over the
//! current number of acknowledged keys and returns `last_acknowledged - r`. It reads the limit
//! from the [`AcknowledgedCounter`] that hands out insert key numbers, so it never returns a key
//! whose insert has not been acknowledged (the limit only covers contiguous acknowledgements).
//!
//! Each client thread owns a clone of the generator; the zipfian's zeta grows incrementally as
//! the limit grows (see [`super::zipfian`]), so the clones stay cheap.

use rand::Rng;

use super::counter::AcknowledgedCounter;
use super::zipfian::ZipfianGenerator;

/// Skewed-towards-latest key chooser over an acknowledged insert counter.
#[derive(Debug, Clone)]
pub struct SkewedLatestGenerator {
    ranks: ZipfianGenerator,
}

impl SkewedLatestGenerator {
    /// Builds the generator for the counter's current limit (YCSB builds its zipfian over
    /// `basis.lastValue()` items; an empty basis is treated as one item).
    pub fn new(basis: &AcknowledgedCounter) -> Self {
        let items = basis.last_value().unwrap_or(0).max(1);
        Self {
            ranks: ZipfianGenerator::new(0, items - 1),
        }
    }

    /// Draws a key number at or below the basis's acknowledged limit, or `None` while nothing has
    /// been acknowledged.
    pub fn next_value<R: Rng + ?Sized>(
        &mut self,
        basis: &AcknowledgedCounter,
        rng: &mut R,
    ) -> Option<u64> {
        let max = basis.last_value()?;
        let rank = self.ranks.next_long(max, rng);
        // The zipfian can return 1 for an item count of 0 or 1; clamp instead of going negative.
        Some(max.saturating_sub(rank))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use rand::rngs::StdRng;
    use rand::seq::SliceRandom;
    use rand::SeedableRng;
    use std::collections::HashSet;

    /// The most recent key is the most popular one.
    #[test]
    fn latest_key_is_hottest() {
        let basis = AcknowledgedCounter::new(1000);
        let mut generator = SkewedLatestGenerator::new(&basis);
        let mut rng = StdRng::seed_from_u64(5);
        let mut counts = vec![0u32; 1000];
        for _ in 0..200_000 {
            let value = generator
                .next_value(&basis, &mut rng)
                .expect("acknowledged keys");
            counts[value as usize] += 1;
        }
        let hottest = counts
            .iter()
            .enumerate()
            .max_by_key(|(_, count)| **count)
            .map(|(index, _)| index);
        assert_eq!(hottest, Some(999));
    }

    proptest! {
        /// Whatever order inserts are acknowledged in, the generator never returns a key number
        /// that has not been acknowledged.
        #[test]
        fn never_returns_unacknowledged(
            loaded in 1u64..50,
            inserts in 1usize..300,
            seed in any::<u64>(),
            draws_per_ack in 1usize..8,
        ) {
            let basis = AcknowledgedCounter::new(loaded);
            let mut generator = SkewedLatestGenerator::new(&basis);
            let mut rng = StdRng::seed_from_u64(seed);
            let mut handed_out: Vec<u64> = (0..inserts).map(|_| basis.next_value()).collect();
            handed_out.shuffle(&mut rng);
            let mut acknowledged: HashSet<u64> = (0..loaded).collect();
            for key_number in handed_out {
                for _ in 0..draws_per_ack {
                    let drawn = generator.next_value(&basis, &mut rng).expect("loaded keys");
                    prop_assert!(acknowledged.contains(&drawn), "drew unacknowledged {}", drawn);
                }
                basis.acknowledge(key_number).expect("outstanding");
                acknowledged.insert(key_number);
            }
            prop_assert_eq!(basis.last_value(), Some(loaded + inserts as u64 - 1));
        }
    }
}
