//! Apply's handling of [`Command::Closed`]: the closed timestamp counts only in its term,
//! whatever the inner command did, and the wrapper is refused where `Fenced` is.

use crate::apply::ApplyBatch;
use crate::dedup::DedupTable;
use crate::locks::{LockTable, TxnLocks};
use crate::types::{Command, Expect, RequestId};
use bytes::Bytes;
use meridian_storage::keys::{Keyspace, Span};
use meridian_storage::MemoryEngine;
use meridian_types::ShardId;

static WHOLE: Span = Span {
    space: Keyspace::User,
    start: Vec::new(),
    end: Vec::new(),
};

fn b(s: &str) -> Bytes {
    Bytes::copy_from_slice(s.as_bytes())
}

fn closed(term: u64, closed_ts: u64, cmd: Command) -> Command {
    Command::Closed {
        term,
        closed_ts,
        cmd: Box::new(cmd),
    }
}

fn put(ts: u64, key: &str) -> Command {
    Command::Write {
        ts,
        puts: vec![(b(key), b("v"))],
        deletes: vec![],
        request: None,
    }
}

/// Applies `cmds` (each from an entry of term 1) as one batch: the results and the batch's
/// closed timestamp.
fn apply(locks: &mut LockTable, cmds: Vec<Command>) -> (Vec<crate::CommandResult>, u64) {
    let engine = MemoryEngine::new();
    let (mut floor, mut dedup) = (0u64, DedupTable::new());
    let mut work = ApplyBatch::new(ShardId(3), &WHOLE, &engine, &mut floor, &mut dedup, locks);
    let results = cmds
        .into_iter()
        .map(|c| work.apply(c, 1).expect("apply"))
        .collect();
    (results, work.closed)
}

/// A closed timestamp counts in its own term, also when its command wrote nothing (a CAS
/// mismatch, a lock in the way); a fenced-out entry's does not, and it writes nothing.
#[test]
fn a_closed_timestamp_counts_only_in_its_term_whatever_its_command_did() {
    let mut locks = LockTable::new();
    let (r, c) = apply(&mut locks, vec![closed(1, 40, put(50, "a"))]);
    assert_eq!((r[0].commit_ts, c), (50, 40));

    let mismatch = Command::Cas {
        ts: 60,
        key: b("a"),
        expect: Expect::Version(1),
        value: None,
        request: None,
    };
    let (r, c) = apply(&mut locks, vec![closed(1, 55, mismatch)]);
    assert!(r[0].mismatch.is_some(), "{r:?}");
    assert_eq!(c, 55, "a mismatch still closes");

    locks.insert(
        RequestId {
            client_id: 1,
            seq: 1,
        },
        TxnLocks {
            anchor: b("a"),
            prepare_ts: 30,
            txn_ts: 20,
            rank: meridian_types::TxnRank::default(),
            writes: vec![(b("a"), None)],
            reads: vec![],
            ranges: vec![],
            participants: vec![],
        },
    );
    let (r, c) = apply(&mut locks, vec![closed(1, 65, put(70, "a"))]);
    assert!(r[0].locked.is_some(), "{r:?}");
    assert_eq!(c, 65, "a locked write still closes");

    let (r, c) = apply(
        &mut locks,
        vec![closed(2, 99, put(80, "b")), closed(1, 70, put(81, "c"))],
    );
    assert!(r[0].fenced && r[0].commit_ts == 0, "{r:?}");
    assert_eq!(c, 70, "the fenced-out entry's 99 does not count");
}

/// `Closed` nests neither itself nor `Fenced`, never wraps a GC page, and its closed
/// timestamp is a command timestamp (bounded).
#[test]
fn closed_is_refused_where_fenced_is() {
    let gc = Command::Gc {
        threshold: 1,
        from: None,
    };
    let fenced = Command::Fenced {
        term: 1,
        cmd: Box::new(put(5, "a")),
    };
    for bad in [
        closed(1, 1, closed(1, 1, put(5, "a"))),
        closed(1, 1, fenced.clone()),
        Command::Fenced {
            term: 1,
            cmd: Box::new(closed(1, 1, put(5, "a"))),
        },
        closed(1, 1, gc),
        closed(1, crate::types::MAX_COMMAND_TS + 1, put(5, "a")),
    ] {
        assert!(bad.validate().is_err(), "{bad}");
        let (r, c) = apply(&mut LockTable::new(), vec![bad]);
        assert!(r[0].rejected.is_some(), "{r:?}");
        assert_eq!(c, 0);
    }
    assert!(closed(1, 1, put(5, "a")).validate().is_ok());
    assert_eq!(
        closed(3, 1, put(5, "a")).with_ts(9),
        closed(3, 1, put(9, "a"))
    );
}
