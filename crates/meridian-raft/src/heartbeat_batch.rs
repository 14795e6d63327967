//! Coalesced heartbeats: one call per peer node carries the heartbeats of every group this
//! node leads there, instead of one gRPC stream per group per heartbeat.
//!
//! # Why
//! openraft sends each follower of each group a heartbeat every `heartbeat_interval` while the
//! group is awake, and it sends each as a one-request `stream_append` call. On our transport
//! that was one HTTP/2 stream, one request task on the follower and one stream task in its
//! openraft, per heartbeat: 256 awake shards on 3 nodes with a 100 ms interval are 5,120 such
//! calls a second, whatever the load. CockroachDB coalesces the heartbeats of its ranges per
//! node pair for the same reason. Quiescence (`quiesce`) removes the heartbeats of idle
//! groups; this removes most of the per-call cost of the awake ones.
//!
//! ```text
//!  group 3 heartbeat worker ─┐  Pending{shard, request}      after `linger`, all queued
//!  group 9 heartbeat worker ─┼─► bounded queue per peer ──► one Heartbeats(batch) call ──►
//!  group 5 heartbeat worker ─┘   (one sender task)          (≤ MAX_BATCHES_IN_FLIGHT)
//!      ◄── each worker gets its own item of the reply (same order), or the call's error
//! ```
//!
//! The follower's handler (`host`'s `heartbeats`) refuses a forgotten sender and merges the
//! batch's clock once (refusing the whole batch beyond `max_offset`, as it would each
//! message), then hands each item to its group's openraft as an ordinary `append_entries`
//! and answers every item, in order.
//!
//! # Safety
//! A heartbeat's acknowledgement extends the leader's lease from the time openraft *produced*
//! the heartbeat (its `HeartbeatEvent` time), not from when the transport sent it or the reply
//! came back. The time a heartbeat waits in the queue therefore only shortens the lease it
//! confirms; it can never lengthen it. Heartbeats carry no entries, so a lost or refused batch
//! loses nothing: openraft sends the next heartbeat on its own.
//!
//! # Invariants
//! - The reply to a batch has exactly one item per request item, in order; a reply of any
//!   other length fails every heartbeat of the batch.
//! - A queue holds at most [`HEARTBEAT_QUEUE`] heartbeats per peer (a full queue fails the
//!   heartbeat at once: the peer is not keeping up); a batch holds at most
//!   [`MAX_HEARTBEAT_BATCH`]; at most [`MAX_BATCHES_IN_FLIGHT`] calls per peer are in flight,
//!   each with the RPC deadline.
//! - A follower answers each item within [`item_budget`] (half the heartbeat interval) of
//!   its Raft's answer or with an error, so one stalled shard does not hold up the batch's
//!   others past their leaders' heartbeat timeout.
//! - A heartbeat whose worker stopped waiting for it (openraft's timeout) is not sent.
//! - A heartbeat waits at most `linger` (a tenth of the heartbeat interval, at most 10 ms)
//!   before its batch is sent, unless the peer's calls in flight are at their limit; one a
//!   request waits on (a ReadIndex round, see [`Urgent`]) does not wait for it.
//!
//! # Peers that do not know `Heartbeats`
//! A node from before this module answers the call UNIMPLEMENTED. Its heartbeats are then
//! re-sent at once, each as an ordinary unary `Append` call (which every version has; at most
//! [`LEGACY_CALLS_IN_FLIGHT`] per batch at a time, each answered as soon as its own call ends),
//! and the peer's later heartbeats go that way too for [`LEGACY_RECHECK`], after which batches
//! try the call again (the peer may have been upgraded). So a rolling upgrade does not cost the
//! leaders here their leases: the heartbeats of the batch that found out are answered, not
//! failed. The first such answer per recheck period is logged as a warning; a sender task
//! that ended idle (below) forgets the mark, and its successor asks again.
//!
//! # Idle peers
//! A peer's sender task ends after [`PEER_IDLE`] with nothing queued (every group it shared
//! with this node quiesced, or the peer left the cluster) and takes its queue out of the map
//! first, so a peer that left costs nothing here. The next heartbeat to it starts a new task.
//! A heartbeat that raced the task's end (its queue closed under it) is queued again on the
//! new one.
//!
//! A peer that leaves the cluster's node list (`MultiRaft::set_peers`) loses its queue at
//! once, and its cached HTTP/2 channel with it (`PeerPool::forget_addrs`).
//!
//! # Not done yet
//! - Replication streams (appends with entries) are still one HTTP/2 stream per group and
//!   follower; only heartbeats are coalesced.

use crate::network::{Msg, PeerPool};
use crate::types::{AppendEntriesRequest, AppendEntriesResponse, RPCError, StreamAppendResult};
use meridian_proto::raft::{HeartbeatBatch, HeartbeatItem};
use openraft::errors::{NetworkError, Unreachable};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot, Notify, Semaphore};
use tokio::time::Instant;

/// Most heartbeats in one call.
pub const MAX_HEARTBEAT_BATCH: usize = 4_096;
/// Most heartbeats queued for one peer.
pub const HEARTBEAT_QUEUE: usize = 16 * 1024;
/// Most calls in flight to one peer.
pub const MAX_BATCHES_IN_FLIGHT: usize = 4;
/// How long a peer that does not know the `Heartbeats` call gets its heartbeats one `Append`
/// call each before a batch tries the call again.
pub const LEGACY_RECHECK: Duration = Duration::from_secs(30);
/// Most unary `Append` calls one batch to a legacy peer has in flight.
pub const LEGACY_CALLS_IN_FLIGHT: usize = 64;
/// How long a peer's sender task waits with nothing queued before it ends.
pub const PEER_IDLE: Duration = Duration::from_secs(60);

/// The longest a heartbeat waits for others to join its batch, for a heartbeat interval.
pub fn linger_for(heartbeat_interval: Duration) -> Duration {
    (heartbeat_interval / 10).min(Duration::from_millis(10))
}

/// How long a follower's Raft may take to answer one heartbeat of a batch before the item is
/// answered with an error: half the heartbeat interval, so a shard stalled on its log (a slow
/// fsync: openraft answers a heartbeat once the follower's log writes are flushed) fails its
/// own heartbeat, as it would alone, without holding up the answers of the batch's others past
/// their leaders' heartbeat timeout.
pub fn item_budget(heartbeat_interval: Duration) -> Duration {
    heartbeat_interval / 2
}

/// How many requests wait on a quorum round of one shard (a ReadIndex read, a lapsed lease's
/// renewal before a write; see `host::ShardReplica::ensure_linearizable`; lease reads do not
/// count). While any does, the
/// shard's heartbeats are sent at once: openraft confirms such a round with a heartbeat, and
/// the linger would be the request's latency. A new waiter also ends the linger of every
/// batch being gathered (a heartbeat of its shard may be in one: sent on the wake, just
/// before the request asked for its round).
#[derive(Debug, Default)]
pub struct Urgent {
    waiting: AtomicUsize,
    pool: Weak<PeerPool>,
}

impl Urgent {
    /// The counter of a shard whose heartbeats go through `pool`'s queues.
    pub fn new(pool: &Arc<PeerPool>) -> Urgent {
        Urgent {
            waiting: AtomicUsize::new(0),
            pool: Arc::downgrade(pool),
        }
    }

    /// Counts a waiting request until the guard drops.
    pub fn hold(&self) -> UrgentGuard<'_> {
        self.waiting.fetch_add(1, Ordering::SeqCst);
        if let Some(pool) = self.pool.upgrade() {
            pool.heartbeats.flush_all();
        }
        UrgentGuard(self)
    }

    pub fn waiting(&self) -> bool {
        self.waiting.load(Ordering::SeqCst) > 0
    }
}

pub struct UrgentGuard<'a>(&'a Urgent);

impl Drop for UrgentGuard<'_> {
    fn drop(&mut self) {
        self.0.waiting.fetch_sub(1, Ordering::SeqCst);
    }
}

/// What a heartbeat's caller gets: the item of the reply (an encoded
/// `Result<AppendEntriesResponse, String>`), or why the call failed.
type ItemResult = Result<bytes::Bytes, RPCError>;

struct Pending {
    shard: u64,
    payload: Vec<u8>,
    /// A request waits on this heartbeat (see [`Urgent`]): no linger.
    now: bool,
    reply: oneshot::Sender<ItemResult>,
}

/// One peer's queue, and the signal that cuts its sender's linger short.
#[derive(Clone)]
struct PeerQueue {
    tx: mpsc::Sender<Pending>,
    flush: Arc<Notify>,
}

/// The per-peer queues and their sender tasks (one set per node, in its [`PeerPool`]).
pub struct HeartbeatBatcher {
    queues: Mutex<HashMap<String, PeerQueue>>,
    /// How long a sender task waits with nothing queued before it ends ([`PEER_IDLE`]; tests
    /// shorten it).
    idle_ms: AtomicU64,
}

impl Default for HeartbeatBatcher {
    fn default() -> Self {
        HeartbeatBatcher {
            queues: Mutex::default(),
            idle_ms: AtomicU64::new(PEER_IDLE.as_millis() as u64),
        }
    }
}

impl HeartbeatBatcher {
    /// Ends every peer's linger now (or the next one, if none is lingering).
    fn flush_all(&self) {
        let queues = self.queues.lock().unwrap_or_else(|p| p.into_inner());
        for queue in queues.values() {
            queue.flush.notify_one();
        }
    }

    /// The queue to the peer at `addr`, starting its sender task on first use (or after the
    /// last one ended).
    fn queue(&self, pool: &Arc<PeerPool>, addr: &str) -> PeerQueue {
        let mut queues = self.queues.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(queue) = queues.get(addr).filter(|q| !q.tx.is_closed()) {
            return queue.clone();
        }
        let (tx, rx) = mpsc::channel(HEARTBEAT_QUEUE);
        let flush = Arc::new(Notify::new());
        tokio::spawn(run_peer(
            Arc::downgrade(pool),
            addr.to_string(),
            rx,
            flush.clone(),
        ));
        let queue = PeerQueue { tx, flush };
        queues.insert(addr.to_string(), queue.clone());
        queue
    }

    /// Takes `addr`'s queue out of the map if it is still the one `flush` belongs to, and
    /// closes `rx` under the map's lock: from then on [`HeartbeatBatcher::queue`] starts a new
    /// task, and a sender holding the old queue gets `Closed` (and asks again).
    fn retire(&self, addr: &str, flush: &Arc<Notify>, rx: &mut mpsc::Receiver<Pending>) {
        let mut queues = self.queues.lock().unwrap_or_else(|p| p.into_inner());
        if queues
            .get(addr)
            .is_some_and(|q| Arc::ptr_eq(&q.flush, flush))
        {
            queues.remove(addr);
        }
        rx.close();
    }

    /// Drops the queues of `addrs` (peers that left the cluster): each sender task ends once
    /// the heartbeats already handed to it are sent (its queue's last sender is gone).
    pub(crate) fn forget(&self, addrs: &[String]) {
        let mut queues = self.queues.lock().unwrap_or_else(|p| p.into_inner());
        for addr in addrs {
            queues.remove(addr);
        }
    }

    fn idle(&self) -> Duration {
        Duration::from_millis(self.idle_ms.load(Ordering::Relaxed))
    }

    /// The peers with a sender task (for tests).
    #[cfg(test)]
    fn peers(&self) -> Vec<String> {
        let queues = self.queues.lock().unwrap_or_else(|p| p.into_inner());
        queues.keys().cloned().collect()
    }
}

/// Sends one heartbeat (`req`, for `shard`) to the peer at `addr` in the peer's next batch
/// (at once if `now`: a request waits on it) and returns the follower's answer as the
/// heartbeat's stream would have.
pub(crate) async fn send(
    pool: &Arc<PeerPool>,
    addr: &str,
    shard: u64,
    req: AppendEntriesRequest,
    now: bool,
) -> Result<StreamAppendResult, RPCError> {
    let prev = req.prev_log_id;
    let last = req.entries.last().map(|e| e.log_id).or(prev);
    let payload = crate::types::codec::encode(&req).map_err(network)?;
    let item = enqueue(pool, addr, shard, payload, now).await?;
    let response: Result<AppendEntriesResponse, String> =
        crate::types::codec::decode(&item).map_err(network)?;
    let response = response.map_err(|e| {
        RPCError::Network(NetworkError::new(&Msg(format!("remote raft error: {e}"))))
    })?;
    Ok(response.into_stream_result(prev, last))
}

/// Queues one heartbeat's `payload` for `addr` and waits for its item of the reply. A queue
/// that closed under us (its task ended idle, see [`HeartbeatBatcher::retire`]) is asked for
/// again once: the map no longer holds it, so the second ask starts a new task.
async fn enqueue(
    pool: &Arc<PeerPool>,
    addr: &str,
    shard: u64,
    payload: Vec<u8>,
    now: bool,
) -> ItemResult {
    let (reply, answer) = oneshot::channel();
    let mut pending = Pending {
        shard,
        payload,
        now,
        reply,
    };
    let mut retried = false;
    let queue = loop {
        let queue = pool.heartbeats.queue(pool, addr);
        match queue.tx.try_send(pending) {
            Ok(()) => break queue,
            Err(mpsc::error::TrySendError::Closed(p)) if !retried => {
                pending = p;
                retried = true;
            }
            Err(e) => return Err(unreachable(format!("heartbeat queue to {addr}: {e}"))),
        }
    };
    if now {
        queue.flush.notify_one();
    }
    answer
        .await
        .map_err(|_| unreachable(format!("heartbeat batch to {addr} was dropped")))?
}

fn network(e: impl std::fmt::Display) -> RPCError {
    RPCError::Network(NetworkError::new(&Msg(e.to_string())))
}

fn unreachable(e: String) -> RPCError {
    RPCError::Unreachable(Unreachable::new(&Msg(e)))
}

/// Until when a peer gets its heartbeats one `Append` call each (see the module docs, "Peers
/// that do not know `Heartbeats`"); `None`: batched.
#[derive(Default)]
struct Legacy(Mutex<Option<Instant>>);

impl Legacy {
    fn active(&self) -> bool {
        let until = self.0.lock().unwrap_or_else(|p| p.into_inner());
        until.is_some_and(|until| Instant::now() < until)
    }

    /// Marks the peer legacy for [`LEGACY_RECHECK`]; true if it was not already (the first
    /// time, or a recheck that found it unchanged): worth a warning.
    fn mark(&self) -> bool {
        let mut until = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let fresh = !until.is_some_and(|until| Instant::now() < until);
        *until = Some(Instant::now() + LEGACY_RECHECK);
        fresh
    }
}

/// The sender task of one peer: waits for a heartbeat, lets others join for `linger` (cut
/// short by an urgent one), sends everything queued (up to a batch) as one call. Ends when
/// the pool is gone, or after the batcher's idle time with nothing queued (sending what
/// raced in before its queue closed).
async fn run_peer(
    pool: Weak<PeerPool>,
    addr: String,
    mut rx: mpsc::Receiver<Pending>,
    flush: Arc<Notify>,
) {
    let in_flight = Arc::new(Semaphore::new(MAX_BATCHES_IN_FLIGHT));
    let legacy = Arc::new(Legacy::default());
    let mut closed = false;
    loop {
        let Some((idle, linger)) = pool
            .upgrade()
            .map(|p| (p.heartbeats.idle(), p.heartbeat_linger))
        else {
            return;
        };
        let first = if closed {
            rx.recv().await
        } else {
            match tokio::time::timeout(idle, rx.recv()).await {
                Ok(first) => first,
                Err(_) => {
                    let Some(pool) = pool.upgrade() else { return };
                    pool.heartbeats.retire(&addr, &flush, &mut rx);
                    closed = true;
                    continue;
                }
            }
        };
        let Some(first) = first else { return };
        if !first.now && !linger.is_zero() {
            tokio::select! {
                _ = tokio::time::sleep(linger) => {}
                _ = flush.notified() => {}
            }
        }
        let Ok(permit) = in_flight.clone().acquire_owned().await else {
            return;
        };
        let mut batch = vec![first];
        while batch.len() < MAX_HEARTBEAT_BATCH {
            match rx.try_recv() {
                Ok(p) => batch.push(p),
                Err(_) => break,
            }
        }
        let Some(pool) = pool.upgrade() else { return };
        let (addr, legacy) = (addr.clone(), legacy.clone());
        tokio::spawn(async move {
            send_batch(&pool, &addr, &legacy, batch).await;
            drop(permit);
        });
    }
}

/// One call carrying `batch` (or, to a legacy peer, one `Append` call per heartbeat); every
/// heartbeat of it gets its item or its call's error.
async fn send_batch(pool: &PeerPool, addr: &str, legacy: &Legacy, batch: Vec<Pending>) {
    let mut items = Vec::with_capacity(batch.len());
    let mut replies = Vec::with_capacity(batch.len());
    // A heartbeat whose worker gave up waiting (openraft's timeout) is not sent.
    for p in batch.into_iter().filter(|p| !p.reply.is_closed()) {
        items.push(HeartbeatItem {
            shard_id: p.shard,
            payload: p.payload.into(),
        });
        replies.push(p.reply);
    }
    let sent = items.len();
    if sent == 0 {
        return;
    }
    if legacy.active() {
        return one_by_one(pool, addr, items, replies).await;
    }
    let answers: Vec<ItemResult> = match call(pool, addr, items.clone()).await {
        Ok(answers) if answers.len() == sent => answers.into_iter().map(Ok).collect(),
        Ok(answers) => {
            let why = format!(
                "heartbeat batch to {addr}: {} answers for {sent} heartbeats",
                answers.len()
            );
            (0..sent).map(|_| Err(network(&why))).collect()
        }
        Err(CallFailure::Unimplemented(why)) => {
            if legacy.mark() {
                tracing::warn!(
                    peer = addr,
                    error = why,
                    "peer does not know coalesced heartbeats (an older version?): \
                     sending them one Append call each for {LEGACY_RECHECK:?}"
                );
            }
            return one_by_one(pool, addr, items, replies).await;
        }
        Err(CallFailure::Unreachable(m)) => {
            (0..sent).map(|_| Err(unreachable(m.clone()))).collect()
        }
        Err(CallFailure::Network(m)) => (0..sent).map(|_| Err(network(&m))).collect(),
    };
    for (reply, answer) in replies.into_iter().zip(answers) {
        let _ = reply.send(answer);
    }
}

enum CallFailure {
    /// The peer does not know the call (a node from before it).
    Unimplemented(String),
    Unreachable(String),
    Network(String),
}

impl From<tonic::Status> for CallFailure {
    fn from(s: tonic::Status) -> CallFailure {
        match s.code() {
            tonic::Code::Unimplemented => CallFailure::Unimplemented(s.message().to_string()),
            tonic::Code::Unavailable | tonic::Code::Unknown => {
                CallFailure::Unreachable(s.message().to_string())
            }
            _ => CallFailure::Network(s.message().to_string()),
        }
    }
}

async fn call(
    pool: &PeerPool,
    addr: &str,
    items: Vec<HeartbeatItem>,
) -> Result<Vec<bytes::Bytes>, CallFailure> {
    let mut client = pool.client(addr).map_err(CallFailure::Unreachable)?;
    let mut request = tonic::Request::new(HeartbeatBatch {
        hlc: pool.clock.now().0,
        from_node: pool.self_id,
        items,
    });
    request.set_timeout(pool.rpc_timeout);
    let reply = client.heartbeats(request).await?.into_inner();
    pool.merge_reply_clock(reply.hlc)
        .map_err(CallFailure::Network)?;
    Ok(reply.items)
}

/// Each heartbeat of `items` as its own unary `Append` call (what a peer from before
/// `Heartbeats` answers), at most [`LEGACY_CALLS_IN_FLIGHT`] at a time; each heartbeat's
/// answer goes to its `replies` entry as soon as its own call ends (a peer's shard stalled on
/// its log holds up only its own), and one whose worker gave up meanwhile is not sent.
async fn one_by_one(
    pool: &PeerPool,
    addr: &str,
    items: Vec<HeartbeatItem>,
    replies: Vec<oneshot::Sender<ItemResult>>,
) {
    use futures::StreamExt;
    let calls = items
        .into_iter()
        .zip(replies)
        .map(|(item, reply)| async move {
            if reply.is_closed() {
                return;
            }
            let _ = reply.send(append(pool, addr, item).await);
        });
    futures::stream::iter(calls)
        .buffer_unordered(LEGACY_CALLS_IN_FLIGHT)
        .for_each(|()| async {})
        .await;
}

/// One heartbeat as a unary `Append` call; its answer as a batch item would carry it.
async fn append(pool: &PeerPool, addr: &str, item: HeartbeatItem) -> ItemResult {
    let hlc = pool.clock.now().0;
    let reply = pool
        .node_rpc(addr, "append", item.shard_id, hlc, item.payload)
        .await
        .map_err(crate::network::status_to_rpc_error)?;
    pool.merge_reply_clock(reply.hlc).map_err(network)?;
    Ok(reply.payload)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn item_budget_is_half_the_interval() {
        assert_eq!(
            item_budget(Duration::from_millis(400)),
            Duration::from_millis(200)
        );
    }

    #[test]
    fn linger_is_a_tenth_of_the_interval_at_most_ten_ms() {
        assert_eq!(
            linger_for(Duration::from_millis(50)),
            Duration::from_millis(5)
        );
        assert_eq!(
            linger_for(Duration::from_millis(100)),
            Duration::from_millis(10)
        );
        assert_eq!(
            linger_for(Duration::from_millis(400)),
            Duration::from_millis(10)
        );
        assert_eq!(linger_for(Duration::ZERO), Duration::ZERO);
    }
}

#[cfg(test)]
#[path = "heartbeat_batch_tests.rs"]
mod peer_tests;
