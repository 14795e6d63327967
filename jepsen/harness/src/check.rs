//! Checking a recorded history with the `meridian-jepsen` checkers, and negative controls.
//!
//! - register: [`check_linearizable`] per key (WGL search, step budget per key; a key that
//!   runs out is `unknown`).
//! - set: [`check_set`] (lost acknowledged adds, unexpected / failed-but-present / duplicated
//!   elements; stale and never-read counts).
//! - append: [`check_append_with`] (Elle-style: each key's version order from the lists read,
//!   the ww/wr/rw and real-time dependency graph, a cycle = an anomaly). Real-time order is
//!   required between all transactions (strict serializability), or, under a nemesis that
//!   skews clocks, between transactions sharing a key (no stale reads; a causal reverse across
//!   shards is allowed, see the README's Transactions) unless the run commit-waits
//!   (`--linearizable`).
//! - bank: [`check_bank`] (every ok read of all accounts: the accounts opened, no negative
//!   balance, the opening total).
//! - `--negative-control NAME`: [`controls::apply`] corrupts a copy of the history (seeded), the
//!   copy is checked, and the control *fires* iff the checker finds it invalid.

use crate::args::Workload;
use meridian_jepsen::checker::append::{check_append_with, RealTime};
use meridian_jepsen::checker::bank::check_bank;
use meridian_jepsen::checker::linearizable::{check_linearizable, LinearizableConfig};
use meridian_jepsen::checker::set::check_set;
use meridian_jepsen::checker::{overall, CheckResult, Validity};
use meridian_jepsen::controls::{self, NegativeControl};
use meridian_jepsen::history::{History, OpKind};
use serde::Serialize;
use std::collections::BTreeMap;
use std::time::Instant;

/// The verdict on one history.
#[derive(Debug, Clone, Serialize)]
pub struct Verdict {
    pub valid: Validity,
    pub results: Vec<CheckResult>,
    /// Operations the checker examined (register: ops handed to the search; set: adds
    /// attempted plus successful final reads).
    pub ops_checked: usize,
    pub check_ms: u64,
}

/// Checks `history` for `workload`; `keys` are the run's keys (bank: its accounts);
/// `real_time` is the order an append history must respect.
pub fn check(
    workload: Workload,
    history: &History,
    keys: &[String],
    real_time: RealTime,
) -> anyhow::Result<Verdict> {
    let started = Instant::now();
    let (result, ops_checked) = match workload {
        Workload::Register => {
            let report = check_linearizable(history, &LinearizableConfig::default())?;
            (report.to_check_result(), report.ops_checked)
        }
        Workload::Set => {
            let report = check_set(history)?;
            (
                report.to_check_result(),
                report.attempt_count + report.final_reads,
            )
        }
        Workload::Bank => {
            let report = check_bank(history, &crate::bank::model(keys))?;
            let checked = report.reads_ok;
            (report.to_check_result(), checked)
        }
        Workload::Append => {
            let report = check_append_with(history, real_time)?;
            let checked = report.txns_ok + report.txns_indeterminate;
            (report.to_check_result(), checked)
        }
    };
    let results = vec![result];
    Ok(Verdict {
        valid: overall(&results),
        results,
        ops_checked,
        check_ms: started.elapsed().as_millis() as u64,
    })
}

/// What a negative control did.
#[derive(Debug, Clone, Serialize)]
pub struct ControlOutcome {
    pub control: String,
    /// The mutation, or why none could be made.
    pub description: String,
    /// History indices the mutation involves.
    pub ops: Vec<usize>,
    /// Whether the checker found the mutated history invalid.
    pub fired: bool,
    /// The verdict on the mutated history (absent if no mutation could be made).
    pub mutated: Option<Verdict>,
}

/// Applies `control` to `history` (seeded) and checks the result.
pub fn run_control(
    workload: Workload,
    control: NegativeControl,
    history: &History,
    keys: &[String],
    seed: u64,
    real_time: RealTime,
) -> anyhow::Result<ControlOutcome> {
    match controls::apply(control, history, seed) {
        Ok(mutation) => {
            let verdict = check(workload, &mutation.history, keys, real_time)?;
            Ok(ControlOutcome {
                control: control.name().into(),
                description: mutation.description,
                ops: mutation.ops,
                fired: verdict.valid == Validity::False,
                mutated: Some(verdict),
            })
        }
        Err(error) => Ok(ControlOutcome {
            control: control.name().into(),
            description: error.to_string(),
            ops: Vec::new(),
            fired: false,
            mutated: None,
        }),
    }
}

/// Counts of operations by function and outcome (`{"write": {"ok": 3, "info": 1}, ...}`);
/// invokes never completed count as `"info"`.
pub fn op_counts(history: &History) -> BTreeMap<String, BTreeMap<String, usize>> {
    let mut counts: BTreeMap<String, BTreeMap<String, usize>> = BTreeMap::new();
    if let Ok(pairs) = history.pairs() {
        for p in pairs {
            let f = history.ops[p.invoke].f.to_string();
            let outcome = match p.outcome {
                OpKind::Ok => "ok",
                OpKind::Fail => "fail",
                OpKind::Info | OpKind::Invoke => "info",
            };
            *counts
                .entry(f)
                .or_default()
                .entry(outcome.into())
                .or_default() += 1;
        }
    }
    counts
}

/// Totals of `op_counts` over all functions: (ok, fail, info).
pub fn totals(counts: &BTreeMap<String, BTreeMap<String, usize>>) -> (usize, usize, usize) {
    let sum = |k: &str| {
        counts
            .values()
            .map(|m| m.get(k).copied().unwrap_or(0))
            .sum()
    };
    (sum("ok"), sum("fail"), sum("info"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use meridian_jepsen::sim::{simulate_register, simulate_set, SimConfig};

    /// Simulated correct histories pass; each control fires on them.
    #[test]
    fn controls_fire_on_simulated_histories() {
        let cfg = SimConfig::default();
        let register = simulate_register(&cfg, 3);
        assert_eq!(
            check(Workload::Register, &register, &[], RealTime::Strict)
                .unwrap()
                .valid,
            Validity::True
        );
        let c = run_control(
            Workload::Register,
            NegativeControl::StaleRead,
            &register,
            &[],
            1,
            RealTime::Strict,
        )
        .unwrap();
        assert!(c.fired, "{}", c.description);
        let set = simulate_set(&cfg, 3);
        assert_eq!(
            check(Workload::Set, &set, &[], RealTime::Strict)
                .unwrap()
                .valid,
            Validity::True
        );
        let c = run_control(
            Workload::Set,
            NegativeControl::LostAck,
            &set,
            &[],
            1,
            RealTime::Strict,
        )
        .unwrap();
        assert!(c.fired, "{}", c.description);
    }

    /// A control with nothing to mutate does not fire (and says why).
    #[test]
    fn control_on_empty_history_does_not_fire() {
        let c = run_control(
            Workload::Set,
            NegativeControl::LostAck,
            &History::new(),
            &[],
            1,
            RealTime::Strict,
        )
        .unwrap();
        assert!(!c.fired && c.mutated.is_none());
        assert!(
            c.description.contains("nothing to mutate"),
            "{}",
            c.description
        );
    }

    /// Counts group by f and outcome.
    #[test]
    fn counts() {
        let mut h = History::new();
        h.invoke(0, meridian_jepsen::history::OpFn::Add, Some("s"), 1.into());
        h.complete(0, OpKind::Ok, 1.into());
        h.invoke(1, meridian_jepsen::history::OpFn::Add, Some("s"), 2.into());
        let c = op_counts(&h);
        assert_eq!(c["add"]["ok"], 1);
        assert_eq!(c["add"]["info"], 1);
        assert_eq!(totals(&c), (1, 0, 1));
    }
}
