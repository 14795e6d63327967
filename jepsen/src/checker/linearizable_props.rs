//! Property and performance tests of the register linearizability checker: simulated
//! histories (valid by construction, then corrupted), agreement with a brute-force reference,
//! and one large history for timing.

use std::time::Instant;

use proptest::prelude::*;
use serde_json::{json, Value};

use super::*;
use crate::history::{History, OpFn, OpKind};
use crate::sim::{simulate_register, SimConfig};

fn check(h: &History) -> LinearizabilityReport {
    check_linearizable(h, &LinearizableConfig::default()).expect("well-formed history")
}

/// Corrupts one ok read (chosen by `pick`) to a value never written; false if there is none.
fn corrupt_one_read(h: &mut History, pick: usize) -> bool {
    let reads: Vec<usize> = h
        .pairs()
        .unwrap()
        .into_iter()
        .filter(|p| p.outcome == OpKind::Ok && h.ops[p.invoke].f == OpFn::Read)
        .filter_map(|p| p.completion)
        .collect();
    if reads.is_empty() {
        return false;
    }
    h.ops[reads[pick % reads.len()]].value = json!("never-written");
    true
}

fn sim_config() -> impl Strategy<Value = SimConfig> {
    (1usize..7, 1usize..40, 1usize..4, 0.0f64..0.3, 0.0f64..0.2).prop_map(
        |(p, n, k, info, fail)| SimConfig {
            processes: p,
            ops_per_process: n,
            keys: k,
            info_prob: info,
            fail_prob: fail,
            read_prob: 0.0,
        },
    )
}

/// A brute-force reference: tries every real-time-respecting order of the ok ops, with each
/// info write/CAS either placed somewhere after its invoke or left out. No pruning at all.
fn reference_linearizable(h: &History) -> bool {
    struct RefOp {
        call: usize,
        ret: Option<usize>,
        f: OpFn,
        value: Value,
    }
    let ops: Vec<RefOp> = h
        .pairs()
        .unwrap()
        .into_iter()
        .filter(|p| {
            p.outcome == OpKind::Ok
                || (p.outcome == OpKind::Info && h.ops[p.invoke].f != OpFn::Read)
        })
        .map(|p| {
            let inv = &h.ops[p.invoke];
            let ok = p.outcome == OpKind::Ok;
            let value = if inv.f == OpFn::Read {
                h.ops[p.completion.unwrap()].value.clone()
            } else {
                inv.value.clone()
            };
            RefOp {
                call: p.invoke,
                ret: if ok { p.completion } else { None },
                f: inv.f,
                value,
            }
        })
        .collect();
    fn go(ops: &[RefOp], done: &mut [bool], state: &Value) -> bool {
        if ops
            .iter()
            .zip(done.iter())
            .all(|(o, d)| *d || o.ret.is_none())
        {
            return true;
        }
        for i in 0..ops.len() {
            let blocked =
                (0..ops.len()).any(|j| !done[j] && ops[j].ret.is_some_and(|r| r < ops[i].call));
            if done[i] || blocked {
                continue;
            }
            let o = &ops[i];
            let next = match o.f {
                OpFn::Read => (*state == o.value).then(|| state.clone()),
                OpFn::Write => Some(o.value.clone()),
                _ => {
                    let (e, n) = (&o.value[0], &o.value[1]);
                    if *state == *e {
                        Some(n.clone())
                    } else if o.ret.is_none() {
                        Some(state.clone())
                    } else {
                        None
                    }
                }
            };
            if let Some(next) = next {
                done[i] = true;
                if go(ops, done, &next) {
                    return true;
                }
                done[i] = false;
            }
        }
        false
    }
    go(&ops, &mut vec![false; ops.len()], &Value::Null)
}

/// A small simulated history on one key with some ok reads changed to another value that was
/// written (or null), some CAS outcomes flipped, and some writes and CAS expectations changed to
/// repeat an earlier value (or null): linearizable or not, unknown in advance.
fn perturbed_history(seed: u64, procs: usize, ops: usize, flips: u64) -> History {
    let cfg = SimConfig {
        processes: procs,
        ops_per_process: ops,
        keys: 1,
        info_prob: 0.25,
        fail_prob: 0.1,
        read_prob: 0.0,
    };
    let mut h = simulate_register(&cfg, seed);
    let mut written: Vec<Value> = vec![Value::Null];
    written.extend(
        h.ops
            .iter()
            .filter(|o| o.kind == OpKind::Invoke && o.f == OpFn::Write)
            .map(|o| o.value.clone()),
    );
    for (n, op) in h.ops.iter_mut().enumerate() {
        let roll = (seed ^ flips)
            .wrapping_mul(0x9E37_79B9_7F4A_7C15)
            .rotate_left(n as u32 % 64)
            % 5;
        match (op.kind, op.f) {
            (OpKind::Ok, OpFn::Read) if roll == 0 => op.value = written[n % written.len()].clone(),
            (OpKind::Ok, OpFn::Cas) if roll == 1 => op.kind = OpKind::Fail,
            (OpKind::Fail, OpFn::Cas) if roll == 1 => op.kind = OpKind::Ok,
            (OpKind::Invoke, OpFn::Write) if roll == 2 => {
                op.value = written[n % written.len()].clone()
            }
            (OpKind::Invoke, OpFn::Cas) if roll == 2 => {
                op.value[0] = written[n % written.len()].clone()
            }
            _ => {}
        }
    }
    h
}

proptest! {
    /// The optimized search (pruning, bounding, greedy reads, placeholder states) agrees with a
    /// brute-force reference on small, possibly non-linearizable histories.
    #[test]
    fn agrees_with_brute_force(seed in any::<u64>(), procs in 1usize..6, ops in 1usize..6, flips in any::<u64>()) {
        let h = perturbed_history(seed, procs, ops, flips);
        let expected = Validity::from_bool(reference_linearizable(&h));
        prop_assert_eq!(check(&h).valid, expected, "{}", h.to_jsonl_string());
    }

    /// Histories of a simulated atomic register with concurrent clients are always linearizable.
    #[test]
    fn simulated_histories_are_linearizable(cfg in sim_config(), seed in any::<u64>()) {
        let h = simulate_register(&cfg, seed);
        let r = check(&h);
        prop_assert_eq!(r.valid, Validity::True, "{:?}", r);
    }

    /// The same histories with one ok read corrupted to a never-written value never are.
    #[test]
    fn corrupted_reads_are_never_linearizable(cfg in sim_config(), seed in any::<u64>(), pick in any::<usize>()) {
        let mut h = simulate_register(&cfg, seed);
        prop_assume!(corrupt_one_read(&mut h, pick));
        let r = check(&h);
        prop_assert_eq!(r.valid, Validity::False);
        prop_assert_eq!(r.failures.len(), 1);
    }

    /// With one ok read made stale (the value from before a completed write: a subtler
    /// corruption that needs the full search), they never are either.
    #[test]
    fn stale_reads_are_never_linearizable(cfg in sim_config(), seed in any::<u64>()) {
        let h = simulate_register(&cfg, seed);
        let Ok(m) = crate::controls::stale_read(&h, seed) else { return Ok(()) };
        let r = check(&m.history);
        prop_assert_eq!(r.valid, Validity::False, "{}", m.description);
    }
}

/// Performance: 10 processes x 2,000 ops on 5 keys checks as valid (time printed, not asserted).
#[test]
fn large_history_checks_valid() {
    let cfg = SimConfig {
        processes: 10,
        ops_per_process: 2_000,
        keys: 5,
        info_prob: 0.02,
        fail_prob: 0.02,
        read_prob: 0.0,
    };
    let h = simulate_register(&cfg, 42);
    let started = Instant::now();
    let r = check(&h);
    let took = started.elapsed();
    eprintln!(
        "large history: {} events, {} ops checked on {} keys, {} steps, {:?}",
        h.len(),
        r.ops_checked,
        r.keys,
        r.steps,
        took
    );
    assert_eq!(r.valid, Validity::True, "{:?}", r.failures);
}
