//! Giving a shard zone survival from wherever its replicas are: first the replicas its home
//! region lacks, then the goal.
//!
//! Zone survival keeps a shard's votes in its home region, so the region must hold at least
//! [`ZONE_VOTERS`] of its replicas (the server refuses the goal otherwise). A shard placed one
//! replica per region has one there. [`Client::place`] closes the gap: from one status of the
//! cluster it plans the additions ([`zone_additions`], a pure function), runs each as an
//! `add_replica` (learner, caught up, voter), then stores the goal; the shard's leader then
//! makes the replicas outside the home region learners. The targets are live members of the
//! home region without a replica of the shard, preferring
//!
//! 1. a zone none of the shard's home replicas (or the targets chosen so far) is in,
//! 2. then the node with the fewest replicas,
//! 3. then the lowest node id (a stable choice).
//!
//! A region with too few live members fails the plan before anything moves. Running the
//! command again after an interruption re-plans from what is there (an added replica counts).
//!
//! # Not done yet
//! Nothing is removed: the replicas outside the home region stay, as learners, and going back
//! to region survival keeps the added ones (as voters) until removed by hand.

use crate::admin::{ReplicaChange, Survival};
use crate::client::Client;
use crate::error::{Error, Result};
use meridian_proto::kv::StatusResponse;
use std::collections::{BTreeMap, BTreeSet};

/// Fewest replicas of a shard in its home region that zone survival accepts (the server's
/// `survival::ZONE_VOTERS`).
pub const ZONE_VOTERS: usize = 3;

/// The nodes that should get a replica of `shard` so that `home` holds [`ZONE_VOTERS`] of
/// them (see the module docs); empty if it does already.
pub fn zone_additions(status: &StatusResponse, shard: u64, home: &str) -> Result<Vec<u64>> {
    let Some(info) = status.shards.iter().find(|s| s.shard_id == shard) else {
        return Err(Error::InvalidArgument {
            message: format!("there is no shard {shard}"),
        });
    };
    let at_home: Vec<_> = status.nodes.iter().filter(|n| n.region == home).collect();
    let held: Vec<_> = at_home
        .iter()
        .filter(|n| info.replicas.contains(&n.node_id))
        .collect();
    let need = ZONE_VOTERS.saturating_sub(held.len());
    let mut zones: BTreeSet<&str> = held.iter().map(|n| n.zone.as_str()).collect();
    let mut load: BTreeMap<u64, usize> = BTreeMap::new();
    for s in &status.shards {
        for r in &s.replicas {
            *load.entry(*r).or_default() += 1;
        }
    }
    let mut free: Vec<_> = at_home
        .iter()
        .filter(|n| n.live && !info.replicas.contains(&n.node_id))
        .collect();
    if free.len() < need {
        return Err(Error::InvalidArgument {
            message: format!(
                "zone survival needs {ZONE_VOTERS} replicas of shard {shard} in {home}: it has {} \
                 and {} live member(s) there could take one; start more nodes in {home} \
                 (meridian start --join ... --region {home})",
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
        chosen.push(node.node_id);
    }
    Ok(chosen)
}

impl Client {
    /// Sets `shard`'s home region and survival goal like [`Client::set_placement`], but for
    /// zone survival first gives the home region the replicas it lacks (see the module docs),
    /// calling `added` after each. Returns the shard map version that holds the placement.
    pub async fn place(
        &self,
        shard: u64,
        home_region: Option<&str>,
        survival: Option<Survival>,
        mut added: impl FnMut(u64, &ReplicaChange),
    ) -> Result<u64> {
        if let (Some(Survival::Zone), Some(home)) = (survival, home_region) {
            let status = self.status().await?;
            for node in zone_additions(&status, shard, home)? {
                let change = self.add_replica(shard, node).await?;
                added(node, &change);
            }
        }
        self.set_placement(shard, home_region, survival).await
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
        let s = status(&NODES, &[(1, &[1, 4, 5, 2])]);
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
}
