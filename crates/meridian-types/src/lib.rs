//! Vocabulary shared by every Meridian crate: ids, HLC timestamps, limits and error codes.
//!
//! # Layout
//! - [`ids`]: `ShardId`, `NodeId`.
//! - [`timestamp`]: the HLC [`Timestamp`] newtype every MVCC version and read carries.
//! - [`clock`]: the node's hybrid logical clock with an injectable offset and `max_offset` check.
//! - [`limits`]: every size limit of the public API as a named constant.
//! - [`error`]: stable error codes and the retryable/permanent classification.
//! - [`constraints`]: replica constraints (`+region=eu-west,-zone=c`), shared by server and client.
//! - [`txn_rank`]: a transaction's priority and age, which decide lock conflicts (wound-wait).
//! - [`zones`]: whether losing one zone would leave a shard's voters without a majority.
//!
//! This crate has no heavy dependencies on purpose: the client crate depends on it too.

pub mod clock;
pub mod constraints;
pub mod error;
pub mod ids;
pub mod limits;
pub mod timestamp;
pub mod txn_rank;
pub mod zones;

pub use clock::{Clock, ClockError};
pub use constraints::Constraints;
pub use error::ErrorCode;
pub use ids::{NodeId, ShardId};
pub use timestamp::Timestamp;
pub use txn_rank::{TxnPriority, TxnRank};
