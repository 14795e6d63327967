//! The `meridian` command line, as a library so tests share its machinery.
//!
//! # Layout
//! - [`local_cluster`]: real `meridian start` child processes on loopback, with ordered
//!   shutdown and no leftovers; used by `meridian demo` and by the cluster tests.
//! - [`demo`]: `meridian demo` — cluster, sample data, mixed workload, latency report;
//!   [`demo_bank`]: its transactions phase.
//! - [`commands`]: `meridian kv get|put|del|cas|scan|txn` and `meridian cluster status`.
//! - [`txn_steps`]: the steps of `meridian kv txn`.
//! - [`display`]: byte formatting (text or hex) and the status tables.
//! - [`heap`]: why the binary allocates with jemalloc, and its figures for `/metrics`.
//!
//! `main.rs` only installs the allocator, parses arguments, sets up tracing and the runtime,
//! and maps errors to a non-zero exit code.

pub mod commands;
pub mod demo;
pub mod demo_bank;
pub mod display;
pub mod heap;
pub mod local_cluster;
pub mod txn_steps;

pub use local_cluster::{LocalCluster, LocalClusterConfig};
