//! Tests of the list-append checker (`append`): hand-built histories, valid and each anomaly.

use super::*;
use crate::checker::Validity;
use serde_json::json;

/// A history of sequential transactions `(micro-ops as invoked, as completed, outcome)`.
fn history(txns: &[(Value, Value, OpKind)]) -> History {
    let mut h = History::new();
    for (p, (inv, done, kind)) in txns.iter().enumerate() {
        h.invoke(p as u64, OpFn::Txn, Some("append"), inv.clone());
        h.complete(p as u64, *kind, done.clone());
    }
    h
}

fn ok(value: Value) -> (Value, Value, OpKind) {
    (value.clone(), value, OpKind::Ok)
}

fn verdict(txns: &[(Value, Value, OpKind)]) -> CheckResult {
    check_append(&history(txns)).unwrap().to_check_result()
}

#[test]
fn a_serial_history_is_valid() {
    let r = verdict(&[
        ok(json!([["append", "x", 1], ["append", "y", 1]])),
        ok(json!([["r", "x", [1]], ["append", "x", 2]])),
        ok(json!([["r", "x", [1, 2]], ["r", "y", [1]]])),
    ]);
    assert_eq!(r.valid, Validity::True, "{:?}", r.anomalies);
}

#[test]
fn write_skew_is_a_g2_cycle() {
    // T1 reads x and y empty, appends x; T2 reads x and y empty, appends y: each missed
    // the other's append (rw both ways). Serializable would let one see the other.
    let r = verdict(&[
        ok(json!([["r", "x", []], ["r", "y", []], ["append", "x", 1]])),
        ok(json!([["r", "x", []], ["r", "y", []], ["append", "y", 1]])),
        ok(json!([["r", "x", [1]], ["r", "y", [1]]])),
    ]);
    assert_eq!(r.valid, Validity::False);
    assert!(
        r.anomalies[0].message.starts_with("G2 cycle"),
        "{:?}",
        r.anomalies
    );
}

#[test]
fn a_fractured_read_is_a_cycle() {
    // T1 appends x and y together; T2 sees T1's y but not its x.
    let r = verdict(&[
        ok(json!([["append", "x", 1], ["append", "y", 1]])),
        ok(json!([["r", "x", []], ["r", "y", [1]]])),
        ok(json!([["r", "x", [1]]])),
    ]);
    assert_eq!(r.valid, Validity::False);
    assert_eq!(r.anomalies[0].kind, "cycle");
}

#[test]
fn a_stale_read_after_a_completed_append_breaks_real_time_order() {
    // Serializable (the reader can be ordered first) but not strictly: it began after the
    // append had completed and still missed it.
    let r = verdict(&[
        ok(json!([["append", "x", 1]])),
        ok(json!([["r", "x", []]])),
        ok(json!([["r", "x", [1]]])),
    ]);
    assert_eq!(r.valid, Validity::False);
    assert!(
        r.anomalies[0].message.starts_with("real-time"),
        "{:?}",
        r.anomalies
    );
    // Concurrent (the read invoked before the append completed): fine.
    let mut h = History::new();
    h.invoke(0, OpFn::Txn, Some("append"), json!([["append", "x", 1]]));
    h.invoke(1, OpFn::Txn, Some("append"), json!([["r", "x", null]]));
    h.complete(0, OpKind::Ok, json!([["append", "x", 1]]));
    h.complete(1, OpKind::Ok, json!([["r", "x", []]]));
    h.invoke(2, OpFn::Txn, Some("append"), json!([["r", "x", null]]));
    h.complete(2, OpKind::Ok, json!([["r", "x", [1]]]));
    let r = check_append(&h).unwrap().to_check_result();
    assert_eq!(r.valid, Validity::True, "{:?}", r.anomalies);
}

#[test]
fn a_causal_reverse_is_strict_real_time_only() {
    // R begins; W1 appends x and completes; then W2 appends y and completes; R, reading
    // both, saw y's append but not x's. Not strictly serializable (W1 → W2 in real time,
    // W2 → R, R → W1), but no key was read stale: allowed per key.
    let mut h = History::new();
    h.invoke(
        0,
        OpFn::Txn,
        Some("append"),
        json!([["r", "x", null], ["r", "y", null]]),
    );
    h.invoke(1, OpFn::Txn, Some("append"), json!([["append", "x", 1]]));
    h.complete(1, OpKind::Ok, json!([["append", "x", 1]]));
    h.invoke(2, OpFn::Txn, Some("append"), json!([["append", "y", 1]]));
    h.complete(2, OpKind::Ok, json!([["append", "y", 1]]));
    h.complete(0, OpKind::Ok, json!([["r", "x", []], ["r", "y", [1]]]));
    h.invoke(
        3,
        OpFn::Txn,
        Some("append"),
        json!([["r", "x", null], ["r", "y", null]]),
    );
    h.complete(3, OpKind::Ok, json!([["r", "x", [1]], ["r", "y", [1]]]));
    let strict = check_append(&h).unwrap().to_check_result();
    assert_eq!(strict.valid, Validity::False);
    assert!(strict.anomalies[0].message.starts_with("real-time"));
    let per_key = check_append_with(&h, RealTime::PerKey)
        .unwrap()
        .to_check_result();
    assert_eq!(per_key.valid, Validity::True, "{:?}", per_key.anomalies);
}

#[test]
fn a_stale_read_is_caught_per_key_too() {
    let h = history(&[
        ok(json!([["append", "x", 1]])),
        ok(json!([["r", "x", []]])),
        ok(json!([["r", "x", [1]]])),
    ]);
    let r = check_append_with(&h, RealTime::PerKey)
        .unwrap()
        .to_check_result();
    assert_eq!(r.valid, Validity::False);
    assert!(
        r.anomalies[0].message.starts_with("real-time"),
        "{:?}",
        r.anomalies
    );
}

#[test]
fn bad_reads_are_named() {
    for (txns, kind) in [
        (
            vec![
                ok(json!([["append", "x", 1]])),
                ok(json!([["append", "x", 2]])),
                ok(json!([["r", "x", [1, 2]]])),
                ok(json!([["r", "x", [2]]])),
            ],
            "incompatible-order",
        ),
        (vec![ok(json!([["r", "x", [7]]]))], "garbage-read"),
        (
            vec![
                (json!([["append", "x", 1]]), Value::Null, OpKind::Fail),
                ok(json!([["r", "x", [1]]])),
            ],
            "aborted-read",
        ),
        (
            vec![
                ok(json!([["append", "x", 1]])),
                ok(json!([["r", "x", [1, 1]]])),
            ],
            "duplicate-elements",
        ),
    ] {
        let r = verdict(&txns);
        assert_eq!(r.valid, Validity::False, "{kind}");
        assert_eq!(r.anomalies[0].kind, kind);
    }
}

#[test]
fn an_indeterminate_append_that_was_read_counts_as_committed() {
    let r = verdict(&[
        (json!([["append", "x", 1]]), Value::Null, OpKind::Info),
        ok(json!([["r", "x", [1]], ["append", "x", 2]])),
        ok(json!([["r", "x", [1, 2]]])),
    ]);
    assert_eq!(r.valid, Validity::True, "{:?}", r.anomalies);
}

#[test]
fn values_round_trip_and_nothing_checked_is_unknown() {
    let ops = vec![
        Micro::Append("k".into(), 3),
        Micro::Read("k".into(), Some(vec![3])),
    ];
    assert_eq!(parse_txn(&txn_value(&ops)).unwrap(), ops);
    assert!(parse_txn(&json!([["put", "k", 1]])).is_none());
    assert_eq!(verdict(&[]).valid, Validity::Unknown);
}
