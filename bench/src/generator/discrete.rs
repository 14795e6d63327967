//! YCSB's `DiscreteGenerator`: picks one of a few values with given weights.
//!
//! The core workload uses it to choose the next operation. The walk is the same as YCSB's: draw
//! `u` uniform in [0, 1), then go through the values in insertion order subtracting each one's
//! normalised weight until `u` falls below it. With the same insertion order (READ, UPDATE,
//! INSERT, SCAN, READMODIFYWRITE) the same `u` picks the same operation as Java YCSB.
//!
//! Invariant: every stored weight is finite and positive; values with weight zero are not added
//! (YCSB skips proportions that are not `> 0`).

use rand::Rng;

/// Errors building a discrete generator.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum DiscreteError {
    #[error("weight {weight} is not a finite number >= 0")]
    BadWeight { weight: f64 },
    #[error("no value has a positive weight")]
    Empty,
}

/// Weighted choice among values, in insertion order.
#[derive(Debug, Clone)]
pub struct DiscreteGenerator<T> {
    values: Vec<(f64, T)>,
    weight_sum: f64,
}

impl<T: Clone> DiscreteGenerator<T> {
    /// Builds a generator from `(weight, value)` pairs; pairs with weight 0 are dropped.
    pub fn new(pairs: impl IntoIterator<Item = (f64, T)>) -> Result<Self, DiscreteError> {
        let mut values = Vec::new();
        for (weight, value) in pairs {
            if !weight.is_finite() || weight < 0.0 {
                return Err(DiscreteError::BadWeight { weight });
            }
            if weight > 0.0 {
                values.push((weight, value));
            }
        }
        if values.is_empty() {
            return Err(DiscreteError::Empty);
        }
        let weight_sum = values.iter().map(|(weight, _)| weight).sum();
        Ok(Self { values, weight_sum })
    }

    /// Draws the next value.
    pub fn next_value<R: Rng + ?Sized>(&self, rng: &mut R) -> T {
        let mut remaining: f64 = rng.gen();
        for (weight, value) in &self.values {
            let share = weight / self.weight_sum;
            if remaining < share {
                return value.clone();
            }
            remaining -= share;
        }
        // Floating point rounding can leave `remaining` a hair above the last share; the last
        // value is the one YCSB would have reached.
        self.values
            .last()
            .map(|(_, value)| value.clone())
            .expect("constructor guarantees at least one value")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    /// Draw frequencies follow the weights.
    #[test]
    fn frequencies_follow_weights() {
        let generator = DiscreteGenerator::new([(0.5, 'a'), (0.0, 'z'), (0.3, 'b'), (0.2, 'c')])
            .expect("valid weights");
        let mut rng = StdRng::seed_from_u64(7);
        let draws = 200_000;
        let mut counts = [0u32; 3];
        for _ in 0..draws {
            match generator.next_value(&mut rng) {
                'a' => counts[0] += 1,
                'b' => counts[1] += 1,
                'c' => counts[2] += 1,
                other => panic!("unexpected value {other}"),
            }
        }
        for (count, expected) in counts.iter().zip([0.5, 0.3, 0.2]) {
            let share = f64::from(*count) / f64::from(draws);
            assert!(
                (share - expected).abs() < 0.01,
                "share {share} vs {expected}"
            );
        }
    }

    /// Weights that do not sum to one are normalised, and all-zero weights are refused.
    #[test]
    fn weights_are_normalised_and_validated() {
        let generator = DiscreteGenerator::new([(2.0, 1), (2.0, 2)]).expect("valid");
        let mut rng = StdRng::seed_from_u64(1);
        let ones = (0..10_000)
            .filter(|_| generator.next_value(&mut rng) == 1)
            .count();
        assert!((4_500..5_500).contains(&ones));
        assert_eq!(
            DiscreteGenerator::new([(0.0, 1)]).unwrap_err(),
            DiscreteError::Empty
        );
        assert!(DiscreteGenerator::new([(-1.0, 1)]).is_err());
    }
}
