//! Negative controls: deliberate, minimal corruptions of a valid history that a checker must
//! catch.
//!
//! # What
//! A checker that always answers "valid" passes every test run against a correct system. The
//! harness's `--negative-control NAME` flag (and this crate's tests) guard against that: they
//! take a real or simulated history, apply one mutation known to make it invalid, and require
//! the checker to say so.
//!
//! - [`NegativeControl::LostAck`] (`lost-ack`): pick an acknowledged (`Ok`) add whose element
//!   appears in the final read(s) of its set, and remove the element from those reads. The set
//!   checker must report it lost.
//! - [`NegativeControl::StaleRead`] (`stale-read`): pick an `Ok` read R, the latest write W that
//!   completed before R was invoked, and the value P the register held before W (the value of a
//!   write W0 that completed before W was invoked, or absent if no write came before); rewrite
//!   R to return P. Non-linearizability is guaranteed, not hoped for: P is written by exactly one
//!   op (W0) or is absent (null, never written), W0 precedes W which precedes R in real time,
//!   so no linearization can make P current at R.
//!
//! # Invariants
//! - Deterministic: the same history, control and seed give the same mutation
//!   (`StdRng::seed_from_u64`; candidates are enumerated in history order).
//! - A mutation that is impossible (nothing to mutate) is an error, never a silent no-op.
//! - The history's shape (ops, indices, times) is unchanged; only one or more completion
//!   `value`s are rewritten.
//!
//! # Not done yet
//! Controls for transactional workloads (bank, list-append) arrive with those workloads.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::str::FromStr;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::Value;

use crate::checker::value_key;
use crate::history::{History, HistoryError, OpFn, OpKind, OpPair};

/// The available mutations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NegativeControl {
    /// Remove an acknowledged add's element from the final read of a set.
    LostAck,
    /// Make an ok register read return the value from before a completed write.
    StaleRead,
    /// Move one unit of money out of existence in an ok bank read (one balance minus 1).
    WrongTotal,
    /// Make an ok list-append transaction see one of another transaction's appends but not
    /// the other (drop it from one of its reads): a dependency cycle.
    FracturedRead,
}

impl NegativeControl {
    /// All controls, for `--help` texts and loops.
    pub const ALL: [NegativeControl; 4] = [
        NegativeControl::LostAck,
        NegativeControl::StaleRead,
        NegativeControl::WrongTotal,
        NegativeControl::FracturedRead,
    ];

    /// The command-line name.
    pub fn name(self) -> &'static str {
        match self {
            NegativeControl::LostAck => "lost-ack",
            NegativeControl::StaleRead => "stale-read",
            NegativeControl::WrongTotal => "wrong-total",
            NegativeControl::FracturedRead => "fractured-read",
        }
    }
}

impl fmt::Display for NegativeControl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for NegativeControl {
    type Err = ControlError;
    fn from_str(s: &str) -> Result<Self, ControlError> {
        NegativeControl::ALL
            .into_iter()
            .find(|c| c.name() == s)
            .ok_or_else(|| ControlError::UnknownControl(s.to_owned()))
    }
}

/// Why a control could not be applied.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    /// The name is not one of [`NegativeControl::ALL`].
    #[error("unknown negative control {0:?} (expected lost-ack, stale-read, wrong-total or fractured-read)")]
    UnknownControl(String),
    /// The history has nothing this control can corrupt.
    #[error("negative control {control}: nothing to mutate: {reason}")]
    NothingToMutate {
        /// The control.
        control: NegativeControl,
        /// Why.
        reason: String,
    },
    /// The history is not well formed.
    #[error(transparent)]
    History(#[from] HistoryError),
}

/// A mutated history and what was done to it.
#[derive(Debug, Clone, PartialEq)]
pub struct Mutation {
    /// Which control.
    pub control: NegativeControl,
    /// The corrupted history.
    pub history: History,
    /// History indices involved (the ops whose relationship the mutation breaks).
    pub ops: Vec<usize>,
    /// A sentence for logs and `results.json`.
    pub description: String,
}

/// Applies `control` to a copy of `history`, choosing among candidates with `seed`.
pub fn apply(
    control: NegativeControl,
    history: &History,
    seed: u64,
) -> Result<Mutation, ControlError> {
    match control {
        NegativeControl::LostAck => lost_ack(history, seed),
        NegativeControl::StaleRead => stale_read(history, seed),
        NegativeControl::WrongTotal => wrong_total(history, seed),
        NegativeControl::FracturedRead => fractured_read(history, seed),
    }
}

/// `fractured-read`: finds an ok transaction R that read keys `a` and `b` whose lists both end
/// with an append of one other transaction W, and drops W's element from R's read of `a` (only
/// where another ok read of `a` still shows it, so the version order keeps it). R then saw W on
/// `b` (W before R) and not on `a` (R before W): a cycle the append checker must find.
pub fn fractured_read(history: &History, seed: u64) -> Result<Mutation, ControlError> {
    use crate::checker::append::{parse_txn, txn_value, Micro};
    let pairs = history.pairs()?;
    // Who appended each value (by invocation index), and every ok transaction's micro-ops.
    let mut writer: HashMap<(String, u64), usize> = HashMap::new();
    let mut oks: Vec<(usize, usize, Vec<Micro>)> = Vec::new();
    for p in &pairs {
        if history.ops[p.invoke].f != OpFn::Txn {
            continue;
        }
        let source = match (p.outcome, p.completion) {
            (OpKind::Ok, Some(c)) => c,
            _ => p.invoke,
        };
        let Some(micro) = parse_txn(&history.ops[source].value) else {
            continue;
        };
        for m in &micro {
            if let Micro::Append(k, v) = m {
                writer.insert((k.clone(), *v), p.invoke);
            }
        }
        if p.outcome == OpKind::Ok {
            oks.push((p.invoke, source, micro));
        }
    }
    let last_writer = |m: &Micro| match m {
        Micro::Read(k, Some(list)) => list
            .last()
            .and_then(|v| writer.get(&(k.clone(), *v)))
            .copied(),
        _ => None,
    };
    // (completion index, position of the read to shorten)
    let mut candidates: Vec<(usize, usize)> = Vec::new();
    for (invoke, completion, micro) in &oks {
        for (i, a) in micro.iter().enumerate() {
            let (Micro::Read(key_a, Some(list_a)), Some(w)) = (a, last_writer(a)) else {
                continue;
            };
            if w == *invoke {
                continue;
            }
            let paired = micro.iter().enumerate().any(|(j, b)| {
                j != i && matches!(b, Micro::Read(k, _) if k != key_a) && last_writer(b) == Some(w)
            });
            // Another transaction's read still shows the dropped element.
            let kept = oks.iter().any(|(other_invoke, _, other)| {
                other_invoke != invoke
                    && other.iter().any(|m| {
                        matches!(m, Micro::Read(k, Some(l)) if k == key_a && l.len() >= list_a.len())
                    })
            });
            if paired && kept {
                candidates.push((*completion, i));
            }
        }
    }
    if candidates.is_empty() {
        return Err(nothing(
            NegativeControl::FracturedRead,
            "no ok transaction read two keys last appended by one other transaction",
        ));
    }
    let (completion, i) = candidates[StdRng::seed_from_u64(seed).gen_range(0..candidates.len())];
    let mut micro = parse_txn(&history.ops[completion].value).expect("parsed above");
    let Micro::Read(key, Some(list)) = &mut micro[i] else {
        unreachable!("candidates are reads");
    };
    let dropped = list.pop().expect("a candidate read is not empty");
    let description = format!("dropped {dropped} from the read of {key} in op {completion}");
    let mut mutated = history.clone();
    mutated.ops[completion].value = txn_value(&micro);
    Ok(Mutation {
        control: NegativeControl::FracturedRead,
        history: mutated,
        ops: vec![completion],
        description,
    })
}

/// `wrong-total`: lowers one balance of one ok bank read (a `read_all` whose value is an
/// object of balances) by 1, as a lost half of a transfer would.
pub fn wrong_total(history: &History, seed: u64) -> Result<Mutation, ControlError> {
    let reads: Vec<usize> = history
        .pairs()?
        .into_iter()
        .filter(|p| p.outcome == OpKind::Ok && history.ops[p.invoke].f == OpFn::ReadAll)
        .filter_map(|p| p.completion)
        .filter(|&c| {
            history.ops[c]
                .value
                .as_object()
                .is_some_and(|o| o.values().any(Value::is_i64))
        })
        .collect();
    if reads.is_empty() {
        return Err(nothing(
            NegativeControl::WrongTotal,
            "no ok read of the bank's balances",
        ));
    }
    let read = reads[StdRng::seed_from_u64(seed).gen_range(0..reads.len())];
    let mut mutated = history.clone();
    let Value::Object(balances) = &mut mutated.ops[read].value else {
        unreachable!("filtered to objects above");
    };
    let (account, balance) = balances
        .iter_mut()
        .find(|(_, b)| b.is_i64())
        .expect("filtered to reads with a balance");
    let old = balance.as_i64().expect("an integer");
    *balance = Value::from(old - 1);
    let description = format!(
        "lowered {account} from {old} to {} in read op {read}",
        old - 1
    );
    Ok(Mutation {
        control: NegativeControl::WrongTotal,
        history: mutated,
        ops: vec![read],
        description,
    })
}

fn nothing(control: NegativeControl, reason: &str) -> ControlError {
    ControlError::NothingToMutate {
        control,
        reason: reason.to_owned(),
    }
}

/// `lost-ack`: removes one acknowledged add's element from every final read of its set.
pub fn lost_ack(history: &History, seed: u64) -> Result<Mutation, ControlError> {
    let pairs = history.pairs()?;
    let mut by_key: BTreeMap<Option<String>, (Vec<OpPair>, Vec<OpPair>)> = BTreeMap::new();
    for p in pairs {
        let inv = &history.ops[p.invoke];
        let slot = by_key.entry(inv.key.clone()).or_default();
        match inv.f {
            OpFn::Add => slot.0.push(p),
            OpFn::ReadAll if p.outcome == OpKind::Ok => slot.1.push(p),
            _ => {}
        }
    }
    // (add, final-read completions containing its element)
    let mut candidates: Vec<(OpPair, Vec<usize>)> = Vec::new();
    for (adds, reads) in by_key.values() {
        let last_add_done = adds.iter().filter_map(|p| p.completion).max();
        let finals: Vec<usize> = reads
            .iter()
            .filter(|r| last_add_done.is_none_or(|last| r.invoke > last))
            .filter_map(|r| r.completion)
            .collect();
        for a in adds.iter().filter(|a| a.outcome == OpKind::Ok) {
            let elem = &history.ops[a.invoke].value;
            let holding: Vec<usize> = finals
                .iter()
                .copied()
                .filter(|&c| {
                    history.ops[c]
                        .value
                        .as_array()
                        .is_some_and(|xs| xs.contains(elem))
                })
                .collect();
            if !holding.is_empty() {
                candidates.push((*a, holding));
            }
        }
    }
    if candidates.is_empty() {
        return Err(nothing(
            NegativeControl::LostAck,
            "no acknowledged add appears in a final read_all",
        ));
    }
    let (add, reads) =
        candidates.swap_remove(StdRng::seed_from_u64(seed).gen_range(0..candidates.len()));
    let elem = history.ops[add.invoke].value.clone();
    let mut mutated = history.clone();
    for &c in &reads {
        if let Value::Array(xs) = &mut mutated.ops[c].value {
            xs.retain(|x| *x != elem);
        }
    }
    let mut ops = vec![add.invoke];
    ops.extend(add.completion);
    ops.extend(&reads);
    Ok(Mutation {
        control: NegativeControl::LostAck,
        history: mutated,
        description: format!(
            "removed element {elem} (acknowledged add, op {}) from final read(s) {reads:?}",
            add.invoke
        ),
        ops,
    })
}

/// A successful register write or CAS: when it ran and the value it left.
struct Writer {
    invoke: usize,
    completion: usize,
    value: Value,
}

/// `stale-read`: rewrites one ok read to return the value from before a completed write.
pub fn stale_read(history: &History, seed: u64) -> Result<Mutation, ControlError> {
    let pairs = history.pairs()?;
    let mut writers: HashMap<&str, Vec<Writer>> = HashMap::new();
    let mut written: HashMap<(&str, String), usize> = HashMap::new();
    let mut reads: Vec<(&str, OpPair)> = Vec::new();
    for p in &pairs {
        let inv = &history.ops[p.invoke];
        let Some(key) = inv.key.as_deref() else {
            continue;
        };
        let new = match inv.f {
            OpFn::Write => Some(&inv.value),
            OpFn::Cas => inv.cas_values().map(|(_, n)| n),
            OpFn::Read if p.outcome == OpKind::Ok => {
                reads.push((key, *p));
                None
            }
            _ => None,
        };
        let Some(new) = new else { continue };
        *written.entry((key, value_key(new))).or_default() += 1;
        if p.outcome == OpKind::Ok {
            let completion = p.completion.expect("ok has a completion");
            writers.entry(key).or_default().push(Writer {
                invoke: p.invoke,
                completion,
                value: new.clone(),
            });
        }
    }
    for ws in writers.values_mut() {
        ws.sort_by_key(|w| w.completion);
    }
    let unique =
        |key: &str, v: &Value| written.get(&(key, value_key(v))).copied().unwrap_or(0) == 1;

    // (read, W, W0 or None for "absent", the stale value)
    let mut candidates: Vec<(OpPair, &Writer, Option<&Writer>, Value)> = Vec::new();
    for (key, r) in reads {
        let Some(ws) = writers.get(key) else { continue };
        let before_r = ws.partition_point(|w| w.completion < r.invoke);
        let Some(w) = before_r.checked_sub(1).map(|i| &ws[i]) else {
            continue;
        };
        let before_w = ws.partition_point(|x| x.completion < w.invoke);
        let prev = ws[..before_w].iter().rev().find(|x| unique(key, &x.value));
        let stale = match prev {
            Some(w0) => w0.value.clone(),
            None if !written.contains_key(&(key, value_key(&Value::Null))) => Value::Null,
            None => continue,
        };
        let read_value = &history.ops[r.completion.expect("ok has a completion")].value;
        if *read_value != stale {
            candidates.push((r, w, prev, stale));
        }
    }
    if candidates.is_empty() {
        return Err(nothing(
            NegativeControl::StaleRead,
            "no ok read follows a completed write with a known previous value",
        ));
    }
    let pick = StdRng::seed_from_u64(seed).gen_range(0..candidates.len());
    let (r, w, prev, stale) = &candidates[pick];
    let rc = r.completion.expect("ok has a completion");
    let mut mutated = history.clone();
    let old = std::mem::replace(&mut mutated.ops[rc].value, stale.clone());
    let mut ops: Vec<usize> = prev
        .map(|w0| vec![w0.invoke, w0.completion])
        .unwrap_or_default();
    ops.extend([w.invoke, w.completion, r.invoke, rc]);
    Ok(Mutation {
        control: NegativeControl::StaleRead,
        history: mutated,
        description: format!(
            "read op {} now returns {stale} instead of {old}: the value before write op {} (completed at {})",
            r.invoke, w.invoke, w.completion
        ),
        ops,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checker::linearizable::{check_linearizable, LinearizableConfig};
    use crate::checker::set::check_set;
    use crate::checker::Validity;
    use crate::sim::{simulate_register, simulate_set, SimConfig};
    use serde_json::json;

    /// Names round-trip through FromStr/Display, and unknown names are rejected.
    #[test]
    fn names_parse() {
        for c in NegativeControl::ALL {
            assert_eq!(c.name().parse::<NegativeControl>().unwrap(), c);
        }
        assert!(matches!(
            "nope".parse::<NegativeControl>(),
            Err(ControlError::UnknownControl(_))
        ));
    }

    /// lost-ack on valid simulated set histories always makes the set checker fail.
    #[test]
    fn lost_ack_is_caught_by_set_checker() {
        let cfg = SimConfig {
            info_prob: 0.1,
            fail_prob: 0.1,
            read_prob: 0.2,
            ..SimConfig::default()
        };
        for seed in 0..30 {
            let h = simulate_set(&cfg, seed);
            assert!(check_set(&h).unwrap().valid);
            let m = apply(NegativeControl::LostAck, &h, seed).unwrap();
            assert_eq!(m.history.len(), h.len());
            let r = check_set(&m.history).unwrap();
            assert!(!r.valid, "seed {seed}: {}", m.description);
            assert_eq!(r.lost_count, 1);
            assert_eq!(r.anomalies[0].ops[0], m.ops[0]);
        }
    }

    /// stale-read on valid simulated register histories always makes linearizability fail.
    #[test]
    fn stale_read_is_caught_by_linearizability_checker() {
        let cfg = SimConfig {
            processes: 4,
            ops_per_process: 60,
            info_prob: 0.1,
            ..SimConfig::default()
        };
        let lin = |h: &History| {
            check_linearizable(h, &LinearizableConfig::default())
                .unwrap()
                .valid
        };
        for seed in 0..30 {
            let h = simulate_register(&cfg, seed);
            assert_eq!(lin(&h), Validity::True);
            let m = apply(NegativeControl::StaleRead, &h, seed).unwrap();
            assert_eq!(
                lin(&m.history),
                Validity::False,
                "seed {seed}: {}",
                m.description
            );
        }
    }

    /// The same seed gives the same mutation; different seeds usually pick different ops.
    #[test]
    fn mutations_are_deterministic() {
        let h = simulate_register(&SimConfig::default(), 5);
        let a = stale_read(&h, 1).unwrap();
        assert_eq!(a, stale_read(&h, 1).unwrap());
        let picks: std::collections::HashSet<Vec<usize>> =
            (0..10).map(|s| stale_read(&h, s).unwrap().ops).collect();
        assert!(picks.len() > 1);
    }

    /// Impossible mutations are errors, not silent no-ops.
    #[test]
    fn impossible_mutations_are_errors() {
        let mut h = History::new();
        h.invoke(0, OpFn::Read, Some("x"), Value::Null);
        h.complete(0, OpKind::Ok, Value::Null);
        assert!(matches!(
            stale_read(&h, 0),
            Err(ControlError::NothingToMutate { .. })
        ));
        assert!(matches!(
            lost_ack(&h, 0),
            Err(ControlError::NothingToMutate { .. })
        ));
        // A set with only failed adds has nothing acknowledged to lose.
        h.invoke(0, OpFn::Add, Some("s"), json!(1));
        h.complete(0, OpKind::Fail, json!(1));
        h.invoke(0, OpFn::ReadAll, Some("s"), Value::Null);
        h.complete(0, OpKind::Ok, json!([]));
        let err = lost_ack(&h, 0).unwrap_err();
        assert!(err.to_string().contains("lost-ack"), "{err}");
    }

    /// stale-read on the simplest history: w1; w2; r -> 2 becomes r -> 1.
    #[test]
    fn stale_read_rewrites_to_previous_value() {
        let mut h = History::new();
        for v in [1, 2] {
            h.invoke(0, OpFn::Write, Some("x"), json!(v));
            h.complete(0, OpKind::Ok, json!(v));
        }
        h.invoke(1, OpFn::Read, Some("x"), Value::Null);
        h.complete(1, OpKind::Ok, json!(2));
        let m = stale_read(&h, 0).unwrap();
        assert_eq!(m.history.ops[5].value, json!(1));
        assert_eq!(m.ops, vec![0, 1, 2, 3, 4, 5]);
    }
}

#[cfg(test)]
mod fractured_read_tests {
    use super::*;
    use crate::checker::append::check_append;
    use crate::checker::Validity;
    use serde_json::json;

    #[test]
    fn fractured_read_makes_a_cycle_the_append_checker_finds() {
        let mut h = History::new();
        for (p, txn) in [
            json!([["append", "x", 1], ["append", "y", 1]]),
            json!([["r", "x", [1]], ["r", "y", [1]]]),
            json!([["r", "x", [1]]]),
        ]
        .into_iter()
        .enumerate()
        {
            h.invoke(p as u64, OpFn::Txn, Some("append"), txn.clone());
            h.complete(p as u64, OpKind::Ok, txn);
        }
        let valid = |h: &History| check_append(h).unwrap().to_check_result().valid;
        assert_eq!(valid(&h), Validity::True);
        let m = fractured_read(&h, 1).unwrap();
        assert_eq!(m.ops, vec![3], "{}", m.description);
        assert!(
            m.description.contains("from the read of x"),
            "{}",
            m.description
        );
        assert_eq!(valid(&m.history), Validity::False);

        // Without another read of x, dropping the element would also drop it from the
        // version order (no cycle): the control refuses instead.
        let mut short = h.clone();
        short.ops.truncate(4);
        assert!(fractured_read(&short, 1).is_err());
    }
}
