//! Biased elections: after a leader's crash, a replica in the shard's home region wins.
//!
//! The leader-follow loop (`leader_follow`) brings leadership home after a failover, at the
//! cost of a second election (a transfer) a few election timeouts later. When the home region
//! holds another voter of the shard (two replicas there, as zone survival or three nodes per
//! region give), that voter should simply win the first election. So a replica outside the
//! home region does not *start* elections (openraft's `runtime_config().elect(false)`; it
//! still votes) while a voter of the home region other than the last known leader is live
//! (its node answered a ping within `election_timeout_max`): that voter's election timer fires
//! and it wins. In the usual layout of one voter per region, the only home voter is the leader
//! itself, so a crashed home leader is replaced as before; a crashed leader *outside* the home
//! (after a failover) is left to the home voter.
//!
//! # Fallback
//! A shard counts as leaderless when its replica knows no leader or the leader's node has not
//! answered a ping for a round (openraft keeps reporting the leader a follower voted for,
//! dead or not). Leaderless for two rounds, every replica may campaign again: a home voter
//! that answers pings but cannot win (behind the others' logs, cut off from them,
//! clock-fenced) lets the others campaign three to four rounds (`election_timeout_max` each)
//! after the leader's node last answered a ping, instead of about one; it never blocks a
//! failover.
//!
//! # Invariants
//! - A replica whose elections wait for its group's quorum at start (`founding`) is not
//!   switched until released; its first decision comes at the round after.
//! - Only the start of elections is switched; votes, pre-votes, appends and Raft's safety are
//!   untouched, as with quiescence's timer switches (which use `tick`, not `elect`).
//! - A replica of a shard without a home, or in the home region, always may elect.
//!
//! # Not done yet
//! - Decided once per round (every `election_timeout_max`) from the last round's view; a home
//!   voter that dies in the same round as the leader costs the fallback's delay.

use crate::node::Node;
use meridian_types::{NodeId, ShardId};
use openraft::type_config::async_runtime::WatchReceiver;
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// What the loop remembers per replica.
#[derive(Default)]
pub(crate) struct Seen {
    last_leader: Option<NodeId>,
    leaderless_since: Option<Instant>,
    elect: Option<bool>,
}

/// The facts one decision needs.
#[derive(Debug)]
struct Facts {
    /// Whether the shard has a home and this node is outside it.
    outside_home: bool,
    /// Voters of the shard in its home region, other than this node, with their liveness.
    home_voters: Vec<(NodeId, bool)>,
    last_leader: Option<NodeId>,
    leaderless_for: Duration,
    period: Duration,
}

/// Whether this node's replica may start elections.
fn may_elect(f: &Facts) -> bool {
    if !f.outside_home || f.leaderless_for >= 2 * f.period {
        return true;
    }
    !f.home_voters
        .iter()
        .any(|(id, live)| *live && Some(*id) != f.last_leader)
}

/// One round over this node's replicas of data shards.
pub(crate) fn step(node: &Node, seen: &mut HashMap<ShardId, Seen>, period: Duration) {
    let me = node.config.node_id;
    let now = Instant::now();
    let map = node.map();
    let regions: HashMap<NodeId, String> = node
        .members_now()
        .into_iter()
        .map(|m| (m.node_id, m.region))
        .collect();
    seen.retain(|id, _| node.host.get(*id).is_some());
    for desc in &map.data {
        let Some(replica) = node.host.get(desc.id) else {
            continue;
        };
        let state = seen.entry(desc.id).or_default();
        let leader = replica.raft.metrics().borrow_watched().current_leader;
        if let Some(l) = leader {
            state.last_leader = Some(l);
        }
        let live = leader.is_some_and(|l| l == me || node.host.pool.seen_within(l, period));
        if live {
            state.leaderless_since = None;
        } else {
            state.leaderless_since.get_or_insert(now);
        }
        // The home, when this node is outside it.
        let away_from = desc
            .home
            .as_deref()
            .filter(|home| *home != node.config.region);
        let home_voters = match away_from {
            Some(home) => {
                let metrics = replica.raft.metrics();
                let watched = metrics.borrow_watched();
                watched
                    .membership_config
                    .membership()
                    .voter_ids()
                    .filter(|id| *id != me && regions.get(id).is_some_and(|r| r == home))
                    .map(|id| (id, node.host.pool.seen_within(id, period)))
                    .collect()
            }
            None => Vec::new(),
        };
        let facts = Facts {
            outside_home: away_from.is_some(),
            home_voters,
            last_leader: state.last_leader,
            leaderless_for: state
                .leaderless_since
                .map_or(Duration::ZERO, |t| now.duration_since(t)),
            period,
        };
        let elect = may_elect(&facts);
        if state.elect != Some(elect) {
            // A replica whose elections wait for its quorum (`founding`) is left alone; the
            // switch happens under the hold's lock, so a release cannot undo it.
            let switched = node.election_hold.unless_held(desc.id, || {
                replica.raft.runtime_config().elect(elect);
            });
            if switched {
                if !elect {
                    tracing::info!(shard = %desc.id, ?facts, "election bias: this replica leaves elections to the home region");
                } else if state.elect.is_some() {
                    tracing::info!(shard = %desc.id, ?facts, "election bias: this replica may start elections again");
                }
                state.elect = Some(elect);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(outside_home: bool, home_voters: &[(NodeId, bool)], last_leader: u64) -> Facts {
        Facts {
            outside_home,
            home_voters: home_voters.to_vec(),
            last_leader: Some(last_leader),
            leaderless_for: Duration::ZERO,
            period: Duration::from_secs(1),
        }
    }

    #[test]
    fn only_a_replica_outside_the_home_with_another_live_home_voter_holds_back() {
        // Two home voters (1, 4); node 1 leads; this node is outside the home.
        assert!(!may_elect(&facts(true, &[(1, true), (4, true)], 1)));
        // The leader itself is not the reason to hold back: one voter per region.
        assert!(may_elect(&facts(true, &[(1, true)], 1)));
        // The other home voter is silent: campaign as usual.
        assert!(may_elect(&facts(true, &[(1, false), (4, false)], 1)));
        assert!(may_elect(&facts(true, &[(1, true), (4, false)], 1)));
        // A non-home leader crashed: the live home voter should win.
        assert!(!may_elect(&facts(true, &[(1, true)], 2)));
        // Inside the home, or no home: always.
        assert!(may_elect(&facts(false, &[(4, true)], 1)));
        assert!(may_elect(&facts(false, &[], 1)));
    }

    #[test]
    fn two_rounds_without_a_leader_let_everyone_campaign() {
        let mut f = facts(true, &[(1, true), (4, true)], 1);
        f.leaderless_for = Duration::from_millis(1_999);
        assert!(!may_elect(&f));
        f.leaderless_for = Duration::from_secs(2);
        assert!(may_elect(&f));
    }
}
