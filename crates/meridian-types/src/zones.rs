//! Zones of a shard's voters: whether losing one zone would stop its writes.
//!
//! Under zone survival a shard's voters all sit in its home region, and the shard is meant to
//! keep committing writes when any one zone (a building, a rack row: the nodes' `--zone`
//! labels) is lost. It does only if no zone holds half of the voters or more: losing such a
//! zone leaves the rest without a majority. Three voters therefore need three zones; four
//! need four; five need three (two, two and one).
//!
//! This is the pure rule, shared by the server (which refuses a zone-survival goal, and a
//! removal, that would leave a crowded zone) and the client (which plans the replicas zone
//! survival needs, and refuses a plan that cannot avoid one before anything moves).
//!
//! # Invariants
//! - [`crowded_zone`] names a zone exactly when losing it leaves the other voters no
//!   majority; a node without a zone label is in the zone its caller gives it (the server's
//!   members say `default`), so unlabelled nodes crowd one zone.

use crate::NodeId;
use std::collections::BTreeMap;

/// The zone that holds half of `voters` or more (the fullest one if two tie at half), with
/// the nodes in it sorted; `None` when losing any one zone leaves a majority, or there are no
/// voters. `voters` are (node, zone) pairs, each node once.
pub fn crowded_zone<'a>(
    voters: impl IntoIterator<Item = (NodeId, &'a str)>,
) -> Option<(&'a str, Vec<NodeId>)> {
    let mut by_zone: BTreeMap<&'a str, Vec<NodeId>> = BTreeMap::new();
    let mut total = 0;
    for (node, zone) in voters {
        by_zone.entry(zone).or_default().push(node);
        total += 1;
    }
    by_zone
        .into_iter()
        .filter(|(_, nodes)| 2 * nodes.len() >= total)
        .max_by_key(|(zone, nodes)| (nodes.len(), std::cmp::Reverse(*zone)))
        .map(|(zone, mut nodes)| {
            nodes.sort_unstable();
            (zone, nodes)
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn three_voters_need_three_zones() {
        assert_eq!(crowded_zone([(1, "a"), (2, "b"), (3, "c")]), None);
        assert_eq!(
            crowded_zone([(3, "a"), (2, "b"), (1, "a")]),
            Some(("a", vec![1, 3]))
        );
        assert_eq!(
            crowded_zone([(1, "default"), (2, "default"), (3, "default")]),
            Some(("default", vec![1, 2, 3]))
        );
    }

    #[test]
    fn half_is_crowded_and_ties_name_the_first_zone() {
        // Four voters, two zones of two: losing either leaves two of four, no majority.
        assert_eq!(
            crowded_zone([(1, "b"), (2, "a"), (3, "b"), (4, "a")]),
            Some(("a", vec![2, 4]))
        );
        // Four in four zones, five in three (2, 2, 1): every loss leaves a majority.
        assert_eq!(crowded_zone([(1, "a"), (2, "b"), (3, "c"), (4, "d")]), None);
        assert_eq!(
            crowded_zone([(1, "a"), (2, "a"), (3, "b"), (4, "b"), (5, "c")]),
            None
        );
        assert_eq!(crowded_zone(std::iter::empty()), None);
    }

    proptest! {
        /// The rule against its meaning: a zone is named exactly when removing its voters
        /// leaves no strict majority of all of them.
        #[test]
        fn names_a_zone_exactly_when_its_loss_leaves_no_majority(
            zones in proptest::collection::vec(0u8..4, 1..9)
        ) {
            let labels = ["a", "b", "c", "d"];
            let voters: Vec<(NodeId, &str)> = zones
                .iter()
                .enumerate()
                .map(|(i, z)| (i as NodeId, labels[*z as usize]))
                .collect();
            let n = voters.len();
            let loses_majority = labels.iter().any(|z| {
                let left = voters.iter().filter(|(_, zone)| zone != z).count();
                voters.iter().any(|(_, zone)| zone == z) && 2 * left <= n
            });
            let named = crowded_zone(voters.iter().copied());
            prop_assert_eq!(named.is_some(), loses_majority);
            if let Some((zone, nodes)) = named {
                let expected: Vec<NodeId> =
                    voters.iter().filter(|(_, z)| *z == zone).map(|(id, _)| *id).collect();
                prop_assert_eq!(nodes, expected);
            }
        }
    }
}
