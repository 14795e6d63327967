//! `meridian-ycsb compare`: one command for the side-by-side comparison of Meridian, etcd and
//! embedded RocksDB on YCSB workloads A-F.
//!
//! ```text
//!  for each store, one after the other (2 cores: never two stores at once)
//!    data set 1: start fresh ─► load --records ─► A ─► B ─► C ─► F ─► D ─► stop
//!    data set 2: start fresh ─► load --records ─► E ─────────────────────► stop
//!  then for each store: start fresh ─► closed economy (transactions) ─► validate ─► stop
//!  ─► <out>/results.json, results.md, chart.svg, <store>-<workload>.txt, <store>-economy.txt
//! ```
//!
//! E runs on a fresh reload because D inserts records and E's scans would see them (YCSB's
//! recommended order). Every phase goes through [`crate::cli::execute_phase`], the function
//! behind `load` and `run`, with the built-in workload files and the same `--threads` and
//! `--operations` for every store, so a comparison measures exactly what the single commands do.
//!
//! Stores ([`stores`]):
//! - **meridian**: a 3-node cluster of `meridian start` processes on loopback
//!   (`meridian_cli::LocalCluster`, loopback Raft timings, default shard layout). A write is
//!   acknowledged after a quorum has fsynced it (Raft log group commit).
//! - **etcd**: a 3-member cluster of `etcd` processes on loopback ([`etcd_cluster`]), default
//!   durability (each member fsyncs its WAL before acknowledging), 8 GiB backend quota.
//! - **rocksdb**: the embedded driver on a fresh directory, WAL on but no fsync per write: the
//!   storage engine's own ceiling, with neither replication nor durability.
//!
//! Files: `args.rs` (the flags and the workloads), `plan.rs` (their validation into stores and
//! data sets), `runner.rs` (the orchestration above: [`run`], each data set and phase, cleanup,
//! writing the results), `record.rs` (what each phase produced, gathered in [`Comparison`]);
//! the outputs [`markdown`] and [`chart`]; the closed-economy phase [`economy`]; the run's
//! description [`context`]; the servers [`stores`] and [`etcd_cluster`].
//!
//! # Failure and cleanup
//! - A phase that fails (the client returns an error, the store cannot start, a server process
//!   dies) ends its data set: the store is stopped, the failure is recorded on that phase, the
//!   data set's later phases are recorded as skipped, and the comparison goes on with the next
//!   data set. Single operations that fail are counted in the report (`Return=ERROR`), not fatal.
//! - Results are written even after a failure or an interruption; [`run`] then returns an error
//!   so the exit status is non-zero.
//! - Every server process is owned by a guard that SIGKILLs and reaps it on drop, and is started
//!   with `PR_SET_PDEATHSIG` and in its own process group. Ctrl-C and SIGTERM are raced against
//!   the work: the work is dropped (its guards kill the servers) and the partial results are
//!   written. Start servers only from the thread that drives [`run`] (the main or test thread):
//!   the death signal fires when the spawning *thread* exits.
//!
//! # Not done yet
//! - One machine: clients and all three replicas share the cores, so these are loopback numbers,
//!   not a WAN deployment's.
//! - No warm-up phase and a single repetition; run it again to see the noise.

mod args;
pub mod chart;
pub mod context;
pub mod economy;
pub mod etcd_cluster;
pub mod markdown;
mod plan;
mod record;
mod runner;
pub mod stores;

pub use args::{CompareArgs, WorkloadId, RUN_ORDER};
pub use context::RunContext;
pub use record::{Comparison, OperationSummary, PhaseRecord, PhaseStatus};
pub use runner::run;

/// Most records or operations per phase accepted.
pub const MAX_COUNT: u64 = 1_000_000_000;
/// Most client threads accepted (also `client::MAX_THREADS`).
pub const MAX_THREADS: usize = crate::client::MAX_THREADS;
/// Ports a Meridian cluster of 3 uses above `--base-port` (clients +1..3, Raft +101..103).
pub const MERIDIAN_PORT_SPAN: u16 = 104;
/// Ports the etcd cluster uses above `--etcd-base-port` (clients +1..3, peers +11..13).
pub const ETCD_PORT_SPAN: u16 = 14;
/// Default distance of etcd's ports above `--base-port`.
pub const ETCD_PORT_OFFSET: u16 = 200;
/// Percentiles every phase reports; the tables quote p50 and p99.
pub const PERCENTILES: &str = "50,95,99";
