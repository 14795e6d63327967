//! The multi-Raft host: every shard replica on this node (the transport service that routes
//! peer messages to them by shard id is in `transport`).
//!
//! One [`MultiRaft`] per node owns the shared pieces — the RocksDB engine, the group-commit
//! [`LogWriter`], the peer channel pool and the HLC — and one openraft `Raft` per shard replica.
//! Shards are added at startup (the shard map) or later (a replica move) with `open_shard`, and
//! removed with `retire_shard` (see `retire`).

use crate::log_store::LogStore;
use crate::log_writer::LogWriter;
use crate::network::{NetworkFactory, PeerPool};
use crate::state_machine::ShardStateMachine;
use crate::transport_stats::TransportStats;
use crate::types::*;
use meridian_storage::keys::Span;
use meridian_storage::Engine;
use meridian_types::{Clock, ShardId};
use openraft::type_config::async_runtime::WatchReceiver;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::Duration;

pub struct ShardReplica {
    pub shard: ShardId,
    pub raft: Raft,
    pub sm: ShardStateMachine,
    /// Quiescence state (see `quiesce`).
    pub quiet: crate::quiesce::Quiet,
    /// Whether the resting loop stopped this follower's ticker (see `rest`).
    pub rest: crate::rest::Rest,
    /// Proposal timestamps issued as leader and not yet settled (see `issued`).
    pub issued: Arc<crate::issued::Issued>,
    /// As leader: the side channel's quorum confirmations (see `closed_ts_channel`).
    pub closer: std::sync::Mutex<crate::closed_ts::Closer>,
    /// Requests waiting on a quorum round of this shard (see [`ShardReplica::ensure_linearizable`]):
    /// while any wait, its heartbeats skip `heartbeat_batch`'s linger.
    pub(crate) urgent: Arc<crate::heartbeat_batch::Urgent>,
    /// As leader: the queue that coalesces this shard's proposals (see `proposals`).
    pub proposer: Arc<crate::proposals::Proposer>,
}

impl ShardReplica {
    /// `raft.ensure_linearizable(option)` for a quorum round (ReadIndex: a read, or a lapsed
    /// lease's renewal before a write), with this shard's heartbeats sent at once while it
    /// waits instead of after `heartbeat_batch`'s linger: the round is a request's latency.
    /// A lease read, which needs no round, calls `raft.ensure_linearizable` itself (marking
    /// every read urgent would end every linger under read load).
    pub async fn ensure_linearizable(
        &self,
        option: impl Into<openraft::LinearizerOption>,
    ) -> Result<
        openraft::raft::linearizable_read::ReadLogId<TypeConfig>,
        RaftError<openraft::errors::LinearizableReadError<TypeConfig>>,
    > {
        let _waiting = self.urgent.hold();
        self.raft.ensure_linearizable(option).await
    }
}

pub struct MultiRaft {
    pub node_id: NodeId,
    pub engine: Arc<dyn Engine>,
    pub clock: Arc<Clock>,
    pub pool: Arc<PeerPool>,
    pub writer: Arc<LogWriter>,
    pub raft_config: Arc<openraft::Config>,
    pub data_dir: PathBuf,
    shards: RwLock<BTreeMap<ShardId, Arc<ShardReplica>>>,
    /// Peer messages received, by kind (the node's metrics).
    pub transport_stats: TransportStats,
    /// Votes are refused until this instant (see [`MultiRaft::refuses_votes`]).
    votes_from: std::time::Instant,
    /// What a peer's shard map record is handed to (the server's `membership`); set once.
    pub(crate) map_listener: std::sync::OnceLock<MapListener>,
    /// The cluster's nodes and their peer addresses (this node may be listed): whom the pings,
    /// the closed-timestamp side channel and the clock fence cover. Replaced whole when a
    /// node joins or is forgotten ([`MultiRaft::set_peers`], which drops the connections of
    /// addresses no longer listed).
    peers: RwLock<Arc<Vec<(NodeId, String)>>>,
    /// Former members (`ShardMap::forgotten`): their messages are refused.
    forgotten: RwLock<Arc<Vec<NodeId>>>,
    /// This node's client address, sent in ping replies (set once by the server).
    pub client_addr: std::sync::OnceLock<String>,
    /// The shard map version this node pings with, and who hears of peers behind it.
    pub map_gossip: crate::map_gossip::MapGossip,
    /// Warns when a peer's round trip leaves heartbeats no time to be answered.
    pub rtt_watch: crate::rtt_watch::RttWatch,
    /// Entries a shard leader keeps in flight before its proposals queue and coalesce (see
    /// `proposals`; 0 = off); the server sets it from its configuration.
    pub proposals_in_flight: Arc<std::sync::atomic::AtomicUsize>,
    /// Every shard's proposal counters (the node's metrics).
    pub propose_stats: Arc<crate::proposals::ProposeStats>,
    /// The boot incarnation, and the pings heard and answered, for parked leases (see
    /// `parked_lease`, `parked_promise`).
    pub ping_ledger: Arc<crate::parked_lease::PingLedger>,
    /// When this node started (`quiesce::now_ms`): its restart quarantine runs from here.
    pub started_ms: u64,
    /// Reads served on a parked lease, without waking their shard (see `parked_promise`).
    pub parked_reads: std::sync::atomic::AtomicU64,
    /// This node runs quiesce rounds (`spawn_quiescence` with quiescence enabled): only then
    /// do its replicas park on a peer's `Quiesce`, since only then does its loop watch parked
    /// followers' leaders and retry the release of their promises.
    pub quiescing: std::sync::atomic::AtomicBool,
}

/// Peers with a message of one kind in flight: at most one each, so a slow peer costs one
/// outstanding call, not one per round.
#[derive(Default)]
pub(crate) struct InFlight(std::sync::Mutex<std::collections::HashSet<NodeId>>);

impl InFlight {
    /// Marks `peer` busy; false if it was already.
    pub(crate) fn start(&self, peer: NodeId) -> bool {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(peer)
    }

    pub(crate) fn done(&self, peer: NodeId) {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&peer);
    }
}

/// Takes a shard map record a peer sent; answers the version the node routes by afterwards.
pub type MapListener =
    Arc<dyn Fn(Vec<u8>) -> futures::future::BoxFuture<'static, Result<u64, String>> + Send + Sync>;

impl MultiRaft {
    pub fn new(
        node_id: NodeId,
        engine: Arc<dyn Engine>,
        clock: Arc<Clock>,
        raft_config: openraft::Config,
        rpc_timeout: Duration,
        data_dir: PathBuf,
    ) -> Result<Arc<MultiRaft>, String> {
        let raft_config = Arc::new(
            raft_config
                .validate()
                .map_err(|e| format!("raft config: {e}"))?,
        );
        let vote_quarantine = Duration::from_millis(raft_config.election_timeout_max);
        Ok(Arc::new(MultiRaft {
            node_id,
            writer: Arc::new(LogWriter::start(engine.clone())),
            pool: PeerPool::new(
                node_id,
                clock.clone(),
                rpc_timeout,
                // Half the margin lease reads leave unused (see `append_credit`).
                Duration::from_millis(raft_config.election_timeout_max / 20),
                crate::heartbeat_batch::linger_for(Duration::from_millis(
                    raft_config.heartbeat_interval,
                )),
            ),
            engine,
            clock,
            data_dir,
            shards: RwLock::new(BTreeMap::new()),
            transport_stats: TransportStats::default(),
            votes_from: std::time::Instant::now() + vote_quarantine,
            map_listener: std::sync::OnceLock::new(),
            peers: RwLock::new(Arc::new(Vec::new())),
            forgotten: RwLock::new(Arc::new(Vec::new())),
            client_addr: std::sync::OnceLock::new(),
            map_gossip: Default::default(),
            rtt_watch: crate::rtt_watch::RttWatch::new(raft_config.heartbeat_interval),
            proposals_in_flight: Arc::new(std::sync::atomic::AtomicUsize::new(
                crate::proposals::DEFAULT_IN_FLIGHT,
            )),
            propose_stats: Default::default(),
            ping_ledger: Arc::new(crate::parked_lease::PingLedger::new(
                raft_config.election_timeout_max,
            )),
            started_ms: crate::quiesce::now_ms(),
            parked_reads: Default::default(),
            quiescing: Default::default(),
            raft_config,
        }))
    }

    /// Replaces the cluster's node list (see the `peers` field); `peers` may include this node.
    /// The cached connections and heartbeat queues of addresses no longer listed (a node that
    /// left the cluster) are dropped (see [`PeerPool::forget_addrs`]).
    pub fn set_peers(&self, peers: Vec<(NodeId, String)>) {
        let gone: Vec<String> = {
            let mut current = self.peers.write().unwrap_or_else(|p| p.into_inner());
            let gone = current
                .iter()
                .filter(|(_, addr)| !peers.iter().any(|(_, a)| a == addr))
                .map(|(_, addr)| addr.clone())
                .collect();
            *current = Arc::new(peers);
            gone
        };
        self.pool.forget_addrs(&gone);
    }

    /// Replaces the former members whose messages are refused.
    pub fn set_forgotten(&self, forgotten: Vec<NodeId>) {
        *self.forgotten.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(forgotten);
    }

    /// Whether `node` was forgotten (see [`MultiRaft::set_forgotten`]).
    pub fn is_forgotten(&self, node: NodeId) -> bool {
        self.forgotten
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .contains(&node)
    }

    /// The cluster's nodes other than this one, with their peer addresses.
    pub fn peers(&self) -> Vec<(NodeId, String)> {
        let all = self.peers.read().unwrap_or_else(|p| p.into_inner()).clone();
        all.iter()
            .filter(|(id, _)| *id != self.node_id)
            .cloned()
            .collect()
    }

    /// Hands peers' shard map records to `listener` from now on (once; later calls are ignored).
    pub fn set_map_listener(&self, listener: MapListener) {
        let _ = self.map_listener.set(listener);
    }

    /// Whether this node still refuses (pre-)votes because it started recently.
    ///
    /// A leader serves lease reads for up to `election_timeout_max` after its last quorum
    /// acknowledgement, trusting that no follower that acknowledged it will vote for anyone
    /// else before then. A follower that restarts forgets when it last heard from the leader
    /// (openraft keeps that lease in memory only), so it could vote at once and help elect a
    /// second leader while the first still serves reads from its lease: a stale read. Refusing
    /// every vote for `election_timeout_max` after start restores the promise, whatever the
    /// node knew before it stopped. The cost: elections right after a node starts wait that long.
    pub fn refuses_votes(&self) -> bool {
        std::time::Instant::now() < self.votes_from
    }

    /// Opens (or creates) this node's replica of `shard`, which owns the user keys of `span`,
    /// and starts its Raft.
    pub async fn open_shard(
        &self,
        shard: ShardId,
        span: Span,
    ) -> Result<Arc<ShardReplica>, String> {
        if let Some(r) = self.get(shard) {
            return Ok(r);
        }
        let engine = self.engine.clone();
        let clock = self.clock.clone();
        let dir = self
            .data_dir
            .join("snapshots")
            .join(format!("shard-{}", shard.0));
        let sm = tokio::task::spawn_blocking(move || {
            ShardStateMachine::open(shard, span, engine, clock, dir)
        })
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| format!("opening shard {shard} state machine: {e}"))?;
        let log = LogStore::new(shard, self.engine.clone(), self.writer.clone());
        let urgent = Arc::new(crate::heartbeat_batch::Urgent::new(&self.pool));
        let quiet = crate::quiesce::Quiet::new(self.node_id);
        let network = NetworkFactory {
            shard,
            pool: self.pool.clone(),
            urgent: urgent.clone(),
            gate: Arc::new(crate::parked_promise::CampaignGate {
                me: self.node_id,
                promise: quiet.promise.clone(),
                ledger: self.ping_ledger.clone(),
                started_ms: self.started_ms,
                election_timeout_max_ms: self.raft_config.election_timeout_max,
            }),
        };
        let raft = Raft::new(
            self.node_id,
            self.raft_config.clone(),
            network,
            log,
            sm.clone(),
        )
        .await
        .map_err(|e| format!("starting raft for shard {shard}: {e}"))?;
        let issued: Arc<crate::issued::Issued> = Arc::default();
        spawn_role_watch(
            shard,
            &raft,
            self.node_id,
            self.clock.clone(),
            issued.clone(),
        );
        let proposer = Arc::new(crate::proposals::Proposer::new(
            raft.clone(),
            self.proposals_in_flight.clone(),
            self.propose_stats.clone(),
        ));
        let replica = Arc::new(ShardReplica {
            shard,
            raft,
            proposer,
            sm,
            quiet,
            rest: Default::default(),
            issued,
            closer: Default::default(),
            urgent,
        });
        self.shards
            .write()
            .expect("shard table lock poisoned")
            .insert(shard, replica.clone());
        Ok(replica)
    }

    pub fn get(&self, shard: ShardId) -> Option<Arc<ShardReplica>> {
        self.shards
            .read()
            .expect("shard table lock poisoned")
            .get(&shard)
            .cloned()
    }

    /// Takes `shard`'s replica out of the table (peer messages for it are refused from now on).
    pub(crate) fn remove_replica(&self, shard: ShardId) -> Option<Arc<ShardReplica>> {
        self.shards
            .write()
            .expect("shard table lock poisoned")
            .remove(&shard)
    }

    pub fn replicas(&self) -> Vec<Arc<ShardReplica>> {
        self.shards
            .read()
            .expect("shard table lock poisoned")
            .values()
            .cloned()
            .collect()
    }

    /// Stops every shard's Raft (in-flight proposals finish or fail), then the log writer.
    pub async fn shutdown(&self) {
        for r in self.replicas() {
            if let Err(e) = r.raft.shutdown().await {
                tracing::warn!(shard = %r.shard, error = %e, "raft shutdown");
            }
        }
        self.shards
            .write()
            .expect("shard table lock poisoned")
            .clear();
    }
}

/// Watches a replica's Raft role (term, vote, state, leader). Each change is logged at INFO,
/// with its log position: leader changes are rare, and they are what a post-mortem of a lost
/// or stale write needs first (which node led which term, with what log). When this node is
/// seen to lead a new term, that term's `max_offset` wait begins (`Issued::begin_term`), so
/// the term's first write does not pay it when the shard was elected long before. Watches
/// openraft's server metrics, which change only on vote, state, leader or membership changes
/// — never per entry or per heartbeat — so an idle or busy shard costs nothing here.
fn spawn_role_watch(
    shard: ShardId,
    raft: &Raft,
    me: NodeId,
    clock: Arc<Clock>,
    issued: Arc<crate::issued::Issued>,
) {
    let mut server = raft.server_metrics();
    let all = raft.metrics();
    tokio::spawn(async move {
        let mut last = None;
        loop {
            let (vote, state, leader) = {
                let m = server.borrow_watched();
                (m.vote, m.state, m.current_leader)
            };
            if state == openraft::ServerState::Leader && leader == Some(me) {
                issued.begin_term(&clock, openraft::vote::RaftLeaderId::term(vote.leader_id()));
            }
            let key = (vote, state, leader);
            if last.as_ref() != Some(&key) {
                let (last_log, committed, applied) = {
                    let m = all.borrow_watched();
                    (m.last_log_index, m.local_committed, m.last_applied)
                };
                tracing::info!(
                    %shard,
                    vote = %vote,
                    state = ?state,
                    leader = ?leader,
                    last_log = ?last_log,
                    committed = ?committed.map(|l| l.index),
                    applied = ?applied.map(|l| l.index),
                    "raft role"
                );
                last = Some(key);
            }
            if server.changed().await.is_err() {
                break;
            }
        }
    });
}

pub(crate) use crate::transport::exit_forgotten;
pub use crate::transport::{
    TransportService, EXIT_FORGOTTEN, FORGOTTEN_HEADER, MAX_SNAPSHOT_BYTES,
};
