//! Replica moves: adding a replica of a shard on a node, removing one, and how every node
//! learns which replicas it hosts.
//!
//! # What changes
//! A shard's replicas are two things that must agree: the **Raft membership** of its group
//! (who votes, who learns, what the leader replicates to) and the **shard map** stored in the
//! metadata shard (`shard_map_store`), which says which nodes host a replica, so that they
//! open one at start and clients know where to go. A move changes both, in an order that
//! keeps every intermediate state safe:
//!
//! - **Add** (`add_replica`, run by the shard's leader):
//!   1. the map lists the new node (compare-and-swap to the next version), and every node is
//!      told (`push`); the new node opens an empty replica that never initializes a group;
//!   2. the leader adds it as a **learner** and waits (bounded by [`CATCH_UP_WAIT`]) until
//!      it has replicated the log (or installed a snapshot, when the log was purged);
//!   3. the leader makes it a **voter** (a joint-consensus change, openraft's), unless the
//!      shard's survival goal keeps the votes elsewhere (`survival`: under zone survival a
//!      replica outside the home region stays a learner).
//!
//!   Stopped after 1, a node hosts an idle empty replica; after 2, a learner that follows
//!   the log but does not vote. Asking again finishes the move: every step is idempotent.
//!   (The leader's survival step, `survival`, also promotes such a learner once it has the
//!   log and is live, if the shard's goal wants it to vote.)
//!   `Cluster.Status` reports each shard's voters, learners and joint state next to the map's
//!   replica list, so `cluster status` shows a move stopped half way (its MOVES column).
//! - **Remove** (`remove_replica`, run by the shard's leader):
//!   1. the leader removes the node from the voters and from the group (committed by the
//!      remaining quorum);
//!   2. the map drops it, every node is told, and the removed node retires its replica:
//!      stops its Raft and deletes its data (`meridian-raft`'s `retire`).
//!
//!   The map changes only after the membership committed, so no node deletes a replica the
//!   group still counts on. Stopped after 1, the node keeps an idle, unused replica until the
//!   removal is asked again.
//!
//! A caller that asked before without a final answer (a transport error, or a retryable one
//! a leader may give after acting) says so (`retried`): then an add whose target votes
//! already, or a remove whose target holds nothing (an unknown node id included), answers
//! with the group as it stands; asked for the first time, both are refused as mistakes (a
//! wrong node id). An add that finds the group half way through making its target a voter
//! (joint, the target in the new voter set only: an earlier attempt, or a leader before this
//! one, was cut off) finishes that change before it answers, whoever asks (voters of the old
//! set only stay learners); one whose target votes only in the old set (its removal was cut
//! off) is refused with the remove to ask first.
//!
//! Members are the founding ones and those that joined (`join`, recorded in the same map):
//! either can receive replicas. A member with no replica left can be *forgotten*
//! (`join::forget`, listed in the same map): no longer pinged, listed or admitted as a peer.
//!
//! # How nodes learn the map
//! The node that changed the map sends the new record to every member over the peer transport
//! (`RaftTransport.ShardMap`). A node **adopts** a record only if it is newer than its own
//! and has the founding layout (moves change replica lists, joins and forgets the member
//! list, `cluster placement` homes; nothing changes ranges). Adopting persists
//! the record in the node's own keyspace ([`SHARD_MAP_CACHE_KEY`]) before acting on it, then
//! opens the replicas the map adds to this node and retires those it takes away. At start a
//! node hosts the replicas of the newest map it knows: its metadata replica's record, its
//! cached one, or the founding one; its registration reads the stored record too. A node that
//! was down during a move learns it that way at its next start. One that was up but missed
//! the push (cut off) learns it from its next ping that reaches a member: pings carry the
//! pinger's map version, and a member with a newer map pushes it ([`push_to`], see
//! `meridian-raft`'s `map_gossip`).
//!
//! # Invariants
//! - One membership change per shard at a time on its leader (`Node::changing`, shared with
//!   the survival step); a second one asked meanwhile answers UNAVAILABLE (retried).
//! - The stored record changes only by compare-and-swap from the record the change was
//!   computed from, so concurrent moves serialize (the loser re-reads and recomputes).
//! - Only founding replicas of a never-changed map (version 1) initialize Raft groups; a
//!   replica added by a move is always empty until its leader feeds it.
//! - A shard keeps at least one voter: removing the last one is refused.
//!
//! # Placement checks
//! An add goes only to a member the shard's replica constraints allow
//! (`constraints::refuse_target`); a remove never leaves a shard with zone survival fewer
//! than `ZONE_VOTERS` replicas in its home region, and never leaves one group crowded (a
//! zone of the home region under zone survival, a region under region survival: so many of
//! the replicas there that the rest are no majority) when removing another of its replicas
//! would not, and the live members its constraints allow could hold its replicas spread
//! (`removal_checks`). All answer INVALID_ARGUMENT naming the fix.
//!
//! # Not done yet
//! - An add is not checked against either spread: a move adds before it removes, so the
//!   shard briefly has two replicas in a region (or a home zone) on purpose. A remove is
//!   allowed where no better one exists (a decommission of a region's or zone's only node, a
//!   shard crowded already, a shard left with two replicas).
//! - `decommission` (moving every replica off a node) is a client-side plan of one add and
//!   one remove per shard, or the remove alone (`meridian-client`'s `decommission`); no
//!   server-side job tracks it.

use crate::error::{Result, ServerError};
use crate::node::Node;
use crate::shard_map::ShardMap;
use crate::shard_map_store::{self, SHARD_MAP_KEY};
use bytes::Bytes;
use meridian_raft::{Command, ShardReplica};
use meridian_storage::keys::SHARD_MAP_CACHE_KEY;
use meridian_storage::{Cf, Engine, WriteBatch};
use meridian_types::{NodeId, ShardId};
use openraft::impls::BasicNode;
use openraft::type_config::async_runtime::WatchReceiver;
use openraft::ChangeMembers;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long an add waits for the new replica to catch up before it answers UNAVAILABLE (the
/// learner keeps catching up; asking again resumes the wait). Below the server's request
/// deadline (`REQUEST_TIMEOUT`).
pub const CATCH_UP_WAIT: Duration = Duration::from_secs(20);

/// Most compare-and-swap rounds one map change tries before it gives up (each lost round means
/// another move changed the map meanwhile).
const MAX_MAP_ROUNDS: u32 = 8;

/// What a move left: the map version that records it and the group as its leader sees it.
#[derive(Debug, Default)]
pub struct Outcome {
    pub map_version: u64,
    pub voters: Vec<NodeId>,
    pub learners: Vec<NodeId>,
}

/// Adds a replica of `shard` on `target` (see the module docs); must run on the leader.
/// `retried`: the caller may have asked before without hearing the answer, so a target that
/// votes already is the move done, not a mistake.
pub async fn add_replica(
    node: &Node,
    shard: ShardId,
    target: NodeId,
    retried: bool,
) -> Result<Outcome> {
    let replica = led_replica(node, shard).await?;
    let _held = hold(node, shard)?;
    let member = node.member(target).ok_or_else(|| {
        ServerError::InvalidArgument(format!(
            "node {target} is not a member of this cluster (members: {:?})",
            node.members_now()
                .iter()
                .map(|m| m.node_id)
                .collect::<Vec<_>>()
        ))
    })?;
    let addr = member.peer_addr.to_string();
    let configs = replica
        .raft
        .metrics()
        .borrow_watched()
        .membership_config
        .membership()
        .get_joint_config()
        .clone();
    match add_step(&configs, target, retried) {
        AddStep::Proceed => {}
        AddStep::Done => return Ok(outcome(node, &replica)),
        AddStep::VoterAlready => {
            return Err(ServerError::InvalidArgument(format!(
                "node {target} is a voter of shard {shard} already"
            )))
        }
        AddStep::Changing => {
            // Nothing else finishes an interrupted removal (the survival step finishes only
            // a change towards the voters it wants), so waiting would not help.
            return Err(ServerError::InvalidArgument(format!(
                "shard {shard}'s group is half way through removing node {target} (joint \
                 configuration); finish that with `meridian cluster remove-replica {shard} \
                 {target}`, then add it again"
            )));
        }
        AddStep::Finish => {
            // Constraints stored since the earlier attempt listed the target may exclude it.
            if let Some(why) = node
                .map()
                .get(shard)
                .and_then(|d| crate::constraints::refuse_target(d, &member))
            {
                return Err(ServerError::InvalidArgument(why));
            }
            // An earlier ask (or a leader before this one) left the group joint with the
            // target in its new voter set: openraft turns a joint group's next change into
            // its final configuration. `retain`: a voter of the old set only (a joint change
            // the survival step began) stays a learner, as that step meant.
            tracing::info!(%shard, target, "adding a replica: finishing the voter change an earlier attempt began");
            node.wake_to_write(&replica).await;
            replica
                .raft
                .change_membership(ChangeMembers::AddVoterIds(BTreeSet::from([target])), true)
                .await
                .map_err(|e| raft_error(node, shard, e))?;
            return Ok(outcome(node, &replica));
        }
    }
    change_map(node, |map| {
        // Checked against the map being changed: a forget that won the race is seen here.
        if map.forgotten.contains(&target) {
            return Err(ServerError::InvalidArgument(format!(
                "node {target} was forgotten (meridian cluster forget); it cannot take replicas"
            )));
        }
        // So are constraints a placement stored meanwhile. A replica already listed (an add
        // asked again) is checked too: constraints stored after it was listed may exclude it.
        if let Some(desc) = map.get(shard) {
            if let Some(why) = crate::constraints::refuse_target(desc, &member) {
                return Err(ServerError::InvalidArgument(why));
            }
        }
        Ok(map.with_replica_added(shard, target))
    })
    .await?;
    tracing::info!(%shard, target, "adding a replica: learner first");
    node.wake_to_write(&replica).await;
    replica
        .raft
        .add_learner(target, BasicNode::new(addr), false)
        .await
        .map_err(|e| raft_error(node, shard, e))?;
    wait_caught_up(node, &replica, shard, target).await?;
    let region_of = |id: NodeId| node.member(id).map(|m| m.region);
    let votes = node
        .map()
        .get(shard)
        .is_some_and(|d| crate::survival::voters_wanted(d, region_of).contains(&target));
    if !votes {
        tracing::info!(%shard, target, "adding a replica: the learner caught up and stays one (zone survival keeps the votes in the home region)");
        return Ok(outcome(node, &replica));
    }
    tracing::info!(%shard, target, "adding a replica: the learner caught up; making it a voter");
    node.wake_to_write(&replica).await;
    replica
        .raft
        .change_membership(ChangeMembers::AddVoterIds(BTreeSet::from([target])), false)
        .await
        .map_err(|e| raft_error(node, shard, e))?;
    Ok(outcome(node, &replica))
}

/// Removes `target`'s replica of `shard` (see the module docs); must run on the leader.
/// `retried`: the caller may have asked before without hearing the answer, so a target that
/// holds no replica is the move done, not a mistake.
pub async fn remove_replica(
    node: &Node,
    shard: ShardId,
    target: NodeId,
    retried: bool,
) -> Result<Outcome> {
    let replica = led_replica(node, shard).await?;
    let _held = hold(node, shard)?;
    let (voters, learners) = group(&replica);
    let listed = node
        .map()
        .get(shard)
        .is_some_and(|d| d.replicas.contains(&target));
    if !voters.contains(&target) && !learners.contains(&target) && !listed {
        if retried {
            return Ok(outcome(node, &replica));
        }
        return Err(ServerError::InvalidArgument(format!(
            "node {target} holds no replica of shard {shard} (voters {voters:?}, learners {learners:?})"
        )));
    }
    if voters.contains(&target) && voters.len() == 1 {
        return Err(ServerError::InvalidArgument(format!(
            "node {target} is shard {shard}'s last voter; add another replica first"
        )));
    }
    if let Some(why) = node.map().get(shard).and_then(|d| {
        let members: Vec<crate::removal_checks::Place> = node
            .members_now()
            .into_iter()
            .map(|m| {
                let live = m.node_id == node.config.node_id
                    || node
                        .host
                        .pool
                        .seen_within(m.node_id, crate::cluster::LIVENESS_WINDOW);
                let could = live && crate::constraints::refuse_target(d, &m).is_none();
                crate::removal_checks::Place {
                    id: m.node_id,
                    region: m.region,
                    zone: m.zone,
                    could,
                }
            })
            .collect();
        crate::removal_checks::zone_survival_refusal(d, target, |id| {
            node.member(id).map(|m| m.region)
        })
        .or_else(|| crate::removal_checks::zone_spread_refusal(d, target, &members))
        .or_else(|| crate::removal_checks::region_survival_refusal(d, target, &members))
    }) {
        return Err(ServerError::InvalidArgument(why));
    }
    if voters.contains(&target) || learners.contains(&target) {
        tracing::info!(%shard, target, "removing a replica from the group");
        let change = if voters.contains(&target) {
            ChangeMembers::RemoveVoters(BTreeSet::from([target]))
        } else {
            ChangeMembers::RemoveNodes(BTreeSet::from([target]))
        };
        node.wake_to_write(&replica).await;
        replica
            .raft
            .change_membership(change, false)
            .await
            .map_err(|e| raft_error(node, shard, e))?;
    }
    change_map(node, |map| Ok(map.with_replica_removed(shard, target))).await?;
    Ok(outcome(node, &replica))
}

/// Holds `shard` for one membership change on this node, or UNAVAILABLE (retryable) while
/// another one (a move, a survival goal's role change) is under way.
fn hold(node: &Node, shard: ShardId) -> Result<crate::survival::ChangingGuard<'_>> {
    node.changing.try_hold(shard).ok_or_else(|| {
        ServerError::Unavailable(format!(
            "another membership change of shard {shard} is under way on its leader; try again"
        ))
    })
}

/// This node's replica of `shard` if it leads it, else NOT_LEADER (with the leader's address)
/// or WRONG_SHARD.
async fn led_replica(node: &Node, shard: ShardId) -> Result<Arc<ShardReplica>> {
    if node.map().get(shard).is_none() {
        return Err(ServerError::InvalidArgument(format!("no shard {shard}")));
    }
    // Wakes a quiesced group: a membership change needs heartbeats and replication.
    let replica = node.replica(shard)?;
    let leader = replica.raft.metrics().borrow_watched().current_leader;
    if leader != Some(node.config.node_id) {
        return Err(node.not_leader(shard, leader).await);
    }
    Ok(replica)
}

/// What an add of `target` does, given the group's voter configurations (two while a voter
/// change is half done: the old set, then the new one).
#[derive(Debug, PartialEq, Eq)]
enum AddStep {
    /// Not a voter anywhere: learner, catch up, voter.
    Proceed,
    /// A voter of the settled group: the move is done (if `retried`).
    Done,
    /// Refused: a voter already (a first ask: likely a mistaken id).
    VoterAlready,
    /// The group is half way through making it a voter: finish that change.
    Finish,
    /// A voter of the old set only: its removal was cut off half way.
    Changing,
}

fn add_step(configs: &[BTreeSet<NodeId>], target: NodeId, retried: bool) -> AddStep {
    let anywhere = configs.iter().any(|c| c.contains(&target));
    let in_new = configs.last().is_some_and(|c| c.contains(&target));
    let everywhere = configs.iter().all(|c| c.contains(&target));
    match (anywhere, in_new, everywhere) {
        (false, _, _) => AddStep::Proceed,
        (true, false, _) => AddStep::Changing,
        (true, true, false) => AddStep::Finish,
        (true, true, true) if retried => AddStep::Done,
        (true, true, true) => AddStep::VoterAlready,
    }
}

/// The group's voters and learners as this replica sees them.
fn group(replica: &ShardReplica) -> (Vec<NodeId>, Vec<NodeId>) {
    let metrics = replica.raft.metrics().borrow_watched().clone();
    let membership = metrics.membership_config.membership();
    (
        membership.voter_ids().collect(),
        membership.learner_ids().collect(),
    )
}

fn outcome(node: &Node, replica: &ShardReplica) -> Outcome {
    let (voters, learners) = group(replica);
    Outcome {
        map_version: node.map().version,
        voters,
        learners,
    }
}

/// A failed Raft call: NOT_LEADER if this node lost the lead meanwhile, else UNAVAILABLE
/// (another change in progress, a quorum not reachable: asking again is safe).
fn raft_error(node: &Node, shard: ShardId, e: impl std::fmt::Display) -> ServerError {
    let leader = node
        .host
        .get(shard)
        .and_then(|r| r.raft.metrics().borrow_watched().current_leader);
    if leader != Some(node.config.node_id) {
        return ServerError::NotLeader {
            shard,
            leader: None,
        };
    }
    ServerError::Unavailable(format!("changing shard {shard}'s group: {e}"))
}

/// Waits until `target`'s replicated log reaches the leader's last index (as of the call).
async fn wait_caught_up(
    node: &Node,
    replica: &ShardReplica,
    shard: ShardId,
    target: NodeId,
) -> Result<()> {
    let mut watch = replica.raft.metrics();
    let goal = watch.borrow_watched().last_log_index.unwrap_or(0);
    let give_up = Instant::now() + CATCH_UP_WAIT;
    loop {
        let now = watch.borrow_watched().clone();
        if now.current_leader != Some(node.config.node_id) {
            return Err(node.not_leader(shard, now.current_leader).await);
        }
        let matched = now
            .replication
            .as_ref()
            .and_then(|r| r.get(&target))
            .and_then(|m| m.as_ref())
            .map_or(0, |m| m.index);
        if matched >= goal {
            return Ok(());
        }
        let remaining = give_up.saturating_duration_since(Instant::now());
        if remaining.is_zero() {
            return Err(ServerError::Unavailable(format!(
                "node {target}'s new replica of shard {shard} has replicated the log to index \
                 {matched} of {goal} after {} s; it is a learner and keeps catching up: ask \
                 again to finish the move",
                CATCH_UP_WAIT.as_secs()
            )));
        }
        let _ = tokio::time::timeout(remaining, watch.changed()).await;
    }
}

/// Stores the map `edit` makes of the current one (compare-and-swap on the stored record),
/// adopts it and tells every member. `edit` returning `None` means the change is in the map
/// already, an error that it cannot be made. Returns the version that holds the change.
pub(crate) async fn change_map(
    node: &Node,
    edit: impl Fn(&ShardMap) -> Result<Option<ShardMap>>,
) -> Result<u64> {
    for _ in 0..MAX_MAP_ROUNDS {
        let current = node.map();
        let Some(next) = edit(&current)? else {
            return Ok(current.version);
        };
        let expect = shard_map_store::encode(&current).map_err(ServerError::Internal)?;
        let record = shard_map_store::encode(&next).map_err(ServerError::InvalidArgument)?;
        let cmd = Command::Cas {
            ts: node.clock.now().0,
            key: Bytes::from_static(SHARD_MAP_KEY),
            expect: meridian_raft::Expect::Value(expect),
            value: Some(record.clone()),
            request: None,
        };
        let result = node
            .propose_anywhere(ShardId::META, cmd)
            .await
            .map_err(|e| {
                ServerError::Unavailable(format!(
                    "storing the shard map in the metadata shard: {e}"
                ))
            })?;
        match (result.mismatch, result.rejected) {
            (None, None) => {
                tracing::info!(version = next.version, "stored a new shard map");
                let version = next.version;
                adopt(node, next).await;
                push(node, &record).await;
                return Ok(version);
            }
            // Another move changed it first: adopt the stored map and recompute.
            (Some(Some((_, stored))), _) => {
                let stored = shard_map_store::decode(&stored).map_err(ServerError::Internal)?;
                adopt(node, stored).await;
            }
            (Some(None), _) => {
                return Err(ServerError::Unavailable(
                    "the founding shard map is not stored yet; try again in a moment".into(),
                ))
            }
            (None, Some(why)) => {
                return Err(ServerError::Unavailable(format!(
                    "storing the shard map was refused: {why:?}"
                )))
            }
        }
    }
    Err(ServerError::Unavailable(format!(
        "the shard map changed {MAX_MAP_ROUNDS} times while this move tried to store it; try again"
    )))
}

/// Sends `record` to every other member, at once, and waits for their answers at most one
/// round's wait (`RaftSection::round_wait`: every reachable member answers well within it).
/// Sends still running then go on in the background: a member cut off would otherwise hold
/// the move's reply for a whole RPC timeout, past the client's own, and the client would retry
/// a move that was done. A member that cannot be reached learns the map later (the next push,
/// its ping's map gossip, or its next start).
async fn push(node: &Node, record: &Bytes) {
    let me = node.config.node_id;
    let sends: Vec<_> = node
        .members_now()
        .into_iter()
        .filter(|m| m.node_id != me)
        .map(|m| {
            let (pool, record) = (node.host.pool.clone(), record.clone());
            tokio::spawn(async move {
                let peer = m.node_id;
                match pool.push_shard_map(&m.peer_addr.to_string(), &record).await {
                    Ok(version) => tracing::debug!(peer, version, "peer has the shard map"),
                    Err(e) => {
                        tracing::warn!(peer, error = %e, "could not send the new shard map to a peer")
                    }
                }
            })
        })
        .collect();
    let bound = node.config.raft.round_wait();
    if tokio::time::timeout(bound, futures::future::join_all(sends))
        .await
        .is_err()
    {
        tracing::info!(
            bound_ms = bound.as_millis() as u64,
            "a member has not answered the shard map push yet; replying without it"
        );
    }
}

/// Sends this node's map to `peer`, whose ping carried an older version (`meridian-raft`'s
/// `map_gossip`): a member that missed a change while cut off gets it once it is reachable.
pub(crate) async fn push_to(node: &Node, peer: NodeId) {
    let Some(member) = node.member(peer) else {
        return;
    };
    let map = node.map();
    let record = match shard_map_store::encode(&map) {
        Ok(record) => record,
        Err(e) => {
            tracing::error!(error = %e, "cannot encode the shard map for a peer behind");
            return;
        }
    };
    let addr = member.peer_addr.to_string();
    match node.host.pool.push_shard_map(&addr, &record).await {
        Ok(theirs) if theirs >= map.version => tracing::info!(
            peer,
            version = map.version,
            theirs,
            "sent the shard map to a peer whose ping showed an older one"
        ),
        // Its ranges differ (a misconfigured node): `map_gossip` asks again at most once a
        // second, so this repeats at that rate until the node is fixed or stops.
        Ok(theirs) => tracing::warn!(
            peer,
            version = map.version,
            theirs,
            "a peer behind did not adopt the shard map sent to it"
        ),
        Err(e) => tracing::warn!(peer, error = %e, "could not send the shard map to a peer behind"),
    }
}

/// A peer's record (`RaftTransport.ShardMap`): adopted if newer; the version in use after.
pub async fn on_pushed(node: &Node, raw: &[u8]) -> std::result::Result<u64, String> {
    let map = shard_map_store::decode(raw)?;
    adopt(node, map).await;
    Ok(node.map().version)
}

/// Makes `map` this node's if it is newer and has the founding layout: persists it, swaps it
/// in, and opens or retires replicas to match. Returns whether it was adopted.
pub async fn adopt(node: &Node, map: ShardMap) -> bool {
    let _one_at_a_time = node.reconciling.lock().await;
    if map.version <= node.map().version {
        return false;
    }
    if !map.same_layout(&node.founding) {
        tracing::error!(
            version = map.version,
            "ignoring a shard map whose ranges differ from the founding ones"
        );
        return false;
    }
    let record = match shard_map_store::encode(&map) {
        Ok(r) => r,
        Err(e) => {
            tracing::error!(error = %e, "cannot encode an adopted shard map");
            return false;
        }
    };
    let engine = node.engine.clone();
    let persisted = tokio::task::spawn_blocking(move || {
        let mut batch = WriteBatch::new();
        batch.put(Cf::RaftMeta, SHARD_MAP_CACHE_KEY, record.to_vec());
        engine.write(batch, true)
    })
    .await;
    if !matches!(persisted, Ok(Ok(()))) {
        tracing::error!(
            ?persisted,
            "cannot persist an adopted shard map; not adopting it"
        );
        return false;
    }
    let version = map.version;
    node.shard_map.adopt(map);
    node.refresh_peers();
    tracing::info!(version, "adopted a new shard map");
    reconcile(node).await;
    true
}

/// Opens the replicas the current map places on this node and retires the others.
async fn reconcile(node: &Node) {
    let me = node.config.node_id;
    let map = node.map();
    for desc in map.all() {
        if desc.replicas.contains(&me) && node.host.get(desc.id).is_none() {
            match node.host.open_shard(desc.id, desc.span()).await {
                Ok(_) => tracing::info!(shard = %desc.id, "opened a replica a move placed here"),
                Err(e) => tracing::error!(shard = %desc.id, error = %e, "cannot open a replica"),
            }
        }
    }
    for replica in node.host.replicas() {
        let Some(desc) = map.get(replica.shard) else {
            continue;
        };
        if desc.replicas.contains(&me) {
            continue;
        }
        if let Err(e) = node.host.retire_shard(desc.id, &desc.span()).await {
            tracing::error!(shard = %desc.id, error = %e, "cannot retire a replica");
        }
    }
}

/// The map this node adopted last, from its own keyspace.
pub fn read_cached(engine: &dyn Engine) -> std::result::Result<Option<ShardMap>, String> {
    match engine.get(Cf::RaftMeta, SHARD_MAP_CACHE_KEY) {
        Ok(None) => Ok(None),
        Ok(Some(raw)) => shard_map_store::decode(&raw).map(Some),
        Err(e) => Err(format!("reading the cached shard map: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_add_asked_again_while_the_voter_change_is_half_done_finishes_it() {
        let set = |ids: &[NodeId]| ids.iter().copied().collect::<BTreeSet<_>>();
        let settled = [set(&[1, 2, 3])];
        assert_eq!(add_step(&settled, 4, false), AddStep::Proceed);
        assert_eq!(add_step(&settled, 3, false), AddStep::VoterAlready);
        assert_eq!(add_step(&settled, 3, true), AddStep::Done);
        // Joint: node 4 votes in the new set only. The move is not done until the group
        // leaves the joint configuration, whoever asks.
        let adding = [set(&[1, 2, 3]), set(&[1, 2, 3, 4])];
        assert_eq!(add_step(&adding, 4, true), AddStep::Finish);
        assert_eq!(add_step(&adding, 4, false), AddStep::Finish);
        assert_eq!(add_step(&adding, 1, true), AddStep::Done);
        // Joint: node 3 votes in the old set only (it is being removed).
        let removing = [set(&[1, 2, 3]), set(&[1, 2, 4])];
        assert_eq!(add_step(&removing, 3, true), AddStep::Changing);
        assert_eq!(add_step(&removing, 3, false), AddStep::Changing);
    }
}
