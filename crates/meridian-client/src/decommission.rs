//! Decommissioning a node: moving every replica it holds to other nodes, one shard at a time,
//! so it can be stopped without any shard losing a replica it needs.
//!
//! A move is an `add_replica` on a chosen node followed by a `remove_replica` of the leaving
//! one, so the shard never has fewer replicas than before (one more, briefly); or, for a
//! shard that has enough replicas without the leaving one (below), the removal alone. The
//! plan is made from one status of the cluster ([`plan`], a pure function): for each shard the
//! leaving node holds, the target is a live node without a replica of it that the shard's
//! replica constraints allow (`constraint_plan`) and, under zone survival, in the home
//! region if the leaving node is there (`constraint_plan::home_bound`), preferring
//!
//! 1. the leaving node's region (the shard keeps its spread over regions),
//! 2. then a region none of the shard's other replicas is in,
//! 3. then a zone of that region none of them is in (under zone survival, the spread that
//!    lets the shard lose a zone; the server refuses a removal that crowds one needlessly),
//! 4. then the node with the fewest replicas (counting the moves planned so far),
//! 5. then the lowest node id (a stable choice).
//!
//! At the end the cluster's status must list no replica on the node, else the call fails
//! (something added one meanwhile) and can be run again. A shard no node can take (every
//! other node has a replica of it already) fails the plan before anything moves, unless it
//! has enough replicas without the leaving one.
//!
//! **Enough replicas** ([`enough_without`]): the shard's other replicas that work (on live
//! nodes, not learners still catching up) number at least the cluster's `replication_factor`
//! (as the answering node's `Cluster.Status` reports it; 0 from an older node, which turns
//! this off), no voter change is half done, at least three are in the home region when the
//! leaving one is a zone-survival home replica (and no node that could take it is in a zone
//! of the home those three or more lack), and no node that could take the replica is in a
//! region those replicas lack (an add there would widen the shard's spread). That is what
//! makes an interrupted run resumable: running the command again re-plans from what is left,
//! and a move cut between its add and its remove (the shard holds one replica more) is
//! finished by the removal alone. A replica someone added beyond the replication factor is
//! removed the same way, so such a shard ends with one replica fewer. The server still
//! checks each removal (zone and region survival, `membership`).

use crate::admin::ReplicaChange;
use crate::client::Client;
use crate::error::{Error, Result};
use meridian_proto::kv::{NodeInfo, ShardInfo, StatusResponse};
use std::collections::BTreeMap;

/// One planned move: `shard`'s replica on the leaving node goes to `to`, or, with `None`,
/// is only removed (the shard has enough replicas without it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Move {
    pub shard: u64,
    pub to: Option<u64>,
}

/// A finished move, as reported to the caller's progress callback.
#[derive(Clone, Debug)]
pub struct MoveDone {
    pub shard: u64,
    /// The node that took the replica; `None` when it was only removed.
    pub to: Option<u64>,
    /// The group after the removal.
    pub change: ReplicaChange,
}

/// The moves that take every replica off `node`, given the cluster's `status`.
pub fn plan(status: &StatusResponse, node: u64) -> Result<Vec<Move>> {
    let Some(leaving) = status.nodes.iter().find(|n| n.node_id == node) else {
        return Err(Error::InvalidArgument {
            message: format!("node {node} is not a member of the cluster"),
        });
    };
    let mut load: BTreeMap<u64, usize> = status.nodes.iter().map(|n| (n.node_id, 0)).collect();
    for shard in &status.shards {
        for r in &shard.replicas {
            *load.entry(*r).or_default() += 1;
        }
    }
    let mut moves = Vec::new();
    for shard in status.shards.iter().filter(|s| s.replicas.contains(&node)) {
        let constraints = crate::constraint_plan::shard_constraints(shard)?;
        let bound = crate::constraint_plan::home_bound(shard, Some(leaving));
        // The shard's other replicas' nodes, and whether one is in `n`'s region (and zone).
        let others: Vec<&NodeInfo> = status
            .nodes
            .iter()
            .filter(|o| o.node_id != node && shard.replicas.contains(&o.node_id))
            .collect();
        let held = |n: &NodeInfo, zone_too: bool| {
            others
                .iter()
                .any(|o| o.region == n.region && (!zone_too || o.zone == n.zone))
        };
        let candidates: Vec<&NodeInfo> = status
            .nodes
            .iter()
            .filter(|n| n.node_id != node && n.live && !shard.replicas.contains(&n.node_id))
            .filter(|n| crate::constraint_plan::allows(&constraints, n))
            .filter(|n| bound.is_none_or(|home| n.region == home))
            .collect();
        let target = candidates.iter().min_by_key(|n| {
            let region_rank = if n.region == leaving.region {
                0
            } else if !held(n, false) {
                1
            } else {
                2
            };
            (region_rank, held(n, true), load[&n.node_id], n.node_id)
        });
        let enough = enough_without(status, shard, node, bound, &candidates);
        let to = match target {
            _ if enough => None,
            Some(n) => Some(n.node_id),
            None => {
                return Err(Error::InvalidArgument {
                    message: format!(
                        "no live node{} can take node {node}'s replica of shard {} (replicas \
                         {:?}, constraints {constraints}): add a node first",
                        bound.map_or(String::new(), |home| format!(
                            " in {home} (zone survival keeps three replicas there)"
                        )),
                        shard.shard_id,
                        shard.replicas
                    ),
                })
            }
        };
        if let Some(to) = to {
            *load.entry(to).or_default() += 1;
        }
        moves.push(Move {
            shard: shard.shard_id,
            to,
        });
    }
    Ok(moves)
}

/// Whether `shard` keeps enough replicas without `node`'s that the decommission only removes
/// it: at least the cluster's replication factor of working replicas (on live nodes, and not
/// learners still catching up: a learner zone survival keeps outside the home counts), no
/// voter change half done, three of them in the home if `bound` names it (the leaving one is
/// a zone-survival home replica, with no `candidates` node in a zone of the home they lack),
/// and no `candidates` node (one that could take the replica) in a region those replicas
/// lack: an add there would widen the shard's spread.
fn enough_without(
    status: &StatusResponse,
    shard: &ShardInfo,
    node: u64,
    bound: Option<&str>,
    candidates: &[&NodeInfo],
) -> bool {
    let info = |id: u64| status.nodes.iter().find(|n| n.node_id == id);
    let kept_learner = |n: &NodeInfo| shard.survival == "zone" && n.region != shard.home_region;
    let working: Vec<(&str, &str)> = shard
        .replicas
        .iter()
        .filter(|r| **r != node)
        .filter_map(|r| info(*r))
        .filter(|n| n.live && (!shard.learners.contains(&n.node_id) || kept_learner(n)))
        .map(|n| (n.region.as_str(), n.zone.as_str()))
        .collect();
    let at_home = |home: &str| working.iter().filter(|(r, _)| *r == home).count();
    // Under zone survival (`bound`), the candidates are in the home region already.
    let home_spread = || {
        candidates
            .iter()
            .all(|n| working.contains(&(n.region.as_str(), n.zone.as_str())))
    };
    status.replication_factor > 0
        && !shard.joint
        && working.len() >= status.replication_factor as usize
        && bound
            .is_none_or(|home| at_home(home) >= crate::survival_plan::ZONE_VOTERS && home_spread())
        && candidates
            .iter()
            .all(|n| working.iter().any(|(r, _)| *r == n.region))
}

impl Client {
    /// Moves every replica off `node` (see the module docs); calls `progress` after each move.
    /// Returns the moves made. Each add and remove has the client's call deadline.
    pub async fn decommission(
        &self,
        node: u64,
        mut progress: impl FnMut(&MoveDone),
    ) -> Result<Vec<MoveDone>> {
        let status = self.status().await?;
        let moves = plan(&status, node)?;
        let mut done = Vec::with_capacity(moves.len());
        for step in moves {
            if let Some(to) = step.to {
                match self.add_replica(step.shard, to).await {
                    Ok(_) => {}
                    // A voter already (added meanwhile): only the removal is left.
                    Err(Error::InvalidArgument { message })
                        if message.contains("voter of shard") => {}
                    Err(e) => return Err(e),
                }
            }
            let change = self.remove_replica(step.shard, node).await?;
            let finished = MoveDone {
                shard: step.shard,
                to: step.to,
                change,
            };
            progress(&finished);
            done.push(finished);
        }
        // Safe to stop only if the map (as a node reports it now) lists none of its replicas.
        let left: Vec<u64> = self
            .status()
            .await?
            .shards
            .iter()
            .filter(|s| s.replicas.contains(&node))
            .map(|s| s.shard_id)
            .collect();
        if !left.is_empty() {
            return Err(Error::Unavailable {
                message: format!(
                    "node {node} still holds replicas of shards {left:?} (moved meanwhile?); \
                     run the decommission again"
                ),
            });
        }
        Ok(done)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A live node of `region`.
    fn live_node(node_id: u64, region: &str) -> NodeInfo {
        NodeInfo {
            node_id,
            region: region.into(),
            live: true,
            ..Default::default()
        }
    }

    fn status(nodes: &[(u64, &str, bool)], shards: &[(u64, &[u64])]) -> StatusResponse {
        let nodes: Vec<(u64, &str, &str, bool)> = nodes
            .iter()
            .map(|(id, r, live)| (*id, *r, "a", *live))
            .collect();
        crate::test_support::status(&nodes, shards)
    }

    #[test]
    fn moves_stay_in_the_leaving_nodes_region_first() {
        let s = status(
            &[
                (1, "a", true),
                (2, "b", true),
                (3, "c", true),
                (4, "a", true),
                (5, "b", true),
            ],
            &[(0, &[1, 2, 3]), (1, &[1, 2, 3]), (2, &[2, 3, 5])],
        );
        let moves = plan(&s, 1).unwrap();
        assert_eq!(
            moves,
            vec![
                Move {
                    shard: 0,
                    to: Some(4)
                },
                Move {
                    shard: 1,
                    to: Some(4)
                }
            ]
        );
    }

    #[test]
    fn then_a_region_the_shard_lacks_then_the_least_loaded() {
        // No other node in region a: node 6 (region d, unused by the shard) beats the less
        // loaded node 5 (region b, which the shard has).
        let s = status(
            &[
                (1, "a", true),
                (2, "b", true),
                (3, "c", true),
                (5, "b", true),
                (6, "d", true),
            ],
            &[(1, &[1, 2, 3]), (2, &[6, 2, 3]), (3, &[6, 2, 3])],
        );
        assert_eq!(
            plan(&s, 1).unwrap(),
            vec![Move {
                shard: 1,
                to: Some(6)
            }]
        );
        // Among equals, the fewest replicas, counting planned moves: 4 and 5 alternate.
        let s = status(
            &[
                (1, "a", true),
                (2, "a", true),
                (3, "a", true),
                (4, "a", true),
                (5, "a", true),
            ],
            &[(1, &[1, 2, 3]), (2, &[1, 2, 3]), (3, &[1, 2, 3])],
        );
        let to: Vec<_> = plan(&s, 1).unwrap().iter().map(|m| m.to).collect();
        assert_eq!(to, vec![Some(4), Some(5), Some(4)]);
    }

    #[test]
    fn dead_nodes_are_not_targets_and_a_full_shard_fails_the_plan() {
        let s = status(
            &[
                (1, "a", true),
                (2, "a", true),
                (3, "a", true),
                (4, "a", false),
            ],
            &[(1, &[1, 2, 3])],
        );
        let error = plan(&s, 1).unwrap_err();
        assert!(
            error.to_string().contains("no live node can take"),
            "{error}"
        );
        let error = plan(&s, 9).unwrap_err();
        assert!(error.to_string().contains("not a member"), "{error}");
        assert!(
            plan(&s, 4).unwrap().is_empty(),
            "a node without replicas has nothing to move"
        );
    }

    #[test]
    fn targets_obey_the_shards_constraints() {
        let nodes = [
            (1, "a", true),
            (2, "b", true),
            (3, "c", true),
            (4, "a", true),
            (5, "d", true),
        ];
        let mut s = status(&nodes, &[(1, &[1, 2, 3])]);
        assert_eq!(
            plan(&s, 1).unwrap()[0].to,
            Some(4),
            "the leaving node's region first"
        );
        s.shards[0].constraints = "-region=a".into();
        assert_eq!(plan(&s, 1).unwrap()[0].to, Some(5), "region a is excluded");
        s.shards[0].constraints = "+region=a".into();
        // Only node 4 is allowed: fine for node 1's replica.
        assert_eq!(plan(&s, 1).unwrap()[0].to, Some(4));
        s.shards[0].constraints = "-region=a,-region=d".into();
        let e = plan(&s, 1).unwrap_err().to_string();
        assert!(e.contains("constraints -region=a,-region=d"), "{e}");
        // Zone survival in region a: node 1's replica stays in a, or the plan fails.
        s.shards[0].constraints = String::new();
        s.shards[0].home_region = "a".into();
        s.shards[0].survival = "zone".into();
        assert_eq!(plan(&s, 1).unwrap()[0].to, Some(4));
        s.shards[0].replicas = vec![1, 4, 2];
        let e = plan(&s, 1).unwrap_err().to_string();
        assert!(e.contains("no live node in a (zone survival"), "{e}");
        assert_eq!(
            plan(&s, 2).unwrap()[0].to,
            Some(3),
            "a learner elsewhere is not bound"
        );
    }

    /// Under zone survival the replacement for a home replica goes to a zone the shard's
    /// other home replicas are not in (the bug: node 6, in node 4's zone, was picked on its
    /// id, and the server refuses the removal that follows, which would leave two of the
    /// three home replicas in one zone).
    #[test]
    fn a_home_replica_moves_to_a_zone_the_home_lacks() {
        let mut s = status(
            &[
                (1, "a", true),
                (2, "b", true),
                (4, "a", true),
                (5, "a", true),
                (6, "a", true),
                (7, "a", true),
                (8, "a", true),
            ],
            &[(1, &[1, 4, 5, 2]), (2, &[7, 2])],
        );
        for (node, zone) in [
            (1, "z1"),
            (4, "z2"),
            (5, "z3"),
            (6, "z2"),
            (7, "z4"),
            (8, "z2"),
        ] {
            s.nodes.iter_mut().find(|n| n.node_id == node).unwrap().zone = zone.into();
        }
        s.shards[0].home_region = "a".into();
        s.shards[0].survival = "zone".into();
        assert_eq!(
            plan(&s, 1).unwrap()[0].to,
            Some(7),
            "zone z4, though node 7 holds more"
        );
        // Enough replicas without node 1 (rf 3), but two of its three home ones share z2:
        // node 7 could spread them, so it is added rather than node 1's removed alone.
        s.replication_factor = 3;
        s.shards[0].replicas = vec![1, 4, 5, 8, 2];
        assert_eq!(plan(&s, 1).unwrap()[0].to, Some(7));
        s.nodes.iter_mut().find(|n| n.node_id == 7).unwrap().live = false;
        assert_eq!(
            plan(&s, 1).unwrap()[0].to,
            None,
            "no zone left to spread to"
        );
    }

    /// A shard that keeps enough replicas without the leaving one only loses it: how a run
    /// cut between a move's add and its remove is finished by the next run (the bug: it added
    /// the replica to yet another node).
    #[test]
    fn a_shard_with_enough_replicas_only_loses_the_leaving_one() {
        let nodes = [
            (1, "a", true),
            (2, "b", true),
            (3, "c", true),
            (4, "a", true),
            (5, "a", true),
        ];
        // Node 1's replica of shard 1 went to node 4, the run stopped before the remove.
        let mut s = status(&nodes, &[(1, &[1, 2, 3, 4]), (2, &[1, 2, 3])]);
        s.replication_factor = 3;
        assert_eq!(
            plan(&s, 1).unwrap(),
            vec![
                Move { shard: 1, to: None },
                Move {
                    shard: 2,
                    to: Some(5)
                }
            ]
        );
        // The same with no other node free: the removal alone, where the plan used to fail.
        s.shards[0].replicas = vec![1, 2, 3, 4, 5];
        assert_eq!(plan(&s, 1).unwrap()[0].to, None);
        // An add would widen the shard's regions: node 4 (a) is added rather than leave the
        // shard in b and c only.
        s.shards[0].replicas = vec![1, 2, 3, 6];
        s.nodes.push(live_node(6, "b"));
        assert_eq!(plan(&s, 1).unwrap()[0].to, Some(4));
        // Fewer than the replication factor left: added, as before.
        s.shards[0].replicas = vec![1, 2, 4];
        assert_eq!(plan(&s, 1).unwrap()[0].to, Some(5));
        // Zone survival in a: the home keeps three (1 leaves, 4, 5 and 7 stay) or gets one.
        s.shards[0].home_region = "a".into();
        s.shards[0].survival = "zone".into();
        s.nodes.push(live_node(7, "a"));
        s.shards[0].replicas = vec![1, 4, 5, 7, 2];
        assert_eq!(plan(&s, 1).unwrap()[0].to, None);
        s.shards[0].replicas = vec![1, 4, 5, 2, 3];
        assert_eq!(plan(&s, 1).unwrap()[0].to, Some(7));
        // A node that does not report the factor (0): always an add.
        s.replication_factor = 0;
        s.shards[0].replicas = vec![1, 4, 5, 7, 2];
        assert!(plan(&s, 1).is_err(), "no free node in a");
    }

    /// Replicas that do not work (a down node, a learner still catching up, a voter change
    /// half done) do not count towards enough, and any node that could take the replica in a
    /// region the shard lacks means an add.
    #[test]
    fn only_working_replicas_count_as_enough() {
        let nodes = [
            (1, "a", true),
            (2, "b", true),
            (3, "c", true),
            (4, "a", true),
            (5, "a", true),
        ];
        let mut s = status(&nodes, &[(1, &[1, 2, 3, 4])]);
        s.replication_factor = 3;
        assert_eq!(plan(&s, 1).unwrap()[0].to, None, "the control");
        s.nodes[3].live = false;
        assert_eq!(plan(&s, 1).unwrap()[0].to, Some(5), "node 4 is down");
        s.nodes[3].live = true;
        s.shards[0].learners = vec![4];
        assert_eq!(plan(&s, 1).unwrap()[0].to, Some(5), "node 4 still learns");
        s.shards[0].survival = "zone".into();
        s.shards[0].home_region = "b".into();
        assert_eq!(
            plan(&s, 1).unwrap()[0].to,
            None,
            "a learner zone survival keeps outside its home works"
        );
        s.shards[0].survival = String::new();
        s.shards[0].home_region = String::new();
        s.shards[0].learners.clear();
        s.shards[0].joint = true;
        assert_eq!(
            plan(&s, 1).unwrap()[0].to,
            Some(5),
            "a voter change half done"
        );
        s.shards[0].joint = false;
        // Shard in a and b only ([1, 4] in a, [2, 6] in b), node 3 (c) free: an add, to the
        // preferred node (5, in the leaving node's region), though node 3 is what forbids
        // the removal alone.
        s.nodes.push(live_node(6, "b"));
        s.shards[0].replicas = vec![1, 4, 2, 6];
        assert_eq!(plan(&s, 1).unwrap()[0].to, Some(5));
        s.nodes[2].live = false;
        assert_eq!(plan(&s, 1).unwrap()[0].to, None, "node 3 is down");
    }
}
