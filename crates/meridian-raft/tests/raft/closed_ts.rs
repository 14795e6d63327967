//! Closed timestamps in the state machine: a `Closed` entry raises the replica's closed
//! timestamp with the batch it is applied in, a side-channel offer waits for its index, and
//! what was closed survives a snapshot install (which replaces the rest of the lock table).

use bytes::Bytes;
use meridian_raft::state_machine::ShardStateMachine;
use meridian_raft::types::Entry;
use meridian_raft::{Command, TypeConfig};
use meridian_storage::{Engine, MemoryEngine};
use meridian_types::ShardId;
use openraft::storage::RaftStateMachine;
use openraft::{EntryPayload, RaftSnapshotBuilder};
use std::sync::Arc;

const SHARD: ShardId = ShardId(5);

/// An entry at `index` of `entry_term` putting `key` at `ts`, closed at `closed` in `term`.
fn closed(index: u64, entry_term: u64, term: u64, ts: u64, closed: u64) -> Entry {
    Entry {
        log_id: openraft::testing::log_id::<TypeConfig>(entry_term, 1, index),
        payload: EntryPayload::Normal(Command::Closed {
            term,
            closed_ts: closed,
            cmd: Box::new(Command::Write {
                ts,
                puts: vec![(Bytes::from(format!("k{index}")), Bytes::from("v"))],
                deletes: vec![],
                request: None,
            }),
        }),
    }
}

fn blank(index: u64) -> Entry {
    Entry {
        log_id: openraft::testing::log_id::<TypeConfig>(1, 1, index),
        payload: EntryPayload::Blank,
    }
}

fn open(engine: &Arc<dyn Engine>, dir: &std::path::Path) -> ShardStateMachine {
    crate::common::open_shard(SHARD, engine, dir)
}

/// Only an entry applied in the term it was closed in raises the closed timestamp, and an
/// offer counts once its index is applied.
#[tokio::test]
async fn entries_and_offers_raise_the_closed_timestamp_only_when_they_may() {
    let dir = tempfile::tempdir().unwrap();
    let engine: Arc<dyn Engine> = Arc::new(MemoryEngine::new());
    let sm = open(&engine, dir.path());
    assert_eq!(sm.closed_ts(), 0);
    let results = sm
        .apply_for_results(vec![closed(1, 1, 1, 100, 50), closed(2, 2, 1, 110, 90)])
        .await
        .unwrap();
    assert!(!results[0].fenced && results[1].fenced, "{results:?}");
    assert_eq!(
        sm.closed_ts(),
        50,
        "the fenced-out entry's 90 does not count"
    );
    sm.offer_closed(4, 95);
    assert_eq!(sm.closed_ts(), 50, "index 4 is not applied yet");
    sm.apply_for_results(vec![blank(3)]).await.unwrap();
    assert_eq!(sm.closed_ts(), 50);
    sm.apply_for_results(vec![blank(4)]).await.unwrap();
    assert_eq!(
        sm.closed_ts(),
        95,
        "the offer counts once index 4 is applied"
    );
    sm.offer_closed(2, 80);
    assert_eq!(sm.closed_ts(), 95, "never lower");
}

/// A snapshot install replaces the lock table; the closed timestamp is carried over and a
/// waiting offer whose index the snapshot covers counts.
#[tokio::test]
async fn the_closed_timestamp_survives_a_snapshot_install() {
    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a: Arc<dyn Engine> = Arc::new(MemoryEngine::new());
    let b: Arc<dyn Engine> = Arc::new(MemoryEngine::new());
    let (mut sm_a, mut sm_b) = (open(&a, dir_a.path()), open(&b, dir_b.path()));
    let entries: Vec<Entry> = (1..=10).map(|i| closed(i, 1, 1, 100 + i, 10 * i)).collect();
    sm_a.apply_for_results(entries).await.unwrap();
    assert_eq!(sm_a.closed_ts(), 100);
    sm_b.apply_for_results(vec![closed(1, 1, 1, 101, 10)])
        .await
        .unwrap();
    sm_b.offer_closed(8, 70);
    assert_eq!(sm_b.closed_ts(), 10);
    let snapshot = sm_a.build_snapshot().await.expect("build");
    sm_b.install_snapshot(&snapshot.meta, snapshot.snapshot.clone())
        .await
        .expect("install");
    assert_eq!(
        sm_b.closed_ts(),
        70,
        "kept across the install, and the waiting offer's index 8 is now applied"
    );
}
