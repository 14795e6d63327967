//! The HLC timestamp that orders every MVCC version and every read.
//!
//! A `Timestamp` is uhlc's 64-bit NTP-format time: the upper 32 bits are seconds since the
//! Unix epoch, the lower 32 bits a binary fraction whose low bits uhlc uses as the logical
//! counter. Comparing two timestamps as integers compares them as hybrid logical times, so the
//! newtype is a plain `u64` on the wire and on disk (big-endian where order matters).

use serde::{Deserialize, Serialize};
use std::fmt;

#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct Timestamp(pub u64);

impl Timestamp {
    pub const ZERO: Timestamp = Timestamp(0);
    /// Reads "at the latest version" use this.
    pub const MAX: Timestamp = Timestamp(u64::MAX);

    pub fn as_u64(self) -> u64 {
        self.0
    }

    /// The next representable timestamp; saturates at `MAX`.
    pub fn next(self) -> Timestamp {
        Timestamp(self.0.saturating_add(1))
    }

    /// Physical part in milliseconds since the Unix epoch (for display and offset checks).
    pub fn physical_ms(self) -> u64 {
        let secs = self.0 >> 32;
        let frac = self.0 & 0xFFFF_FFFF;
        secs * 1000 + ((frac * 1000) >> 32)
    }

    /// Builds a timestamp from milliseconds since the Unix epoch (logical part zero).
    pub fn from_physical_ms(ms: u64) -> Timestamp {
        let secs = ms / 1000;
        // Rounded up so that physical_ms(from_physical_ms(ms)) == ms.
        let frac = ((ms % 1000) << 32).div_ceil(1000);
        Timestamp((secs << 32) | frac)
    }
}

impl From<uhlc::NTP64> for Timestamp {
    fn from(t: uhlc::NTP64) -> Self {
        Timestamp(t.as_u64())
    }
}

impl From<Timestamp> for uhlc::NTP64 {
    fn from(t: Timestamp) -> Self {
        uhlc::NTP64(t.0)
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{:08x}", self.physical_ms(), self.0 & 0xFFFF_FFFF)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn physical_ms_round_trips() {
        for ms in [0u64, 1, 999, 1_000, 1_764_000_000_123] {
            assert_eq!(Timestamp::from_physical_ms(ms).physical_ms(), ms);
        }
    }
}
