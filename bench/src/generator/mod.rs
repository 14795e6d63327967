//! Number generators of YCSB's core workload, ported one to one.
//!
//! | module | YCSB class | used for |
//! |---|---|---|
//! | [`hash`] | `Utils.fnvhash64` | hashed insert order, scrambling zipfian ranks |
//! | [`counter`] | `CounterGenerator`, `AcknowledgedCounterGenerator` | load key sequence, insert key sequence during a run |
//! | [`discrete`] | `DiscreteGenerator` | choosing the operation |
//! | [`uniform`] | `UniformLongGenerator` | uniform keys, field choice, scan length |
//! | [`zipfian`] | `ZipfianGenerator`, `ScrambledZipfianGenerator` | zipfian keys, zipfian scan length |
//! | [`latest`] | `SkewedLatestGenerator` | the "latest" request distribution |
//!
//! Randomness is always passed in (`&mut impl Rng`), never taken from a thread-local source, so
//! a run with `-p seed=N` and one thread is reproducible and tests use seeded generators.
//! Generators that keep per-draw state (the zipfian's incrementally extended zeta) are cloned per
//! client thread; only the counters are shared.

pub mod counter;
pub mod discrete;
pub mod hash;
pub mod latest;
pub mod uniform;
pub mod zipfian;

pub use counter::{AcknowledgedCounter, CounterGenerator};
pub use discrete::DiscreteGenerator;
pub use hash::fnv_hash64;
pub use latest::SkewedLatestGenerator;
pub use uniform::UniformLongGenerator;
pub use zipfian::{ScrambledZipfianGenerator, ZipfianGenerator};
