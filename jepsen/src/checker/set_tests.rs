//! Tests of the set checker: hand-built histories for each outcome and simulated ones.

use serde_json::{json, Value};

use super::*;
use crate::history::{History, OpFn, OpKind};
use crate::sim::{simulate_set, SimConfig};

const S: Option<&str> = Some("s");

fn add(h: &mut History, p: u64, e: i64, outcome: OpKind) {
    h.invoke(p, OpFn::Add, S, json!(e));
    h.complete(p, outcome, json!(e));
}

fn read_all(h: &mut History, p: u64, elems: Value) {
    h.invoke(p, OpFn::ReadAll, S, Value::Null);
    h.complete(p, OpKind::Ok, elems);
}

/// ok 1, ok 2, fail 3, info 4 (applied), info 5 (not applied): the final read [1, 2, 4].
fn base() -> History {
    let mut h = History::new();
    add(&mut h, 0, 1, OpKind::Ok);
    add(&mut h, 1, 2, OpKind::Ok);
    add(&mut h, 0, 3, OpKind::Fail);
    add(&mut h, 2, 4, OpKind::Info);
    add(&mut h, 3, 5, OpKind::Info);
    h
}

/// A history where every acknowledged add is read, with info adds either way, is valid.
#[test]
fn complete_history_is_valid() {
    let mut h = base();
    read_all(&mut h, 9, json!([1, 2, 4]));
    let r = check_set(&h).unwrap();
    assert!(r.valid, "{r:?}");
    assert_eq!(
        (r.attempt_count, r.ok_count, r.fail_count, r.info_count),
        (5, 2, 1, 2)
    );
    assert_eq!(
        (r.recovered_count, r.never_read_count, r.final_reads),
        (1, 1, 1)
    );
    assert_eq!(r.to_check_result().valid, Validity::True);
}

/// An acknowledged add missing from the final read is lost: invalid, with the proving ops.
#[test]
fn lost_ack_is_invalid() {
    let mut h = base();
    read_all(&mut h, 9, json!([1, 4]));
    let r = check_set(&h).unwrap();
    assert!(!r.valid);
    assert_eq!((r.lost_count, r.lost.clone()), (1, vec![json!(2)]));
    let c = r.to_check_result();
    assert_eq!(c.valid, Validity::False);
    assert_eq!(c.anomalies[0].kind, "lost");
    assert_eq!(c.anomalies[0].ops, vec![2, 3, 10, 11]);
    assert_eq!(
        serde_json::to_value(&c).unwrap()["stats"]["lost_count"],
        json!(1)
    );
}

/// An element that was never attempted in the final read is unexpected: invalid.
#[test]
fn unexpected_element_is_invalid() {
    let mut h = base();
    read_all(&mut h, 9, json!([1, 2, 99]));
    let r = check_set(&h).unwrap();
    assert!(!r.valid);
    assert_eq!(
        (r.unexpected_count, r.unexpected.clone()),
        (1, vec![json!(99)])
    );
    assert_eq!(r.anomalies[0].kind, "unexpected");
}

/// The element of a failed add must not be read.
#[test]
fn failed_add_present_is_invalid() {
    let mut h = base();
    read_all(&mut h, 9, json!([1, 2, 3]));
    let r = check_set(&h).unwrap();
    assert!(!r.valid);
    assert_eq!(r.failed_present_count, 1);
}

/// A read listing an element twice is invalid.
#[test]
fn duplicated_element_is_invalid() {
    let mut h = base();
    read_all(&mut h, 9, json!([1, 2, 2]));
    let r = check_set(&h).unwrap();
    assert!(!r.valid);
    assert_eq!(r.duplicated_count, 1);
}

/// Without a successful read after all adds completed, the result is invalid with a reason.
#[test]
fn no_final_read_is_invalid_with_reason() {
    let mut h = base();
    h.invoke(9, OpFn::ReadAll, S, Value::Null);
    h.complete(9, OpKind::Info, Value::Null);
    let r = check_set(&h).unwrap();
    assert!(!r.valid);
    assert!(
        r.reason
            .as_deref()
            .unwrap()
            .contains("no successful read_all"),
        "{r:?}"
    );
    assert_eq!(r.anomalies[0].kind, "no-final-read");
}

/// A read concurrent with an add is not final; missing acknowledged elements there are stale.
#[test]
fn intermediate_stale_read_is_counted_not_failed() {
    let mut h = History::new();
    add(&mut h, 0, 1, OpKind::Ok);
    add(&mut h, 0, 2, OpKind::Ok);
    h.invoke(1, OpFn::Add, S, json!(3));
    read_all(&mut h, 2, json!([1])); // misses 2, acknowledged before this read
    h.complete(1, OpKind::Ok, json!(3));
    read_all(&mut h, 2, json!([1, 2, 3]));
    let r = check_set(&h).unwrap();
    assert!(r.valid, "{r:?}");
    assert_eq!((r.intermediate_reads, r.final_reads), (1, 1));
    assert_eq!((r.stale_count, r.stale_reads), (1, 1));
}

/// Adding the same element twice is a malformed history, not a verdict.
#[test]
fn duplicate_add_is_malformed() {
    let mut h = base();
    add(&mut h, 0, 1, OpKind::Ok);
    assert!(matches!(
        check_set(&h).unwrap_err(),
        CheckError::Malformed { index: 10, .. }
    ));
}

/// Each key is its own set: a loss in one key is reported for that key.
#[test]
fn keys_are_separate_sets() {
    let mut h = History::new();
    h.invoke(0, OpFn::Add, Some("a"), json!(1));
    h.complete(0, OpKind::Ok, json!(1));
    h.invoke(0, OpFn::Add, Some("b"), json!(1));
    h.complete(0, OpKind::Ok, json!(1));
    h.invoke(1, OpFn::ReadAll, Some("a"), Value::Null);
    h.complete(1, OpKind::Ok, json!([1]));
    h.invoke(1, OpFn::ReadAll, Some("b"), Value::Null);
    h.complete(1, OpKind::Ok, json!([]));
    let r = check_set(&h).unwrap();
    assert!(!r.valid);
    assert_eq!(r.anomalies.len(), 1);
    assert_eq!(r.anomalies[0].key.as_deref(), Some("b"));
}

/// Simulated set histories (with faults and intermediate reads) are valid.
#[test]
fn simulated_set_histories_are_valid() {
    let cfg = SimConfig {
        info_prob: 0.1,
        fail_prob: 0.1,
        read_prob: 0.2,
        ..SimConfig::default()
    };
    for seed in 0..50 {
        let r = check_set(&simulate_set(&cfg, seed)).unwrap();
        assert!(r.valid, "seed {seed}: {r:?}");
        assert_eq!(
            r.stale_count, 0,
            "a linearizable simulation has no stale reads"
        );
    }
}
