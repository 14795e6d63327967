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
//! voters as learners) from the voters it has to the voters wanted. It acts only when
//! - no membership change is in progress (not joint),
//! - every wanted voter is in the group already (a replica being added is `add_replica`'s
//!   work) and has replicated the leader's log (promoting a lagging learner would stall
//!   commits until it caught up),
//! - and the leader itself is a wanted voter (under zone survival the leader-follow loop moves
//!   the leader home first; a leader never demotes itself).
//!
//! A replica added to a shard with zone survival outside its home region stays a learner
//! (`membership::add_replica` asks [`voters_wanted`] before promoting it).
//!
//! # Invariants
//! - Zone survival needs a home region and at least [`ZONE_VOTERS`] replicas there when it is
//!   set (refused otherwise, naming what to add). If moves later leave fewer, every replica
//!   votes again ([`voters_wanted`] falls back to region survival's roles): a shard never runs
//!   on one or two voters because of its goal.
//! - Roles only ever change by Raft membership changes the leader commits; the map never lists
//!   roles, so no map version can disagree with the group about who votes.
//!
//! # Not done yet
//! - Replicas are not moved for the goal: setting zone survival refuses until the home region
//!   holds [`ZONE_VOTERS`] replicas (`meridian cluster add-replica` puts them there), and going
//!   back to region survival makes every replica vote without removing the home region's
//!   extra ones.
//! - The home region's voters are not checked to sit in distinct zones.
//! - Not available at bootstrap (`home_regions` gives homes only) and not for the metadata
//!   shard.

use crate::node::Node;
use crate::shard_map::ShardDescriptor;
use meridian_types::{NodeId, ShardId};
use openraft::type_config::async_runtime::WatchReceiver;
use openraft::ChangeMembers;
use std::collections::{BTreeSet, HashMap};
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

/// The voters a leader should change its group to, if a change is due (see the module
/// docs): `None` when the group has the voters wanted, or cannot get them yet.
pub fn role_change(
    voters: &BTreeSet<NodeId>,
    learners: &BTreeSet<NodeId>,
    wanted: &BTreeSet<NodeId>,
    leader: NodeId,
    caught_up: impl Fn(NodeId) -> bool,
) -> Option<BTreeSet<NodeId>> {
    if wanted == voters || wanted.is_empty() || !wanted.contains(&leader) {
        return None;
    }
    let ready = wanted
        .iter()
        .all(|id| voters.contains(id) || (learners.contains(id) && caught_up(*id)));
    ready.then(|| wanted.clone())
}

/// One round of the leader's side (see the module docs) over the data shards this node
/// leads; at most one change per shard per `10 × period` (`attempts` remembers them).
pub(crate) async fn step(node: &Node, attempts: &mut HashMap<ShardId, Instant>, period: Duration) {
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
            if config.get_joint_config().len() != 1 {
                continue;
            }
            let voters: BTreeSet<NodeId> = config.voter_ids().collect();
            let learners: BTreeSet<NodeId> = config.learner_ids().collect();
            let last = m.last_log_index.unwrap_or(0);
            let caught_up = |id: NodeId| {
                m.replication
                    .as_ref()
                    .and_then(|r| r.get(&id))
                    .and_then(|x| x.as_ref())
                    .is_some_and(|x| x.index >= last)
            };
            let wanted = voters_wanted(desc, region_of);
            role_change(&voters, &learners, &wanted, me, caught_up).map(|to| (voters, to))
        };
        let Some((from, to)) = change else {
            continue;
        };
        let now = Instant::now();
        if attempts
            .get(&desc.id)
            .is_some_and(|t| now.duration_since(*t) < period * 10)
        {
            continue;
        }
        attempts.insert(desc.id, now);
        // Wakes a quiesced group: a membership change needs replication.
        if node.replica(desc.id).is_err() {
            continue;
        }
        tracing::info!(shard = %desc.id, ?from, ?to, survival = desc.survival.as_str(), "changing a shard's voters for its survival goal");
        let change = replica
            .raft
            .change_membership(ChangeMembers::ReplaceAllVoters(to), true);
        match tokio::time::timeout(period, change).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                tracing::warn!(shard = %desc.id, error = %e, "changing the voters failed")
            }
            Err(_) => {
                tracing::warn!(shard = %desc.id, "changing the voters did not commit in time")
            }
        }
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
        let none = BTreeSet::new();
        let yes = |_| true;
        // Region -> zone: demote 2 and 3 in one change, led from the home region.
        assert_eq!(role_change(&all, &none, &east, 1, yes), Some(east.clone()));
        // Not by a leader that would demote itself (leader-follow moves it home first).
        assert_eq!(role_change(&all, &none, &east, 2, yes), None);
        // Zone -> region: promote the learners once they have the log.
        let learners = set(&[2, 3]);
        assert_eq!(
            role_change(&east, &learners, &all, 1, yes),
            Some(all.clone())
        );
        assert_eq!(role_change(&east, &learners, &all, 1, |id| id != 3), None);
        // A wanted voter not in the group yet is add_replica's to add.
        assert_eq!(role_change(&east, &set(&[2]), &all, 1, yes), None);
        // Nothing to do.
        assert_eq!(role_change(&east, &learners, &east, 1, yes), None);
    }
}
