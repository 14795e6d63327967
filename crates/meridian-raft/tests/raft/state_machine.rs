//! State machine behaviour beyond openraft's suite: MVCC apply, the version-floor rule,
//! restart from persisted state, snapshot files moving data between engines, retried writes
//! applied once, bad commands rejected without a panic, and crash-atomic snapshot install.

use bytes::Bytes;
use meridian_raft::state_machine::ShardStateMachine;
use meridian_raft::types::Entry;
use meridian_raft::{Command, RequestId, TypeConfig};
use meridian_storage::{mvcc, Engine, MemoryEngine};
use meridian_types::{Clock, ShardId, Timestamp};
use openraft::storage::RaftStateMachine;
use openraft::{EntryPayload, RaftSnapshotBuilder};
use std::sync::Arc;
use std::time::Duration;

const SHARD: ShardId = ShardId(5);

/// A log entry at `index` writing `puts` and `deletes` at `ts`.
fn entry(
    index: u64,
    ts: u64,
    puts: &[(&str, &str)],
    deletes: &[&str],
    request: Option<RequestId>,
) -> Entry {
    let bytes = |s: &str| Bytes::from(s.to_string());
    Entry {
        log_id: openraft::testing::log_id::<TypeConfig>(1, 1, index),
        payload: EntryPayload::Normal(Command::Write {
            ts,
            puts: puts.iter().map(|(k, v)| (bytes(k), bytes(v))).collect(),
            deletes: deletes.iter().map(|k| bytes(k)).collect(),
            request,
        }),
    }
}

fn write(index: u64, ts: u64, key: &str, value: &str) -> Entry {
    entry(index, ts, &[(key, value)], &[], None)
}

/// A put carrying a request id, as the client sends it on every attempt of one write.
fn write_with_id(index: u64, ts: u64, key: &str, value: &str, client_id: u64, seq: u64) -> Entry {
    entry(
        index,
        ts,
        &[(key, value)],
        &[],
        Some(RequestId { client_id, seq }),
    )
}

fn delete(index: u64, ts: u64, key: &str) -> Entry {
    entry(index, ts, &[], &[key], None)
}

async fn apply(sm: &mut ShardStateMachine, entries: Vec<Entry>) {
    let stream = futures::stream::iter(entries.into_iter().map(|e| Ok((e, None))));
    sm.apply(stream).await.expect("apply");
}

fn open(engine: &Arc<dyn Engine>, dir: &std::path::Path) -> ShardStateMachine {
    crate::common::open_shard(SHARD, engine, dir)
}

fn read(engine: &Arc<dyn Engine>, key: &str) -> Option<(Timestamp, Vec<u8>)> {
    mvcc::get(&**engine, SHARD, key.as_bytes(), Timestamp::MAX).expect("read")
}

#[tokio::test]
async fn versions_stay_ordered_when_proposed_timestamps_go_backwards() {
    let dir = tempfile::tempdir().unwrap();
    let engine: Arc<dyn Engine> = Arc::new(MemoryEngine::new());
    let mut sm = open(&engine, dir.path());
    // A new leader with a slower clock proposes older timestamps than the previous leader.
    apply(
        &mut sm,
        vec![
            write(1, 1_000, "k", "a"),
            write(2, 500, "k", "b"),
            write(3, 700, "k", "c"),
        ],
    )
    .await;
    let (ts, value) = read(&engine, "k").expect("k exists");
    assert_eq!(value, b"c");
    assert_eq!(ts, Timestamp(1_002), "floor+1 rule: 1000, 1001, 1002");
    assert_eq!(sm.version_floor().await, 1_002);
    // The older versions are still there, in order.
    assert_eq!(
        mvcc::get(&*engine, SHARD, b"k", Timestamp(1_001))
            .unwrap()
            .unwrap()
            .1,
        b"b"
    );
}

#[tokio::test]
async fn applied_state_survives_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let engine: Arc<dyn Engine> = Arc::new(MemoryEngine::new());
    {
        let mut sm = open(&engine, dir.path());
        apply(
            &mut sm,
            vec![
                write(1, 10, "a", "1"),
                delete(2, 20, "a"),
                write(3, 30, "b", "2"),
            ],
        )
        .await;
    }
    let mut sm = open(&engine, dir.path());
    let (applied, _) = sm.applied_state().await.unwrap();
    assert_eq!(applied.unwrap().index, 3);
    assert_eq!(sm.version_floor().await, 30);
    assert!(read(&engine, "a").is_none(), "deleted key stays deleted");
    assert_eq!(read(&engine, "b").unwrap().1, b"2");
}

/// A retired replica's state machine writes nothing more: openraft's shutdown leaves its
/// worker running, and an apply it still ran after the retirement's deletion left an applied
/// index without the data before it (a re-added replica then lacked 1,891 acknowledged adds in
/// a Jepsen set × membership run). Nor does a snapshot build or install.
#[tokio::test]
async fn a_retired_state_machine_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let engine: Arc<dyn Engine> = Arc::new(MemoryEngine::new());
    let mut sm = open(&engine, dir.path());
    apply(&mut sm, vec![write(1, 10, "a", "1")]).await;
    let snapshot = sm.build_snapshot().await.expect("a snapshot before");
    sm.retire().await;
    let late = sm.apply_for_results(vec![write(2, 20, "b", "2")]).await;
    assert!(late.is_err(), "an apply after the retirement succeeded");
    assert!(
        read(&engine, "b").is_none(),
        "an apply after the retirement wrote"
    );
    assert!(sm.build_snapshot().await.is_err(), "built a snapshot");
    let installed = sm.install_snapshot(&snapshot.meta, snapshot.snapshot).await;
    assert!(installed.is_err(), "installed a snapshot");
    // Its stored applied state is still the one before: reopened, it is at index 1.
    let mut sm = open(&engine, dir.path());
    let (applied, _) = sm.applied_state().await.unwrap();
    assert_eq!(applied.map(|l| l.index), Some(1));
}

#[tokio::test]
async fn snapshot_file_moves_a_shard_between_engines() {
    let dir_a = tempfile::tempdir().unwrap();
    let dir_b = tempfile::tempdir().unwrap();
    let a: Arc<dyn Engine> = Arc::new(MemoryEngine::new());
    let b: Arc<dyn Engine> = Arc::new(MemoryEngine::new());
    let mut sm_a = open(&a, dir_a.path());
    let mut sm_b = open(&b, dir_b.path());
    let entries: Vec<Entry> = (1..=200)
        .map(|i| write(i, 100 + i, &format!("key{i:04}"), &format!("v{i}")))
        .collect();
    apply(&mut sm_a, entries).await;
    // The follower has stale data that the snapshot must replace.
    apply(&mut sm_b, vec![write(1, 5, "stale", "x")]).await;

    let snapshot = sm_a.build_snapshot().await.expect("build");
    let path = snapshot
        .snapshot
        .path
        .clone()
        .expect("non-empty shard has a file");
    assert!(path.exists());
    sm_b.install_snapshot(&snapshot.meta, snapshot.snapshot.clone())
        .await
        .expect("install");

    assert!(
        read(&b, "stale").is_none(),
        "install replaces the whole range"
    );
    for i in [1u64, 100, 200] {
        assert_eq!(
            read(&b, &format!("key{i:04}")).unwrap().1,
            format!("v{i}").into_bytes()
        );
    }
    let (applied, _) = sm_b.applied_state().await.unwrap();
    assert_eq!(applied.unwrap().index, 200);
    assert_eq!(sm_b.version_floor().await, 300);
    let current = sm_b
        .get_current_snapshot()
        .await
        .unwrap()
        .expect("current snapshot recorded");
    assert_eq!(current.meta, snapshot.meta);
}

/// Data shards share one keyspace, so a node's engine holds the neighbours' keys between and
/// around a shard's span. A snapshot of shard [m, n) carries exactly its span (and its
/// shard-local keys); installing it replaces exactly that span and leaves the neighbours'
/// keys (another shard's replicas on the same node) as they were.
#[tokio::test]
async fn a_snapshot_carries_and_replaces_exactly_the_shards_span() {
    use meridian_storage::keys::{Keyspace, Span};
    let span = |start: &str, end: &str| Span {
        space: Keyspace::User,
        start: start.into(),
        end: end.into(),
    };
    let open_span = |engine: &Arc<dyn Engine>, dir: &std::path::Path, id: u64, s: Span| {
        let clock = Arc::new(Clock::new(Duration::from_millis(500)));
        ShardStateMachine::open(ShardId(id), s, engine.clone(), clock, dir.to_path_buf())
            .expect("open")
    };
    let dirs: Vec<_> = (0..4).map(|_| tempfile::tempdir().unwrap()).collect();
    let a: Arc<dyn Engine> = Arc::new(MemoryEngine::new());
    let b: Arc<dyn Engine> = Arc::new(MemoryEngine::new());
    // On both engines: the neighbours [.., m) and [n, ..) hold keys of their own.
    for (engine, dir_left, dir_right, tag) in [(&a, 0, 1, "a"), (&b, 2, 3, "b")] {
        let mut left = open_span(engine, dirs[dir_left].path(), 1, span("", "m"));
        let mut right = open_span(engine, dirs[dir_right].path(), 3, span("n", ""));
        apply(&mut left, vec![write(1, 10, "l", tag)]).await;
        apply(
            &mut right,
            vec![write(1, 10, "n", tag), write(2, 11, "z", tag)],
        )
        .await;
    }
    let dir_ma = tempfile::tempdir().unwrap();
    let dir_mb = tempfile::tempdir().unwrap();
    let mut middle_a = open_span(&a, dir_ma.path(), 2, span("m", "n"));
    let mut middle_b = open_span(&b, dir_mb.path(), 2, span("m", "n"));
    apply(
        &mut middle_a,
        vec![write(1, 20, "m1", "new"), write(2, 21, "m2", "new")],
    )
    .await;
    apply(&mut middle_b, vec![write(1, 5, "m3", "stale")]).await;

    let snapshot = middle_a.build_snapshot().await.expect("build");
    middle_b
        .install_snapshot(&snapshot.meta, snapshot.snapshot.clone())
        .await
        .expect("install");
    let value = |key: &str| read(&b, key).map(|(_, v)| String::from_utf8(v).unwrap());
    assert_eq!(value("m1").as_deref(), Some("new"));
    assert_eq!(value("m2").as_deref(), Some("new"));
    assert_eq!(value("m3"), None, "the span is replaced whole");
    for key in ["l", "n", "z"] {
        assert_eq!(
            value(key).as_deref(),
            Some("b"),
            "{key}: a neighbour's key is untouched"
        );
    }
}

#[tokio::test]
async fn a_retried_write_is_applied_once_even_after_another_clients_write() {
    let dir = tempfile::tempdir().unwrap();
    let engine: Arc<dyn Engine> = Arc::new(MemoryEngine::new());
    let mut sm = open(&engine, dir.path());
    // Client 7's put(k, v1) commits but its answer is lost; client 8 writes v2; client 7's
    // retry of the same request reaches the log again. Applying it again would roll k back.
    apply(
        &mut sm,
        vec![
            write_with_id(1, 100, "k", "v1", 7, 1),
            write_with_id(2, 200, "k", "v2", 8, 1),
            write_with_id(3, 300, "k", "v1", 7, 1),
        ],
    )
    .await;
    let (ts, value) = read(&engine, "k").expect("k exists");
    assert_eq!(value, b"v2", "the retry must not apply a second time");
    assert_eq!(ts, Timestamp(200));
    assert!(
        mvcc::get(&*engine, SHARD, b"k", Timestamp(299))
            .unwrap()
            .unwrap()
            .0
            == Timestamp(200),
        "no version was written for the duplicate"
    );
    let (applied, _) = sm.applied_state().await.unwrap();
    assert_eq!(
        applied.unwrap().index,
        3,
        "a duplicate still advances the applied index"
    );
    // The table survives a restart: a retry after reopening is still recognised.
    drop(sm);
    let mut sm = open(&engine, dir.path());
    apply(&mut sm, vec![write_with_id(4, 400, "k", "v1", 7, 1)]).await;
    assert_eq!(read(&engine, "k").unwrap().1, b"v2");
    // A new request of the same client is applied.
    apply(&mut sm, vec![write_with_id(5, 500, "k", "v3", 7, 2)]).await;
    assert_eq!(read(&engine, "k").unwrap().1, b"v3");
}

#[tokio::test]
async fn a_command_that_fails_validation_is_rejected_at_apply_without_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let engine: Arc<dyn Engine> = Arc::new(MemoryEngine::new());
    let mut sm = open(&engine, dir.path());
    // A peer proposed a timestamp at Timestamp::MAX (the latest-version slot's key): apply used
    // to assert on it, on every replica and on every replay of the committed entry.
    apply(
        &mut sm,
        vec![write(1, u64::MAX, "bad", "x"), write(2, 50, "good", "y")],
    )
    .await;
    assert!(
        read(&engine, "bad").is_none(),
        "a rejected command writes nothing"
    );
    assert_eq!(read(&engine, "good").unwrap().1, b"y");
    let (applied, _) = sm.applied_state().await.unwrap();
    assert_eq!(applied.unwrap().index, 2);
    assert_eq!(
        sm.version_floor().await,
        50,
        "the rejected ts did not raise the floor"
    );
}

#[tokio::test]
async fn a_snapshot_install_interrupted_by_a_crash_is_finished_on_open() {
    let dir_a = tempfile::tempdir().unwrap();
    let dir_b = tempfile::tempdir().unwrap();
    let a: Arc<dyn Engine> = Arc::new(MemoryEngine::new());
    let b: Arc<dyn Engine> = Arc::new(MemoryEngine::new());
    let mut sm_a = open(&a, dir_a.path());
    let entries: Vec<Entry> = (1..=50)
        .map(|i| write_with_id(i, 1_000 + i, "k", &format!("v{i}"), 3, i))
        .collect();
    apply(&mut sm_a, entries).await;
    let snapshot = sm_a.build_snapshot().await.expect("build");

    // The follower has applied an older prefix of the same log.
    let mut sm_b = open(&b, dir_b.path());
    let old: Vec<Entry> = (1..=10)
        .map(|i| write_with_id(i, 1_000 + i, "k", &format!("v{i}"), 3, i))
        .collect();
    apply(&mut sm_b, old).await;
    // Crash after the data range was replaced, before the applied index was recorded.
    sm_b.install_snapshot_then_crash(&snapshot.meta, snapshot.snapshot.clone())
        .await
        .expect("partial install");
    drop(sm_b);

    let mut sm_b = open(&b, dir_b.path());
    let (applied, _) = sm_b.applied_state().await.unwrap();
    assert_eq!(
        applied.unwrap().index,
        50,
        "open must finish the install: data and applied index agree"
    );
    assert_eq!(read(&b, "k").unwrap().1, b"v50");
    assert_eq!(sm_b.version_floor().await, 1_050);
    // The dedup table came with the snapshot: a late retry of request 3/40 is not re-applied.
    apply(&mut sm_b, vec![write_with_id(51, 2_000, "k", "v40", 3, 40)]).await;
    assert_eq!(read(&b, "k").unwrap().1, b"v50");
    let current = sm_b
        .get_current_snapshot()
        .await
        .unwrap()
        .expect("recorded");
    assert_eq!(current.meta, snapshot.meta);
}

fn prepare_entry(index: u64, ts: u64, seq: u64, key: &str, value: &str) -> Entry {
    let bytes = |s: &str| Bytes::from(s.to_string());
    Entry {
        log_id: openraft::testing::log_id::<TypeConfig>(1, 1, index),
        payload: EntryPayload::Normal(Command::Prepare {
            ts,
            txn: RequestId { client_id: 3, seq },
            txn_ts: 1,
            rank: meridian_types::TxnRank::default(),
            anchor: bytes(key),
            is_anchor: true,
            reads: vec![],
            ranges: vec![],
            writes: vec![(bytes(key), Some(bytes(value)))],
            participants: vec![bytes("elsewhere")],
        }),
    }
}

/// The prepared locks of `sm`'s shard, as `(seq, prepare_ts)`.
fn locks(sm: &ShardStateMachine) -> Vec<(u64, u64)> {
    let table = sm.locks();
    let table = table.read().unwrap();
    let mut out: Vec<(u64, u64)> = table.txns().map(|(id, l)| (id.seq, l.prepare_ts)).collect();
    out.sort();
    out
}

#[tokio::test]
async fn prepared_locks_survive_a_reopen_and_travel_with_a_snapshot() {
    let dir_a = tempfile::tempdir().unwrap();
    let dir_b = tempfile::tempdir().unwrap();
    let a: Arc<dyn Engine> = Arc::new(MemoryEngine::new());
    let b: Arc<dyn Engine> = Arc::new(MemoryEngine::new());
    let mut sm_a = open(&a, dir_a.path());
    apply(
        &mut sm_a,
        vec![
            write(1, 100, "a", "1"),
            prepare_entry(2, 110, 1, "k", "v"),
            prepare_entry(3, 120, 2, "m", "w"),
        ],
    )
    .await;
    assert_eq!(locks(&sm_a), vec![(1, 110), (2, 120)]);
    drop(sm_a);
    let mut sm_a = open(&a, dir_a.path());
    assert_eq!(locks(&sm_a), vec![(1, 110), (2, 120)], "rebuilt on open");
    // The transaction region never shows up as user data, even from the shard's empty start.
    let page = mvcc::scan(&*a, SHARD, b"", None, Timestamp(1_000), 10, false).expect("scan");
    let keys: Vec<&[u8]> = page.rows.iter().map(|(k, _, _)| &k[..]).collect();
    assert_eq!(keys, vec![&b"a"[..]]);

    let mut sm_b = open(&b, dir_b.path());
    apply(&mut sm_b, vec![prepare_entry(1, 50, 9, "stale", "x")]).await;
    let snapshot = sm_a.build_snapshot().await.expect("build");
    sm_b.install_snapshot(&snapshot.meta, snapshot.snapshot.clone())
        .await
        .expect("install");
    assert_eq!(
        locks(&sm_b),
        vec![(1, 110), (2, 120)],
        "the install replaced the locks"
    );
}
