//! Builders shared by the unit tests of the planners (`decommission`, `survival_plan`).

use meridian_proto::kv::{NodeInfo, ShardInfo, StatusResponse};

/// A cluster status with nodes as (id, region, zone, live) and shards as (id, replicas).
pub fn status(nodes: &[(u64, &str, &str, bool)], shards: &[(u64, &[u64])]) -> StatusResponse {
    StatusResponse {
        nodes: nodes
            .iter()
            .map(|(id, region, zone, live)| NodeInfo {
                node_id: *id,
                region: region.to_string(),
                zone: zone.to_string(),
                live: *live,
                ..Default::default()
            })
            .collect(),
        shards: shards
            .iter()
            .map(|(id, replicas)| ShardInfo {
                shard_id: *id,
                replicas: replicas.to_vec(),
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    }
}
