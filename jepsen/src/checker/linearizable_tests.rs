//! Tests of the register linearizability checker on hand-built histories: valid ones, and the
//! classic invalid ones from Knossos.

use serde_json::{json, Value};

use super::*;
use crate::history::{History, OpFn, OpKind};
use crate::sim::{simulate_register, SimConfig};

const K: Option<&str> = Some("x");

fn check(h: &History) -> LinearizabilityReport {
    check_linearizable(h, &LinearizableConfig::default()).expect("well-formed history")
}

fn write(h: &mut History, p: u64, v: i64) {
    h.invoke(p, OpFn::Write, K, json!(v));
}

fn read(h: &mut History, p: u64) {
    h.invoke(p, OpFn::Read, K, Value::Null);
}

fn cas(h: &mut History, p: u64, e: Value, n: i64) {
    h.invoke(p, OpFn::Cas, K, json!([e, n]));
}

fn ok(h: &mut History, p: u64, v: Value) {
    h.complete(p, OpKind::Ok, v);
}

/// A sequential write-then-read history, and reads of absent before any write, are valid.
#[test]
fn sequential_history_is_valid() {
    let mut h = History::new();
    read(&mut h, 0);
    ok(&mut h, 0, Value::Null);
    write(&mut h, 0, 1);
    ok(&mut h, 0, json!(1));
    read(&mut h, 1);
    ok(&mut h, 1, json!(1));
    write(&mut h, 1, 2);
    ok(&mut h, 1, json!(2));
    read(&mut h, 0);
    ok(&mut h, 0, json!(2));
    let r = check(&h);
    assert_eq!(r.valid, Validity::True, "{r:?}");
    assert_eq!((r.keys, r.ops_checked), (1, 5));
}

/// Two overlapping writes and an overlapping read: the read may see either value.
#[test]
fn concurrent_writes_either_order_is_valid() {
    for seen in [1, 2] {
        let mut h = History::new();
        write(&mut h, 0, 1);
        write(&mut h, 1, 2);
        read(&mut h, 2);
        ok(&mut h, 0, json!(1));
        ok(&mut h, 1, json!(2));
        ok(&mut h, 2, json!(seen));
        // After both writes completed, whichever was linearized last stays.
        read(&mut h, 2);
        ok(&mut h, 2, json!(seen));
        assert_eq!(check(&h).valid, Validity::True, "read {seen}");
    }
}

/// A read concurrent with the first write may see absent.
#[test]
fn read_concurrent_with_first_write_may_see_absent() {
    let mut h = History::new();
    write(&mut h, 0, 1);
    read(&mut h, 1);
    ok(&mut h, 1, Value::Null);
    ok(&mut h, 0, json!(1));
    assert_eq!(check(&h).valid, Validity::True);
}

/// An info write may have taken effect, even long after its timeout was recorded.
#[test]
fn info_write_that_took_effect_is_valid() {
    let mut h = History::new();
    write(&mut h, 0, 1);
    ok(&mut h, 0, json!(1));
    write(&mut h, 1, 2);
    h.complete(1, OpKind::Info, Value::Null);
    read(&mut h, 2);
    ok(&mut h, 2, json!(1));
    read(&mut h, 2);
    ok(&mut h, 2, json!(2));
    assert_eq!(check(&h).valid, Validity::True);
}

/// An info write may also never have taken effect (and is then dropped as unobserved).
#[test]
fn info_write_that_did_not_take_effect_is_valid() {
    let mut h = History::new();
    write(&mut h, 0, 1);
    ok(&mut h, 0, json!(1));
    write(&mut h, 1, 2);
    h.complete(1, OpKind::Info, Value::Null);
    write(&mut h, 3, 3);
    read(&mut h, 2);
    ok(&mut h, 2, json!(1));
    ok(&mut h, 3, json!(3));
    read(&mut h, 2);
    ok(&mut h, 2, json!(3));
    let r = check(&h);
    assert_eq!(r.valid, Validity::True);
    assert_eq!(r.dropped_unobserved_info, 1);
}

/// An info write whose value is read before the write was invoked is still invalid.
#[test]
fn info_write_cannot_act_before_its_invoke() {
    let mut h = History::new();
    read(&mut h, 0);
    ok(&mut h, 0, json!(5));
    write(&mut h, 1, 5);
    h.complete(1, OpKind::Info, Value::Null);
    assert_eq!(check(&h).valid, Validity::False);
}

/// A CAS history: successful CASes chain, a failed CAS is dropped, an info CAS may apply.
#[test]
fn cas_history_is_valid() {
    let mut h = History::new();
    write(&mut h, 0, 0);
    ok(&mut h, 0, json!(0));
    cas(&mut h, 1, json!(0), 1);
    cas(&mut h, 2, json!(0), 2);
    ok(&mut h, 1, json!([0, 1]));
    h.complete(2, OpKind::Fail, json!([0, 2]));
    cas(&mut h, 0, json!(1), 3);
    h.complete(0, OpKind::Info, Value::Null);
    read(&mut h, 1);
    ok(&mut h, 1, json!(3));
    cas(&mut h, 1, json!(3), 4);
    ok(&mut h, 1, json!([3, 4]));
    read(&mut h, 2);
    ok(&mut h, 2, json!(4));
    let r = check(&h);
    assert_eq!(r.valid, Validity::True, "{r:?}");
    assert_eq!(r.dropped_fail, 1);
}

/// Knossos's classic: a read after a completed write returns the older value.
#[test]
fn stale_read_after_completed_write_is_invalid() {
    let mut h = History::new();
    write(&mut h, 0, 1);
    ok(&mut h, 0, json!(1));
    write(&mut h, 0, 2);
    ok(&mut h, 0, json!(2));
    read(&mut h, 1);
    ok(&mut h, 1, json!(1));
    let r = check(&h);
    assert_eq!(r.valid, Validity::False);
    let w = &r.failures[0];
    assert_eq!(w.key, "x");
    assert_eq!(w.prefix, vec![0, 2]);
    assert_eq!(w.state_after_prefix, json!(2));
    assert_eq!(w.stuck.len(), 1);
    assert_eq!((w.stuck[0].invoke, w.stuck[0].completion), (4, Some(5)));
}

/// A read returning a value no one ever wrote is invalid.
#[test]
fn read_of_unwritten_value_is_invalid() {
    let mut h = History::new();
    write(&mut h, 0, 1);
    read(&mut h, 1);
    ok(&mut h, 0, json!(1));
    ok(&mut h, 1, json!(7));
    let r = check(&h);
    assert_eq!(r.valid, Validity::False);
    assert!(r.failures[0].reason.contains("no operation ever wrote"));
    assert_eq!(r.failures[0].stuck[0].completion, Some(3));
    assert_eq!(r.steps, 0, "found without a search");
}

/// A read of null after a completed write is invalid (absent only before any write).
#[test]
fn read_of_absent_after_write_is_invalid() {
    let mut h = History::new();
    write(&mut h, 0, 1);
    ok(&mut h, 0, json!(1));
    read(&mut h, 1);
    ok(&mut h, 1, Value::Null);
    assert_eq!(check(&h).valid, Validity::False);
}

/// Lost write under concurrency: after two overlapping writes complete, reads flip between them.
#[test]
fn lost_write_under_concurrency_is_invalid() {
    let mut h = History::new();
    write(&mut h, 0, 1);
    write(&mut h, 1, 2);
    ok(&mut h, 1, json!(2));
    read(&mut h, 2);
    ok(&mut h, 2, json!(1));
    ok(&mut h, 0, json!(1));
    read(&mut h, 2);
    ok(&mut h, 2, json!(2));
    let r = check(&h);
    assert_eq!(r.valid, Validity::False);
    assert_eq!(
        r.failures[0]
            .stuck
            .iter()
            .map(|o| o.invoke)
            .collect::<Vec<_>>(),
        vec![6]
    );
}

/// Two successful CASes from the same expected value cannot both be linearized.
#[test]
fn double_successful_cas_is_invalid() {
    let mut h = History::new();
    write(&mut h, 0, 0);
    ok(&mut h, 0, json!(0));
    cas(&mut h, 1, json!(0), 1);
    cas(&mut h, 2, json!(0), 2);
    ok(&mut h, 1, json!([0, 1]));
    ok(&mut h, 2, json!([0, 2]));
    assert_eq!(check(&h).valid, Validity::False);
}

/// A successful CAS whose expected value is not current is invalid.
#[test]
fn cas_on_wrong_value_is_invalid() {
    let mut h = History::new();
    write(&mut h, 0, 1);
    ok(&mut h, 0, json!(1));
    cas(&mut h, 0, json!(5), 6);
    ok(&mut h, 0, json!([5, 6]));
    assert_eq!(check(&h).valid, Validity::False);
}

/// Failed writes did not happen: reading their value is invalid.
#[test]
fn failed_write_must_not_be_visible() {
    let mut h = History::new();
    write(&mut h, 0, 1);
    h.complete(0, OpKind::Fail, json!(1));
    read(&mut h, 1);
    ok(&mut h, 1, json!(1));
    assert_eq!(check(&h).valid, Validity::False);
}

/// Keys are independent registers: each is checked on its own.
#[test]
fn keys_are_checked_independently() {
    let mut h = History::new();
    h.invoke(0, OpFn::Write, Some("a"), json!(1));
    h.invoke(1, OpFn::Write, Some("b"), json!(2));
    h.complete(0, OpKind::Ok, json!(1));
    h.complete(1, OpKind::Ok, json!(2));
    h.invoke(0, OpFn::Read, Some("b"), Value::Null);
    h.complete(0, OpKind::Ok, json!(2));
    h.invoke(1, OpFn::Read, Some("a"), Value::Null);
    h.complete(1, OpKind::Ok, json!(2)); // "a" never held 2
    let r = check(&h);
    assert_eq!((r.valid, r.keys), (Validity::False, 2));
    assert_eq!(r.failures.len(), 1);
    assert_eq!(r.failures[0].key, "a");
    let c = r.to_check_result();
    assert_eq!(c.anomalies[0].kind, "nonlinearizable");
    assert_eq!(c.anomalies[0].ops, vec![6, 7]);
    assert_eq!(serde_json::to_value(&c).unwrap()["valid"], json!(false));
}

/// A tiny step budget turns a valid history into Unknown, reported as such.
#[test]
fn step_budget_gives_unknown() {
    let h = simulate_register(
        &SimConfig {
            keys: 1,
            ..SimConfig::default()
        },
        3,
    );
    let r = check_linearizable(
        &h,
        &LinearizableConfig {
            max_steps_per_key: 10,
        },
    )
    .unwrap();
    assert_eq!(r.valid, Validity::Unknown);
    let c = r.to_check_result();
    assert_eq!(serde_json::to_value(&c).unwrap()["valid"], json!("unknown"));
    assert_eq!(c.anomalies[0].kind, "unknown");
}

/// A CAS whose value is not an [expected, new] pair is a malformed-op error naming the op.
#[test]
fn malformed_cas_is_an_error() {
    let mut h = History::new();
    h.invoke(0, OpFn::Cas, K, json!(3));
    ok(&mut h, 0, json!(3));
    let err = check_linearizable(&h, &LinearizableConfig::default()).unwrap_err();
    assert!(
        matches!(err, CheckError::Malformed { index: 0, .. }),
        "{err}"
    );
}
