//! [`PeerPool`]: the node's connections to its peers: one lazily dialled HTTP/2 control channel
//! per peer node shared by every shard (see `network` for the openraft side), with the
//! node-level calls made over it: pings (liveness and clock offsets), unary calls by address,
//! heartbeat batches (`heartbeat_batch`), and forgetting the channels of nodes that left.
//! Replication streams and snapshots travel on connections of their own (`peer_streams`).

use crate::clock_fence::{ClockOffset, PeerOffsets};
use crate::network::RateLimitedLog;
use crate::parked_lease::Token;
use crate::peer_streams::{StreamLanes, StreamSlot};
use crate::types::*;
use meridian_proto::raft::raft_transport_client::RaftTransportClient;
use meridian_proto::raft::RaftReply;
use meridian_types::limits::MAX_MESSAGE_BYTES;
use meridian_types::{Clock, ShardId, Timestamp};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tonic::transport::Channel;

/// One lazily connected HTTP/2 channel per peer node shared by every shard, for every call but
/// replication streams and snapshots, which travel on connections of their own (`peer_streams`).
pub struct PeerPool {
    channels: Mutex<HashMap<String, Channel>>,
    /// The connections that carry replication streams, apart from `channels`.
    streams: StreamLanes,
    /// Peer address (as the membership names it) → the address to dial instead (a WAN proxy
    /// link); set once at startup.
    dial: std::sync::RwLock<HashMap<String, String>>,
    /// When each peer last answered us or sent us a message (liveness for status).
    last_seen: Mutex<HashMap<NodeId, Instant>>,
    /// Each peer's client address, as its last ping reply gave it.
    client_addrs: Mutex<HashMap<NodeId, String>>,
    /// Each peer's clock offset, as the last ping measured it (read by `clock_fence`).
    pub offsets: Arc<PeerOffsets>,
    pub self_id: NodeId,
    pub clock: Arc<Clock>,
    pub rpc_timeout: Duration,
    /// How much later than a follower's acknowledgement a leader may date it (see
    /// [`crate::append_credit`]).
    pub append_slack: Duration,
    /// How long a heartbeat waits for others to the same peer (see `heartbeat_batch`).
    pub heartbeat_linger: Duration,
    /// The per-peer queues of coalesced heartbeats (see `heartbeat_batch`).
    pub(crate) heartbeats: crate::heartbeat_batch::HeartbeatBatcher,
    pub(crate) clock_log: RateLimitedLog,
}

impl PeerPool {
    pub fn new(
        self_id: NodeId,
        clock: Arc<Clock>,
        rpc_timeout: Duration,
        append_slack: Duration,
        heartbeat_linger: Duration,
    ) -> Arc<PeerPool> {
        Arc::new(PeerPool {
            channels: Mutex::new(HashMap::new()),
            streams: Default::default(),
            dial: std::sync::RwLock::new(HashMap::new()),
            last_seen: Mutex::new(HashMap::new()),
            client_addrs: Mutex::new(HashMap::new()),
            offsets: Arc::default(),
            self_id,
            clock,
            rpc_timeout,
            append_slack,
            heartbeat_linger,
            heartbeats: Default::default(),
            clock_log: RateLimitedLog::new(Duration::from_secs(5)),
        })
    }

    /// Dial `overrides` (peer address → address to dial) instead of the peers' own addresses.
    /// Replaces the previous set (a node that joined adds its entry); applies to peers not
    /// dialled yet, so it is called before the first dial and again only to add peers.
    pub fn set_dial_overrides(&self, overrides: HashMap<String, String>) {
        *self.dial.write().unwrap_or_else(|p| p.into_inner()) = overrides;
    }

    /// Drops the cached channel and heartbeat queue of each of `addrs` (peers that left the
    /// cluster). Calls in flight hold their own clones of the channel and finish; a later call
    /// to one of them dials again.
    pub fn forget_addrs(&self, addrs: &[String]) {
        if addrs.is_empty() {
            return;
        }
        {
            let mut channels = self.channels.lock().expect("peer pool lock poisoned");
            for addr in addrs {
                channels.remove(addr);
            }
        }
        self.streams.forget(addrs);
        self.heartbeats.forget(addrs);
        tracing::info!(peers = ?addrs, "dropped the connections of peers that left the cluster");
    }

    /// How many peer channels are cached (for tests).
    #[cfg(test)]
    pub(crate) fn cached_channels(&self) -> usize {
        self.channels.lock().expect("peer pool lock poisoned").len()
    }

    /// A client for every call to the peer at `addr` but replication streams and snapshots.
    pub fn client(&self, addr: &str) -> Result<RaftTransportClient<Channel>, String> {
        let mut channels = self.channels.lock().expect("peer pool lock poisoned");
        let channel = match channels.get(addr) {
            Some(c) => c.clone(),
            None => {
                let c = self.dial(addr)?;
                channels.insert(addr.to_string(), c.clone());
                c
            }
        };
        Ok(transport_client(channel))
    }

    /// A client for one replication stream or snapshot transfer to the peer at `addr`, on a
    /// connection with room for it (see `peer_streams`); the call holds the slot until it ends.
    pub fn stream_client(
        &self,
        addr: &str,
    ) -> Result<(RaftTransportClient<Channel>, StreamSlot), String> {
        let (channel, slot) = self.streams.take(addr, || self.dial(addr))?;
        Ok((transport_client(channel), slot))
    }

    /// How many replication connections lead to `addr`, and the streams on each.
    pub fn stream_lanes(&self, addr: &str) -> Vec<usize> {
        self.streams.lanes_of(addr)
    }

    /// A new lazily connected channel to `addr` (or the address dialled instead of it).
    fn dial(&self, addr: &str) -> Result<Channel, String> {
        let dial = self.dial.read().unwrap_or_else(|p| p.into_inner());
        let target = dial.get(addr).map_or(addr, String::as_str);
        Ok(Channel::from_shared(format!("http://{target}"))
            .map_err(|e| format!("bad peer address {addr:?}: {e}"))?
            .connect_timeout(self.rpc_timeout)
            .tcp_nodelay(true)
            // Keep-alive pings also bound how long a replication stream to a dead peer
            // stalls before it errors out and openraft reconnects.
            .http2_keep_alive_interval(Duration::from_secs(1))
            .keep_alive_timeout(self.rpc_timeout.max(Duration::from_secs(1)))
            .keep_alive_while_idle(true)
            .connect_lazy())
    }

    pub fn mark_seen(&self, node: NodeId) {
        self.last_seen
            .lock()
            .expect("last_seen lock poisoned")
            .insert(node, Instant::now());
    }

    pub fn seen_within(&self, node: NodeId, window: Duration) -> bool {
        self.last_seen
            .lock()
            .expect("last_seen lock poisoned")
            .get(&node)
            .is_some_and(|t| t.elapsed() <= window)
    }

    /// Records a peer's clock offset measured by a ping.
    pub fn record_offset(&self, node: NodeId, offset: ClockOffset) {
        self.offsets.record(node, offset);
    }

    /// A ping's answer: the peer's offset, and the peer seen unless its clock is one whose Raft
    /// messages HLC admission refuses, as when pings were admitted like them (see `clock_fence`).
    pub fn note_ping(&self, node: NodeId, offset: ClockOffset) {
        let max_offset_ms = self.clock.max_offset().as_millis() as u64;
        if crate::clock_fence::within_max_offset(&offset, max_offset_ms) {
            self.mark_seen(node);
        }
        self.record_offset(node, offset);
    }

    /// The peer's clock offset as last measured, if any ping has come back.
    pub fn offset_of(&self, node: NodeId) -> Option<ClockOffset> {
        self.offsets.get(node)
    }

    /// Merges a peer's reply timestamp; a reply from beyond max_offset is an error.
    pub(crate) fn merge_reply_clock(&self, hlc: u64) -> Result<(), String> {
        self.clock.update(Timestamp(hlc)).map_err(|e| {
            if self.clock_log.should_log() {
                tracing::error!(error = %e, "rejecting reply from peer");
            }
            e.to_string()
        })
    }
}

fn transport_client(channel: Channel) -> RaftTransportClient<Channel> {
    RaftTransportClient::new(channel)
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES)
}

/// A ping's answer.
#[derive(Clone, Debug)]
pub struct PingAnswer {
    /// The peer's clock offset, estimated from the round trip.
    pub offset: ClockOffset,
    /// The peer's client address (empty from a node that does not send it).
    pub client_addr: String,
    /// When the ping was sent (`quiesce::now_ms`, this process's monotonic clock).
    pub sent_ms: u64,
    /// The peer's token for this node (`None` from a node from before tokens).
    pub token: Option<Token>,
}

/// The token a `Ping` or `Quiesce` reply carries, if any (see `parked_lease`).
fn reply_token(reply: &RaftReply) -> Option<Token> {
    (reply.incarnation != 0).then_some(Token {
        incarnation: reply.incarnation,
        lapses: reply.lapses,
    })
}

/// Why a ping got no answer.
#[derive(Debug)]
pub enum PingFailure {
    /// The peer refused this node as a former member (PERMISSION_DENIED marked with
    /// `host::FORGOTTEN_HEADER` naming this node, see `MultiRaft::set_forgotten`): the
    /// cluster's shard map lists this node as forgotten, for good (ids are never reused).
    Forgotten(String),
    /// Anything else (down, cut off, slow): no verdict.
    Failed(String),
}

/// The quiescence RPCs (see `quiesce`): node-level, not tied to one shard's openraft.
impl PeerPool {
    /// One unary quiescence call with the RPC deadline; the reply's clock is merged.
    async fn node_call<Resp: serde::de::DeserializeOwned>(
        &self,
        addr: &str,
        kind: &'static str,
        shard: u64,
        payload: Vec<u8>,
    ) -> Result<Resp, String> {
        let reply = self.node_reply(addr, kind, shard, payload).await?;
        let result: Result<Resp, String> =
            codec::decode(&reply.payload).map_err(|e| e.to_string())?;
        result
    }

    /// One node-level call's reply, its clock merged.
    async fn node_reply(
        &self,
        addr: &str,
        kind: &'static str,
        shard: u64,
        payload: Vec<u8>,
    ) -> Result<RaftReply, String> {
        let reply = self
            .node_rpc(addr, kind, shard, self.clock.now().0, payload)
            .await
            .map_err(|s| s.message().to_string())?;
        self.merge_reply_clock(reply.hlc)?;
        Ok(reply)
    }

    /// One unary call with the RPC deadline, sending `hlc` (0: none): a node-level one, or
    /// (`"append"`) one shard's append, as `heartbeat_batch` sends a heartbeat to a peer that
    /// does not know coalesced ones; the peer's status as it answered.
    pub(crate) async fn node_rpc(
        &self,
        addr: &str,
        kind: &'static str,
        shard: u64,
        hlc: u64,
        payload: impl Into<bytes::Bytes>,
    ) -> Result<RaftReply, tonic::Status> {
        let mut client = self.client(addr).map_err(tonic::Status::unavailable)?;
        let mut request =
            tonic::Request::new(crate::quiesce::envelope(shard, hlc, self.self_id, payload));
        request.set_timeout(self.rpc_timeout);
        let reply = match kind {
            "ping" => client.ping(request).await,
            "wake" => client.wake(request).await,
            "close_timestamps" => client.close_timestamps(request).await,
            "shard_map" => client.shard_map(request).await,
            "append" => client.append(request).await,
            _ => client.quiesce(request).await,
        }?;
        Ok(reply.into_inner())
    }

    /// Node-level liveness: one round trip, which also measures the peer's clock offset (the
    /// reply carries the peer's physical clock), whatever the two HLCs say (a ping carries no
    /// HLC either way, see `clock_fence`, so that it measures clocks HLC admission refuses).
    /// Pings the node at `addr`, telling it this node's shard map version (`map_gossip`):
    /// its clock offset, and its client address (empty from a node that does not send it).
    pub async fn ping(&self, addr: &str, map_version: u64) -> Result<PingAnswer, PingFailure> {
        let payload =
            codec::encode(&map_version).map_err(|e| PingFailure::Failed(e.to_string()))?;
        let sent_ms = crate::quiesce::now_ms();
        let sent = self.clock.physical_now();
        let reply = self
            .node_rpc(addr, "ping", 0, 0, payload)
            .await
            .map_err(|s| {
                let me = self.self_id.to_string();
                let names_me = s
                    .metadata()
                    .get(crate::host::FORGOTTEN_HEADER)
                    .is_some_and(|v| v.to_str().is_ok_and(|v| v == me));
                match s.code() {
                    tonic::Code::PermissionDenied if names_me => {
                        PingFailure::Forgotten(s.message().to_string())
                    }
                    _ => PingFailure::Failed(s.message().to_string()),
                }
            })?;
        let received = self.clock.physical_now();
        let remote: Result<u64, String> =
            codec::decode(&reply.payload).map_err(|e| PingFailure::Failed(e.to_string()))?;
        let remote = remote.map_err(PingFailure::Failed)?;
        let offset = ClockOffset::estimate(sent, Timestamp(remote), received);
        Ok(PingAnswer {
            offset,
            token: reply_token(&reply),
            client_addr: reply.client_addr,
            sent_ms,
        })
    }

    /// Notes `node`'s client address, as its ping reply gave it.
    pub fn note_client_addr(&self, node: NodeId, client_addr: String) {
        if client_addr.is_empty() {
            return;
        }
        self.client_addrs
            .lock()
            .expect("client_addrs lock poisoned")
            .insert(node, client_addr);
    }

    /// `node`'s client address, if a ping reply gave it.
    pub fn client_addr_of(&self, node: NodeId) -> Option<String> {
        self.client_addrs
            .lock()
            .expect("client_addrs lock poisoned")
            .get(&node)
            .cloned()
    }

    /// Asks the follower at `addr` to park `shard`; whether it did.
    pub async fn quiesce(
        &self,
        addr: &str,
        shard: ShardId,
        request: &crate::quiesce::QuiesceRequest,
    ) -> Result<(bool, Option<Token>), String> {
        let payload = codec::encode(request).map_err(|e| e.to_string())?;
        let reply = self.node_reply(addr, "quiesce", shard.0, payload).await?;
        let parked: Result<bool, String> =
            codec::decode(&reply.payload).map_err(|e| e.to_string())?;
        Ok((parked?, reply_token(&reply)))
    }

    /// Asks the leader at `addr` to wake `shard`.
    pub async fn wake(&self, addr: &str, shard: ShardId) -> Result<(), String> {
        self.node_call(addr, "wake", shard.0, Vec::new()).await
    }

    /// Sends the stored shard map's record to the node at `addr` (see `MultiRaft::on_shard_map`);
    /// the version it routes by afterwards.
    pub async fn push_shard_map(&self, addr: &str, record: &[u8]) -> Result<u64, String> {
        self.node_call(addr, "shard_map", 0, record.to_vec()).await
    }

    /// Sends one side-channel round (see `closed_ts_channel`) to the node at `addr`; the
    /// shards it confirmed.
    pub async fn close_timestamps(
        &self,
        addr: &str,
        entries: &[crate::closed_ts_channel::ClosedEntry],
    ) -> Result<Vec<u64>, String> {
        let payload = codec::encode(&entries).map_err(|e| e.to_string())?;
        self.node_call(addr, "close_timestamps", 0, payload).await
    }
}
