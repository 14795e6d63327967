//! A leader's quorum lease before it appends an entry.
//!
//! # Why
//! openraft (0.10) appends an entry for a leader only while its **quorum lease** holds: less
//! than `election_timeout_max` since a quorum last acknowledged it. Otherwise `client_write`,
//! `change_membership` and `add_learner` all fail with a `ForwardToLeader` that names nobody
//! ("has to forward request to: None, None"), although the node still leads. Two leaders are
//! in that state as a matter of course:
//! - a **parked** leader (see `quiesce`): its heartbeats stopped when the group quiesced, so
//!   nothing renewed the lease; waking it sends one heartbeat round, whose answers come back a
//!   round trip later than any entry proposed right after the wake;
//! - a leader just elected, not yet confirmed by a round of its own.
//!
//! A client write answered NOT_LEADER with no hint is retried by the client, after a backoff.
//! A membership change is not: the survival goal's role change (`meridian-server`'s
//! `survival`) tried again ten election timeouts later, by when the group had parked again, so
//! a goal given to a quiesced shard was never carried out (CI's container test, stop 52; the
//! cluster test `zone_survival_given_while_the_leader_is_parked`).
//!
//! # What
//! [`ShardReplica::renew_lapsed_lease`] runs before every entry this node's code appends as
//! leader: when the lease has less than a tenth of its length left
//! ([`ShardReplica::lease_has_margin`], the window lease reads use), it runs one quorum round
//! (ReadIndex, which acknowledges the leadership and so renews the lease; openraft sends its
//! heartbeats even while the parked group's are switched off), the whole call bounded by two
//! heartbeat intervals, one round's wait. A failure says nothing by itself: openraft then
//! decides, and a leader cut off from its quorum answers "no leader" about as soon as before.
//!
//! # Invariants
//! - Only a leader of a group with more than one voter waits (a lone voter's lease always
//!   holds), and only when the lease lacks its margin: an awake leader under load pays nothing.
//! - The wait is bounded by [`ShardReplica::round_wait`] (the quorum round and openraft's wait
//!   for the read's entry to apply, together); nothing is retried here.
//!
//! # Not done yet
//! - The round is a ReadIndex, which also waits for the read's entry to apply (a new leader's
//!   first entry); openraft has no "renew only" call.
//! - A proposal that passed the check with a sliver of lease left can still reach openraft
//!   after it lapsed (queued behind a batch): the client then gets NOT_LEADER and retries.

use crate::host::ShardReplica;
use openraft::type_config::async_runtime::WatchReceiver;
use openraft::{LinearizerOption, ReadPolicy};
use std::time::Duration;

/// How long after the last quorum acknowledgement a leader treats its lease as held: the
/// lease (`election_timeout_max`) less a tenth for clock-rate drift between nodes (see
/// `parked_lease::lease_window_ms`, which parked leases share).
pub fn lease_window(election_timeout_max_ms: u64) -> Duration {
    Duration::from_millis(crate::parked_lease::lease_window_ms(
        election_timeout_max_ms,
    ))
}

impl ShardReplica {
    /// Whether this leader's lease has at least a tenth of its length left ([`lease_window`]).
    ///
    /// openraft lets a leader serve lease reads until `election_timeout_max` after the last
    /// quorum acknowledgement, and followers refuse votes for as long after they last heard
    /// from it. Both sides measure with their own monotonic clocks, whose rates may differ; the
    /// leader uses only the first 90% so a slightly fast follower clock cannot end the
    /// followers' promise while the leader still reads from it.
    pub fn lease_has_margin(&self) -> bool {
        let window = lease_window(self.raft.config().election_timeout_max);
        let acked = self.raft.data_metrics().borrow_watched().last_quorum_acked;
        acked.is_some_and(|at| openraft::Instant::elapsed(&at.into_inner()) < window)
    }

    /// One quorum round's wait: two heartbeat intervals (a replica's round trip should be
    /// under one; `rtt_watch` warns when it is not).
    pub fn round_wait(&self) -> Duration {
        Duration::from_millis(self.raft.config().heartbeat_interval.saturating_mul(2))
    }

    /// Before this node appends an entry as the group's leader: renews a lease that lacks its
    /// margin with one quorum round, at most [`Self::round_wait`] (see the module docs). A
    /// no-op on a follower, on a group with one voter, and with the lease held.
    pub async fn renew_lapsed_lease(&self) {
        let metrics = self.raft.metrics();
        let (leads, several_voters) = {
            let m = metrics.borrow_watched();
            let several = m
                .membership_config
                .membership()
                .voter_ids()
                .nth(1)
                .is_some();
            (m.current_leader == Some(self.quiet.me), several)
        };
        if !leads || !several_voters || self.lease_has_margin() {
            return;
        }
        let wait = self.round_wait();
        let renew = LinearizerOption::from(ReadPolicy::ReadIndex).with_wait_timeout(wait);
        // openraft bounds the round by `wait`, then waits, unbounded, for this replica to apply
        // up to the read's log id: at once on a parked leader, but a leader just elected waits
        // for its first entry to commit, which a cut-off leader never sees. The whole call is
        // bounded, so the caller (holding its shard's `Changing`, or the GC loop) goes on.
        let _ = tokio::time::timeout(wait, self.ensure_linearizable(renew)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_window_stops_a_tenth_of_the_lease_early() {
        assert_eq!(lease_window(3_000), Duration::from_millis(2_700));
        assert_eq!(lease_window(1_200), Duration::from_millis(1_080));
        for lease_ms in [1u64, 7, 150, 999, 3_001, 60_000] {
            let window = lease_window(lease_ms).as_secs_f64() * 1_000.0;
            assert!(
                window <= lease_ms as f64 * 0.9,
                "{lease_ms} ms lease: a {window} ms window leaves less than the margin"
            );
            assert!(window > lease_ms as f64 * 0.9 - 1.0, "{lease_ms}: {window}");
        }
    }
}
