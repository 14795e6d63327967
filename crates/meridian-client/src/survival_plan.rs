//! Moving a shard between survival goals from wherever its replicas are: the replicas a goal
//! needs are added before it is stored, the ones it no longer needs removed after.
//!
//! **Zone survival** keeps a shard's votes in its home region, so the region must hold at
//! least [`ZONE_VOTERS`] of its replicas (the server refuses the goal otherwise). A shard
//! placed one replica per region has one there. [`Client::place`] closes the gap: from one
//! status of the cluster it plans the additions ([`zone_additions`], a pure function), runs
//! each as an `add_replica` (learner, caught up, voter), then stores the goal; the shard's
//! leader then makes the replicas outside the home region learners. The targets are live
//! members of the home region without a replica of the shard that its replica constraints
//! allow (`constraint_plan`), preferring
//!
//! 1. a zone none of the shard's home replicas (or the targets chosen so far) is in,
//! 2. then the node with the fewest replicas,
//! 3. then the lowest node id (a stable choice).
//!
//! A region with too few live members fails the plan before anything moves, and so does one
//! whose members are in too few zones: if one zone would hold half of the home replicas or
//! more (`meridian_types::zones`), losing it would stop the shard's writes, and the server
//! refuses the goal too. Running the command again after an interruption re-plans from what is
//! there (an added replica counts).
//!
//! **Region survival** needs the opposite: every replica votes, and the shard survives losing
//! a region only if no region holds half of them or more (losing it would leave no majority).
//! A shard that had zone survival has three replicas in its home region and one in each other,
//! so going back would leave it unable to survive its home region. [`Client::place`] therefore
//! stores the goal first, then removes one replica at a time, each planned
//! ([`region_removals`], a pure function) from the status of the shard's leader once it
//! reports every replica a voter ([`ALL_VOTING_TIMEOUT`]; removing a voter while learners wait
//! would leave one or two, and the leader may move between removals). While the most crowded
//! region holds half the replicas or more, has two or more, and the shard has more than three,
//! one of that region's replicas goes, preferring
//!
//! 1. not the leader (a removal of the leader costs an election),
//! 2. a replica on a member that is down,
//! 3. a replica sharing its zone with another replica of that region,
//! 4. then the most loaded node, then the highest node id.
//!
//! So three replicas in the home region and one in each of two others become one per region.
//! Where no removal can give region survival (the replicas span fewer than three regions, or
//! a replica's node is not listed) nothing is
//! removed and the result carries a warning: the goal is stored, every replica votes, and the
//! CLI says the shard does not survive a region yet. Only an explicit `--survive region`
//! removes anything; a home change alone keeps replicas.
//!
//! # Not done yet
//! The replicas outside the home region stay under zone survival, as learners (they serve
//! follower reads there); no goal asks for more than one of them per region.

use crate::admin::{ReplicaChange, Survival};
use crate::client::Client;
use crate::error::{Error, Result};
use meridian_proto::kv::{ShardInfo, StatusResponse};
use std::collections::{BTreeMap, BTreeSet};

/// Fewest replicas of a shard in its home region that zone survival accepts (the server's
/// `survival::ZONE_VOTERS`).
pub const ZONE_VOTERS: usize = 3;

/// The nodes that should get a replica of `shard` so that `home` holds [`ZONE_VOTERS`] of
/// them (see the module docs); empty if it does already.
pub fn zone_additions(status: &StatusResponse, shard: u64, home: &str) -> Result<Vec<u64>> {
    let info = shard_info(status, shard)?;
    let at_home: Vec<_> = status.nodes.iter().filter(|n| n.region == home).collect();
    let held: Vec<_> = at_home
        .iter()
        .filter(|n| info.replicas.contains(&n.node_id))
        .collect();
    let need = ZONE_VOTERS.saturating_sub(held.len());
    let mut zones: BTreeSet<&str> = held.iter().map(|n| n.zone.as_str()).collect();
    let load = replicas_per_node(status);
    let constraints = crate::constraint_plan::shard_constraints(info)?;
    let mut free: Vec<_> = at_home
        .iter()
        .filter(|n| n.live && !info.replicas.contains(&n.node_id))
        .filter(|n| crate::constraint_plan::allows(&constraints, n))
        .collect();
    if free.len() < need {
        return Err(Error::InvalidArgument {
            message: format!(
                "zone survival needs {ZONE_VOTERS} replicas of shard {shard} in {home}: it has {} \
                 and {} live member(s) there that its constraints ({constraints}) allow could \
                 take one; start more nodes in {home} (meridian start --join ... --region \
                 {home})",
                held.len(),
                free.len()
            ),
        });
    }
    let mut chosen = Vec::with_capacity(need);
    for _ in 0..need {
        let (i, _) = free
            .iter()
            .enumerate()
            .min_by_key(|(_, n)| {
                (
                    zones.contains(n.zone.as_str()),
                    load.get(&n.node_id).copied().unwrap_or(0),
                    n.node_id,
                )
            })
            .expect("enough free members, checked above");
        let node = free.remove(i);
        zones.insert(node.zone.as_str());
        chosen.push(node);
    }
    // The goal's voters: what is there plus the additions. A shard that has the goal in
    // this home already keeps it (the server answers "no change").
    let kept = info.survival == "zone" && info.home_region == home;
    let voters = held
        .iter()
        .chain(&chosen)
        .map(|n| (n.node_id, n.zone.as_str()));
    if let Some((zone, nodes)) = meridian_types::zones::crowded_zone(voters).filter(|_| !kept) {
        let fix = match chosen.is_empty() {
            // Nothing to add: the replicas there already crowd the zone.
            true => format!(
                "move one of them to a node of another zone in {home} (meridian cluster \
                 add-replica {shard} NODE, then remove-replica {shard} NODE)"
            ),
            false => format!(
                "the live members there that could take a replica are not in enough zones: \
                 start nodes in other zones of {home} (meridian start --join ... --region \
                 {home} --zone Z), or move a replica there that shares a zone"
            ),
        };
        return Err(Error::InvalidArgument {
            message: format!(
                "zone survival for shard {shard} in {home} would have voters {nodes:?} in zone \
                 {zone:?}, half or more of its {} there: losing that zone would stop its \
                 writes; {fix}",
                held.len() + chosen.len()
            ),
        });
    }
    Ok(chosen.iter().map(|n| n.node_id).collect())
}

/// How long [`Client::place`] waits, after storing region survival, for the shard's leader to
/// report every replica a voter before it removes any. The leader changes a shard's roles at
/// most once per ten `election_timeout_max` (30 s by default), and promotes a learner only
/// once it answers pings and has the leader's log.
pub const ALL_VOTING_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(120);

/// What [`Client::place`] did to a replica.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Move {
    /// A replica added in place of the one on node `instead`, which breaks the shard's
    /// constraints (`constraint_plan`).
    Obeying { instead: u64 },
    /// A replica that broke the shard's constraints, removed (its replacement was added).
    Breaking,
    /// A replica added for the goal.
    Added,
    /// A replica the goal no longer needs, removed.
    Removed,
}

/// What region survival asks of a shard's replicas, from its leader's status.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RegionPlan {
    /// Remove these replicas, in order (empty: none to remove).
    Remove(Vec<u64>),
    /// No removal gives the shard region survival (the reason); nothing is removed.
    Cannot(String),
}

/// The replicas of `shard` to remove so that no region holds half of them or more (see the
/// module docs), or why no removal can achieve that: the replicas span fewer than three
/// regions, or a replica's node is not in the status.
pub fn region_removals(status: &StatusResponse, shard: u64) -> Result<RegionPlan> {
    let info = shard_info(status, shard)?;
    let load = replicas_per_node(status);
    let node = |id: u64| status.nodes.iter().find(|n| n.node_id == id);
    let mut by_region: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
    for &r in &info.replicas {
        let Some(n) = node(r) else {
            return Ok(RegionPlan::Cannot(format!(
                "node {r} holds a replica but the cluster status does not list it"
            )));
        };
        by_region.entry(n.region.as_str()).or_default().push(r);
    }
    if by_region.len() < 3 {
        let regions: Vec<&str> = by_region.keys().copied().collect();
        return Ok(RegionPlan::Cannot(format!(
            "its replicas are in {} region(s) ({}); losing one of fewer than three regions \
             always loses a majority: add replicas in a third region",
            regions.len(),
            regions.join(", ")
        )));
    }
    let mut left = info.replicas.len();
    let mut removed = Vec::new();
    while left > 3 {
        let Some(crowded) = by_region
            .values_mut()
            .filter(|rs| rs.len() >= 2 && 2 * rs.len() >= left)
            .max_by_key(|rs| rs.len())
        else {
            break;
        };
        let zone = |id: u64| node(id).map(|n| n.zone.as_str());
        let shares_zone = |id: u64| {
            crowded
                .iter()
                .any(|&other| other != id && zone(other) == zone(id))
        };
        let (i, _) = crowded
            .iter()
            .enumerate()
            .max_by_key(|(_, &id)| {
                (
                    id != info.leader_id,
                    !node(id).is_some_and(|n| n.live),
                    shares_zone(id),
                    load.get(&id).copied().unwrap_or(0),
                    id,
                )
            })
            .expect("a crowded region has two replicas or more");
        removed.push(crowded.remove(i));
        left -= 1;
    }
    // With three regions or more the loop ends with no region holding half: at three
    // replicas left, each region holds one.
    Ok(RegionPlan::Remove(removed))
}

/// The shard `shard` as `status` lists it, or INVALID_ARGUMENT naming it.
pub(crate) fn shard_info(status: &StatusResponse, shard: u64) -> Result<&ShardInfo> {
    status
        .shards
        .iter()
        .find(|s| s.shard_id == shard)
        .ok_or_else(|| Error::InvalidArgument {
            message: format!("there is no shard {shard}"),
        })
}

/// The home and goal [`Client::place`] stores new constraints with, before any replica moves,
/// for a shard now as `info` says, asked to get `home` and `survival`: only the constraints
/// change, plus a move to region survival (always possible). A shard that has or gets zone
/// survival keeps its current home, which changes once the new one has its three replicas
/// (as without constraints); any other shard takes the new home at once.
pub fn constraints_first<'a>(
    info: &'a ShardInfo,
    home: Option<&'a str>,
    survival: Option<Survival>,
) -> (Option<&'a str>, Option<Survival>) {
    let zone = match survival {
        Some(goal) => goal == Survival::Zone,
        None => info.survival == Survival::Zone.as_str(),
    };
    let first_home = match zone {
        true => Some(info.home_region.as_str()).filter(|h| !h.is_empty()),
        false => home,
    };
    (
        first_home,
        survival.filter(|goal| *goal == Survival::Region),
    )
}

/// How many replicas (of every shard) each node holds, as `status` lists them.
pub(crate) fn replicas_per_node(status: &StatusResponse) -> BTreeMap<u64, usize> {
    let mut load: BTreeMap<u64, usize> = BTreeMap::new();
    for s in &status.shards {
        for r in &s.replicas {
            *load.entry(*r).or_default() += 1;
        }
    }
    load
}

/// What [`Client::place`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placed {
    /// The last shard map version written.
    pub map_version: u64,
    /// Why the shard does not have the goal's layout, when it was stored without it (region
    /// survival a removal cannot give; see [`RegionPlan::Cannot`]).
    pub warning: Option<String>,
}

impl Client {
    /// Sets `shard`'s home region, survival goal and replica constraints like
    /// [`Client::set_placement`], but moves replicas to match, calling `moved` after each
    /// addition or removal:
    /// 1. new `constraints` are stored first (with the new home, unless the shard has or gets
    ///    zone survival: its home changes in step 2; and with region survival if asked), then
    ///    each replica that breaks them is replaced (`constraint_plan`: add, then remove). A
    ///    failed plan leaves the constraints stored and nothing moved;
    /// 2. zone survival's missing home replicas are added, then the goal stored;
    /// 3. after an explicit region survival, the replicas it no longer needs are removed (see
    ///    the module docs).
    pub async fn place(
        &self,
        shard: u64,
        home_region: Option<&str>,
        survival: Option<Survival>,
        constraints: Option<&meridian_types::Constraints>,
        mut moved: impl FnMut(Move, u64, &ReplicaChange),
    ) -> Result<Placed> {
        if let Some(constraints) = constraints {
            let status = self.status().await?;
            let (first_home, first_goal) =
                constraints_first(shard_info(&status, shard)?, home_region, survival);
            self.set_placement(shard, first_home, first_goal, Some(constraints))
                .await?;
            let status = self.status().await?;
            let moves = crate::constraint_plan::constraint_moves(&status, shard, constraints)?;
            for step in moves {
                match self.add_replica(shard, step.to).await {
                    Ok(change) => moved(Move::Obeying { instead: step.from }, step.to, &change),
                    // A voter already (added meanwhile): only the removal is left.
                    Err(Error::InvalidArgument { message })
                        if message.contains("voter of shard") => {}
                    Err(e) => return Err(e),
                }
                let change = self.remove_replica(shard, step.from).await?;
                moved(Move::Breaking, step.from, &change);
            }
        }
        if let (Some(Survival::Zone), Some(home)) = (survival, home_region) {
            let mut status = self.status().await?;
            if let Some(constraints) = constraints {
                // The ones just stored, whatever the answering node has adopted yet.
                if let Some(info) = status.shards.iter_mut().find(|s| s.shard_id == shard) {
                    info.constraints = constraints.status_text();
                }
            }
            for node in zone_additions(&status, shard, home)? {
                let change = self.add_replica(shard, node).await?;
                moved(Move::Added, node, &change);
            }
        }
        let mut placed = Placed {
            map_version: self
                .set_placement(shard, home_region, survival, None)
                .await?,
            warning: None,
        };
        if survival != Some(Survival::Region) {
            return Ok(placed);
        }
        // One removal at a time, each planned from the leader's own view once every replica
        // votes: the leader may move between removals, and must never be removed.
        let started = std::time::Instant::now();
        let replicas = {
            let status = self.status().await?;
            shard_info(&status, shard)?.replicas.len()
        };
        for _ in 0..replicas {
            let status = self.all_voting(shard, started).await?;
            match region_removals(&status, shard)? {
                RegionPlan::Cannot(why) => {
                    placed.warning = Some(format!(
                        "shard {shard} cannot survive losing a region yet: {why}"
                    ));
                    break;
                }
                RegionPlan::Remove(nodes) => {
                    let Some(&node) = nodes.first() else {
                        break;
                    };
                    let change = self.remove_replica(shard, node).await?;
                    moved(Move::Removed, node, &change);
                    placed.map_version = placed.map_version.max(change.map_version);
                }
            }
        }
        Ok(placed)
    }

    /// The status of `shard`'s leader's node once it reports every replica of the shard a
    /// voter (no learner, not joint, voters = the map's replicas), waiting until
    /// [`ALL_VOTING_TIMEOUT`] after `started`: removing replicas while learners wait to be
    /// promoted would leave one or two voters.
    async fn all_voting(&self, shard: u64, started: std::time::Instant) -> Result<StatusResponse> {
        let mut last = String::from("no leader found");
        while started.elapsed() < ALL_VOTING_TIMEOUT {
            if let Some(status) = self.leader_status(shard).await {
                let seen = shard_info(&status, shard)?;
                let voters: BTreeSet<u64> = seen.voters.iter().copied().collect();
                let replicas: BTreeSet<u64> = seen.replicas.iter().copied().collect();
                if seen.learners.is_empty() && !seen.joint && voters == replicas {
                    return Ok(status);
                }
                last = format!(
                    "voters {:?} learners {:?}{}",
                    seen.voters,
                    seen.learners,
                    if seen.joint { " (joint)" } else { "" }
                );
            }
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
        Err(Error::Unavailable {
            message: format!(
                "shard {shard}'s replicas did not all become voters within \
                 {ALL_VOTING_TIMEOUT:?} ({last}); region survival is stored. A learner is \
                 promoted once it answers pings and has the leader's log: if its node is down, \
                 remove its replica (meridian cluster remove-replica); then run the command \
                 again to remove the replicas region survival does not need"
            ),
        })
    }

    /// The status of the node that leads `shard` by its own account: the replicas (from any
    /// node's map) are asked in turn, since a node without a replica names no leader.
    async fn leader_status(&self, shard: u64) -> Option<StatusResponse> {
        let status = self.status().await.ok()?;
        let info = shard_info(&status, shard).ok()?;
        let mut order: Vec<u64> = vec![info.leader_id];
        order.extend(info.replicas.iter().filter(|r| **r != info.leader_id));
        for id in order {
            let Some(node) = status.nodes.iter().find(|n| n.node_id == id && id != 0) else {
                continue;
            };
            let Ok(theirs) = self.node_status(&node.client_addr).await else {
                continue;
            };
            let leads = shard_info(&theirs, shard).is_ok_and(|s| s.leader_id == id);
            if leads {
                return Some(theirs);
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::status;

    const NODES: [(u64, &str, &str, bool); 7] = [
        (1, "us-east", "a", true),
        (2, "eu-west", "a", true),
        (3, "ap-south", "a", true),
        (4, "us-east", "a", true),
        (5, "us-east", "b", true),
        (6, "us-east", "c", true),
        (7, "us-east", "d", false),
    ];

    #[test]
    fn the_home_region_gets_replicas_in_new_zones_first() {
        let s = status(&NODES, &[(1, &[1, 2, 3]), (2, &[5, 2, 3])]);
        // Node 1 holds zone a: 5 (b, but loaded) and 6 (c) before 4 (a); 7 is down.
        assert_eq!(zone_additions(&s, 1, "us-east").unwrap(), vec![6, 5]);
        let s = status(&NODES, &[(1, &[1, 2, 3])]);
        assert_eq!(zone_additions(&s, 1, "us-east").unwrap(), vec![5, 6]);
        let s = status(&NODES, &[(1, &[1, 5, 6, 2])]);
        assert_eq!(zone_additions(&s, 1, "us-east").unwrap(), Vec::<u64>::new());
        // Constraints keep zone c out: only 4 (zone a, like node 1) is left beside 5, and two
        // voters of three in zone a do not survive losing it.
        let mut s = status(&NODES, &[(1, &[1, 2, 3])]);
        s.shards[0].constraints = "-zone=c".into();
        let e = zone_additions(&s, 1, "us-east").unwrap_err().to_string();
        assert!(e.contains("voters [1, 4] in zone \"a\""), "{e}");
        s.shards[0].constraints = "-zone=c,-zone=b".into();
        let e = zone_additions(&s, 1, "us-east").unwrap_err().to_string();
        assert!(
            e.contains("that its constraints (-zone=b,-zone=c) allow"),
            "{e}"
        );
    }

    #[test]
    fn new_constraints_are_stored_with_a_home_and_goal_the_shard_can_have_now() {
        let mut info = ShardInfo {
            shard_id: 1,
            home_region: "us-east".into(),
            survival: "zone".into(),
            ..Default::default()
        };
        let (region, zone) = (Some(Survival::Region), Some(Survival::Zone));
        // Zone survival, kept or asked: the current home until the new one has replicas.
        assert_eq!(
            constraints_first(&info, Some("eu-west"), None),
            (Some("us-east"), None)
        );
        assert_eq!(
            constraints_first(&info, Some("eu-west"), zone),
            (Some("us-east"), None)
        );
        // Leaving it: the new home (or none) with region survival, in one store.
        assert_eq!(
            constraints_first(&info, Some("eu-west"), region),
            (Some("eu-west"), region)
        );
        assert_eq!(constraints_first(&info, None, region), (None, region));
        // Region survival now: the new home at once, and zone survival only later.
        info.survival = "region".into();
        assert_eq!(
            constraints_first(&info, Some("eu-west"), None),
            (Some("eu-west"), None)
        );
        assert_eq!(
            constraints_first(&info, Some("eu-west"), zone),
            (Some("us-east"), None)
        );
        info.home_region = String::new();
        assert_eq!(
            constraints_first(&info, Some("eu-west"), zone),
            (None, None)
        );
    }

    #[test]
    fn a_plan_whose_voters_would_share_a_zone_is_refused_before_anything_moves() {
        // Node 1 (a) holds the shard; 4 (a) and 5 (b) are the only other live us-east members.
        let nodes = &NODES[..5];
        let s = status(nodes, &[(1, &[1, 2, 3])]);
        let e = zone_additions(&s, 1, "us-east").unwrap_err().to_string();
        assert!(
            e.contains("would have voters [1, 4] in zone \"a\", half or more of its 3 there"),
            "{e}"
        );
        // Three there already, two of them in zone a: nothing to add, still refused.
        let s = status(&NODES, &[(1, &[1, 4, 5, 2])]);
        let e = zone_additions(&s, 1, "us-east").unwrap_err().to_string();
        assert!(e.contains("voters [1, 4]"), "{e}");
        // Unless the shard has that goal there already (the server keeps it).
        let mut s = s;
        s.shards[0].survival = "zone".into();
        s.shards[0].home_region = "us-east".into();
        assert_eq!(zone_additions(&s, 1, "us-east").unwrap(), Vec::<u64>::new());
    }

    #[test]
    fn a_region_without_enough_live_members_fails_the_plan() {
        let s = status(&NODES, &[(1, &[1, 2, 3])]);
        let e = zone_additions(&s, 1, "eu-west").unwrap_err().to_string();
        assert!(e.contains("it has 1 and 0 live member(s)"), "{e}");
        let e = zone_additions(&s, 9, "us-east").unwrap_err().to_string();
        assert!(e.contains("no shard 9"), "{e}");
    }

    const SPREAD: [(u64, &str, &str, bool); 7] = [
        (1, "us-east", "a", true),
        (2, "eu-west", "a", true),
        (3, "ap-south", "a", true),
        (4, "us-east", "b", true),
        (5, "us-east", "c", true),
        (6, "us-east", "a", false),
        (7, "eu-west", "b", true),
    ];

    fn led_by(mut s: StatusResponse, leader: u64) -> StatusResponse {
        s.shards[0].leader_id = leader;
        s
    }

    fn removals(s: &StatusResponse) -> Vec<u64> {
        match region_removals(s, 1).unwrap() {
            RegionPlan::Remove(nodes) => nodes,
            RegionPlan::Cannot(why) => panic!("expected removals: {why}"),
        }
    }

    fn cannot(s: &StatusResponse) -> String {
        match region_removals(s, 1).unwrap() {
            RegionPlan::Cannot(why) => why,
            RegionPlan::Remove(nodes) => panic!("expected no plan, got removals {nodes:?}"),
        }
    }

    #[test]
    fn region_survival_leaves_one_replica_per_region_after_zone_survival() {
        // Three in us-east (1 leads), one in each other region: the two other us-east go.
        let s = led_by(status(&SPREAD, &[(1, &[1, 4, 5, 2, 3])]), 1);
        let mut gone = removals(&s);
        gone.sort_unstable();
        assert_eq!(gone, vec![4, 5]);
        // Node 4 leads: it stays; the down node 6 goes first, then the one sharing zone a (1).
        let s = led_by(status(&SPREAD, &[(1, &[1, 4, 6, 2, 3])]), 4);
        assert_eq!(removals(&s), vec![6, 1]);
        // Four replicas, two in us-east: losing us-east would leave two of four, no majority.
        let s = led_by(status(&SPREAD, &[(1, &[1, 4, 2, 3])]), 1);
        assert_eq!(removals(&s), vec![4]);
    }

    #[test]
    fn a_shard_that_survives_a_region_already_keeps_its_replicas() {
        for replicas in [&[1, 2, 3][..], &[1, 4, 2, 7, 3]] {
            assert_eq!(removals(&s_of(replicas)), Vec::<u64>::new(), "{replicas:?}");
        }
        let e = region_removals(&s_of(&[1, 2, 3]), 9)
            .unwrap_err()
            .to_string();
        assert!(e.contains("no shard 9"), "{e}");
    }

    fn s_of(replicas: &[u64]) -> StatusResponse {
        led_by(status(&SPREAD, &[(1, replicas)]), 1)
    }

    #[test]
    fn no_removal_is_planned_where_none_gives_region_survival() {
        // Two regions (3 + 2): no layout survives losing one; nothing is stripped.
        let why = cannot(&s_of(&[1, 4, 5, 2, 7]));
        assert!(why.contains("in 2 region(s) (eu-west, us-east)"), "{why}");
        assert!(cannot(&s_of(&[1, 4, 5])).contains("in 1 region(s)"));
        // Three replicas, two in us-east: two regions again (none is removed below three).
        let why = cannot(&s_of(&[1, 4, 2]));
        assert!(why.contains("in 2 region(s)"), "{why}");
        // A replica on a node the status does not list.
        let why = cannot(&s_of(&[1, 2, 3, 9]));
        assert!(why.contains("node 9 holds a replica"), "{why}");
    }
}
