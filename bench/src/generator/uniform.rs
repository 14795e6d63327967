//! YCSB's `UniformLongGenerator`: integers uniform over an inclusive range.
//!
//! Used for the uniform request distribution, for choosing which field an update writes, and
//! for scan lengths. YCSB computes `abs(nextLong()) % interval + lb`, which is very slightly
//! biased; this port draws an unbiased value with `gen_range`, which has the same distribution to
//! within 2^-40 for any interval this tool uses.

use rand::Rng;

/// Uniform integers in `[lower, upper]`.
#[derive(Debug, Clone)]
pub struct UniformLongGenerator {
    lower: u64,
    upper: u64,
}

impl UniformLongGenerator {
    /// Panics if `lower > upper`: callers validate ranges from properties first.
    pub fn new(lower: u64, upper: u64) -> Self {
        assert!(lower <= upper, "uniform range [{lower}, {upper}] is empty");
        Self { lower, upper }
    }

    /// Draws the next value.
    pub fn next_value<R: Rng + ?Sized>(&self, rng: &mut R) -> u64 {
        rng.gen_range(self.lower..=self.upper)
    }

    /// Mean of the distribution (YCSB exposes it for its estimates).
    pub fn mean(&self) -> f64 {
        (self.lower as f64 + self.upper as f64) / 2.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    /// Every value stays inside the inclusive range and both ends are reached.
    #[test]
    fn stays_in_range_and_reaches_ends() {
        let generator = UniformLongGenerator::new(1, 100);
        let mut rng = StdRng::seed_from_u64(3);
        let mut seen_low = false;
        let mut seen_high = false;
        for _ in 0..100_000 {
            let value = generator.next_value(&mut rng);
            assert!((1..=100).contains(&value));
            seen_low |= value == 1;
            seen_high |= value == 100;
        }
        assert!(seen_low && seen_high);
        assert_eq!(generator.mean(), 50.5);
    }
}
