//! meridian-bench: a Rust port of YCSB's core workload (`site.ycsb.workloads.CoreWorkload`)
//! with drivers for Meridian, etcd and embedded RocksDB, so the three run the same workloads
//! side by side and report in YCSB's format.
//!
//! # Layout
//!
//! - [`cli`]: the `meridian-ycsb` command line (`load` / `run` / `compare`), the whole binary.
//! - [`bulk_load`]: `bulk-load`, which writes a table's records in per-shard batches (for
//!   experiments that need a large data set, not a measured load).
//! - [`compare`]: `compare`, which starts Meridian, etcd and RocksDB in turn, runs workloads
//!   A-F on each and writes `results.json`, `results.md` and `chart.svg`.
//! - [`client`]: client threads, throttling (`--target`), status lines and progress bar.
//! - [`workload`]: the core workload: operation mix, key choice, record values.
//! - [`generator`]: YCSB's number generators (FNV hash, counters, discrete, uniform, zipfian,
//!   scrambled zipfian, skewed latest), each with unit tests.
//! - [`wrapper`]: YCSB's `DBWrapper`, which times every driver call.
//! - [`measurements`]: per-operation HdrHistograms and status counts.
//! - [`report`]: the text report (render and parse) and its JSON form.
//! - [`record`]: the single record encoding all drivers share.
//! - [`db`]: the driver traits and the rocksdb, etcd and meridian drivers.
//! - [`properties`]: the Java properties parser for workload files.
//!
//! Faithfulness to YCSB is the point: key names, hashes, the zipfian constants and item counts,
//! the acknowledged insert counter, operation order in the chooser and the report's text are
//! YCSB's. Deviations are listed in the module that makes them and in `bench/README.md`.

pub mod bulk_load;
pub mod cli;
pub mod client;
pub mod compare;
pub mod db;
pub mod economy;
pub mod generator;
pub mod geo;
pub mod measurements;
pub mod properties;
pub mod record;
pub mod report;
pub mod workload;
pub mod wrapper;
