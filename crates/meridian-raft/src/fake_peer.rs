//! A fake peer node for the transport's tests, serving `RaftTransport` on loopback: it answers
//! heartbeats (batched, or one `Append` each when `legacy`) and replication streams, with the
//! same limit on streams per connection as a node, and counts what it gets.

use crate::heartbeat_batch::send;
use crate::network::PeerPool;
use crate::types::{
    codec, AppendEntriesRequest, AppendEntriesResponse, StreamAppendResult, TypeConfig, Vote,
};
use meridian_proto::raft::raft_transport_server::{RaftTransport, RaftTransportServer};
use meridian_proto::raft::{
    HeartbeatBatch, HeartbeatBatchReply, RaftReply, RaftRequest, SnapshotChunk,
};
use meridian_types::Clock;
use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::oneshot;
use tonic::{Request, Response, Status, Streaming};

/// Counts the calls it gets; answers every heartbeat `Success`, batched unless `legacy`.
#[derive(Default)]
pub struct FakePeer {
    pub legacy: bool,
    /// A shard whose `Append` calls take a second (stalled on its log).
    pub slow_shard: Option<u64>,
    /// `Heartbeats` calls refused as unknown (legacy).
    pub refused: AtomicUsize,
    pub batches: AtomicUsize,
    pub batched_items: AtomicUsize,
    pub appends: AtomicUsize,
    /// Replication streams open now.
    pub open_streams: Arc<AtomicUsize>,
    /// The connections (the caller's address) that replication streams came on, and those that
    /// heartbeat batches came on.
    pub stream_connections: Mutex<HashSet<SocketAddr>>,
    pub batch_connections: Mutex<HashSet<SocketAddr>>,
}

/// Notes the connection `request` came on in `set`.
fn note_connection<T>(set: &Mutex<HashSet<SocketAddr>>, request: &Request<T>) {
    if let Some(addr) = request.remote_addr() {
        set.lock().unwrap_or_else(|p| p.into_inner()).insert(addr);
    }
}

/// Counts one open stream while it lives.
struct OpenStream(Arc<AtomicUsize>);

impl OpenStream {
    fn new(count: Arc<AtomicUsize>) -> Self {
        count.fetch_add(1, Ordering::SeqCst);
        OpenStream(count)
    }
}

impl Drop for OpenStream {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

fn success(payload: &[u8]) -> Result<bytes::Bytes, Status> {
    let _: AppendEntriesRequest =
        codec::decode(payload).map_err(|e| Status::invalid_argument(e.to_string()))?;
    let answer: Result<AppendEntriesResponse, String> = Ok(AppendEntriesResponse::Success);
    Ok(codec::encode(&answer).expect("encodes").into())
}

fn unimplemented<T>() -> Result<T, Status> {
    Err(Status::unimplemented("not in this fake"))
}

#[tonic::async_trait]
impl RaftTransport for FakePeer {
    async fn append(&self, request: Request<RaftRequest>) -> Result<Response<RaftReply>, Status> {
        self.appends.fetch_add(1, Ordering::SeqCst);
        let request = request.into_inner();
        if self.slow_shard == Some(request.shard_id) {
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        let payload = success(&request.payload)?;
        Ok(Response::new(RaftReply {
            hlc: 0,
            payload,
            ..Default::default()
        }))
    }

    type AppendStreamStream =
        std::pin::Pin<Box<dyn futures::Stream<Item = Result<RaftReply, Status>> + Send + 'static>>;

    /// Answers each request as its follower would a heartbeat it matches, and keeps the stream
    /// open until the sender ends it; `open_streams` counts the streams open at a time.
    async fn append_stream(
        &self,
        request: Request<Streaming<RaftRequest>>,
    ) -> Result<Response<Self::AppendStreamStream>, Status> {
        use futures::StreamExt;
        note_connection(&self.stream_connections, &request);
        let open = OpenStream::new(self.open_streams.clone());
        let replies = request.into_inner().map(move |item| {
            let _open = &open;
            let request = item?;
            let req: AppendEntriesRequest = codec::decode(&request.payload)
                .map_err(|e| Status::invalid_argument(e.to_string()))?;
            let matching = req.entries.last().map(|e| e.log_id).or(req.prev_log_id);
            let answer: Result<StreamAppendResult, String> = Ok(Ok(matching));
            Ok(RaftReply {
                hlc: 0,
                payload: codec::encode(&answer).expect("encodes").into(),
                ..Default::default()
            })
        });
        Ok(Response::new(Box::pin(replies)))
    }

    async fn heartbeats(
        &self,
        request: Request<HeartbeatBatch>,
    ) -> Result<Response<HeartbeatBatchReply>, Status> {
        if self.legacy {
            self.refused.fetch_add(1, Ordering::SeqCst);
            return Err(Status::unimplemented("unknown method Heartbeats"));
        }
        self.batches.fetch_add(1, Ordering::SeqCst);
        note_connection(&self.batch_connections, &request);
        let batch = request.into_inner();
        self.batched_items
            .fetch_add(batch.items.len(), Ordering::SeqCst);
        let items = batch
            .items
            .iter()
            .map(|item| success(&item.payload))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Response::new(HeartbeatBatchReply { hlc: 0, items }))
    }

    async fn vote(&self, _: Request<RaftRequest>) -> Result<Response<RaftReply>, Status> {
        unimplemented()
    }
    async fn pre_vote(&self, _: Request<RaftRequest>) -> Result<Response<RaftReply>, Status> {
        unimplemented()
    }
    async fn transfer_leader(
        &self,
        _: Request<RaftRequest>,
    ) -> Result<Response<RaftReply>, Status> {
        unimplemented()
    }
    async fn install_snapshot(
        &self,
        _: Request<Streaming<SnapshotChunk>>,
    ) -> Result<Response<RaftReply>, Status> {
        unimplemented()
    }
    async fn propose(&self, _: Request<RaftRequest>) -> Result<Response<RaftReply>, Status> {
        unimplemented()
    }
    async fn quiesce(&self, _: Request<RaftRequest>) -> Result<Response<RaftReply>, Status> {
        unimplemented()
    }
    async fn wake(&self, _: Request<RaftRequest>) -> Result<Response<RaftReply>, Status> {
        unimplemented()
    }
    async fn ping(&self, _: Request<RaftRequest>) -> Result<Response<RaftReply>, Status> {
        unimplemented()
    }
    async fn close_timestamps(
        &self,
        _: Request<RaftRequest>,
    ) -> Result<Response<RaftReply>, Status> {
        unimplemented()
    }
    async fn shard_map(&self, _: Request<RaftRequest>) -> Result<Response<RaftReply>, Status> {
        unimplemented()
    }
}

/// Serves `peer` on a loopback port, with a node's limit on streams per peer connection, until the returned sender drops; returns its address.
async fn serve(peer: Arc<FakePeer>) -> (String, oneshot::Sender<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("address").to_string();
    let (stop, stopped) = oneshot::channel::<()>();
    tokio::spawn(async move {
        let _ = crate::transport::peer_listener_settings(tonic::transport::Server::builder())
            .add_service(RaftTransportServer::from_arc(peer))
            .serve_with_incoming_shutdown(
                tonic::transport::server::TcpIncoming::from(listener),
                async {
                    let _ = stopped.await;
                },
            )
            .await;
    });
    (addr, stop)
}

/// A fake peer serving on loopback, and a pool of node 1's to reach it with.
pub struct Setup {
    pub peer: Arc<FakePeer>,
    pub addr: String,
    pub pool: Arc<PeerPool>,
    _stop: oneshot::Sender<()>,
}

pub async fn setup(peer: FakePeer) -> Setup {
    let peer = Arc::new(peer);
    let (addr, _stop) = serve(peer.clone()).await;
    Setup {
        peer,
        addr,
        pool: pool(),
        _stop,
    }
}

pub fn pool() -> Arc<PeerPool> {
    PeerPool::new(
        1,
        Arc::new(Clock::new(Duration::from_millis(500))),
        Duration::from_secs(2),
        Duration::ZERO,
        Duration::from_millis(20),
    )
}

pub fn heartbeat() -> AppendEntriesRequest {
    AppendEntriesRequest {
        vote: Vote::new_committed(2, 1),
        prev_log_id: Some(openraft::testing::log_id::<TypeConfig>(2, 1, 10)),
        entries: Vec::new(),
        leader_commit: Some(openraft::testing::log_id::<TypeConfig>(2, 1, 10)),
    }
}

/// Sends one heartbeat for each of `shards` at once and asserts each was answered `Success`.
pub async fn beat(pool: &Arc<PeerPool>, addr: &str, shards: std::ops::Range<u64>) {
    let sends = shards.map(|shard| send(pool, addr, shard, heartbeat(), false));
    for (i, answer) in futures::future::join_all(sends)
        .await
        .into_iter()
        .enumerate()
    {
        let answer = answer.unwrap_or_else(|e| panic!("heartbeat {i} failed: {e}"));
        assert!(answer.is_ok(), "heartbeat {i} answered {answer:?}");
    }
}
