//! Closed timestamps: a shard leader's promise that no write at or below a timestamp is still
//! to come past a log index, and the follower state that lets a replica serve reads at such a
//! timestamp without asking the leader.
//!
//! # The promise
//! A leader publishes a pair `(C, i)`: every write whose version timestamp is `<= C` is at a
//! log index `<= i`, or is the resolution of a 2PC lock whose prepare is at an index `<= i`
//! with `prepare_ts <= C`. A replica that has applied `i` therefore holds the final state at
//! every `T <= C`, apart from write intents it can see (a reader treats any intent prepared at
//! or below `T` as blocking). `C` itself comes from [`Issued::close`]: `min(now - lag,
//! oldest in-flight issue - 1)`, taken under the lock `issue` takes, so
//!
//! ```text
//!   issued <= C  ──>  settled (applied on the leader: index <= its applied index)
//!   issued  > C  ──>  applied at max(ts, floor + 1) > C   (apply only raises a timestamp)
//!   later issues ──>  HLC reading after close returned  > C
//! ```
//!
//! # How a pair travels
//! - **In a log entry** ([`crate::Command::Closed`]): `C` is computed right after the
//!   proposal's own timestamp was issued (so that timestamp is in flight and `C` is below it)
//!   and the entry carries it; `i` is the entry's own index. Entries of earlier terms sit
//!   before it in the log, so they are covered by construction. Apply counts `C` only when the
//!   entry's term is the one it was closed in ([`ClosedState::on_entry`]).
//! - **On the side channel** (idle and quiesced shards): `i` is read *after* `C` was computed,
//!   and the follower holds the pair until it has applied `i` ([`ClosedState::offer`]). A
//!   leader publishes this way only while a quorum confirmed a message of its term recently
//!   enough ([`Closer`], [`publishable`]), so that a later leader, elected after that
//!   confirmation, issues above `C` (its first timestamp is past its physical clock plus
//!   `max_offset`, see `issued`, and `C` is `lag` behind the old leader's clock).
//!
//! # Followers keep the maximum
//! A new leader may publish a lower `C` than the old one did; followers keep the maximum, which
//! is safe because each published pair is. The state is in memory only (in the lock table,
//! under the guard apply holds while it writes), so a reader sees a closed timestamp and the
//! data it covers together; a restarted replica starts at 0 and catches up within one round.
//!
//! # Not done yet
//! - Persisting the closed timestamp (a restarted follower redirects for one interval).
//! - Closing ahead of the clock (`LeadForGlobalReads`): writes may never be pushed today.
//! - Deltas on the side channel: every round names every led shard.
//!
//! [`Issued::close`]: crate::issued::Issued::close

use meridian_types::Timestamp;
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// The fraction of the lag a side-channel confirmation may be old before a leader stops
/// publishing: the same 10 % drift margin the `Kv` service gives the leader lease.
pub const CONFIRMATION_MARGIN: f64 = 0.9;

/// Most voters a [`Closer`] remembers confirmations of (a shard has at most a handful).
pub const MAX_CLOSER_VOTERS: usize = 16;

/// The highest timestamp a leader may close: `lag_ms` behind `now` and below the oldest
/// timestamp still in flight (`oldest`). `lag_ms == 0` disables closing (0 is returned).
/// Pure, so the model tests can drive it.
pub fn closable(now: u64, lag_ms: u64, oldest: Option<u64>) -> u64 {
    if lag_ms == 0 {
        return 0;
    }
    let by_clock = now.saturating_sub(Timestamp::from_physical_ms(lag_ms).0);
    match oldest {
        Some(oldest) => by_clock.min(oldest.saturating_sub(1)),
        None => by_clock,
    }
}

/// Whether a leader whose latest quorum confirmation was sent `confirmation_age` ago (`None`:
/// never in this term) may still publish on the side channel: the confirmation must be younger
/// than [`CONFIRMATION_MARGIN`] of the lag (see the module docs). `lag_ms == 0`: never.
pub fn publishable(confirmation_age: Option<Duration>, lag_ms: u64) -> bool {
    let limit = Duration::from_millis(lag_ms).mul_f64(CONFIRMATION_MARGIN);
    confirmation_age.is_some_and(|age| age < limit)
}

/// A replica's closed timestamp: the highest `C` of a pair whose index it has applied.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClosedState {
    ts: u64,
    applied: u64,
    /// A side-channel pair `(index, C)` waiting for its index to be applied; only the newest
    /// is kept (a bounded slot: a follower far behind catches up from entries anyway).
    pending: Option<(u64, u64)>,
}

impl ClosedState {
    /// The timestamp at and below which this replica's applied state is final.
    pub fn ts(&self) -> u64 {
        self.ts
    }

    /// The highest applied index this state has been told of.
    pub fn applied(&self) -> u64 {
        self.applied
    }

    /// A closed timestamp carried by an entry applied now (its own index is applied with it).
    pub fn on_entry(&mut self, closed: u64) {
        self.ts = self.ts.max(closed);
    }

    /// The replica has applied through `index` (an apply call or a snapshot install).
    pub fn on_applied(&mut self, index: u64) {
        self.applied = self.applied.max(index);
        if let Some((at, closed)) = self.pending {
            if at <= self.applied {
                self.ts = self.ts.max(closed);
                self.pending = None;
            }
        }
    }

    /// A side-channel pair: `closed` counts once `index` is applied.
    pub fn offer(&mut self, index: u64, closed: u64) {
        if closed <= self.ts {
            return;
        }
        if index <= self.applied {
            self.ts = closed;
            return;
        }
        // Keep the newer offer unless the waiting one is at least as good (a lower index that
        // closes at least as much).
        let keep = matches!(self.pending, Some((at, c)) if at <= index && c >= closed);
        if !keep {
            self.pending = Some((index, closed));
        }
    }
}

/// A leader's side-channel confirmations for one shard: for each voter, the send time of the
/// latest round of this leader's term it acknowledged.
#[derive(Debug, Default)]
pub struct Closer {
    term: u64,
    acks: HashMap<u64, Instant>,
}

impl Closer {
    /// `voter` acknowledged, as leader of `term`, a round this node sent at `sent_at`.
    /// Confirmations of an earlier term are forgotten when the term changes.
    pub fn confirmed(&mut self, term: u64, voter: u64, sent_at: Instant) {
        if term != self.term {
            if term < self.term {
                return;
            }
            self.term = term;
            self.acks.clear();
        }
        if self.acks.len() >= MAX_CLOSER_VOTERS && !self.acks.contains_key(&voter) {
            return;
        }
        let at = self.acks.entry(voter).or_insert(sent_at);
        *at = (*at).max(sent_at);
    }

    /// The send time of the newest round a majority of `voters` confirmed in `term`, counting
    /// this node (`me`, a voter) as confirming at `now`; `None` without a majority.
    pub fn quorum_confirmed(
        &self,
        term: u64,
        voters: &[u64],
        me: u64,
        now: Instant,
    ) -> Option<Instant> {
        if voters.is_empty() {
            return None;
        }
        let mut times: Vec<Instant> = voters
            .iter()
            .filter_map(|v| {
                if *v == me {
                    Some(now)
                } else if term == self.term {
                    self.acks.get(v).copied()
                } else {
                    None
                }
            })
            .collect();
        let majority = voters.len() / 2 + 1;
        if times.len() < majority {
            return None;
        }
        times.sort_unstable_by(|a, b| b.cmp(a));
        Some(times[majority - 1])
    }
}

#[cfg(test)]
#[path = "closed_ts_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "closed_ts_model_tests.rs"]
mod model_tests;

#[cfg(test)]
#[path = "closed_ts_apply_tests.rs"]
mod apply_tests;
