//! Parked leases, enforced: followers keep their promises, and a parked leader whose lease
//! holds serves reads ([`MultiRaft::serves_parked_read`], used by the server's plain reads:
//! `Get`, `BatchGet` parts and scan pages outside transactions).
//!
//! `parked_lease` states the rules; this module makes the nodes keep them. A follower that
//! parks under leader L (answering L's `Quiesce`) makes a [`Promise`]: while it is in force,
//! the follower
//! - grants no vote and no pre-vote to a candidate other than L (the transport answers such a
//!   request with a refusal before openraft sees it),
//! - gets no vote for its own candidacy: its own vote and pre-vote requests are answered
//!   locally with a refusal ([`CampaignGate`]), whatever openraft's election switch says (an
//!   election timer, `TransferLeader`, `trigger().elect()`; openraft may still raise its
//!   term, which disrupts but elects no one),
//! - and hands a `TransferLeader` for another target to openraft only once the promise's
//!   leader released it (`settle_for_transfer`; during the restart quarantine, once that is
//!   over).
//!
//! The same gate keeps a restarted node from campaigning during its restart quarantine
//! (`election_timeout_max` after its start, when it also refuses votes): it forgot its
//! promises, and the leaders it made them to may still count its answers.
//!
//! # How a promise ends
//! - **L's node falls silent** for `election_timeout_max`, or is heard again after such a
//!   silence (a lapse, `PingLedger`): checked on every use, and a promise found lapsed is
//!   dropped.
//! - **L released it.** A follower with a promise that is not parked any more (woken by L or by
//!   anyone else) sends L's node a `Wake` for the shard, once per quiescence round until it is
//!   answered. L's node answers only after its replica left the parked state
//!   (`wake_requested` records the activity, waits out a quiesce round in progress, and
//!   resumes the replica first), so after the answer L serves no more parked reads on that
//!   parking.
//!   A late message from L (a heartbeat sent before the parking) wakes the follower but does
//!   not end the promise: only the answer does.
//! - Each promise has a generation; an answer ends only the promise it was asked for, not one
//!   made since (L parked again and the follower confirmed again).
//!
//! # Parking atomically with the vote
//! A follower parks only while its vote is L's. openraft's metrics, which `follower_can_park`
//! reads, can lag the core, and a vote request may be between the transport's check and the
//! core. So parking first makes the promise (from then on every new vote request for another
//! candidate is refused), then checks that no vote request is in flight, then asks the core
//! for its vote (`with_raft_state`): a vote answered before the count was read shows there,
//! one in flight shows in the count. Each side writes its own flag and then reads the
//! other's, with a full fence between, so at least one of them sees the other. A parking that
//! fails puts back the promise held before it (a repeated `Quiesce` must not end a promise
//! the leader's current parking counts).
//!
//! # Not done yet
//! - Times are `Instant`s (CLOCK_MONOTONIC), which stop while the machine is suspended.
//! - A promise also ends when the follower is no longer a member, but only by its leader's
//!   silence or release: a removed follower's promise can outlive the membership change (it
//!   refuses votes of a group that no longer counts it, which is harmless).

use crate::host::{MultiRaft, ShardReplica};
use crate::parked_lease::{restart_quarantine, Heard, PingLedger, Promise};
use crate::quiesce::{now_ms, QuiesceRequest};
use crate::types::NodeId;
use std::sync::atomic::{fence, AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, Mutex};

/// A replica's promise to its parked leader, if it made one, and the votes in flight.
#[derive(Default)]
pub struct PromiseSlot {
    held: Mutex<Option<(Promise, u64)>>,
    generations: AtomicU64,
    votes_in_flight: AtomicU64,
}

/// Whether a promise made as `promise` forbids helping `candidate` now: it is in force (see
/// [`Promise::in_force`]) and `candidate` is not its leader.
pub fn forbids(
    promise: &Promise,
    heard: &Heard,
    candidate: NodeId,
    now_ms: u64,
    election_timeout_max_ms: u64,
) -> bool {
    promise.in_force(heard, now_ms, election_timeout_max_ms) && promise.forbids(candidate)
}

impl PromiseSlot {
    /// Makes `promise` (replacing any other); returns its generation.
    pub fn make(&self, promise: Promise) -> u64 {
        let generation = self.generations.fetch_add(1, SeqCst) + 1;
        *self.lock() = Some((promise, generation));
        // Parking reads the votes in flight next (see the module docs).
        fence(SeqCst);
        generation
    }

    /// Ends the promise of `generation`, if it is still the one held; whether it did.
    pub fn end(&self, generation: u64) -> bool {
        let mut held = self.lock();
        if held.is_some_and(|(_, g)| g == generation) {
            *held = None;
            return true;
        }
        false
    }

    /// Puts `previous` back in place of the promise of `generation`, if that is still the
    /// one held (a parking that failed after [`PromiseSlot::make`]).
    pub fn restore(&self, generation: u64, previous: Option<(Promise, u64)>) {
        let mut held = self.lock();
        if held.is_some_and(|(_, g)| g == generation) {
            *held = previous;
        }
    }

    /// The promise held, with its generation (in force or not).
    pub fn held(&self) -> Option<(Promise, u64)> {
        *self.lock()
    }

    /// The promise in force now, given what this node heard of its leader's node; one that
    /// lapsed is dropped.
    pub fn in_force(
        &self,
        ledger: &PingLedger,
        now_ms: u64,
        election_timeout_max_ms: u64,
    ) -> Option<Promise> {
        let mut held = self.lock();
        let (promise, _) = (*held)?;
        let heard = ledger.heard(promise.leader);
        if promise.in_force(&heard, now_ms, election_timeout_max_ms) {
            Some(promise)
        } else {
            *held = None;
            None
        }
    }

    /// The leader whose promise forbids helping `candidate` at `now_ms`, if one does.
    pub fn forbidding(
        &self,
        candidate: NodeId,
        ledger: &PingLedger,
        now_ms: u64,
        election_timeout_max_ms: u64,
    ) -> Option<NodeId> {
        self.in_force(ledger, now_ms, election_timeout_max_ms)
            .filter(|p| p.forbids(candidate))
            .map(|p| p.leader)
    }

    /// A vote or pre-vote request is about to be checked and handed to openraft: counted
    /// until the guard drops.
    pub fn vote_starts(&self) -> VoteInFlight<'_> {
        self.votes_in_flight.fetch_add(1, SeqCst);
        // The request reads the promise next (see the module docs).
        fence(SeqCst);
        VoteInFlight(self)
    }

    /// Whether a vote or pre-vote request is between its check and openraft's answer.
    pub fn votes_in_flight(&self) -> bool {
        self.votes_in_flight.load(SeqCst) > 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<(Promise, u64)>> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A vote request being checked or answered (see [`PromiseSlot::vote_starts`]).
pub struct VoteInFlight<'a>(&'a PromiseSlot);

impl Drop for VoteInFlight<'_> {
    fn drop(&mut self) {
        self.0.votes_in_flight.fetch_sub(1, SeqCst);
    }
}

impl MultiRaft {
    /// Whether `replica` may take part in a leadership transfer to `target` now: past this
    /// node's restart quarantine, with no promise in force that forbids helping `target`.
    pub fn may_join_transfer(&self, replica: &ShardReplica, target: NodeId) -> bool {
        let (now, etmax) = (now_ms(), self.raft_config.election_timeout_max);
        !restart_quarantine(self.started_ms, now, etmax)
            && replica
                .quiet
                .promise
                .forbidding(target, &self.ping_ledger, now, etmax)
                .is_none()
    }

    /// Waits (at most 2 × `election_timeout_max`) until [`MultiRaft::may_join_transfer`],
    /// asking the leader of a promise in the way to release it; whether it may.
    pub async fn settle_for_transfer(&self, replica: &ShardReplica, target: NodeId) -> bool {
        let etmax = self.raft_config.election_timeout_max;
        let deadline = now_ms() + 2 * etmax;
        while !self.may_join_transfer(replica, target) {
            if now_ms() >= deadline {
                return false;
            }
            let held = replica.quiet.promise.held();
            if let Some((promise, _)) = held {
                if self.wake_and_release(replica, promise.leader).await {
                    continue;
                }
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        true
    }
}

/// Whether one shard's replica may campaign (send vote or pre-vote requests), held by its
/// Raft network: not during the node's restart quarantine, not under a promise in force.
pub struct CampaignGate {
    pub me: NodeId,
    pub promise: Arc<PromiseSlot>,
    pub ledger: Arc<PingLedger>,
    /// This process's start (`quiesce::now_ms`), for the restart quarantine.
    pub started_ms: u64,
    pub election_timeout_max_ms: u64,
}

impl CampaignGate {
    /// Why this replica may not campaign now, if it may not.
    pub fn refusal(&self) -> Option<String> {
        self.refusal_at(now_ms())
    }

    /// [`CampaignGate::refusal`] at `now_ms`.
    pub fn refusal_at(&self, now_ms: u64) -> Option<String> {
        let etmax = self.election_timeout_max_ms;
        if restart_quarantine(self.started_ms, now_ms, etmax) {
            return Some(format!(
                "node {} started less than election_timeout_max ({etmax} ms) ago and does not campaign yet",
                self.me
            ));
        }
        let leader = self
            .promise
            .forbidding(self.me, &self.ledger, now_ms, etmax)?;
        Some(format!(
            "node {} promised its parked leader {leader} not to campaign while that leader's node is heard",
            self.me
        ))
    }
}

impl MultiRaft {
    /// Whether a linearizable read of `replica` may be served now without waking it and
    /// without a Raft round: this node leads it parked and its parked lease holds
    /// (`ShardReplica::parked_lease_holds`, which re-checks the parked state after it
    /// evaluated the lease: whatever wakes the shard — a write, a vote request, a transfer —
    /// leaves that state before it acts). Counted in `parked_reads`.
    pub fn serves_parked_read(&self, replica: &ShardReplica) -> bool {
        let holds = replica.parked_lease_holds(&self.ping_ledger);
        if holds {
            self.parked_reads.fetch_add(1, SeqCst);
        }
        holds
    }

    /// Sends `Wake` for the replica's shard to `leader`'s node. The node answers only once its
    /// replica is not parked, so the answer also ends a promise to `leader` held when the
    /// `Wake` was sent (see `parked_promise`); a leader no longer in the group's membership
    /// leads nothing there, and a promise to it ends at once.
    pub(crate) fn wake_leader(self: &Arc<Self>, replica: &Arc<ShardReplica>, leader: NodeId) {
        let (host, replica) = (self.clone(), replica.clone());
        tokio::spawn(async move {
            host.wake_and_release(&replica, leader).await;
            replica.quiet.releasing.store(false, SeqCst);
        });
    }

    /// [`MultiRaft::wake_leader`], awaited: whether the `Wake` was answered (or `leader` is no
    /// longer a member); a promise to `leader` held before it was sent is then ended.
    async fn wake_and_release(&self, replica: &ShardReplica, leader: NodeId) -> bool {
        let promise = &replica.quiet.promise;
        let held = promise.held().filter(|(p, _)| p.leader == leader);
        let answered = match replica.member_addr(leader) {
            None => true,
            Some(addr) => self.pool.wake(&addr, replica.shard).await.is_ok(),
        };
        if let (true, Some((_, generation))) = (answered, held) {
            promise.end(generation);
        }
        answered
    }

    /// A follower that holds a promise but is not parked any more asks the promise's leader
    /// to release it (a `Wake`, see [`MultiRaft::wake_leader`]): one in flight per replica,
    /// sent again each round until answered or lapsed.
    pub(crate) fn release_promise(self: &Arc<Self>, replica: &Arc<ShardReplica>) {
        let Some((promise, _)) = replica.quiet.promise.held() else {
            return;
        };
        if !replica.quiet.releasing.swap(true, SeqCst) {
            self.wake_leader(replica, promise.leader);
        }
    }
}

impl ShardReplica {
    /// The follower side of `Quiesce`: parks if `from` may, promising `from` (`lapses`:
    /// `from`'s node's lapse count, heard just before); returns whether it did.
    pub async fn park_on_request(&self, from: NodeId, req: &QuiesceRequest, lapses: u64) -> bool {
        if !self.view().follower_can_park(from, req) {
            return false;
        }
        // The promise first, then no vote in flight, then the core's vote: a vote that starts
        // later sees the promise, one in flight shows in the count, and one answered before
        // the count was read shows in the core (see the module docs).
        let promise = &self.quiet.promise;
        let previous = promise.held();
        let generation = promise.make(crate::parked_lease::Promise {
            leader: from,
            lapses,
        });
        let in_flight = promise.votes_in_flight();
        let core_vote = match in_flight {
            true => None,
            false => self.raft.with_raft_state(|st| *st.vote_ref()).await.ok(),
        };
        if core_vote != Some(req.vote) {
            // A promise it held before (a repeated Quiesce of a parking still counted) stays.
            promise.restore(generation, previous);
            return false;
        }
        self.park_under(from);
        true
    }

    /// The parked leader whose promise forbids this replica to help `candidate` now (a vote,
    /// a pre-vote or a leadership transfer), if one does.
    pub fn promise_forbids(&self, candidate: NodeId, ledger: &PingLedger) -> Option<NodeId> {
        let etmax = self.raft.config().election_timeout_max;
        self.quiet
            .promise
            .forbidding(candidate, ledger, now_ms(), etmax)
    }

    /// Whether this replica holds a promise in force now (one that lapsed is dropped, not
    /// counted: `meridian_raft_parked_promises`).
    pub fn promise_in_force(&self, ledger: &PingLedger) -> bool {
        let etmax = self.raft.config().election_timeout_max;
        self.quiet
            .promise
            .in_force(ledger, now_ms(), etmax)
            .is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const E: u64 = 1_000;

    fn heard(last_ms: u64, lapses: u64) -> Heard {
        Heard {
            last_ms: Some(last_ms),
            lapses,
        }
    }

    #[test]
    fn a_promise_forbids_other_candidates_only_while_its_leader_is_heard() {
        let p = Promise {
            leader: 1,
            lapses: 0,
        };
        // Heard 999 ms ago: in force; the leader itself may still be helped.
        assert!(forbids(&p, &heard(1_000, 0), 2, 1_999, E));
        assert!(!forbids(&p, &heard(1_000, 0), 1, 1_999, E));
        // Silent for election_timeout_max: ended.
        assert!(!forbids(&p, &heard(1_000, 0), 2, 2_000, E));
        // Heard again after a silence (a lapse): ended for good, however recent.
        assert!(!forbids(&p, &heard(5_000, 1), 2, 5_001, E));
        // Never heard: nothing to keep.
        assert!(!forbids(&p, &Heard::default(), 2, 10, E));
    }

    #[test]
    fn an_answer_ends_only_the_promise_it_was_asked_for() {
        let slot = PromiseSlot::default();
        let p = Promise {
            leader: 1,
            lapses: 0,
        };
        let first = slot.make(p);
        let second = slot.make(p);
        assert!(second > first);
        assert!(!slot.end(first), "a late answer for an older parking");
        assert_eq!(slot.held(), Some((p, second)));
        assert!(slot.end(second));
        assert_eq!(slot.held(), None);
        assert!(!slot.end(second));
    }

    #[test]
    fn a_failed_parking_puts_back_the_promise_held_before_it() {
        let slot = PromiseSlot::default();
        let p = Promise {
            leader: 1,
            lapses: 0,
        };
        let counted = slot.make(p);
        // A repeated Quiesce: a new promise, and the parking fails.
        let previous = slot.held();
        let failed = slot.make(p);
        slot.restore(failed, previous);
        assert_eq!(slot.held(), Some((p, counted)), "the counted promise stays");
        // A first parking that fails leaves none.
        let empty = PromiseSlot::default();
        let failed = empty.make(p);
        empty.restore(failed, None);
        assert_eq!(empty.held(), None);
        // A newer promise made meanwhile is not replaced.
        let newer = slot.make(p);
        slot.restore(failed, None);
        assert_eq!(slot.held(), Some((p, newer)));
    }

    #[test]
    fn a_lapsed_promise_is_dropped_and_a_live_one_kept() {
        let ledger = PingLedger::new(E);
        let slot = PromiseSlot::default();
        let token = ledger.hear(1);
        slot.make(Promise {
            leader: 1,
            lapses: token.lapses,
        });
        let now = now_ms();
        assert_eq!(slot.forbidding(2, &ledger, now, E), Some(1));
        assert_eq!(slot.forbidding(1, &ledger, now, E), None);
        assert!(
            slot.held().is_some(),
            "helping the leader keeps the promise"
        );
        // election_timeout_max after the leader's node was last heard: lapsed.
        assert_eq!(slot.forbidding(2, &ledger, now + E, E), None);
        assert_eq!(slot.held(), None, "a lapsed promise is dropped");
    }

    /// The metric counts promises in force: one whose leader's node was never heard (or fell
    /// silent) is held until something looks at it, and must not count.
    #[tokio::test]
    async fn a_replica_counts_only_a_promise_in_force() {
        let node = crate::proposals::tests::one_node(false).await;
        let replica = &node.replica;
        // one_node's election_timeout_max: 300 ms.
        let ledger = &PingLedger::new(300);
        replica.quiet.promise.make(Promise {
            leader: 7,
            lapses: 0,
        });
        assert!(replica.quiet.promise.held().is_some());
        assert!(
            !replica.promise_in_force(ledger),
            "node 7 was never heard: the promise has lapsed"
        );
        assert_eq!(replica.quiet.promise.held(), None);
        let token = ledger.hear(7);
        replica.quiet.promise.make(Promise {
            leader: 7,
            lapses: token.lapses,
        });
        assert!(replica.promise_in_force(ledger));
    }

    #[test]
    fn votes_in_flight_are_counted_until_answered() {
        let slot = PromiseSlot::default();
        assert!(!slot.votes_in_flight());
        let a = slot.vote_starts();
        let b = slot.vote_starts();
        drop(a);
        assert!(slot.votes_in_flight());
        drop(b);
        assert!(!slot.votes_in_flight());
    }

    #[test]
    fn the_gate_holds_campaigns_in_quarantine_and_under_a_promise() {
        let ledger = Arc::new(PingLedger::new(E));
        let promise = Arc::new(PromiseSlot::default());
        let gate = |started_ms| CampaignGate {
            me: 2,
            promise: promise.clone(),
            ledger: ledger.clone(),
            started_ms,
            election_timeout_max_ms: E,
        };
        assert_eq!(gate(0).refusal_at(E), None);
        let quarantined = gate(E).refusal_at(E + E - 1).unwrap();
        assert!(quarantined.contains("started less than"), "{quarantined}");
        // Heard the leader's node at some time in (0, E): at E the promise is in force.
        let _ = now_ms();
        std::thread::sleep(std::time::Duration::from_millis(3));
        let token = ledger.hear(1);
        let heard_at = ledger.heard(1).last_ms.unwrap();
        assert!(heard_at > 0 && heard_at < E, "{heard_at}");
        promise.make(Promise {
            leader: 1,
            lapses: token.lapses,
        });
        let promised = gate(0).refusal_at(E).unwrap();
        assert!(
            promised.contains("promised its parked leader 1"),
            "{promised}"
        );
        assert_eq!(gate(0).refusal_at(heard_at + E), None, "lapsed");
    }
}
