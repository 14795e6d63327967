//! Identifiers. Shard ids are dense small integers assigned by the metadata group; shard 0 is
//! the metadata group itself, data shards start at 1.

use serde::{Deserialize, Serialize};
use std::fmt;

/// A node's id: unique in its cluster, never reused. Raft uses it as the replica id.
pub type NodeId = u64;

/// The id of a range shard (one Raft group). `ShardId::META` holds the shard map.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ShardId(pub u64);

impl ShardId {
    /// The metadata group: shard map and node registry. It owns no user keys.
    pub const META: ShardId = ShardId(0);

    pub fn is_meta(self) -> bool {
        self == Self::META
    }
}

impl fmt::Display for ShardId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "s{}", self.0)
    }
}
