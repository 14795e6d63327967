//! State machine behaviour beyond openraft's suite: MVCC apply, the version-floor rule,
//! restart from persisted state, and snapshot files moving data between engines.

use bytes::Bytes;
use meridian_raft::state_machine::ShardStateMachine;
use meridian_raft::types::Entry;
use meridian_raft::{Command, TypeConfig};
use meridian_storage::{mvcc, Engine, MemoryEngine};
use meridian_types::{Clock, ShardId, Timestamp};
use openraft::storage::RaftStateMachine;
use openraft::{EntryPayload, RaftSnapshotBuilder};
use std::sync::Arc;
use std::time::Duration;

const SHARD: ShardId = ShardId(5);

fn write(index: u64, ts: u64, key: &str, value: &str) -> Entry {
    Entry {
        log_id: openraft::testing::log_id::<TypeConfig>(1, 1, index),
        payload: EntryPayload::Normal(Command::Write {
            ts,
            puts: vec![(Bytes::from(key.to_string()), Bytes::from(value.to_string()))],
            deletes: vec![],
        }),
    }
}

fn delete(index: u64, ts: u64, key: &str) -> Entry {
    Entry {
        log_id: openraft::testing::log_id::<TypeConfig>(1, 1, index),
        payload: EntryPayload::Normal(Command::Write {
            ts,
            puts: vec![],
            deletes: vec![Bytes::from(key.to_string())],
        }),
    }
}

async fn apply(sm: &mut ShardStateMachine, entries: Vec<Entry>) {
    let stream = futures::stream::iter(entries.into_iter().map(|e| Ok((e, None))));
    sm.apply(stream).await.expect("apply");
}

fn open(engine: &Arc<dyn Engine>, dir: &std::path::Path) -> ShardStateMachine {
    let clock = Arc::new(Clock::new(Duration::from_millis(500)));
    ShardStateMachine::open(SHARD, engine.clone(), clock, dir.to_path_buf()).expect("open")
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
