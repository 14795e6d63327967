//! Parked leases: the rules for serving linearizable reads from a quiesced shard.
//!
//! This module holds the rules, as pure functions, their model, and the ping records
//! ([`PingLedger`]). `parked_promise` enforces them: followers keep their promises, and a
//! parked leader whose lease holds serves linearizable plain reads (point, batch, scan page) without waking its shard
//! (`MultiRaft::serves_parked_read`). The design is in `docs/parked-reads.md`.
//!
//! # Why
//! A read keeps its group awake, because the lease is the group's own quorum acknowledgement
//! of a heartbeat. At 256 read-mostly shards per node that is thousands of heartbeat rounds a
//! second through as many Raft cores (`bench/results/2026-12-06/shard-count-profile`). Here a
//! parked leader's lease is instead tied to the node-level pings that quiescence already
//! sends (one per node pair per heartbeat interval), so a read need not wake the group.
//!
//! # The rules
//! All times are a node's own monotonic milliseconds; no rule compares two nodes' clocks.
//!
//! ```text
//!  every node, for each peer node: Heard{last, lapses}: a ping or a Quiesce received from
//!    the peer sets last; one received after a silence of election_timeout_max or more first
//!    counts a lapse. Answers to the peer carry a Token{incarnation, lapses}
//!  follower F parks under leader L (answering L's Quiesce with its token)
//!    → a Promise{leader L, lapses}: in force while no lapse was counted since and L's node
//!    is not silent now. While in force, F neither grants a vote to, nor pre-votes for, nor
//!    becomes, a candidate other than L, and drops TransferLeader. Once ended, it stays
//!    ended: hearing L again does not restore it (F may have voted meanwhile)
//!  node restart → every promise and count forgotten; the node neither grants votes
//!    (`refuses_votes`) nor campaigns (`parked_promise::CampaignGate`) for
//!    election_timeout_max after its start, and its tokens carry a new incarnation
//!  leader L, parked, serves a read iff a majority of the voters, L counted, are voters that
//!    confirmed parking with token T and whose latest answer carries T and answers a ping L
//!    sent (L's clock) less than 0.9 × election_timeout_max ago, and after L had every
//!    confirmation of the parking (so the voter received it after it parked)
//!  L leaves the parked state (any vote request for the shard, a write, a transfer) before
//!    it acts on what woke it, and serves no parked read after
//! ```
//!
//! # Why it is safe
//! Another leader needs a majority of votes, so a voter of L's lease majority. L itself
//! grants nothing while it serves parked reads. A follower F counted by an answer to a ping
//! sent at `s` received it at `r ≥ s`, and its answer carried the token of its parking, so
//! its promise had not ended by `r`. It holds until L's node has been silent for
//! `election_timeout_max`, from `r` or later: F refuses votes and does not campaign before
//! `r + election_timeout_max` (F's clock), while L's lease on that answer ends at
//! `s + 0.9 × election_timeout_max` (L's clock): safe as long as F's clock runs less than
//! 1/0.9 ≈ 1.11 times as fast as L's. A follower that restarted since its answer refuses
//! votes and does not campaign for `election_timeout_max` after its start, which came after
//! `r`; its later answers carry a new incarnation, so L stops counting it. The lapse count
//! is what keeps a follower that was cut off from L long enough to vote for another from
//! counting again when the link heals: its answers then carry a higher count.
//!
//! The model (`parked_lease_model_tests`) checks this over random delays, losses, cuts,
//! clock rates within 5% of real time, a pausing leader and restarting followers, in groups
//! of three and five voters; each negative control there breaks one rule and is caught. It
//! found the need for the lapse count: without it, a follower cut off past its promise,
//! which voted for another, counted again on its next answer.
//!
//! # Not covered here (the enforcement's job, `parked_promise`)
//! - How a promise ends other than by silence: L releases it (the answer to a follower's
//!   `Wake`, given only after L left the parked state; a late heartbeat from L does not).
//! - A parked leader's own vote: it leaves the parked state before openraft sees a vote
//!   request, a transfer or a proposal for the shard (`on_peer_message`, `touch`).
//! - A follower parks only while its vote is L's, checked through the Raft core and with no
//!   vote request in flight; `TransferLeader` is refused under a promise and during the
//!   restart quarantine (openraft campaigns on it whatever the election switch says).
//! - Times here are `Instant`s, which stop while the machine is suspended (not handled).

use crate::quiesce::now_ms;
use crate::types::NodeId;
use std::collections::HashMap;
use std::sync::Mutex;

/// The part of `election_timeout_max` a parked lease uses (the rest is the margin for clock
/// rates), in tenths.
pub const LEASE_TENTHS: u64 = 9;

/// How long after a ping's send time an answer to it counts for a parked lease; also the
/// window of the server's ordinary lease reads (`kv.rs`'s `lease_read_window`).
pub fn lease_window_ms(election_timeout_max_ms: u64) -> u64 {
    election_timeout_max_ms * LEASE_TENTHS / 10
}

/// What a node knows of hearing one peer node, for its promises to leaders on that node.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Heard {
    /// When a ping or a `Quiesce` from the peer was last received (this node's clock).
    pub last_ms: Option<u64>,
    /// How many times the peer was heard again after a silence of `election_timeout_max` or
    /// more (since this node's start): each such silence ended every promise to the peer.
    pub lapses: u64,
}

impl Heard {
    /// A ping or a `Quiesce` from the peer, received at `now_ms`.
    pub fn hear(&mut self, now_ms: u64, election_timeout_max_ms: u64) {
        if self.silent(now_ms, election_timeout_max_ms) && self.last_ms.is_some() {
            self.lapses += 1;
        }
        // The max: two threads may hear the peer at once and take their times in either order.
        self.last_ms = Some(self.last_ms.map_or(now_ms, |last| last.max(now_ms)));
    }

    /// Whether the peer has been silent for `election_timeout_max` (or never heard).
    pub fn silent(&self, now_ms: u64, election_timeout_max_ms: u64) -> bool {
        self.last_ms
            .is_none_or(|last| now_ms.saturating_sub(last) >= election_timeout_max_ms)
    }

    /// This node's token for the peer: what its answers to the peer carry.
    pub fn token(&self, incarnation: u64) -> Token {
        Token {
            incarnation,
            lapses: self.lapses,
        }
    }
}

/// What a follower's answers to a leader's node carry: its boot incarnation and its count of
/// the leader node's silences. A leader counts an answer only when it carries the token the
/// follower had when it confirmed parking: then no promise made then has ended since.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Token {
    pub incarnation: u64,
    pub lapses: u64,
}

/// A parked follower's promise to its leader.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Promise {
    pub leader: NodeId,
    /// The leader node's [`Heard::lapses`] when the follower parked (after hearing its
    /// `Quiesce`).
    pub lapses: u64,
}

impl Promise {
    /// Whether the promise holds at `now_ms`, given what this node heard of the leader's node:
    /// no silence of `election_timeout_max` since the parking, counting to now.
    pub fn in_force(&self, heard: &Heard, now_ms: u64, election_timeout_max_ms: u64) -> bool {
        heard.lapses == self.lapses && !heard.silent(now_ms, election_timeout_max_ms)
    }

    /// Whether a promise in force forbids helping `candidate` (a vote, a pre-vote, or the
    /// follower's own candidacy when `candidate` is itself).
    pub fn forbids(&self, candidate: NodeId) -> bool {
        candidate != self.leader
    }
}

/// Whether a node started at `started_ms` must still neither vote for others nor campaign.
pub fn restart_quarantine(started_ms: u64, now_ms: u64, election_timeout_max_ms: u64) -> bool {
    now_ms.saturating_sub(started_ms) < election_timeout_max_ms
}

/// A follower's latest answer to one of the leader's pings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Answer {
    /// When the leader sent the ping (the leader's clock).
    pub sent_ms: u64,
    pub token: Token,
}

/// What a leader knows of one voter for its parked lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VoterLease {
    pub voter: NodeId,
    /// The voter's token when it confirmed parking (`None`: it did not).
    pub parked: Option<Token>,
    /// When the leader had every confirmation of the parking (its clock): only answers to
    /// pings sent from then on count, as only those were received after the voter parked.
    pub confirmed_ms: u64,
    pub answer: Option<Answer>,
}

impl VoterLease {
    /// Whether this voter counts towards the lease at `now_ms`.
    pub fn counts(&self, now_ms: u64, election_timeout_max_ms: u64) -> bool {
        match (self.parked, self.answer) {
            (Some(parked), Some(a)) => {
                a.token == parked
                    && a.sent_ms >= self.confirmed_ms
                    && now_ms.saturating_sub(a.sent_ms) < lease_window_ms(election_timeout_max_ms)
            }
            _ => false,
        }
    }
}

/// Whether leader `me` may serve a read of its parked shard at `now_ms`: a majority of
/// `voters` (every voter of the shard's single config, `me` among them) counts.
pub fn lease_holds(
    me: NodeId,
    voters: &[VoterLease],
    now_ms: u64,
    election_timeout_max_ms: u64,
) -> bool {
    let counted = voters
        .iter()
        .filter(|v| v.voter == me || v.counts(now_ms, election_timeout_max_ms))
        .count();
    voters.iter().any(|v| v.voter == me) && counted * 2 > voters.len()
}

/// A node's ping records for parked leases: its boot incarnation, what it heard of each peer
/// node (the follower side: pings and `Quiesce` received) and each peer's latest answer to its
/// own pings (the leader side). Times are this process's monotonic milliseconds
/// (`quiesce::now_ms`). One entry per peer node ever heard, not per shard.
pub struct PingLedger {
    incarnation: u64,
    election_timeout_max_ms: u64,
    heard: Mutex<HashMap<NodeId, Heard>>,
    answers: Mutex<HashMap<NodeId, Answer>>,
}

impl PingLedger {
    /// The records of a node that just started (a new incarnation).
    pub fn new(election_timeout_max_ms: u64) -> PingLedger {
        PingLedger {
            incarnation: boot_incarnation(),
            election_timeout_max_ms,
            heard: Mutex::default(),
            answers: Mutex::default(),
        }
    }

    /// This process's boot incarnation (never 0).
    pub fn incarnation(&self) -> u64 {
        self.incarnation
    }

    /// A ping or a `Quiesce` from `peer` received now: the token to answer with.
    pub fn hear(&self, peer: NodeId) -> Token {
        self.hear_with(peer, now_ms)
    }

    /// [`PingLedger::hear`] at the time `now` gives, read under the lock.
    fn hear_with(&self, peer: NodeId, now: impl FnOnce() -> u64) -> Token {
        let mut heard = self.heard.lock().unwrap_or_else(|p| p.into_inner());
        let h = heard.entry(peer).or_default();
        h.hear(now(), self.election_timeout_max_ms);
        h.token(self.incarnation)
    }

    #[cfg(test)]
    fn hear_at(&self, peer: NodeId, now_ms: u64) -> Token {
        self.hear_with(peer, || now_ms)
    }

    /// What this node heard of `peer`.
    pub fn heard(&self, peer: NodeId) -> Heard {
        let heard = self.heard.lock().unwrap_or_else(|p| p.into_inner());
        heard.get(&peer).copied().unwrap_or_default()
    }

    /// Lapses counted so far, over every peer (see [`Heard::lapses`]).
    pub fn lapses_total(&self) -> u64 {
        let heard = self.heard.lock().unwrap_or_else(|p| p.into_inner());
        heard.values().map(|h| h.lapses).sum()
    }

    /// `peer` answered a ping this node sent at `sent_ms` with `token`; an answer to an older
    /// ping than the one recorded (a reordering) is ignored.
    pub fn note_answer(&self, peer: NodeId, sent_ms: u64, token: Token) {
        let mut answers = self.answers.lock().unwrap_or_else(|p| p.into_inner());
        let newer = answers.get(&peer).is_none_or(|a| a.sent_ms <= sent_ms);
        if newer {
            answers.insert(peer, Answer { sent_ms, token });
        }
    }

    /// `peer`'s latest answer to this node's pings.
    pub fn answer(&self, peer: NodeId) -> Option<Answer> {
        let answers = self.answers.lock().unwrap_or_else(|p| p.into_inner());
        answers.get(&peer).copied()
    }
}

/// A number that differs between two starts of a process with overwhelming probability:
/// the wall clock's nanoseconds mixed with the process id, never 0.
fn boot_incarnation() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let mixed = (nanos ^ (u64::from(std::process::id()) << 40)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    mixed.max(1)
}

#[cfg(test)]
#[path = "parked_lease_model_tests.rs"]
mod model_tests;

#[cfg(test)]
mod tests {
    use super::*;

    const E: u64 = 1_000;

    fn token(incarnation: u64, lapses: u64) -> Token {
        Token {
            incarnation,
            lapses,
        }
    }

    fn voter(id: NodeId, parked: Option<Token>, answer: Option<(u64, Token)>) -> VoterLease {
        VoterLease {
            voter: id,
            parked,
            confirmed_ms: 900,
            answer: answer.map(|(sent_ms, token)| Answer { sent_ms, token }),
        }
    }

    #[test]
    fn a_promise_ends_after_a_silence_and_later_pings_do_not_restore_it() {
        let mut heard = Heard::default();
        heard.hear(100, E);
        let p = Promise {
            leader: 1,
            lapses: heard.lapses,
        };
        assert!(p.in_force(&heard, 1_099, E));
        assert!(!p.in_force(&heard, 1_100, E));
        heard.hear(1_050, E);
        assert!(p.in_force(&heard, 2_049, E));
        // Heard again after a silence: a lapse, and the promise stays ended.
        heard.hear(3_050, E);
        assert_eq!(heard.lapses, 1);
        assert!(!p.in_force(&heard, 3_051, E));
        assert!(p.forbids(2) && !p.forbids(1));
    }

    #[test]
    fn the_lease_needs_a_majority_of_fresh_answers_with_the_parking_token() {
        let me = 1;
        let t = token(7, 0);
        let fresh = |id| voter(id, Some(t), Some((1_000, t)));
        let none = |id| voter(id, None, None);
        assert!(lease_holds(me, &[none(1), fresh(2), none(3)], 1_899, E));
        // 0.9 × E after the send, the answer no longer counts.
        assert!(!lease_holds(me, &[none(1), fresh(2), none(3)], 1_900, E));
        // An answer from a later incarnation (a restart), or after a lapse, does not count.
        let restarted = voter(2, Some(t), Some((1_000, token(8, 0))));
        assert!(!lease_holds(me, &[none(1), restarted, none(3)], 1_100, E));
        let lapsed = voter(2, Some(t), Some((1_000, token(7, 1))));
        assert!(!lease_holds(me, &[none(1), lapsed, none(3)], 1_100, E));
        // An answer to a ping sent before the parking was confirmed does not count.
        let early = voter(2, Some(t), Some((899, t)));
        assert!(!lease_holds(me, &[none(1), early, none(3)], 1_100, E));
        // A voter that did not confirm parking does not count.
        let unparked = voter(2, None, Some((1_000, t)));
        assert!(!lease_holds(me, &[none(1), unparked, none(3)], 1_100, E));
        // Five voters need three.
        assert!(!lease_holds(
            me,
            &[none(1), fresh(2), none(3), none(4), none(5)],
            1_100,
            E
        ));
        assert!(lease_holds(
            me,
            &[none(1), fresh(2), fresh(3), none(4), none(5)],
            1_100,
            E
        ));
        // A leader that is not a voter serves nothing.
        assert!(!lease_holds(9, &[fresh(2), fresh(3), fresh(4)], 1_100, E));
    }

    #[test]
    fn restarted_nodes_wait_an_election_timeout() {
        assert!(restart_quarantine(500, 1_499, E));
        assert!(!restart_quarantine(500, 1_500, E));
    }

    #[test]
    fn the_ledger_counts_lapses_per_peer_and_keeps_the_newest_answer() {
        let ledger = PingLedger::new(E);
        assert_ne!(ledger.incarnation(), 0);
        assert_eq!(ledger.hear_at(2, 100), token(ledger.incarnation(), 0));
        assert_eq!(ledger.hear_at(2, 1_099).lapses, 0);
        assert_eq!(
            ledger.hear_at(3, 5_000).lapses,
            0,
            "a first hearing is no lapse"
        );
        assert_eq!(ledger.hear_at(2, 2_099).lapses, 1);
        // A time read earlier but applied later does not move the last hearing back.
        assert_eq!(ledger.hear_at(2, 2_000).lapses, 1);
        assert_eq!(ledger.heard(2).last_ms, Some(2_099));
        assert_eq!(ledger.lapses_total(), 1);
        let t = token(9, 0);
        ledger.note_answer(2, 500, t);
        ledger.note_answer(2, 400, token(9, 1));
        assert_eq!(
            ledger.answer(2),
            Some(Answer {
                sent_ms: 500,
                token: t
            })
        );
        assert_eq!(ledger.answer(3), None);
    }
}
