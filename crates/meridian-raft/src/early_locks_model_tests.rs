//! A model test of the early lock table: random sequences of acquires (some in a stale term),
//! cancels, commits begun and ended, releases, expiries, wound flags taken, clears and closes,
//! over four owners of random ranks (which may tie) and three keys, with the real limits or tiny
//! ones. After every step the table must keep its invariants ([`check_invariants`]), agree
//! with a naive model (plain lists, the most senior waiter found by a scan rather than kept at
//! the head of a sorted queue), and have answered every ticket it ever issued exactly once,
//! unless it still waits.

use super::*;
use proptest::prelude::*;
use std::cmp::Ordering;
use std::collections::BTreeMap;

const KEYS: [&[u8]; 3] = [b"a", b"b", b"c"];
const OWNERS: u64 = 4;
const IDLE_MS: u64 = 1_000;
const TINY: Limits = Limits {
    locks: 2,
    per_key: 2,
    per_shard: 3,
};

macro_rules! ensure {
    ($cond:expr, $($what:tt)*) => {
        if !$cond {
            return Err(format!($($what)*));
        }
    };
}

/// Every invariant of the module docs that the table's state shows, and the consistency of
/// its indexes.
pub(super) fn check_invariants(t: &EarlyLockTable) -> Result<(), String> {
    let limits = t.limits;
    ensure!(t.keys.len() <= limits.locks, "too many locks");
    ensure!(t.tickets.len() <= limits.per_shard, "too many waiters");
    ensure!(t.wounded.len() <= limits.locks, "too many flags");
    let closed_and_empty = t.keys.is_empty() && t.owners.is_empty();
    ensure!(t.term.is_some() || closed_and_empty, "closed, not empty");
    let mut queued = 0;
    for (key, k) in &t.keys {
        let holder = t.owners.get(&k.holder).ok_or("holder unknown")?;
        ensure!(holder.held.contains(key), "{key:?}: holder unaware");
        ensure!(k.queue.len() <= limits.per_key, "{key:?}: queue long");
        queued += k.queue.len();
        for (i, w) in k.queue.iter().enumerate() {
            let o = t.owners.get(&w.owner).ok_or("waiter unknown")?;
            let listed = o.rank == w.rank && o.tickets.contains(&w.ticket);
            ensure!(listed && !o.committing, "{key:?}: waiter {w:?}");
            let junior = senior(holder.rank, k.holder, w.rank, w.owner);
            ensure!(holder.committing || junior, "{key:?}: {w:?} not junior");
            let ahead = &k.queue[..i];
            ensure!(ahead.iter().all(|p| p.owner != w.owner), "waits twice");
            let sorted = ahead
                .last()
                .is_none_or(|p| senior(p.rank, p.owner, w.rank, w.owner));
            ensure!(sorted, "{key:?}: queue not sorted");
            let ticket = t.tickets.get(&w.ticket).ok_or("no ticket")?;
            let same = ticket.owner == w.owner && ticket.key == *key;
            ensure!(same, "{key:?}: ticket {w:?}");
            ensure!(t.waits.contains(&(ticket.since, w.ticket)), "waits");
            ensure!(w.ticket.0 < t.next_ticket, "ticket from the future");
        }
    }
    // With the checks above: every ticket waits in its key's queue, and that key is held.
    let counts = queued == t.tickets.len() && t.waits.len() == queued;
    ensure!(counts, "ticket counts");
    for (id, o) in &t.owners {
        ensure!(!o.held.is_empty() || !o.tickets.is_empty(), "empty entry");
        let holds = |k: &Bytes| t.keys.get(k).is_some_and(|s| s.holder == *id);
        ensure!(o.held.iter().all(holds), "{id:?} lists a key not its own");
        let waits = |x: &TicketId| t.tickets.get(x).is_some_and(|x| x.owner == *id);
        ensure!(o.tickets.iter().all(waits), "{id:?} lists a ticket");
        let indexed = t.idle.contains(&(o.last_ms, *id));
        ensure!(indexed != o.committing, "idle index of {id:?}");
    }
    let idle = t.owners.values().filter(|o| !o.committing).count();
    ensure!(t.idle.len() == idle, "stale idle entries");
    let by_age = &t.wounded_by_age;
    let flags = by_age.iter().all(|(at, o)| t.wounded.get(o) == Some(at));
    ensure!(t.wounded.len() == by_age.len() && flags, "wound index");
    let edges = wait_edges(t);
    ensure!(!has_cycle(&edges), "a cycle of waits: {edges:?}");
    Ok(())
}

/// Who waits for whom: each waiter for the key's holder and for every waiter ahead of it.
fn wait_edges(t: &EarlyLockTable) -> Vec<(RequestId, RequestId)> {
    let mut edges = Vec::new();
    for k in t.keys.values() {
        for (i, w) in k.queue.iter().enumerate() {
            edges.push((w.owner, k.holder));
            edges.extend(k.queue[..i].iter().map(|p| (w.owner, p.owner)));
        }
    }
    edges
}

/// Peels off the owners that wait for no one left; a cycle is what cannot be peeled.
fn has_cycle(edges: &[(RequestId, RequestId)]) -> bool {
    let mut left: BTreeSet<RequestId> = edges.iter().flat_map(|&(a, b)| [a, b]).collect();
    loop {
        let waits = |n: RequestId| edges.iter().any(|&(a, b)| a == n && left.contains(&b));
        let free: Vec<RequestId> = left.iter().copied().filter(|&n| !waits(n)).collect();
        if free.is_empty() {
            return !left.is_empty();
        }
        for n in free {
            left.remove(&n);
        }
    }
}

#[path = "early_locks_model.rs"]
mod model;
use model::{view_of, Model};

/// One step of a sequence.
#[derive(Clone, Debug)]
enum Op {
    /// `owner` locks these keys (any order, repeats allowed), in a stale term if `stale`.
    Acquire {
        owner: u64,
        keys: Vec<usize>,
        stale: bool,
    },
    /// The waiting ticket at this index gives up (past the end: an unknown ticket).
    Cancel(usize),
    BeginCommit(u64),
    EndCommit(u64),
    Release(u64),
    TakeWounded(u64),
    Advance(u64),
    Expire,
    /// A new term.
    Clear,
    Close,
}

fn op() -> impl Strategy<Value = Op> {
    let owner = || 0..OWNERS;
    let keys = proptest::collection::vec(0..KEYS.len(), 0..4);
    prop_oneof![
        8 => (owner(), keys, proptest::bool::weighted(0.05))
            .prop_map(|(owner, keys, stale)| Op::Acquire { owner, keys, stale }),
        2 => (0..8usize).prop_map(Op::Cancel),
        2 => owner().prop_map(Op::BeginCommit),
        2 => owner().prop_map(Op::EndCommit),
        2 => owner().prop_map(Op::Release),
        1 => owner().prop_map(Op::TakeWounded),
        3 => (0..1_500u64).prop_map(Op::Advance),
        2 => Just(Op::Expire),
        1 => Just(Op::Clear),
        1 => Just(Op::Close),
    ]
}

fn id(n: u64) -> RequestId {
    RequestId {
        client_id: n,
        seq: 0,
    }
}

/// Every ticket ever issued, with its owner and key, and whether it was answered.
#[derive(Default)]
struct Tickets(BTreeMap<TicketId, (RequestId, Bytes, bool)>);

impl Tickets {
    fn issue(&mut self, ticket: TicketId, owner: RequestId, key: Bytes) -> Result<(), String> {
        let fresh = self.0.insert(ticket, (owner, key, false)).is_none();
        ensure!(fresh, "{ticket:?} issued twice");
        Ok(())
    }
    fn answer(&mut self, answers: &[Answer]) -> Result<(), String> {
        for a in answers {
            let e = self
                .0
                .get_mut(&a.ticket)
                .ok_or(format!("{a:?}: no such ticket"))?;
            ensure!(!e.2, "{a:?} answered twice");
            ensure!(e.0 == a.owner && e.1 == a.key, "{a:?}: another's ticket");
            e.2 = true;
        }
        Ok(())
    }
    /// The tickets not answered are exactly those still waiting.
    fn check(&self, t: &EarlyLockTable) -> Result<(), String> {
        let open: BTreeSet<TicketId> = self
            .0
            .iter()
            .filter(|(_, e)| !e.2)
            .map(|(t, _)| *t)
            .collect();
        let waiting: BTreeSet<TicketId> = t.tickets.keys().copied().collect();
        ensure!(
            open == waiting,
            "not answered {open:?}, waiting {waiting:?}"
        );
        Ok(())
    }
}

fn run(ranks: &[(u32, u64)], tiny: bool, ops: &[Op]) -> Result<(), String> {
    let limits = if tiny { TINY } else { Limits::default() };
    let rank = |n: u64| {
        let (priority, age_ts) = ranks[n as usize];
        TxnRank { priority, age_ts }
    };
    let mut table = EarlyLockTable::with_limits(limits);
    let mut model = Model {
        limits: Some(limits),
        ..Model::default()
    };
    let (mut term, mut now) = (1, 0);
    table.clear(term);
    model.reset(Some(term));
    let mut tickets = Tickets::default();
    for (step, op) in ops.iter().enumerate() {
        let at = |e: String| format!("step {step} {op:?}: {e}");
        let waiting = table.waiters();
        let (mut got, mut want) = (Vec::new(), Vec::new());
        match *op {
            Op::Acquire {
                owner,
                ref keys,
                stale,
            } => {
                let keys: Vec<Bytes> = keys.iter().map(|&k| Bytes::from(KEYS[k])).collect();
                let asked = if stale { term + 1 } else { term };
                let out = table.acquire(id(owner), rank(owner), &keys, now, asked);
                let expected = model.acquire(id(owner), rank(owner), &keys, now, asked);
                ensure!(
                    out == expected,
                    "step {step} {op:?}: {out:?} vs {expected:?}"
                );
                for (outcome, key) in out.iter().zip(keys) {
                    if let KeyOutcome::Waiting(ticket) = outcome {
                        tickets.issue(*ticket, id(owner), key).map_err(at)?;
                    }
                }
            }
            Op::Cancel(i) => {
                let waits = &model.waits;
                let ticket = waits.get(i).map_or(TicketId(i as u64), |w| w.ticket);
                (got, want) = (table.cancel(ticket), model.cancel(ticket));
            }
            Op::BeginCommit(n) => {
                (got, want) = (
                    table.begin_commit(id(n), now),
                    model.begin_commit(id(n), now),
                );
            }
            Op::EndCommit(n) => {
                (got, want) = (table.end_commit(id(n), now), model.end_commit(id(n), now));
            }
            Op::Release(n) => {
                (got, want) = (
                    table.release_owner(id(n), now),
                    model.release_owner(id(n), now),
                );
            }
            Op::TakeWounded(n) => {
                let (taken, expected) = (table.take_wounded(id(n)), model.take_wounded(id(n)));
                ensure!(
                    taken == expected,
                    "step {step} {op:?}: {taken} vs {expected}"
                );
            }
            Op::Advance(ms) => now += ms,
            Op::Expire => (got, want) = (table.expire(now, IDLE_MS), model.expire(now, IDLE_MS)),
            Op::Clear => {
                term += 1;
                (got, want) = (table.clear(term), model.reset(Some(term)));
            }
            Op::Close => (got, want) = (table.close(), model.reset(None)),
        }
        if matches!(op, Op::Clear | Op::Close) {
            let all = got.len() == waiting && table.owners.is_empty() && table.wounded.is_empty();
            ensure!(all, "step {step}: not everything cleared and answered");
        }
        got.sort_by_key(|a| a.ticket);
        want.sort_by_key(|a| a.ticket);
        ensure!(
            got == want,
            "step {step} {op:?}: answers {got:?} vs {want:?}"
        );
        tickets.answer(&got).map_err(at)?;
        check_invariants(&table).map_err(at)?;
        let (seen, expected) = (view_of(&table), model.view());
        ensure!(
            seen == expected,
            "step {step} {op:?}: {seen:?} vs {expected:?}"
        );
        let counts = (table.locks_held(), table.waiters());
        ensure!(
            counts == (model.locks.len(), model.waits.len()),
            "step {step}: counts"
        );
        tickets.check(&table).map_err(at)?;
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    /// The table keeps its invariants, agrees with the naive model and answers every ticket
    /// exactly once, over any sequence of operations.
    #[test]
    fn the_early_lock_table_agrees_with_a_naive_model(
        ranks in proptest::collection::vec((1u32..4, 0u64..3), OWNERS as usize),
        tiny in proptest::bool::ANY,
        ops in proptest::collection::vec(op(), 1..120),
    ) {
        if let Err(e) = run(&ranks, tiny, &ops) {
            prop_assert!(false, "{}", e);
        }
    }
}

/// Negative controls for [`check_invariants`]: it sees a cycle, a queue out of rank order and
/// a holder without an entry.
#[test]
fn the_checker_sees_what_it_checks() {
    assert!(has_cycle(&[(id(1), id(2)), (id(2), id(3)), (id(3), id(1))]));
    assert!(!has_cycle(&[
        (id(1), id(2)),
        (id(2), id(3)),
        (id(1), id(3))
    ]));
    let mut t = EarlyLockTable::new();
    t.clear(1);
    let rank = |n| TxnRank {
        priority: 2,
        age_ts: n,
    };
    let key = [Bytes::from_static(b"a")];
    for n in [1, 3, 2] {
        t.acquire(id(n), rank(n), &key, 0, 1);
    }
    assert_eq!(check_invariants(&t), Ok(()));
    let state = t.keys.get_mut(&key[0]).expect("held");
    state.queue.swap(0, 1);
    assert!(check_invariants(&t).unwrap_err().contains("not sorted"));
    t.keys.get_mut(&key[0]).expect("held").holder = id(9);
    assert!(check_invariants(&t).is_err());
}
