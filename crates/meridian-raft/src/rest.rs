//! Resting followers: a follower that hears its leader needs no election timer.
//!
//! openraft wakes every replica's Raft core on a tick (`heartbeat_interval × 13/64`, ~20 ms
//! at 100 ms heartbeats) while the group is awake. On a follower the tick only runs the
//! election timer: "has my leader been silent for my election timeout?" While the leader's
//! appends keep arriving, the answer is no, and the wake-up was for nothing. With 256 busy
//! shards on three nodes that is ~38,000 Raft-core wake-ups a second, two thirds of them on
//! followers (measured, `bench/results/2026-12-05/heartbeat-batching.md`). Quiescence
//! (`quiesce`) stops the ticks of *idle* groups; this module stops them on the followers of
//! *busy* ones, as CockroachDB and TiKV drive their election timers from a node-level loop
//! rather than a timer per group.
//!
//! ```text
//!  each append openraft accepts (a heartbeat or entries whose vote it took: Success,
//!  PartialSuccess or Conflict — not HigherVote) → heard = when the append was received
//!  node loop, every heartbeat_interval, for each awake (not quiesced) replica:
//!    follower or learner, heard within rest_after, not held → ticker off (resting)
//!    otherwise, if resting                                  → ticker on (openraft decides)
//!  named a leader transfer's target → held for election_timeout_max, ticker on at once
//! ```
//!
//! # Why a dead leader is noticed as early as before
//! openraft's election timer is not a countdown of ticks: each tick compares *now* with the
//! time the follower last took its leader's vote (a received append), and elects once its
//! leader lease (`election_timeout_max`, while the vote is a committed leader's) and its
//! randomized election timeout (`election_timeout_min` or more) have both passed since. A tick
//! that resumes after a rest therefore decides exactly as a tick would have at that moment.
//! After a leader transfer reaches a voter, openraft drops that lease, and the voter may elect
//! `election_timeout_min` after its last append: the tightest case, and the one the timing
//! below is sized for. A follower's ticker is off only while it received an accepted append
//! within `rest_after`; the loop sees the silence at most one loop period later, and the
//! ticker's first tick comes at most one tick interval after that. `rest_after` is chosen (see
//! [`rest_after_ms`]) so that the sum, with a margin for a late loop, ends by
//! `election_timeout_min`. `heard` is the append's *receipt* time, never later than the moment
//! openraft took the vote (its answer comes only after the log flush).
//!
//! Only accepted appends count: a candidate's vote requests do not. Counting them would let a
//! candidate that keeps losing (its log is behind) keep every other follower's ticker off, and
//! the group would never elect.
//!
//! # Invariants
//! - The loop turns a ticker off only for an awake, unheld replica that is a follower or
//!   learner and received an accepted append within `rest_after`; it turns on only tickers it
//!   turned off.
//! - The loop's switches and a transfer's are serialized per replica (`switching`), so a
//!   transfer target's ticker, once on, stays on while it is held.
//! - Quiescence owns the ticker of a parked or waking replica: parking clears `resting`, and a
//!   ticker the loop turns on for a replica that meanwhile parked is turned off again.
//! - A transfer's target turns its ticker on before it campaigns and does not rest for
//!   `election_timeout_max` (its metrics say follower until openraft has flushed its log and
//!   campaigned); any other change of role is seen within one loop period.
//!
//! # Not done yet
//! - A replica elected without a transfer naming it (its own timer: its ticker was on) is
//!   never resting; but `trigger().elect()` on a resting replica (nothing calls it today)
//!   would campaign without ticks for up to one loop period.
//! - The loop walks every replica each period; at many thousands of awake replicas per node a
//!   list of followers kept by role changes would be cheaper.

use crate::host::{MultiRaft, ShardReplica};
use crate::quiesce::now_ms;
use crate::types::{AppendEntriesResponse, NodeId, StreamAppendError, StreamAppendResult};
use openraft::type_config::async_runtime::WatchReceiver;
use openraft::ServerState;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::Mutex;

/// The node loop's period (`quiesce::spawn_quiescence`): one heartbeat interval, at least 10 ms.
pub fn loop_period_ms(heartbeat_interval: u64) -> u64 {
    heartbeat_interval.max(10)
}

/// How long after its last accepted append a follower may keep its ticker off, in ms, or
/// `None` when the timings leave no room (the ticker then always runs, as in plain openraft).
///
/// The ticker must be back before `election_timeout_min` after the last append, so
/// `rest_after`, one loop period ([`loop_period_ms`]), one tick interval (openraft's,
/// `heartbeat_interval × 13/64`) and a margin for a late loop (a quarter period) add up to at
/// most `election_timeout_min`. `rest_after` takes what is left, and must be at least 1.5
/// heartbeat intervals so that one late heartbeat does not switch the ticker back on.
pub fn rest_after_ms(heartbeat_interval: u64, election_timeout_min: u64) -> Option<u64> {
    let period = loop_period_ms(heartbeat_interval);
    let tick = (heartbeat_interval * 13 / 64).max(1);
    let reserved = period + tick + period / 4;
    let rest_after = election_timeout_min.checked_sub(reserved)?;
    (rest_after * 2 >= heartbeat_interval * 3).then_some(rest_after)
}

/// What the loop does with one replica's ticker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Switch {
    /// Ticker off (again: a delayed wake-up may have turned it on meanwhile).
    Rest,
    /// Ticker on: the loop had turned it off, and the reason is gone.
    Resume,
    /// Leave it alone.
    Keep,
}

/// The loop's decision for an awake replica in `state` that last received an append it
/// accepted `heard_ago_ms` ago (`None`: never), `resting` telling whether the loop turned its
/// ticker off, `held` whether it was named a leader transfer's target lately (it is about to
/// campaign, though its metrics may still say follower).
pub fn decide(
    state: ServerState,
    heard_ago_ms: Option<u64>,
    rest_after_ms: u64,
    resting: bool,
    held: bool,
) -> Switch {
    let may_rest = !held
        && matches!(state, ServerState::Follower | ServerState::Learner)
        && heard_ago_ms.is_some_and(|ago| ago <= rest_after_ms);
    match (may_rest, resting) {
        (true, _) => Switch::Rest,
        (false, true) => Switch::Resume,
        (false, false) => Switch::Keep,
    }
}

/// A replica's resting state (`heard_ms` lock-free: touched on every accepted append).
#[derive(Default)]
pub struct Rest {
    /// When this replica last *received* an append it then accepted (`quiesce::now_ms`; 0 =
    /// never): receipt, not answer, time, so never later than the moment openraft renewed
    /// the leader's lease with it (an answer waits for the log flush).
    heard_ms: AtomicU64,
    /// The loop turned this replica's ticker off.
    resting: AtomicBool,
    /// Named a leader transfer's target: no rest before this time (`now_ms`).
    hold_until_ms: AtomicU64,
    /// Serializes the loop's switches with a transfer's, so neither undoes the other half way.
    switching: Mutex<()>,
}

impl Rest {
    pub fn is_resting(&self) -> bool {
        self.resting.load(SeqCst)
    }
}

impl ShardReplica {
    /// Notes this replica's answer to an append (a unary or coalesced heartbeat) received at
    /// `received_ms` (`quiesce::now_ms`).
    pub fn note_append_answer(
        &self,
        received_ms: u64,
        answer: &Result<AppendEntriesResponse, String>,
    ) {
        if matches!(answer, Ok(r) if !matches!(r, AppendEntriesResponse::HigherVote(_))) {
            self.note_accepted_append(received_ms);
        }
    }

    /// Notes this replica's answer to an append on a replication stream, received at
    /// `received_ms`.
    pub fn note_stream_answer(
        &self,
        received_ms: u64,
        answer: &Result<StreamAppendResult, String>,
    ) {
        if matches!(answer, Ok(Ok(_)) | Ok(Err(StreamAppendError::Conflict(_)))) {
            self.note_accepted_append(received_ms);
        }
    }

    /// openraft took an append's vote (the sender is this replica's leader, its lease renewed):
    /// anything but a higher-vote refusal.
    fn note_accepted_append(&self, received_ms: u64) {
        self.rest.heard_ms.fetch_max(received_ms.max(1), SeqCst);
    }

    /// A leader transfer reached this replica. Its target is about to campaign, and a
    /// candidate or leader needs its ticks at once, though its metrics may say follower for a
    /// while yet (openraft first flushes its log): no rest for `election_timeout_max`, and
    /// the ticker on now if the loop had turned it off. Other voters may rest on: their
    /// ticker is back before their (lease-less, after a transfer) election could be due.
    pub fn on_transfer_leader(&self, target: NodeId) {
        if target != self.raft.metrics().borrow_watched().id {
            return;
        }
        let _switching = self.switching();
        let hold = self.raft.config().election_timeout_max;
        self.rest.hold_until_ms.store(now_ms() + hold, SeqCst);
        if self.rest.is_resting() {
            self.resume_ticker();
        }
    }

    /// Held while switching this replica's ticker for `rest` (see [`Rest::switching`]).
    fn switching(&self) -> std::sync::MutexGuard<'_, ()> {
        self.rest
            .switching
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// Quiescence parked this replica: its ticker is quiescence's from now on.
    pub(crate) fn forget_rest(&self) {
        self.rest.resting.store(false, SeqCst);
    }

    /// Ticker on, no longer resting (the caller holds `switching`); a replica that parked
    /// meanwhile stays without one.
    fn resume_ticker(&self) {
        self.rest.resting.store(false, SeqCst);
        self.raft.runtime_config().tick(true);
        if self.is_quiesced() {
            self.raft.runtime_config().tick(false);
        }
    }

    /// One loop step for this replica (see the module docs).
    fn rest_step(&self, now: u64, rest_after: u64) {
        if self.is_quiesced() {
            return;
        }
        let _switching = self.switching();
        let heard = self.rest.heard_ms.load(SeqCst);
        let heard_ago = (heard != 0).then(|| now.saturating_sub(heard));
        let state = self.raft.metrics().borrow_watched().state;
        let held = now < self.rest.hold_until_ms.load(SeqCst);
        match decide(state, heard_ago, rest_after, self.rest.is_resting(), held) {
            Switch::Rest => {
                self.rest.resting.store(true, SeqCst);
                self.raft.runtime_config().tick(false);
                // Parked meanwhile: quiescence owns the (already stopped) ticker.
                if self.is_quiesced() {
                    self.forget_rest();
                }
            }
            Switch::Resume => self.resume_ticker(),
            Switch::Keep => {}
        }
    }
}

impl MultiRaft {
    /// The resting loop's `rest_after` for this node's Raft timings, or `None` (no resting
    /// loop) when turned off or when the timings leave no room (logged).
    pub(crate) fn rest_after(&self, wanted: bool) -> Option<u64> {
        if !wanted {
            return None;
        }
        let (hb, min) = (
            self.raft_config.heartbeat_interval,
            self.raft_config.election_timeout_min,
        );
        let rest_after = rest_after_ms(hb, min);
        match rest_after {
            Some(ms) => tracing::debug!(rest_after_ms = ms, "followers rest between heartbeats"),
            None => tracing::info!(
                heartbeat_interval_ms = hb,
                election_timeout_min_ms = min,
                "followers keep their election tickers: the timings leave no room to rest \
                 (election_timeout_min must be about 3 heartbeat intervals or more)"
            ),
        }
        rest_after
    }

    /// One pass of the resting loop over this node's replicas (from the node loop in
    /// `quiesce`, every heartbeat interval).
    pub(crate) fn rest_round(&self, rest_after: u64) {
        let now = now_ms();
        for replica in self.replicas() {
            replica.rest_step(now, rest_after);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ticker_is_back_before_the_earliest_election() {
        for (hb, min) in [
            (100, 600),
            (400, 1_500),
            (50, 150),
            (400, 1_200),
            (10, 30),
            (5, 30),
        ] {
            let rest_after = rest_after_ms(hb, min).expect("room to rest");
            let (period, tick) = (loop_period_ms(hb), (hb * 13 / 64).max(1));
            assert!(
                rest_after + period + tick + period / 4 <= min,
                "hb {hb}, min {min}: rest {rest_after}"
            );
            assert!(
                rest_after * 2 >= hb * 3,
                "one late heartbeat must not resume"
            );
        }
        assert_eq!(rest_after_ms(100, 600), Some(455));
        assert_eq!(rest_after_ms(400, 1_500), Some(919));
    }

    #[test]
    fn no_rest_when_the_timings_leave_no_room() {
        assert_eq!(rest_after_ms(100, 250), None, "rest_after 105 < 150");
        assert_eq!(rest_after_ms(100, 100), None);
        assert_eq!(rest_after_ms(0, 0), None);
    }

    #[test]
    fn only_a_follower_or_learner_that_heard_its_leader_rests() {
        use ServerState::*;
        assert_eq!(decide(Follower, Some(100), 455, false, false), Switch::Rest);
        assert_eq!(decide(Learner, Some(455), 455, false, false), Switch::Rest);
        // Resting already: asserted again (a delayed wake-up may have turned the ticker on).
        assert_eq!(decide(Follower, Some(0), 455, true, false), Switch::Rest);
        // Silent too long, never heard, or no longer a follower: the ticker comes back.
        assert_eq!(
            decide(Follower, Some(456), 455, true, false),
            Switch::Resume
        );
        assert_eq!(decide(Follower, None, 455, true, false), Switch::Resume);
        assert_eq!(decide(Candidate, Some(1), 455, true, false), Switch::Resume);
        assert_eq!(decide(Leader, Some(1), 455, true, false), Switch::Resume);
        // A ticker the loop did not stop is not its to start.
        assert_eq!(decide(Follower, Some(456), 455, false, false), Switch::Keep);
        assert_eq!(decide(Leader, Some(1), 455, false, false), Switch::Keep);
        assert_eq!(decide(Candidate, None, 455, false, false), Switch::Keep);
    }

    #[test]
    fn a_transfer_target_does_not_rest_while_its_metrics_still_say_follower() {
        use ServerState::*;
        // Named a transfer's target: openraft flushes its log before it campaigns, and its
        // metrics say follower (with a fresh append) until then.
        assert_eq!(decide(Follower, Some(1), 455, true, true), Switch::Resume);
        assert_eq!(decide(Follower, Some(1), 455, false, true), Switch::Keep);
        assert_eq!(decide(Leader, Some(1), 455, false, true), Switch::Keep);
    }
}
