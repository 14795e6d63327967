//! Meridian's storage layer: the engine trait, its RocksDB and in-memory engines, the key
//! encodings of every keyspace, and MVCC reads and writes on top.
//!
//! # Layout
//! - [`engine`]: the [`Engine`] trait (with its durability contract), [`Cf`] column families,
//!   [`WriteBatch`] and [`EngineOptions`].
//! - [`rocks`]: [`RocksEngine`], one RocksDB per node with five column families.
//! - [`memory`]: [`MemoryEngine`], a `BTreeMap` per column family for tests and simulation.
//! - [`keys`]: order-preserving key layouts (data versions and latest-version slots, Raft
//!   log, Raft metadata, intents).
//! - [`mvcc`]: versioned puts, deletes, point reads (exact-key gets and MultiGet of each
//!   key's latest-version slot, which holds the newest value) and paged scans at an HLC read
//!   timestamp.
//! - `conformance` (feature `testing`): the suite every engine must pass, plus crash checks
//!   of the durability contract for engines that can simulate power loss.
//! - `crash` (feature `testing`): `CrashEngine`, an in-memory engine that loses unsynced
//!   writes on a simulated crash (and `ForgetfulEngine`, which ignores `sync`, as a negative
//!   control).
//! - `faulty` (feature `testing`): `FaultyEngine`, which can hold writes (a stall) and fail
//!   WAL syncs (a dying disk).
//!
//! The crate is synchronous on purpose: every call may block on disk. Async callers run it on
//! `spawn_blocking` or a dedicated pool.

pub mod engine;
pub mod error;
pub mod gc;
pub mod keys;
pub mod memory;
pub mod mvcc;
pub mod rocks;
pub mod uncertainty;

#[cfg(any(test, feature = "testing"))]
pub mod conformance;
#[cfg(any(test, feature = "testing"))]
pub mod crash;
#[cfg(any(test, feature = "testing"))]
pub mod faulty;

pub use engine::{
    BatchOp, Cf, Engine, EngineOptions, KeyRange, KvIter, KvPair, WriteBatch, MAX_ENTRY_BYTES,
};
pub use error::{Error, Result};
pub use memory::MemoryEngine;
pub use rocks::{EngineMemory, RocksEngine, STORAGE_FORMAT_VERSION};
