//! Meridian's multi-Raft layer: one openraft group per shard, many groups per node.
//!
//! # Layout
//! - [`types`]: the openraft type config, the replicated [`types::Command`], the binary codec;
//!   the commands themselves are defined in `command` and checked in `command_check`.
//! - [`log_store`]: a shard's Raft log in the node's shared RocksDB (`raft_log` / `raft_meta`).
//! - [`log_writer`]: group commit — one fsync for the appends of every shard.
//! - [`state_machine`]: MVCC apply with the applied index persisted atomically; file snapshots
//!   installed crash-atomically.
//! - [`closed_ts`]: closed timestamps: a leader's promise that no write at or below a
//!   timestamp is still to come past a log index; followers serve reads below it.
//! - [`closed_ts_channel`]: the side channel carrying idle and quiesced shards' closed
//!   timestamps, node to node, without waking them.
//! - [`locks`]: prepared locks and transaction records of multi-shard transactions;
//!   [`resolutions`]: the commits a replica resolved lately, for snapshot reads.
//! - [`dedup`]: the per-shard table of applied write request ids that makes retries safe.
//! - [`network`]: the peer transport client (one channel per peer, deadlines, HLC on every RPC
//!   but pings); [`heartbeat_batch`]: every group's heartbeats to a peer node in one call.
//! - [`host`]: the per-node shard table and the transport service routing by shard id.
//! - [`quiesce`]: idle shards stop ticking; node-level pings notice a dead leader instead.
//! - [`clock_fence`]: the pings' clock offsets; a node out of step with a majority stops.
//! - [`rtt_watch`]: the pings' round trips; a warning when heartbeats cannot be answered in time.
//!
//! # Invariants
//! - An entry is acknowledged to openraft as flushed only after an fsync that followed it.
//! - Applied index, membership, version floor and dedup entries are written in the same atomic
//!   batch as the data they describe.
//! - Apply is total: a command that fails validation is applied as a rejection, never a panic.
//! - Apply touches only its shard's span of the user keyspace (`span_check`) and its own
//!   shard-local keys.
//! - Every RPC carries the sender's HLC timestamp and is rejected beyond `max_offset`.
//! - Except the node-level ping: it carries no HLC, only the answering node's physical clock.
//! - A node whose clock is more than 80% of `max_offset` off from a majority of the cluster on
//!   three checks in a row exits (status 5).
//!
//! # Not done yet
//! - Leader placement preferences and leader transfer on request.
//! - Membership changes (adding / removing replicas); the founding membership is static.

mod append_credit;
mod apply;
mod apply_2pc;
pub mod clock_fence;
pub mod closed_ts;
pub mod closed_ts_channel;
mod command;
mod command_check;
pub mod dedup;
pub mod early_locks;
#[cfg(test)]
mod fake_peer;
pub mod gc_survey;
pub mod heartbeat_batch;
pub mod host;
pub mod issued;
pub mod locks;
pub mod log_store;
pub mod log_tail;
pub mod log_writer;
pub mod map_gossip;
#[cfg(test)]
mod model_rng;
pub mod network;
pub mod parked_lease;
pub mod parked_promise;
pub mod peer_pool;
pub mod peer_streams;
pub mod proposals;
pub mod quiesce;
pub mod resolutions;
pub mod rest;
mod retire;
pub mod rtt_watch;
pub mod span_check;
pub mod state_machine;
pub mod transport;
mod transport_admit;
pub mod transport_stats;
pub mod txn_check;
pub mod types;
pub mod write_lease;

pub use host::{MultiRaft, ShardReplica, TransportService};
pub use types::{
    Command, CommandResult, Expect, GcRecordsResult, GcResult, NodeId, Raft, RangeCheck, ReadCheck,
    RequestId, StuckRecord, TypeConfig,
};
