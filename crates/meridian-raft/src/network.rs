//! The peer transport: every Raft group's traffic over one tonic service and a few HTTP/2
//! connections per peer node (the channels: [`PeerPool`], in `peer_pool`; the receiving side:
//! `transport`).
//!
//! ```text
//!   shard 3 replication ─┐   PeerPool[node 2]       ┌─► shard 3's Raft
//!   shard 5 replication ─┴─► stream lanes ══════════╪─► shard 5's Raft   (RaftTransport service,
//!   shard 0 heartbeats  ───► control channel ═══════╧─► shard 0's Raft    routed by shard_id)
//! ```
//!
//! Replication streams (one per shard and follower, long-lived) and snapshot transfers travel
//! on their own connections, at most half the peer's stream limit on each (`peer_streams`);
//! every other call (heartbeat batches, votes, pings) shares one control channel per peer.
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
use crate::state_machine::SnapshotFile;
use crate::types::*;
use meridian_proto::raft::{RaftReply, RaftRequest, SnapshotChunk};
use meridian_types::error::{ERROR_CODE_HEADER, HLC_HEADER};
use meridian_types::limits::SNAPSHOT_CHUNK_BYTES;
use meridian_types::{ErrorCode, ShardId};
use openraft::base::{BoxFuture, BoxStream};
use openraft::errors::{NetworkError, ReplicationClosed, Unreachable};
use openraft::network::{RPCOption, RaftNetworkFactory, RaftNetworkV2};
use openraft::raft::StreamAppendError;
use openraft::OptionalSend;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::AsyncReadExt;

pub use crate::peer_pool::{PeerPool, PingFailure};

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

/// Creates per-target connections for one shard's Raft.
pub struct NetworkFactory {
    pub shard: ShardId,
    pub pool: Arc<PeerPool>,
    /// The shard's waiting requests (see `heartbeat_batch::Urgent`), for its heartbeats.
    pub urgent: Arc<crate::heartbeat_batch::Urgent>,
    /// Whether the replica may campaign now (see `parked_promise`).
    pub gate: Arc<crate::parked_promise::CampaignGate>,
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
            gate: self.gate.clone(),
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
    gate: Arc<crate::parked_promise::CampaignGate>,
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
    /// A refusal, answered here, of this replica's own (pre-)vote request when it may not
    /// campaign now (see `parked_promise::CampaignGate`): a refusal, not an error, so the
    /// campaign ends quietly instead of logging a warning per peer. It carries a vote of term
    /// 0, below the candidate's, so the candidate adopts nothing from it.
    fn campaign_refused(&self) -> Option<VoteResponse> {
        let why = self.gate.refusal()?;
        tracing::debug!(shard = %self.shard, target = self.target, %why, "not campaigning");
        Some(VoteResponse::new(Vote::new(0, self.gate.me), None, false))
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
        // A snapshot streams the whole file: it takes a replication connection's slot, off
        // the connection that carries pings and votes (see `peer_streams`).
        let (mut client, _slot) = self
            .pool
            .stream_client(&self.addr)
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
            let (mut client, slot) = self
                .pool
                .stream_client(&self.addr)
                .map_err(|e| RPCError::Unreachable(Unreachable::new(&Msg(e))))?;
            // The stream's place on its connection, held by both sides: it is given back once
            // openraft has dropped the replies and hyper the request body.
            let slot = Arc::new(slot);
            let body_slot = slot.clone();
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
                .map(move |req| {
                    let _slot = &body_slot;
                    match codec::encode(&req) {
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
                let _slot = &slot;
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
        if let Some(refused) = self.campaign_refused() {
            return Ok(refused);
        }
        self.call("vote", &rpc, &option).await
    }

    async fn pre_vote(
        &mut self,
        rpc: VoteRequest,
        option: RPCOption,
    ) -> Result<VoteResponse, RPCError> {
        if let Some(refused) = self.campaign_refused() {
            return Ok(refused);
        }
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

#[cfg(test)]
#[path = "network_tests.rs"]
mod peer_tests;
