//! Whether removing a replica would cost a shard its survival goal: the checks
//! `membership::remove_replica` makes before it changes a group.
//!
//! - **Zone survival** keeps the votes in the home region, so a removal there must leave
//!   `ZONE_VOTERS` replicas, and no zone of the home region may be left holding half of
//!   them or more (losing it would stop the writes).
//! - **Region survival** needs no region to hold so many replicas that the rest are no
//!   majority.
//!
//! The spread rules (zones at home, regions) are one check over groups
//! ([`needless_crowding`]): a removal that crowds a group is refused only when removing
//! another replica would not, and the live members its constraints allow could hold the
//! replicas spread; a removal that must crowd (a decommission of a group's only node, a dead
//! replica whose zone has no other node) goes ahead.
//!
//! All are pure (the caller gathers where each node is), and answer the refusal's text, which
//! names the fix: the replicas to remove instead, or where to add one first.
//!
//! # Not done yet
//! - Adds are not checked: a move adds before it removes, so a shard briefly holds two
//!   replicas in a region (or a zone) on purpose.

use meridian_types::NodeId;

/// Why removing `target`'s replica of `desc` would break its zone survival goal (fewer than
/// `ZONE_VOTERS` replicas left in its home region); `None` if it would not. `region_of`
/// gives a node's region.
pub(crate) fn zone_survival_refusal(
    desc: &crate::shard_map::ShardDescriptor,
    target: NodeId,
    region_of: impl Fn(NodeId) -> Option<String>,
) -> Option<String> {
    use crate::survival::{Survival, ZONE_VOTERS};
    let home = desc
        .home
        .as_deref()
        .filter(|_| desc.survival == Survival::Zone)?;
    let at_home = |id: &NodeId| region_of(*id).as_deref() == Some(home);
    if !desc.replicas.contains(&target) || !at_home(&target) {
        return None;
    }
    let left = desc.replicas.iter().filter(|id| at_home(id)).count() - 1;
    (left < ZONE_VOTERS).then(|| {
        format!(
            "shard {} has zone survival in {home}, which needs {ZONE_VOTERS} replicas there; \
             removing node {target}'s would leave {left}: add a replica in {home} first \
             (meridian cluster add-replica {} NODE), or change the goal (meridian cluster \
             placement {} --home {home} --survive region)",
            desc.id.0, desc.id.0, desc.id.0
        )
    })
}

/// Where a cluster member is, for the spread checks: its region, its zone, and whether it
/// could take a replica of the shard now (live, and allowed by the shard's constraints).
#[derive(Clone, Debug)]
pub(crate) struct Place {
    pub id: NodeId,
    pub region: String,
    pub zone: String,
    pub could: bool,
}

/// A removal that crowds one group (a region, or a zone of the home region) needlessly, as
/// [`needless_crowding`] finds it.
struct Crowding<'a> {
    /// Replicas left after the removal.
    n: usize,
    /// The fullest group left, and how many of the `n` it holds.
    worst: &'a str,
    count: usize,
    /// The replicas whose removal would leave no group crowded.
    instead: Vec<NodeId>,
    /// Groups with a member that could take a replica, holding none of the `n`.
    lacking: Vec<&'a str>,
}

/// Whether removing `target` from `replicas` leaves one group holding so many of them that
/// the rest are no majority without it (more than `ceil(n/2) - 1` of `n`), needlessly:
/// refused when both
/// - removing another of `replicas` would leave no group crowded (the removal picked the
///   wrong one: a move into a crowded group, a removal from a group held once), and
/// - the members other than `target` that could take a replica now could hold `n` replicas
///   uncrowded (each group up to the bound): otherwise nothing better exists (the removal of
///   a group's only node, whose replica must go elsewhere, or of a dead one).
///
/// So a step that makes nothing worse (already crowded, one of a two-step cleanup of extra
/// replicas) and a removal down to fewer than three replicas (which never survive losing a
/// group) go ahead. `members` are (node, its group, whether it could take a replica now); a
/// replica on a node not among them counts in a group of its own, "?".
fn needless_crowding<'a>(
    replicas: &[NodeId],
    target: NodeId,
    members: &'a [(NodeId, &'a str, bool)],
) -> Option<Crowding<'a>> {
    use std::collections::BTreeMap;
    if !replicas.contains(&target) {
        return None;
    }
    let group_of = |id: NodeId| {
        members
            .iter()
            .find(|(m, _, _)| *m == id)
            .map_or("?", |(_, g, _)| *g)
    };
    let n = replicas.len() - 1;
    let bound = n.div_ceil(2).saturating_sub(1);
    // Replicas per group without `without`'s.
    let held = |without: NodeId| {
        let mut held: BTreeMap<&str, usize> = BTreeMap::new();
        for id in replicas.iter().filter(|id| **id != without) {
            *held.entry(group_of(*id)).or_default() += 1;
        }
        held
    };
    let uncrowded = |without: NodeId| held(without).values().all(|c| *c <= bound);
    if bound == 0 || uncrowded(target) {
        return None;
    }
    let mut instead: Vec<NodeId> = replicas
        .iter()
        .copied()
        .filter(|id| *id != target && uncrowded(*id))
        .collect();
    instead.sort_unstable();
    let mut capacity: BTreeMap<&str, usize> = BTreeMap::new();
    for (_, group, _) in members
        .iter()
        .filter(|(id, _, could)| *id != target && *could)
    {
        *capacity.entry(group).or_default() += 1;
    }
    let placeable: usize = capacity.values().map(|c| (*c).min(bound)).sum();
    if instead.is_empty() || placeable < n {
        return None;
    }
    let left = held(target);
    let (worst, count) = left.iter().max_by_key(|(_, c)| **c)?;
    let lacking = capacity
        .keys()
        .copied()
        .filter(|g| !left.contains_key(g))
        .collect();
    Some(Crowding {
        n,
        worst,
        count: *count,
        instead,
        lacking,
    })
}

/// "node 1's or node 4's", for a refusal's text.
fn named(instead: &[NodeId]) -> String {
    let named: Vec<String> = instead.iter().map(|id| format!("node {id}'s")).collect();
    named.join(" or ")
}

/// Why removing `target`'s replica of `desc` would cost its region survival needlessly;
/// `None` if it would not. A shard survives losing a region when no region holds so many of
/// its replicas that the others are no majority without them (at most `ceil(n/2) - 1` of
/// `n`: one of three, two of five); the refusal is [`needless_crowding`]'s over regions.
pub(crate) fn region_survival_refusal(
    desc: &crate::shard_map::ShardDescriptor,
    target: NodeId,
    members: &[Place],
) -> Option<String> {
    use crate::survival::Survival;
    if desc.survival != Survival::Region {
        return None;
    }
    let groups: Vec<(NodeId, &str, bool)> = members
        .iter()
        .map(|m| (m.id, m.region.as_str(), m.could))
        .collect();
    let c = needless_crowding(&desc.replicas, target, &groups)?;
    let add = if c.lacking.is_empty() {
        String::new()
    } else {
        format!(
            ", or first add a replica in {} (meridian cluster add-replica {} NODE)",
            c.lacking.join(" or "),
            desc.id.0
        )
    };
    Some(format!(
        "removing node {target}'s replica of shard {} would leave {} with {} of its {} \
         replicas: losing {} would lose the shard (region survival). Remove {} replica \
         instead{add}",
        desc.id.0,
        c.worst,
        c.count,
        c.n,
        c.worst,
        named(&c.instead),
    ))
}

/// Why removing `target`'s replica of `desc` would crowd a zone of its home region
/// needlessly, under zone survival: the replicas left there (its voters) would have half or
/// more in one zone, so losing that zone would stop the shard's writes, when removing another
/// home replica would not and the home region's members that could take a replica could
/// hold them spread ([`needless_crowding`] over the home region's zones). `None` otherwise,
/// and for a replica outside the home (a learner).
pub(crate) fn zone_spread_refusal(
    desc: &crate::shard_map::ShardDescriptor,
    target: NodeId,
    members: &[Place],
) -> Option<String> {
    use crate::survival::Survival;
    let home = desc
        .home
        .as_deref()
        .filter(|_| desc.survival == Survival::Zone)?;
    let at_home: Vec<&Place> = members.iter().filter(|m| m.region == home).collect();
    let zones: Vec<(NodeId, &str, bool)> = at_home
        .iter()
        .map(|m| (m.id, m.zone.as_str(), m.could))
        .collect();
    let home_replicas: Vec<NodeId> = desc
        .replicas
        .iter()
        .copied()
        .filter(|id| at_home.iter().any(|m| m.id == *id))
        .collect();
    let c = needless_crowding(&home_replicas, target, &zones)?;
    let add = if c.lacking.is_empty() {
        String::new()
    } else {
        format!(
            ", or first add a replica on a node of {home} in zone {} (meridian cluster \
             add-replica {} NODE)",
            c.lacking.join(" or "),
            desc.id.0
        )
    };
    Some(format!(
        "removing node {target}'s replica of shard {} would leave zone {} with {} of its {} \
         replicas in {home}: losing that zone would stop its writes (zone survival). Remove \
         {} replica instead{add}",
        desc.id.0,
        c.worst,
        c.count,
        c.n,
        named(&c.instead),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shard_map::ShardMap;
    use crate::survival::Survival;

    fn place(id: NodeId, region: &str, zone: &str) -> Place {
        Place {
            id,
            region: region.into(),
            zone: zone.into(),
            could: true,
        }
    }

    #[test]
    fn a_removal_never_leaves_zone_survival_fewer_than_three_home_replicas() {
        let region_of = |id: NodeId| Some(if id <= 4 { "us-east" } else { "eu-west" }.to_string());
        let mut map = ShardMap::founding(&[], 0, &[], 1);
        let desc = &mut map.data[0];
        desc.replicas = vec![1, 2, 3, 5];
        desc.home = Some("us-east".into());
        assert_eq!(
            zone_survival_refusal(desc, 1, region_of),
            None,
            "region survival"
        );
        desc.survival = Survival::Zone;
        let e = zone_survival_refusal(desc, 1, region_of).unwrap();
        assert!(
            e.contains("would leave 2") && e.contains("add-replica 1 NODE"),
            "{e}"
        );
        assert_eq!(
            zone_survival_refusal(desc, 5, region_of),
            None,
            "a learner elsewhere"
        );
        assert_eq!(
            zone_survival_refusal(desc, 9, region_of),
            None,
            "not a replica"
        );
        desc.replicas.push(4);
        assert_eq!(
            zone_survival_refusal(desc, 1, region_of),
            None,
            "four at home"
        );
    }

    #[test]
    fn a_removal_that_crowds_a_home_zone_is_refused_only_when_another_would_not() {
        // us: nodes 1 and 4 in zone a, 2 and 6 in b, 3 in c; eu: node 5 (a learner).
        let mut six = vec![
            place(1, "us", "a"),
            place(2, "us", "b"),
            place(3, "us", "c"),
            place(4, "us", "a"),
            place(5, "eu", "a"),
            place(6, "us", "b"),
        ];
        let mut map = ShardMap::founding(&[], 0, &[], 1);
        let desc = &mut map.data[0];
        // Node 2's replica moving to node 4: the add is done, the wrong removal comes.
        desc.replicas = vec![1, 2, 3, 4, 5];
        desc.home = Some("us".into());
        assert_eq!(zone_spread_refusal(desc, 2, &six), None, "region survival");
        desc.survival = Survival::Zone;
        let e = zone_spread_refusal(desc, 2, &six).unwrap();
        assert!(
            e.contains("would leave zone a with 2 of its 3 replicas in us")
                && e.contains("Remove node 1's or node 4's replica instead")
                && e.contains("or first add a replica on a node of us in zone b"),
            "{e}"
        );
        assert_eq!(zone_spread_refusal(desc, 4, &six), None, "spread kept");
        assert_eq!(zone_spread_refusal(desc, 1, &six), None, "spread kept");
        assert_eq!(
            zone_spread_refusal(desc, 5, &six),
            None,
            "a learner elsewhere"
        );
        assert_eq!(zone_spread_refusal(desc, 9, &six), None, "not a replica");
        // Zone b's other node down (or barred by constraints), or absent: nothing could hold
        // three replicas spread without node 2 (a decommission of b's only node), so it goes.
        six[5].could = false;
        assert_eq!(zone_spread_refusal(desc, 2, &six), None);
        six.pop();
        assert_eq!(zone_spread_refusal(desc, 2, &six), None);
        // Already crowded (three in zone a): no removal spreads them, so none is refused.
        six.push(place(7, "us", "a"));
        six.push(place(8, "us", "c"));
        desc.replicas = vec![1, 4, 7, 2, 3, 5];
        assert_eq!(zone_spread_refusal(desc, 2, &six), None);
        // Five at home (zones a, a, b, c, c): any four of them have two in one zone, half of
        // four, so no removal keeps them spread and none is refused.
        desc.replicas = vec![1, 4, 2, 3, 8];
        assert_eq!(zone_spread_refusal(desc, 8, &six), None);
    }

    #[test]
    fn a_removal_that_costs_region_survival_is_refused_only_when_another_would_not() {
        // Each in zone "z", and could take a replica now.
        let members = |regions: &[(NodeId, &str)]| -> Vec<Place> {
            regions.iter().map(|(id, r)| place(*id, r, "z")).collect()
        };
        let mut map = ShardMap::founding(&[], 0, &[], 1);
        let desc = &mut map.data[0];
        // Nodes 1, 4 in us, 2, 5 in eu, 3 in ap; the shard's eu replica is moving to us.
        let five = members(&[(1, "us"), (2, "eu"), (3, "ap"), (4, "us"), (5, "eu")]);
        desc.replicas = vec![1, 2, 3, 4];
        let e = region_survival_refusal(desc, 2, &five).unwrap();
        assert!(
            e.contains("would leave us with 2 of its 3")
                && e.contains("Remove node 1's or node 4's replica instead")
                && e.contains("or first add a replica in eu"),
            "{e}"
        );
        assert_eq!(
            region_survival_refusal(desc, 4, &five),
            None,
            "removing the second us replica leaves one per region"
        );
        // No other member in eu that could take it (none, down, or barred by constraints):
        // nothing better exists (a decommission of eu's only node), so it goes ahead.
        let four = members(&[(1, "us"), (2, "eu"), (3, "ap"), (4, "us")]);
        assert_eq!(region_survival_refusal(desc, 2, &four), None);
        let mut down = five.clone();
        down[4].could = false;
        assert_eq!(region_survival_refusal(desc, 2, &down), None);
        // One region only, or two replicas left: no placement survives a region anyway.
        let one = members(&[(1, "us"), (2, "us"), (3, "us"), (4, "us")]);
        assert_eq!(region_survival_refusal(desc, 2, &one), None);
        desc.replicas = vec![1, 2, 3];
        assert_eq!(region_survival_refusal(desc, 2, &five), None, "two left");
        // Already crowded ([us, us, eu] plus a fourth us replica): no removal survives a
        // region, so none is refused, though ap could take a replica.
        desc.replicas = vec![1, 4, 2, 6];
        let crowded = members(&[(1, "us"), (2, "eu"), (3, "ap"), (4, "us"), (6, "us")]);
        assert_eq!(region_survival_refusal(desc, 1, &crowded), None);
        // Four regions, a cleanup of extra us replicas in two steps: the first leaves 2 of 4
        // in us, which no removal avoids, so it goes ahead.
        let spread = members(&[
            (1, "us"),
            (2, "eu"),
            (3, "ap"),
            (4, "us"),
            (5, "us"),
            (6, "sa"),
        ]);
        desc.replicas = vec![1, 4, 5, 2, 3];
        assert_eq!(region_survival_refusal(desc, 5, &spread), None);
        // Five replicas (from six): two per region at most.
        let many = members(&[
            (1, "us"),
            (2, "us"),
            (3, "us"),
            (4, "eu"),
            (5, "eu"),
            (6, "ap"),
            (7, "ap"),
        ]);
        desc.replicas = vec![1, 2, 3, 4, 6, 7];
        let e = region_survival_refusal(desc, 7, &many).unwrap();
        assert!(
            e.contains("us with 3 of its 5")
                && e.contains("Remove node 1's or node 2's or node 3's replica instead")
                && !e.contains("first add"),
            "{e}"
        );
        assert_eq!(region_survival_refusal(desc, 1, &many), None);
        assert_eq!(
            region_survival_refusal(desc, 9, &many),
            None,
            "not a replica"
        );
        // Zone survival keeps its votes at home on purpose: not this check's business.
        desc.replicas = vec![1, 2, 3, 4];
        desc.home = Some("us".into());
        desc.survival = Survival::Zone;
        assert_eq!(region_survival_refusal(desc, 2, &five), None);
    }
}
