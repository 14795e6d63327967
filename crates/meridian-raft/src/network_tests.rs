//! Replication streams against a fake peer on loopback, opened as openraft opens them.

use super::*;
use crate::fake_peer::{beat, heartbeat, setup, FakePeer};
use futures::StreamExt;
use meridian_types::limits::MAX_PEER_STREAMS_PER_CONNECTION;

/// One open replication stream: openraft's request side and the reply side.
struct OpenStream {
    requests: futures::channel::mpsc::UnboundedSender<AppendEntriesRequest>,
    replies: BoxStream<'static, Result<StreamAppendResult, RPCError>>,
}

/// Opens `shard`'s replication stream to the peer at `addr` as openraft does, sends one
/// heartbeat on it and waits for the answer.
async fn open_stream(pool: &Arc<PeerPool>, addr: &str, shard: u64) -> Result<OpenStream, String> {
    let mut factory = NetworkFactory {
        shard: ShardId(shard),
        pool: pool.clone(),
        urgent: Default::default(),
        gate: Arc::new(crate::parked_promise::CampaignGate {
            me: 1,
            promise: Default::default(),
            ledger: Arc::new(crate::parked_lease::PingLedger::new(1_000)),
            started_ms: 0,
            election_timeout_max_ms: 1_000,
        }),
    };
    let node = Node {
        addr: addr.to_string(),
    };
    // The stream borrows its connection for its whole life; a test can leak one.
    let connection: &'static mut PeerConnection =
        Box::leak(Box::new(factory.new_client(2, &node).await));
    let (requests, input) = futures::channel::mpsc::unbounded();
    let mut replies = connection
        .stream_append(input, RPCOption::new(Duration::from_secs(5)))
        .await
        .map_err(|e| format!("shard {shard}'s stream did not open: {e}"))?;
    requests
        .unbounded_send(heartbeat())
        .map_err(|e| e.to_string())?;
    match tokio::time::timeout(Duration::from_secs(5), replies.next()).await {
        Ok(Some(Ok(Ok(_)))) => Ok(OpenStream { requests, replies }),
        other => Err(format!("shard {shard}'s stream answered {other:?}")),
    }
}

/// A node leading more shards with a replica on one peer than a peer connection has stream
/// slots (1,024 data shards led from their home region, say): every shard's stream opens and
/// stays open, and the node's other calls to the peer still get through. Before the streams
/// had connections of their own, the 1,025th stream and every later call to the peer waited
/// for a slot that never freed.
#[tokio::test]
async fn more_streams_than_one_connection_carries_all_open_and_other_calls_pass() {
    let t = setup(FakePeer::default()).await;
    let shards = u64::from(MAX_PEER_STREAMS_PER_CONNECTION) + 8;
    let mut open = Vec::new();
    for shard in 0..shards {
        open.push(open_stream(&t.pool, &t.addr, shard).await.unwrap());
    }
    assert_eq!(t.peer.open_streams.load(Ordering::SeqCst), shards as usize);
    tokio::time::timeout(Duration::from_secs(5), beat(&t.pool, &t.addr, 0..3))
        .await
        .expect("heartbeats to the peer waited behind the replication streams");
    // The streams came on three connections (512 + 512 + 8), the heartbeats on another.
    let streams_came_on = t.peer.stream_connections.lock().unwrap().clone();
    let batches_came_on = t.peer.batch_connections.lock().unwrap().clone();
    assert_eq!(streams_came_on.len(), 3, "{streams_came_on:?}");
    assert_eq!(batches_came_on.len(), 1, "{batches_came_on:?}");
    assert!(streams_came_on.is_disjoint(&batches_came_on));
    // Every stream still carries requests.
    for (shard, stream) in open.iter_mut().enumerate().step_by(97) {
        stream.requests.unbounded_send(heartbeat()).unwrap();
        let answer = tokio::time::timeout(Duration::from_secs(5), stream.replies.next()).await;
        assert!(
            matches!(answer, Ok(Some(Ok(Ok(_))))),
            "shard {shard}: {answer:?}"
        );
    }
    let lanes = t.pool.stream_lanes(&t.addr);
    assert_eq!(lanes.iter().sum::<usize>(), shards as usize);
    assert!(
        lanes
            .iter()
            .all(|&n| n <= crate::peer_streams::STREAMS_PER_CONNECTION),
        "{lanes:?}"
    );
}

/// A stream whose reply side openraft drops (after a conflict or an error) while its
/// request side is still alive gives its place back once the gate has ended the request side
/// too, and the peer sees the stream end.
#[tokio::test]
async fn a_stream_whose_replies_are_dropped_gives_its_place_back() {
    let t = setup(FakePeer::default()).await;
    let first = open_stream(&t.pool, &t.addr, 1).await.unwrap();
    let _second = open_stream(&t.pool, &t.addr, 2).await.unwrap();
    assert_eq!(t.pool.stream_lanes(&t.addr), vec![2]);
    let OpenStream { requests, replies } = first;
    drop(replies);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while t.pool.stream_lanes(&t.addr) != vec![1] || t.peer.open_streams.load(Ordering::SeqCst) != 1
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the dropped stream still holds a place: lanes {:?}, open at the peer {}",
            t.pool.stream_lanes(&t.addr),
            t.peer.open_streams.load(Ordering::SeqCst)
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let _third = open_stream(&t.pool, &t.addr, 3).await.unwrap();
    assert_eq!(
        t.pool.stream_lanes(&t.addr),
        vec![2],
        "the freed place was taken again"
    );
    // openraft's sender lived throughout: only the gate ended the request side.
    drop(requests);
}

/// Calls a node gives up on by the hundred before the peer has accepted them (a booting node's
/// votes, dropped when their election rounds time out) do not cost the connection they share
/// with other calls: the peer's listener takes up to its stream limit of such resets
/// (`transport::peer_listener_settings`). With HTTP/2's default of 20 it answered GOAWAY
/// "too_many_resets" and failed every call on the connection with RESOURCE_EXHAUSTED.
#[tokio::test]
async fn calls_dropped_by_the_hundred_do_not_cost_the_connection() {
    let t = setup(FakePeer {
        slow_shard: Some(7),
        ..FakePeer::default()
    })
    .await;
    let payload = codec::encode(&heartbeat()).unwrap();
    let call = |shard: u64| {
        let mut client = t.pool.client(&t.addr).unwrap();
        let request = RaftRequest {
            shard_id: shard,
            hlc: 0,
            from_node: 1,
            payload: payload.clone().into(),
        };
        async move { client.append(request).await.map(|_| ()) }
    };
    // Connected first, so what follows is resets, not dials.
    call(1).await.expect("the first call");
    // Calls that live through the resets, each answered after a second.
    let witnesses: Vec<_> = (0..5).map(|_| tokio::spawn(call(7))).collect();
    for _ in 0..10 {
        let dropped = (0..100).map(|_| tokio::time::timeout(Duration::from_micros(200), call(7)));
        futures::future::join_all(dropped).await;
    }
    for (i, witness) in witnesses.into_iter().enumerate() {
        let answer = witness.await.unwrap();
        assert!(
            answer.is_ok(),
            "call {i} lived through the resets: {answer:?}"
        );
    }
}
