//! Unit tests of the early lock table, rule by rule (`early_locks`).

use super::model_tests::check_invariants;
use super::*;
use meridian_types::TxnPriority;
use KeyOutcome::{Free, Own, Waiting, Wound};
use NotHeld::*;
use TicketOutcome::Granted;

const T: u64 = 7;
const IDLE: u64 = 1_000;

fn id(n: u64) -> RequestId {
    RequestId {
        client_id: n,
        seq: 0,
    }
}

/// Owner `n` is `n` old: the lower number is senior.
fn rank(n: u64) -> TxnRank {
    TxnRank::new(TxnPriority::Normal, n)
}

fn keys(ks: &[&'static str]) -> Vec<Bytes> {
    ks.iter().map(|k| Bytes::from(*k)).collect()
}

fn table(limits: Limits) -> EarlyLockTable {
    let mut t = EarlyLockTable::with_limits(limits);
    assert!(t.clear(T).is_empty());
    t
}

/// Owner `n` acquires `ks` at `now` in term `T`; the invariants hold after.
fn take(t: &mut EarlyLockTable, n: u64, ks: &[&'static str], now: u64) -> Vec<KeyOutcome> {
    let out = t.acquire(id(n), rank(n), &keys(ks), now, T);
    check_invariants(t).expect("invariants");
    out
}

fn wait(t: &mut EarlyLockTable, n: u64, k: &'static str, now: u64) -> TicketId {
    match take(t, n, &[k], now)[..] {
        [Waiting(ticket)] => ticket,
        ref other => panic!("expected a wait, got {other:?}"),
    }
}

/// Answers as `(ticket, owner, outcome)`, keys checked against their tickets.
fn ans(t: &EarlyLockTable, answers: Vec<Answer>) -> Vec<(TicketId, u64, TicketOutcome)> {
    check_invariants(t).expect("invariants");
    answers
        .into_iter()
        .map(|a| (a.ticket, a.owner.client_id, a.outcome))
        .collect()
}

fn no(why: NotHeld) -> TicketOutcome {
    TicketOutcome::NotHeld(why)
}

#[test]
fn free_and_own_keys_are_held_and_reset_the_idle_clock() {
    let mut t = table(Limits::default());
    assert_eq!(take(&mut t, 1, &["a", "b"], 0), [Free, Free]);
    assert_eq!(take(&mut t, 1, &["b", "c"], 900), [Own, Free]);
    assert_eq!(t.held(id(1)), keys(&["a", "b", "c"]));
    t.expire(1_500, IDLE);
    assert_eq!(t.locks_held(), 3, "the clock was reset at 900");
    t.expire(1_900, IDLE);
    assert_eq!(t.locks_held(), 0);
}

#[test]
fn a_senior_wounds_a_junior_holder_that_is_not_committing() {
    let mut t = table(Limits::default());
    take(&mut t, 5, &["a", "b"], 0);
    assert_eq!(take(&mut t, 2, &["a"], 1), [Wound(id(5))]);
    assert_eq!(t.holder(b"a"), Some(id(2)));
    assert_eq!(t.held(id(5)), keys(&["b"]));
    assert!(t.is_wounded(id(5)) && t.take_wounded(id(5)));
    assert!(!t.take_wounded(id(5)), "taken once");
}

#[test]
fn juniors_wait_in_rank_order_and_a_release_grants_the_most_senior() {
    let mut t = table(Limits::default());
    take(&mut t, 1, &["a"], 0);
    let t9 = wait(&mut t, 9, "a", 1);
    let t4 = wait(&mut t, 4, "a", 2);
    let t6 = wait(&mut t, 6, "a", 3);
    let out = t.release_owner(id(1), 10);
    assert_eq!(ans(&t, out), [(t4, 4, Granted)]);
    assert_eq!((t.holder(b"a"), t.waiters()), (Some(id(4)), 2));
    let out = t.cancel(t6);
    assert_eq!(ans(&t, out), [(t6, 6, no(Cancelled))]);
    assert!(t.cancel(t6).is_empty(), "answered once");
    let out = t.release_owner(id(4), 11);
    assert_eq!(ans(&t, out), [(t9, 9, Granted)]);
    assert!(t.release_owner(id(9), 12).is_empty());
    assert_eq!((t.locks_held(), t.waiters()), (0, 0));
}

#[test]
fn a_committing_holder_is_neither_wounded_nor_expired() {
    let mut t = table(Limits::default());
    take(&mut t, 5, &["a"], 0);
    assert!(t.begin_commit(id(5), 1).is_empty());
    let senior = wait(&mut t, 2, "a", 2);
    let junior = wait(&mut t, 8, "a", 3);
    let out = t.expire(10_000, IDLE);
    assert_eq!(
        ans(&t, out),
        [(senior, 2, no(Expired)), (junior, 8, no(Expired))]
    );
    assert_eq!(t.holder(b"a"), Some(id(5)));
}

#[test]
fn a_failed_commit_lets_a_senior_waiter_wound_the_holder() {
    let mut t = table(Limits::default());
    take(&mut t, 5, &["a", "b"], 0);
    t.begin_commit(id(5), 1);
    let senior = wait(&mut t, 2, "a", 2);
    let junior = wait(&mut t, 8, "b", 2);
    let out = t.end_commit(id(5), 3);
    assert_eq!(ans(&t, out), [(senior, 2, Granted)]);
    assert!(t.take_wounded(id(5)));
    assert_eq!(t.held(id(5)), keys(&["b"]), "the junior still waits");
    let out = t.release_owner(id(5), 4);
    assert_eq!(ans(&t, out), [(junior, 8, Granted)]);
}

#[test]
fn a_committing_owner_stops_waiting_and_never_waits() {
    let mut t = table(Limits::default());
    take(&mut t, 1, &["a"], 0);
    take(&mut t, 3, &["b"], 0);
    let ticket = wait(&mut t, 3, "a", 1);
    let out = t.begin_commit(id(3), 2);
    assert_eq!(ans(&t, out), [(ticket, 3, no(Committing))]);
    let out = take(&mut t, 3, &["a"], 3);
    assert_eq!(out, [KeyOutcome::NotHeld(Committing)]);
    wait(&mut t, 9, "b", 3);
}

#[test]
fn an_owner_waits_once_per_key_and_keeps_its_first_rank() {
    let mut t = table(Limits::default());
    take(&mut t, 1, &["a"], 0);
    take(&mut t, 5, &["b"], 0);
    wait(&mut t, 3, "a", 1);
    let again = take(&mut t, 3, &["a", "a"], 2);
    assert_eq!(again, [KeyOutcome::NotHeld(AlreadyWaiting); 2]);
    assert_eq!(t.waiters(), 1);
    // Owner 3 now claims to be junior to 5: it still wounds with its first rank.
    let out = t.acquire(id(3), rank(50), &keys(&["b"]), 3, T);
    assert_eq!(out, [Wound(id(5))]);
}

#[test]
fn bounds_answer_not_held() {
    let mut t = table(Limits {
        locks: 3,
        per_key: 1,
        per_shard: 2,
    });
    let out = take(&mut t, 1, &["a", "b", "c", "d"], 0);
    assert_eq!(out, [Free, Free, Free, KeyOutcome::NotHeld(TableFull)]);
    wait(&mut t, 2, "a", 0);
    let full = [KeyOutcome::NotHeld(QueueFull)];
    assert_eq!(take(&mut t, 3, &["a"], 0), full, "per key");
    wait(&mut t, 3, "b", 0);
    assert_eq!(take(&mut t, 4, &["c"], 0), full, "per shard");
    // Wound flags too: the oldest goes.
    let mut t = table(Limits {
        locks: 1,
        per_key: 1,
        per_shard: 1,
    });
    take(&mut t, 9, &["a"], 0);
    take(&mut t, 8, &["a"], 1);
    take(&mut t, 7, &["a"], 2);
    assert!(!t.is_wounded(id(9)) && t.is_wounded(id(8)));
}

#[test]
fn another_term_is_refused_and_a_clear_answers_every_waiter() {
    let mut t = EarlyLockTable::new();
    let stale = [KeyOutcome::NotHeld(StaleTerm)];
    let a = keys(&["a"]);
    assert_eq!(t.acquire(id(1), rank(1), &a, 0, 0), stale, "closed");
    t.clear(T);
    assert_eq!(t.acquire(id(1), rank(1), &a, 0, T + 1), stale);
    take(&mut t, 9, &["a", "b"], 0);
    take(&mut t, 1, &["b"], 0);
    let ticket = wait(&mut t, 10, "a", 0);
    let out = t.clear(T + 1);
    assert_eq!(ans(&t, out), [(ticket, 10, no(Cleared))]);
    assert_eq!((t.locks_held(), t.waiters()), (0, 0));
    assert!(!t.is_wounded(id(9)));
    assert_eq!(t.acquire(id(2), rank(2), &a, 0, T + 1), [Free]);
    // A late clear of an older term changes nothing.
    assert!(t.clear(T).is_empty());
    assert_eq!((t.term(), t.holder(b"a")), (Some(T + 1), Some(id(2))));
    assert!(t.close().is_empty() && t.term().is_none());
    assert_eq!(t.acquire(id(2), rank(2), &a, 0, T + 1), stale);
    assert_eq!(t.locks_held(), 0);
}

#[test]
fn expiry_passes_an_idle_holders_keys_on_and_ends_old_waits() {
    let mut t = table(Limits::default());
    take(&mut t, 1, &["a"], 0);
    let ticket = wait(&mut t, 9, "a", 600);
    let out = t.expire(1_000, IDLE);
    assert_eq!(ans(&t, out), [(ticket, 9, Granted)]);
    assert!(
        t.expire(1_999, IDLE).is_empty(),
        "the grant reset 9's clock"
    );
    assert_eq!(t.holder(b"a"), Some(id(9)));
    t.expire(2_000, IDLE);
    assert_eq!(t.locks_held(), 0);

    take(&mut t, 1, &["a"], 0);
    let ticket = wait(&mut t, 5, "a", 0);
    take(&mut t, 1, &[], 900);
    let out = t.expire(1_000, IDLE);
    assert_eq!(ans(&t, out), [(ticket, 5, no(Expired))]);
    assert_eq!(t.holder(b"a"), Some(id(1)));
}
