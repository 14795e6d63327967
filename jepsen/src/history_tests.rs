//! Tests of the history model: pairing, validation errors, JSON Lines I/O.

use super::*;
use serde_json::json;

fn small() -> History {
    let mut h = History::new();
    h.invoke(0, OpFn::Write, Some("k"), json!(1));
    h.invoke(1, OpFn::Read, Some("k"), Value::Null);
    h.complete(0, OpKind::Ok, json!(1));
    h.complete(1, OpKind::Ok, json!(1));
    h.invoke(1, OpFn::Cas, Some("k"), json!([1, 2]));
    h
}

/// Pairs follow invoke order, and a dangling invoke is reported as Info with no completion.
#[test]
fn pairs_match_invokes_and_dangling_is_info() {
    let pairs = small().pairs().unwrap();
    assert_eq!(
        pairs,
        vec![
            OpPair {
                invoke: 0,
                completion: Some(2),
                outcome: OpKind::Ok
            },
            OpPair {
                invoke: 1,
                completion: Some(3),
                outcome: OpKind::Ok
            },
            OpPair {
                invoke: 4,
                completion: None,
                outcome: OpKind::Info
            },
        ]
    );
}

/// A completion with no outstanding invoke is rejected, naming the op and process.
#[test]
fn completion_without_invoke_is_an_error() {
    let mut h = History::new();
    h.complete(7, OpKind::Ok, json!(1));
    let err = h.validate().unwrap_err();
    assert!(matches!(
        err,
        HistoryError::CompletionWithoutInvoke {
            index: 0,
            process: 7
        }
    ));
}

/// Two invokes in a row by one process are rejected, naming both ops.
#[test]
fn double_invoke_is_an_error() {
    let mut h = small();
    h.invoke(1, OpFn::Read, Some("k"), Value::Null);
    let err = h.validate().unwrap_err();
    assert!(matches!(
        err,
        HistoryError::DoubleInvoke {
            index: 5,
            process: 1,
            outstanding: 4
        }
    ));
    assert!(err.to_string().contains("op 4"), "{err}");
}

/// A completion whose f differs from its invoke's is rejected.
#[test]
fn mismatched_completion_is_an_error() {
    let mut h = History::new();
    h.invoke(0, OpFn::Write, Some("k"), json!(1));
    let mut op = Op::new(0, OpKind::Ok, OpFn::Read, Some("k"), json!(1));
    op.time_ns = 5;
    h.push(op);
    assert!(matches!(
        h.validate().unwrap_err(),
        HistoryError::MismatchedCompletion {
            index: 1,
            invoke: 0,
            ..
        }
    ));
}

/// An op whose index disagrees with its position is rejected.
#[test]
fn index_mismatch_is_an_error() {
    let mut h = small();
    h.ops[2].index = 9;
    assert!(matches!(
        h.validate().unwrap_err(),
        HistoryError::IndexMismatch {
            position: 2,
            index: 9
        }
    ));
}

/// JSON Lines round-trips, and optional fields are omitted when absent.
#[test]
fn jsonl_round_trip() {
    let mut h = small();
    h.ops[2].node = Some("n1".into());
    h.ops[3].error = Some("timeout".into());
    let text = h.to_jsonl_string();
    assert_eq!(text.lines().count(), h.len());
    assert!(!text.lines().next().unwrap().contains("node"));
    assert!(text.contains(r#""kind":"invoke""#) && text.contains(r#""f":"cas""#));
    assert_eq!(History::from_jsonl_str(&text).unwrap(), h);
}

/// A malformed line is reported with its 1-based line number; blank lines are skipped.
#[test]
fn jsonl_malformed_line_names_the_line() {
    let text = small().to_jsonl_string();
    let mut lines: Vec<&str> = text.lines().collect();
    lines.insert(1, "");
    lines.insert(3, "{\"index\": 2, \"kind\": \"bogus\"}");
    let err = History::from_jsonl_str(&lines.join("\n")).unwrap_err();
    assert!(matches!(err, HistoryError::Parse { line: 4, .. }), "{err}");
    assert!(err.to_string().starts_with("history line 4:"), "{err}");
}

/// Files are written and read back through the same format.
#[test]
fn jsonl_file_round_trip() {
    let path = std::env::temp_dir().join(format!("meridian-jepsen-{}.jsonl", std::process::id()));
    let h = small();
    h.write_jsonl(&path).unwrap();
    let back = History::read_jsonl(&path).unwrap();
    let _ = std::fs::remove_file(&path);
    assert_eq!(back, h);
    let missing = History::read_jsonl(path.with_extension("missing")).unwrap_err();
    assert!(matches!(missing, HistoryError::Io { .. }));
}
