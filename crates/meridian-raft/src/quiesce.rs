//! Quiescence: an idle shard costs nothing.
//!
//! A Raft group that nobody writes to still ticks: its leader sends a heartbeat to every
//! follower each `heartbeat_interval`, and every follower runs an election timer. With
//! thousands of shards per node that is thousands of messages and timer wake-ups per second
//! for no work at all (measured: an idle 3-node cluster with 1,024 shards used both cores).
//! Like CockroachDB's quiesced ranges and TiKV's hibernate regions, a group that is idle and
//! fully replicated here stops ticking, and node-level liveness takes over the one job the
//! heartbeats did: noticing that the leader is gone.
//!
//! ```text
//!  leader, idle ≥ election_timeout_max, every voter matched = committed = last log
//!    1. heartbeats off; wait 2 × heartbeat_interval (heartbeats in flight land)
//!    2. Quiesce{vote, last_log_id} → each follower: parks (ticker off) iff it still follows
//!       this leader in this vote with exactly this log, all committed
//!    3. all parked → the leader parks (ticker off); otherwise heartbeats back on
//!
//!  wake: a request for the shard on the leader (`ShardReplica::touch`) → ticker + heartbeats
//!        on, one heartbeat at once; a follower wakes on any message from its leader; woken by
//!        anyone else (a candidate's vote request) it first asks its leader to `Wake` and keeps
//!        its election timer off until the leader is heard (or `election_timeout_max` passes)
//!  flapping: a leader woken within 2× its idle threshold of parking doubles the threshold
//!        (up to 8× `election_timeout_max`); one that stayed parked longer goes back to the
//!        base, so a cold but touched shard stops paying a quiesce round and a wake per request
//!  dead leader: every node pings every other node once per heartbeat_interval (one message
//!        per node pair, not per shard); a parked follower whose leader's node has not been
//!        heard from for `election_timeout_max` wakes with its lease long expired and elects.
//!        A node whose ping a peer refuses as from a forgotten member (`meridian cluster
//!        forget`) stops itself (`host::exit_forgotten`, exit status 79). Each answer's round
//!        trip goes to `rtt_watch` (a warning when heartbeats cannot be answered in time).
//! ```
//!
//! The tickers of awake followers that hear their leader are stopped too, by `rest`, which
//! leaves a parked or waking replica's ticker to quiescence.
//!
//! # Safety
//! Quiescence only switches openraft's timers (`runtime_config().tick`, `.heartbeat`); every
//! message is still processed, so Raft's safety does not depend on it. A parked leader's last
//! quorum acknowledgement ages, so it serves no openraft lease read until a new heartbeat
//! round (the wake) renews it. It may instead serve plain reads on a parked lease, built from
//! the node-level pings (`parked_lease`), which its parked followers' promises back: they
//! refuse other candidates until it releases them or its node falls silent
//! (`parked_promise`).
//!
//! # Invariants
//! - A leader parks only after every voter said it parked at the leader's last log id.
//! - A follower parks only while it follows that leader, in that (committed) vote, with the
//!   leader's last log id committed locally.
//! - Any request or peer message for a parked shard wakes it; a parked follower never waits
//!   more than `election_timeout_max` after its leader's node falls silent.
//! - One ping per peer node per heartbeat interval, at most one in flight per peer.
//!
//! # Not done yet
//! - A node that restarts does not know its peers' groups are parked: its election timers run
//!   (it campaigns only after its restart quarantine, see `parked_promise`), and it may win
//!   elections of idle shards (safe, but it moves leaders).
//! - Learners (zone survival's replicas outside the home region) are not parked with their
//!   group: only voters count for quiescing, and a learner's timers keep running (it never
//!   campaigns).
//! - Pings carry liveness and the peer's physical clock, no HLC (`clock_fence` acts on the
//!   offsets); CockroachDB also piggybacks the awake groups' heartbeats on them.

use crate::host::{InFlight, MultiRaft, ShardReplica};
use crate::network::PingFailure;
use crate::types::{LogId, NodeId, RaftMetrics, Vote};
use meridian_proto::raft::RaftRequest;
use openraft::type_config::async_runtime::WatchReceiver;
use openraft::ServerState;
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering::SeqCst};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// The leader's request to a follower: park if you are exactly where I am.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct QuiesceRequest {
    pub vote: Vote,
    pub last_log_id: Option<LogId>,
}

const AWAKE: u8 = 0;
const PARKED: u8 = 1;
/// A follower woken by a non-leader: ticker still off until its leader is heard.
const WAKING: u8 = 2;

/// Milliseconds since this process's first call (the clock of `quiesce` and `rest`).
pub(crate) fn now_ms() -> u64 {
    static ORIGIN: OnceLock<Instant> = OnceLock::new();
    ORIGIN.get_or_init(Instant::now).elapsed().as_millis() as u64
}

/// A replica's quiescence state (lock-free: touched on every request).
#[derive(Default)]
pub struct Quiet {
    /// This node's id (the replica's own Raft id), fixed at open.
    pub(crate) me: NodeId,
    /// Shared with a woken follower's delayed ticker restart, which must not fire if the
    /// replica parked again meanwhile.
    state: Arc<AtomicU8>,
    /// The leader when parked (this node, for a parked leader).
    leader: AtomicU64,
    last_activity_ms: AtomicU64,
    waking_since_ms: AtomicU64,
    /// A quiesce round is running for this (leader) replica.
    attempting: AtomicBool,
    /// Leader: when it last parked, and the idle time it now needs before parking again
    /// (0 = the base, `election_timeout_max`; see [`next_idle_threshold`]).
    parked_at_ms: AtomicU64,
    idle_threshold_ms: AtomicU64,
    /// Leader: each follower's token when it confirmed the last parking (see `parked_lease`;
    /// recorded, not acted on yet).
    parked_tokens: std::sync::Mutex<Vec<(NodeId, crate::parked_lease::Token)>>,
    /// Leader: when it had every confirmation of the last parking (`now_ms`).
    parked_confirmed_ms: AtomicU64,
    /// Follower: its promise to the leader it parked under (see `parked_promise`), shared
    /// with its Raft network's campaign gate.
    pub promise: Arc<crate::parked_promise::PromiseSlot>,
    /// Follower: a `Wake` asking that leader to release the promise is in flight.
    pub(crate) releasing: AtomicBool,
}

impl Quiet {
    /// The state of a new (awake) replica on node `me`.
    pub fn new(me: NodeId) -> Quiet {
        Quiet {
            me,
            ..Quiet::default()
        }
    }
}

/// Longest idle time a shard may be made to wait for before it quiesces, in multiples of the
/// base threshold.
pub const MAX_IDLE_THRESHOLD_FACTOR: u64 = 8;

/// A wake that comes less than this many thresholds after the parking counts as flapping.
pub const FLAP_FACTOR: u64 = 2;

/// The idle time a leader needs before it quiesces again, after a wake that came `parked_for_ms`
/// after it parked. A shard woken soon after parking (within [`FLAP_FACTOR`]× its threshold)
/// doubles its threshold, up to [`MAX_IDLE_THRESHOLD_FACTOR`]× the base; one that stayed parked
/// longer goes back to the base. So a shard touched about as often as its threshold stops
/// paying a quiesce round and a wake (the woken leader's first write waits for a quorum round)
/// for each request, while a shard idle for a few thresholds at a time still quiesces, and one
/// whose writes stop (reads served on the parked lease do not wake it) parks again within
/// 8 × `base`.
///
/// Why these factors: a parking costs a few messages per follower (a `Quiesce` and its answer;
/// at the wake, a `Wake` and its answer), and the first write after it one extra round trip,
/// while an awake leader sends each follower a heartbeat every `heartbeat_interval`, several
/// per `base` (loopback timings: 12). A shard that stays parked for 2 × its threshold has saved
/// more messages than its parking cost. The cap was 64 before reads were served on parked
/// leases: a shard then woken by reads stayed awake for up to 64 × `base` after a write load
/// ended, and a read-only load that followed paid its heartbeats (YCSB C after A at 256
/// shards, `bench/results/2026-12-07/parked-reads/`).
pub fn next_idle_threshold(current_ms: u64, base_ms: u64, parked_for_ms: u64) -> u64 {
    let current = current_ms.max(base_ms);
    if parked_for_ms < current.saturating_mul(FLAP_FACTOR) {
        current
            .saturating_mul(2)
            .min(base_ms.saturating_mul(MAX_IDLE_THRESHOLD_FACTOR))
    } else {
        base_ms
    }
}

/// The part of a replica's Raft metrics quiescence decides on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupView {
    pub state: ServerState,
    pub leader: Option<NodeId>,
    pub vote: Vote,
    pub last_log_index: Option<u64>,
    pub committed: Option<LogId>,
    pub applied: Option<LogId>,
    /// Single (not joint) voter set, and its change committed.
    pub membership_settled: bool,
    pub voters: Vec<NodeId>,
    /// The leader's view of each replica's matched log id (leader only).
    pub matched: Vec<(NodeId, Option<LogId>)>,
}

/// A single (not joint) voter set, and its change committed.
fn membership_settled(m: &RaftMetrics) -> bool {
    m.membership_config.get_joint_config().len() == 1
        && m.membership_config == m.committed_membership_config
}

impl GroupView {
    pub fn of(m: &RaftMetrics) -> GroupView {
        GroupView {
            state: m.state,
            leader: m.current_leader,
            vote: m.vote,
            last_log_index: m.last_log_index,
            committed: m.local_committed,
            applied: m.last_applied,
            membership_settled: membership_settled(m),
            voters: m.membership_config.voter_ids().collect(),
            matched: m
                .replication
                .as_ref()
                .map(|r| r.iter().map(|(id, l)| (*id, *l)).collect())
                .unwrap_or_default(),
        }
    }

    /// Everything in the log is committed and applied here.
    fn settled_locally(&self) -> bool {
        self.membership_settled
            && self.committed.map(|l| l.index) == self.last_log_index
            && self.applied == self.committed
    }

    /// The leader may start a quiesce round: it leads, and every voter has its whole log.
    pub fn leader_can_quiesce(&self, me: NodeId) -> bool {
        self.state == ServerState::Leader
            && self.leader == Some(me)
            && self.vote.is_committed()
            && self.settled_locally()
            && self.voters.iter().all(|v| {
                *v == me
                    || self
                        .matched
                        .iter()
                        .any(|(id, l)| id == v && *l == self.committed)
            })
    }

    /// A follower may park on `from`'s request.
    pub fn follower_can_park(&self, from: NodeId, req: &QuiesceRequest) -> bool {
        self.state == ServerState::Follower
            && self.leader == Some(from)
            && req.vote.is_committed()
            && self.vote == req.vote
            && self.settled_locally()
            && self.committed == req.last_log_id
    }
}

impl ShardReplica {
    pub fn is_quiesced(&self) -> bool {
        self.quiet.state.load(SeqCst) != AWAKE
    }

    pub(crate) fn view(&self) -> GroupView {
        GroupView::of(&self.raft.metrics().borrow_watched())
    }

    /// A client request for this shard reached this node: note it, and wake the group. Returns
    /// the leader to ask to `Wake` when this replica is a quiesced follower (the caller sends
    /// it): a follower must not simply restart its election timer, whose lease expired long
    /// ago — it would campaign against a live leader.
    pub fn touch(&self) -> Option<NodeId> {
        self.quiet.last_activity_ms.store(now_ms(), SeqCst);
        if self.quiet.attempting.load(SeqCst) {
            // A quiesce round turned heartbeats off; it will see the activity and give up.
            self.raft.runtime_config().heartbeat(true);
        }
        self.on_peer_message(self.quiet.me)
    }

    /// Heartbeats on and the ticker back; a leader also sends one heartbeat round at once.
    ///
    /// A follower's ticker comes back one heartbeat interval later: the message that woke it
    /// (from its leader) renews its lease only once Raft processes it, and a tick before that
    /// would find the lease long expired and start an election against a live leader.
    fn resume(&self, why: &'static str) {
        if self.quiet.state.swap(AWAKE, SeqCst) == AWAKE {
            return;
        }
        self.raft.runtime_config().heartbeat(true);
        tracing::debug!(shard = %self.shard, why, "shard awake");
        if self.raft.is_leader() {
            let base = self.raft.config().election_timeout_max;
            let parked_for = now_ms().saturating_sub(self.quiet.parked_at_ms.load(SeqCst));
            let current = self.quiet.idle_threshold_ms.load(SeqCst);
            self.quiet
                .idle_threshold_ms
                .store(next_idle_threshold(current, base, parked_for), SeqCst);
            self.raft.runtime_config().tick(true);
            let raft = self.raft.clone();
            tokio::spawn(async move {
                let _ = raft.trigger().heartbeat().await;
            });
        } else {
            let raft = self.raft.clone();
            let state = self.quiet.state.clone();
            let delay = Duration::from_millis(raft.config().heartbeat_interval);
            tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                if state.load(SeqCst) == AWAKE {
                    raft.runtime_config().tick(true);
                }
            });
        }
    }

    /// Any peer message for this shard. Returns the leader to ask to `Wake` when a follower
    /// was woken by someone else, or by its leader while it holds a promise (the answer
    /// releases it); the caller sends it.
    pub fn on_peer_message(&self, from: NodeId) -> Option<NodeId> {
        match self.quiet.state.load(SeqCst) {
            AWAKE => None,
            _ => {
                let leader = self.quiet.leader.load(SeqCst);
                if from == leader || leader == self.quiet.me {
                    self.resume("peer message");
                    // A follower woken by its leader has its promise released by a `Wake`.
                    self.quiet.promise.held().map(|(p, _)| p.leader)
                } else if self
                    .quiet
                    .state
                    .compare_exchange(PARKED, WAKING, SeqCst, SeqCst)
                    .is_ok()
                {
                    self.quiet.waking_since_ms.store(now_ms(), SeqCst);
                    Some(leader)
                } else {
                    None
                }
            }
        }
    }

    /// Parks this follower under `leader` (see `park_on_request` in `parked_promise`).
    pub(crate) fn park_under(&self, leader: NodeId) {
        self.quiet.leader.store(leader, SeqCst);
        self.quiet.state.store(PARKED, SeqCst);
        self.forget_rest();
        self.raft.runtime_config().tick(false);
    }

    /// Whether this replica is a parked leader whose parked lease holds now (see
    /// `parked_lease`): a majority of its voters, itself counted, confirmed its last parking
    /// and answered a ping sent within the lease window with the same token. Reads use it
    /// through `MultiRaft::serves_parked_read`.
    pub fn parked_lease_holds(&self, ledger: &crate::parked_lease::PingLedger) -> bool {
        use crate::parked_lease::{lease_holds, VoterLease};
        let me = self.quiet.me;
        if self.quiet.state.load(SeqCst) != PARKED || self.quiet.leader.load(SeqCst) != me {
            return false;
        }
        // Read in place: this runs on every read of a parked shard (a `GroupView` would clone
        // the membership and the replication map each time).
        let metrics = self.raft.metrics();
        let m = metrics.borrow_watched();
        if !membership_settled(&m) || m.state != ServerState::Leader || m.current_leader != Some(me)
        {
            return false;
        }
        let tokens = self
            .quiet
            .parked_tokens
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let confirmed_ms = self.quiet.parked_confirmed_ms.load(SeqCst);
        let voters: Vec<VoterLease> = m
            .membership_config
            .voter_ids()
            .map(|voter| VoterLease {
                voter,
                parked: tokens.iter().find(|(id, _)| *id == voter).map(|(_, t)| *t),
                confirmed_ms,
                answer: ledger.answer(voter),
            })
            .collect();
        drop((tokens, m));
        let etmax = self.raft.config().election_timeout_max;
        let holds = lease_holds(me, &voters, now_ms(), etmax);
        // Still parked after the evaluation: a vote request that woke the replica meanwhile
        // (it stores AWAKE before openraft sees the request) ends the lease.
        holds && self.quiet.state.load(SeqCst) == PARKED
    }

    /// The peer address of `node` in this group's membership, if it is a member.
    pub(crate) fn member_addr(&self, node: NodeId) -> Option<String> {
        self.raft
            .metrics()
            .borrow_watched()
            .membership_config
            .nodes()
            .find(|(id, _)| **id == node)
            .map(|(_, n)| n.addr.clone())
    }

    /// The leader side of `Wake`: resume if parked (followers learn it from the heartbeat).
    /// Returns only once this replica is not parked: the answer releases a follower's promise
    /// (see `parked_promise`).
    ///
    /// A `Wake` counts as activity, and a quiesce round in progress is waited out (it gives
    /// up on the activity, or parks and at once resumes on it): otherwise the answer could be
    /// sent between the round's last check and its parking, and release a promise the new
    /// parking still counts. Returns false if a round is still running after 2 s (then no
    /// answer is given).
    pub async fn wake_requested(&self) -> bool {
        self.quiet.last_activity_ms.store(now_ms(), SeqCst);
        for _ in 0..400 {
            if !self.quiet.attempting.load(SeqCst) {
                if self.is_quiesced() {
                    self.resume("wake request");
                }
                return true;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        false
    }
}

impl MultiRaft {
    /// Starts the node's quiescence loop: pings to its peers (`set_peers`, read each round),
    /// quiesce rounds for idle shards this node leads (unless `enabled` is false: then only the
    /// pings, which also feed liveness in the cluster status), and the dead-leader watchdog for
    /// parked followers; with `rest_followers`, also the resting loop (see `rest`) when the
    /// Raft timings leave it room. Also starts the clock fence over what the pings measure.
    pub fn spawn_quiescence(self: &Arc<Self>, enabled: bool, rest_followers: bool) {
        self.quiescing.store(enabled, SeqCst);
        crate::clock_fence::spawn_for(self);
        let host = self.clone();
        let in_flight = Arc::new(InFlight::default());
        let rest_after = self.rest_after(rest_followers);
        tokio::spawn(async move {
            let period = Duration::from_millis(crate::rest::loop_period_ms(
                host.raft_config.heartbeat_interval,
            ));
            let mut interval = tokio::time::interval(period);
            interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                interval.tick().await;
                host.ping_peers(&in_flight);
                if enabled {
                    host.quiescence_round();
                }
                if let Some(rest_after) = rest_after {
                    host.rest_round(rest_after);
                }
            }
        });
    }

    fn ping_peers(self: &Arc<Self>, in_flight: &Arc<InFlight>) {
        let map_version = self.map_gossip.version();
        for (peer, addr) in self.peers() {
            if !in_flight.start(peer) {
                continue;
            }
            let (host, flags, me) = (self.clone(), in_flight.clone(), self.node_id);
            tokio::spawn(async move {
                let pool = &host.pool;
                match pool.ping(&addr, map_version).await {
                    Ok(answer) => {
                        host.rtt_watch.note(peer, &answer.offset);
                        pool.note_ping(peer, answer.offset);
                        pool.note_client_addr(peer, answer.client_addr);
                        if let Some(token) = answer.token {
                            host.ping_ledger.note_answer(peer, answer.sent_ms, token);
                        }
                    }
                    Err(PingFailure::Forgotten(said)) => {
                        crate::host::exit_forgotten(me, peer, &said)
                    }
                    Err(PingFailure::Failed(_)) => {}
                }
                flags.done(peer);
            });
        }
    }

    fn quiescence_round(self: &Arc<Self>) {
        let base_ms = self.raft_config.election_timeout_max;
        let now = now_ms();
        for replica in self.replicas() {
            match replica.quiet.state.load(SeqCst) {
                PARKED => {
                    let leader = replica.quiet.leader.load(SeqCst);
                    if leader != self.node_id
                        && !self
                            .pool
                            .seen_within(leader, Duration::from_millis(base_ms))
                    {
                        tracing::info!(shard = %replica.shard, leader, "waking a quiesced shard: its leader's node is silent");
                        replica.resume("leader node silent");
                    }
                }
                WAKING => {
                    let since = replica.quiet.waking_since_ms.load(SeqCst);
                    if now.saturating_sub(since) >= base_ms {
                        replica.resume("leader did not answer a wake");
                    }
                    self.release_promise(&replica);
                }
                _ => {
                    self.release_promise(&replica);
                    let last = replica.quiet.last_activity_ms.load(SeqCst);
                    let needed = replica.quiet.idle_threshold_ms.load(SeqCst).max(base_ms);
                    if now.saturating_sub(last) >= needed
                        && !replica.quiet.attempting.load(SeqCst)
                        // is_leader first: a view allocates, and most replicas are followers.
                        && replica.raft.is_leader()
                        && replica.view().leader_can_quiesce(self.node_id)
                    {
                        replica.quiet.attempting.store(true, SeqCst);
                        let host = self.clone();
                        tokio::spawn(async move {
                            host.quiesce(&replica, last).await;
                            replica.quiet.attempting.store(false, SeqCst);
                        });
                    }
                }
            }
        }
    }

    /// After a quiesce round a follower refused: the next one waits for the doubled idle
    /// threshold (see [`next_idle_threshold`]), counted from now.
    fn back_off(&self, replica: &ShardReplica) {
        let base = self.raft_config.election_timeout_max;
        let current = replica.quiet.idle_threshold_ms.load(SeqCst);
        replica
            .quiet
            .idle_threshold_ms
            .store(next_idle_threshold(current, base, 0), SeqCst);
        replica.quiet.last_activity_ms.fetch_max(now_ms(), SeqCst);
    }

    /// One quiesce round for a shard this node leads (see the module docs).
    async fn quiesce(&self, replica: &ShardReplica, activity: u64) {
        let runtime = replica.raft.runtime_config();
        runtime.heartbeat(false);
        tokio::time::sleep(Duration::from_millis(
            2 * self.raft_config.heartbeat_interval,
        ))
        .await;
        let unchanged = || replica.quiet.last_activity_ms.load(SeqCst) == activity;
        let view = replica.view();
        if !unchanged() || !view.leader_can_quiesce(self.node_id) {
            runtime.heartbeat(true);
            return;
        }
        let request = QuiesceRequest {
            vote: view.vote,
            last_log_id: view.committed,
        };
        let followers: Vec<NodeId> = view
            .voters
            .iter()
            .copied()
            .filter(|v| *v != self.node_id)
            .collect();
        let asks = followers.iter().map(|f| {
            let addr = replica
                .raft
                .metrics()
                .borrow_watched()
                .membership_config
                .nodes()
                .find(|(id, _)| *id == f)
                .map(|(_, n)| n.addr.clone());
            let pool = self.pool.clone();
            let request = request.clone();
            let shard = replica.shard;
            async move {
                let answer = match addr {
                    Some(addr) => pool.quiesce(&addr, shard, &request).await.ok(),
                    None => None,
                };
                (*f, answer.unwrap_or((false, None)))
            }
        });
        let answers = futures::future::join_all(asks).await;
        let all_parked = answers.iter().all(|(_, (parked, _))| *parked);
        if !all_parked || !unchanged() {
            if unchanged() {
                // A follower refused with nothing new here: behind, or on a node that does not
                // quiesce (`--quiesce false`), which refuses every time. Back off as a
                // flapping shard does, so such a shard pays a failed round at most once per
                // 8 × the base, not once per base.
                self.back_off(replica);
            }
            runtime.heartbeat(true);
            return;
        }
        // Every follower parked before it answered: pings sent from now on reach them parked.
        replica.quiet.parked_confirmed_ms.store(now_ms(), SeqCst);
        *replica
            .quiet
            .parked_tokens
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = answers
            .into_iter()
            .filter_map(|(f, (_, token))| Some((f, token?)))
            .collect();
        replica.quiet.leader.store(self.node_id, SeqCst);
        replica.quiet.parked_at_ms.store(now_ms(), SeqCst);
        replica.quiet.state.store(PARKED, SeqCst);
        replica.forget_rest();
        runtime.tick(false);
        // A request that arrived between the check and the park saw AWAKE and did not wake.
        if !unchanged() {
            replica.resume("request during park");
        } else {
            tracing::debug!(shard = %replica.shard, "shard quiesced");
        }
    }

    /// Replicas of this node by quiescence: (awake, quiesced).
    pub fn quiescence_counts(&self) -> (usize, usize) {
        let replicas = self.replicas();
        let quiet = replicas.iter().filter(|r| r.is_quiesced()).count();
        (replicas.len() - quiet, quiet)
    }

    /// Sends `Wake` for `shard` to `leader` (a follower woken by a non-leader, or holding a
    /// promise to `leader` it wants released).
    pub fn send_wake(self: &Arc<Self>, shard: meridian_types::ShardId, leader: NodeId) {
        if let Some(replica) = self.get(shard) {
            self.wake_leader(&replica, leader);
        }
    }
}

/// Builds the envelope for a quiescence RPC.
pub(crate) fn envelope(
    shard: u64,
    hlc: u64,
    from_node: NodeId,
    payload: impl Into<bytes::Bytes>,
) -> RaftRequest {
    RaftRequest {
        shard_id: shard,
        hlc,
        from_node,
        payload: payload.into(),
    }
}

#[cfg(test)]
#[path = "quiesce_tests.rs"]
mod tests;
