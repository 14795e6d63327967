//! The node registry: each node's record (client and peer address, region, zone) in the
//! metadata shard, written at startup and read by `Status` and leader hints; and, right after
//! registering, the founding shard map stored there or checked against the stored one.

use super::Node;
use bytes::Bytes;
use meridian_raft::Command;
use meridian_storage::mvcc;
use meridian_types::{NodeId, ShardId, Timestamp};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

/// Key prefix of node records in the metadata group.
pub const NODE_KEY_PREFIX: &[u8] = b"node/";

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeRecord {
    pub node_id: NodeId,
    pub client_addr: String,
    pub peer_addr: String,
    pub region: String,
    pub zone: String,
}

pub fn node_key(id: NodeId) -> Vec<u8> {
    let mut k = NODE_KEY_PREFIX.to_vec();
    k.extend_from_slice(format!("{id:020}").as_bytes());
    k
}

/// Stops the node: its configuration gives another shard map than the one the cluster stored.
fn map_mismatch(diff: &str) -> ! {
    tracing::error!(%diff, "this node's shard map differs from the stored one; stopping");
    eprintln!(
        "fatal: the shard map stored in the metadata shard differs from the one this node's \
         configuration gives ({diff}); stopping (start the node with the configuration the \
         cluster was founded with)"
    );
    std::process::exit(crate::shard_map_store::EXIT_MAP_MISMATCH)
}

impl Node {
    fn my_record(&self) -> NodeRecord {
        NodeRecord {
            node_id: self.config.node_id,
            client_addr: self.config.client_addr.to_string(),
            peer_addr: self.config.peer_addr.to_string(),
            region: self.config.region.clone(),
            zone: self.config.zone.clone(),
        }
    }

    /// Registers this node in the metadata group; retries with backoff until it succeeds.
    pub(super) async fn register_self(self: Arc<Self>) {
        let record = self.my_record();
        let puts = vec![(
            Bytes::from(node_key(record.node_id)),
            Bytes::from(serde_json::to_vec(&record).expect("node record serializes")),
        )];
        let mut delay = Duration::from_millis(20);
        loop {
            let cmd = Command::Write {
                ts: self.clock.now().0,
                puts: puts.clone(),
                deletes: Vec::new(),
                // Re-proposing the same registration is harmless: it overwrites equal values.
                request: None,
            };
            match self.propose_anywhere(ShardId::META, cmd).await {
                Ok(_) => {
                    tracing::info!(node = record.node_id, "registered in the metadata group");
                    break;
                }
                Err(e) => tracing::debug!(error = %e, "node registration not done yet; retrying"),
            }
            tokio::time::sleep(delay).await;
            // Kept short: clients cannot route to this node until it is registered.
            delay = (delay * 2).min(Duration::from_millis(200));
        }
        self.store_or_check_shard_map().await;
    }

    /// Stores this node's founding map in the metadata shard unless a map is stored already,
    /// in which case it must be this node's (see `shard_map_store`): a node whose map differs
    /// stops. Retries until the metadata shard answers.
    async fn store_or_check_shard_map(&self) {
        let mut delay = Duration::from_millis(50);
        loop {
            let cmd = Command::Cas {
                ts: self.clock.now().0,
                key: Bytes::from_static(crate::shard_map_store::SHARD_MAP_KEY),
                expect: meridian_raft::Expect::Absent,
                value: Some(self.shard_map_record.clone()),
                request: None,
            };
            match self.propose_anywhere(ShardId::META, cmd).await {
                Ok(result) => match result.mismatch {
                    None if result.rejected.is_none() => {
                        tracing::info!(
                            version = self.founding.version,
                            "stored the founding shard map in the metadata group"
                        );
                        return;
                    }
                    Some(Some((_, raw))) => {
                        let stored = crate::shard_map_store::decode(&raw);
                        let diff = stored.as_ref().map(|stored| {
                            crate::shard_map_store::founding_difference(stored, &self.founding)
                        });
                        match diff {
                            Ok(None) => {
                                tracing::info!("the stored shard map matches this node's");
                                if let Ok(stored) = stored {
                                    crate::membership::adopt(self, stored).await;
                                }
                                return;
                            }
                            Ok(Some(diff)) => map_mismatch(&diff),
                            Err(e) => map_mismatch(e),
                        }
                    }
                    _ => tracing::warn!(?result, "unexpected answer storing the shard map"),
                },
                Err(e) => {
                    tracing::debug!(error = %e, "storing the shard map not done yet; retrying")
                }
            }
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(Duration::from_secs(1));
        }
    }

    /// Registered nodes, read from the local metadata replica; members not found there (a
    /// node without a metadata replica, or one not registered yet) get what this node read
    /// before, or the client address their ping replies gave.
    pub async fn registry(&self) -> BTreeMap<NodeId, NodeRecord> {
        let forgotten = self.map().forgotten.clone();
        let mut out: BTreeMap<NodeId, NodeRecord> = self
            .members_now()
            .into_iter()
            .map(|m| {
                (
                    m.node_id,
                    NodeRecord {
                        node_id: m.node_id,
                        client_addr: String::new(),
                        peer_addr: m.peer_addr.to_string(),
                        region: m.region.clone(),
                        zone: m.zone.clone(),
                    },
                )
            })
            .collect();
        if self.host.get(ShardId::META).is_some() {
            let engine = self.engine.clone();
            let rows = tokio::task::spawn_blocking(move || {
                let mut end = NODE_KEY_PREFIX.to_vec();
                *end.last_mut().expect("non-empty prefix") += 1;
                mvcc::scan(
                    &*engine,
                    ShardId::META,
                    NODE_KEY_PREFIX,
                    Some(&end),
                    Timestamp::MAX,
                    10_000,
                    false,
                )
            })
            .await;
            if let Ok(Ok(page)) = rows {
                for (_, _, value) in page.rows {
                    if let Ok(rec) = serde_json::from_slice::<NodeRecord>(&value) {
                        // A forgotten member's registration stays; it is no longer listed.
                        if !forgotten.contains(&rec.node_id) {
                            out.insert(rec.node_id, rec);
                        }
                    }
                }
            }
        }
        let mut cache = self.registry_cache.write().expect("registry cache lock");
        for (id, rec) in &out {
            if !rec.client_addr.is_empty() {
                cache.insert(*id, rec.clone());
            }
        }
        cache.retain(|id, _| !forgotten.contains(id));
        // A node that no longer (or never) holds a metadata replica fills the gaps from the
        // registrations it read while it did, then from its pings' replies.
        for (id, rec) in cache.iter() {
            let entry = out.entry(*id).or_insert_with(|| rec.clone());
            if entry.client_addr.is_empty() {
                *entry = rec.clone();
            }
        }
        for (id, rec) in out.iter_mut() {
            if rec.client_addr.is_empty() {
                if let Some(addr) = self.host.pool.client_addr_of(*id) {
                    rec.client_addr = addr;
                }
            }
        }
        if let Some(me) = out.get_mut(&self.config.node_id) {
            if me.client_addr.is_empty() {
                me.client_addr = self.config.client_addr.to_string();
            }
        }
        out
    }

    /// The client address of `node`, if registered.
    pub async fn client_addr_of(&self, node: NodeId) -> Option<String> {
        if let Some(r) = self
            .registry_cache
            .read()
            .expect("registry cache lock")
            .get(&node)
        {
            return Some(r.client_addr.clone());
        }
        self.registry()
            .await
            .get(&node)
            .map(|r| r.client_addr.clone())
            .filter(|a| !a.is_empty())
    }
}
