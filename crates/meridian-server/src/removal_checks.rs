//! Whether removing a replica would cost a shard its survival goal: the checks
//! `membership::remove_replica` makes before it changes a group.
//!
//! - **Zone survival** keeps the votes in the home region, so a removal there must leave
//!   `ZONE_VOTERS` replicas.
//! - **Region survival** needs no region to hold so many replicas that the rest are no
//!   majority; a removal that would leave that is refused when removing another replica
//!   would not, and the live members its constraints allow could hold the replicas that way.
//!
//! Both are pure (the caller gathers where each node is), and answer the refusal's text, which
//! names the fix: the replicas to remove instead, or where to add one first.
//!
//! # Not done yet
//! - Adds are not checked: a move adds before it removes, so a shard briefly holds two
//!   replicas in a region on purpose.
//! - Zone survival's zones are not checked here: a removal may leave half of the home
//!   replicas or more in one zone. Refusing it would need the members that could hold the
//!   replicas instead (a decommission of a zone's only node, a dead replica's removal must
//!   still go ahead) and a decommission planner that picks new zones first.

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

/// Why removing `target`'s replica of `desc` would cost its region survival needlessly;
/// `None` if it would not. `members` are the cluster's members as (id, region, whether it
/// could take a replica now: live and allowed by the shard's replica constraints).
///
/// A shard survives losing a region when no region holds so many of its replicas that the
/// others are no majority without them: at most `ceil(n/2) - 1` of `n` in any region (one
/// of three, two of five). The removal is refused when the replicas it leaves break that
/// while both
/// - removing another of the shard's replicas would leave them surviving a region (the
///   removal picked the wrong one: a move into a crowded region, a remove from a region the
///   shard holds once), and
/// - the members other than `target` that could take a replica now could hold `n` replicas
///   that way (each region up to the bound), so the shard could survive a region without
///   `target`: otherwise nothing better exists (a decommission of a region's only node, whose
///   replica must go to another region).
///
/// So a step that makes nothing worse (a shard already crowded, one of a two-step cleanup of
/// extra replicas) and a removal down to fewer than three replicas (which never survive a
/// region) are allowed.
pub(crate) fn region_survival_refusal(
    desc: &crate::shard_map::ShardDescriptor,
    target: NodeId,
    members: &[(NodeId, String, bool)],
) -> Option<String> {
    use crate::survival::Survival;
    use std::collections::BTreeMap;
    if desc.survival != Survival::Region || !desc.replicas.contains(&target) {
        return None;
    }
    let region_of = |id: NodeId| {
        members
            .iter()
            .find(|(m, _, _)| *m == id)
            .map_or("?", |(_, r, _)| r.as_str())
    };
    let n = desc.replicas.len() - 1;
    let bound = n.div_ceil(2).saturating_sub(1);
    // Replicas per region without `without`'s.
    let held = |without: NodeId| {
        let mut held: BTreeMap<&str, usize> = BTreeMap::new();
        for id in desc.replicas.iter().filter(|id| **id != without) {
            *held.entry(region_of(*id)).or_default() += 1;
        }
        held
    };
    let survives = |without: NodeId| held(without).values().all(|c| *c <= bound);
    if bound == 0 || survives(target) {
        return None;
    }
    let instead: Vec<NodeId> = desc
        .replicas
        .iter()
        .copied()
        .filter(|id| *id != target && survives(*id))
        .collect();
    let mut capacity: BTreeMap<&str, usize> = BTreeMap::new();
    for (_, region, _) in members
        .iter()
        .filter(|(id, _, could)| *id != target && *could)
    {
        *capacity.entry(region.as_str()).or_default() += 1;
    }
    let placeable: usize = capacity.values().map(|c| (*c).min(bound)).sum();
    if instead.is_empty() || placeable < n {
        return None;
    }
    let left = held(target);
    let (worst, count) = left.iter().max_by_key(|(_, c)| **c)?;
    let lacking: Vec<&str> = capacity
        .keys()
        .copied()
        .filter(|r| !left.contains_key(r))
        .collect();
    let instead: Vec<String> = instead.iter().map(|id| format!("node {id}'s")).collect();
    let add = if lacking.is_empty() {
        String::new()
    } else {
        format!(
            ", or first add a replica in {} (meridian cluster add-replica {} NODE)",
            lacking.join(" or "),
            desc.id.0
        )
    };
    Some(format!(
        "removing node {target}'s replica of shard {} would leave {worst} with {count} of its \
         {n} replicas: losing {worst} would lose the shard (region survival). Remove {} \
         replica instead{add}",
        desc.id.0,
        instead.join(" or "),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shard_map::ShardMap;
    use crate::survival::Survival;

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
    fn a_removal_that_costs_region_survival_is_refused_only_when_another_would_not() {
        // (id, region, could take a replica now).
        let members = |regions: &[(NodeId, &str)]| -> Vec<(NodeId, String, bool)> {
            regions
                .iter()
                .map(|(id, r)| (*id, r.to_string(), true))
                .collect()
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
        down[4].2 = false;
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
