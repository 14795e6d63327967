//! Tests of `apply`: commands kept inside their shard's span, term fencing, conditions, CAS,
//! transaction commits and the dedup table.

use super::*;
use crate::types::{RangeCheck, ReadCheck, RequestId};
use meridian_storage::MemoryEngine;

const SHARD: ShardId = ShardId(3);
static WHOLE: Span = Span {
    space: keys::Keyspace::User,
    start: Vec::new(),
    end: Vec::new(),
};

/// Data shards share one keyspace, so apply is what keeps a command inside its shard:
/// a write, a CAS or a commit naming a key of another span is rejected and writes nothing
/// (here, before any of its keys, even those inside).
#[test]
fn a_command_outside_the_shards_span_is_rejected_and_writes_nothing() {
    let engine = MemoryEngine::new();
    let span = Span {
        space: keys::Keyspace::User,
        start: b"m".to_vec(),
        end: b"n".to_vec(),
    };
    let (mut floor, mut dedup, mut locks) = (0u64, DedupTable::new(), LockTable::new());
    let mut work = ApplyBatch::new(SHARD, &span, &engine, &mut floor, &mut dedup, &mut locks);
    let both = Command::Write {
        ts: 10,
        puts: vec![(b("m1"), b("inside")), (b("z"), b("outside"))],
        deletes: vec![],
        request: None,
    };
    let results = [
        work.apply(both, 1).unwrap(),
        work.apply(cas(11, "a", Expect::Absent, Some("x")), 1)
            .unwrap(),
        work.apply(put(12, "m2", "ok"), 1).unwrap(),
    ];
    engine.write(work.batch, false).unwrap();
    assert!(
        results[0]
            .rejected
            .as_deref()
            .is_some_and(|r| r.contains("span")),
        "{results:?}"
    );
    assert!(results[1].rejected.is_some(), "{results:?}");
    assert!(results[2].rejected.is_none(), "{results:?}");
    assert_eq!(latest(&engine, "m1"), None);
    assert_eq!(latest(&engine, "z"), None);
    assert_eq!(latest(&engine, "a"), None);
    assert_eq!(latest(&engine, "m2"), Some((12, b"ok".to_vec())));
}

fn b(s: &str) -> Bytes {
    Bytes::copy_from_slice(s.as_bytes())
}

fn put(ts: u64, key: &str, value: &str) -> Command {
    Command::Write {
        ts,
        puts: vec![(b(key), b(value))],
        deletes: vec![],
        request: None,
    }
}

fn cas(ts: u64, key: &str, expect: Expect, value: Option<&str>) -> Command {
    Command::Cas {
        ts,
        key: b(key),
        expect,
        value: value.map(b),
        request: None,
    }
}

/// Applies each group of commands as one batch (one apply call), committing between
/// groups, and returns every command's result.
fn run(engine: &MemoryEngine, groups: Vec<Vec<Command>>) -> Vec<CommandResult> {
    let (mut floor, mut dedup, mut locks) = (0u64, DedupTable::new(), LockTable::new());
    let mut results = Vec::new();
    for group in groups {
        let mut work = ApplyBatch::new(SHARD, &WHOLE, engine, &mut floor, &mut dedup, &mut locks);
        for cmd in group {
            results.push(work.apply(cmd, 1).expect("apply"));
        }
        engine.write(work.batch, false).expect("write");
    }
    results
}

fn latest(engine: &MemoryEngine, key: &str) -> Option<(u64, Vec<u8>)> {
    mvcc::get(engine, SHARD, key.as_bytes(), Timestamp::MAX)
        .unwrap()
        .map(|(ts, v)| (ts.0, v))
}

#[test]
fn a_fenced_command_applies_only_in_the_term_it_was_issued_in() {
    let engine = MemoryEngine::new();
    let fenced = |term, ts, value: &str| Command::Fenced {
        term,
        cmd: Box::new(put(ts, "k", value)),
    };
    // `run` applies every entry as term 1.
    let r = run(
        &engine,
        vec![vec![fenced(2, 10, "stale"), fenced(1, 11, "ok")]],
    );
    assert!(r[0].fenced && r[0].commit_ts == 0, "{:?}", r[0]);
    assert!(!r[1].fenced && r[1].commit_ts == 11, "{:?}", r[1]);
    assert_eq!(latest(&engine, "k"), Some((11, b"ok".to_vec())));
    // Nesting is refused by validation, whatever the terms.
    let nested = Command::Fenced {
        term: 1,
        cmd: Box::new(fenced(1, 12, "inner")),
    };
    let r = run(&engine, vec![vec![nested]]);
    assert!(r[0].rejected.is_some(), "{:?}", r[0]);
    assert_eq!(latest(&engine, "k"), Some((11, b"ok".to_vec())));
}

#[test]
fn each_condition_holds_only_on_its_state() {
    assert!(Expect::Absent.holds(None));
    assert!(!Expect::Absent.holds(Some((1, b"x"))));
    assert!(Expect::Version(5).holds(Some((5, b"x"))));
    assert!(!Expect::Version(5).holds(Some((6, b"x"))));
    assert!(!Expect::Version(5).holds(None));
    assert!(Expect::Value(b("x")).holds(Some((9, b"x"))));
    assert!(!Expect::Value(b("x")).holds(Some((9, b"y"))));
    // An empty value is a value, not absence.
    assert!(!Expect::Value(b("")).holds(None));
    assert!(Expect::Value(b("")).holds(Some((1, b""))));
}

#[test]
fn a_cas_sees_the_writes_committed_before_it() {
    let engine = MemoryEngine::new();
    let r = run(
        &engine,
        vec![
            vec![put(10, "k", "a")],
            vec![
                cas(20, "k", Expect::Absent, Some("x")),
                cas(21, "k", Expect::Value(b("a")), Some("b")),
            ],
        ],
    );
    assert_eq!(r[0].commit_ts, 10);
    assert_eq!(
        r[1].mismatch,
        Some(Some((10, b("a")))),
        "k exists: not absent"
    );
    assert_eq!(r[1].commit_ts, 0);
    assert_eq!((r[2].mismatch.clone(), r[2].commit_ts), (None, 21));
    assert_eq!(latest(&engine, "k"), Some((21, b"b".to_vec())));
}

#[test]
fn a_cas_sees_earlier_writes_of_its_own_batch() {
    // The batch is not in RocksDB until the end: without the pending overlay the second
    // CAS would read "a" from the engine and swap, losing the first swap.
    let engine = MemoryEngine::new();
    let r = run(
        &engine,
        vec![
            vec![put(10, "k", "a")],
            vec![
                cas(20, "k", Expect::Value(b("a")), Some("b")),
                cas(21, "k", Expect::Value(b("a")), Some("c")),
                cas(22, "k", Expect::Version(20), None),
                cas(23, "k", Expect::Absent, Some("d")),
            ],
        ],
    );
    assert!(r[1].mismatch.is_none());
    assert_eq!(r[2].mismatch, Some(Some((20, b("b")))));
    assert!(
        r[3].mismatch.is_none(),
        "version 20 is the newest: the delete swaps"
    );
    assert!(r[4].mismatch.is_none(), "deleted in this batch: absent");
    assert_eq!(latest(&engine, "k"), Some((23, b"d".to_vec())));
}

#[test]
fn a_retried_swap_is_not_applied_twice_but_a_retried_mismatch_is_evaluated_again() {
    let engine = MemoryEngine::new();
    let id = RequestId {
        client_id: 7,
        seq: 1,
    };
    let with_id = |ts, expect, value: &str| Command::Cas {
        ts,
        key: b("k"),
        expect,
        value: Some(b(value)),
        request: Some(id),
    };
    let (mut floor, mut dedup, mut locks) = (0u64, DedupTable::new(), LockTable::new());
    let mut work = ApplyBatch::new(SHARD, &WHOLE, &engine, &mut floor, &mut dedup, &mut locks);
    let first = work.apply(with_id(10, Expect::Absent, "a"), 1).unwrap();
    // Another client's write, then the retry of the first swap: answered from the table.
    work.apply(put(11, "k", "z"), 1).unwrap();
    let retry = work.apply(with_id(12, Expect::Absent, "a"), 1).unwrap();
    assert_eq!((first.commit_ts, first.duplicate), (10, false));
    assert_eq!((retry.commit_ts, retry.duplicate), (10, true));
    assert!(retry.mismatch.is_none());
    engine.write(work.batch, false).unwrap();
    assert_eq!(latest(&engine, "k"), Some((11, b"z".to_vec())));

    // A mismatch is not remembered: the same id is evaluated again later.
    let other = RequestId {
        client_id: 7,
        seq: 2,
    };
    let mut work = ApplyBatch::new(SHARD, &WHOLE, &engine, &mut floor, &mut dedup, &mut locks);
    let cmd = |ts| Command::Cas {
        ts,
        key: b("k"),
        expect: Expect::Value(b("y")),
        value: Some(b("w")),
        request: Some(other),
    };
    let miss = work.apply(cmd(20), 1).unwrap();
    assert_eq!(miss.mismatch, Some(Some((11, b("z")))));
    work.apply(put(21, "k", "y"), 1).unwrap();
    let hit = work.apply(cmd(22), 1).unwrap();
    assert_eq!(
        (hit.commit_ts, hit.duplicate, hit.mismatch),
        (22, false, None)
    );
}

#[test]
fn a_bad_cas_is_rejected_without_writing() {
    let engine = MemoryEngine::new();
    let r = run(
        &engine,
        vec![vec![
            cas(MAX_COMMAND_TS + 1, "k", Expect::Absent, Some("v")),
            cas(1, "", Expect::Absent, Some("v")),
        ]],
    );
    assert!(r.iter().all(|r| r.rejected.is_some()), "{r:?}");
    assert!(latest(&engine, "k").is_none());
}

fn txn(
    ts: u64,
    reads: Vec<(&str, Option<u64>)>,
    ranges: Vec<RangeCheck>,
    writes: Vec<(&str, Option<&str>)>,
) -> Command {
    Command::Txn {
        ts,
        reads: reads
            .into_iter()
            .map(|(k, version)| ReadCheck { key: b(k), version })
            .collect(),
        ranges,
        writes: writes.into_iter().map(|(k, v)| (b(k), v.map(b))).collect(),
        request: None,
    }
}

fn range(start: &str, end: Option<&str>, rows: Vec<(&str, u64)>) -> RangeCheck {
    RangeCheck {
        start: b(start),
        end: end.map(b),
        rows: rows.into_iter().map(|(k, ts)| (b(k), ts)).collect(),
    }
}

#[test]
fn a_txn_commits_only_while_its_reads_hold() {
    let engine = MemoryEngine::new();
    let r = run(
        &engine,
        vec![
            vec![put(10, "a", "1"), put(11, "b", "2")],
            vec![
                // Read a@10 and b@11 (and c absent): all hold, so both writes apply.
                txn(
                    20,
                    vec![("a", Some(10)), ("b", Some(11)), ("c", None)],
                    vec![],
                    vec![("a", Some("0")), ("b", None)],
                ),
                // Read a@10 too, but a is now at 20 (same batch): conflict, nothing written.
                txn(21, vec![("a", Some(10))], vec![], vec![("z", Some("x"))]),
                // b was deleted by the first: reading it as absent holds.
                txn(22, vec![("b", None)], vec![], vec![("c", Some("3"))]),
            ],
        ],
    );
    assert_eq!((r[2].commit_ts, r[2].conflict.clone()), (20, None));
    assert_eq!(r[3].conflict, Some(b("a")));
    assert_eq!(r[3].commit_ts, 0);
    assert_eq!((r[4].commit_ts, r[4].conflict.clone()), (22, None));
    assert_eq!(latest(&engine, "a"), Some((20, b"0".to_vec())));
    assert_eq!(latest(&engine, "b"), None);
    assert_eq!(
        latest(&engine, "z"),
        None,
        "the conflicting txn wrote nothing"
    );
    assert_eq!(latest(&engine, "c"), Some((22, b"3".to_vec())));
}

#[test]
fn a_txn_that_read_an_absent_key_conflicts_with_its_creation() {
    let engine = MemoryEngine::new();
    let r = run(
        &engine,
        vec![
            vec![put(10, "k", "v")],
            vec![txn(
                20,
                vec![("k", None)],
                vec![],
                vec![("other", Some("x"))],
            )],
        ],
    );
    assert_eq!(r[1].conflict, Some(b("k")));
}

#[test]
fn a_scanned_range_conflicts_with_phantoms_removals_and_changes() {
    let engine = MemoryEngine::new();
    run(
        &engine,
        vec![vec![
            put(10, "r/1", "a"),
            put(11, "r/3", "b"),
            put(12, "s", "out"),
        ]],
    );
    let seen = || range("r/", Some("r0"), vec![("r/1", 10), ("r/3", 11)]);
    let scan_then = |cmds: Vec<Command>| {
        let engine = MemoryEngine::new();
        run(
            &engine,
            vec![vec![
                put(10, "r/1", "a"),
                put(11, "r/3", "b"),
                put(12, "s", "out"),
            ]],
        );
        let mut groups = vec![cmds];
        groups.push(vec![txn(30, vec![], vec![seen()], vec![("w", Some("x"))])]);
        run(&engine, groups).last().unwrap().conflict.clone()
    };
    // Unchanged range (a write outside it does not matter): commits.
    assert_eq!(scan_then(vec![put(20, "s", "moved")]), None);
    // A phantom inside the range, before, between or after the rows read.
    for key in ["r/0", "r/2", "r/9"] {
        assert_eq!(scan_then(vec![put(20, key, "new")]), Some(b("r/")), "{key}");
    }
    // A removed row and a changed row.
    assert_eq!(
        scan_then(vec![Command::Write {
            ts: 20,
            puts: vec![],
            deletes: vec![b("r/1")],
            request: None
        }]),
        Some(b("r/"))
    );
    assert_eq!(scan_then(vec![put(20, "r/3", "c")]), Some(b("r/")));
    // Writes earlier in the commit's own batch count too (the pending overlay).
    let r = run(
        &engine,
        vec![vec![
            put(20, "r/2", "new"),
            txn(21, vec![], vec![seen()], vec![("w", Some("x"))]),
        ]],
    );
    assert_eq!(r[1].conflict, Some(b("r/")));
    let r = run(
        &engine,
        vec![vec![
            Command::Write {
                ts: 30,
                puts: vec![],
                deletes: vec![b("r/2")],
                request: None,
            },
            txn(31, vec![], vec![seen()], vec![("w", Some("x"))]),
        ]],
    );
    assert_eq!(
        r[1].conflict, None,
        "the phantom was deleted again in the batch"
    );
}

#[test]
fn a_retried_txn_commit_is_answered_from_the_dedup_table() {
    let engine = MemoryEngine::new();
    let id = RequestId {
        client_id: 5,
        seq: 9,
    };
    let with_id = |ts| Command::Txn {
        ts,
        reads: vec![ReadCheck {
            key: b("n"),
            version: None,
        }],
        ranges: vec![],
        writes: vec![(b("n"), Some(b("1")))],
        request: Some(id),
    };
    let r = run(&engine, vec![vec![with_id(10)], vec![with_id(20)]]);
    assert_eq!((r[0].commit_ts, r[0].duplicate), (10, false));
    // Without the table the retry would conflict (n now exists) and report a failure for
    // a commit that happened.
    assert_eq!(
        (r[1].commit_ts, r[1].duplicate, r[1].conflict.clone()),
        (10, true, None)
    );
}

#[test]
fn a_txn_without_writes_or_over_its_limits_is_rejected() {
    let engine = MemoryEngine::new();
    let r = run(
        &engine,
        vec![vec![
            txn(10, vec![("a", None)], vec![], vec![]),
            txn(
                10,
                vec![],
                vec![range("b", Some("a"), vec![])],
                vec![("w", Some("x"))],
            ),
            txn(
                10,
                vec![],
                vec![range("a", Some("b"), vec![("c", 1)])],
                vec![("w", Some("x"))],
            ),
        ]],
    );
    assert!(r.iter().all(|r| r.rejected.is_some()), "{r:?}");
    assert!(latest(&engine, "w").is_none());
}
