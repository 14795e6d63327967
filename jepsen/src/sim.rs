//! Simulated histories: correct executions of a sequential register or set, recorded the way the
//! harness records real ones.
//!
//! # What
//! [`simulate_register`] and [`simulate_set`] run a discrete-event simulation: concurrent client
//! processes invoke operations against a single, atomic, in-memory object; each operation takes
//! effect at one random instant inside its invoke–completion interval, and the events are
//! recorded in the order they happen. The result is linearizable by construction, which makes
//! these histories ground truth for the checkers' property and performance tests, for the
//! negative controls, and for a harness self-test that needs no cluster.
//!
//! Faults are modelled the way clients see them: a `Fail` op did not take effect; an `Info` op
//! (timeout) took effect with probability 1/2, possibly *after* its completion was recorded,
//! and its process is then retired and replaced by a fresh process id, as Jepsen does. An
//! `Info` op that is a process's last may have no completion at all.
//!
//! # Invariants
//! - Deterministic for a given config and seed (`StdRng::seed_from_u64`).
//! - Written register values and added set elements are unique positive integers, so a value
//!   that was never written is easy to produce (any value above the counter, or a string).
//! - Every generated history passes [`History::validate`].
//!
//! # Not done yet
//! No clock skew or reordered recording: the recorded order is the true real-time order.

use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap, HashMap};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::history::{History, Op, OpFn, OpKind};

/// Shape of a simulated run.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SimConfig {
    /// Concurrent client processes.
    pub processes: usize,
    /// Operations each process slot performs (adds, for the set workload).
    pub ops_per_process: usize,
    /// Register keys (ignored by the set workload).
    pub keys: usize,
    /// Probability that an op ends `Info`.
    pub info_prob: f64,
    /// Probability that an op ends `Fail` without taking effect.
    pub fail_prob: f64,
    /// Set workload: probability that an op is a (non-final) `ReadAll` rather than an `Add`.
    pub read_prob: f64,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            processes: 5,
            ops_per_process: 50,
            keys: 2,
            info_prob: 0.05,
            fail_prob: 0.05,
            read_prob: 0.1,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    Invoke { slot: usize },
    Apply { op: usize },
    Complete { op: usize },
}

/// One in-flight or finished operation of the simulation.
struct SimOp {
    slot: usize,
    process: u64,
    f: OpFn,
    key: Option<String>,
    value: Value,
    planned: OpKind,
    /// What the op observed when applied: read value, CAS success.
    result: Option<Value>,
    last: bool,
}

struct Sim {
    rng: StdRng,
    cfg: SimConfig,
    heap: BinaryHeap<Reverse<(u64, u64, Event)>>,
    seq: u64,
    history: History,
    ops: Vec<SimOp>,
    pid: Vec<u64>,
    done: Vec<usize>,
    next_pid: u64,
    next_value: u64,
}

impl Sim {
    fn new(cfg: SimConfig, seed: u64) -> Sim {
        let mut sim = Sim {
            rng: StdRng::seed_from_u64(seed),
            cfg,
            heap: BinaryHeap::new(),
            seq: 0,
            history: History::new(),
            ops: Vec::new(),
            pid: (0..cfg.processes as u64).collect(),
            done: vec![0; cfg.processes],
            next_pid: cfg.processes as u64,
            next_value: 1,
        };
        for slot in 0..cfg.processes {
            let t = sim.rng.gen_range(0..10);
            sim.schedule(t, Event::Invoke { slot });
        }
        sim
    }

    fn schedule(&mut self, t: u64, e: Event) {
        self.seq += 1;
        self.heap.push(Reverse((t, self.seq, e)));
    }

    fn record(&mut self, t: u64, mut op: Op) {
        op.time_ns = t * 1_000;
        op.wall_ms = 1_700_000_000_000 + t / 1_000;
        self.history.push(op);
    }

    /// Starts op `(f, key, value)` for `slot` at time `t`: records the invoke and schedules the
    /// apply (if the op takes effect) and the completion.
    fn start(&mut self, t: u64, slot: usize, f: OpFn, key: Option<String>, value: Value) {
        let roll: f64 = self.rng.gen();
        let planned = if roll < self.cfg.info_prob {
            OpKind::Info
        } else if roll < self.cfg.info_prob + self.cfg.fail_prob {
            OpKind::Fail
        } else {
            OpKind::Ok
        };
        let dur = self.rng.gen_range(2..40);
        let id = self.ops.len();
        self.done[slot] += 1;
        let last = self.done[slot] == self.cfg.ops_per_process;
        let op = Op::new(
            self.pid[slot],
            OpKind::Invoke,
            f,
            key.as_deref(),
            value.clone(),
        );
        self.record(t, op);
        self.ops.push(SimOp {
            slot,
            process: self.pid[slot],
            f,
            key,
            value,
            planned,
            result: None,
            last,
        });
        match planned {
            OpKind::Ok => {
                let at = self.rng.gen_range(t + 1..t + dur);
                self.schedule(at, Event::Apply { op: id });
            }
            OpKind::Info if self.rng.gen_bool(0.5) => {
                let at = self.rng.gen_range(t + 1..t + 3 * dur);
                self.schedule(at, Event::Apply { op: id });
            }
            _ => {}
        }
        self.schedule(t + dur, Event::Complete { op: id });
    }

    /// Records op `id`'s completion at `t` and schedules its slot's next invoke.
    fn finish(&mut self, t: u64, id: usize) {
        let o = &self.ops[id];
        let (kind, value, error) = match (o.planned, o.f) {
            (OpKind::Ok, OpFn::Cas) if o.result == Some(Value::Bool(false)) => (
                OpKind::Fail,
                o.value.clone(),
                Some("cas mismatch".to_owned()),
            ),
            (OpKind::Ok, OpFn::Read | OpFn::ReadAll) => {
                (OpKind::Ok, o.result.clone().unwrap_or_default(), None)
            }
            (OpKind::Ok, _) => (OpKind::Ok, o.value.clone(), None),
            (OpKind::Fail, _) => (
                OpKind::Fail,
                o.value.clone(),
                Some("unavailable".to_owned()),
            ),
            _ => (OpKind::Info, Value::Null, Some("timeout".to_owned())),
        };
        let (slot, last) = (o.slot, o.last);
        if kind == OpKind::Info && last && self.rng.gen_bool(0.5) {
            return; // the client crashed: no completion is ever recorded
        }
        let mut op = Op::new(o.process, kind, o.f, o.key.as_deref(), value);
        op.error = error;
        op.node = Some(format!("n{}", 1 + o.process % 3));
        self.record(t, op);
        if kind == OpKind::Info {
            self.pid[slot] = self.next_pid;
            self.next_pid += 1;
        }
        if !last {
            let gap = self.rng.gen_range(1..6);
            self.schedule(t + gap, Event::Invoke { slot });
        }
    }

    fn fresh_value(&mut self) -> u64 {
        self.next_value += 1;
        self.next_value - 1
    }
}

/// A correct, concurrent history of read/write/CAS registers (see the module docs).
pub fn simulate_register(cfg: &SimConfig, seed: u64) -> History {
    let mut sim = Sim::new(*cfg, seed);
    let keys = cfg.keys.max(1);
    let mut state: HashMap<String, Value> = HashMap::new();
    while let Some(Reverse((t, _, e))) = sim.heap.pop() {
        match e {
            Event::Invoke { slot } => {
                let key = format!("k{}", sim.rng.gen_range(0..keys));
                let roll: f64 = sim.rng.gen();
                let (f, value) = if roll < 0.5 {
                    (OpFn::Read, Value::Null)
                } else if roll < 0.8 {
                    (OpFn::Write, json!(sim.fresh_value()))
                } else {
                    // Usually expect the current value, so CASes often succeed.
                    let cur = state.get(&key).cloned().unwrap_or(Value::Null);
                    let old = sim.rng.gen_range(0..sim.next_value);
                    let expected = if sim.rng.gen_bool(0.7) {
                        cur
                    } else {
                        json!(old)
                    };
                    (OpFn::Cas, json!([expected, sim.fresh_value()]))
                };
                sim.start(t, slot, f, Some(key), value);
            }
            Event::Apply { op } => {
                let o = &mut sim.ops[op];
                let key = o.key.clone().unwrap_or_default();
                let cur = state.entry(key).or_insert(Value::Null);
                o.result = Some(match o.f {
                    OpFn::Read => cur.clone(),
                    OpFn::Write => {
                        *cur = o.value.clone();
                        Value::Null
                    }
                    _ => {
                        let (e, n) = (o.value[0].clone(), o.value[1].clone());
                        let matched = *cur == e;
                        if matched {
                            *cur = n;
                        }
                        Value::Bool(matched)
                    }
                });
            }
            Event::Complete { op } => sim.finish(t, op),
        }
    }
    sim.history
}

/// A correct, concurrent set history: unique adds, occasional `ReadAll`s, and one final
/// `ReadAll` after every operation (including late-applying `Info` adds) has taken effect.
pub fn simulate_set(cfg: &SimConfig, seed: u64) -> History {
    let mut sim = Sim::new(*cfg, seed);
    let key = Some("s".to_owned());
    let mut set: BTreeSet<u64> = BTreeSet::new();
    let mut end = 0;
    while let Some(Reverse((t, _, e))) = sim.heap.pop() {
        end = t;
        match e {
            Event::Invoke { slot } => {
                if sim.rng.gen_bool(cfg.read_prob) {
                    sim.start(t, slot, OpFn::ReadAll, key.clone(), Value::Null);
                } else {
                    let v = json!(sim.fresh_value());
                    sim.start(t, slot, OpFn::Add, key.clone(), v);
                }
            }
            Event::Apply { op } => {
                let o = &mut sim.ops[op];
                if o.f == OpFn::Add {
                    set.insert(o.value.as_u64().expect("sim adds integers"));
                } else {
                    o.result = Some(json!(set.iter().collect::<Vec<_>>()));
                }
            }
            Event::Complete { op } => sim.finish(t, op),
        }
    }
    let reader = sim.next_pid;
    let mut inv = Op::new(
        reader,
        OpKind::Invoke,
        OpFn::ReadAll,
        key.as_deref(),
        Value::Null,
    );
    inv.node = Some("n1".into());
    sim.record(end + 1, inv);
    let mut ok = Op::new(
        reader,
        OpKind::Ok,
        OpFn::ReadAll,
        key.as_deref(),
        json!(set.iter().collect::<Vec<_>>()),
    );
    ok.node = Some("n1".into());
    sim.record(end + 2, ok);
    sim.history
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Simulated histories are well formed and deterministic per seed.
    #[test]
    fn simulations_are_valid_and_deterministic() {
        let cfg = SimConfig::default();
        for seed in 0..20 {
            let r = simulate_register(&cfg, seed);
            r.validate().unwrap();
            assert_eq!(r, simulate_register(&cfg, seed));
            let s = simulate_set(&cfg, seed);
            s.validate().unwrap();
            assert_eq!(s, simulate_set(&cfg, seed));
        }
        assert_ne!(simulate_register(&cfg, 1), simulate_register(&cfg, 2));
    }

    /// Every outcome occurs: ok, fail, info, and invokes without completion.
    #[test]
    fn simulations_exercise_all_outcomes() {
        let cfg = SimConfig {
            info_prob: 0.2,
            fail_prob: 0.1,
            ..SimConfig::default()
        };
        let h = simulate_register(&cfg, 7);
        let pairs = h.pairs().unwrap();
        for kind in [OpKind::Ok, OpKind::Fail, OpKind::Info] {
            assert!(pairs.iter().any(|p| p.outcome == kind), "{kind:?}");
        }
        assert!(pairs.iter().any(|p| p.completion.is_none()));
    }
}
