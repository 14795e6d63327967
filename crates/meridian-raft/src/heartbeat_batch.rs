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
//! # Not done yet
//! - A peer's queue and sender task stay for the node's lifetime, even after the peer left
//!   the cluster (as its HTTP/2 channel does in `PeerPool`).
//! - Replication streams (appends with entries) are still one HTTP/2 stream per group and
//!   follower; only heartbeats are coalesced.
//! - A peer that does not know the `Heartbeats` call (a node from before it) answers
//!   UNIMPLEMENTED and its groups' leaders here lose their leases: mixed versions are not
//!   supported.

use crate::network::{Msg, PeerPool};
use crate::types::{AppendEntriesRequest, AppendEntriesResponse, RPCError, StreamAppendResult};
use meridian_proto::raft::{HeartbeatBatch, HeartbeatItem};
use openraft::errors::{NetworkError, Unreachable};
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot, Notify, Semaphore};

/// Most heartbeats in one call.
pub const MAX_HEARTBEAT_BATCH: usize = 4_096;
/// Most heartbeats queued for one peer.
pub const HEARTBEAT_QUEUE: usize = 16 * 1024;
/// Most calls in flight to one peer.
pub const MAX_BATCHES_IN_FLIGHT: usize = 4;

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
#[derive(Default)]
pub struct HeartbeatBatcher {
    queues: Mutex<HashMap<String, PeerQueue>>,
}

impl HeartbeatBatcher {
    /// Ends every peer's linger now (or the next one, if none is lingering).
    fn flush_all(&self) {
        let queues = self.queues.lock().unwrap_or_else(|p| p.into_inner());
        for queue in queues.values() {
            queue.flush.notify_one();
        }
    }

    /// The queue to the peer at `addr`, starting its sender task on first use.
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
    let (reply, answer) = oneshot::channel();
    let queue = pool.heartbeats.queue(pool, addr);
    queue
        .tx
        .try_send(Pending {
            shard,
            payload,
            now,
            reply,
        })
        .map_err(|e| unreachable(format!("heartbeat queue to {addr}: {e}")))?;
    if now {
        queue.flush.notify_one();
    }
    let item = answer
        .await
        .map_err(|_| unreachable(format!("heartbeat batch to {addr} was dropped")))??;
    let response: Result<AppendEntriesResponse, String> =
        crate::types::codec::decode(&item).map_err(network)?;
    let response = response.map_err(|e| {
        RPCError::Network(NetworkError::new(&Msg(format!("remote raft error: {e}"))))
    })?;
    Ok(response.into_stream_result(prev, last))
}

fn network(e: impl std::fmt::Display) -> RPCError {
    RPCError::Network(NetworkError::new(&Msg(e.to_string())))
}

fn unreachable(e: String) -> RPCError {
    RPCError::Unreachable(Unreachable::new(&Msg(e)))
}

/// The sender task of one peer: waits for a heartbeat, lets others join for `linger` (cut
/// short by an urgent one), sends everything queued (up to a batch) as one call. Ends when
/// the pool is gone.
async fn run_peer(
    pool: Weak<PeerPool>,
    addr: String,
    mut rx: mpsc::Receiver<Pending>,
    flush: Arc<Notify>,
) {
    let in_flight = Arc::new(Semaphore::new(MAX_BATCHES_IN_FLIGHT));
    while let Some(first) = rx.recv().await {
        let Some(linger) = pool.upgrade().map(|p| p.heartbeat_linger) else {
            return;
        };
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
        let addr = addr.clone();
        tokio::spawn(async move {
            send_batch(&pool, &addr, batch).await;
            drop(permit);
        });
    }
}

/// One call carrying `batch`; every heartbeat of it gets its item or the call's error.
async fn send_batch(pool: &PeerPool, addr: &str, batch: Vec<Pending>) {
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
    let answered = call(pool, addr, items).await;
    match answered {
        Ok(answers) if answers.len() == sent => {
            for (reply, item) in replies.into_iter().zip(answers) {
                let _ = reply.send(Ok(item));
            }
        }
        Ok(answers) => {
            let why = format!(
                "heartbeat batch to {addr}: {} answers for {sent} heartbeats",
                answers.len()
            );
            for reply in replies {
                let _ = reply.send(Err(network(&why)));
            }
        }
        Err(why) => {
            for reply in replies {
                let _ = reply.send(Err(match &why {
                    CallFailure::Unreachable(m) => unreachable(m.clone()),
                    CallFailure::Network(m) => network(m),
                }));
            }
        }
    }
}

enum CallFailure {
    Unreachable(String),
    Network(String),
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
    let reply = client
        .heartbeats(request)
        .await
        .map_err(|s| match s.code() {
            tonic::Code::Unavailable | tonic::Code::Unknown => {
                CallFailure::Unreachable(s.message().to_string())
            }
            _ => CallFailure::Network(s.message().to_string()),
        })?;
    let reply = reply.into_inner();
    pool.merge_reply_clock(reply.hlc)
        .map_err(CallFailure::Network)?;
    Ok(reply.items)
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
