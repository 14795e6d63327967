//! Unit and property tests of the closed-timestamp pieces (the protocol model is in
//! `closed_ts_model_tests.rs`).

use super::*;
use proptest::prelude::*;

const SECOND: u64 = 1 << 32;

/// Closing is `lag` behind the clock and below the oldest in-flight issue; lag 0 disables it.
#[test]
fn closable_is_behind_the_clock_and_below_every_inflight_issue() {
    let now = 1_000 * SECOND;
    assert_eq!(closable(now, 0, None), 0);
    assert_eq!(closable(now, 1_000, None), now - SECOND);
    assert_eq!(
        closable(now, 1_000, Some(now - 2 * SECOND)),
        now - 2 * SECOND - 1
    );
    assert_eq!(closable(now, 1_000, Some(now)), now - SECOND);
    assert_eq!(closable(5, 1_000, None), 0, "saturates at 0");
    assert_eq!(closable(now, 1_000, Some(0)), 0);
}

/// A side-channel publication needs a quorum confirmation younger than 90 % of the lag.
#[test]
fn publishable_needs_a_recent_confirmation() {
    let ms = Duration::from_millis;
    assert!(!publishable(None, 3_000));
    assert!(publishable(Some(ms(0)), 3_000));
    assert!(publishable(Some(ms(2_699)), 3_000));
    assert!(!publishable(Some(ms(2_700)), 3_000));
    assert!(!publishable(Some(ms(0)), 0), "lag 0 disables closing");
}

/// A side-channel pair counts only once its index is applied; the newest waiting pair is kept.
#[test]
fn an_offer_waits_for_its_index_and_the_ts_never_goes_down() {
    let mut state = ClosedState::default();
    state.on_applied(10);
    state.offer(12, 500);
    assert_eq!(state.ts(), 0, "index 12 not applied yet");
    state.offer(15, 700);
    state.on_applied(12);
    assert_eq!(state.ts(), 0, "the newer offer replaced the older one");
    state.on_applied(15);
    assert_eq!(state.ts(), 700);
    state.offer(15, 600);
    state.on_entry(650);
    assert_eq!(
        state.ts(),
        700,
        "a lower closed timestamp (a new leader's) is ignored"
    );
    state.offer(14, 800);
    assert_eq!(state.ts(), 800, "an applied index counts at once");
    state.on_entry(900);
    assert_eq!(state.ts(), 900);
}

/// A waiting offer is not replaced by a worse one (a later index closing less).
#[test]
fn a_waiting_offer_is_kept_over_a_worse_one() {
    let mut state = ClosedState::default();
    state.offer(5, 300);
    state.offer(9, 200);
    state.on_applied(5);
    assert_eq!(state.ts(), 300);
}

/// The quorum confirmation is the majority-th newest acknowledgement, self counted as now.
#[test]
fn quorum_confirmed_is_the_majority_th_newest_acknowledgement() {
    let base = Instant::now();
    let at = |ms: u64| base + Duration::from_millis(ms);
    let now = at(1_000);
    let mut closer = Closer::default();
    assert_eq!(closer.quorum_confirmed(1, &[1, 2, 3], 1, now), None);
    closer.confirmed(1, 2, at(100));
    assert_eq!(
        closer.quorum_confirmed(1, &[1, 2, 3], 1, now),
        Some(at(100))
    );
    closer.confirmed(1, 3, at(300));
    closer.confirmed(1, 2, at(50)); // an older ack does not move it back
    assert_eq!(
        closer.quorum_confirmed(1, &[1, 2, 3], 1, now),
        Some(at(300))
    );
    // Five voters: self and two others.
    closer.confirmed(1, 4, at(200));
    let five = [1, 2, 3, 4, 5];
    assert_eq!(closer.quorum_confirmed(1, &five, 1, now), Some(at(200)));
    // Another term's confirmations do not count; a new term forgets the old ones.
    assert_eq!(closer.quorum_confirmed(2, &[1, 2, 3], 1, now), None);
    closer.confirmed(2, 2, at(400));
    assert_eq!(closer.quorum_confirmed(1, &[1, 2, 3], 1, now), None);
    assert_eq!(
        closer.quorum_confirmed(2, &[1, 2, 3], 1, now),
        Some(at(400))
    );
    closer.confirmed(1, 3, at(900));
    assert_eq!(
        closer.quorum_confirmed(2, &[1, 2, 3], 1, now),
        Some(at(400)),
        "an ack of an older term is ignored"
    );
    assert_eq!(closer.quorum_confirmed(2, &[], 1, now), None);
}

/// The confirmation table is bounded.
#[test]
fn the_closer_remembers_at_most_max_voters() {
    let mut closer = Closer::default();
    let now = Instant::now();
    for voter in 0..(MAX_CLOSER_VOTERS as u64 + 10) {
        closer.confirmed(1, voter, now);
    }
    assert_eq!(closer.acks.len(), MAX_CLOSER_VOTERS);
}

#[derive(Clone, Debug)]
enum Op {
    Entry(u64),
    Applied(u64),
    Offer(u64, u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0u64..50).prop_map(Op::Entry),
        (0u64..20).prop_map(Op::Applied),
        (0u64..20, 0u64..50).prop_map(|(i, c)| Op::Offer(i, c)),
    ]
}

proptest! {
    /// Against a model that remembers every pair: the closed timestamp never exceeds the best
    /// pair whose index is applied (safety), never goes down, and once every offered index is
    /// applied it covers the last offer (liveness).
    #[test]
    fn closed_state_is_safe_monotone_and_live(ops in proptest::collection::vec(op(), 0..40)) {
        let mut state = ClosedState::default();
        let (mut applied, mut safe_max, mut offers) = (0u64, 0u64, Vec::new());
        let mut last = 0;
        for op in &ops {
            match *op {
                Op::Entry(c) => {
                    state.on_entry(c);
                    safe_max = safe_max.max(c);
                }
                Op::Applied(i) => {
                    state.on_applied(i);
                    applied = applied.max(i);
                }
                Op::Offer(i, c) => {
                    state.offer(i, c);
                    offers.push((i, c));
                }
            }
            let allowed = offers
                .iter()
                .filter(|(i, _)| *i <= applied)
                .map(|(_, c)| *c)
                .fold(safe_max, u64::max);
            prop_assert!(state.ts() <= allowed, "{} > {allowed} after {op:?}", state.ts());
            prop_assert!(state.ts() >= last);
            last = state.ts();
        }
        if let Some(&(_, c)) = offers.last() {
            state.on_applied(offers.iter().map(|(i, _)| *i).max().unwrap_or(0));
            prop_assert!(state.ts() >= c);
        }
    }
}
