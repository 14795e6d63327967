//! A coalesced entry ([`Command::Batch`]) applies exactly as its members would, each in an
//! entry of its own at that place in the log: the same results (commit timestamps, CAS
//! mismatches, fences, duplicates, rejections) and the same data. A property test over random
//! member sequences (writes, deletes, CASes, transaction commits, 2PC prepares and
//! resolutions, retries, fenced and invalid members) cut into random batches, comparing every
//! result, every key's newest version, the closed timestamp and the prepared locks; and a
//! control that the comparison sees member order.

use bytes::Bytes;
use meridian_raft::locks::Decision;
use meridian_raft::state_machine::ShardStateMachine;
use meridian_raft::types::{Entry, MAX_PROPOSAL_BATCH};
use meridian_raft::{Command, CommandResult, Expect, ReadCheck, RequestId, TypeConfig};
use meridian_storage::{mvcc, Engine, MemoryEngine};
use meridian_types::{ShardId, Timestamp};
use openraft::EntryPayload;
use proptest::prelude::*;
use std::sync::Arc;

const SHARD: ShardId = ShardId(5);
const KEYS: [&str; 3] = ["a", "b", "c"];
/// The term every entry is appended in; members fenced to another term are refused.
const TERM: u64 = 3;

/// One member as the leader proposes it: fenced (`Closed`) to `term` around a data command.
#[derive(Clone, Debug)]
enum Op {
    Put {
        key: usize,
        ts: u64,
        seq: Option<u64>,
    },
    Delete {
        key: usize,
        ts: u64,
    },
    Cas {
        key: usize,
        ts: u64,
        expect: Option<u64>,
    },
    /// A single-shard transaction commit: it read `read` at `version` (`None`: absent) and
    /// writes `write`; applied only if the read still holds.
    Txn {
        read: usize,
        version: Option<u64>,
        write: usize,
        ts: u64,
        seq: Option<u64>,
    },
    /// A 2PC prepare of transaction `txn` locking `key` (its anchor if `anchor`).
    Prepare {
        key: usize,
        txn: u64,
        anchor: bool,
        ts: u64,
    },
    /// A 2PC resolution of transaction `txn`: commit at `commit`, or abort.
    Resolve {
        txn: u64,
        commit: Option<u64>,
        anchor: bool,
        ts: u64,
    },
    /// An empty write: fails validation, so apply rejects this member alone.
    Invalid {
        ts: u64,
    },
}

fn member(op: &Op, term: u64, closed_ts: u64) -> Command {
    let key = |i: &usize| Bytes::from(KEYS[*i]);
    let cmd = match op {
        Op::Put { key: k, ts, seq } => Command::Write {
            ts: *ts,
            puts: vec![(key(k), Bytes::from(format!("v{ts}")))],
            deletes: vec![],
            request: seq.map(|seq| RequestId { client_id: 9, seq }),
        },
        Op::Delete { key: k, ts } => Command::Write {
            ts: *ts,
            puts: vec![],
            deletes: vec![key(k)],
            request: None,
        },
        Op::Cas { key: k, ts, expect } => Command::Cas {
            ts: *ts,
            key: key(k),
            expect: match expect {
                None => Expect::Absent,
                Some(v) => Expect::Version(*v),
            },
            value: Some(Bytes::from(format!("cas{ts}"))),
            request: None,
        },
        Op::Txn {
            read,
            version,
            write,
            ts,
            seq,
        } => Command::Txn {
            ts: *ts,
            reads: vec![ReadCheck {
                key: key(read),
                version: *version,
            }],
            ranges: vec![],
            writes: vec![(key(write), Some(Bytes::from(format!("txn{ts}"))))],
            request: seq.map(|seq| RequestId { client_id: 9, seq }),
        },
        Op::Prepare {
            key: k,
            txn,
            anchor,
            ts,
        } => Command::Prepare {
            ts: *ts,
            txn: RequestId {
                client_id: 4,
                seq: *txn,
            },
            txn_ts: 1,
            rank: meridian_types::TxnRank::default(),
            anchor: key(k),
            is_anchor: *anchor,
            reads: vec![],
            ranges: vec![],
            writes: vec![(key(k), Some(Bytes::from(format!("p{ts}"))))],
            participants: vec![Bytes::from("elsewhere")],
        },
        Op::Resolve {
            txn,
            commit,
            anchor,
            ts,
        } => Command::Resolve {
            ts: *ts,
            txn: RequestId {
                client_id: 4,
                seq: *txn,
            },
            txn_ts: 1,
            anchor: *anchor,
            decision: match commit {
                Some(c) => Decision::Commit(*c),
                None => Decision::Abort,
            },
        },
        Op::Invalid { ts } => Command::Write {
            ts: *ts,
            puts: vec![],
            deletes: vec![],
            request: None,
        },
    };
    Command::Closed {
        term,
        closed_ts,
        cmd: Box::new(cmd),
    }
}

fn op() -> impl Strategy<Value = Op> {
    let ts = 1u64..40;
    prop_oneof![
        4 => (0..KEYS.len(), ts.clone(), proptest::option::of(0u64..4))
            .prop_map(|(key, ts, seq)| Op::Put { key, ts, seq }),
        1 => (0..KEYS.len(), ts.clone()).prop_map(|(key, ts)| Op::Delete { key, ts }),
        3 => (0..KEYS.len(), ts.clone(), proptest::option::of(1u64..45))
            .prop_map(|(key, ts, expect)| Op::Cas { key, ts, expect }),
        2 => (0..KEYS.len(), proptest::option::of(1u64..45), 0..KEYS.len(), ts.clone(),
              proptest::option::of(0u64..4))
            .prop_map(|(read, version, write, ts, seq)| Op::Txn { read, version, write, ts, seq }),
        2 => (0..KEYS.len(), 0u64..3, proptest::bool::ANY, ts.clone())
            .prop_map(|(key, txn, anchor, ts)| Op::Prepare { key, txn, anchor, ts }),
        2 => (0u64..3, proptest::option::of(1u64..45), proptest::bool::ANY, ts.clone())
            .prop_map(|(txn, commit, anchor, ts)| Op::Resolve { txn, commit, anchor, ts }),
        1 => ts.prop_map(|ts| Op::Invalid { ts }),
    ]
}

/// Members with their fence term (mostly `TERM`; sometimes an older one) and closed timestamp.
fn members() -> impl Strategy<Value = Vec<(Op, bool, u64)>> {
    proptest::collection::vec((op(), proptest::bool::weighted(0.85), 0u64..30), 1..40)
}

fn entry_at(index: u64, cmd: Command) -> Entry {
    Entry {
        log_id: openraft::testing::log_id::<TypeConfig>(TERM, 1, index),
        payload: EntryPayload::Normal(cmd),
    }
}

fn open(engine: &Arc<dyn Engine>, dir: &std::path::Path) -> ShardStateMachine {
    crate::common::open_shard(SHARD, engine, dir)
}

/// What every key reads as at the end, and the shard's closed timestamp.
/// Every key's newest `(version, value)`, the shard's closed timestamp, and its prepared
/// transactions `(seq, prepare_ts)`.
type State = (Vec<Option<(u64, Vec<u8>)>>, u64, Vec<(u64, u64)>);

fn state(engine: &Arc<dyn Engine>, sm: &ShardStateMachine) -> State {
    let keys = KEYS
        .iter()
        .map(|k| {
            mvcc::get(&**engine, SHARD, k.as_bytes(), Timestamp::MAX)
                .expect("read")
                .map(|(ts, v)| (ts.0, v))
        })
        .collect();
    let table = sm.locks();
    let table = table.read().unwrap();
    let mut locks: Vec<(u64, u64)> = table.txns().map(|(id, l)| (id.seq, l.prepare_ts)).collect();
    locks.sort();
    (keys, sm.closed_ts(), locks)
}

/// Applies `cmds` one entry each, or cut into batches at `cuts` (each a batch of
/// `cut` members, a lone member unwrapped as the proposer sends it), in `calls` apply calls
/// of two entries; returns every member's result and the final state.
fn run(cmds: &[Command], cuts: Option<&[usize]>) -> (Vec<CommandResult>, State) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    rt.block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let engine: Arc<dyn Engine> = Arc::new(MemoryEngine::new());
        let sm = open(&engine, dir.path());
        let mut groups: Vec<Vec<Command>> = Vec::new();
        match cuts {
            None => groups.extend(cmds.iter().map(|c| vec![c.clone()])),
            Some(cuts) => {
                let mut rest = cmds;
                let mut cuts = cuts.iter().cycle();
                while !rest.is_empty() {
                    let n = (*cuts.next().unwrap()).clamp(1, rest.len());
                    groups.push(rest[..n].to_vec());
                    rest = &rest[n..];
                }
            }
        }
        let entries: Vec<(Entry, usize)> = groups
            .into_iter()
            .enumerate()
            .map(|(i, mut group)| {
                let n = group.len();
                let cmd = if n == 1 {
                    group.pop().unwrap()
                } else {
                    Command::Batch { cmds: group }
                };
                (entry_at(i as u64 + 1, cmd), n)
            })
            .collect();
        let mut results = Vec::new();
        for chunk in entries.chunks(2) {
            let sizes: Vec<usize> = chunk.iter().map(|(_, n)| *n).collect();
            let out = sm
                .apply_for_results(chunk.iter().map(|(e, _)| e.clone()).collect())
                .await
                .expect("apply");
            for (result, n) in out.into_iter().zip(sizes) {
                if n == 1 {
                    results.push(result);
                } else {
                    assert_eq!(result.batch.len(), n, "{result:?}");
                    results.extend(result.batch);
                }
            }
        }
        let end = state(&engine, &sm);
        (results, end)
    })
}

fn commands(members: &[(Op, bool, u64)]) -> Vec<Command> {
    members
        .iter()
        .map(|(op, current, closed)| member(op, if *current { TERM } else { TERM - 1 }, *closed))
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]
    #[test]
    fn a_batch_applies_as_its_members_would_one_entry_each(
        members in members(),
        cuts in proptest::collection::vec(1usize..8, 1..5),
    ) {
        let cmds = commands(&members);
        let alone = run(&cmds, None);
        let batched = run(&cmds, Some(&cuts));
        prop_assert_eq!(alone, batched);
    }
}

/// The comparison above is not blind to order: a put and a CAS-if-absent on one key give other
/// results when a batch holds them the other way round (what an apply that reordered members
/// would produce).
#[test]
fn control_the_comparison_sees_member_order() {
    let put = member(
        &Op::Put {
            key: 0,
            ts: 5,
            seq: None,
        },
        TERM,
        0,
    );
    let cas_absent = member(
        &Op::Cas {
            key: 0,
            ts: 6,
            expect: None,
        },
        TERM,
        0,
    );
    let alone = run(&[put.clone(), cas_absent.clone()], None);
    let swapped = run(&[cas_absent, put], Some(&[2]));
    assert_ne!(alone, swapped, "a reordered batch must not look the same");
}

/// Each member answers for itself: a fenced, an invalid, a duplicate and a mismatched member
/// sit in one batch with members that write.
#[tokio::test]
async fn each_member_of_a_batch_answers_for_itself() {
    let dir = tempfile::tempdir().unwrap();
    let engine: Arc<dyn Engine> = Arc::new(MemoryEngine::new());
    let sm = open(&engine, dir.path());
    let put = |key, ts, seq| member(&Op::Put { key, ts, seq }, TERM, 0);
    let cmds = vec![
        put(0, 10, Some(1)),
        member(
            &Op::Put {
                key: 1,
                ts: 11,
                seq: None,
            },
            TERM - 1,
            0,
        ),
        member(&Op::Invalid { ts: 12 }, TERM, 0),
        put(0, 13, Some(1)),
        member(
            &Op::Cas {
                key: 2,
                ts: 14,
                expect: Some(99),
            },
            TERM,
            0,
        ),
        put(2, 15, None),
    ];
    let out = sm
        .apply_for_results(vec![entry_at(1, Command::Batch { cmds })])
        .await
        .unwrap();
    let r = &out[0].batch;
    assert_eq!(r.len(), 6, "{out:?}");
    assert_eq!(r[0].commit_ts, 10);
    assert!(r[1].fenced, "another term's member is fenced: {:?}", r[1]);
    assert!(r[2].rejected.is_some(), "{:?}", r[2]);
    assert!(r[3].duplicate && r[3].commit_ts == 10, "{:?}", r[3]);
    assert_eq!(r[4].mismatch, Some(None), "{:?}", r[4]);
    assert_eq!(r[5].commit_ts, 15);
    let read = |k: &str| mvcc::get(&*engine, SHARD, k.as_bytes(), Timestamp::MAX).unwrap();
    assert!(read("b").is_none(), "the fenced member wrote nothing");
    assert_eq!(read("c").unwrap().1, b"v15".to_vec());
}

/// A batch of the wrong shape is refused whole, deterministically: nested, too large, or a
/// member that is not a fenced data command.
#[tokio::test]
async fn a_malformed_batch_is_rejected_whole() {
    let dir = tempfile::tempdir().unwrap();
    let engine: Arc<dyn Engine> = Arc::new(MemoryEngine::new());
    let sm = open(&engine, dir.path());
    let put = || {
        member(
            &Op::Put {
                key: 0,
                ts: 5,
                seq: None,
            },
            TERM,
            0,
        )
    };
    let unfenced = Command::Write {
        ts: 5,
        puts: vec![(Bytes::from("a"), Bytes::from("x"))],
        deletes: vec![],
        request: None,
    };
    let bad = [
        Command::Batch { cmds: vec![] },
        Command::Batch {
            cmds: vec![put(); MAX_PROPOSAL_BATCH + 1],
        },
        Command::Batch {
            cmds: vec![put(), Command::Batch { cmds: vec![put()] }],
        },
        Command::Batch {
            cmds: vec![put(), unfenced],
        },
        Command::Batch {
            cmds: vec![
                put(),
                Command::Closed {
                    term: TERM,
                    closed_ts: 0,
                    cmd: Box::new(Command::Gc {
                        threshold: 1,
                        from: None,
                    }),
                },
            ],
        },
        Command::Closed {
            term: TERM,
            closed_ts: 0,
            cmd: Box::new(Command::Batch { cmds: vec![put()] }),
        },
    ];
    for (i, cmd) in bad.into_iter().enumerate() {
        let out = sm
            .apply_for_results(vec![entry_at(i as u64 + 1, cmd)])
            .await
            .unwrap();
        assert!(
            out[0].rejected.is_some() && out[0].batch.is_empty(),
            "{out:?}"
        );
    }
    let read = mvcc::get(&*engine, SHARD, b"a", Timestamp::MAX).unwrap();
    assert!(read.is_none(), "nothing of a malformed batch was written");
}
