//! Power loss, simulated (meridian-storage's `CrashEngine`, which drops every write not yet
//! made durable): what the Raft log and the state machine promise must survive it.
//!
//! SIGKILL cannot test this — the OS keeps what a killed process wrote — so the kill tests of
//! meridian-cli prove nothing about fsync. Each check here has a negative control on
//! `ForgetfulEngine` (an engine that ignores sync), where it must fail.

use bytes::Bytes;
use meridian_raft::log_store::LogStore;
use meridian_raft::log_writer::LogWriter;
use meridian_raft::state_machine::ShardStateMachine;
use meridian_raft::types::{Entry, IOFlushed};
use meridian_raft::{Command, TypeConfig};
use meridian_storage::crash::{CrashEngine, ForgetfulEngine};
use meridian_storage::{mvcc, Engine};
use meridian_types::{Clock, ShardId, Timestamp};
use openraft::storage::{RaftLogStorage, RaftStateMachine};
use openraft::type_config::TypeConfigExt;
use openraft::{EntryPayload, RaftLogReader};
use std::sync::Arc;
use std::time::Duration;

const SHARD: ShardId = ShardId(4);

fn entry(index: u64) -> Entry {
    Entry {
        log_id: openraft::testing::log_id::<TypeConfig>(1, 1, index),
        payload: EntryPayload::Normal(Command::Write {
            ts: 100 + index,
            puts: vec![(
                Bytes::from(format!("k{index}")),
                Bytes::from(format!("v{index}")),
            )],
            deletes: Vec::new(),
            request: None,
        }),
    }
}

/// Appends `1..=count` in runs of 10, each reported flushed before the next, as openraft sees
/// it; then the power fails (`crash`). Returns what a restarted log store reads back.
async fn append_flush_crash(engine: Arc<dyn Engine>, crash: impl Fn(), count: u64) -> Vec<u64> {
    {
        let writer = Arc::new(LogWriter::start(engine.clone()));
        let mut store = LogStore::new(SHARD, engine.clone(), writer);
        for start in (1..=count).step_by(10) {
            let (tx, rx) = TypeConfig::oneshot();
            store
                .append((start..start + 10).map(entry), IOFlushed::signal(tx))
                .await
                .expect("append");
            rx.await.expect("callback").expect("flushed");
        }
    }
    crash();
    let writer = Arc::new(LogWriter::start(engine.clone()));
    let mut store = LogStore::new(SHARD, engine, writer);
    store
        .try_get_log_entries(1..)
        .await
        .expect("read")
        .iter()
        .map(|e| e.log_id.index)
        .collect()
}

#[tokio::test]
async fn log_entries_reported_flushed_survive_a_power_loss() {
    let engine = Arc::new(CrashEngine::new());
    let crashing = engine.clone();
    let got = append_flush_crash(engine, move || crashing.crash(), 100).await;
    assert_eq!(got, (1..=100).collect::<Vec<_>>());
}

/// Negative control: on an engine that ignores sync, the same check loses the entries.
#[tokio::test]
async fn the_flush_check_fails_on_an_engine_that_ignores_sync() {
    let engine = Arc::new(ForgetfulEngine::new());
    let crashing = engine.clone();
    let got = append_flush_crash(engine, move || crashing.crash(), 100).await;
    assert!(
        got.len() < 100,
        "a forgetful engine kept {} entries",
        got.len()
    );
}

/// Apply writes data and the applied index in one unsynced batch: after a power loss at any
/// point (every prefix of the pending writes), the applied index read back on restart and the
/// data agree — an entry's write is visible iff its index is at or below the applied index.
#[tokio::test]
async fn applied_index_and_data_agree_after_a_power_loss_at_any_point() {
    const ENTRIES: u64 = 6;
    let mut outcomes = std::collections::BTreeSet::new();
    for keep in 0..=ENTRIES as usize {
        let engine = Arc::new(CrashEngine::new());
        let dyn_engine: Arc<dyn Engine> = engine.clone();
        let dir = tempfile::tempdir().unwrap();
        let open = || {
            let clock = Arc::new(Clock::new(Duration::from_millis(500)));
            let span = meridian_storage::keys::Span::user();
            ShardStateMachine::open(SHARD, span, dyn_engine.clone(), clock, dir.path().into())
                .unwrap()
        };
        let mut sm = open();
        engine.crash(); // whatever open wrote is the durable starting point
                        // One apply call per entry: one batch each.
        for index in 1..=ENTRIES {
            let stream = futures::stream::iter(vec![Ok((entry(index), None))]);
            sm.apply(stream).await.expect("apply");
        }
        drop(sm);
        engine.crash_keeping(keep);
        let mut sm = open();
        let (applied, _) = sm.applied_state().await.unwrap();
        let applied = applied.map_or(0, |l| l.index);
        for index in 1..=ENTRIES {
            let key = format!("k{index}");
            let visible = mvcc::get(&*dyn_engine, SHARD, key.as_bytes(), Timestamp::MAX)
                .unwrap()
                .is_some();
            assert_eq!(
                visible,
                index <= applied,
                "keep {keep}: entry {index} visible={visible} but applied index is {applied}"
            );
        }
        outcomes.insert(applied);
    }
    // Every prefix was a distinct, consistent outcome (the check saw each case).
    assert_eq!(outcomes.len(), ENTRIES as usize + 1, "{outcomes:?}");
}
