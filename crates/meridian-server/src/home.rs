//! Home regions: which region should lead each key range.
//!
//! A shard whose replicas sit in three regions commits a write after a round trip from its
//! leader to the nearest other replica; a client in the leader's region pays that, a client
//! elsewhere pays its own trip to the leader on top. Data mostly used from one region should
//! therefore be *led* from there. `cluster.home_regions` (flag `--home-regions`) lists rules
//! `<start key>=<region>`: keys from the start key up to the next rule's start key have that
//! home region. A shard takes the home of the rule covering its start key; keys before the
//! first rule have none (their leaders stay spread over the cluster).
//!
//! ```toml
//! [cluster]
//! home_regions = ["=us-east", "user5=eu-west", "user7=ap-south"]
//! ```
//!
//! What a home does:
//! - **Placement**: the shard's first replica in placement order (the one that bootstraps the
//!   group, so usually its first leader) is a node of the home region, if one holds a replica.
//! - **Leaders follow** (`leader_follow`): a node leading a shard from outside its home hands
//!   leadership to a caught-up voter in the home region with openraft's cooperative
//!   `transfer_leader`, rate-limited, so after a failover the leader returns home once the
//!   home replica is back.
//! - **Elections lean home** (`election_bias`): a replica outside the home does not start
//!   elections while a voter of the home region other than the last leader is live.
//!
//! **At run time** ([`set_placement`], `Cluster.SetPlacement`, `meridian cluster placement
//! SHARD --home REGION|none [--survive region|zone] [--constraints TEXT|none]`) a shard's
//! home (and its survival goal, see `survival`, and replica constraints, see `constraints`)
//! changes: the stored shard map (`shard_map_store`)
//! holds each shard's home, so the change is a compare-and-swap to the map's next version,
//! pushed to every member like a replica move; each node's leader-follow loop reads the map
//! it holds on every round, so the leader moves within a few election timeouts. The
//! configuration's rules are founding values: once the map changed, a restarted node takes
//! the stored homes, whatever its `home_regions` say (a founding map must still match them).
//!
//! # Invariants
//! - Rules are sorted by start key, start keys are distinct, and every region names a region of
//!   some founding member (checked at startup: a typo fails with the field named).
//! - Every founding member must be given the same rules, as with `initial_cluster`; members
//!   that disagree place and move leaders differently, which costs transfers but never safety
//!   (Raft elects whoever it elects; a transfer is only a hint).
//! - A home set at run time is a region where the shard map lists a replica at that moment
//!   (possibly a learner still catching up: leadership follows only once it votes; a later
//!   move may take it away: the home is then kept, and nothing follows it until a voter is
//!   there again).
//!
//! # Not done yet
//! - A survival goal (`survival`: zone survival keeps the votes in the home region) decides
//!   who votes among the replicas a shard has, and constraints (`constraints`) who may hold
//!   them; founding placement ignores the home beyond the first replica (and zone survival's
//!   three). Followers outside the home leave
//!   elections to a live home voter (`election_bias`) only when the home region has a voter
//!   besides the last leader.
//! - A home is per shard (ranges never split), not per key range independent of shards.

use crate::config::{ConfigError, Member};
use crate::error::ServerError;
use crate::node::Node;
use crate::shard_map::ShardMap;
use crate::survival::Survival;
use meridian_types::{Constraints, NodeId, ShardId};

/// Keys from `start` (inclusive) to the next rule's start have `region` as home, and shards
/// starting there the survival goal `survival` (`<start>=<region>:zone`; see `survival`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HomeRule {
    pub start: Vec<u8>,
    pub region: String,
    pub survival: Survival,
}

/// Parses and checks `cluster.home_regions` against the founding members' regions.
pub fn parse_home_regions(
    raw: &[String],
    members: &[Member],
) -> Result<Vec<HomeRule>, ConfigError> {
    let mut rules: Vec<HomeRule> = Vec::with_capacity(raw.len());
    for (i, entry) in raw.iter().enumerate() {
        let field = format!("cluster.home_regions[{i}]");
        let fail = |message: String| ConfigError {
            field: field.clone(),
            message,
        };
        let (start, placement) = entry.rsplit_once('=').ok_or_else(|| {
            fail(format!(
                "{entry:?} is not of the form <start key>=<region>[:zone|:region]"
            ))
        })?;
        let (region, survival) = match placement.split_once(':') {
            Some((_, goal)) if goal.trim().is_empty() => {
                return Err(fail(format!(
                    "{entry:?} ends in ':' with no survival goal (zone or region)"
                )))
            }
            Some((region, goal)) => (region, Survival::parse(goal.trim()).map_err(fail)?),
            None => (placement, Survival::Region),
        };
        let region = region.trim();
        if region.is_empty() {
            return Err(fail(format!("{entry:?} names no region")));
        }
        if !members.iter().any(|m| m.region == region) {
            let mut known: Vec<&str> = members.iter().map(|m| m.region.as_str()).collect();
            known.sort_unstable();
            known.dedup();
            return Err(fail(format!(
                "region {region:?} has no founding member (regions: {})",
                known.join(", ")
            )));
        }
        let there = members.iter().filter(|m| m.region == region).count();
        if survival == Survival::Zone && there < crate::survival::ZONE_VOTERS {
            return Err(fail(format!(
                "zone survival needs {} founding members in {region:?} to survive losing one, \
                 and it has {there}",
                crate::survival::ZONE_VOTERS
            )));
        }
        if rules.iter().any(|r| r.start == start.as_bytes()) {
            return Err(fail(format!("start key {start:?} is listed twice")));
        }
        rules.push(HomeRule {
            start: start.as_bytes().to_vec(),
            region: region.to_string(),
            survival,
        });
    }
    rules.sort_by(|a, b| a.start.cmp(&b.start));
    Ok(rules)
}

/// Parses and checks `cluster.home_regions` and `cluster.replica_constraints` together (a
/// home the constraints exclude is refused; see `constraints::check_homes`).
pub fn parse_rules(
    cluster: &crate::config::ClusterSection,
    members: &[Member],
) -> Result<(Vec<HomeRule>, Vec<crate::constraints::ConstraintRule>), ConfigError> {
    let homes = parse_home_regions(&cluster.home_regions, members)?;
    let rules = crate::constraints::parse_rules(
        &cluster.replica_constraints,
        members,
        cluster.replication_factor as usize,
    )?;
    crate::constraints::check_homes(&homes, &rules, members)?;
    Ok((homes, rules))
}

/// The rule for a shard starting at `start`: the last one starting at or before it.
pub fn rule_of<'r>(rules: &'r [HomeRule], start: &[u8]) -> Option<&'r HomeRule> {
    let idx = rules.partition_point(|r| r.start.as_slice() <= start);
    idx.checked_sub(1).map(|i| &rules[i])
}

/// The home region of a shard starting at `start` (see [`rule_of`]).
pub fn home_of<'r>(rules: &'r [HomeRule], start: &[u8]) -> Option<&'r str> {
    rule_of(rules, start).map(|r| r.region.as_str())
}

/// The next version of `map` with data shard `shard` homed in `region` (`None`: no home),
/// with survival goal `survival` and replica constraints `constraints` (`None`: the shard's
/// current ones; see `survival`, `constraints`). `Ok(None)` if it has that placement
/// already; an error for an unknown or metadata shard, a region where none of the shard's
/// replicas is, a survival goal the shard cannot have there (zone survival with fewer than
/// three replicas there, or, when the goal or the home is new, with one zone holding half of
/// them or more), or constraints that `members` (the cluster's now) cannot satisfy or that
/// exclude the home.
pub fn with_placement(
    map: &ShardMap,
    shard: ShardId,
    region: Option<&str>,
    survival: Option<Survival>,
    constraints: Option<&Constraints>,
    members: &[Member],
) -> std::result::Result<Option<ShardMap>, String> {
    let region_of = |id: NodeId| {
        members
            .iter()
            .find(|m| m.node_id == id)
            .map(|m| m.region.clone())
    };
    if shard == ShardId::META {
        return Err("shard 0 is the metadata shard; only data shards have a home region".into());
    }
    let Some(idx) = map.data.iter().position(|d| d.id == shard) else {
        let ids: Vec<String> = map.data.iter().map(|d| d.id.0.to_string()).collect();
        return Err(format!(
            "there is no data shard {} (data shards: {})",
            shard.0,
            ids.join(", ")
        ));
    };
    let desc = &map.data[idx];
    let survival = survival.unwrap_or(desc.survival);
    let constraints = constraints.unwrap_or(&desc.constraints);
    if desc.home.as_deref() == region
        && desc.survival == survival
        && &desc.constraints == constraints
    {
        return Ok(None);
    }
    if let Some(region) = region {
        let placed: Vec<(NodeId, Option<String>)> = desc
            .replicas
            .iter()
            .map(|id| (*id, region_of(*id)))
            .collect();
        if !placed.iter().any(|(_, r)| r.as_deref() == Some(region)) {
            let listed: Vec<String> = placed
                .iter()
                .map(|(id, r)| format!("node {id} in {}", r.as_deref().unwrap_or("?")))
                .collect();
            return Err(format!(
                "shard {} has no replica in region {region:?} ({}); move one there first \
                 (meridian cluster add-replica {} NODE)",
                shard.0,
                listed.join(", "),
                shard.0
            ));
        }
    }
    if let Some(why) = crate::survival::refusal(desc, survival, region, region_of) {
        return Err(match (region, desc.survival) {
            (None, Survival::Zone) => format!(
                "shard {} has zone survival, which needs a home region: clear both \
                 (--home none --survive region)",
                shard.0
            ),
            _ => why,
        });
    }
    let newly_zone = desc.survival != Survival::Zone || desc.home.as_deref() != region;
    if newly_zone {
        let place_of = place_in(members);
        if let Some(why) = crate::survival::crowded_zone_refusal(desc, survival, region, place_of) {
            return Err(why);
        }
    }
    crate::constraints::check_placement(desc, constraints, region, survival, members)?;
    let mut next = map.clone();
    next.data[idx].home = region.map(str::to_string);
    next.data[idx].survival = survival;
    next.data[idx].constraints = constraints.clone();
    next.version += 1;
    Ok(Some(next))
}

/// A node's (region, zone) among `members`.
fn place_in(members: &[Member]) -> impl Fn(NodeId) -> Option<(String, String)> + Copy + '_ {
    move |id| {
        members
            .iter()
            .find(|m| m.node_id == id)
            .map(|m| (m.region.clone(), m.zone.clone()))
    }
}

/// Why the founding map `map` cannot be founded: a data shard with zone survival whose
/// replicas in its home region (as founding placement put them) have half or more in one zone,
/// so losing that zone would stop its writes (`meridian_types::zones`). Asked only on a
/// founding member's first start (its data dir has no cluster id yet, and it does not join):
/// a cluster founded by an older binary, which did not check, keeps starting and taking
/// joiners; a founding member of such a cluster restarted on an empty data dir is refused.
pub fn crowded_founding_zones(map: &ShardMap, members: &[Member]) -> Option<String> {
    let place_of = place_in(members);
    let mut zoned = map.data.iter().filter(|d| d.survival == Survival::Zone);
    zoned.find_map(|desc| {
        let home = desc.home.as_deref()?;
        let (zone, nodes, there) = crate::survival::crowded_home_zone(desc, home, place_of)?;
        Some(format!(
            "cluster.home_regions: shard {} (keys from {:?}) would be founded with zone survival \
             in {home}, and {} of its {there} replicas there are in zone {zone:?} (nodes \
             {nodes:?}): losing that zone would stop its writes. Give the founding members in \
             {home} distinct zones (id=addr@region/zone in initial_cluster; a member without one \
             is in zone \"default\"), or drop \":zone\" from the rule",
            desc.id.0,
            String::from_utf8_lossy(&desc.start),
            nodes.len(),
        ))
    })
}

/// Logs a warning for each shard whose home (or replica constraints) in `current` (a stored
/// map, changed at run time) differs from the one this node's `home_regions`
/// (`replica_constraints`) give (`founding`): the stored one applies.
pub fn warn_overridden_homes(founding: &ShardMap, current: &ShardMap) {
    for (ours, stored) in founding.data.iter().zip(&current.data) {
        if ours.id == stored.id && ours.constraints != stored.constraints {
            tracing::warn!(
                shard = ours.id.0,
                stored = %stored.constraints,
                configured = %ours.constraints,
                "the shard map's replica constraints (set by meridian cluster placement) differ \
                 from this node's replica_constraints; the shard map's apply"
            );
        }
        if ours.id == stored.id && (&ours.home, ours.survival) != (&stored.home, stored.survival) {
            tracing::warn!(
                shard = ours.id.0,
                stored = stored.home.as_deref().unwrap_or("none"),
                stored_survival = stored.survival.as_str(),
                configured = ours.home.as_deref().unwrap_or("none"),
                configured_survival = ours.survival.as_str(),
                "the shard map's home region (set by meridian cluster placement) differs from \
                 this node's home_regions; the shard map's applies"
            );
        }
    }
}

/// Serves a `Cluster.SetPlacement`: stores shard `shard`'s new home and survival goal
/// (`None`: unchanged) in the shard map and tells every member. Returns the map version that
/// holds them.
pub async fn set_placement(
    node: &Node,
    shard: ShardId,
    region: Option<String>,
    survival: Option<Survival>,
    constraints: Option<Constraints>,
) -> crate::error::Result<u64> {
    let version = crate::membership::change_map(node, |map| {
        with_placement(
            map,
            shard,
            region.as_deref(),
            survival,
            constraints.as_ref(),
            &node.members_now(),
        )
        .map_err(ServerError::InvalidArgument)
    })
    .await?;
    tracing::info!(%shard, home = region.as_deref().unwrap_or("none"), survival = ?survival, constraints = ?constraints.map(|c| c.to_string()), version, "set a shard's placement");
    Ok(version)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn members() -> Vec<Member> {
        [
            "1=127.0.0.1:1@us-east/a",
            "2=127.0.0.1:2@eu-west/a",
            "3=127.0.0.1:3@ap-south/a",
        ]
        .iter()
        .map(|s| Member::parse(s).unwrap())
        .collect()
    }

    fn raw(entries: &[&str]) -> Vec<String> {
        entries.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn rules_cover_from_their_start_to_the_next() {
        let rules = parse_home_regions(
            &raw(&["user5=eu-west", "=us-east", "user7=ap-south"]),
            &members(),
        )
        .unwrap();
        assert_eq!(home_of(&rules, b""), Some("us-east"));
        assert_eq!(home_of(&rules, b"user4999"), Some("us-east"));
        assert_eq!(home_of(&rules, b"user5"), Some("eu-west"));
        assert_eq!(home_of(&rules, b"user6"), Some("eu-west"));
        assert_eq!(home_of(&rules, b"user7"), Some("ap-south"));
        assert_eq!(home_of(&rules, b"zzz"), Some("ap-south"));
        let partial = parse_home_regions(&raw(&["m=eu-west"]), &members()).unwrap();
        assert_eq!(
            home_of(&partial, b"a"),
            None,
            "keys before the first rule have no home"
        );
        assert_eq!(home_of(&[], b"a"), None);
    }

    #[test]
    fn a_rule_may_name_a_survival_goal() {
        let mut members = members();
        for m in ["4=127.0.0.1:4@us-east/b", "5=127.0.0.1:5@us-east/c"] {
            members.push(Member::parse(m).unwrap());
        }
        let rules = parse_home_regions(
            &raw(&["=us-east:zone", "m=eu-west:region", "t=ap-south"]),
            &members,
        )
        .unwrap();
        let goals: Vec<(&str, Survival)> = rules
            .iter()
            .map(|r| (r.region.as_str(), r.survival))
            .collect();
        assert_eq!(
            goals,
            [
                ("us-east", Survival::Zone),
                ("eu-west", Survival::Region),
                ("ap-south", Survival::Region)
            ]
        );
        assert_eq!(rule_of(&rules, b"a").unwrap().survival, Survival::Zone);
    }

    #[test]
    fn bad_rules_name_their_field() {
        let cases = [
            (raw(&["eu-west"]), "is not of the form"),
            (raw(&["a="]), "names no region"),
            (raw(&["a=mars"]), "has no founding member"),
            (raw(&["a=eu-west", "a=us-east"]), "listed twice"),
            (raw(&["a=eu-west:zones"]), "unknown survival goal \"zones\""),
            (raw(&["a=eu-west:"]), "with no survival goal"),
            (
                raw(&["a=eu-west:zone"]),
                "zone survival needs 3 founding members in \"eu-west\"",
            ),
        ];
        for (entries, want) in cases {
            let e = parse_home_regions(&entries, &members()).unwrap_err();
            assert!(e.field.starts_with("cluster.home_regions["), "{e}");
            assert!(e.message.contains(want), "{entries:?}: {e}");
        }
    }

    #[test]
    fn a_founding_map_whose_zone_survival_home_replicas_share_a_zone_is_refused() {
        let founded = |extra: &[&str], rf: usize| {
            let mut members = members();
            members.extend(extra.iter().map(|m| Member::parse(m).unwrap()));
            let rules = parse_home_regions(&raw(&["=us-east:zone"]), &members).unwrap();
            let map = ShardMap::founding(&members, rf, &[], 1).with_homes(&rules, &members);
            crowded_founding_zones(&map, &members)
        };
        // us-east: 1 in a, 4 and 5 in b.
        let b = ["4=127.0.0.1:4@us-east/b", "5=127.0.0.1:5@us-east/b"];
        let e = founded(&b, 3).unwrap();
        assert!(
            e.contains("shard 1 (keys from \"\")")
                && e.contains("2 of its 3 replicas there are in zone \"b\" (nodes [4, 5])"),
            "{e}"
        );
        assert_eq!(
            founded(&["4=127.0.0.1:4@us-east/b", "5=127.0.0.1:5@us-east/c"], 3),
            None
        );
        // Five replicas, four of them in us-east (a, a, b, c): two of four in zone a.
        let wide = [
            "4=127.0.0.1:4@us-east/b",
            "5=127.0.0.1:5@us-east/c",
            "6=127.0.0.1:6@us-east/a",
        ];
        let e = founded(&wide[..], 6).unwrap();
        assert!(
            e.contains("2 of its 4 replicas there are in zone \"a\""),
            "{e}"
        );
    }

    #[test]
    fn a_home_changes_only_to_a_region_holding_a_replica() {
        let members = members();
        let region_of = |id: NodeId| {
            members
                .iter()
                .find(|m| m.node_id == id)
                .map(|m| m.region.clone())
        };
        let map = ShardMap::founding(&members, 2, &[], 3);
        let shard = &map.data[0];
        let held = region_of(shard.replicas[0]).unwrap();
        let missing = ["us-east", "eu-west", "ap-south"]
            .into_iter()
            .find(|r| {
                !shard
                    .replicas
                    .iter()
                    .any(|id| region_of(*id).as_deref() == Some(r))
            })
            .unwrap();

        let next = with_placement(&map, shard.id, Some(&held), None, None, &members)
            .unwrap()
            .unwrap();
        assert_eq!(next.version, map.version + 1);
        assert_eq!(next.data[0].home.as_deref(), Some(held.as_str()));
        assert_eq!(
            next.data[0].replicas, shard.replicas,
            "replicas stay as they were"
        );
        assert!(next.same_layout(&map), "a home is not part of the layout");
        assert_eq!(
            with_placement(&next, shard.id, Some(&held), None, None, &members),
            Ok(None)
        );
        let cleared = with_placement(&next, shard.id, None, None, None, &members)
            .unwrap()
            .unwrap();
        assert_eq!(cleared.data[0].home, None);
        assert_eq!(cleared.version, map.version + 2);

        let e = with_placement(&map, shard.id, Some(missing), None, None, &members).unwrap_err();
        assert!(
            e.contains("has no replica in region") && e.contains("add-replica"),
            "{e}"
        );
        let e = with_placement(&map, ShardId::META, Some(&held), None, None, &members).unwrap_err();
        assert!(e.contains("metadata shard"), "{e}");
        let e = with_placement(&map, ShardId(99), None, None, None, &members).unwrap_err();
        assert!(e.contains("no data shard 99"), "{e}");
    }

    #[test]
    fn zone_survival_is_set_with_a_home_and_cleared_with_it() {
        let mut members = members();
        for (id, zone) in [(4, "b"), (5, "c")] {
            members.push(Member::parse(&format!("{id}=127.0.0.1:{id}@us-east/{zone}")).unwrap());
        }
        let map = ShardMap::founding(&members, 5, &[], 2);
        let shard = map.data[0].id;
        let zone = Some(Survival::Zone);
        let e = with_placement(&map, shard, None, zone, None, &members).unwrap_err();
        assert!(e.contains("--home"), "{e}");
        let e = with_placement(&map, shard, Some("eu-west"), zone, None, &members).unwrap_err();
        assert!(e.contains("needs 3 replicas"), "{e}");
        let zoned = with_placement(&map, shard, Some("us-east"), zone, None, &members)
            .unwrap()
            .unwrap();
        assert_eq!(zoned.data[0].survival, Survival::Zone);
        // Moving the home keeps the goal, so it must hold there too.
        let e = with_placement(&zoned, shard, Some("eu-west"), None, None, &members).unwrap_err();
        assert!(e.contains("needs 3 replicas"), "{e}");
        let e = with_placement(&zoned, shard, None, None, None, &members).unwrap_err();
        assert!(e.contains("--home none --survive region"), "{e}");
        let cleared = with_placement(&zoned, shard, None, Some(Survival::Region), None, &members)
            .unwrap()
            .unwrap();
        assert_eq!(
            (cleared.data[0].home.as_deref(), cleared.data[0].survival),
            (None, Survival::Region)
        );
        assert_eq!(
            with_placement(&zoned, shard, Some("us-east"), zone, None, &members),
            Ok(None)
        );
    }

    #[test]
    fn zone_survival_is_refused_while_home_replicas_share_a_zone() {
        let mut members = members();
        for m in ["4=127.0.0.1:4@us-east/a", "5=127.0.0.1:5@us-east/c"] {
            members.push(Member::parse(m).unwrap());
        }
        let mut map = ShardMap::founding(&members, 5, &[], 1);
        let shard = map.data[0].id;
        let zone = Some(Survival::Zone);
        // Nodes 1 and 4 are both in zone a: losing it leaves node 5 alone, no majority.
        let e = with_placement(&map, shard, Some("us-east"), zone, None, &members).unwrap_err();
        assert!(
            e.contains("2 of its 3 replicas there share zone \"a\" (nodes [1, 4])")
                && e.contains("add-replica 1 NODE")
                && e.contains("remove-replica 1 NODE"),
            "{e}"
        );
        // A fourth in zone b is not enough (two of four in a), removing node 4 then is.
        members.push(Member::parse("6=127.0.0.1:6@us-east/b").unwrap());
        map.data[0].replicas.push(6);
        let e = with_placement(&map, shard, Some("us-east"), zone, None, &members).unwrap_err();
        assert!(e.contains("2 of its 4 replicas"), "{e}");
        map.data[0].replicas.retain(|id| *id != 4);
        let zoned = with_placement(&map, shard, Some("us-east"), zone, None, &members)
            .unwrap()
            .unwrap();
        // A shard that has the goal keeps it through other changes, crowded or not.
        let mut crowded = zoned.clone();
        crowded.data[0].replicas.push(4);
        members.push(Member::parse("7=127.0.0.1:7@eu-west/z").unwrap());
        let c = Constraints::parse("-zone=z").unwrap();
        let changed = with_placement(&crowded, shard, Some("us-east"), None, Some(&c), &members)
            .unwrap()
            .unwrap();
        assert_eq!(changed.data[0].constraints, c);
        // Region survival does not look at zones.
        assert!(with_placement(
            &crowded,
            shard,
            None,
            Some(Survival::Region),
            None,
            &members
        )
        .unwrap()
        .is_some());
    }
}
