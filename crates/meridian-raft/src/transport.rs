//! The `RaftTransport` gRPC service: every peer message a node receives, routed to the shard
//! replica it names (see `host` for the replicas themselves).
//!
//! Each request is admitted first: a former member (`MultiRaft::set_forgotten`) is refused,
//! the sender's HLC reading is merged into this node's clock (a reading too far ahead is
//! refused, see `network::clock_rejection`), and the shard must be hosted here. Then the
//! message goes to openraft (append, heartbeats, votes, transfer, snapshots received as
//! files), to quiescence and its wake-ups (`quiesce`), to node-level pings, to the
//! closed-timestamp side channel (`closed_ts_channel`), or, for the metadata shard only, to a
//! proposal forwarded by a peer.

use crate::heartbeat_batch::MAX_HEARTBEAT_BATCH;
use crate::host::{MultiRaft, ShardReplica};
use crate::network::{clock_rejection, RateLimitedLog, SnapshotHeader};
use crate::state_machine::SnapshotFile;
use crate::transport_stats::PeerMessage;
use crate::types::*;
use meridian_proto::raft::raft_transport_server::RaftTransport;
use meridian_proto::raft::{
    HeartbeatBatch, HeartbeatBatchReply, RaftReply, RaftRequest, SnapshotChunk,
};
use meridian_types::limits::{
    MAX_MESSAGE_BYTES, MAX_PEER_STREAMS_PER_CONNECTION, SNAPSHOT_CHUNK_BYTES,
};
use meridian_types::{ShardId, Timestamp};
use openraft::type_config::async_runtime::WatchReceiver;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tonic::{Request, Response, Status, Streaming};

pub(crate) use crate::transport_admit::exit_forgotten;
use crate::transport_admit::{admit, admit_stream_request, decode_payload, refuse_forgotten};
pub use crate::transport_admit::{EXIT_FORGOTTEN, FORGOTTEN_HEADER};

/// Numbers incoming snapshot files so concurrent or retried streams never share one.
static INCOMING_SNAPSHOTS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Deletes a partly received snapshot file when its stream fails.
struct RemoveOnDrop(Option<PathBuf>);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        if let Some(path) = self.0.take() {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// Largest snapshot file a node accepts, in bytes.
pub const MAX_SNAPSHOT_BYTES: u64 = 64 * 1024 * 1024 * 1024;

/// The HTTP/2 settings of a node's peer listener, applied to `builder`: at most
/// [`MAX_PEER_STREAMS_PER_CONNECTION`] streams open per connection, and as many streams a peer
/// may reset before this listener has accepted them.
///
/// The second is HTTP/2's rapid-reset guard (CVE-2023-44487). With hyper's default (20), a
/// peer that reset more than 20 streams the listener had not accepted yet got GOAWAY
/// ENHANCE_YOUR_CALM ("too_many_resets"), and every call on that connection failed with
/// RESOURCE_EXHAUSTED. A booting node with a thousand groups does that honestly: openraft drops
/// a vote request when its election round times out, each dropped call is a reset, and the
/// busy listener is behind on accepting, so hundreds of votes failed per boot. The guard
/// stays, at the stream limit. Nothing authenticates peers (no TLS yet): the peer port must be
/// reachable from the cluster's nodes only (a firewall), this allowance or not.
pub fn peer_listener_settings(builder: tonic::transport::Server) -> tonic::transport::Server {
    builder
        .max_concurrent_streams(MAX_PEER_STREAMS_PER_CONNECTION)
        .http2_max_pending_accept_reset_streams(Some(MAX_PEER_STREAMS_PER_CONNECTION as usize))
}

/// The `RaftTransport` gRPC service.
pub struct TransportService {
    host: Arc<MultiRaft>,
    clock_log: Arc<RateLimitedLog>,
}

impl TransportService {
    pub fn new(host: Arc<MultiRaft>) -> TransportService {
        TransportService {
            host,
            clock_log: Arc::new(RateLimitedLog::new(Duration::from_secs(5))),
        }
    }

    pub fn into_server(
        self,
    ) -> meridian_proto::raft::raft_transport_server::RaftTransportServer<TransportService> {
        meridian_proto::raft::raft_transport_server::RaftTransportServer::new(self)
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES)
    }

    fn admit(&self, shard_id: u64, hlc: u64, from: u64) -> Result<Arc<ShardReplica>, Status> {
        admit(&self.host, &self.clock_log, shard_id, hlc, from)
    }

    /// Merges a node-level message's clock and notes the sender alive.
    fn admit_node(&self, hlc: u64, from: u64) -> Result<(), Status> {
        refuse_forgotten(&self.host, from)?;
        if let Err(e) = self.host.clock.update(Timestamp(hlc)) {
            if self.clock_log.should_log() {
                tracing::error!(from_node = from, error = %e, "rejecting peer message");
            }
            return Err(clock_rejection(&e));
        }
        self.host.pool.mark_seen(from);
        Ok(())
    }

    fn refuse_votes_after_start(&self) -> Result<(), Status> {
        if self.host.refuses_votes() {
            return Err(Status::unavailable(format!(
                "node {} started less than election_timeout_max ago and refuses votes (a leader it acknowledged before a restart may still hold a lease)",
                self.host.node_id
            )));
        }
        Ok(())
    }

    /// A refusal of a (pre-)vote for `candidate` when this replica's promise to a parked
    /// leader forbids it (see `parked_promise`): it carries this replica's vote, which is not
    /// above the candidate's, so the candidate only learns it was refused.
    fn promised_elsewhere(
        &self,
        replica: &ShardReplica,
        candidate: NodeId,
    ) -> Option<VoteResponse> {
        let leader = replica.promise_forbids(candidate, &self.host.ping_ledger)?;
        tracing::debug!(shard = %replica.shard, candidate, leader, "vote refused: promised to a parked leader");
        let vote = replica.raft.metrics().borrow_watched().vote;
        Some(VoteResponse::new(vote, None, false))
    }

    fn reply<T: serde::Serialize>(
        &self,
        result: Result<T, String>,
    ) -> Result<Response<RaftReply>, Status> {
        let payload = codec::encode(&result).map_err(|e| Status::internal(e.to_string()))?;
        Ok(Response::new(RaftReply {
            hlc: self.host.clock.now().0,
            payload: payload.into(),
            ..Default::default()
        }))
    }
}

#[tonic::async_trait]
impl RaftTransport for TransportService {
    async fn append(&self, request: Request<RaftRequest>) -> Result<Response<RaftReply>, Status> {
        self.host.transport_stats.received(PeerMessage::Append);
        let received = crate::quiesce::now_ms();
        let req = request.into_inner();
        let replica = self.admit(req.shard_id, req.hlc, req.from_node)?;
        let rpc: AppendEntriesRequest = decode_payload(&req)?;
        let answer = replica
            .raft
            .append_entries(rpc)
            .await
            .map_err(|e| e.to_string());
        replica.note_append_answer(received, &answer);
        self.reply(answer)
    }

    type AppendStreamStream =
        std::pin::Pin<Box<dyn futures::Stream<Item = Result<RaftReply, Status>> + Send + 'static>>;

    /// Answers at once and admits the first request when it comes: a replication session
    /// may stay idle (a quiesced leader sends nothing), and waiting for its first request
    /// before answering made every idle session time out and reconnect (a warning storm and
    /// CPU that grew with the shard count). A bad first request ends the reply stream with its
    /// status.
    async fn append_stream(
        &self,
        request: Request<Streaming<RaftRequest>>,
    ) -> Result<Response<Self::AppendStreamStream>, Status> {
        use futures::StreamExt;
        let inbound = request.into_inner();
        let host = self.host.clone();
        let clock_log = self.clock_log.clone();
        let session = async move {
            let (first, inbound) = inbound.into_future().await;
            let first = first.ok_or_else(|| Status::invalid_argument("empty append stream"))??;
            host.transport_stats.received(PeerMessage::StreamedAppend);
            let replica = admit(
                &host,
                &clock_log,
                first.shard_id,
                first.hlc,
                first.from_node,
            )?;
            let first_req: AppendEntriesRequest = decode_payload(&first)?;
            let shard_id = first.shard_id;
            // When each request reached Raft, in order: its answer, which comes in the same
            // order, is noted with it (see `rest`). At most openraft's pipeline is unanswered.
            let received = Arc::new(std::sync::Mutex::new(std::collections::VecDeque::from([
                crate::quiesce::now_ms(),
            ])));
            let (receiving, answered) = (received.clone(), received);
            // Requests after the first are admitted one by one; a bad one ends the stream (the
            // leader reconnects), it never reaches Raft.
            let streaming = replica.clone();
            let admitting = host.clone();
            let rest = inbound
                .map(move |r| {
                    let admitted = admit_stream_request(&admitting, &streaming, shard_id, r);
                    if admitted.is_some() {
                        receiving
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .push_back(crate::quiesce::now_ms());
                    }
                    admitted
                })
                .take_while(|r| futures::future::ready(r.is_some()))
                .filter_map(futures::future::ready);
            let requests = futures::stream::once(futures::future::ready(first_req)).chain(rest);
            let clock = host.clock.clone();
            let answering = replica.clone();
            let replies = replica.raft.stream_append(requests).map(move |item| {
                let result: Result<StreamAppendResult, String> =
                    item.map_err(|fatal| fatal.to_string());
                let received_at = answered
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .pop_front();
                if let Some(at) = received_at {
                    answering.note_stream_answer(at, &result);
                }
                let payload =
                    codec::encode(&result).map_err(|e| Status::internal(e.to_string()))?;
                Ok(RaftReply {
                    hlc: clock.now().0,
                    payload: payload.into(),
                    ..Default::default()
                })
            });
            // Boxed here: the opaque stream type names `replica`'s lifetime.
            Ok::<Self::AppendStreamStream, Status>(Box::pin(replies))
        };
        let replies = futures::stream::once(session).flat_map(|opened| match opened {
            Ok(replies) => replies.left_stream(),
            Err(status) => {
                futures::stream::once(futures::future::ready(Err(status))).right_stream()
            }
        });
        Ok(Response::new(Box::pin(replies)))
    }

    /// A peer's coalesced heartbeats (see `heartbeat_batch`): the sender and its clock are
    /// admitted once for the batch, then every item goes to its group's openraft as an
    /// ordinary append and is answered in order; an item for a shard with no replica here, a
    /// malformed one, or one its Raft does not answer within `item_budget`, is answered with
    /// its error and does not fail or hold up the others.
    async fn heartbeats(
        &self,
        request: Request<HeartbeatBatch>,
    ) -> Result<Response<HeartbeatBatchReply>, Status> {
        self.host
            .transport_stats
            .received(PeerMessage::HeartbeatBatch);
        let batch = request.into_inner();
        if batch.items.len() > MAX_HEARTBEAT_BATCH {
            return Err(Status::invalid_argument(format!(
                "{} heartbeats in one batch; at most {MAX_HEARTBEAT_BATCH}",
                batch.items.len()
            )));
        }
        self.admit_node(batch.hlc, batch.from_node)?;
        let from = batch.from_node;
        let host = &self.host;
        let item_budget = crate::heartbeat_batch::item_budget(Duration::from_millis(
            host.raft_config.heartbeat_interval,
        ));
        let received = crate::quiesce::now_ms();
        let answers = batch.items.into_iter().map(|item| async move {
            host.transport_stats.received(PeerMessage::Heartbeat);
            let result: Result<AppendEntriesResponse, String> = match host
                .get(ShardId(item.shard_id))
            {
                None => Err(format!(
                    "shard {} has no replica on node {}",
                    item.shard_id, host.node_id
                )),
                Some(replica) => {
                    if let Some(leader) = replica.on_peer_message(from) {
                        host.send_wake(replica.shard, leader);
                    }
                    match codec::decode::<AppendEntriesRequest>(&item.payload) {
                        Err(e) => Err(format!("malformed raft payload: {e}")),
                        // Bounded, so one shard whose Raft is slow to answer (a
                        // stalled fsync) does not hold the other shards' answers.
                        Ok(rpc) => {
                            let answer =
                                tokio::time::timeout(item_budget, replica.raft.append_entries(rpc))
                                    .await
                                    .map_err(|_| {
                                        format!(
                                    "shard {} did not answer a heartbeat within {item_budget:?}",
                                    item.shard_id
                                )
                                    })
                                    .and_then(|r| r.map_err(|e| e.to_string()));
                            replica.note_append_answer(received, &answer);
                            answer
                        }
                    }
                }
            };
            codec::encode(&result).map(bytes::Bytes::from)
        });
        let items = futures::future::join_all(answers)
            .await
            .into_iter()
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| Status::internal(e.to_string()))?;
        Ok(Response::new(HeartbeatBatchReply {
            hlc: self.host.clock.now().0,
            items,
        }))
    }

    async fn vote(&self, request: Request<RaftRequest>) -> Result<Response<RaftReply>, Status> {
        self.host.transport_stats.received(PeerMessage::Vote);
        let req = request.into_inner();
        self.refuse_votes_after_start()?;
        let replica = self.admit(req.shard_id, req.hlc, req.from_node)?;
        let rpc: VoteRequest = decode_payload(&req)?;
        let _in_flight = replica.quiet.promise.vote_starts();
        if let Some(refused) = self.promised_elsewhere(&replica, req.from_node) {
            return self.reply(Ok::<VoteResponse, String>(refused));
        }
        self.reply(replica.raft.vote(rpc).await.map_err(|e| e.to_string()))
    }

    async fn pre_vote(&self, request: Request<RaftRequest>) -> Result<Response<RaftReply>, Status> {
        self.host.transport_stats.received(PeerMessage::PreVote);
        let req = request.into_inner();
        self.refuse_votes_after_start()?;
        let replica = self.admit(req.shard_id, req.hlc, req.from_node)?;
        let rpc: VoteRequest = decode_payload(&req)?;
        let _in_flight = replica.quiet.promise.vote_starts();
        if let Some(refused) = self.promised_elsewhere(&replica, req.from_node) {
            return self.reply(Ok::<VoteResponse, String>(refused));
        }
        self.reply(replica.raft.pre_vote(rpc).await.map_err(|e| e.to_string()))
    }

    async fn transfer_leader(
        &self,
        request: Request<RaftRequest>,
    ) -> Result<Response<RaftReply>, Status> {
        self.host
            .transport_stats
            .received(PeerMessage::TransferLeader);
        let req = request.into_inner();
        let replica = self.admit(req.shard_id, req.hlc, req.from_node)?;
        let rpc: TransferLeaderRequest = decode_payload(&req)?;
        let target = *rpc.to_node_id();
        // openraft acts on a transfer whatever its election switch says (the target campaigns,
        // the others drop their leader lease), so not during the restart quarantine and not
        // under a promise that forbids helping the target (see `parked_promise`). Refusing would
        // leave the leader in its transfer until an election; instead the transfer is accepted
        // and handed to openraft once those have passed (the promise's leader asked to release
        // it), within 2 × election_timeout_max.
        if !self.host.may_join_transfer(&replica, target) {
            let (host, replica) = (self.host.clone(), replica.clone());
            tokio::spawn(async move {
                if host.settle_for_transfer(&replica, target).await {
                    replica.on_transfer_leader(target);
                    if let Err(e) = replica.raft.handle_transfer_leader(rpc).await {
                        tracing::info!(shard = %replica.shard, target, error = %e, "a deferred leader transfer failed");
                    }
                } else {
                    tracing::info!(shard = %replica.shard, target, "dropping a leader transfer: still in the restart quarantine or under a promise");
                }
            });
            return self.reply(Ok::<TransferLeaderResponse, String>(Ok(())));
        }
        // Its target is about to campaign: a candidate needs its ticker (see `rest`).
        replica.on_transfer_leader(target);
        self.reply(
            replica
                .raft
                .handle_transfer_leader(rpc)
                .await
                .map_err(|e| e.to_string()),
        )
    }

    async fn propose(&self, request: Request<RaftRequest>) -> Result<Response<RaftReply>, Status> {
        self.host.transport_stats.received(PeerMessage::Propose);
        let req = request.into_inner();
        let replica = self.admit(req.shard_id, req.hlc, req.from_node)?;
        // Data shards take writes only through the `Kv` service, which issues their timestamps
        // under the shard's `issued` tracker (snapshot reads rely on that); a timestamp chosen
        // on another node would bypass it.
        if !ShardId(req.shard_id).is_meta() {
            return self.reply(Err::<CommandResult, String>(format!(
                "shard {}: peers may propose only to the metadata shard",
                req.shard_id
            )));
        }
        let cmd: Command = decode_payload(&req)?;
        // Only a leader's own proposer coalesces, and only data writes (see `proposals`).
        if matches!(cmd, Command::Batch { .. }) {
            return self.reply(Err::<CommandResult, String>(
                "peers may not propose a coalesced batch".into(),
            ));
        }
        // `admit` woke the replica; a parked leader's lease must be renewed too.
        replica.renew_lapsed_lease().await;
        let result = match replica.raft.client_write(cmd).await {
            Ok(resp) => Ok(resp.data),
            Err(e) => Err(write_error_text(&e)),
        };
        self.reply(result)
    }

    async fn quiesce(&self, request: Request<RaftRequest>) -> Result<Response<RaftReply>, Status> {
        self.host.transport_stats.received(PeerMessage::Quiesce);
        let req = request.into_inner();
        self.admit_node(req.hlc, req.from_node)?;
        let Some(replica) = self.host.get(ShardId(req.shard_id)) else {
            return self.reply(Ok(false));
        };
        if !self
            .host
            .quiescing
            .load(std::sync::atomic::Ordering::SeqCst)
        {
            // `--quiesce false`: nothing here would wake a parked replica when its leader's
            // node dies, nor retry the release of its promise.
            return self.reply(Ok(false));
        }
        let rpc: crate::quiesce::QuiesceRequest = decode_payload(&req)?;
        // Heard before parking: a promise counts lapses from the token it is made with.
        let token = self.host.ping_ledger.hear(req.from_node);
        let parked = replica
            .park_on_request(req.from_node, &rpc, token.lapses)
            .await;
        let mut reply = self.reply(Ok::<bool, String>(parked))?;
        reply.get_mut().incarnation = token.incarnation;
        reply.get_mut().lapses = token.lapses;
        Ok(reply)
    }

    async fn wake(&self, request: Request<RaftRequest>) -> Result<Response<RaftReply>, Status> {
        self.host.transport_stats.received(PeerMessage::Wake);
        let req = request.into_inner();
        self.admit_node(req.hlc, req.from_node)?;
        if let Some(replica) = self.host.get(ShardId(req.shard_id)) {
            // Answered only once the replica is out of the parked state: the answer releases a
            // follower's promise (see `parked_promise`).
            if !replica.wake_requested().await {
                return Err(Status::unavailable(format!(
                    "shard {}: a quiesce round is still running; wake again",
                    req.shard_id
                )));
            }
        }
        self.reply(Ok::<(), String>(()))
    }

    /// A side-channel round of closed timestamps (see `closed_ts_channel`): node-level
    /// admission only, so a parked replica stays parked.
    async fn close_timestamps(
        &self,
        request: Request<RaftRequest>,
    ) -> Result<Response<RaftReply>, Status> {
        self.host
            .transport_stats
            .received(PeerMessage::CloseTimestamps);
        let req = request.into_inner();
        self.admit_node(req.hlc, req.from_node)?;
        let entries: Vec<crate::closed_ts_channel::ClosedEntry> = decode_payload(&req)?;
        let confirmed = self.host.on_closed_round(req.from_node, &entries)?;
        self.reply(Ok::<Vec<u64>, String>(confirmed))
    }

    /// Liveness, and this node's physical clock for the pinger's offset measurement. No HLC
    /// either way, nothing admitted nor merged, the pinger not marked seen (see `clock_fence`):
    /// a ping must measure exactly the clocks that HLC admission refuses.
    /// A peer's new shard map record (see `PeerPool::push_shard_map`): node-level admission,
    /// then the listener decides.
    async fn shard_map(
        &self,
        request: Request<RaftRequest>,
    ) -> Result<Response<RaftReply>, Status> {
        self.host.transport_stats.received(PeerMessage::ShardMap);
        let req = request.into_inner();
        self.admit_node(req.hlc, req.from_node)?;
        let listener = self
            .host
            .map_listener
            .get()
            .cloned()
            .ok_or_else(|| Status::unavailable("this node is still starting"))?;
        self.reply(listener(req.payload.to_vec()).await)
    }

    /// Answers with this node's physical clock and client address. PERMISSION_DENIED for a
    /// forgotten member (which then stops, see [`exit_forgotten`]); a payload is the pinger's
    /// shard map version (see `map_gossip`).
    async fn ping(&self, request: Request<RaftRequest>) -> Result<Response<RaftReply>, Status> {
        self.host.transport_stats.received(PeerMessage::Ping);
        let req = request.into_inner();
        refuse_forgotten(&self.host, req.from_node)?;
        if !req.payload.is_empty() {
            if let Ok(theirs) = codec::decode::<u64>(&req.payload) {
                self.host.map_gossip.peer_has(req.from_node, theirs);
            }
        }
        let payload = codec::encode(&Ok::<u64, String>(self.host.clock.physical_now().0))
            .map_err(|e| Status::internal(e.to_string()))?;
        let token = self.host.ping_ledger.hear(req.from_node);
        Ok(Response::new(RaftReply {
            hlc: 0,
            payload: payload.into(),
            client_addr: self.host.client_addr.get().cloned().unwrap_or_default(),
            incarnation: token.incarnation,
            lapses: token.lapses,
        }))
    }

    async fn install_snapshot(
        &self,
        request: Request<Streaming<SnapshotChunk>>,
    ) -> Result<Response<RaftReply>, Status> {
        let mut stream = request.into_inner();
        let first = stream
            .message()
            .await?
            .ok_or_else(|| Status::invalid_argument("empty snapshot stream"))?;
        self.host
            .transport_stats
            .received(PeerMessage::SnapshotChunk);
        let replica = self.admit(first.shard_id, first.hlc, first.from_node)?;
        let SnapshotHeader {
            vote,
            meta,
            version_floor,
            dedup,
        } = codec::decode(&first.header)
            .map_err(|e| Status::invalid_argument(format!("malformed snapshot header: {e}")))?;
        let dir = replica.sm.snapshot_dir().await;
        let index = meta.last_log_id.as_ref().map(|l| l.index).unwrap_or(0);
        let mut path = None;
        if !first.done {
            // A unique name per stream: a retried or concurrent stream for the same index must
            // not write into (or delete) a file another stream is still using.
            let nonce = INCOMING_SNAPSHOTS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let p = dir.join(format!(
                "incoming-{}-{index}-{}-{nonce}.sst",
                replica.shard.0,
                std::process::id()
            ));
            let mut file = tokio::fs::File::create(&p)
                .await
                .map_err(|e| Status::internal(format!("creating {}: {e}", p.display())))?;
            let mut cleanup = RemoveOnDrop(Some(p.clone()));
            let mut expected_offset = 0u64;
            loop {
                let chunk = stream.message().await?.ok_or_else(|| {
                    Status::invalid_argument("snapshot stream ended before its last chunk")
                })?;
                self.host
                    .transport_stats
                    .received(PeerMessage::SnapshotChunk);
                if chunk.data.len() > SNAPSHOT_CHUNK_BYTES || chunk.offset != expected_offset {
                    return Err(Status::invalid_argument(format!(
                        "snapshot chunk at offset {} ({} bytes), expected offset {expected_offset}",
                        chunk.offset,
                        chunk.data.len()
                    )));
                }
                if crc32fast::hash(&chunk.data) != chunk.crc32 {
                    return Err(Status::data_loss(format!(
                        "snapshot chunk at offset {} fails its CRC",
                        chunk.offset
                    )));
                }
                expected_offset += chunk.data.len() as u64;
                if expected_offset > MAX_SNAPSHOT_BYTES {
                    return Err(Status::resource_exhausted(
                        "snapshot larger than MAX_SNAPSHOT_BYTES",
                    ));
                }
                file.write_all(&chunk.data)
                    .await
                    .map_err(|e| Status::internal(format!("writing snapshot: {e}")))?;
                if chunk.done {
                    break;
                }
            }
            file.sync_all()
                .await
                .map_err(|e| Status::internal(e.to_string()))?;
            cleanup.0 = None;
            path = Some(p);
        }
        let path_for_cleanup = path.clone();
        let snapshot = Snapshot {
            meta,
            snapshot: SnapshotFile {
                path,
                version_floor,
                dedup,
            },
        };
        let installed = replica.raft.install_full_snapshot(vote, snapshot).await;
        if installed.is_err() {
            // Not installed: the file is nobody's.
            drop(RemoveOnDrop(path_for_cleanup));
        }
        self.reply(installed.map_err(|e| e.to_string()))
    }
}
