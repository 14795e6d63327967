//! The closed-timestamp side channel: how the followers of an idle (or quiesced) shard learn
//! its closed timestamp, which a busy shard carries in its log entries (see `closed_ts`).
//!
//! ```text
//!  every closed_ts_interval_ms, on each node, for every data shard it leads:
//!    before = metrics;  C = issued.close(lag);  after = metrics      (C first, index after)
//!    publish (C, after.applied) iff  before and after lead the same term
//!                                and an entry of that term is applied
//!                                and applied == last log index          (idle)
//!                                and a quorum confirmed a round sent < 0.9 × lag ago
//!    otherwise send (0, applied): a round that only gathers confirmations
//!  one CloseTimestamps RPC per peer: the entries of the shards that peer is a voter or learner of
//!  follower: if it is in that term and follows the sender → offer (index, C), confirm shard
//!  leader: each confirmation stamps (peer, send time of the round) in the shard's Closer;
//!          only voters' stamps count toward the quorum
//! ```
//!
//! Why each condition is there (the model test `closed_ts_model_tests` breaks each one and
//! sees a follower claim a closed timestamp the log later contradicts):
//! - **Index read after `C`**: a proposal that settles between the two reads is then at or
//!   below the index; read before, it could be past it with a timestamp below `C`.
//! - **Idle**: entries in the leader's log past its applied index (an earlier term's, or its
//!   own whose writers gave up when the term changed) may carry timestamps below `C` that
//!   `Issued` no longer tracks. A busy shard publishes through its entries instead, where
//!   every earlier entry is before the one carrying `C`. (This also implies an entry of the
//!   leader's term is applied, which is checked anyway.)
//! - **Quorum confirmation**: openraft's lease cannot be trusted here (a quiesced leader has
//!   none, and a cooperative transfer elects its target while the followers' lease runs). A
//!   follower confirms a round only while it follows the sender in that term, so every later
//!   election needs a voter that confirmed before it voted: the election comes after the
//!   round's send time `t_s`. The old leader publishes only until `t_s + 0.9 × lag`, so its
//!   `C <= hlc(t_s) + 0.9 × lag - lag`, below the new leader's first timestamp (which is past
//!   its physical clock plus `max_offset` at the election, see `issued`).
//!
//! The RPC is node-level like `Quiesce`: it merges the sender's HLC and marks it alive, but
//! never goes through the per-shard admission that wakes a parked replica. So a quiesced
//! shard's followers keep their closed timestamp fresh and keep serving follower reads while
//! the group stays asleep.
//!
//! # Limits
//! At most [`MAX_ROUND_SHARDS`] entries per message (a node leading more shards sends them
//! over several rounds, in turn), one round in flight per peer, each with the RPC deadline.
//!
//! # Not done yet
//! - Deltas: every round names every led shard (about 32 bytes each).
//! - Learners get rounds (zone survival's replicas outside the home region serve follower
//!   reads) but their confirmations never count toward a quorum's.

use crate::closed_ts::publishable;
use crate::host::{InFlight, MultiRaft, ShardReplica};
use crate::types::{LogId, NodeId, RaftMetrics};
use openraft::type_config::async_runtime::WatchReceiver;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Most shards one `CloseTimestamps` message names.
pub const MAX_ROUND_SHARDS: usize = 8_192;

/// One shard's entry in a round: the sender leads `shard` in `term` and has applied `index`;
/// `closed_ts` (0: nothing published, a confirmation round) is closed at that index.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClosedEntry {
    pub shard: u64,
    pub term: u64,
    pub index: u64,
    pub closed_ts: u64,
}

/// What a leader's metrics say about the side channel's conditions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaderView {
    pub leading: bool,
    pub term: u64,
    pub applied: Option<LogId>,
    pub last_log_index: Option<u64>,
    pub voters: Vec<NodeId>,
    /// Learners take closed timestamps too (they serve follower reads: zone survival's
    /// replicas outside the home region), but never count toward a quorum's confirmation.
    pub learners: Vec<NodeId>,
}

impl LeaderView {
    pub fn of(m: &RaftMetrics, me: NodeId) -> LeaderView {
        LeaderView {
            leading: m.state == openraft::ServerState::Leader && m.current_leader == Some(me),
            term: m.current_term,
            applied: m.last_applied,
            last_log_index: m.last_log_index,
            voters: m.membership_config.voter_ids().collect(),
            learners: m.membership_config.membership().learner_ids().collect(),
        }
    }
}

/// The entry a leader sends for `shard` (see the module docs), from its metrics `before`
/// and `after` closing at `closed`; `None` when it does not lead throughout.
pub fn round_entry(
    shard: u64,
    before: &LeaderView,
    after: &LeaderView,
    closed: u64,
    confirmation_age: Option<Duration>,
    lag_ms: u64,
) -> Option<ClosedEntry> {
    if !(before.leading && after.leading && before.term == after.term) {
        return None;
    }
    let applied = after.applied?;
    let own_term_applied = applied.leader_id.term == after.term;
    let idle = after.last_log_index == Some(applied.index);
    let publish = own_term_applied && idle && publishable(confirmation_age, lag_ms);
    Some(ClosedEntry {
        shard,
        term: after.term,
        index: applied.index,
        closed_ts: if publish { closed } else { 0 },
    })
}

/// Whether a replica whose metrics say it is in `term_here` following `leader_here` takes
/// (and confirms) an entry of `term` from node `from`.
pub fn follower_accepts(
    term_here: u64,
    leader_here: Option<NodeId>,
    from: NodeId,
    term: u64,
) -> bool {
    term_here == term && leader_here == Some(from)
}

impl MultiRaft {
    /// Starts the side channel's sender: every `interval_ms`, one round to each of the node's
    /// peers (`set_peers`, read each round) for the data shards this node leads. Does nothing
    /// when `lag_ms` is 0 (closed timestamps off).
    pub fn spawn_closed_ts(self: &Arc<Self>, lag_ms: u64, interval_ms: u64) {
        if lag_ms == 0 {
            return;
        }
        let host = self.clone();
        let in_flight = Arc::new(InFlight::default());
        tokio::spawn(async move {
            let mut interval = tokio::time::interval(Duration::from_millis(interval_ms.max(1)));
            interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut cursor = 0usize;
            loop {
                interval.tick().await;
                cursor = host.closed_ts_round(&in_flight, lag_ms, cursor);
            }
        });
    }

    /// One round; returns where the next one starts among the led shards (when there are
    /// more than [`MAX_ROUND_SHARDS`]).
    fn closed_ts_round(
        self: &Arc<Self>,
        in_flight: &Arc<InFlight>,
        lag_ms: u64,
        cursor: usize,
    ) -> usize {
        let led: Vec<Arc<ShardReplica>> = self
            .replicas()
            .into_iter()
            .filter(|r| !r.shard.is_meta() && r.raft.is_leader())
            .collect();
        let start = if cursor < led.len() { cursor } else { 0 };
        let batch: Vec<&Arc<ShardReplica>> = led
            .iter()
            .cycle()
            .skip(start)
            .take(led.len().min(MAX_ROUND_SHARDS))
            .collect();
        let next = (start + batch.len()) % led.len().max(1);
        let mut per_peer: BTreeMap<NodeId, Vec<ClosedEntry>> = BTreeMap::new();
        let now = Instant::now();
        for replica in batch {
            let Some((entry, voters)) = self.closed_entry(replica, lag_ms, now) else {
                continue;
            };
            for voter in voters.into_iter().filter(|v| *v != self.node_id) {
                per_peer.entry(voter).or_default().push(entry);
            }
        }
        for (peer, addr) in self.peers() {
            let Some(entries) = per_peer.remove(&peer) else {
                continue;
            };
            if !in_flight.start(peer) {
                continue;
            }
            let (host, flags) = (self.clone(), in_flight.clone());
            tokio::spawn(async move {
                let sent_at = Instant::now();
                if let Ok(confirmed) = host.pool.close_timestamps(&addr, &entries).await {
                    host.note_confirmed(peer, &entries, &confirmed, sent_at);
                }
                flags.done(peer);
            });
        }
        next
    }

    /// This node's entry for a shard it leads, with the shard's voters and learners; publishes it to this
    /// replica's own closed state too (the leader's closed timestamp is what status shows).
    fn closed_entry(
        &self,
        replica: &ShardReplica,
        lag_ms: u64,
        now: Instant,
    ) -> Option<(ClosedEntry, Vec<NodeId>)> {
        let before = LeaderView::of(&replica.raft.metrics().borrow_watched(), self.node_id);
        let closed = replica.issued.close(&self.clock, lag_ms);
        let after = LeaderView::of(&replica.raft.metrics().borrow_watched(), self.node_id);
        let age = replica
            .closer
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .quorum_confirmed(after.term, &after.voters, self.node_id, now)
            .map(|at| now.saturating_duration_since(at));
        let entry = round_entry(replica.shard.0, &before, &after, closed, age, lag_ms)?;
        if entry.closed_ts != 0 {
            replica.sm.offer_closed(entry.index, entry.closed_ts);
        }
        let mut to = after.voters;
        to.extend(after.learners);
        Some((entry, to))
    }

    fn note_confirmed(
        &self,
        peer: NodeId,
        sent: &[ClosedEntry],
        confirmed: &[u64],
        sent_at: Instant,
    ) {
        let terms: BTreeMap<u64, u64> = sent.iter().map(|e| (e.shard, e.term)).collect();
        for shard in confirmed {
            // Only shards this round named, in the term it named them with.
            let (Some(term), Some(replica)) =
                (terms.get(shard), self.get(meridian_types::ShardId(*shard)))
            else {
                continue;
            };
            replica
                .closer
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .confirmed(*term, peer, sent_at);
        }
    }

    /// The follower side: takes each entry whose shard this node follows `from` on in that
    /// term (offering its closed timestamp) and returns those shards: the confirmations.
    /// Wakes nothing.
    pub fn on_closed_round(
        &self,
        from: NodeId,
        entries: &[ClosedEntry],
    ) -> Result<Vec<u64>, tonic::Status> {
        if entries.len() > MAX_ROUND_SHARDS {
            return Err(tonic::Status::invalid_argument(format!(
                "{} shards in one closed-timestamp round, over MAX_ROUND_SHARDS",
                entries.len()
            )));
        }
        let mut confirmed = Vec::new();
        for entry in entries {
            let Some(replica) = self.get(meridian_types::ShardId(entry.shard)) else {
                continue;
            };
            let (term, leader) = {
                let m = replica.raft.metrics();
                let m = m.borrow_watched();
                (m.current_term, m.current_leader)
            };
            if !follower_accepts(term, leader, from, entry.term) {
                continue;
            }
            if entry.closed_ts != 0 {
                replica.sm.offer_closed(entry.index, entry.closed_ts);
            }
            confirmed.push(entry.shard);
        }
        Ok(confirmed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::TypeConfig;

    fn view(term: u64, applied: Option<(u64, u64)>, last: u64) -> LeaderView {
        LeaderView {
            leading: true,
            term,
            applied: applied.map(|(t, i)| openraft::testing::log_id::<TypeConfig>(t, 1, i)),
            last_log_index: Some(last),
            voters: vec![1, 2, 3],
            learners: vec![],
        }
    }

    /// A leader publishes only while leading one term throughout, idle, with an entry of its
    /// term applied and a recent quorum confirmation; otherwise it sends a confirmation round.
    #[test]
    fn a_round_publishes_only_when_every_condition_holds() {
        let ok = view(3, Some((3, 10)), 10);
        let fresh = Some(Duration::from_millis(100));
        let entry = |before: &LeaderView, after: &LeaderView, age| {
            round_entry(7, before, after, 500, age, 3_000)
        };
        assert_eq!(
            entry(&ok, &ok, fresh),
            Some(ClosedEntry {
                shard: 7,
                term: 3,
                index: 10,
                closed_ts: 500
            })
        );
        let closed = |e: Option<ClosedEntry>| e.map(|e| e.closed_ts);
        assert_eq!(closed(entry(&ok, &ok, None)), Some(0), "never confirmed");
        assert_eq!(
            closed(entry(&ok, &ok, Some(Duration::from_millis(2_700)))),
            Some(0),
            "confirmation too old"
        );
        let busy = view(3, Some((3, 10)), 11);
        assert_eq!(
            closed(entry(&ok, &busy, fresh)),
            Some(0),
            "an unapplied entry"
        );
        let old_term = view(3, Some((2, 10)), 10);
        assert_eq!(
            closed(entry(&ok, &old_term, fresh)),
            Some(0),
            "no own-term entry applied"
        );
        let next_term = view(4, Some((4, 10)), 10);
        assert_eq!(
            entry(&ok, &next_term, fresh),
            None,
            "the term changed around C"
        );
        let mut deposed = ok.clone();
        deposed.leading = false;
        assert_eq!(entry(&ok, &deposed, fresh), None);
        assert_eq!(entry(&deposed, &ok, fresh), None);
        assert_eq!(
            entry(&ok, &view(3, None, 0), fresh),
            None,
            "nothing applied"
        );
    }

    /// A follower takes a round only from the leader it follows, in its term.
    #[test]
    fn a_follower_takes_rounds_only_from_its_leader_in_its_term() {
        assert!(follower_accepts(5, Some(1), 1, 5));
        assert!(
            !follower_accepts(6, Some(1), 1, 5),
            "it voted in a later term"
        );
        assert!(!follower_accepts(5, Some(2), 1, 5), "another leader");
        assert!(!follower_accepts(5, None, 1, 5), "no leader known");
    }
}
