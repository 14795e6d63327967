//! The log store's read contract, beyond openraft's suite (whose logs are short).
//!
//! openraft reads committed entries back through `try_get_log_entries` (via `entries_stream`)
//! to apply them, and marks the whole requested range applied. A reader that returns fewer
//! entries than the log holds therefore makes the state machine skip entries for good: that
//! lost 5,112 acknowledged writes in a Jepsen run (jepsen/evidence, `set-clock-chain`), when a
//! replica that lagged by more than 4,096 entries caught up in one apply.

use bytes::Bytes;
use futures::StreamExt;
use meridian_raft::log_store::{LogStore, MAX_BYTES_PER_READ, MAX_ENTRIES_PER_READ};
use meridian_raft::log_tail::MAX_CACHED_ENTRIES;
use meridian_raft::log_writer::LogWriter;
use meridian_raft::types::{Entry, IOFlushed};
use meridian_raft::{Command, TypeConfig};
use meridian_storage::keys;
use meridian_storage::{Cf, Engine, MemoryEngine, WriteBatch};
use meridian_types::ShardId;
use openraft::storage::RaftLogStorage;
use openraft::type_config::TypeConfigExt;
use openraft::{EntryPayload, RaftLogReader};
use std::sync::atomic::Ordering;
use std::sync::Arc;

const SHARD: ShardId = ShardId(3);

/// An entry whose value is `value_len` bytes.
fn sized_entry(index: u64, value_len: usize) -> Entry {
    Entry {
        log_id: openraft::testing::log_id::<TypeConfig>(1, 1, index),
        payload: EntryPayload::Normal(Command::Write {
            ts: index,
            puts: vec![(
                Bytes::from(format!("k{index}")),
                Bytes::from(vec![b'v'; value_len]),
            )],
            deletes: Vec::new(),
            request: None,
        }),
    }
}

/// A store holding entries `1..=count` (written to the engine and synced), and its engine.
async fn store_with(count: u64) -> (LogStore, Arc<dyn Engine>) {
    store_of(count, 1).await
}

/// [`store_with`] of entries with `value_len`-byte values.
async fn store_of(count: u64, value_len: usize) -> (LogStore, Arc<dyn Engine>) {
    let engine: Arc<dyn Engine> = Arc::new(MemoryEngine::new());
    let writer = Arc::new(LogWriter::start(engine.clone()));
    let mut store = LogStore::new(SHARD, engine.clone(), writer);
    append_written(&mut store, count, value_len).await;
    (store, engine)
}

/// Appends entries `1..=count` and waits until they are written and synced.
async fn append_written(store: &mut LogStore, count: u64, value_len: usize) {
    // Appended in runs, as a follower receives them.
    let mut flushed = Vec::new();
    for start in (1..=count).step_by(1_000) {
        let end = (start + 999).min(count);
        let (tx, rx) = TypeConfig::oneshot();
        store
            .append(
                (start..=end).map(|i| sized_entry(i, value_len)),
                IOFlushed::signal(tx),
            )
            .await
            .expect("append");
        flushed.push(rx);
    }
    for rx in flushed {
        rx.await.expect("flush reported").expect("flushed");
    }
}

/// Reads apply (the apply stream) of `range`, as indexes.
async fn apply(store: &mut LogStore, range: std::ops::Range<u64>) -> Vec<u64> {
    store
        .entries_stream(range)
        .await
        .map(|e| e.expect("entry").log_id.index)
        .collect()
        .await
}

fn indexes(entries: &[Entry]) -> Vec<u64> {
    entries.iter().map(|e| e.log_id.index).collect()
}

#[tokio::test]
async fn try_get_log_entries_returns_every_entry_of_a_long_range() {
    let count = 3 * MAX_ENTRIES_PER_READ as u64 + 17;
    let (mut store, _) = store_with(count).await;
    let got = store.try_get_log_entries(1..=count).await.expect("read");
    assert_eq!(
        indexes(&got),
        (1..=count).collect::<Vec<_>>(),
        "every entry of 1..={count}"
    );
    let got = store.try_get_log_entries(5..).await.expect("read");
    assert_eq!(
        got.len() as u64,
        count - 4,
        "an open-ended range reads to the end"
    );
}

#[tokio::test]
async fn the_apply_stream_yields_every_entry_of_a_long_range() {
    let count = 2 * MAX_ENTRIES_PER_READ as u64 + 5;
    let (mut store, _) = store_with(count).await;
    let streamed: Vec<u64> = store
        .entries_stream(1..count + 1)
        .await
        .map(|e| e.expect("entry").log_id.index)
        .collect()
        .await;
    assert_eq!(streamed, (1..=count).collect::<Vec<_>>());
}

#[tokio::test]
async fn limited_reads_are_bounded_but_never_empty() {
    let count = MAX_ENTRIES_PER_READ as u64 + 100;
    let (mut store, _) = store_with(count).await;
    let got = store
        .limited_get_log_entries(1, count + 1)
        .await
        .expect("read");
    assert!(!got.is_empty() && got.len() <= MAX_ENTRIES_PER_READ);
    assert_eq!(indexes(&got), (1..=got.len() as u64).collect::<Vec<_>>());
}

/// Large entries: a replication read stops at [`MAX_BYTES_PER_READ`] (one append the
/// transport can send), still never empty, and the apply stream still yields every entry
/// though its pieces end by bytes rather than by count.
#[tokio::test]
async fn reads_of_large_entries_are_bounded_by_bytes_and_the_apply_stream_misses_none() {
    let value = 300 * 1024;
    let count = 40u64;
    let (mut store, _) = store_of(count, value).await;
    let got = store
        .limited_get_log_entries(1, count + 1)
        .await
        .expect("read");
    let bytes: usize = got
        .iter()
        .map(meridian_raft::types::codec::encoded_len)
        .sum();
    assert!(
        !got.is_empty() && bytes <= MAX_BYTES_PER_READ && got.len() < count as usize,
        "{} entries, {bytes} bytes",
        got.len()
    );
    assert_eq!(
        got.len(),
        MAX_BYTES_PER_READ / (value + 64),
        "as many as fit, not fewer"
    );
    let streamed: Vec<u64> = store
        .entries_stream(1..count + 1)
        .await
        .map(|e| e.expect("entry").log_id.index)
        .collect()
        .await;
    assert_eq!(streamed, (1..=count).collect::<Vec<_>>());

    let (mut store, _) = store_of(2, MAX_BYTES_PER_READ + 1).await;
    let got = store.limited_get_log_entries(1, 3).await.expect("read");
    assert_eq!(
        indexes(&got),
        vec![1],
        "an entry over the budget goes alone"
    );
}

#[tokio::test]
async fn a_hole_inside_the_range_is_an_error_not_a_short_read() {
    let (mut store, engine) = store_with(50).await;
    // Applied, so the entries are read from RocksDB from now on (not the in-memory tail).
    assert_eq!(apply(&mut store, 1..51).await, (1..=50).collect::<Vec<_>>());
    let mut batch = WriteBatch::new();
    batch.delete(Cf::RaftLog, keys::raft_log_key(SHARD, 20));
    engine.write(batch, true).unwrap();
    let err = store
        .try_get_log_entries(1..=50)
        .await
        .expect_err("a hole at 20 must fail the read");
    assert!(err.to_string().contains("20"), "{err}");
    // Absence at the start (purged) or the end (not appended yet) is not a hole.
    assert_eq!(
        indexes(&store.try_get_log_entries(21..=60).await.unwrap()),
        (21..=50).collect::<Vec<_>>()
    );
}

/// A read whose first entry the in-memory tail still holds is answered there (written but not
/// yet applied); entries apply has read leave it, and reads of them go to RocksDB. The
/// writer's statistics count which is which.
#[tokio::test]
async fn reads_come_from_memory_until_apply_has_read_the_entries() {
    let engine: Arc<dyn Engine> = Arc::new(MemoryEngine::new());
    let writer = Arc::new(LogWriter::start(engine.clone()));
    let mut store = LogStore::new(SHARD, engine.clone(), writer.clone());
    append_written(&mut store, 100, 10).await;
    let counts = || {
        let stats = writer.stats();
        (
            stats.log_reads_memory.load(Ordering::Relaxed),
            stats.log_reads_stored.load(Ordering::Relaxed),
        )
    };
    let all: Vec<u64> = (1..=100).collect();
    assert_eq!(
        indexes(&store.limited_get_log_entries(1, 101).await.unwrap()),
        all
    );
    assert_eq!(counts(), (1, 0), "written, not applied: still in memory");
    assert_eq!(apply(&mut store, 1..61).await, (1..=60).collect::<Vec<_>>());
    assert_eq!(counts(), (2, 0));
    assert_eq!(
        indexes(&store.try_get_log_entries(1..=100).await.unwrap()),
        all
    );
    assert_eq!(counts(), (2, 1), "1..=60 were applied: RocksDB has them");
    assert_eq!(
        indexes(&store.try_get_log_entries(61..=100).await.unwrap()),
        (61..=100).collect::<Vec<_>>()
    );
    assert_eq!(counts(), (3, 1));
}

/// Past its bound, the tail keeps only the newest written entries: an older read needs
/// RocksDB and still sees every entry.
#[tokio::test]
async fn the_tail_keeps_a_bounded_number_of_written_entries() {
    let count = MAX_CACHED_ENTRIES as u64 + 500;
    let engine: Arc<dyn Engine> = Arc::new(MemoryEngine::new());
    let writer = Arc::new(LogWriter::start(engine.clone()));
    let mut store = LogStore::new(SHARD, engine.clone(), writer.clone());
    append_written(&mut store, count, 10).await;
    let stored = || writer.stats().log_reads_stored.load(Ordering::Relaxed);
    let newest = count - MAX_CACHED_ENTRIES as u64 + 1;
    let got = store.try_get_log_entries(newest..=count).await.unwrap();
    assert_eq!(got.len(), MAX_CACHED_ENTRIES);
    assert_eq!(stored(), 0, "the newest MAX_CACHED_ENTRIES are in memory");
    let got = store.try_get_log_entries(newest - 1..=count).await.unwrap();
    assert_eq!(indexes(&got), (newest - 1..=count).collect::<Vec<_>>());
    assert_eq!(stored(), 1);
}
