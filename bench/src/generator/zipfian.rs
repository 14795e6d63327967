//! Zipfian key choosers: YCSB's `ZipfianGenerator` and `ScrambledZipfianGenerator`.
//!
//! [`ZipfianGenerator`] is the algorithm of Gray et al., "Quickly Generating Billion-Record
//! Synthetic Databases" (SIGMOD 1994), exactly as YCSB implements it: item `i` (0-based) is drawn
//! with probability proportional to `1 / (i + 1)^θ`, θ = 0.99 by default, so item 0 is the most
//! popular. `zeta(n) = Σ_{i=1..n} 1/i^θ` costs O(n) to compute; when the item count grows (the
//! "latest" distribution follows the insert counter) YCSB extends the sum incrementally from the
//! last count instead of starting over, and so does this port.
//!
//! A faithful quirk: when the item count grows, YCSB recomputes `eta` with the *constructor's*
//! item count (`items`), not the new one. This port keeps that, so draws match Java's.
//!
//! [`ScrambledZipfianGenerator`] spreads the popular items over the key space: it draws a rank
//! from a zipfian over 10^10 items (whose zeta is precomputed as [`ZETAN`]) and maps it to
//! `min + fnv_hash64(rank) mod item_count`. The popularity of the hottest key is therefore about
//! `1 / ZETAN` ≈ 3.78% whatever the record count.
//!
//! Not done: YCSB's `allowitemcountdecrease` mode (never enabled by the core workload).

use rand::Rng;

use super::hash::fnv_hash64;

/// YCSB's default zipfian constant θ.
pub const ZIPFIAN_CONSTANT: f64 = 0.99;
/// zeta(10^10) for θ = 0.99, as precomputed by YCSB (`ScrambledZipfianGenerator.ZETAN`).
pub const ZETAN: f64 = 26.469_028_201_783_02;
/// Number of ranks the scrambled generator draws from (`ScrambledZipfianGenerator.ITEM_COUNT`).
pub const SCRAMBLED_ITEM_COUNT: u64 = 10_000_000_000;

/// `Σ_{i=start..end-1} 1/(i+1)^θ + initial_sum` (YCSB's `zetastatic`).
pub fn zeta(start: u64, end: u64, theta: f64, initial_sum: f64) -> f64 {
    let mut sum = initial_sum;
    for i in start..end {
        sum += 1.0 / ((i + 1) as f64).powf(theta);
    }
    sum
}

/// Zipfian-distributed integers in `[base, base + items)`, item `base` the most popular.
#[derive(Debug, Clone)]
pub struct ZipfianGenerator {
    items: u64,
    base: u64,
    theta: f64,
    zeta2theta: f64,
    alpha: f64,
    zetan: f64,
    eta: f64,
    /// The item count `zetan` was computed for.
    count_for_zeta: u64,
}

impl ZipfianGenerator {
    /// Zipfian over `[min, max]` with θ = [`ZIPFIAN_CONSTANT`]; computes zeta in O(max - min).
    pub fn new(min: u64, max: u64) -> Self {
        let items = max - min + 1;
        Self::with_zetan(
            min,
            max,
            ZIPFIAN_CONSTANT,
            zeta(0, items, ZIPFIAN_CONSTANT, 0.0),
        )
    }

    /// Zipfian over `[min, max]` with constant `theta` and a precomputed `zetan` for the item
    /// count `max - min + 1`.
    pub fn with_zetan(min: u64, max: u64, theta: f64, zetan: f64) -> Self {
        assert!(min <= max, "zipfian range [{min}, {max}] is empty");
        assert!(
            theta > 0.0 && theta < 1.0,
            "zipfian constant {theta} outside (0, 1)"
        );
        let items = max - min + 1;
        let zeta2theta = zeta(0, 2, theta, 0.0);
        let eta = Self::eta_for(items, theta, zeta2theta, zetan);
        Self {
            items,
            base: min,
            theta,
            zeta2theta,
            alpha: 1.0 / (1.0 - theta),
            zetan,
            eta,
            count_for_zeta: items,
        }
    }

    fn eta_for(items: u64, theta: f64, zeta2theta: f64, zetan: f64) -> f64 {
        (1.0 - (2.0 / items as f64).powf(1.0 - theta)) / (1.0 - zeta2theta / zetan)
    }

    /// Number of items the generator was built for.
    pub fn items(&self) -> u64 {
        self.items
    }

    /// Draws from the constructor's item count.
    pub fn next_value<R: Rng + ?Sized>(&mut self, rng: &mut R) -> u64 {
        self.next_long(self.items, rng)
    }

    /// Draws as if there were `item_count` items (YCSB's `nextLong(itemcount)`). A larger count
    /// than before extends zeta incrementally; a smaller one reuses the larger zeta, as YCSB does
    /// when it may not decrease the item count.
    pub fn next_long<R: Rng + ?Sized>(&mut self, item_count: u64, rng: &mut R) -> u64 {
        if item_count > self.count_for_zeta {
            self.zetan = zeta(self.count_for_zeta, item_count, self.theta, self.zetan);
            self.count_for_zeta = item_count;
            // YCSB uses `items` here, not `item_count` (see the module docs).
            self.eta = Self::eta_for(self.items, self.theta, self.zeta2theta, self.zetan);
        }
        let u: f64 = rng.gen();
        let uz = u * self.zetan;
        if uz < 1.0 {
            return self.base;
        }
        if uz < 1.0 + 0.5f64.powf(self.theta) {
            return self.base + 1;
        }
        let spread = (self.eta * u - self.eta + 1.0).powf(self.alpha);
        self.base + (item_count as f64 * spread) as u64
    }
}

/// Zipfian popularity scattered over `[min, max]` by hashing (YCSB's
/// `ScrambledZipfianGenerator`).
#[derive(Debug, Clone)]
pub struct ScrambledZipfianGenerator {
    min: u64,
    item_count: u64,
    ranks: ZipfianGenerator,
}

impl ScrambledZipfianGenerator {
    /// Scrambled zipfian over `[min, max]` with θ = 0.99 and the precomputed [`ZETAN`].
    pub fn new(min: u64, max: u64) -> Self {
        assert!(
            min <= max,
            "scrambled zipfian range [{min}, {max}] is empty"
        );
        Self {
            min,
            item_count: max - min + 1,
            ranks: ZipfianGenerator::with_zetan(0, SCRAMBLED_ITEM_COUNT, ZIPFIAN_CONSTANT, ZETAN),
        }
    }

    /// Number of distinct values (`max - min + 1`).
    pub fn item_count(&self) -> u64 {
        self.item_count
    }

    /// Draws the next value.
    pub fn next_value<R: Rng + ?Sized>(&mut self, rng: &mut R) -> u64 {
        let rank = self.ranks.next_value(rng);
        // The rank is below 2^34, so it fits an i64. Java's `%` could return a negative number
        // for the single hash value i64::MIN; rem_euclid keeps the result in range instead.
        let hashed = fnv_hash64(rank as i64);
        self.min + hashed.rem_euclid(self.item_count as i64) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    /// The precomputed ZETAN agrees with the incremental sum's definition on a prefix: zeta grows
    /// with n and zeta(2) is 1 + 2^-0.99.
    #[test]
    fn zeta_basics() {
        assert!((zeta(0, 2, 0.99, 0.0) - (1.0 + 0.5f64.powf(0.99))).abs() < 1e-12);
        let full = zeta(0, 1000, 0.99, 0.0);
        let split = zeta(500, 1000, 0.99, zeta(0, 500, 0.99, 0.0));
        assert!((full - split).abs() < 1e-9);
    }

    /// Popularity decreases with rank: item 0 beats item 1 beats item 2 ..., and each decile of
    /// the range gets fewer draws than the one before.
    #[test]
    fn zipfian_popularity_is_monotone() {
        let mut generator = ZipfianGenerator::new(0, 999);
        let mut rng = StdRng::seed_from_u64(42);
        let mut counts = vec![0u64; 1000];
        for _ in 0..1_000_000 {
            let value = generator.next_value(&mut rng);
            counts[value as usize] += 1;
        }
        for rank in 0..5 {
            assert!(
                counts[rank] > counts[rank + 1],
                "rank {rank}: {} <= {}",
                counts[rank],
                counts[rank + 1]
            );
        }
        let deciles: Vec<u64> = counts.chunks(100).map(|chunk| chunk.iter().sum()).collect();
        for pair in deciles.windows(2) {
            assert!(pair[0] > pair[1], "deciles not decreasing: {deciles:?}");
        }
        // Item 0's share is 1/zeta(1000).
        let expected = 1.0 / zeta(0, 1000, 0.99, 0.0);
        let share = counts[0] as f64 / 1_000_000.0;
        assert!((share - expected).abs() < 0.003, "{share} vs {expected}");
    }

    /// Growing the item count extends zeta incrementally to the same value as a fresh sum.
    #[test]
    fn incremental_zeta_matches_fresh() {
        let mut generator = ZipfianGenerator::new(0, 99);
        let mut rng = StdRng::seed_from_u64(1);
        let value = generator.next_long(5_000, &mut rng);
        assert!(value <= 5_000);
        assert!((generator.zetan - zeta(0, 5_000, 0.99, 0.0)).abs() < 1e-9);
    }

    /// With the item count YCSB uses for recordcount = 1000 and no inserts (1001), the hottest
    /// key draws about 1/ZETAN ≈ 3.78% of requests.
    #[test]
    fn scrambled_hottest_key_share() {
        let mut generator = ScrambledZipfianGenerator::new(0, 1000);
        assert_eq!(generator.item_count(), 1001);
        let mut rng = StdRng::seed_from_u64(2024);
        let draws = 1_000_000u64;
        let mut counts = vec![0u64; 1001];
        for _ in 0..draws {
            counts[generator.next_value(&mut rng) as usize] += 1;
        }
        let hottest = *counts.iter().max().expect("non-empty");
        let share = hottest as f64 / draws as f64;
        assert!((0.0368..0.0395).contains(&share), "hottest share {share}");
        // The hottest key is the hash of rank 0.
        let rank0_key = fnv_hash64(0).rem_euclid(1001) as usize;
        assert_eq!(counts[rank0_key], hottest);
    }

    /// Scrambled values stay inside [min, max].
    #[test]
    fn scrambled_stays_in_range() {
        let mut generator = ScrambledZipfianGenerator::new(500, 599);
        let mut rng = StdRng::seed_from_u64(9);
        for _ in 0..100_000 {
            let value = generator.next_value(&mut rng);
            assert!((500..=599).contains(&value));
        }
    }
}
