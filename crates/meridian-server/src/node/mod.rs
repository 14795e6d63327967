//! A running node: storage, the multi-Raft host, the founding shard map and the node registry.
//!
//! # Startup
//! 1. Apply the test clock offset, open the node's RocksDB (refusing an incompatible on-disk
//!    format or a data dir that belongs to another cluster), and wait until the clock has
//!    passed the HLC ceiling persisted before the restart (`hlc_ceiling`; refusing to start if
//!    the clock went back further than that can explain).
//! 2. Compute the founding shard map (a pure function of the config, identical on every founding
//!    member) and open a Raft replica for every shard placed on this node.
//! 3. The first replica (in placement order) of each shard initializes that shard's Raft group
//!    at once; the others do so with the same membership only if the group is still pristine
//!    after a few election timeouts (the first one being down or fenced by clock skew).
//! 4. A background task registers this node (client address, region, zone) in the metadata
//!    group (shard 0), forwarding to its leader; Status and leader hints read the registry.
//!    Then it stores the founding shard map there, or checks it against the one stored
//!    (`shard_map_store`; a node with a local metadata replica also checks it before step 2).
//!
//! # Files
//! - `mod.rs` (this file): [`Node`], its startup and shutdown, routing and proposals.
//! - `identity`: the founding shard map and the cluster id derived from it.
//! - `registry`: the node registry in the metadata shard (registration, lookups) and the
//!   founding map's store-or-check there.

use crate::config::{Member, NodeConfig};
use crate::error::{Result, ServerError};
use crate::shard_map::{ShardDescriptor, ShardMap};
use bytes::Bytes;
use meridian_proto::raft::RaftRequest;
use meridian_raft::types::codec;
use meridian_raft::{Command, CommandResult, MultiRaft, ShardReplica};
use meridian_storage::{Engine, EngineOptions, RocksEngine};
use meridian_types::{Clock, NodeId, ShardId, Timestamp};
use openraft::impls::BasicNode;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, RwLock};
use std::time::Duration;

mod identity;
mod registry;

pub use identity::{cluster_id, founding_cluster_id, founding_map};
pub use registry::{node_key, NodeRecord, NODE_KEY_PREFIX};

pub struct Node {
    pub config: NodeConfig,
    pub cluster_id: String,
    pub engine: Arc<RocksEngine>,
    pub host: Arc<MultiRaft>,
    pub clock: Arc<Clock>,
    /// The map this node routes by and hosts replicas of: the founding map, or a newer one the
    /// cluster stored since (replica moves, see `membership`).
    pub(crate) shard_map: crate::shard_map::MapCell,
    /// The founding map (version 1), computed from the configuration.
    pub(crate) founding: Arc<ShardMap>,
    /// `founding` as the metadata shard stores it (`shard_map_store`), encoded once at start.
    shard_map_record: Bytes,
    /// No timestamp at or above the last persisted HLC ceiling is handed out (`hlc_ceiling`).
    pub ceiling: Arc<crate::hlc_ceiling::CeilingGate>,
    registry_cache: RwLock<HashMap<NodeId, NodeRecord>>,
    /// Held while adopting a shard map, so replicas open and retire one map at a time.
    pub(crate) reconciling: tokio::sync::Mutex<()>,
    /// Shards whose Raft membership this node is changing (a move or a survival goal's role
    /// change): one change per shard at a time (see `survival::Changing`).
    pub(crate) changing: crate::survival::Changing,
    /// Persists the HLC ceiling (see `hlc_ceiling`); aborted on shutdown.
    ceiling_keeper: tokio::task::JoinHandle<()>,
    /// Committed records GC passes found unfinished, for the sweeper (see `sweeper`).
    pub(crate) stuck: crate::sweeper::StuckQueue,
    /// Early locks of the shards this node leads (see `kv_early_lock`).
    pub early_locks: crate::kv_early_lock::EarlyLocks,
    /// Replicas whose elections wait for a quorum of their group to answer (see `founding`).
    pub(crate) election_hold: Arc<crate::election_hold::ElectionHold>,
    /// The read barriers client reads passed, by kind (the node's metrics; see `kv_read`).
    pub(crate) read_barriers: crate::kv_read::ReadBarriers,
}

fn raft_config(cfg: &NodeConfig) -> openraft::Config {
    let r = &cfg.raft;
    openraft::Config {
        cluster_name: "meridian".into(),
        heartbeat_interval: r.heartbeat_interval_ms,
        election_timeout_min: r.election_timeout_min_ms,
        election_timeout_max: r.election_timeout_max_ms,
        enable_pre_vote: Some(true),
        // Replicate new entries to followers while the leader's own fsync is in flight: a
        // commit then costs max(leader fsync, follower fsync + RTT), not their sum.
        broadcast_submitted_on_append: Some(true),
        // ...which is why a restarted leader must be elected again: restored at once in its old
        // term (openraft's default), a leader that lost unsynced entries to a power loss would
        // append other entries under log ids a follower already holds, and the follower would
        // keep and apply its own (Jepsen, set × power-loss; see the test below).
        enable_leader_restore: Some(false),
        // Under load, replication acks prove liveness; skip the redundant heartbeats.
        heartbeat_min_interval: Some(r.heartbeat_interval_ms),
        snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(r.snapshot_every_entries),
        max_in_snapshot_log_to_keep: r.logs_to_keep_after_snapshot,
        install_snapshot_timeout: r.rpc_timeout_ms.max(10_000),
        ..Default::default()
    }
}

impl Node {
    pub async fn start(config: NodeConfig) -> anyhow::Result<Arc<Node>> {
        meridian_types::clock::set_process_offset_ms(config.clock_offset_ms);
        let clock = Arc::new(Clock::new(Duration::from_millis(
            config.cluster.max_offset_ms,
        )));
        std::fs::create_dir_all(&config.data_dir).map_err(|e| {
            anyhow::anyhow!("cannot create data_dir {}: {e}", config.data_dir.display())
        })?;
        let db_dir = config.data_dir.join("db");
        let engine = tokio::task::spawn_blocking(move || {
            RocksEngine::open(&db_dir, &EngineOptions::default())
        })
        .await?
        .map_err(|e| {
            anyhow::anyhow!("cannot open storage in {}: {e}", config.data_dir.display())
        })?;
        let engine = Arc::new(engine);

        let founding = Arc::new(founding_map(&config));
        let id = cluster_id(&config.initial_cluster, &founding);
        match engine.read_cluster_id()? {
            None => {
                // A founding member's first start: refused before anything is written. A node
                // joining a running cluster takes the map it has, checked or not.
                let members = &config.initial_cluster;
                let crowded = crate::home::crowded_founding_zones(&founding, members)
                    .filter(|_| config.join.is_none());
                if let Some(why) = crowded {
                    anyhow::bail!("{why}");
                }
                engine.write_cluster_id(&id)?
            }
            Some(existing) if existing == id => {}
            Some(existing) => anyhow::bail!(
                "data dir {} belongs to cluster {existing}, but this node's initial_cluster describes cluster {id}; \
                 use an empty data dir or the original configuration",
                config.data_dir.display()
            ),
        }

        // The map the cluster agreed on wins over this node's configuration (see
        // `shard_map_store`): a node whose configuration gives another map does not start.
        let shard_map_record =
            crate::shard_map_store::encode(&founding).map_err(|e| anyhow::anyhow!(e))?;
        let stored =
            crate::shard_map_store::read_local(&*engine).map_err(|e| anyhow::anyhow!(e))?;
        // The newest map this node knows: its metadata replica's, the one it adopted last
        // (a node without a metadata replica, see `membership`), or the founding one.
        let mut current = (*founding).clone();
        if let Some(stored) = stored {
            if let Some(diff) = crate::shard_map_store::founding_difference(&stored, &founding) {
                anyhow::bail!(
                    "the shard map stored in the metadata shard (version {}) differs from the one \
                     this node's configuration gives: {diff}; start the node with the \
                     configuration the cluster was founded with",
                    stored.version
                );
            }
            tracing::info!(
                version = stored.version,
                "the stored shard map matches this node's"
            );
            if stored.version > current.version {
                current = stored;
            }
        }
        if let Some(cached) =
            crate::membership::read_cached(&*engine).map_err(|e| anyhow::anyhow!(e))?
        {
            if cached.version > current.version && cached.same_layout(&founding) {
                current = cached;
            }
        }
        if current.version > 1 {
            tracing::info!(
                version = current.version,
                "hosting the replicas of a changed shard map"
            );
        }
        crate::home::warn_overridden_homes(&founding, &current);

        let dyn_engine: Arc<dyn Engine> = engine.clone();
        // Before any timestamp is issued: never below one issued before a restart.
        let waited = crate::hlc_ceiling::wait_past_ceiling(&*dyn_engine, &clock).await?;
        if !waited.is_zero() {
            tracing::info!(
                waited_ms = waited.as_millis() as u64,
                "clock passed the HLC ceiling"
            );
        }
        let ceiling = Arc::new(crate::hlc_ceiling::CeilingGate::default());
        ceiling.persisted(crate::hlc_ceiling::persist_ceiling(&*dyn_engine, &clock)?);
        let ceiling_keeper =
            crate::hlc_ceiling::spawn_keeper(dyn_engine.clone(), clock.clone(), ceiling.clone());
        let host = MultiRaft::new(
            config.node_id,
            dyn_engine,
            clock.clone(),
            raft_config(&config),
            Duration::from_millis(config.raft.rpc_timeout_ms),
            config.data_dir.clone(),
        )
        .map_err(|e| anyhow::anyhow!(e))?;
        host.proposals_in_flight.store(
            config.raft.proposals_in_flight,
            std::sync::atomic::Ordering::Relaxed,
        );
        let node = Arc::new(Node {
            cluster_id: id,
            engine,
            host,
            clock,
            shard_map: crate::shard_map::MapCell::new(current),
            founding,
            shard_map_record,
            ceiling,
            registry_cache: RwLock::new(HashMap::new()),
            reconciling: tokio::sync::Mutex::new(()),
            changing: Default::default(),
            config,
            ceiling_keeper,
            stuck: Default::default(),
            early_locks: Default::default(),
            election_hold: Default::default(),
            read_barriers: Default::default(),
        });
        // Before any replica opens: the transport dials peers through their overrides.
        node.refresh_peers();
        let _ = node
            .host
            .client_addr
            .set(node.config.client_addr.to_string());
        crate::founding::open_and_bootstrap(&node).await?;
        let weak = Arc::downgrade(&node);
        node.host.set_map_listener(Arc::new(move |raw: Vec<u8>| {
            let weak = weak.clone();
            Box::pin(async move {
                let node = weak.upgrade().ok_or("the node is stopping")?;
                crate::membership::on_pushed(&node, &raw).await
            })
        }));
        let weak = Arc::downgrade(&node);
        node.host.map_gossip.set_listener(Arc::new(move |peer| {
            let Some(node) = weak.upgrade() else { return };
            tokio::spawn(async move { crate::membership::push_to(&node, peer).await });
        }));
        node.host.spawn_closed_ts(
            node.config.cluster.closed_ts_lag_ms,
            node.config.cluster.closed_ts_interval_ms,
        );
        node.host
            .spawn_quiescence(node.config.raft.quiesce, node.config.raft.rest_followers);
        // The loop holds only a weak reference and ends with the node.
        crate::gc::spawn(&node);
        crate::sweeper::spawn(&node);
        crate::leader_follow::spawn(&node);
        let registering = node.clone();
        tokio::spawn(async move { registering.register_self().await });
        Ok(node)
    }

    pub(crate) fn members(&self) -> BTreeMap<NodeId, BasicNode> {
        self.config
            .initial_cluster
            .iter()
            .map(|m| (m.node_id, BasicNode::new(m.peer_addr.to_string())))
            .collect()
    }

    /// The shard map this node routes by now.
    pub fn map(&self) -> Arc<ShardMap> {
        self.shard_map.get()
    }

    /// Every member: the founding ones (`initial_cluster`), then those that joined since (the
    /// map's `joined`).
    pub fn members_now(&self) -> Vec<Member> {
        let map = self.map();
        let mut all = self.config.initial_cluster.clone();
        all.extend(map.joined.iter().cloned());
        all.retain(|m| !map.forgotten.contains(&m.node_id));
        all
    }

    pub(crate) fn member(&self, id: NodeId) -> Option<Member> {
        self.members_now().into_iter().find(|m| m.node_id == id)
    }

    /// Hands the Raft host the members (whom it pings, sends closed timestamps to and counts in
    /// the clock fence), the dial overrides `peer_dial` gives for them, the forgotten members
    /// and the map version its pings carry. Called at start and whenever a map is adopted.
    pub(crate) fn refresh_peers(&self) {
        let members = self.members_now();
        let overrides = members
            .iter()
            .filter_map(|m| {
                let via = self.config.peer_dial.get(&m.node_id)?;
                Some((m.peer_addr.to_string(), via.to_string()))
            })
            .collect::<HashMap<String, String>>();
        for (addr, via) in &overrides {
            tracing::info!(%addr, %via, "dialling a peer through an override");
        }
        self.host.pool.set_dial_overrides(overrides);
        let map = self.map();
        self.host.set_forgotten(map.forgotten.clone());
        self.host.map_gossip.set_version(map.version);
        self.host.set_peers(
            members
                .iter()
                .map(|m| (m.node_id, m.peer_addr.to_string()))
                .collect(),
        );
    }

    /// Proposes `cmd` to `shard`: locally if this node leads it, else forwarded to the leader
    /// (or, when the leader is unknown, to each replica in turn).
    pub async fn propose_anywhere(
        &self,
        shard: ShardId,
        cmd: Command,
    ) -> std::result::Result<CommandResult, String> {
        if let Some(replica) = self.host.get(shard) {
            self.wake_to_write(&replica).await;
            if replica.raft.is_leader() {
                return replica
                    .raft
                    .client_write(cmd)
                    .await
                    .map(|r| r.data)
                    .map_err(|e| meridian_raft::types::write_error_text(&e));
            }
        }
        let replicas = self
            .map()
            .get(shard)
            .ok_or("unknown shard")?
            .replicas
            .clone();
        let leader = match self.host.get(shard) {
            Some(r) => r.raft.current_leader().await,
            None => None,
        };
        let targets: Vec<NodeId> = match leader {
            Some(l) => vec![l],
            None => replicas,
        };
        let payload = codec::encode(&cmd).map_err(|e| e.to_string())?;
        let mut last_err = String::from("no replica reachable");
        for target in targets.into_iter().filter(|t| *t != self.config.node_id) {
            let Some(member) = self.member(target) else {
                continue;
            };
            let mut client = self.host.pool.client(&member.peer_addr.to_string())?;
            let mut req = tonic::Request::new(RaftRequest {
                shard_id: shard.0,
                hlc: self.clock.now().0,
                from_node: self.config.node_id,
                payload: payload.clone().into(),
            });
            req.set_timeout(Duration::from_millis(self.config.raft.rpc_timeout_ms));
            match client.propose(req).await {
                Ok(reply) => {
                    let reply = reply.into_inner();
                    let _ = self.clock.update(Timestamp(reply.hlc));
                    let r: std::result::Result<CommandResult, String> =
                        codec::decode(&reply.payload).map_err(|e| e.to_string())?;
                    match r {
                        Ok(v) => return Ok(v),
                        Err(e) => last_err = format!("node {target}: {e}"),
                    }
                }
                Err(s) => last_err = format!("node {target}: {}", s.message()),
            }
        }
        Err(last_err)
    }

    /// This node's replica of `shard`, or `WRONG_SHARD`.
    /// Every client request goes through here, so it also wakes a quiesced shard.
    pub fn replica(&self, shard: ShardId) -> Result<Arc<ShardReplica>> {
        let replica = self.host.get(shard).ok_or_else(|| {
            ServerError::WrongShard(format!(
                "shard {shard} has no replica on node {}",
                self.config.node_id
            ))
        })?;
        self.touch(&replica);
        Ok(replica)
    }

    /// Notes activity on `replica` and wakes it if quiesced (a parked follower asks its leader
    /// to `Wake`). Also right before anything is proposed to it: a parked leader then leaves
    /// the parked state, and serves no more parked reads, before the entry exists (a request
    /// may wait longer than the shard's idle threshold between routing and proposing).
    pub fn touch(&self, replica: &ShardReplica) {
        if let Some(leader) = replica.touch() {
            self.host.send_wake(replica.shard, leader);
        }
    }

    /// Right before this node appends an entry to `replica`'s group as its leader (a
    /// membership change, a GC page, a metadata write): wakes it ([`Self::touch`]) and renews a
    /// lapsed quorum lease, without which openraft refuses the entry as if nobody led
    /// (`meridian_raft::write_lease`).
    pub async fn wake_to_write(&self, replica: &ShardReplica) {
        self.touch(replica);
        replica.renew_lapsed_lease().await;
    }

    /// The data shard owning `key` and this node's replica of it.
    pub fn route(&self, key: &[u8]) -> Result<(ShardDescriptor, Arc<ShardReplica>)> {
        let desc = self.map().lookup(key).clone();
        let replica = self.replica(desc.id)?;
        Ok((desc, replica))
    }

    pub async fn not_leader(&self, shard: ShardId, leader: Option<NodeId>) -> ServerError {
        let leader = match leader {
            Some(id) if id != self.config.node_id => self.client_addr_of(id).await.map(|a| (id, a)),
            _ => None,
        };
        ServerError::NotLeader { shard, leader }
    }

    /// Stops Raft, flushes RocksDB. In-flight requests have been drained by the servers.
    pub async fn shutdown(&self) {
        self.ceiling_keeper.abort();
        self.host.shutdown().await;
        let engine = self.engine.clone();
        match tokio::task::spawn_blocking(move || engine.flush()).await {
            Ok(Ok(())) => tracing::info!("storage flushed"),
            Ok(Err(e)) => tracing::error!(error = %e, "flushing storage on shutdown"),
            Err(e) => tracing::error!(error = %e, "flush task"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A restarted leader must win a new election before it leads again. openraft would
    /// otherwise restore its leadership at once, in the same term (`enable_leader_restore`,
    /// on by default); with `broadcast_submitted_on_append` followers can hold entries the
    /// leader had not yet synced, so a leader that lost power comes back with a shorter log and
    /// appends *other* entries under log ids a follower already holds — which the follower
    /// keeps (same log id, assumed same entry), and applies. The Jepsen runs in
    /// `jepsen/evidence/set-power-loss-20261202T063639Z` and `set-all-20261202T065115Z` show
    /// acknowledged adds missing from a replica and from the final read that way.
    #[test]
    fn a_restarted_leader_is_elected_again_not_restored() {
        let args = crate::config::test_args();
        let config = raft_config(&NodeConfig::load(&args).unwrap());
        assert_eq!(config.enable_leader_restore, Some(false));
        assert_eq!(config.broadcast_submitted_on_append, Some(true));
    }

    /// The default timings pass openraft's own checks (a node with them starts), and the
    /// heartbeat interval, which openraft also uses as each heartbeat's timeout, leaves room
    /// for the default WAN matrix's longest round trip (us-east to ap-south, 200 ms): at 150 ms
    /// a leader with its only live follower that far away refused every write.
    #[test]
    fn default_timings_validate_and_outlast_the_longest_default_round_trip() {
        let args = crate::config::test_args();
        let config = raft_config(&NodeConfig::load(&args).unwrap());
        let config = config.validate().expect("openraft accepts the defaults");
        assert!(
            config.heartbeat_interval > 200,
            "heartbeat_interval {} ms",
            config.heartbeat_interval
        );
        assert_eq!(
            meridian_raft::rtt_watch::heartbeat_rtt_warning(3, 200, config.heartbeat_interval),
            None
        );
    }

    /// Every timing the node's own checks accept, openraft accepts too, so a bad setting is
    /// refused at load with the setting's name rather than by openraft when the node starts
    /// (`MultiRaft::new`). openraft also wants the widest gap between heartbeats (twice the interval,
    /// since `heartbeat_min_interval` equals it, plus one tick of 13/64 of it, at least
    /// 1 ms) below `election_timeout_min`: a 1 ms interval with a 3 ms minimum passed the
    /// "a third of the minimum" rule and not openraft's.
    #[test]
    fn timings_the_node_accepts_openraft_accepts() {
        let mut accepted = 0;
        for hb in 1..=40u64 {
            for min in 1..=130u64 {
                let mut args = crate::config::test_args();
                args.heartbeat_interval_ms = Some(hb);
                args.election_timeout_min_ms = Some(min);
                let Ok(cfg) = NodeConfig::load(&args) else {
                    continue;
                };
                accepted += 1;
                if let Err(e) = raft_config(&cfg).validate() {
                    panic!("heartbeat {hb} ms, election timeout min {min} ms: the node accepts it, openraft refuses: {e}");
                }
            }
        }
        assert!(accepted > 1_000, "only {accepted} timings accepted");
    }
}
