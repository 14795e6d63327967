//! meridian-raft's integration tests, one module each, in one test binary (each binary links
//! RocksDB with its line tables, ~420 MB; see crates/meridian-cli/tests/cluster/main.rs).

mod common;

mod batch_apply;
mod closed_ts;
mod crash;
mod gc;
mod log_store;
mod log_tail;
mod openraft_suite;
mod state_machine;
