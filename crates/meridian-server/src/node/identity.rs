//! The cluster's identity: the founding shard map and the cluster id.
//!
//! The cluster id is derived from the founding member list and shard layout, so founding
//! members agree on it without coordination. It is written into the data dir at first start and
//! checked on every later start.

use crate::config::{Member, NodeConfig};
use crate::shard_map::ShardMap;

/// A stable id for the founding configuration (FNV-1a over its canonical text).
pub fn cluster_id(members: &[Member], map: &ShardMap) -> String {
    let mut members: Vec<&Member> = members.iter().collect();
    members.sort_by_key(|m| m.node_id);
    let mut text = String::new();
    for m in members {
        text.push_str(&format!("{}={};", m.node_id, m.peer_addr));
    }
    for s in &map.data {
        text.push_str(&format!("{}:{:?};", s.id.0, s.start));
    }
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in text.bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x100_0000_01b3);
    }
    format!("mer-{h:016x}")
}

/// The founding shard map `config` gives (see `shard_map`).
pub fn founding_map(config: &NodeConfig) -> ShardMap {
    let splits: Vec<Vec<u8>> = config
        .cluster
        .split_points
        .iter()
        .map(|s| s.as_bytes().to_vec())
        .collect();
    ShardMap::founding(
        &config.initial_cluster,
        config.cluster.replication_factor as usize,
        &splits,
        config.cluster.initial_shards,
    )
    .with_constraints(
        &config.replica_constraints,
        &config.initial_cluster,
        config.cluster.replication_factor as usize,
    )
    .with_homes(&config.home_regions, &config.initial_cluster)
}

/// The cluster id `config`'s founding members and map make (see [`cluster_id`]).
pub fn founding_cluster_id(config: &NodeConfig) -> String {
    cluster_id(&config.initial_cluster, &founding_map(config))
}
