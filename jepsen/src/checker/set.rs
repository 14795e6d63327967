//! The set workload checker: were acknowledged inserts kept, and nothing invented?
//!
//! # What
//! Clients `Add` unique elements to a set (per key) and, at the end, after every add has
//! completed, one or more `ReadAll`s read the whole set. [`check_set`] compares what was
//! acknowledged with what was finally read:
//!
//! - **lost**: an `Ok` add missing from a final read. The store acknowledged a write and then
//!   lost it: invalid.
//! - **unexpected**: an element in any read that no add ever attempted: invalid.
//! - **failed-present**: an element of a `Fail` add (definitely not applied) in any read: invalid.
//! - **duplicated**: an element listed twice by one read of a set: invalid.
//! - **recovered**: an `Info` add present in a final read (it did take effect): fine, counted.
//! - **never read**: an attempted, not failed, add that appears in no read at all (for `Ok` adds
//!   this is the same as lost; for `Info` adds it means "probably never applied"): counted.
//! - **stale**: for a non-final read, an `Ok` add acknowledged before that read was invoked but
//!   missing from it. Reported as a count, not a failure: the workload makes no claim that
//!   intermediate reads are linearizable (they may be served by followers).
//!
//! A read is *final* if it completed `Ok` and was invoked after the completion of every add of
//! its key. With no final read the result is invalid, with a reason: without one, nothing can be
//! said about loss.
//!
//! # Invariants
//! Elements are compared by their canonical JSON text. Add elements must be unique per key
//! (otherwise the check is a [`CheckError::Malformed`]); reads must return arrays.
//!
//! # Not done yet
//! No detection of reads that see an element before its add was invoked, and no per-element
//! latency-to-visibility statistics (Jepsen's set-full).

use std::collections::{BTreeMap, HashMap, HashSet};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{value_key, Anomaly, CheckError, CheckResult, Validity};
use crate::history::{History, OpFn, OpKind, OpPair};

/// How many example elements each list in the report keeps (counts are always complete).
const MAX_LISTED: usize = 100;

/// The set checker's report (summed over keys).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SetReport {
    /// Overall verdict.
    pub valid: bool,
    /// Why invalid, in a sentence (absent when valid).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Adds attempted.
    pub attempt_count: usize,
    /// Adds acknowledged (`Ok`).
    pub ok_count: usize,
    /// Adds that failed (`Fail`).
    pub fail_count: usize,
    /// Adds with indeterminate outcome (`Info`, or never completed).
    pub info_count: usize,
    /// Successful final reads.
    pub final_reads: usize,
    /// Successful non-final reads.
    pub intermediate_reads: usize,
    /// Acknowledged adds missing from a final read.
    pub lost_count: usize,
    /// Some lost elements.
    pub lost: Vec<Value>,
    /// Elements read that were never attempted.
    pub unexpected_count: usize,
    /// Some unexpected elements.
    pub unexpected: Vec<Value>,
    /// Elements of failed adds that were read.
    pub failed_present_count: usize,
    /// Elements listed twice in one read.
    pub duplicated_count: usize,
    /// Info adds present in a final read.
    pub recovered_count: usize,
    /// Attempted (not failed) adds present in no read at all.
    pub never_read_count: usize,
    /// (non-final read, element) pairs where an element acknowledged before the read was missing.
    pub stale_count: usize,
    /// Non-final reads with at least one stale element.
    pub stale_reads: usize,
    /// The anomalies, with op indices (also in [`CheckResult::anomalies`]).
    #[serde(skip)]
    pub anomalies: Vec<Anomaly>,
}

struct Add {
    pair: OpPair,
    value: Value,
}

/// Checks every set key of `history` (ops `Add` and `ReadAll`; others are ignored).
pub fn check_set(history: &History) -> Result<SetReport, CheckError> {
    let mut by_key: BTreeMap<Option<String>, (Vec<OpPair>, Vec<OpPair>)> = BTreeMap::new();
    for p in history.pairs()? {
        let inv = &history.ops[p.invoke];
        let slot = by_key.entry(inv.key.clone()).or_default();
        match inv.f {
            OpFn::Add => slot.0.push(p),
            OpFn::ReadAll => slot.1.push(p),
            _ => {}
        }
    }
    let mut report = SetReport {
        valid: true,
        ..SetReport::default()
    };
    if by_key.is_empty() {
        report.valid = false;
        report.reason = Some("no set operations in the history".into());
    }
    for (key, (adds, reads)) in by_key {
        check_key(history, key, &adds, &reads, &mut report)?;
    }
    if report.valid && !report.anomalies.is_empty() {
        report.valid = false;
        let mut kinds: Vec<&str> = report.anomalies.iter().map(|a| a.kind.as_str()).collect();
        kinds.sort_unstable();
        kinds.dedup();
        report.reason = Some(format!("anomalies found: {}", kinds.join(", ")));
    }
    Ok(report)
}

fn push_limited(list: &mut Vec<Value>, v: &Value) {
    if list.len() < MAX_LISTED {
        list.push(v.clone());
    }
}

fn check_key(
    history: &History,
    key: Option<String>,
    add_pairs: &[OpPair],
    read_pairs: &[OpPair],
    report: &mut SetReport,
) -> Result<(), CheckError> {
    let mut adds: HashMap<String, Add> = HashMap::new();
    for p in add_pairs {
        let value = history.ops[p.invoke].value.clone();
        report.attempt_count += 1;
        match p.outcome {
            OpKind::Ok => report.ok_count += 1,
            OpKind::Fail => report.fail_count += 1,
            _ => report.info_count += 1,
        }
        if let Some(prev) = adds.insert(
            value_key(&value),
            Add {
                pair: *p,
                value: value.clone(),
            },
        ) {
            return Err(CheckError::Malformed {
                index: p.invoke,
                reason: format!("element {value} already added by op {}", prev.pair.invoke),
            });
        }
    }
    let last_add_done = add_pairs.iter().filter_map(|p| p.completion).max();
    let anomaly = |kind: &str, ops: Vec<usize>, message: String| Anomaly {
        kind: kind.into(),
        key: key.clone(),
        ops,
        message,
    };
    let pair_ops = |p: &OpPair| {
        std::iter::once(p.invoke)
            .chain(p.completion)
            .collect::<Vec<_>>()
    };

    // Parse every successful read; classify as final or intermediate.
    let mut finals: Vec<(OpPair, HashSet<String>)> = Vec::new();
    let mut intermediates: Vec<(OpPair, HashSet<String>)> = Vec::new();
    let mut ever_read: HashSet<String> = HashSet::new();
    let mut reported: HashSet<(&str, String)> = HashSet::new();
    for p in read_pairs.iter().filter(|p| p.outcome == OpKind::Ok) {
        let done = p.completion.expect("ok has a completion");
        let Value::Array(elems) = &history.ops[done].value else {
            return Err(CheckError::Malformed {
                index: done,
                reason: "read_all must return an array".into(),
            });
        };
        let mut seen = HashSet::new();
        for e in elems {
            let k = value_key(e);
            if !seen.insert(k.clone()) {
                report.duplicated_count += 1;
                report.anomalies.push(anomaly(
                    "duplicated",
                    pair_ops(p),
                    format!("read lists {e} twice"),
                ));
            }
            match adds.get(&k) {
                None if reported.insert(("unexpected", k.clone())) => {
                    report.unexpected_count += 1;
                    push_limited(&mut report.unexpected, e);
                    report.anomalies.push(anomaly(
                        "unexpected",
                        pair_ops(p),
                        format!("read returned {e}, never added"),
                    ));
                }
                Some(a)
                    if a.pair.outcome == OpKind::Fail
                        && reported.insert(("failed-present", k.clone())) =>
                {
                    report.failed_present_count += 1;
                    let mut ops = pair_ops(&a.pair);
                    ops.extend(pair_ops(p));
                    report.anomalies.push(anomaly(
                        "failed-present",
                        ops,
                        format!("read returned {e}, whose add failed"),
                    ));
                }
                _ => {}
            }
        }
        ever_read.extend(seen.iter().cloned());
        if last_add_done.is_none_or(|last| p.invoke > last) {
            finals.push((*p, seen));
        } else {
            intermediates.push((*p, seen));
        }
    }
    report.final_reads += finals.len();
    report.intermediate_reads += intermediates.len();
    if finals.is_empty() {
        report.valid = false;
        let reason =
            format!("set {key:?}: no successful read_all invoked after every add completed");
        report
            .anomalies
            .push(anomaly("no-final-read", Vec::new(), reason.clone()));
        report.reason.get_or_insert(reason);
    }

    // Adds in history order, for deterministic reports.
    let mut ordered: Vec<&Add> = adds.values().collect();
    ordered.sort_by_key(|a| a.pair.invoke);
    for a in &ordered {
        let k = value_key(&a.value);
        if a.pair.outcome != OpKind::Fail && !ever_read.contains(&k) {
            report.never_read_count += 1;
        }
        match a.pair.outcome {
            OpKind::Ok => {
                if let Some((r, _)) = finals.iter().find(|(_, s)| !s.contains(&k)) {
                    report.lost_count += 1;
                    push_limited(&mut report.lost, &a.value);
                    let mut ops = pair_ops(&a.pair);
                    ops.extend(pair_ops(r));
                    let msg = format!(
                        "acknowledged add of {} missing from final read {}",
                        a.value, r.invoke
                    );
                    report.anomalies.push(anomaly("lost", ops, msg));
                }
            }
            OpKind::Info if finals.iter().any(|(_, s)| s.contains(&k)) => {
                report.recovered_count += 1
            }
            _ => {}
        }
    }

    // Stale intermediate reads: acknowledged before the read was invoked, yet missing.
    let mut acked: Vec<(usize, String)> = ordered
        .iter()
        .filter(|a| a.pair.outcome == OpKind::Ok)
        .map(|a| {
            (
                a.pair.completion.expect("ok has a completion"),
                value_key(&a.value),
            )
        })
        .collect();
    acked.sort();
    for (r, seen) in &intermediates {
        let before = acked.partition_point(|(done, _)| *done < r.invoke);
        let stale = acked[..before]
            .iter()
            .filter(|(_, k)| !seen.contains(k))
            .count();
        report.stale_count += stale;
        report.stale_reads += usize::from(stale > 0);
    }
    Ok(())
}

impl SetReport {
    /// The common result for `results.json`.
    pub fn to_check_result(&self) -> CheckResult {
        CheckResult {
            checker: "set".into(),
            valid: Validity::from_bool(self.valid),
            anomalies: self.anomalies.clone(),
            stats: serde_json::to_value(self).expect("report serializes"),
        }
    }
}

#[cfg(test)]
#[path = "set_tests.rs"]
mod tests;
