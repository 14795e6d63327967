//! Survival goals: which failure a shard's voters are placed to survive.
//!
//! A shard's replicas all hold the data; only its **voters** form the quorums that commit
//! writes and elect leaders. Where the voters sit decides both what a write costs and what
//! failure the shard survives:
//!
//! - **Region survival** (the default): every replica votes. Placement puts one replica per
//!   region, so a write waits for the nearest other region (one WAN round trip from the home
//!   region) and the shard keeps serving when a whole region is lost.
//! - **Zone survival** (`meridian cluster placement SHARD --home REGION --survive zone`): only
//!   the replicas in the shard's home region vote; the replicas elsewhere become Raft
//!   **learners**, which receive the log (and closed timestamps, so they serve follower reads
//!   in their region) but neither vote nor campaign. A write commits within the home region,
//!   at local latency; the shard survives the loss of one of its home voters (a zone) and of
//!   every other region, but not the loss of its home region: the learners hold the data up to
//!   what they replicated, and cannot elect a leader among themselves.
//!
//! # How roles follow the map
//! The goal is stored in the shard map with the shard's home (`home::set_placement`), so the
//! wanted roles are a pure function of the map ([`voters_wanted`]). The shard's leader makes
//! its Raft group match them ([`step`], run by the leader-follow loop every
//! `election_timeout_max`): one joint-consensus change (`ReplaceAllVoters`, keeping removed
//! voters as learners) from the voters it has to the voters wanted, run to its end (both
//! entries). It acts only when
//! - the group's voters and learners are the map's replicas (no move in progress, and this
//!   leader's map is not behind the group),
//! - no other membership change of the shard is under way on this node (`Changing`, shared
//!   with `membership`'s moves, so a move and a role change never collide half way),
//! - and every wanted voter is ready: answering pings, and for a learner, holding the leader's
//!   log (promoting a lagging learner would stall commits; dropping voters while a wanted one
//!   is down could leave no quorum).
//!
//! A leader that is not a wanted voter (the home moved under zone survival) first *adds* the
//! wanted voters to its own; the leader-follow loop then moves the lead to the home region,
//! and that leader drops the rest. A leader never demotes itself. A group left joint by a
//! leader change mid-way is finished by the next leader if it was heading for the voters
//! wanted.
//!
//! A replica added to a shard with zone survival outside its home region stays a learner
//! (`membership::add_replica` asks [`voters_wanted`] before promoting it); under region
//! survival the step promotes a listed learner (an interrupted add) once it is ready.
//!
//! # Invariants
//! - Zone survival needs a home region and at least [`ZONE_VOTERS`] replicas there, no zone
//!   holding half of them or more, when it is set (refused otherwise, naming what to add or
//!   remove; the CLI adds them first, new zones first, and refuses a plan that would crowd a
//!   zone before anything moves). At bootstrap the rule's region needs [`ZONE_VOTERS`]
//!   founding members, and a node founding the cluster refuses a founding map whose home
//!   replicas crowd a zone (`home::crowded_founding_zones`; a data dir founded by an older
//!   binary, which did not check, keeps starting). If moves later
//!   leave fewer, every replica is wanted as a voter again ([`voters_wanted`] falls back to
//!   region survival's roles), so the goal itself never asks for one or two voters (a removal
//!   still leaves two until the next round promotes the learners).
//! - Roles only ever change by Raft membership changes the leader commits; the map never lists
//!   roles, so no map version can disagree with the group about who votes.
//!
//! # Not done yet
//! - Going back to region survival makes every replica vote; the home region's extra
//!   replicas are removed by the client (`meridian-client`'s `survival_plan`), not by the
//!   server, so `Cluster.SetPlacement` alone leaves a shard that cannot survive its home
//!   region until they are.
//! - Only the giving of the goal (or of a new home with it) and founding check the home
//!   voters' zones ([`crowded_zone_refusal`]): a replica move may crowd a zone afterwards
//!   (neither adds nor removes are checked, see `removal_checks`), and nothing moves a
//!   shard's replicas out of a crowded zone by itself.
//! - Not for the metadata shard (it has no home). At bootstrap (`home_regions` rules ending
//!   in `:zone`) the founding map holds the goal and the home replicas, but the group is
//!   founded with every replica voting; the first rounds of its leader make the others
//!   learners.
//! - Older binaries cannot decode a shard map with zone survival: a rolling upgrade must not
//!   set it before every node runs this version.

use crate::node::Node;
use crate::shard_map::ShardDescriptor;
use meridian_types::{NodeId, ShardId};
use openraft::type_config::async_runtime::WatchReceiver;
use openraft::ChangeMembers;
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Fewest replicas in the home region that zone survival accepts: three voters survive the
/// loss of one.
pub const ZONE_VOTERS: usize = 3;

/// Which failure a shard's voters are placed to survive (see the module docs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Survival {
    /// Every replica votes.
    #[default]
    Region,
    /// Only the home region's replicas vote; the others are learners.
    Zone,
}

impl Survival {
    /// `region` or `zone` (what the CLI and the API take and show).
    pub fn parse(raw: &str) -> Result<Survival, String> {
        match raw {
            "region" | "" => Ok(Survival::Region),
            "zone" => Ok(Survival::Zone),
            other => Err(format!(
                "unknown survival goal {other:?} (expected \"region\" or \"zone\")"
            )),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Survival::Region => "region",
            Survival::Zone => "zone",
        }
    }
}

/// The voters `desc` should have: every replica, or under zone survival its replicas in the
/// home region (when there are at least [`ZONE_VOTERS`]; otherwise every replica).
pub fn voters_wanted(
    desc: &ShardDescriptor,
    region_of: impl Fn(NodeId) -> Option<String>,
) -> BTreeSet<NodeId> {
    let all: BTreeSet<NodeId> = desc.replicas.iter().copied().collect();
    let (Survival::Zone, Some(home)) = (desc.survival, desc.home.as_deref()) else {
        return all;
    };
    let home_voters: BTreeSet<NodeId> = all
        .iter()
        .copied()
        .filter(|id| region_of(*id).as_deref() == Some(home))
        .collect();
    if home_voters.len() >= ZONE_VOTERS {
        home_voters
    } else {
        all
    }
}

/// Why `desc` cannot have `survival` with home `home`, if it cannot (see the invariants).
pub fn refusal(
    desc: &ShardDescriptor,
    survival: Survival,
    home: Option<&str>,
    region_of: impl Fn(NodeId) -> Option<String>,
) -> Option<String> {
    if survival == Survival::Region {
        return None;
    }
    let Some(home) = home else {
        return Some(
            "zone survival keeps the voters in the shard's home region: give one (--home REGION)"
                .into(),
        );
    };
    let there: Vec<NodeId> = desc
        .replicas
        .iter()
        .copied()
        .filter(|id| region_of(*id).as_deref() == Some(home))
        .collect();
    (there.len() < ZONE_VOTERS).then(|| {
        format!(
            "zone survival needs {ZONE_VOTERS} replicas of shard {} in {home} to survive losing \
             one, and it has {} ({there:?}); add replicas there first (meridian cluster \
             add-replica {} NODE)",
            desc.id.0,
            there.len(),
            desc.id.0
        )
    })
}

/// The zone holding half or more of `desc`'s replicas in `home` (`meridian_types::zones`),
/// with those nodes and how many replicas `home` holds; `None` when losing any one zone leaves
/// a majority. `place_of` gives a node's (region, zone) (a node it does not know is in no
/// region).
pub(crate) fn crowded_home_zone(
    desc: &ShardDescriptor,
    home: &str,
    place_of: impl Fn(NodeId) -> Option<(String, String)>,
) -> Option<(String, Vec<NodeId>, usize)> {
    let placed: Vec<(NodeId, String)> = desc
        .replicas
        .iter()
        .filter_map(|id| place_of(*id).map(|(region, zone)| (*id, region, zone)))
        .filter(|(_, region, _)| region == home)
        .map(|(id, _, zone)| (id, zone))
        .collect();
    let (zone, nodes) =
        meridian_types::zones::crowded_zone(placed.iter().map(|(id, z)| (*id, z.as_str())))?;
    Some((zone.to_string(), nodes, placed.len()))
}

/// Why `desc`'s replicas in `home` cannot give zone survival: one zone holds half of them or
/// more ([`crowded_home_zone`]), so losing that zone would stop the shard's writes.
/// `place_of` gives a node's (region, zone). `None` under region survival, without a home, or
/// when no zone is crowded. Asked only when a shard is given zone survival or a new home with
/// it (`home::with_placement`): a shard that already has the goal keeps it, whatever the moves
/// since.
pub fn crowded_zone_refusal(
    desc: &ShardDescriptor,
    survival: Survival,
    home: Option<&str>,
    place_of: impl Fn(NodeId) -> Option<(String, String)>,
) -> Option<String> {
    let home = home.filter(|_| survival == Survival::Zone)?;
    let (zone, nodes, there) = crowded_home_zone(desc, home, place_of)?;
    Some(format!(
        "zone survival keeps shard {id}'s votes in {home}, and {} of its {there} replicas there \
         share zone {zone:?} (nodes {nodes:?}): losing that zone would stop its writes. Add a \
         replica in {home} on a node of another zone (meridian cluster add-replica {id} NODE) \
         and remove one of these (meridian cluster remove-replica {id} NODE)",
        nodes.len(),
        id = desc.id.0,
    ))
}

/// The voters a leader should change its group to, if a change is due (see the module
/// docs): `None` when the group has the voters wanted, or cannot get them yet. `ready` says
/// whether a node can be a voter now: live, and (for a learner) caught up; the leader is.
/// A leader that is not wanted first adds the wanted voters to its own (a home moved under
/// zone survival: the leader-follow loop then moves the lead there, and the new leader drops
/// the rest), so a leader never demotes itself.
pub fn role_change(
    voters: &BTreeSet<NodeId>,
    wanted: &BTreeSet<NodeId>,
    leader: NodeId,
    ready: impl Fn(NodeId) -> bool,
) -> Option<BTreeSet<NodeId>> {
    if wanted.is_empty() || wanted.iter().any(|id| *id != leader && !ready(*id)) {
        return None;
    }
    let to = match wanted.contains(&leader) {
        true => wanted.clone(),
        false => voters.union(wanted).copied().collect(),
    };
    (&to != voters).then_some(to)
}

/// The shards whose membership this node is changing: a move (`membership`) or a role change
/// holds its shard here, so the two never propose at once (openraft refuses a second change
/// while one is in progress, and a move would fail half way).
#[derive(Default)]
pub struct Changing(std::sync::Mutex<BTreeSet<ShardId>>);

/// A shard held in [`Changing`]; released when dropped.
pub struct ChangingGuard<'a> {
    set: &'a Changing,
    shard: ShardId,
}

impl Changing {
    /// Whether a change of `shard` is under way here.
    pub fn is_held(&self, shard: ShardId) -> bool {
        let held = self.0.lock().unwrap_or_else(|p| p.into_inner());
        held.contains(&shard)
    }

    /// Holds `shard`, or `None` if a change of it is under way here.
    pub fn try_hold(&self, shard: ShardId) -> Option<ChangingGuard<'_>> {
        let mut held = self.0.lock().unwrap_or_else(|p| p.into_inner());
        // Lazily: a guard built and dropped here would release the holder's shard.
        held.insert(shard)
            .then(|| ChangingGuard { set: self, shard })
    }
}

impl Drop for ChangingGuard<'_> {
    fn drop(&mut self) {
        let mut held = self.set.0.lock().unwrap_or_else(|p| p.into_inner());
        held.remove(&self.shard);
    }
}

/// One round of the leader's side (see the module docs) over the data shards this node
/// leads; at most one change per shard per `10 × period` (`attempts` remembers them). A
/// change runs to its end (both of its joint-consensus entries; a dropped change could leave
/// the group joint) in a task of its own, so a change that cannot commit (no quorum) holds
/// only its shard, not the loop's other work.
pub(crate) fn step(node: &Arc<Node>, attempts: &mut HashMap<ShardId, Instant>, period: Duration) {
    let me = node.config.node_id;
    let region_of = |id: NodeId| node.member(id).map(|m| m.region);
    for desc in &node.map().data {
        let Some(replica) = node.host.get(desc.id) else {
            continue;
        };
        let change = {
            let watch = replica.raft.metrics();
            let m = watch.borrow_watched();
            if m.current_leader != Some(me) {
                continue;
            }
            let config = m.membership_config.membership();
            // The common case, every replica voting as wanted: no sets built.
            if desc.survival == Survival::Region
                && config.learner_ids().next().is_none()
                && config.get_joint_config().len() == 1
            {
                continue;
            }
            let joint = config.get_joint_config();
            let voters: BTreeSet<NodeId> = config.voter_ids().collect();
            let learners: BTreeSet<NodeId> = config.learner_ids().collect();
            let listed: BTreeSet<NodeId> = desc.replicas.iter().copied().collect();
            // A move in progress, or a map this node has not caught up with: not ours to touch.
            if voters.union(&learners).copied().collect::<BTreeSet<_>>() != listed {
                continue;
            }
            let wanted = voters_wanted(desc, region_of);
            if joint.len() != 1 {
                // Left joint (a leader change mid-way): finish it if it was heading for the
                // voters wanted.
                let last: BTreeSet<NodeId> = joint.last().into_iter().flatten().copied().collect();
                (last == wanted).then_some((voters, wanted))
            } else {
                let last = m.last_log_index.unwrap_or(0);
                let ready = |id: NodeId| {
                    let caught_up = m
                        .replication
                        .as_ref()
                        .and_then(|r| r.get(&id))
                        .and_then(|x| x.as_ref())
                        .is_some_and(|x| x.index >= last);
                    node.host.pool.seen_within(id, period) && (voters.contains(&id) || caught_up)
                };
                role_change(&voters, &wanted, me, ready).map(|to| (voters, to))
            }
        };
        let Some((from, to)) = change else {
            continue;
        };
        // A move holds the shard (an add's last step, say): try again next round rather than
        // spend the attempt on a task that would find it held and return (a 10-round wait).
        if node.changing.is_held(desc.id) {
            continue;
        }
        let now = Instant::now();
        if attempts
            .get(&desc.id)
            .is_some_and(|t| now.duration_since(*t) < period * 10)
        {
            continue;
        }
        attempts.insert(desc.id, now);
        let (node, shard, survival) = (node.clone(), desc.id, desc.survival);
        tokio::spawn(async move {
            let Some(_held) = node.changing.try_hold(shard) else {
                return;
            };
            // Wakes a quiesced group (a membership change needs replication) and renews its
            // leader's lease: a parked leader's has lapsed, and openraft refuses the change
            // until a quorum round renews it (`meridian_raft::write_lease`).
            node.wake_to_write(&replica).await;
            tracing::info!(%shard, ?from, ?to, survival = survival.as_str(), "changing a shard's voters for its survival goal");
            let change = replica
                .raft
                .change_membership(ChangeMembers::ReplaceAllVoters(to), true);
            if let Err(e) = change.await {
                tracing::warn!(%shard, error = %e, "changing the voters failed");
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EAST: [NodeId; 3] = [1, 4, 5];

    fn region_of(id: NodeId) -> Option<String> {
        Some(
            match id {
                2 => "eu-west",
                3 => "ap-south",
                _ if EAST.contains(&id) => "us-east",
                _ => return None,
            }
            .to_string(),
        )
    }

    fn shard(replicas: &[NodeId], home: Option<&str>, survival: Survival) -> ShardDescriptor {
        ShardDescriptor {
            id: ShardId(1),
            start: Vec::new(),
            end: Vec::new(),
            replicas: replicas.to_vec(),
            home: home.map(str::to_string),
            survival,
            constraints: Default::default(),
            generation: 1,
        }
    }

    fn set(ids: &[NodeId]) -> BTreeSet<NodeId> {
        ids.iter().copied().collect()
    }

    #[test]
    fn zone_survival_keeps_the_votes_in_the_home_region() {
        let five = [1, 2, 3, 4, 5];
        let zone = shard(&five, Some("us-east"), Survival::Zone);
        assert_eq!(voters_wanted(&zone, region_of), set(&EAST));
        let region = shard(&five, Some("us-east"), Survival::Region);
        assert_eq!(voters_wanted(&region, region_of), set(&five));
        // Fewer than three at home: every replica votes, as under region survival.
        let thin = shard(&[1, 2, 3, 4], Some("us-east"), Survival::Zone);
        assert_eq!(voters_wanted(&thin, region_of), set(&[1, 2, 3, 4]));
        // No home: nothing to keep the votes in.
        let homeless = shard(&five, None, Survival::Zone);
        assert_eq!(voters_wanted(&homeless, region_of), set(&five));
    }

    #[test]
    fn zone_survival_is_refused_without_a_home_or_three_replicas_there() {
        let five = shard(&[1, 2, 3, 4, 5], None, Survival::Region);
        assert_eq!(
            refusal(&five, Survival::Zone, Some("us-east"), region_of),
            None
        );
        assert_eq!(refusal(&five, Survival::Region, None, region_of), None);
        let e = refusal(&five, Survival::Zone, None, region_of).unwrap();
        assert!(e.contains("--home"), "{e}");
        let three = shard(&[1, 2, 3], None, Survival::Region);
        let e = refusal(&three, Survival::Zone, Some("us-east"), region_of).unwrap();
        assert!(
            e.contains("has 1 ([1])") && e.contains("add-replica 1 NODE"),
            "{e}"
        );
        assert_eq!(Survival::parse("zone"), Ok(Survival::Zone));
        assert_eq!(Survival::parse("region"), Ok(Survival::Region));
        assert!(Survival::parse("planet").unwrap_err().contains("planet"));
    }

    #[test]
    fn the_leader_changes_roles_only_when_every_wanted_voter_is_ready() {
        let all = set(&[1, 2, 3, 4, 5]);
        let east = set(&EAST);
        let yes = |_| true;
        // Region -> zone: demote 2 and 3 in one change, led from the home region.
        assert_eq!(role_change(&all, &east, 1, yes), Some(east.clone()));
        // Not while a wanted voter is down (or a learner behind): the change could take the
        // quorum away.
        assert_eq!(role_change(&all, &east, 1, |id| id != 5), None);
        // Zone -> region: promote the learners once they are ready.
        assert_eq!(role_change(&east, &all, 1, yes), Some(all.clone()));
        assert_eq!(role_change(&east, &all, 1, |id| id != 3), None);
        // The leader is always ready.
        assert_eq!(
            role_change(&all, &east, 4, |id| id != 4),
            Some(east.clone())
        );
        // A leader outside the wanted voters (the home moved to eu-west and ap-south, say)
        // adds them and keeps itself; the next leader, a wanted one, drops the rest.
        let away = set(&[2, 3, 6]);
        assert_eq!(
            role_change(&east, &away, 1, yes),
            Some(set(&[1, 2, 3, 4, 5, 6]))
        );
        assert_eq!(role_change(&set(&[1, 2, 3, 4, 5, 6]), &away, 1, yes), None);
        assert_eq!(
            role_change(&set(&[1, 2, 3, 4, 5, 6]), &away, 2, yes),
            Some(away)
        );
        // Nothing to do.
        assert_eq!(role_change(&east, &east, 1, yes), None);
    }

    #[test]
    fn one_change_per_shard_at_a_time() {
        let changing = Changing::default();
        let held = changing.try_hold(ShardId(1)).expect("free");
        assert!(changing.try_hold(ShardId(1)).is_none());
        assert!(changing.try_hold(ShardId(2)).is_some());
        drop(held);
        assert!(changing.try_hold(ShardId(1)).is_some());
    }
}
