//! The batcher against a fake peer on loopback: one that knows `Heartbeats`, and one from
//! before it (UNIMPLEMENTED), whose heartbeats must still be answered; and a sender task that
//! ends when its peer goes idle and comes back on the next heartbeat.

use super::*;
use crate::fake_peer::{beat, heartbeat, setup, FakePeer};

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
