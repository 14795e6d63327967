//! The multi-process cluster tests: real `meridian start` processes on loopback, each test in
//! its own module with its own port range (see `common`).
//!
//! They are one test binary, not one per file: each binary links RocksDB and its line tables
//! (about 470 MB), and 39 of them took 18 GB of the shared target directory on machines whose
//! disk is shared and was seen with under 300 MB free. nextest still runs every test in its
//! own process, one cluster test at a time (`.config/nextest.toml`).

mod common;

mod bad_input;
mod cas;
mod client_safety;
mod clock_offset;
mod closed_ts;
mod coalesced_writes;
mod first_election;
mod follower_reads;
mod full_cluster_restart_keeps_data;
mod gc;
mod heartbeat_batch;
mod home_regions;
mod join;
mod kill_leader_under_load;
mod metrics;
mod move_partition;
mod parked_lease;
mod parked_reads;
mod paused_leader;
mod quiescence;
mod quiescence_opt_out;
mod quiescence_wake;
mod ready_many_nodes;
mod replica_constraints;
mod replica_moves;
mod resting_followers;
mod shard_map;
mod snapshot_scan;
mod stale_snapshot;
mod transfer_leader;
mod txn;
mod txn_clock;
mod txn_early_locks;
mod txn_linearizable;
mod txn_record_gc;
mod txn_recovery;
mod txn_wound_wait;
mod vote_refusal;
mod wan;
mod zone_spread;
mod zone_survival;
