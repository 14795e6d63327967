//! FNV-1a 64-bit hashing of key numbers, as YCSB's `Utils.fnvhash64` does it.
//!
//! YCSB scatters sequential key numbers over the key space (`insertorder=hashed`) and maps
//! zipfian ranks onto key numbers (the scrambled zipfian generator) with this hash. To produce
//! the same keys as Java YCSB, the port must match it bit for bit:
//!
//! - the input is the 8 bytes of the key number, least significant byte first;
//! - each byte is XORed in and then the state multiplied by the FNV prime (FNV-1a order);
//! - the result is read as a Java `long` and passed through `Math.abs`.
//!
//! `Math.abs(Long.MIN_VALUE)` is `Long.MIN_VALUE` in Java (two's complement overflow), so the
//! result is an `i64` that is non-negative except in that one case out of 2^64; callers that
//! need a non-negative number say what they do with it.

/// FNV-1a 64-bit offset basis.
pub const FNV_OFFSET_BASIS_64: u64 = 0xCBF2_9CE4_8422_2325;
/// FNV 64-bit prime.
pub const FNV_PRIME_64: u64 = 1_099_511_628_211;

/// Hashes `value` exactly as YCSB's `Utils.fnvhash64(long)`.
pub fn fnv_hash64(value: i64) -> i64 {
    let mut hash = FNV_OFFSET_BASIS_64;
    for octet in value.to_le_bytes() {
        hash ^= u64::from(octet);
        hash = hash.wrapping_mul(FNV_PRIME_64);
    }
    // Java's Math.abs on a long: wraps for Long.MIN_VALUE.
    (hash as i64).wrapping_abs()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The hash matches Java YCSB's `Utils.fnvhash64` on known key numbers.
    #[test]
    fn matches_java_vectors() {
        assert_eq!(fnv_hash64(0), 6_284_781_860_667_377_211);
        assert_eq!(fnv_hash64(1), 8_517_097_267_634_966_620);
        assert_eq!(fnv_hash64(2), 1_820_151_046_732_198_393);
        assert_eq!(fnv_hash64(999), 2_071_219_101_098_386_137);
    }

    /// The absolute value step applies: no ordinary input yields a negative hash.
    #[test]
    fn result_is_non_negative_for_small_inputs() {
        for value in 0..100_000 {
            assert!(fnv_hash64(value) >= 0, "negative hash for {value}");
        }
    }
}
