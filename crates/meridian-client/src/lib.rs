//! The Rust client for Meridian.
//!
//! A [`Client`] keeps a cached shard map (from `Cluster.Status`), sends every key-value request
//! to the leader of the key's shard (a stale read to the nearest replica first, see [`stale`]),
//! follows `NOT_LEADER` hints, refreshes the map on `WRONG_SHARD`, `UNAVAILABLE` and transport
//! errors, and backs off with jitter — all within
//! one deadline per public call (`ClientConfig::call_timeout`), after which it returns
//! [`Error::DeadlineExceeded`] carrying the last error seen.
//!
//! ```no_run
//! use meridian_client::{Client, ClientConfig};
//!
//! # async fn example() -> Result<(), meridian_client::Error> {
//! let client = Client::connect(ClientConfig::new(["127.0.0.1:7001", "127.0.0.1:7002"])).await?;
//!
//! let commit_ts = client.put("user/42", "alice").await?;
//! assert_eq!(client.get("user/42").await?.as_deref(), Some(&b"alice"[..]));
//!
//! // Batches are split per shard and run in parallel; results keep input order.
//! client.batch_put([("user/1", "ann"), ("user/2", "bob")]).await?;
//! let values = client.batch_get(["user/1", "user/3", "user/2"]).await?;
//! assert!(values[1].is_none());
//!
//! // Optimistic read-modify-write: swap only if the version read is still the newest.
//! use meridian_client::{CasOutcome, Expect};
//! let seen = client.get_versioned("user/1").await?.expect("written above");
//! match client.compare_and_swap("user/1", Expect::Version(seen.version_ts), Some("ann2".into())).await? {
//!     CasOutcome::Swapped { commit_ts } => println!("swapped at {commit_ts}"),
//!     CasOutcome::Mismatch { current } => println!("lost the race; now {current:?}"),
//! }
//!
//! // Scans page across shards; the rows are one snapshot (see `multi`).
//! for row in client.scan("user/", Some("user0".into()), 100, false).await? {
//!     println!("{:?} = {:?} @ {}", row.key, row.value, row.version_ts);
//! }
//! client.delete("user/42").await?;
//! # let _ = commit_ts;
//! # Ok(())
//! # }
//! ```
//!
//! # Layout
//! - [`client`]: [`Client`], the retry loop, single-key calls, status.
//! - `multi`: scans paging across shards, batches split by shard.
//! - [`cas`]: [`Client::compare_and_swap`], a conditional write evaluated by the shard.
//! - [`txn`]: [`Client::txn`], optimistic serializable transactions (one Raft entry on one shard,
//!   a parallel commit across shards: `txn_2pc`, settled by `txn_recover` when in doubt).
//! - [`routing`]: the shard map and leader cache (pure, unit-tested).
//! - [`stale`]: [`Client::get_with`], [`Client::stale_snapshot`] and the nearest-replica routing of stale (follower)
//!   reads.
//! - [`error`]: [`Error`] and the gRPC status → error mapping.
//! - [`config`]: [`ClientConfig`] and its defaults.
//! - `backoff`, `validate`: jittered exponential backoff; client-side limit checks.
//!
//! # Guarantees
//! - Single-key operations are linearizable (reads use [`ReadConsistency::Linearizable`]
//!   unless configured otherwise).
//! - `compare_and_swap` is linearizable: the shard checks the condition and writes in one step.
//! - `txn` is serializable and sees every write acknowledged before it began, while the nodes'
//!   clocks stay within `max_offset`: every attempt reads one snapshot (all shards at one
//!   timestamp; restarted past a version within the clock uncertainty), and one that writes
//!   commits only if everything it read still holds at its commit point. Under clock skew two
//!   later writes to different shards may be seen out of real-time order (see `txn`). Read-write
//!   transactions may span shards (a parallel commit acknowledged after one consensus round,
//!   see `txn_2pc`); read-only ones commit nothing.
//! - Writes carry a write id on every attempt, so a retry never applies a write twice; a call
//!   that ends without knowing the outcome returns [`Error::Ambiguous`].
//! - `batch_put` is atomic per shard only; `batch_get` reads each shard at its own timestamp;
//!   `scan` is one snapshot: a scan that needs more than one page reads them all at one
//!   timestamp (see `multi`).
//! - A stale read ([`ReadConsistency::BoundedStaleness`], `ExactStaleness`, `AsOf`; see
//!   [`stale`]) is the key's (or range's) final state at its returned `read_ts`, served by
//!   the nearest replica that can; a multi-page stale scan is one snapshot; a
//!   [`StaleSnapshot`] reads and scans keys on any shards at one timestamp (a read-only
//!   transaction over stale reads).
//! - Inputs over `meridian_types::limits` fail fast with [`Error::InvalidArgument`].
//!
//! # Not done yet
//! - Reverse scans in a [`StaleSnapshot`] or a transaction.

mod admin;
mod backoff;
pub mod cas;
pub mod client;
pub mod config;
pub mod constraint_plan;
pub mod decommission;
mod early_lock;
pub mod error;
mod locks;
mod multi;
mod oracle;
pub mod routing;
mod snapshot;
pub mod stale;
pub mod survival_plan;
#[cfg(test)]
mod test_support;
pub mod txn;
mod txn_2pc;
mod txn_commit;
mod txn_recover;
mod validate;
mod write_retry;

pub use admin::{ReplicaChange, Survival};
pub use cas::{CasOutcome, Expect};
pub use client::{fetch_status, Client, KeyValue, Versioned};
pub use config::{ClientConfig, ReadConsistency};
pub use error::{Error, LeaderHint, LockInfo, Result};
pub use meridian_proto::kv as proto;
/// The size limits every call is checked against before it is sent.
pub use meridian_types::limits;
pub use meridian_types::{Constraints, Timestamp, TxnPriority, TxnRank};
pub use routing::{NodeRoute, ShardMap, ShardRoute};
pub use stale::{StaleRead, StaleSnapshot};
pub use txn::{CommitInfo, Isolation, Txn, TxnBody, TxnOptions, WOUND_WAIT_FROM_ATTEMPT};
