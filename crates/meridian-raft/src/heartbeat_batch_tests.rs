//! The batcher against a fake peer on loopback: one that knows `Heartbeats`, and one from
//! before it (UNIMPLEMENTED), whose heartbeats must still be answered; and a sender task that
//! ends when its peer goes idle and comes back on the next heartbeat.

use super::*;
use crate::types::{codec, TypeConfig, Vote};
use meridian_proto::raft::raft_transport_server::{RaftTransport, RaftTransportServer};
use meridian_proto::raft::{HeartbeatBatchReply, RaftReply, RaftRequest, SnapshotChunk};
use meridian_types::Clock;
use std::sync::atomic::AtomicUsize;
use tonic::{Request, Response, Status, Streaming};

/// Counts the calls it gets; answers every heartbeat `Success`, batched unless `legacy`.
#[derive(Default)]
struct FakePeer {
    legacy: bool,
    /// A shard whose `Append` calls take a second (stalled on its log).
    slow_shard: Option<u64>,
    /// `Heartbeats` calls refused as unknown (legacy).
    refused: AtomicUsize,
    batches: AtomicUsize,
    batched_items: AtomicUsize,
    appends: AtomicUsize,
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
            client_addr: String::new(),
        }))
    }

    type AppendStreamStream =
        std::pin::Pin<Box<dyn futures::Stream<Item = Result<RaftReply, Status>> + Send + 'static>>;

    async fn append_stream(
        &self,
        _: Request<Streaming<RaftRequest>>,
    ) -> Result<Response<Self::AppendStreamStream>, Status> {
        unimplemented()
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

/// Serves `peer` on a loopback port until the returned sender drops; returns its address.
async fn serve(peer: Arc<FakePeer>) -> (String, oneshot::Sender<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("address").to_string();
    let (stop, stopped) = oneshot::channel::<()>();
    tokio::spawn(async move {
        let _ = tonic::transport::Server::builder()
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
struct Setup {
    peer: Arc<FakePeer>,
    addr: String,
    pool: Arc<PeerPool>,
    _stop: oneshot::Sender<()>,
}

async fn setup(peer: FakePeer) -> Setup {
    let peer = Arc::new(peer);
    let (addr, _stop) = serve(peer.clone()).await;
    Setup {
        peer,
        addr,
        pool: pool(),
        _stop,
    }
}

fn pool() -> Arc<PeerPool> {
    PeerPool::new(
        1,
        Arc::new(Clock::new(Duration::from_millis(500))),
        Duration::from_secs(2),
        Duration::ZERO,
        Duration::from_millis(20),
    )
}

fn heartbeat() -> AppendEntriesRequest {
    AppendEntriesRequest {
        vote: Vote::new_committed(2, 1),
        prev_log_id: Some(openraft::testing::log_id::<TypeConfig>(2, 1, 10)),
        entries: Vec::new(),
        leader_commit: Some(openraft::testing::log_id::<TypeConfig>(2, 1, 10)),
    }
}

/// Sends one heartbeat for each of `shards` at once and asserts each was answered `Success`.
async fn beat(pool: &Arc<PeerPool>, addr: &str, shards: std::ops::Range<u64>) {
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

#[tokio::test]
async fn heartbeats_to_a_current_peer_travel_in_one_batch() {
    let t = setup(FakePeer::default()).await;
    beat(&t.pool, &t.addr, 0..5).await;
    assert_eq!(t.peer.batched_items.load(Ordering::SeqCst), 5);
    assert_eq!(
        t.peer.batches.load(Ordering::SeqCst),
        1,
        "one linger, one call"
    );
    assert_eq!(t.peer.appends.load(Ordering::SeqCst), 0);
}

/// A peer from before `Heartbeats`: the batch that finds out is answered through `Append`
/// calls, not failed, and later heartbeats go that way without asking again.
#[tokio::test]
async fn a_peer_without_the_heartbeats_call_gets_each_as_an_append() {
    let t = setup(FakePeer {
        legacy: true,
        ..FakePeer::default()
    })
    .await;
    beat(&t.pool, &t.addr, 0..5).await;
    assert_eq!(t.peer.appends.load(Ordering::SeqCst), 5);
    let refused = t.peer.refused.load(Ordering::SeqCst);
    assert!(refused >= 1);
    beat(&t.pool, &t.addr, 0..3).await;
    assert_eq!(t.peer.appends.load(Ordering::SeqCst), 8);
    assert_eq!(
        t.peer.refused.load(Ordering::SeqCst),
        refused,
        "a peer found legacy is not asked for a batch again within the recheck period"
    );
    assert_eq!(t.peer.batches.load(Ordering::SeqCst), 0);
}

/// To a legacy peer, each heartbeat is answered when its own `Append` call ends: one shard
/// stalled on the peer's log does not hold up the answers of the others of its batch.
#[tokio::test]
async fn a_legacy_peer_s_slow_shard_holds_up_only_its_own_heartbeat() {
    let t = setup(FakePeer {
        legacy: true,
        slow_shard: Some(3),
        ..FakePeer::default()
    })
    .await;
    let started = tokio::time::Instant::now();
    let sends = (0..6u64).map(|shard| {
        let t = &t;
        async move {
            let answer = send(&t.pool, &t.addr, shard, heartbeat(), false).await;
            (shard, started.elapsed(), answer)
        }
    });
    for (shard, took, answer) in futures::future::join_all(sends).await {
        assert!(matches!(answer, Ok(Ok(_))), "shard {shard}: {answer:?}");
        if shard == 3 {
            assert!(
                took >= Duration::from_secs(1),
                "the slow shard took {took:?}"
            );
        } else {
            assert!(
                took < Duration::from_millis(800),
                "shard {shard}'s heartbeat waited {took:?} for the slow shard's"
            );
        }
    }
}

/// A sender task ends once its peer has been idle for the batcher's idle time (its queue
/// leaves the map) and the next heartbeat starts a new one.
#[tokio::test]
async fn an_idle_peer_s_sender_ends_and_the_next_heartbeat_starts_another() {
    let t = setup(FakePeer::default()).await;
    t.pool.heartbeats.idle_ms.store(150, Ordering::Relaxed);
    beat(&t.pool, &t.addr, 0..2).await;
    assert_eq!(t.pool.heartbeats.peers(), vec![t.addr.clone()]);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while !t.pool.heartbeats.peers().is_empty() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the idle peer's sender task did not end"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    beat(&t.pool, &t.addr, 0..2).await;
    assert_eq!(t.pool.heartbeats.peers(), vec![t.addr.clone()]);
    assert_eq!(t.peer.batched_items.load(Ordering::SeqCst), 4);
}

/// A peer that left the cluster: its queue and channel are dropped, and a later heartbeat to
/// the address (a node that came back there) dials again.
#[tokio::test]
async fn a_forgotten_peer_s_queue_and_channel_are_dropped() {
    let t = setup(FakePeer::default()).await;
    beat(&t.pool, &t.addr, 0..2).await;
    assert_eq!(t.pool.heartbeats.peers(), vec![t.addr.clone()]);
    assert_eq!(t.pool.cached_channels(), 1);
    t.pool.forget_addrs(std::slice::from_ref(&t.addr));
    assert!(t.pool.heartbeats.peers().is_empty());
    assert_eq!(t.pool.cached_channels(), 0);
    beat(&t.pool, &t.addr, 0..2).await;
    assert_eq!(t.peer.batched_items.load(Ordering::SeqCst), 4);
}
