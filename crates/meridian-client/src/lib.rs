//! The Rust client for Meridian.
//!
//! A [`Client`] keeps a cached shard map (from `Cluster.Status`), sends every key-value request
//! to the leader of the key's shard, follows `NOT_LEADER` hints, refreshes the map on
//! `WRONG_SHARD`, `UNAVAILABLE` and transport errors, and backs off with jitter — all within
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
//! // Scans page across shards at one read timestamp.
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
//! - [`client`]: [`Client`], the retry loop, batch grouping, scan paging.
//! - [`routing`]: the shard map and leader cache (pure, unit-tested).
//! - [`error`]: [`Error`] and the gRPC status → error mapping.
//! - [`config`]: [`ClientConfig`] and its defaults.
//! - `backoff`, `validate`: jittered exponential backoff; client-side limit checks.
//!
//! # Guarantees
//! - Single-key operations are linearizable (reads use [`ReadConsistency::Linearizable`]
//!   unless configured otherwise).
//! - `batch_put` is atomic per shard only; `batch_get` reads each shard at its own timestamp;
//!   `scan` reads every page at the first page's timestamp.
//! - Inputs over `meridian_types::limits` fail fast with [`Error::InvalidArgument`].
//!
//! # Not done yet
//! - Transactions, follower reads, retry deduplication of writes whose outcome was unknown.

mod backoff;
pub mod client;
pub mod config;
pub mod error;
pub mod routing;
mod validate;
mod write_retry;

pub use client::{fetch_status, Client, KeyValue, Versioned};
pub use config::{ClientConfig, ReadConsistency};
pub use error::{Error, LeaderHint, Result};
pub use meridian_proto::kv as proto;
pub use meridian_types::Timestamp;
pub use routing::{NodeRoute, ShardMap, ShardRoute};
