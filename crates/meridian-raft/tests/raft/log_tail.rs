//! The log store's in-memory tail: `append`, `truncate_after` and `purge` return before the
//! node's log writer has written anything, and reads must still see exactly the log openraft
//! built — the unwritten tail first, RocksDB only where no pending truncation makes it stale.
//!
//! The engine here holds every write until the test releases it, which is how a RocksDB
//! write stall looks to the log store.

use bytes::Bytes;
use futures::StreamExt;
use meridian_raft::log_store::LogStore;
use meridian_raft::log_writer::LogWriter;
use meridian_raft::types::{Entry, IOFlushed, LogId};
use meridian_raft::{Command, TypeConfig};
use meridian_storage::faulty::FaultyEngine;
use meridian_types::ShardId;
use openraft::storage::RaftLogStorage;
use openraft::type_config::TypeConfigExt;
use openraft::{EntryPayload, RaftLogReader};
use std::sync::Arc;
use std::time::Duration;

const SHARD: ShardId = ShardId(4);

/// Opens the gate when dropped, so a failing assertion cannot leave the writer thread blocked
/// (dropping the writer joins it). Declared after the store, so it drops first.
struct OpenOnDrop(Arc<FaultyEngine>);

impl Drop for OpenOnDrop {
    fn drop(&mut self) {
        self.0.hold_writes(false);
    }
}

fn entry(term: u64, index: u64) -> Entry {
    Entry {
        log_id: openraft::testing::log_id::<TypeConfig>(term, 1, index),
        payload: EntryPayload::Normal(Command::Write {
            ts: index,
            puts: vec![(Bytes::from(format!("k{index}")), Bytes::from_static(b"v"))],
            deletes: Vec::new(),
            request: None,
        }),
    }
}

fn log_ids(entries: &[Entry]) -> Vec<(u64, u64)> {
    entries
        .iter()
        .map(|e| (e.log_id.leader_id.term, e.log_id.index))
        .collect()
}

fn expected(runs: &[(u64, std::ops::RangeInclusive<u64>)]) -> Vec<(u64, u64)> {
    runs.iter()
        .flat_map(|(term, r)| r.clone().map(move |i| (*term, i)))
        .collect()
}

type Flushed = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

/// Appends `entries` and returns a future of its flush report.
async fn append(store: &mut LogStore, entries: impl Iterator<Item = Entry>) -> Flushed {
    let (tx, rx) = TypeConfig::oneshot();
    tokio::time::timeout(
        Duration::from_secs(5),
        store.append(entries.collect::<Vec<_>>(), IOFlushed::signal(tx)),
    )
    .await
    .expect("append returned without waiting for the engine")
    .expect("append");
    Box::pin(async move {
        tokio::time::timeout(Duration::from_secs(10), rx)
            .await
            .expect("flush reported")
            .expect("callback")
            .expect("flushed");
    })
}

async fn last_log_id(store: &mut LogStore) -> Option<LogId> {
    store.get_log_state().await.unwrap().last_log_id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unwritten_appends_are_readable_and_pending_truncations_hide_rocksdb() {
    let engine = Arc::new(FaultyEngine::new());
    let writer = Arc::new(LogWriter::start(engine.clone()));
    let mut store = LogStore::new(SHARD, engine.clone(), writer);
    let _open = OpenOnDrop(engine.clone());

    // Term 1 writes 1..=10 all the way to RocksDB, and 1..=5 are applied, so they leave the
    // in-memory tail: reads of them go to RocksDB, reads of 6..=10 are answered from memory.
    append(&mut store, (1..=10).map(|i| entry(1, i)))
        .await
        .await;
    let applied: Vec<Entry> = store
        .entries_stream(1..6)
        .await
        .map(|e| e.expect("entry"))
        .collect()
        .await;
    assert_eq!(log_ids(&applied), expected(&[(1, 1..=5)]));

    // A stall: nothing reaches RocksDB from here on until the gate opens.
    engine.hold_writes(true);
    let mut flushed = vec![append(&mut store, (11..=12).map(|i| entry(1, i))).await];
    let read = store.try_get_log_entries(1..=20).await.unwrap();
    assert_eq!(
        log_ids(&read),
        expected(&[(1, 1..=12)]),
        "11 and 12 from the tail"
    );

    // A new leader's log conflicts from 6 on (written, not applied): truncate, then append its
    // entries. RocksDB still holds term 1's 6..=10 (the range delete is queued behind the gate)
    // and the tail no longer does.
    store
        .truncate_after(Some(openraft::testing::log_id::<TypeConfig>(1, 1, 5)))
        .await
        .unwrap();
    let read = store.try_get_log_entries(1..=20).await.unwrap();
    assert_eq!(
        log_ids(&read),
        expected(&[(1, 1..=5)]),
        "truncated entries must not come back from RocksDB"
    );
    assert_eq!(last_log_id(&mut store).await.map(|l| l.index), Some(5));
    flushed.push(append(&mut store, (6..=7).map(|i| entry(2, i))).await);
    let read = store.try_get_log_entries(1..=20).await.unwrap();
    assert_eq!(log_ids(&read), expected(&[(1, 1..=5), (2, 6..=7)]));
    let limited = store.limited_get_log_entries(4, 100).await.unwrap();
    assert_eq!(log_ids(&limited), expected(&[(1, 4..=5), (2, 6..=7)]));
    let last = last_log_id(&mut store).await.unwrap();
    assert_eq!((last.leader_id.term, last.index), (2, 7));

    // Nothing is reported durable while the engine holds the writes.
    tokio::time::sleep(Duration::from_millis(100)).await;
    for f in &mut flushed {
        assert!(
            futures::poll!(f.as_mut()).is_pending(),
            "an append was reported flushed before it was written"
        );
    }

    // The stall ends: the queued work lands in order and the log reads the same.
    engine.hold_writes(false);
    for f in flushed {
        f.await;
    }
    let read = store.try_get_log_entries(1..=20).await.unwrap();
    assert_eq!(log_ids(&read), expected(&[(1, 1..=5), (2, 6..=7)]));
    // And so does a fresh store over the same engine (nothing left only in memory).
    let writer = Arc::new(LogWriter::start(engine.clone()));
    let mut reopened = LogStore::new(SHARD, engine.clone(), writer);
    let read = reopened.try_get_log_entries(1..=20).await.unwrap();
    assert_eq!(log_ids(&read), expected(&[(1, 1..=5), (2, 6..=7)]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_purge_shows_in_the_log_state_at_once() {
    let engine = Arc::new(FaultyEngine::new());
    let writer = Arc::new(LogWriter::start(engine.clone()));
    let mut store = LogStore::new(SHARD, engine.clone(), writer);
    let _open = OpenOnDrop(engine.clone());
    append(&mut store, (1..=10).map(|i| entry(1, i)))
        .await
        .await;
    engine.hold_writes(true);
    let purged = openraft::testing::log_id::<TypeConfig>(1, 1, 10);
    store.purge(purged).await.unwrap();
    let state = store.get_log_state().await.unwrap();
    assert_eq!(state.last_purged_log_id, Some(purged));
    assert_eq!(state.last_log_id, Some(purged));
    engine.hold_writes(false);
}
