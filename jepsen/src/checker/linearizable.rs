//! Linearizability of read / write / compare-and-set registers, one key at a time.
//!
//! # What
//! [`check_linearizable`] groups the register operations (`Read`, `Write`, `Cas`) of a history
//! by key and, for each key, searches for a linearization with the WGL algorithm (see
//! `checker/search.rs`). Keys are independent registers, so checking them separately is sound
//! and complete (linearizability is compositional) and keeps each search small.
//!
//! # Semantics
//! - The register starts absent; absent and null are the same value, so a read of null is
//!   legal exactly when the register is absent (never written, or written null).
//! - `Ok` ops took effect between their invoke and completion (history positions).
//! - `Fail` ops did not take effect and are dropped. A `Fail` CAS is a CAS that did not apply.
//! - `Info` ops (timeouts, crashes, invokes never completed) may or may not have taken effect at
//!   any point after their invoke: their return time is +infinity. An `Info` read constrains
//!   nothing and is dropped. An `Info` CAS applies if the register holds `expected` at its
//!   linearization point and is otherwise a no-op; "did not take effect" is covered because an
//!   op that never returns can always be linearized last, where its effect is unobservable.
//! - Before the search, values are classified as *needed*: returned by an `Ok` read, expected
//!   by an `Ok` CAS, or expected by an `Info` CAS whose new value is needed. Then:
//!   - an `Info` write/CAS whose new value is not needed is dropped. Sound: a linearization
//!     without it extends to one with it placed last; conversely, removing it from a
//!     linearization only changes the state while, by construction, no remaining op looks at
//!     it (reads and `Ok` CASes need needed values; `Info` CASes that were no-ops meanwhile can
//!     move to the end). Without this, every crashed write would double the search space of the
//!     rest of the key's history;
//!   - an `Info` write/CAS that is the only writer of a needed non-null value which some `Ok` op
//!     observes must be linearized before that observer, hence before its completion: its return
//!     time becomes the earliest such completion instead of +infinity. No verdict changes (every
//!     linearization satisfies this), but observed crashed writes stop staying pending, and
//!     multiplying the search space, for the rest of the history;
//!   - every other non-null written value that is not needed becomes one placeholder state: no
//!     op can tell such values apart, so neither needs the search.
//! - A read (or a CAS with `expected == new`) never changes the state, so once it is legal it is
//!   linearized greedily, without exploring alternatives (partial-order reduction; moving such
//!   an op earlier never invalidates a linearization).
//! - The search is bounded by [`LinearizableConfig::max_steps_per_key`]; a key that exhausts it
//!   is `Unknown`, and the overall verdict is `Unknown` unless another key is invalid.
//!
//! # Witness
//! An `Ok` read (or CAS) observing a non-null value that no operation wrote is reported
//! directly, without a search (the witness is those ops). Otherwise, for an invalid key, the
//! report gives the longest linearizable prefix found (invoke indices in linearization order),
//! the register value after it, and the ops that were candidates to go next and all failed,
//! with their invoke and completion indices.
//!
//! # Not done yet
//! Keys are checked sequentially; multi-register (transactional) ops are not supported. Proving
//! a history *invalid* explores every configuration before the violation, which grows
//! exponentially with the number of ops concurrently in flight on one key: with the default
//! budget, ~15 concurrent clients per key still decide, ~20 often end `Unknown`. Keep per-key
//! concurrency modest (spread clients over keys) or raise the budget; Lowe's just-in-time
//! linearization would push this further.

use std::collections::{BTreeMap, HashMap, HashSet};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::search::{self, Entry, Model};
use super::{value_key, Anomaly, CheckError, CheckResult, Validity};
use crate::history::{History, OpFn, OpKind};

/// Budget of the search.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LinearizableConfig {
    /// Maximum WGL steps for one key before giving up with `Unknown`.
    pub max_steps_per_key: u64,
}

impl Default for LinearizableConfig {
    fn default() -> Self {
        LinearizableConfig {
            max_steps_per_key: 10_000_000,
        }
    }
}

/// One op of a witness, as found in the history.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WitnessOp {
    /// History index of the invoke.
    pub invoke: usize,
    /// History index of the completion, if any.
    pub completion: Option<usize>,
    /// The client process.
    pub process: u64,
    /// `read`, `write` or `cas`.
    pub f: OpFn,
    /// Read: the value read; write: the value written; cas: `[expected, new]`.
    pub value: Value,
    /// `ok` or `info`.
    pub outcome: OpKind,
}

/// Why one key is not linearizable (or why its search gave up).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KeyWitness {
    /// The key.
    pub key: String,
    /// What was found, in a sentence.
    pub reason: String,
    /// Invoke indices of the longest linearizable prefix found, in linearization order.
    pub prefix: Vec<usize>,
    /// The last few ops of that prefix, in detail.
    pub prefix_tail: Vec<WitnessOp>,
    /// The register's value after the prefix (null: absent).
    pub state_after_prefix: Value,
    /// The ops that could go next after the prefix, none of which could be linearized.
    pub stuck: Vec<WitnessOp>,
}

/// The linearizability checker's report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LinearizabilityReport {
    /// Overall verdict over all keys.
    pub valid: Validity,
    /// Number of keys checked.
    pub keys: usize,
    /// Register ops handed to the search, over all keys.
    pub ops_checked: usize,
    /// `Fail` ops dropped (they did not take effect).
    pub dropped_fail: usize,
    /// `Info` reads dropped (they constrain nothing).
    pub dropped_info_reads: usize,
    /// `Info` writes/CASes dropped because their value is never observed.
    pub dropped_unobserved_info: usize,
    /// `Info` writes/CASes given a finite return time (the only writer of an observed value).
    pub bounded_info: usize,
    /// Search steps over all keys.
    pub steps: u64,
    /// Keys whose search exhausted its budget.
    pub unknown_keys: Vec<String>,
    /// Keys that are not linearizable, with witnesses.
    pub failures: Vec<KeyWitness>,
}

/// A register op in interned form (value ids; 0 is absent/null).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RegOp {
    Read(u32),
    Write(u32),
    Cas {
        expected: u32,
        new: u32,
    },
    /// Indeterminate CAS: applies if it matches, otherwise a no-op.
    InfoCas {
        expected: u32,
        new: u32,
    },
}

struct Register;

impl Model for Register {
    type State = u32;
    type Op = RegOp;
    fn init(&self) -> u32 {
        0
    }
    fn step(&self, s: &u32, op: &RegOp) -> Option<u32> {
        match *op {
            RegOp::Read(v) => (*s == v).then_some(*s),
            RegOp::Write(v) => Some(v),
            RegOp::Cas { expected, new } => (*s == expected).then_some(new),
            RegOp::InfoCas { expected, new } => Some(if *s == expected { new } else { *s }),
        }
    }
    fn is_read_only(&self, op: &RegOp) -> bool {
        match *op {
            RegOp::Read(_) => true,
            RegOp::Cas { expected, new } => expected == new,
            RegOp::Write(_) | RegOp::InfoCas { .. } => false,
        }
    }
}

/// The interned id standing for every written value that nothing ever observes (see
/// [`prune_info`]); such values are indistinguishable to every op, so one state suffices.
const UNOBSERVED: u32 = 1;

/// Interns JSON values as small integers; null is always 0, [`UNOBSERVED`] is 1.
struct Interner {
    ids: HashMap<String, u32>,
    values: Vec<Value>,
}

impl Interner {
    fn new() -> Interner {
        let mut ids = HashMap::new();
        ids.insert(value_key(&Value::Null), 0);
        Interner {
            ids,
            values: vec![
                Value::Null,
                Value::String("<a value nothing observed>".into()),
            ],
        }
    }
    fn id(&mut self, v: &Value) -> u32 {
        let next = self.values.len() as u32;
        let id = *self.ids.entry(value_key(v)).or_insert(next);
        if id == next {
            self.values.push(v.clone());
        }
        id
    }
}

/// A key's ops ready for the search, with the history pair each came from.
struct KeyOps {
    entries: Vec<Entry<RegOp>>,
    sources: Vec<WitnessOp>,
}

/// Checks every register key of `history` for linearizability.
pub fn check_linearizable(
    history: &History,
    config: &LinearizableConfig,
) -> Result<LinearizabilityReport, CheckError> {
    let pairs = history.pairs()?;
    let mut interner = Interner::new();
    let mut keys: BTreeMap<String, KeyOps> = BTreeMap::new();
    let mut report = LinearizabilityReport {
        valid: Validity::True,
        keys: 0,
        ops_checked: 0,
        dropped_fail: 0,
        dropped_info_reads: 0,
        dropped_unobserved_info: 0,
        bounded_info: 0,
        steps: 0,
        unknown_keys: Vec::new(),
        failures: Vec::new(),
    };
    for p in pairs {
        let inv = &history.ops[p.invoke];
        if !matches!(inv.f, OpFn::Read | OpFn::Write | OpFn::Cas) {
            continue;
        }
        let Some(key) = &inv.key else {
            return Err(CheckError::Malformed {
                index: p.invoke,
                reason: "register op without key".into(),
            });
        };
        if p.outcome == OpKind::Fail {
            report.dropped_fail += 1;
            continue;
        }
        let ok = p.outcome == OpKind::Ok;
        let (op, value) = match inv.f {
            OpFn::Read if !ok => {
                report.dropped_info_reads += 1;
                continue;
            }
            OpFn::Read => {
                let v = &history.ops[p.completion.expect("ok has a completion")].value;
                (RegOp::Read(interner.id(v)), v.clone())
            }
            OpFn::Write => (RegOp::Write(interner.id(&inv.value)), inv.value.clone()),
            _ => {
                let Some((e, n)) = inv.cas_values() else {
                    return Err(CheckError::Malformed {
                        index: p.invoke,
                        reason: format!("cas value must be [expected, new], got {}", inv.value),
                    });
                };
                let (expected, new) = (interner.id(e), interner.id(n));
                let op = if ok {
                    RegOp::Cas { expected, new }
                } else {
                    RegOp::InfoCas { expected, new }
                };
                (op, inv.value.clone())
            }
        };
        let ret = if ok {
            p.completion.expect("ok has a completion") as u64
        } else {
            u64::MAX
        };
        let k = keys.entry(key.clone()).or_insert_with(|| KeyOps {
            entries: Vec::new(),
            sources: Vec::new(),
        });
        k.entries.push(Entry {
            op,
            call: p.invoke as u64,
            ret,
        });
        k.sources.push(WitnessOp {
            invoke: p.invoke,
            completion: p.completion,
            process: inv.process,
            f: inv.f,
            value,
            outcome: p.outcome,
        });
    }

    for (key, ops) in keys {
        let ops = prune_info(ops, &mut report);
        report.keys += 1;
        report.ops_checked += ops.entries.len();
        let source = |ids: &[usize]| ids.iter().map(|&i| ops.sources[i].clone()).collect();
        let unwritten = observes_unwritten(&ops.entries);
        if !unwritten.is_empty() {
            report.valid = Validity::False;
            report.failures.push(KeyWitness {
                key,
                reason: "these ok ops observe a value that no operation ever wrote".into(),
                prefix: Vec::new(),
                prefix_tail: Vec::new(),
                state_after_prefix: Value::Null,
                stuck: source(&unwritten),
            });
            continue;
        }
        let r = search::check(&Register, &ops.entries, config.max_steps_per_key);
        report.steps += r.steps;
        report.valid = report.valid.and(r.verdict);
        match r.verdict {
            Validity::True => {}
            Validity::Unknown => report.unknown_keys.push(key),
            Validity::False => {
                let tail_from = r.longest.len().saturating_sub(10);
                report.failures.push(KeyWitness {
                    key,
                    reason: "no linearization: after the longest linearizable prefix, none of \
                             the stuck ops can take effect next"
                        .into(),
                    prefix: r.longest.iter().map(|&i| ops.sources[i].invoke).collect(),
                    prefix_tail: source(&r.longest[tail_from..]),
                    state_after_prefix: replay(&r.longest, &ops, &interner, r.state_after),
                    stuck: source(&r.stuck),
                });
            }
        }
    }
    Ok(report)
}

/// The register's JSON value after linearizing `prefix` (entry ids, in order). The search's own
/// state may be [`UNOBSERVED`]; replaying recovers the concrete value for the witness.
/// `expected` is the search's state after the prefix, checked against the replay.
fn replay(prefix: &[usize], ops: &KeyOps, interner: &Interner, expected: u32) -> Value {
    let mut state = Register.init();
    let mut value = Value::Null;
    for &i in prefix {
        let (op, src) = (&ops.entries[i].op, &ops.sources[i]);
        let applies = match *op {
            RegOp::Read(_) => false,
            RegOp::Write(_) | RegOp::Cas { .. } => true,
            RegOp::InfoCas { expected, .. } => state == expected,
        };
        state = Register.step(&state, op).unwrap_or(state);
        if applies {
            value = match src.f {
                OpFn::Cas => src.value.get(1).cloned().unwrap_or_default(),
                _ => src.value.clone(),
            };
        }
    }
    assert_eq!(state, expected, "witness replay diverged from the search");
    assert!(state == UNOBSERVED || interner.values[state as usize] == value);
    value
}

/// Entry ids of `Ok` reads and CASes that observe a non-null value no entry writes: a cheap,
/// complete proof of non-linearizability that needs no search.
fn observes_unwritten(entries: &[Entry<RegOp>]) -> Vec<usize> {
    let written: HashSet<u32> = entries
        .iter()
        .filter_map(|e| match e.op {
            RegOp::Write(v) | RegOp::Cas { new: v, .. } | RegOp::InfoCas { new: v, .. } => Some(v),
            RegOp::Read(_) => None,
        })
        .collect();
    let unwritten = |v: u32| v != 0 && !written.contains(&v);
    (0..entries.len())
        .filter(|&i| match entries[i].op {
            RegOp::Read(v) | RegOp::Cas { expected: v, .. } => unwritten(v),
            _ => false,
        })
        .collect()
}

/// Simplifies the key's ops before the search (see the module docs):
/// - computes the *needed* values: those an `Ok` read returns or an `Ok` CAS expects, closed
///   under "the `expected` of an `Info` CAS whose new value is needed";
/// - drops `Info` writes/CASes whose new value is not needed;
/// - bounds the return of an `Info` write/CAS that is the only writer of a needed non-null value
///   by the earliest completion of an `Ok` op observing it;
/// - maps every other non-null written value that is not needed to [`UNOBSERVED`].
fn prune_info(ops: KeyOps, report: &mut LinearizabilityReport) -> KeyOps {
    let new_value = |op: &RegOp| match *op {
        RegOp::Write(v) | RegOp::Cas { new: v, .. } | RegOp::InfoCas { new: v, .. } => Some(v),
        RegOp::Read(_) => None,
    };
    let mut writers: HashMap<u32, usize> = HashMap::new();
    // Needed value -> earliest return of an `Ok` op observing it.
    let mut first_seen: HashMap<u32, u64> = HashMap::new();
    // Info CAS new value -> the values those CASes expect.
    let mut info_cas: HashMap<u32, Vec<u32>> = HashMap::new();
    for e in &ops.entries {
        if let Some(v) = new_value(&e.op) {
            *writers.entry(v).or_default() += 1;
        }
        match e.op {
            RegOp::Read(v) | RegOp::Cas { expected: v, .. } => {
                let first = first_seen.entry(v).or_insert(u64::MAX);
                *first = (*first).min(e.ret);
            }
            RegOp::InfoCas { expected, new } => info_cas.entry(new).or_default().push(expected),
            RegOp::Write(_) => {}
        }
    }
    let mut needed: HashSet<u32> = first_seen.keys().copied().collect();
    let mut work: Vec<u32> = needed.iter().copied().collect();
    while let Some(v) = work.pop() {
        for &e in info_cas.get(&v).map_or(&[][..], |es| &es[..]) {
            if needed.insert(e) {
                work.push(e);
            }
        }
    }

    let mut out = KeyOps {
        entries: Vec::new(),
        sources: Vec::new(),
    };
    for (mut e, s) in ops.entries.into_iter().zip(ops.sources) {
        let new = new_value(&e.op);
        if e.ret == u64::MAX {
            let v = new.expect("info reads were dropped");
            if !needed.contains(&v) {
                report.dropped_unobserved_info += 1;
                continue;
            }
            let first = first_seen.get(&v).copied().unwrap_or(u64::MAX);
            if v != 0 && writers[&v] == 1 && first != u64::MAX && first > e.call {
                e.ret = first;
                report.bounded_info += 1;
            }
        }
        if let RegOp::Write(v) | RegOp::Cas { new: v, .. } | RegOp::InfoCas { new: v, .. } =
            &mut e.op
        {
            if *v != 0 && !needed.contains(v) {
                *v = UNOBSERVED;
            }
        }
        out.entries.push(e);
        out.sources.push(s);
    }
    out
}

impl LinearizabilityReport {
    /// The common result for `results.json`: one `nonlinearizable` anomaly per invalid key
    /// (ops: the stuck ops' invokes and completions), one `unknown` per key out of budget.
    pub fn to_check_result(&self) -> CheckResult {
        let mut anomalies = Vec::new();
        for w in &self.failures {
            let ops = w
                .stuck
                .iter()
                .flat_map(|o| std::iter::once(o.invoke).chain(o.completion))
                .collect();
            let stuck: Vec<String> = w
                .stuck
                .iter()
                .map(|o| format!("{} {} (op {})", o.f, o.value, o.invoke))
                .collect();
            anomalies.push(Anomaly {
                kind: "nonlinearizable".into(),
                key: Some(w.key.clone()),
                ops,
                message: format!(
                    "{} (prefix of {} ops, register then holds {}; ops: {})",
                    w.reason,
                    w.prefix.len(),
                    w.state_after_prefix,
                    stuck.join(", ")
                ),
            });
        }
        for key in &self.unknown_keys {
            anomalies.push(Anomaly {
                kind: "unknown".into(),
                key: Some(key.clone()),
                ops: Vec::new(),
                message: "linearizability search exhausted its step budget".into(),
            });
        }
        CheckResult {
            checker: "linearizable".into(),
            valid: self.valid,
            anomalies,
            stats: serde_json::to_value(self).expect("report serializes"),
        }
    }
}

#[cfg(test)]
#[path = "linearizable_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "linearizable_props.rs"]
mod props;
