//! Meridian's Jepsen-style harness library: histories, checkers, negative controls, timelines.
//!
//! # What
//! A Jepsen test runs concurrent clients against a cluster while a *nemesis* injects faults
//! (partitions, kills, clock skew), records every operation as an invoke/completion pair, and
//! afterwards asks a *checker* whether the recorded history is consistent with the guarantees
//! Meridian claims. This crate is the pure, deterministic half of that: it never talks to a
//! cluster. The harness (driver, clients, nemeses) produces a [`history::History`], writes it as
//! `history.jsonl`, and uses this crate to judge it and to write `results.json` and a timeline.
//!
//! # Layout
//! - [`history`]: the Jepsen-shaped history model, invoke/completion pairing, validation, and
//!   JSON Lines I/O.
//! - [`checker`]: the common three-valued [`checker::CheckResult`], and
//!   - [`checker::linearizable`]: per-key linearizability of read/write/CAS registers (WGL search
//!     with memoization, bounded by a step budget, with a witness on failure);
//!   - [`checker::set`]: the set workload (lost acknowledged adds, unexpected elements, stale
//!     intermediate reads);
//!   - [`checker::bank`]: the bank workload (every read of all accounts keeps the total, no
//!     negative balance);
//!   - [`checker::append`]: list-append transactions, Elle-style (version orders from the
//!     lists read, a ww/wr/rw and real-time dependency graph, cycles = not strictly
//!     serializable).
//! - [`controls`]: negative controls (`lost-ack`, `stale-read`, `wrong-total`,
//!   `fractured-read`): minimal
//!   corruptions that a checker must catch, proving it is not vacuously green.
//! - [`timeline`]: a self-contained SVG of the history, with nemesis intervals and latencies.
//! - [`sim`]: simulated correct histories (an atomic register or set behind concurrent, faulty
//!   clients) — ground truth for tests and a cluster-free self-test of the harness.
//!
//! # What is checked, and what not yet
//! Checked: single-key linearizability of registers (the strongest claim for single-key
//! reads/writes/CAS, including indeterminate `Info` outcomes), durability/no-invention of a
//! grow-only set, the bank invariant over transactions (total conserved, no overdraft), and
//! strict serializability of list-append transactions (Elle-style cycle detection, with
//! real-time edges). Not yet: session guarantees.
//! Checking is single-threaded.
//!
//! # Invariants
//! Everything here is deterministic given its inputs (and a seed where randomness is involved),
//! does no I/O beyond reading and writing history files, and never reports a history valid
//! without having fully examined it (`Unknown` exists for that).

pub mod checker;
pub mod controls;
pub mod history;
pub mod sim;
pub mod timeline;
