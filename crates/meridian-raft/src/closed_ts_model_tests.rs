//! A model of closing timestamps across leaders, clocks and the two ways a closed timestamp
//! travels, checked against the final log: a follower whose closed timestamp is `F` with
//! applied index `a` must hold every version `<= F` the log will ever have (none at an index
//! past `a`).
//!
//! The model uses the real rules ([`closable`], [`publishable`], [`ClosedState`]) over
//! abstract integer clocks: three nodes whose physical clocks are within `max_offset` of each
//! other; nodes 0 and 1 take turns leading, node 2 is the follower whose reads are checked.
//! Appending is committing (the log is the committed log); proposals are appended in any
//! order; a command may write nothing (a failed CAS), so it does not raise the version floor;
//! a deposed leader keeps running its side channel without knowing it was deposed.
//!
//! Negative controls: each [`Rule`] breaks one condition of the protocol and the search must
//! find a violation with it (so the checker can see the failure each condition prevents).

use super::*;
use crate::model_rng::Rng;
use meridian_types::Timestamp;
use std::collections::BTreeMap;

const MAX_OFFSET_MS: u64 = 500;
const LAG_MS: u64 = 1_000;
const CASES: u64 = 3_000;
const STEPS: usize = 300;

/// Which condition of the protocol the model breaks (`Safe`: none).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Rule {
    Safe,
    /// Close at `now - lag` whatever is still in flight.
    IgnoreInflight,
    /// Publish on the side channel without a recent quorum confirmation.
    IgnoreConfirmation,
    /// Read the applied index before computing `C` on the side channel.
    IndexBeforeClose,
    /// Publish on the side channel while the sender's log holds entries it has not applied
    /// (an earlier term's, or its own whose proposers gave up when it was deposed).
    IgnoreUnapplied,
}

#[derive(Clone, Debug)]
struct Entry {
    proposer: usize,
    /// `(proposed ts, writes)`; `None`: a blank entry of a new term.
    cmd: Option<(u64, bool)>,
    closed: u64,
}

#[derive(Debug, Default)]
struct Node {
    offset_ms: u64,
    hlc: u64,
    applied: usize,
    /// Leader state: the term it believes it leads, issues in flight, its issue wait mark.
    term: u64,
    inflight: BTreeMap<u64, usize>,
    not_before_ms: u64,
    /// The send time (true ms) of its newest side-channel round a quorum confirmed.
    confirmed_ms: Option<u64>,
    /// The length of its own log once it was deposed (cut off: it hears of nothing later);
    /// `None` while it has every committed entry.
    deposed_at: Option<usize>,
}

struct Model {
    rule: Rule,
    rng: Rng,
    true_ms: u64,
    nodes: [Node; 3],
    leader: usize,
    term: u64,
    log: Vec<Entry>,
    /// Issued proposals not yet appended: `(node, term, ts, closed)`.
    proposals: Vec<(usize, u64, u64, u64)>,
    /// A side-channel round in progress: `(sender, term, send ms, C or index read first)`.
    round: Option<(usize, u64, u64, u64)>,
    follower: ClosedState,
    /// What the follower claimed: `(closed ts, applied index)`.
    observed: Vec<(u64, usize)>,
}

impl Model {
    fn new(seed: u64, rule: Rule) -> Model {
        let mut rng = Rng::new(seed);
        let mut nodes: [Node; 3] = Default::default();
        for node in &mut nodes {
            // Physical clocks within `max_offset` of each other.
            node.offset_ms = rng.below(MAX_OFFSET_MS + 1);
        }
        let mut model = Model {
            rule,
            rng,
            true_ms: 10_000,
            nodes,
            leader: 0,
            term: 0,
            log: Vec::new(),
            proposals: Vec::new(),
            round: None,
            follower: ClosedState::default(),
            observed: Vec::new(),
        };
        model.elect(0);
        model
    }

    fn physical_ms(&self, node: usize) -> u64 {
        self.true_ms + self.nodes[node].offset_ms
    }

    /// An HLC reading on `node`.
    fn now(&mut self, node: usize) -> u64 {
        let physical = Timestamp::from_physical_ms(self.physical_ms(node)).0;
        let n = &mut self.nodes[node];
        n.hlc = (n.hlc + 1).max(physical);
        n.hlc
    }

    fn close(&mut self, node: usize) -> u64 {
        let now = self.now(node);
        let oldest = match self.rule {
            Rule::IgnoreInflight => None,
            _ => self.nodes[node].inflight.keys().next().copied(),
        };
        closable(now, LAG_MS, oldest)
    }

    fn elect(&mut self, node: usize) {
        self.term += 1;
        let old = self.leader;
        if old != node {
            self.nodes[old].deposed_at = Some(self.log.len());
            // Its pending writes may fail (openraft answers them) and settle, or hang.
            if self.rng.below(2) == 0 {
                self.nodes[old].inflight.clear();
            }
        }
        self.nodes[node].deposed_at = None;
        self.leader = node;
        // A leader has every committed entry (it need not have applied them).
        let start = self.physical_ms(node);
        let n = &mut self.nodes[node];
        n.term = self.term;
        n.not_before_ms = start + MAX_OFFSET_MS + 1;
        n.confirmed_ms = None;
        self.log.push(Entry {
            proposer: node,
            cmd: None,
            closed: 0,
        });
    }

    fn issue(&mut self) {
        let node = self.leader;
        if self.physical_ms(node) < self.nodes[node].not_before_ms {
            return;
        }
        let ts = self.now(node);
        *self.nodes[node].inflight.entry(ts).or_default() += 1;
        // Closed right after the proposal's own timestamp was issued.
        let closed = self.close(node);
        self.proposals.push((node, self.term, ts, closed));
    }

    fn append(&mut self, pick: usize) {
        let (node, term, ts, closed) = self.proposals.swap_remove(pick);
        if term != self.term || node != self.leader {
            // Its leader was deposed: it never reaches the log (or is fenced at apply).
            self.settle(node, ts);
            return;
        }
        let writes = self.rng.below(3) != 0;
        self.log.push(Entry {
            proposer: node,
            cmd: Some((ts, writes)),
            closed,
        });
    }

    fn settle(&mut self, node: usize, ts: u64) {
        let inflight = &mut self.nodes[node].inflight;
        if let Some(count) = inflight.get_mut(&ts) {
            *count -= 1;
            if *count == 0 {
                inflight.remove(&ts);
            }
        }
    }

    /// The version every replica gives each entry (`None`: writes nothing), in log order.
    fn versions(&self) -> Vec<Option<u64>> {
        let mut floor = 0u64;
        self.log
            .iter()
            .map(|e| match e.cmd {
                Some((ts, true)) => {
                    floor = ts.max(floor + 1);
                    Some(floor)
                }
                _ => None,
            })
            .collect()
    }

    /// How much of the log `node` has.
    fn log_len(&self, node: usize) -> usize {
        self.nodes[node].deposed_at.unwrap_or(self.log.len())
    }

    fn apply_one(&mut self, node: usize) {
        let index = self.nodes[node].applied;
        if index >= self.log_len(node) {
            return;
        }
        if let Some(version) = self.versions()[index] {
            let n = &mut self.nodes[node];
            n.hlc = n.hlc.max(version);
        }
        self.nodes[node].applied += 1;
        let entry = self.log[index].clone();
        if node == 2 {
            self.follower.on_entry(entry.closed);
            self.follower.on_applied(index as u64 + 1);
            self.observe();
        } else if let Some((ts, _)) = entry.cmd {
            // The proposer's task settles its timestamp once it has applied.
            if entry.proposer == node {
                self.settle(node, ts);
            }
        }
    }

    fn observe(&mut self) {
        self.observed
            .push((self.follower.ts(), self.follower.applied() as usize));
    }

    /// Whether `sender` may publish now (its round is sent, and confirmed, either way).
    fn may_publish(&self, sender: usize) -> bool {
        let n = &self.nodes[sender];
        let age = n
            .confirmed_ms
            .map(|at| std::time::Duration::from_millis(self.true_ms.saturating_sub(at)));
        let confirmed = self.rule == Rule::IgnoreConfirmation || publishable(age, LAG_MS);
        let idle = self.rule == Rule::IgnoreUnapplied || n.applied == self.log_len(sender);
        confirmed && idle
    }

    /// Starts a side-channel round on `sender` (the leader, or a deposed one).
    fn round_start(&mut self, sender: usize) {
        let first = match self.rule {
            Rule::IndexBeforeClose => self.nodes[sender].applied as u64,
            _ => self.close(sender),
        };
        let term = self.nodes[sender].term;
        self.round = Some((sender, term, self.true_ms, first));
    }

    fn round_finish(&mut self) {
        let Some((sender, term, sent_ms, first)) = self.round.take() else {
            return;
        };
        let (index, closed) = match self.rule {
            Rule::IndexBeforeClose => (first, self.close(sender)),
            _ => (self.nodes[sender].applied as u64, first),
        };
        // Checked after `C` and the index were read, with the confirmations so far.
        let publish = self.may_publish(sender);
        // The follower confirms only its current leader's rounds.
        if sender == self.leader && term == self.term {
            let n = &mut self.nodes[sender];
            n.confirmed_ms = Some(n.confirmed_ms.unwrap_or(0).max(sent_ms));
        }
        if publish {
            self.follower.offer(index, closed);
            self.observe();
        }
    }

    fn step(&mut self) {
        match self.rng.below(12) {
            0 | 1 => self.true_ms += self.rng.below(LAG_MS / 2),
            2 | 3 => self.issue(),
            4 if !self.proposals.is_empty() => {
                let pick = self.rng.below(self.proposals.len() as u64) as usize;
                self.append(pick);
            }
            5 => {
                let node = self.rng.below(2) as usize;
                self.apply_one(node);
            }
            6 => self.apply_one(2),
            7 | 8 => {
                // The current leader, or the other (maybe deposed) one.
                let sender = self.rng.below(2) as usize;
                if self.round.is_none() {
                    self.round_start(sender);
                } else {
                    self.round_finish();
                }
            }
            9 if self.rng.below(8) == 0 => self.elect(1 - self.leader),
            _ => self.true_ms += self.rng.below(20),
        }
    }

    /// The first claim the final log contradicts: a version `<= F` at an index past `a`.
    fn violation(&mut self) -> Option<String> {
        // Drain: every proposal still pending reaches the log (in some order).
        while !self.proposals.is_empty() {
            let pick = self.rng.below(self.proposals.len() as u64) as usize;
            self.append(pick);
        }
        let versions = self.versions();
        self.observed.iter().find_map(|&(closed, applied)| {
            versions[applied.min(versions.len())..]
                .iter()
                .flatten()
                .find(|v| **v <= closed)
                .map(|v| format!("closed {closed} at applied {applied}, but version {v} later"))
        })
    }
}

fn run(seed: u64, rule: Rule) -> Option<String> {
    let mut model = Model::new(seed, rule);
    for _ in 0..STEPS {
        model.step();
    }
    model.violation()
}

/// The protocol as implemented: no follower ever claims a closed timestamp the log breaks.
#[test]
fn no_follower_claims_a_closed_timestamp_the_final_log_breaks() {
    let mut claims = 0;
    for seed in 0..CASES {
        let mut model = Model::new(seed, Rule::Safe);
        for _ in 0..STEPS {
            model.step();
        }
        claims += model.observed.iter().filter(|(c, _)| *c > 0).count();
        if let Some(bad) = model.violation() {
            panic!("seed {seed}: {bad}");
        }
    }
    // The model must actually close things, or it proves nothing.
    assert!(claims > 1_000, "only {claims} nonzero closed timestamps");
}

fn first_violation(rule: Rule) -> Option<(u64, String)> {
    (0..CASES).find_map(|seed| run(seed, rule).map(|bad| (seed, bad)))
}

/// Negative control: closing over an in-flight proposal lets it land below a published `C`.
#[test]
fn control_closing_over_inflight_proposals_is_caught() {
    assert!(first_violation(Rule::IgnoreInflight).is_some());
}

/// Negative control: a deposed leader that publishes without a recent quorum confirmation
/// closes over the new leader's writes.
#[test]
fn control_publishing_without_confirmation_is_caught() {
    assert!(first_violation(Rule::IgnoreConfirmation).is_some());
}

/// Negative control: an applied index read before `C` misses a proposal that settled between.
#[test]
fn control_reading_the_index_before_closing_is_caught() {
    assert!(first_violation(Rule::IndexBeforeClose).is_some());
}

/// Negative control: a leader publishing while its log holds entries it has not applied
/// closes over them (an earlier leader's, or its own whose writers gave up on it).
#[test]
fn control_publishing_over_unapplied_entries_is_caught() {
    assert!(first_violation(Rule::IgnoreUnapplied).is_some());
}
