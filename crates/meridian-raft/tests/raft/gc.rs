//! MVCC garbage collection through the state machine: a `Command::Gc` sees every entry
//! before it whatever the apply batching, its threshold survives a reopen and travels with a
//! snapshot, and its pages resume where the previous one stopped.

use bytes::Bytes;
use meridian_raft::state_machine::ShardStateMachine;
use meridian_raft::types::Entry;
use meridian_raft::{Command, CommandResult, GcResult, TypeConfig};
use meridian_storage::{keys, mvcc, Cf, Engine, MemoryEngine};
use meridian_types::{ShardId, Timestamp};
use openraft::storage::RaftStateMachine;
use openraft::{EntryPayload, RaftSnapshotBuilder};
use std::sync::Arc;

const SHARD: ShardId = ShardId(5);

fn entry(index: u64, cmd: Command) -> Entry {
    Entry {
        log_id: openraft::testing::log_id::<TypeConfig>(1, 1, index),
        payload: EntryPayload::Normal(cmd),
    }
}

fn write(index: u64, ts: u64, key: &str, value: Option<&str>) -> Entry {
    let key = Bytes::from(key.to_string());
    let (puts, deletes) = match value {
        Some(v) => (vec![(key, Bytes::from(v.to_string()))], vec![]),
        None => (vec![], vec![key]),
    };
    entry(
        index,
        Command::Write {
            ts,
            puts,
            deletes,
            request: None,
        },
    )
}

fn gc(index: u64, threshold: u64, from: Option<(Bytes, u64)>) -> Entry {
    entry(index, Command::Gc { threshold, from })
}

async fn apply(sm: &mut ShardStateMachine, entries: Vec<Entry>) -> Vec<CommandResult> {
    sm.apply_for_results(entries).await.expect("apply")
}

fn open(engine: &Arc<dyn Engine>, dir: &std::path::Path) -> ShardStateMachine {
    crate::common::open_shard(SHARD, engine, dir)
}

/// Every stored entry of the shard's data, raw: its shard-local keys, then its span's.
fn dump(engine: &Arc<dyn Engine>) -> Vec<(Vec<u8>, Vec<u8>)> {
    [
        keys::shard_local_range(SHARD),
        meridian_storage::keys::Span::user().data_range(),
    ]
    .iter()
    .flat_map(|(lo, hi)| engine.scan(Cf::Data, lo, Some(hi), false))
    .map(|item| item.expect("scan"))
    .collect()
}

fn threshold(sm: &ShardStateMachine) -> u64 {
    sm.locks().read().unwrap().gc_threshold
}

fn history() -> Vec<Entry> {
    vec![
        write(1, 10, "k", Some("a")),
        write(2, 20, "k", Some("b")),
        write(3, 30, "j", Some("x")),
    ]
}

/// The test this module exists for: a GC page right after a delete in one apply call must
/// see the delete (the key goes whole), as a replica applying them in two calls does. Were
/// the page to read RocksDB without the batch before it, it would keep "b" as the keeper and
/// leave the tombstone, and the two replicas would differ.
#[tokio::test]
async fn a_gc_page_sees_the_entries_before_it_however_they_are_batched() {
    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a: Arc<dyn Engine> = Arc::new(MemoryEngine::new());
    let b: Arc<dyn Engine> = Arc::new(MemoryEngine::new());
    let (mut sm_a, mut sm_b) = (open(&a, dir_a.path()), open(&b, dir_b.path()));
    for sm in [&mut sm_a, &mut sm_b] {
        apply(sm, history()).await;
    }
    // Replica a applies the delete, the GC and a later write in one call; b one by one.
    let tail = || {
        vec![
            write(4, 40, "k", None),
            gc(5, 45, None),
            write(6, 50, "j", Some("y")),
        ]
    };
    let together = apply(&mut sm_a, tail()).await;
    let mut alone = Vec::new();
    for e in tail() {
        alone.extend(apply(&mut sm_b, vec![e]).await);
    }
    assert_eq!(together, alone);
    assert_eq!(dump(&a), dump(&b), "both replicas hold the same bytes");
    let page = together[1].gc.clone().expect("a GC result");
    assert_eq!(
        page,
        GcResult {
            threshold: 45,
            resume: None,
            // k: the tombstone @40 (keeper), "b" @20 and "a" @10; j keeps "x" @30.
            versions_deleted: 3,
            keys_deleted: 1,
            examined: 6,
        }
    );
    assert_eq!(mvcc::get(&*a, SHARD, b"k", Timestamp(45)).unwrap(), None);
    assert_eq!(
        mvcc::get(&*a, SHARD, b"j", Timestamp(45)).unwrap(),
        Some((Timestamp(30), b"x".to_vec()))
    );
}

#[tokio::test]
async fn the_threshold_only_rises_survives_a_reopen_and_travels_with_a_snapshot() {
    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a: Arc<dyn Engine> = Arc::new(MemoryEngine::new());
    let b: Arc<dyn Engine> = Arc::new(MemoryEngine::new());
    let mut sm_a = open(&a, dir_a.path());
    apply(&mut sm_a, history()).await;
    let results = apply(&mut sm_a, vec![gc(4, 25, None), gc(5, 15, None)]).await;
    assert_eq!(
        results[1].gc.as_ref().unwrap().threshold,
        25,
        "never lowered"
    );
    assert_eq!(threshold(&sm_a), 25);
    drop(sm_a);
    let mut sm_a = open(&a, dir_a.path());
    assert_eq!(threshold(&sm_a), 25, "restored on open");
    let mut sm_b = open(&b, dir_b.path());
    assert_eq!(threshold(&sm_b), 0);
    let snapshot = sm_a.build_snapshot().await.expect("build");
    sm_b.install_snapshot(&snapshot.meta, snapshot.snapshot.clone())
        .await
        .expect("install");
    assert_eq!(threshold(&sm_b), 25, "installed with the snapshot");
}

#[tokio::test]
async fn pages_resume_where_the_last_one_stopped() {
    let dir = tempfile::tempdir().unwrap();
    let engine: Arc<dyn Engine> = Arc::new(MemoryEngine::new());
    let mut sm = open(&engine, dir.path());
    // More versions of one key than one page examines.
    let n = meridian_storage::gc::GC_PAGE_ENTRIES as u64 + 500;
    let writes: Vec<Entry> = (1..=n)
        .map(|i| write(i, i * 10, "hot", Some(&format!("v{i}"))))
        .collect();
    apply(&mut sm, writes).await;
    let (mut index, mut from, mut deleted, mut pages) = (n + 1, None, 0, 0);
    loop {
        let result = apply(&mut sm, vec![gc(index, n * 10, from.clone())]).await;
        let page = result[0].gc.clone().expect("a GC result");
        assert!(page.examined <= meridian_storage::gc::GC_PAGE_ENTRIES as u64);
        deleted += page.versions_deleted;
        pages += 1;
        index += 1;
        match page.resume {
            Some(next) => from = Some(next),
            None => break,
        }
    }
    assert_eq!(pages, 2);
    assert_eq!(deleted, n - 1, "every version but the newest");
    assert_eq!(
        dump(&engine).len(),
        3,
        "the slot, the newest version and the shard's GC threshold"
    );
}
