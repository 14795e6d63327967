//! The peer transport: every Raft group's traffic over one tonic service and one HTTP/2
//! channel per peer node.
//!
//! ```text
//!   shard 3 replication ─┐                          ┌─► shard 3's Raft
//!   shard 5 replication ─┼─► PeerPool[node 2] ══════╪─► shard 5's Raft   (RaftTransport service,
//!   shard 0 heartbeats  ─┘   (one Channel)          └─► shard 0's Raft    routed by shard_id)
//! ```
//!
//! Each message carries the shard id, the sender's node id and HLC timestamp, and the openraft
//! message encoded with `types::codec`. The receiver merges the timestamp into its clock before
//! anything else and rejects the message (`FAILED_PRECONDITION`, code `CLOCK_OFFSET`) if it is
//! more than `max_offset` ahead; replies carry the receiver's timestamp back the same way.
//! Node-level pings are the exception: they carry no HLC, only the answering node's physical
//! clock, which measures its offset ([`ClockOffset`], acted on by `clock_fence`).
//!
//! Every RPC has a deadline: openraft's per-call TTL where it gives one, else the configured
//! RPC timeout. Snapshots stream an SST file in CRC-checked chunks of
//! [`SNAPSHOT_CHUNK_BYTES`] over a client stream with a bounded queue.
//!
//! # Not done yet
//! - TLS on peer channels; snapshot send throttling (the Couchbase lesson's 200 MB/s default).
//! - An injectable WAN delay hook (tests use a delaying proxy instead).

use crate::append_credit::{Gate, ReplyKind};
pub use crate::clock_fence::ClockOffset;
use crate::clock_fence::PeerOffsets;
use crate::state_machine::SnapshotFile;
use crate::types::*;
use meridian_proto::raft::raft_transport_client::RaftTransportClient;
use meridian_proto::raft::{RaftReply, RaftRequest, SnapshotChunk};
use meridian_types::error::{ERROR_CODE_HEADER, HLC_HEADER};
use meridian_types::limits::{MAX_MESSAGE_BYTES, SNAPSHOT_CHUNK_BYTES};
use meridian_types::{Clock, ErrorCode, ShardId, Timestamp};
use openraft::base::{BoxFuture, BoxStream};
use openraft::errors::{NetworkError, ReplicationClosed, Unreachable};
use openraft::network::{RPCOption, RaftNetworkFactory, RaftNetworkV2};
use openraft::raft::StreamAppendError;
use openraft::OptionalSend;
use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::AsyncReadExt;
use tonic::transport::Channel;

/// Snapshot chunks queued ahead of the network per transfer.
const SNAPSHOT_QUEUE_CHUNKS: usize = 4;

/// The first message of a snapshot stream: who sends it, what it replaces, and the replicated
/// state that is not in the SST file.
#[derive(serde::Serialize, serde::Deserialize)]
pub struct SnapshotHeader {
    pub vote: Vote,
    pub meta: SnapshotMeta,
    pub version_floor: u64,
    pub dedup: Vec<crate::dedup::DedupEntry>,
}

/// A plain message as an error (openraft's network errors wrap an `Error`).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct Msg(pub(crate) String);

/// Logs at most one line per `interval` for a noisy condition (e.g. a skewed peer).
pub struct RateLimitedLog {
    last_ms: AtomicU64,
    interval: Duration,
    origin: Instant,
}

impl RateLimitedLog {
    pub fn new(interval: Duration) -> Self {
        RateLimitedLog {
            last_ms: AtomicU64::new(0),
            interval,
            origin: Instant::now(),
        }
    }

    pub fn should_log(&self) -> bool {
        let now = self.origin.elapsed().as_millis() as u64 + self.interval.as_millis() as u64;
        let last = self.last_ms.load(Ordering::Relaxed);
        now >= last + self.interval.as_millis() as u64
            && self
                .last_ms
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
    }
}

/// One lazily connected HTTP/2 channel per peer node, shared by every shard.
pub struct PeerPool {
    channels: Mutex<HashMap<String, Channel>>,
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
    clock_log: RateLimitedLog,
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
        self.heartbeats.forget(addrs);
        tracing::info!(peers = ?addrs, "dropped the connections of peers that left the cluster");
    }

    /// How many peer channels are cached (for tests).
    #[cfg(test)]
    pub(crate) fn cached_channels(&self) -> usize {
        self.channels.lock().expect("peer pool lock poisoned").len()
    }

    pub fn client(&self, addr: &str) -> Result<RaftTransportClient<Channel>, String> {
        let mut channels = self.channels.lock().expect("peer pool lock poisoned");
        let channel = match channels.get(addr) {
            Some(c) => c.clone(),
            None => {
                let dial = self.dial.read().unwrap_or_else(|p| p.into_inner());
                let target = dial.get(addr).map_or(addr, String::as_str);
                let c = Channel::from_shared(format!("http://{target}"))
                    .map_err(|e| format!("bad peer address {addr:?}: {e}"))?
                    .connect_timeout(self.rpc_timeout)
                    .tcp_nodelay(true)
                    // Keep-alive pings also bound how long a replication stream to a dead peer
                    // stalls before it errors out and openraft reconnects.
                    .http2_keep_alive_interval(Duration::from_secs(1))
                    .keep_alive_timeout(self.rpc_timeout.max(Duration::from_secs(1)))
                    .keep_alive_while_idle(true)
                    .connect_lazy();
                channels.insert(addr.to_string(), c.clone());
                c
            }
        };
        Ok(RaftTransportClient::new(channel)
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES))
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
    pub async fn ping(
        &self,
        addr: &str,
        map_version: u64,
    ) -> Result<(ClockOffset, String), PingFailure> {
        let payload =
            codec::encode(&map_version).map_err(|e| PingFailure::Failed(e.to_string()))?;
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
        Ok((offset, reply.client_addr))
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
    ) -> Result<bool, String> {
        let payload = codec::encode(request).map_err(|e| e.to_string())?;
        self.node_call(addr, "quiesce", shard.0, payload).await
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

/// Creates per-target connections for one shard's Raft.
pub struct NetworkFactory {
    pub shard: ShardId,
    pub pool: Arc<PeerPool>,
    /// The shard's waiting requests (see `heartbeat_batch::Urgent`), for its heartbeats.
    pub urgent: Arc<crate::heartbeat_batch::Urgent>,
}

impl RaftNetworkFactory<TypeConfig> for NetworkFactory {
    type Network = PeerConnection;

    async fn new_client(&mut self, target: NodeId, node: &Node) -> PeerConnection {
        PeerConnection {
            shard: self.shard,
            target,
            addr: node.addr.clone(),
            pool: self.pool.clone(),
            heartbeats: None,
        }
    }

    /// Heartbeats go through the peer's coalescing queue (see `heartbeat_batch`).
    async fn new_heartbeat_client(&mut self, target: NodeId, node: &Node) -> PeerConnection {
        PeerConnection {
            heartbeats: Some(self.urgent.clone()),
            ..self.new_client(target, node).await
        }
    }
}

pub struct PeerConnection {
    shard: ShardId,
    target: NodeId,
    addr: String,
    pool: Arc<PeerPool>,
    /// Set on openraft's heartbeat worker's connection (with the shard's waiting requests):
    /// its `stream_append` calls (one empty request each) are coalesced per peer node (see
    /// `heartbeat_batch`).
    heartbeats: Option<Arc<crate::heartbeat_batch::Urgent>>,
}

pub(crate) fn status_to_rpc_error(status: tonic::Status) -> RPCError {
    match status.code() {
        tonic::Code::Unavailable | tonic::Code::Unknown => {
            RPCError::Unreachable(Unreachable::new(&status))
        }
        _ => RPCError::Network(NetworkError::new(&status)),
    }
}

impl PeerConnection {
    async fn call<Req, Resp>(
        &self,
        kind: &'static str,
        rpc: &Req,
        option: &RPCOption,
    ) -> Result<Resp, RPCError>
    where
        Req: serde::Serialize,
        Resp: serde::de::DeserializeOwned,
    {
        let payload = codec::encode(rpc).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        let mut client = self
            .pool
            .client(&self.addr)
            .map_err(|e| RPCError::Unreachable(Unreachable::new(&Msg(e))))?;
        let mut request = tonic::Request::new(RaftRequest {
            shard_id: self.shard.0,
            hlc: self.pool.clock.now().0,
            from_node: self.pool.self_id,
            payload: payload.into(),
        });
        // openraft's TTL for heartbeats is one heartbeat interval, too tight for a loaded
        // follower that must fsync first; every unary call gets the configured RPC deadline.
        let _ = option;
        request.set_timeout(self.pool.rpc_timeout);
        let reply: RaftReply = match kind {
            "append" => client.append(request).await,
            "vote" => client.vote(request).await,
            "pre_vote" => client.pre_vote(request).await,
            _ => client.transfer_leader(request).await,
        }
        .map_err(|s| {
            if s.metadata().get(ERROR_CODE_HEADER).and_then(|v| v.to_str().ok()) == Some(ErrorCode::ClockOffset.as_str())
                && self.pool.clock_log.should_log()
            {
                tracing::error!(shard = %self.shard, target = self.target, error = s.message(), "peer rejected our clock");
            }
            status_to_rpc_error(s)
        })?
        .into_inner();
        self.pool
            .merge_reply_clock(reply.hlc)
            .map_err(|e| RPCError::Network(NetworkError::new(&Msg(e))))?;
        self.pool.mark_seen(self.target);
        let result: Result<Resp, String> =
            codec::decode(&reply.payload).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        result.map_err(|e| {
            RPCError::Network(NetworkError::new(&Msg(format!("remote raft error: {e}"))))
        })
    }

    async fn send_snapshot(
        &self,
        vote: Vote,
        snapshot: Snapshot,
        deadline: Duration,
    ) -> Result<SnapshotResponse, StreamingError> {
        let net = |e: &dyn std::fmt::Display| {
            StreamingError::Network(NetworkError::new(&Msg(e.to_string())))
        };
        let mut client = self
            .pool
            .client(&self.addr)
            .map_err(|e| StreamingError::Unreachable(Unreachable::new(&Msg(e))))?;
        let header = codec::encode(&SnapshotHeader {
            vote,
            meta: snapshot.meta.clone(),
            version_floor: snapshot.snapshot.version_floor,
            dedup: snapshot.snapshot.dedup.clone(),
        })
        .map_err(|e| net(&e))?;
        let (tx, rx) = tokio::sync::mpsc::channel::<SnapshotChunk>(SNAPSHOT_QUEUE_CHUNKS);
        let shard = self.shard;
        let from_node = self.pool.self_id;
        let clock = self.pool.clock.clone();
        let path = snapshot.snapshot.path.clone();
        let producer = tokio::spawn(async move {
            let first = SnapshotChunk {
                shard_id: shard.0,
                hlc: clock.now().0,
                from_node,
                header: header.into(),
                done: path.is_none(),
                ..Default::default()
            };
            if tx.send(first).await.is_err() {
                return Ok::<u64, std::io::Error>(0);
            }
            let Some(path) = path else { return Ok(0) };
            let mut file = tokio::fs::File::open(&path).await?;
            let total = file.metadata().await?.len();
            let mut offset = 0u64;
            loop {
                let mut buf = vec![0u8; SNAPSHOT_CHUNK_BYTES];
                let mut filled = 0;
                while filled < buf.len() {
                    let n = file.read(&mut buf[filled..]).await?;
                    if n == 0 {
                        break;
                    }
                    filled += n;
                }
                buf.truncate(filled);
                let done = offset + filled as u64 >= total;
                let chunk = SnapshotChunk {
                    shard_id: shard.0,
                    hlc: clock.now().0,
                    from_node,
                    crc32: crc32fast::hash(&buf),
                    offset,
                    done,
                    data: buf.into(),
                    ..Default::default()
                };
                offset += filled as u64;
                if tx.send(chunk).await.is_err() || done {
                    return Ok(offset);
                }
            }
        });
        let mut request = tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(rx));
        request.set_timeout(deadline);
        let reply = client.install_snapshot(request).await;
        let sent = producer.await.map_err(|e| net(&e))?.map_err(|e| net(&e))?;
        let reply = reply
            .map_err(|s| match s.code() {
                tonic::Code::Unavailable => StreamingError::Unreachable(Unreachable::new(&s)),
                _ => StreamingError::Network(NetworkError::new(&s)),
            })?
            .into_inner();
        self.pool
            .merge_reply_clock(reply.hlc)
            .map_err(|e| net(&e))?;
        let result: Result<SnapshotResponse, String> =
            codec::decode(&reply.payload).map_err(|e| net(&e))?;
        tracing::info!(shard = %self.shard, target = self.target, bytes = sent, "sent snapshot");
        result.map_err(|e| net(&e))
    }
}

impl PeerConnection {
    /// A heartbeat worker's stream: each request in its peer's next heartbeat batch, in turn;
    /// the stream ends after its first error, as a replication stream does.
    fn coalesced<'s, S>(
        &self,
        input: S,
        urgent: Arc<crate::heartbeat_batch::Urgent>,
    ) -> BoxStream<'s, Result<StreamAppendResult, RPCError>>
    where
        S: futures::Stream<Item = AppendEntriesRequest> + OptionalSend + Unpin + 'static,
    {
        use futures::StreamExt;
        let (pool, addr, shard, target) = (
            self.pool.clone(),
            self.addr.clone(),
            self.shard,
            self.target,
        );
        let replies = input
            .then(move |req| {
                let (pool, addr) = (pool.clone(), addr.clone());
                let now = urgent.waiting();
                async move {
                    let answer =
                        crate::heartbeat_batch::send(&pool, &addr, shard.0, req, now).await;
                    if answer.is_ok() {
                        pool.mark_seen(target);
                    }
                    answer
                }
            })
            .scan(false, |failed, item| {
                let stop = *failed;
                *failed = item.is_err();
                futures::future::ready((!stop).then_some(item))
            });
        Box::pin(replies)
    }
}

impl RaftNetworkV2<TypeConfig> for PeerConnection {
    type SnapshotData = SnapshotFile;

    /// Pipelined replication over one bidirectional gRPC stream per (shard, follower): requests
    /// go out as openraft produces them, replies come back in order. Setup has the RPC
    /// deadline; a stalled stream is detected by the channel's HTTP/2 keep-alive.
    fn stream_append<'s, S>(
        &'s mut self,
        input: S,
        _option: RPCOption,
    ) -> BoxFuture<'s, Result<BoxStream<'s, Result<StreamAppendResult, RPCError>>, RPCError>>
    where
        S: futures::Stream<Item = AppendEntriesRequest> + OptionalSend + Unpin + 'static,
    {
        use futures::StreamExt;
        if let Some(urgent) = self.heartbeats.clone() {
            return Box::pin(async move { Ok(self.coalesced(input, urgent)) });
        }
        Box::pin(async move {
            let mut client = self
                .pool
                .client(&self.addr)
                .map_err(|e| RPCError::Unreachable(Unreachable::new(&Msg(e))))?;
            let shard = self.shard;
            let from_node = self.pool.self_id;
            let clock = self.pool.clock.clone();
            // Replies are paired with the requests they answer (see `append_credit`).
            let gate = Gate::new(self.pool.append_slack);
            let input = gate.requests(input, |req: &AppendEntriesRequest| {
                let prev = req.prev_log_id;
                let last = req.entries.last().map(|e| e.log_id).or(prev);
                (prev, last)
            });
            // An unencodable request ends the stream (skipped, it would shift the pairing).
            let requests = input
                .map(move |req| match codec::encode(&req) {
                    Ok(payload) => Some(RaftRequest {
                        shard_id: shard.0,
                        hlc: clock.now().0,
                        from_node,
                        payload: payload.into(),
                    }),
                    Err(e) => {
                        tracing::error!(%shard, error = %e, "cannot encode append request");
                        None
                    }
                })
                .take_while(|r| futures::future::ready(r.is_some()))
                .filter_map(futures::future::ready);
            let call = client.append_stream(tonic::Request::new(requests));
            let response = tokio::time::timeout(self.pool.rpc_timeout, call)
                .await
                .map_err(|e| RPCError::Unreachable(Unreachable::new(&e)))?
                .map_err(status_to_rpc_error)?;
            let pool = self.pool.clone();
            let target = self.target;
            let replies = response.into_inner().map(move |item| {
                let reply = item.map_err(status_to_rpc_error)?;
                pool.merge_reply_clock(reply.hlc)
                    .map_err(|e| RPCError::Network(NetworkError::new(&Msg(e))))?;
                pool.mark_seen(target);
                let result: Result<StreamAppendResult, String> = codec::decode(&reply.payload)
                    .map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
                result.map_err(|e| {
                    RPCError::Network(NetworkError::new(&Msg(format!("remote raft error: {e}"))))
                })
            });
            let replies = gate.replies(
                replies,
                |item: &Result<StreamAppendResult, RPCError>| match item {
                    Ok(Ok(matching)) => ReplyKind::Acked(matching),
                    Ok(Err(StreamAppendError::Conflict(at))) => ReplyKind::Conflict(at),
                    _ => ReplyKind::Other,
                },
                move |early| {
                    tracing::info!(
                        %shard, target, early_ms = early.as_millis() as u64,
                        "append stream ended: a late reply would have confirmed leadership too late; restarting it"
                    )
                },
            );
            Ok(Box::pin(replies) as BoxStream<'s, _>)
        })
    }

    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse, RPCError> {
        self.call("append", &rpc, &option).await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest,
        option: RPCOption,
    ) -> Result<VoteResponse, RPCError> {
        self.call("vote", &rpc, &option).await
    }

    async fn pre_vote(
        &mut self,
        rpc: VoteRequest,
        option: RPCOption,
    ) -> Result<VoteResponse, RPCError> {
        self.call("pre_vote", &rpc, &option).await
    }

    async fn transfer_leader(
        &mut self,
        req: TransferLeaderRequest,
        option: RPCOption,
    ) -> Result<TransferLeaderResponse, RPCError> {
        self.call("transfer_leader", &req, &option).await
    }

    async fn full_snapshot(
        &mut self,
        vote: Vote,
        snapshot: Snapshot,
        cancel: impl Future<Output = ReplicationClosed> + OptionalSend + 'static,
        option: RPCOption,
    ) -> Result<SnapshotResponse, StreamingError> {
        let deadline = option.hard_ttl().max(Duration::from_secs(60));
        tokio::select! {
            closed = cancel => Err(StreamingError::Closed(closed)),
            r = self.send_snapshot(vote, snapshot, deadline) => r,
        }
    }
}

/// Helper for the server side: the status a clock rejection turns into.
pub fn clock_rejection(err: &meridian_types::ClockError) -> tonic::Status {
    let mut s = tonic::Status::failed_precondition(err.to_string());
    if let Ok(v) = ErrorCode::ClockOffset.as_str().parse() {
        s.metadata_mut().insert(ERROR_CODE_HEADER, v);
    }
    s
}

/// The header the public API uses to carry HLC timestamps (re-exported for the server).
pub const HLC_METADATA: &str = HLC_HEADER;
