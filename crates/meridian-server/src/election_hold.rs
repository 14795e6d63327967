//! Holding a starting node's elections until a quorum of each group would grant votes.
//!
//! # Why
//! Nodes come up one by one, at a cluster's first start as at a restart of the whole cluster.
//! On the first node up, every group's first elections (one per election timeout, and at once
//! for a founding group it initializes) sent votes and pre-votes to peers not listening yet;
//! each failed and openraft logged it as a warning: on a 1,025-group first start about 3,000
//! on node 1 (`bench/results/2026-12-06/boot-resets`). Such elections cannot win.
//!
//! # What
//! - Every replica opened at start (`founding::open_and_bootstrap`) has its election timer
//!   switched off ([`ElectionHold::hold`]: openraft's `runtime_config().elect(false)`, the
//!   switch `election_bias` uses; votes, pre-votes, appends and transfers are untouched).
//! - One task per node ([`release_when_quorate`]) reads each held group's voter configs
//!   through its Raft core (the stored membership, one config or the two of a joint one; none
//!   yet for a founding group, whose voters are then the map's; the map's too if the core does
//!   not answer within an election timeout), and polls the peer pool every [`QUORUM_POLL`]. A
//!   peer would grant votes once this node has seen it answer, without a break, for an
//!   election timeout ([`Readiness`], counted from the first poll that saw it answer): a node
//!   refuses votes for `election_timeout_max` after its start (`meridian-raft`'s
//!   `refuses_votes`), and it started before it first answered. A peer that falls silent (no
//!   answer within an election timeout) starts that count again.
//! - A group is released once a majority of each of its voter configs (this node counted)
//!   would grant votes, as an election needs ([`quorum_in_each`]): its timer is switched back
//!   on after a delay spread over the election timeout's range by a hash of the node and the
//!   shard ([`release_spread`]), so a node's groups do not all campaign in the same tick (a
//!   held group's timer has run out) and the members of one group rarely campaign at the same
//!   moment. Then what the caller asked to run after the release runs (a founding group's
//!   `initialize`). A group whose replica was retired or opened again meanwhile is released at
//!   once and nothing runs after it.
//! - After [`QUORUM_WAIT_MAX`] the groups still held are released all the same, with one
//!   warning for all of them: a quorum that answers Raft messages but not pings is not
//!   expected (they share the peer connections), but a group must never be kept from electing
//!   by this wait. "Answered" is the peer pool's liveness, which any Raft message from the
//!   peer also sets: a peer whose clock the clock fence refuses can count, and our votes to it
//!   fail, as without the wait.
//!
//! # Invariants
//! - The hold only delays elections a node starts on its own timer; it never changes a
//!   membership, a vote or a log.
//! - A held replica is released exactly once, by dropping its [`Held`] guard: a task that
//!   ends early (a panic, the runtime's end) releases what it held.
//! - `election_bias` leaves a held replica alone, and the hold and the bias switch a replica
//!   under the hold's lock, so a release never overrides the bias's decision: a released
//!   replica may elect until the bias's next round decides again, as at any start.
//!
//! # Not done yet
//! - Replicas opened later (a move, a split) are not held: their peers are up.
//! - A voter this node has no address for never answers: it counts as silent.
//! - A peer that restarts faster than an election timeout keeps its count, though it refuses
//!   votes for `election_timeout_max` after its new start: its groups may be released early
//!   and send votes it refuses (pings carry no instance id to tell).
//! - `Node::shutdown` does not end the task: it keeps the host alive until its groups are
//!   released (at most `QUORUM_WAIT_MAX`), and a late founding `initialize` then fails and
//!   logs it.

use meridian_raft::{MultiRaft, ShardReplica};
use meridian_types::{NodeId, ShardId};
use std::collections::{BTreeSet, HashMap, HashSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How often the held groups check whether their quorums would grant votes.
pub const QUORUM_POLL: Duration = Duration::from_millis(50);
/// The longest a group's elections are held for its quorum (then they are released anyway).
pub const QUORUM_WAIT_MAX: Duration = Duration::from_secs(30);
/// How many shards the warning about groups released without a quorum names.
const WARN_SHARDS: usize = 8;

/// Whether a majority of `members` answers: `me`, and the peers `answered` says answered.
pub fn quorum_answers(
    me: NodeId,
    members: impl IntoIterator<Item = NodeId>,
    answered: impl Fn(NodeId) -> bool,
) -> bool {
    let (mut total, mut up) = (0usize, 0usize);
    for id in members {
        total += 1;
        if id == me || answered(id) {
            up += 1;
        }
    }
    up * 2 > total
}

/// Whether a majority of each of `configs` answers (an election's quorum in a joint
/// membership is one in each config); false for no config at all.
pub fn quorum_in_each(
    me: NodeId,
    configs: &[Vec<NodeId>],
    answered: impl Fn(NodeId) -> bool,
) -> bool {
    !configs.is_empty()
        && configs
            .iter()
            .all(|config| quorum_answers(me, config.iter().copied(), &answered))
}

/// When each peer began answering without a break, to tell the peers that would grant votes:
/// those that answered within `window` and began `window` ago or more.
pub struct Readiness {
    window: Duration,
    answering_since: HashMap<NodeId, Instant>,
}

impl Readiness {
    pub fn new(window: Duration) -> Self {
        Self {
            window,
            answering_since: HashMap::new(),
        }
    }

    /// Looks at `peers` at `now` (`answered` says which answered within the window) and
    /// returns those that would grant votes. A peer not answering starts over.
    pub fn update(
        &mut self,
        now: Instant,
        peers: impl IntoIterator<Item = NodeId>,
        answered: impl Fn(NodeId) -> bool,
    ) -> HashSet<NodeId> {
        let mut ready = HashSet::new();
        for id in peers {
            if !answered(id) {
                self.answering_since.remove(&id);
                continue;
            }
            let since = *self.answering_since.entry(id).or_insert(now);
            if now.duration_since(since) >= self.window {
                ready.insert(id);
            }
        }
        ready
    }
}

/// A delay in `[0, range)` fixed by `node` and `shard` (splitmix64 of the pair): spreads the
/// releases of a node's groups, and differs between the members of one group.
pub fn release_spread(node: NodeId, shard: ShardId, range: Duration) -> Duration {
    let range_ms = range.as_millis() as u64;
    if range_ms == 0 {
        return Duration::ZERO;
    }
    let mut z = ((node << 32) ^ shard.0).wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    Duration::from_millis(z % range_ms)
}

/// The replicas whose elections wait for their quorum (see the module docs).
#[derive(Default)]
pub struct ElectionHold {
    held: Mutex<HashSet<ShardId>>,
}

/// One held replica; dropping it switches the replica's election timer back on.
pub struct Held {
    hold: Arc<ElectionHold>,
    shard: ShardId,
    replica: Arc<ShardReplica>,
}

impl Drop for Held {
    fn drop(&mut self) {
        let mut held = self.hold.lock();
        if held.remove(&self.shard) {
            self.replica.raft.runtime_config().elect(true);
        }
    }
}

impl ElectionHold {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashSet<ShardId>> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Switches `replica`'s election timer off until the returned guard is dropped.
    pub fn hold(self: &Arc<Self>, shard: ShardId, replica: &Arc<ShardReplica>) -> Held {
        let mut held = self.lock();
        replica.raft.runtime_config().elect(false);
        held.insert(shard);
        Held {
            hold: Arc::clone(self),
            shard,
            replica: Arc::clone(replica),
        }
    }

    /// Runs `f` (which may switch `shard`'s timer) unless `shard` is held; under the hold's
    /// lock, so no release comes in between. Returns whether `f` ran.
    pub(crate) fn unless_held(&self, shard: ShardId, f: impl FnOnce()) -> bool {
        let held = self.lock();
        if held.contains(&shard) {
            return false;
        }
        f();
        true
    }
}

/// What runs once a group is released (a founding group's `initialize`).
pub type AfterRelease = Pin<Box<dyn Future<Output = ()> + Send>>;

/// A held group waiting for its quorum.
pub struct Waiting {
    pub held: Held,
    /// The voters if the replica's core knows none yet (a founding group: the map's).
    pub fallback_voters: Vec<NodeId>,
    pub after: Option<AfterRelease>,
}

/// The group's voter configs as its Raft core knows them (its stored membership: one config,
/// or two while joint), else `fallback` as one config (none if it is empty). The core is
/// given `limit` to answer.
async fn voter_configs(
    replica: &ShardReplica,
    fallback: &[NodeId],
    limit: Duration,
) -> Vec<Vec<NodeId>> {
    let read = replica.raft.with_raft_state(|st| {
        st.membership_state
            .effective()
            .membership()
            .get_joint_config()
            .iter()
            .map(|config| config.iter().copied().collect::<Vec<NodeId>>())
            .filter(|config| !config.is_empty())
            .collect::<Vec<_>>()
    });
    let stored = match tokio::time::timeout(limit, read).await {
        Ok(Ok(configs)) => configs,
        Ok(Err(_)) | Err(_) => Vec::new(),
    };
    match (stored.is_empty(), fallback.is_empty()) {
        (false, _) => stored,
        (true, false) => vec![fallback.to_vec()],
        (true, true) => Vec::new(),
    }
}

/// Whether `group`'s replica is still the one the host serves (not retired or opened again).
fn still_open(host: &MultiRaft, group: &Waiting) -> bool {
    host.get(group.held.shard)
        .is_some_and(|now| Arc::ptr_eq(&now, &group.held.replica))
}

/// Releases `group` after `delay`, then runs what follows its release.
fn release_after(group: Waiting, delay: Duration) {
    tokio::spawn(async move {
        tokio::time::sleep(delay).await;
        drop(group.held);
        if let Some(after) = group.after {
            after.await;
        }
    });
}

/// Releases each of `waiting` once a quorum of its voters would grant votes (see the module
/// docs): `window` is the election timeout the peers refuse votes for after their start,
/// `spread` the range the releases are spread over.
pub async fn release_when_quorate(
    host: Arc<MultiRaft>,
    window: Duration,
    spread: Duration,
    waiting: Vec<Waiting>,
) {
    let me = host.node_id;
    let started = Instant::now();
    let mut pending = Vec::with_capacity(waiting.len());
    // All cores asked at once: each read is bounded by `window`, and so are all of them.
    let reads = waiting.into_iter().map(|group| async move {
        let configs = voter_configs(&group.held.replica, &group.fallback_voters, window).await;
        (configs, group)
    });
    for (configs, group) in futures::future::join_all(reads).await {
        if configs.is_empty() {
            // An empty replica a leader will feed: no election to hold.
            release_after(group, Duration::ZERO);
        } else {
            pending.push((configs, group));
        }
    }
    let peers: BTreeSet<NodeId> = pending
        .iter()
        .flat_map(|(configs, _)| configs.iter().flatten().copied())
        .filter(|id| *id != me)
        .collect();
    let mut readiness = Readiness::new(window);
    while !pending.is_empty() {
        let ready = readiness.update(Instant::now(), peers.iter().copied(), |id| {
            host.pool.seen_within(id, window)
        });
        // Retired or opened again meanwhile: nothing left to hold (dropping the guard
        // switches the old replica's timer, which is harmless; the new one is not held).
        pending.retain(|(_, group)| still_open(&host, group));
        let expired = started.elapsed() >= QUORUM_WAIT_MAX;
        let (go, stay): (Vec<_>, Vec<_>) = pending.into_iter().partition(|(configs, _)| {
            expired || quorum_in_each(me, configs, |id| ready.contains(&id))
        });
        if expired && !go.is_empty() {
            let shards: Vec<ShardId> = go
                .iter()
                .take(WARN_SHARDS)
                .map(|(_, g)| g.held.shard)
                .collect();
            tracing::warn!(
                groups = go.len(),
                ?shards,
                waited_s = QUORUM_WAIT_MAX.as_secs(),
                "no quorum of these groups' members answered pings; their elections go ahead all the same"
            );
        }
        for (_, group) in go {
            let delay = release_spread(me, group.held.shard, spread);
            release_after(group, delay);
        }
        pending = stay;
        if !pending.is_empty() {
            tokio::time::sleep(QUORUM_POLL).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_majority_counts_this_node_and_the_peers_that_answered() {
        let answered = |up: &'static [u64]| move |id: NodeId| up.contains(&id);
        assert!(quorum_answers(1, [1], answered(&[])));
        assert!(!quorum_answers(1, [1, 2, 3], answered(&[])));
        assert!(quorum_answers(1, [1, 2, 3], answered(&[3])));
        assert!(!quorum_answers(1, [1, 2, 3, 4], answered(&[2])));
        // A group this node is not in (no own vote): two of three answer.
        assert!(quorum_answers(9, [1, 2, 3], answered(&[1, 2])));
        assert!(!quorum_answers(1, [], answered(&[])));
    }

    #[test]
    fn a_joint_membership_needs_a_majority_of_each_config() {
        let answered = |up: &'static [u64]| move |id: NodeId| up.contains(&id);
        let joint = [vec![1, 2, 3, 4, 5], vec![1, 4, 5]];
        // 3 of the 5 in the union (1, 2, 3) but 1 of {1, 4, 5}: no election could win.
        assert!(!quorum_in_each(1, &joint, answered(&[2, 3])));
        assert!(quorum_in_each(1, &joint, answered(&[2, 4])));
        assert!(quorum_in_each(1, &[vec![1, 2, 3]], answered(&[2])));
        assert!(!quorum_in_each(1, &[], answered(&[2, 3])));
    }

    #[test]
    fn a_peer_is_ready_a_window_after_it_began_answering_and_starts_over_when_silent() {
        let window = Duration::from_secs(3);
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let mut r = Readiness::new(window);
        let all = |_: NodeId| true;
        let only_3 = |id: NodeId| id == 3;
        assert!(r.update(at(0), [2, 3], all).is_empty());
        assert!(r.update(at(2), [2, 3], all).is_empty());
        assert_eq!(r.update(at(3), [2, 3], all), HashSet::from([2, 3]));
        // Peer 2 falls silent: it is not ready, and counts again from when it answers again.
        assert_eq!(r.update(at(4), [2, 3], only_3), HashSet::from([3]));
        assert_eq!(r.update(at(5), [2, 3], all), HashSet::from([3]));
        assert_eq!(r.update(at(7), [2, 3], all), HashSet::from([3]));
        assert_eq!(r.update(at(8), [2, 3], all), HashSet::from([2, 3]));
    }

    #[test]
    fn release_delays_stay_in_range_and_spread() {
        let range = Duration::from_millis(1_500);
        let delays: Vec<Duration> = (1..=1_000)
            .map(|shard| release_spread(1, ShardId(shard), range))
            .collect();
        assert!(delays.iter().all(|d| *d < range));
        assert_eq!(
            delays,
            (1..=1_000)
                .map(|s| release_spread(1, ShardId(s), range))
                .collect::<Vec<_>>()
        );
        // Spread: every tenth of the range gets some of a thousand groups.
        let mut tenths = [0usize; 10];
        for d in &delays {
            tenths[(d.as_millis() * 10 / range.as_millis()) as usize] += 1;
        }
        assert!(tenths.iter().all(|n| *n > 50), "{tenths:?}");
        // One group's members get different delays.
        let members: HashSet<Duration> = (1..=3)
            .map(|n| release_spread(n, ShardId(7), range))
            .collect();
        assert_eq!(members.len(), 3);
        assert_eq!(
            release_spread(1, ShardId(7), Duration::ZERO),
            Duration::ZERO
        );
    }
}
