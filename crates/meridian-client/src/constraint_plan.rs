//! Making a shard's replicas obey its replica constraints: which replicas must move, and where.
//!
//! A shard's constraints (`+region=eu-west,-zone=c`, see `meridian_types::constraints`) are
//! stored by `meridian cluster placement ... --constraints` even while some replicas break
//! them; from then on the server refuses any new replica they exclude. [`Client::place`]
//! then moves each breaking replica: it adds one on a target the constraints allow, then
//! removes the breaking one, so the shard never has fewer replicas than before (one more,
//! briefly), as a decommission does. The plan ([`constraint_moves`], a pure function of one
//! status of the cluster) takes, for each breaking replica, a live member the constraints
//! allow without a replica of the shard, preferring
//!
//! 1. the breaking replica's region (the shard keeps its spread over regions, and its home),
//! 2. then a region none of the shard's staying replicas is in,
//! 3. then a zone none of them is in,
//! 4. then the node with the fewest replicas (counting the moves planned so far),
//! 5. then the lowest node id (a stable choice).
//!
//! Under zone survival a replica in the home region is replaced only by one in the home
//! region ([`home_bound`]): one elsewhere would be a learner, and the server refuses a
//! removal that leaves fewer than three home replicas, so the move would stop half way.
//!
//! A breaking replica no live allowed member can take fails the plan before anything moves
//! (the constraints, stored first, stay). A run interrupted between an add and its remove
//! leaves the shard one replica more: running the command again plans the breaking replica
//! again, to another node (the added one counts as a staying replica), so remove the extra
//! one by hand (`meridian cluster remove-replica`) rather than running it again.
//!
//! The same rule keeps every other planner inside the constraints: zone survival's additions
//! (`survival_plan`) and a decommission's targets (`decommission`) skip members the shard's
//! constraints exclude ([`shard_constraints`]).

use crate::error::{Error, Result};
use meridian_proto::kv::{NodeInfo, ShardInfo, StatusResponse};
use meridian_types::Constraints;
use std::collections::BTreeSet;

/// One planned move: the replica on `from` goes to `to`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConstraintMove {
    pub from: u64,
    pub to: u64,
}

/// The constraints `info` reports (empty text: none).
pub fn shard_constraints(info: &ShardInfo) -> Result<Constraints> {
    Constraints::parse(&info.constraints).map_err(|e| Error::Internal {
        message: format!(
            "shard {} reports constraints {:?} this client cannot read: {e}",
            info.shard_id, info.constraints
        ),
    })
}

/// Whether `node` may hold a replica under `constraints`.
pub fn allows(constraints: &Constraints, node: &NodeInfo) -> bool {
    constraints.allows(&node.region, &node.zone)
}

/// The region a replacement for `from`'s replica of `info` must be in, if any: the home
/// region, when the shard has zone survival and `from` is there (see the module docs).
pub fn home_bound<'a>(info: &'a ShardInfo, from: Option<&NodeInfo>) -> Option<&'a str> {
    let home = info.home_region.as_str();
    (info.survival == "zone" && !home.is_empty() && from.is_some_and(|n| n.region == home))
        .then_some(home)
}

/// The moves that make `shard`'s replicas obey `constraints` (see the module docs); empty if
/// they do.
pub fn constraint_moves(
    status: &StatusResponse,
    shard: u64,
    constraints: &Constraints,
) -> Result<Vec<ConstraintMove>> {
    let info = crate::survival_plan::shard_info(status, shard)?;
    let node = |id: u64| status.nodes.iter().find(|n| n.node_id == id);
    let breaking: Vec<u64> = info
        .replicas
        .iter()
        .copied()
        .filter(|id| node(*id).is_some_and(|n| !allows(constraints, n)))
        .collect();
    let mut staying: BTreeSet<u64> = info
        .replicas
        .iter()
        .copied()
        .filter(|id| !breaking.contains(id))
        .collect();
    let mut load = crate::survival_plan::replicas_per_node(status);
    let mut moves = Vec::with_capacity(breaking.len());
    for from in breaking {
        let from_region = node(from).map_or("", |n| n.region.as_str());
        let bound = home_bound(info, node(from));
        let kept: Vec<&NodeInfo> = staying.iter().filter_map(|id| node(*id)).collect();
        let to = status
            .nodes
            .iter()
            .filter(|n| n.live && allows(constraints, n))
            .filter(|n| bound.is_none_or(|home| n.region == home))
            .filter(|n| !info.replicas.contains(&n.node_id) && !staying.contains(&n.node_id))
            .min_by_key(|n| {
                (
                    n.region != from_region,
                    kept.iter().any(|k| k.region == n.region),
                    kept.iter()
                        .any(|k| k.region == n.region && k.zone == n.zone),
                    load.get(&n.node_id).copied().unwrap_or(0),
                    n.node_id,
                )
            })
            .ok_or_else(|| Error::InvalidArgument {
                message: format!(
                    "no live member that constraints {constraints} allow{} can take node \
                     {from}'s replica of shard {shard} (replicas {:?}): start one, or loosen \
                     the constraints",
                    bound.map_or(String::new(), |home| format!(
                        " in {home} (zone survival keeps three replicas there)"
                    )),
                    info.replicas
                ),
            })?
            .node_id;
        *load.entry(to).or_default() += 1;
        staying.insert(to);
        moves.push(ConstraintMove { from, to });
    }
    Ok(moves)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::status;

    const NODES: [(u64, &str, &str, bool); 7] = [
        (1, "us-east", "a", true),
        (2, "eu-west", "a", true),
        (3, "ap-south", "a", true),
        (4, "us-east", "b", true),
        (5, "eu-west", "b", true),
        (6, "ap-south", "b", false),
        (7, "us-east", "c", true),
    ];

    fn c(text: &str) -> Constraints {
        Constraints::parse(text).unwrap()
    }

    #[test]
    fn obeying_replicas_stay() {
        let s = status(&NODES, &[(1, &[1, 2, 3])]);
        assert_eq!(constraint_moves(&s, 1, &c("none")).unwrap(), []);
        assert_eq!(constraint_moves(&s, 1, &c("-zone=c")).unwrap(), []);
    }

    #[test]
    fn a_breaking_replica_moves_within_its_region_first() {
        let s = status(&NODES, &[(1, &[1, 2, 3]), (2, &[4, 5, 7])]);
        // Every replica is in zone a. Node 1's goes to us-east's node 4 (4 and 7 tie on load,
        // the id decides), node 2's to eu-west's 5; ap-south's 6 is down, so node 3's takes
        // the last allowed live node, 7.
        let moves = constraint_moves(&s, 1, &c("-zone=a")).unwrap();
        assert_eq!(
            moves,
            [
                ConstraintMove { from: 1, to: 4 },
                ConstraintMove { from: 2, to: 5 },
                ConstraintMove { from: 3, to: 7 },
            ]
        );
    }

    #[test]
    fn a_prohibited_region_moves_to_a_region_not_used_yet() {
        let nodes = [
            (1, "us-east", "a", true),
            (2, "eu-west", "a", true),
            (3, "ap-south", "a", true),
            (4, "us-east", "b", true),
            (5, "sa-east", "a", true),
        ];
        let s = status(&nodes, &[(1, &[1, 2, 3])]);
        let moves = constraint_moves(&s, 1, &c("-region=ap-south")).unwrap();
        assert_eq!(
            moves,
            [ConstraintMove { from: 3, to: 5 }],
            "a new region beats a used one"
        );
    }

    #[test]
    fn under_zone_survival_a_home_replica_is_replaced_at_home_only() {
        let mut s = status(&NODES, &[(1, &[1, 4, 7, 2])]);
        s.shards[0].home_region = "us-east".into();
        s.shards[0].survival = "zone".into();
        // Node 1 (zone a) breaks -zone=a; us-east has no other free node: eu-west's 5 would
        // be a learner and leave two home replicas, so the plan fails instead.
        let e = constraint_moves(&s, 1, &c("-zone=a"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("allow in us-east (zone survival"), "{e}");
        // Under -zone=b, home node 4 is bound to us-east as well, where no node is free;
        // under region survival it may leave.
        s.shards[0].replicas = vec![1, 4, 7, 5];
        let moves = constraint_moves(&s, 1, &c("-zone=b"))
            .unwrap_err()
            .to_string();
        assert!(moves.contains("node 4's"), "{moves}");
        s.shards[0].survival = "region".into();
        let moves = constraint_moves(&s, 1, &c("-zone=b")).unwrap();
        assert_eq!(moves[0].from, 4);
    }

    #[test]
    fn a_plan_with_no_allowed_target_fails_before_anything_moves() {
        let s = status(&NODES, &[(1, &[1, 2, 4])]);
        let moves = constraint_moves(&s, 1, &c("+region=us-east")).unwrap();
        assert_eq!(moves, [ConstraintMove { from: 2, to: 7 }]);
        // Three replicas outside us-east and two free members there.
        let s = status(&NODES, &[(1, &[1, 2, 3, 5])]);
        let e = constraint_moves(&s, 1, &c("+region=us-east")).unwrap_err();
        assert!(
            e.to_string()
                .contains("no live member that constraints +region=us-east allow")
                && e.to_string().contains("node 5's replica"),
            "{e}"
        );
    }
}
