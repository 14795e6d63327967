//! The conformance suite every [`Engine`] must pass (feature `testing`).
//!
//! [`run_all`] runs each named check on a fresh engine from `make` and panics (naming the
//! check) on the first violation. The checks pin down the semantics callers rely on and that
//! are easy to get subtly different between RocksDB and an in-memory map: bound inclusivity,
//! reverse order, batch atomicity and op order, range deletes, column family isolation, and
//! snapshot file export/ingest including range replacement and empty ranges.
//!
//! Engine-specific properties (reopen, format version, real durability) are tested next to the
//! engine (`tests/rocks.rs`), not here.
//!
//! [`run_crash_checks`] checks the durability contract (see [`crate::engine`]) on engines that
//! can simulate power loss ([`Crashable`], e.g. `crate::crash::CrashEngine`): synced writes,
//! `sync_wal`, `flush` and ingest survive a crash, and what survives of unsynced writes is a
//! prefix of the write order made of whole batches. A SIGKILL test cannot check this (the OS
//! keeps what a killed process wrote), and `run_all` passes on an engine that ignores `sync`.
//!
//! Keys used by the checks stay inside shard-prefixed ranges where a family may hold reserved
//! keys (`Cf::RaftMeta`), so an engine that writes its own markers still passes.

use crate::engine::{Cf, Engine, WriteBatch};
use crate::keys;
use meridian_types::ShardId;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

/// A named check, run on a fresh engine.
pub type Check<E> = (&'static str, fn(&E));

/// Runs every check on a fresh engine from `make`.
pub fn run_all<E: Engine>(make: impl Fn() -> E) {
    let checks: Vec<Check<E>> = vec![
        ("get_put_delete", check_get_put_delete),
        ("batch_order_and_atomic_apply", check_batch_order),
        ("delete_range", check_delete_range),
        ("scan_bounds_forward_reverse", check_scan_bounds),
        ("multi_get_order", check_multi_get_order),
        ("seek_first_many", check_seek_first_many),
        ("cross_cf_isolation", check_cross_cf_isolation),
        ("large_values_and_binary_keys", check_large_values),
        ("sync_write_and_flush", check_sync_and_flush),
        ("cluster_id", check_cluster_id),
    ];
    for (name, check) in checks {
        eprintln!("conformance: {name}");
        let engine = make();
        check(&engine);
    }
    eprintln!("conformance: export_ingest_round_trip");
    check_export_ingest(&make);
    eprintln!("conformance: export_ingest_empty_range");
    check_export_ingest_empty(&make);
    eprintln!("conformance: export_ingest_two_ranges");
    check_export_ingest_two_ranges(&make);
}

fn put(e: &impl Engine, cf: Cf, k: &[u8], v: &[u8]) {
    let mut b = WriteBatch::new();
    b.put(cf, k, v);
    e.write(b, false).expect("write");
}

fn scan_all(
    e: &impl Engine,
    cf: Cf,
    start: &[u8],
    end: Option<&[u8]>,
    reverse: bool,
) -> Vec<Vec<u8>> {
    e.scan(cf, start, end, reverse)
        .map(|r| r.expect("scan item").0)
        .collect()
}

fn keys_of(ks: &[&[u8]]) -> Vec<Vec<u8>> {
    ks.iter().map(|k| k.to_vec()).collect()
}

fn check_get_put_delete<E: Engine>(e: &E) {
    assert_eq!(e.get(Cf::Data, b"k").unwrap(), None);
    put(e, Cf::Data, b"k", b"v1");
    assert_eq!(e.get(Cf::Data, b"k").unwrap(), Some(b"v1".to_vec()));
    put(e, Cf::Data, b"k", b"v2");
    assert_eq!(e.get(Cf::Data, b"k").unwrap(), Some(b"v2".to_vec()));
    put(e, Cf::Data, b"empty", b"");
    assert_eq!(
        e.get(Cf::Data, b"empty").unwrap(),
        Some(Vec::new()),
        "empty value != missing"
    );
    let mut b = WriteBatch::new();
    b.delete(Cf::Data, b"k");
    b.delete(Cf::Data, b"never-written");
    e.write(b, false).unwrap();
    assert_eq!(e.get(Cf::Data, b"k").unwrap(), None);
    // An empty batch is fine.
    e.write(WriteBatch::new(), true).unwrap();
}

fn check_batch_order<E: Engine>(e: &E) {
    let mut b = WriteBatch::new();
    b.put(Cf::Data, b"a", b"1");
    b.delete(Cf::Data, b"a");
    b.delete(Cf::Data, b"b");
    b.put(Cf::Data, b"b", b"2");
    b.put(Cf::Data, b"c", b"3");
    b.put(Cf::Data, b"c", b"4");
    b.put(Cf::Data, b"r1", b"x");
    b.delete_range(Cf::Data, b"r", b"s");
    b.put(Cf::Data, b"r2", b"y");
    b.put(Cf::RaftLog, b"log", b"z");
    assert_eq!(b.len(), 10);
    e.write(b, false).unwrap();
    assert_eq!(e.get(Cf::Data, b"a").unwrap(), None, "later delete wins");
    assert_eq!(
        e.get(Cf::Data, b"b").unwrap(),
        Some(b"2".to_vec()),
        "later put wins"
    );
    assert_eq!(e.get(Cf::Data, b"c").unwrap(), Some(b"4".to_vec()));
    assert_eq!(
        e.get(Cf::Data, b"r1").unwrap(),
        None,
        "range delete after put"
    );
    assert_eq!(
        e.get(Cf::Data, b"r2").unwrap(),
        Some(b"y".to_vec()),
        "put after range delete"
    );
    assert_eq!(e.get(Cf::RaftLog, b"log").unwrap(), Some(b"z".to_vec()));
}

fn check_delete_range<E: Engine>(e: &E) {
    for k in [&b"a"[..], b"b", b"b\x00", b"c", b"c\xff", b"d", b"e"] {
        put(e, Cf::Data, k, b"v");
    }
    let mut b = WriteBatch::new();
    b.delete_range(Cf::Data, b"b", b"d");
    // Empty and inverted ranges are no-ops.
    b.delete_range(Cf::Data, b"e", b"e");
    b.delete_range(Cf::Data, b"z", b"a");
    assert_eq!(b.len(), 1);
    e.write(b, false).unwrap();
    assert_eq!(
        scan_all(e, Cf::Data, b"", None, false),
        keys_of(&[b"a", b"d", b"e"])
    );
}

fn check_scan_bounds<E: Engine>(e: &E) {
    let all: [&[u8]; 6] = [b"", b"\x00", b"a", b"ab", b"b", b"\xff\xff"];
    for k in all {
        put(e, Cf::Data, k, k);
    }
    assert_eq!(scan_all(e, Cf::Data, b"", None, false), keys_of(&all));
    let mut rev = keys_of(&all);
    rev.reverse();
    assert_eq!(scan_all(e, Cf::Data, b"", None, true), rev);
    // start inclusive, end exclusive, both directions.
    assert_eq!(
        scan_all(e, Cf::Data, b"a", Some(b"b"), false),
        keys_of(&[b"a", b"ab"])
    );
    assert_eq!(
        scan_all(e, Cf::Data, b"a", Some(b"b"), true),
        keys_of(&[b"ab", b"a"])
    );
    assert_eq!(
        scan_all(e, Cf::Data, b"aa", None, false),
        keys_of(&[b"ab", b"b", b"\xff\xff"])
    );
    assert_eq!(
        scan_all(e, Cf::Data, b"aa", None, true),
        keys_of(&[b"\xff\xff", b"b", b"ab"])
    );
    assert_eq!(
        scan_all(e, Cf::Data, b"", Some(b"a"), true),
        keys_of(&[b"\x00", b""])
    );
    // Empty and inverted ranges.
    assert!(scan_all(e, Cf::Data, b"b", Some(b"b"), false).is_empty());
    assert!(scan_all(e, Cf::Data, b"b", Some(b"a"), true).is_empty());
    assert!(scan_all(e, Cf::Data, b"c", Some(b"d"), false).is_empty());
    // Values come with their keys.
    let rows: Vec<_> = e
        .scan(Cf::Data, b"a", Some(b"b"), false)
        .map(|r| r.unwrap())
        .collect();
    assert_eq!(
        rows,
        vec![
            (b"a".to_vec(), b"a".to_vec()),
            (b"ab".to_vec(), b"ab".to_vec())
        ]
    );
    // An iterator sees writes made before it was created.
    let mut it = e.scan(Cf::Data, b"b", None, false);
    assert_eq!(it.next().unwrap().unwrap().0, b"b".to_vec());
}

fn check_multi_get_order<E: Engine>(e: &E) {
    put(e, Cf::Intents, b"a", b"1");
    put(e, Cf::Intents, b"c", b"3");
    let sorted: [&[u8]; 3] = [b"a", b"b", b"c"];
    assert_eq!(
        e.multi_get(Cf::Intents, &sorted).unwrap(),
        vec![Some(b"1".to_vec()), None, Some(b"3".to_vec())]
    );
    let unsorted: [&[u8]; 5] = [b"c", b"x", b"a", b"c", b""];
    assert_eq!(
        e.multi_get(Cf::Intents, &unsorted).unwrap(),
        vec![
            Some(b"3".to_vec()),
            None,
            Some(b"1".to_vec()),
            Some(b"3".to_vec()),
            None
        ]
    );
    assert!(e.multi_get(Cf::Intents, &[]).unwrap().is_empty());
    // Other families are not consulted.
    assert_eq!(
        e.multi_get(Cf::Data, &sorted).unwrap(),
        vec![None, None, None]
    );
}

fn check_seek_first_many<E: Engine>(e: &E) {
    for k in [&b"b"[..], b"d", b"f"] {
        put(e, Cf::Data, k, k);
    }
    let ranges: [(&[u8], &[u8]); 5] = [
        (b"a", b"c"),
        (b"c", b"d"),
        (b"d", b"d\x00"),
        (b"e", b"z"),
        (b"g", b"z"),
    ];
    let got: Vec<Option<Vec<u8>>> = e
        .seek_first_many(Cf::Data, &ranges)
        .unwrap()
        .into_iter()
        .map(|r| r.map(|(k, _)| k))
        .collect();
    assert_eq!(
        got,
        vec![
            Some(b"b".to_vec()),
            None,
            Some(b"d".to_vec()),
            Some(b"f".to_vec()),
            None
        ]
    );
}

fn check_cross_cf_isolation<E: Engine>(e: &E) {
    let key = keys::raft_log_key(ShardId(1), 1);
    let mut b = WriteBatch::new();
    for cf in Cf::ALL {
        b.put(cf, key.clone(), cf.name());
    }
    e.write(b, false).unwrap();
    for cf in Cf::ALL {
        assert_eq!(
            e.get(cf, &key).unwrap(),
            Some(cf.name().as_bytes().to_vec())
        );
    }
    let mut b = WriteBatch::new();
    b.delete(Cf::Data, key.clone());
    let (s, end) = keys::shard_range(ShardId(1));
    b.delete_range(Cf::RaftLog, s.clone(), end.clone());
    e.write(b, false).unwrap();
    for cf in Cf::ALL {
        let expect = match cf {
            Cf::Data | Cf::RaftLog => None,
            _ => Some(cf.name().as_bytes().to_vec()),
        };
        assert_eq!(e.get(cf, &key).unwrap(), expect, "{cf}");
        let scanned = scan_all(e, cf, &s, Some(&end), false);
        assert_eq!(scanned.len(), usize::from(expect.is_some()), "{cf}");
    }
}

fn check_large_values<E: Engine>(e: &E) {
    let big = vec![0xABu8; 2 * 1024 * 1024];
    let key: Vec<u8> = (0..=255u8).collect();
    put(e, Cf::Data, &key, &big);
    assert_eq!(e.get(Cf::Data, &key).unwrap(), Some(big.clone()));
    let rows: Vec<_> = e
        .scan(Cf::Data, b"", None, false)
        .map(|r| r.unwrap())
        .collect();
    assert_eq!(rows, vec![(key, big)]);
}

fn check_sync_and_flush<E: Engine>(e: &E) {
    let mut b = WriteBatch::new();
    b.put(Cf::RaftLog, keys::raft_log_key(ShardId(2), 7), b"entry");
    e.write(b, true).unwrap();
    e.flush().unwrap();
    put(
        e,
        Cf::RaftLog,
        &keys::raft_log_key(ShardId(2), 8),
        b"entry2",
    );
    assert_eq!(
        e.get(Cf::RaftLog, &keys::raft_log_key(ShardId(2), 7))
            .unwrap(),
        Some(b"entry".to_vec())
    );
    e.flush().unwrap();
    let (s, end) = keys::raft_log_range(ShardId(2));
    assert_eq!(scan_all(e, Cf::RaftLog, &s, Some(&end), false).len(), 2);
}

fn check_cluster_id<E: Engine>(e: &E) {
    assert_eq!(e.read_cluster_id().unwrap(), None);
    e.write_cluster_id("cluster-a").unwrap();
    assert_eq!(e.read_cluster_id().unwrap().as_deref(), Some("cluster-a"));
    e.write_cluster_id("cluster-b").unwrap();
    assert_eq!(e.read_cluster_id().unwrap().as_deref(), Some("cluster-b"));
    // The reserved key is outside every shard range.
    let (s, end) = keys::raft_meta_range(ShardId(keys::MAX_SHARD_ID));
    assert!(scan_all(e, Cf::RaftMeta, &s, Some(&end), false).is_empty());
}

fn check_export_ingest<E: Engine>(make: &impl Fn() -> E) {
    let dir = TempDir::new();
    let file = dir.path.join("shard1.sst");
    let (s1, e1) = keys::shard_range(ShardId(1));
    let source = make();
    let mut b = WriteBatch::new();
    for i in 0..500u32 {
        b.put(
            Cf::Data,
            [s1.as_slice(), &i.to_be_bytes()].concat(),
            format!("v{i}"),
        );
    }
    b.put(Cf::Data, keys::shard_prefix(ShardId(2)), b"other shard");
    b.put(
        Cf::Intents,
        [s1.as_slice(), b"intent"].concat(),
        b"not exported",
    );
    source.write(b, false).unwrap();
    source.flush().unwrap();
    let n = source.export_sst(Cf::Data, &[(&s1, &e1)], &file).unwrap();
    assert_eq!(n, 500);
    assert!(file.exists());

    let target = make();
    let mut b = WriteBatch::new();
    b.put(Cf::Data, [s1.as_slice(), b"stale"].concat(), b"must vanish");
    b.put(
        Cf::Data,
        [s1.as_slice(), &7u32.to_be_bytes()].concat(),
        b"overwritten",
    );
    b.put(Cf::Data, keys::shard_prefix(ShardId(0)), b"shard 0 stays");
    b.put(Cf::Data, keys::shard_prefix(ShardId(2)), b"shard 2 stays");
    b.put(
        Cf::Intents,
        [s1.as_slice(), b"x"].concat(),
        b"other cf stays",
    );
    target.write(b, false).unwrap();
    target
        .ingest_sst(Cf::Data, &[(&s1, &e1)], Some(&file))
        .unwrap();

    let src: Vec<_> = source
        .scan(Cf::Data, &s1, Some(&e1), false)
        .map(|r| r.unwrap())
        .collect();
    let dst: Vec<_> = target
        .scan(Cf::Data, &s1, Some(&e1), false)
        .map(|r| r.unwrap())
        .collect();
    assert_eq!(src.len(), 500);
    assert_eq!(src, dst, "the range is replaced exactly");
    let rev: Vec<_> = target
        .scan(Cf::Data, &s1, Some(&e1), true)
        .map(|r| r.unwrap().0)
        .collect();
    assert_eq!(rev.len(), 500);
    assert_eq!(rev.first(), src.last().map(|(k, _)| k));
    assert_eq!(
        target
            .get(Cf::Data, &keys::shard_prefix(ShardId(0)))
            .unwrap(),
        Some(b"shard 0 stays".to_vec())
    );
    assert_eq!(
        target
            .get(Cf::Data, &keys::shard_prefix(ShardId(2)))
            .unwrap(),
        Some(b"shard 2 stays".to_vec())
    );
    assert_eq!(
        target
            .get(Cf::Intents, &[s1.as_slice(), b"x"].concat())
            .unwrap(),
        Some(b"other cf stays".to_vec())
    );
    // The ingested data is a normal part of the engine afterwards: writes, deletes, flush.
    let mut b = WriteBatch::new();
    b.delete(Cf::Data, src[0].0.clone());
    target.write(b, true).unwrap();
    target.flush().unwrap();
    assert_eq!(target.get(Cf::Data, &src[0].0).unwrap(), None);
    // Ingesting the same file again restores it (re-installing a snapshot is idempotent).
    target
        .ingest_sst(Cf::Data, &[(&s1, &e1)], Some(&file))
        .unwrap();
    assert_eq!(
        target.get(Cf::Data, &src[0].0).unwrap(),
        Some(src[0].1.clone())
    );
}

/// A snapshot is a shard's data span plus its shard-local keys: two ranges in one file. Keys
/// between them belong to other shards and survive the ingest; overlapping or descending
/// ranges are refused.
fn check_export_ingest_two_ranges<E: Engine>(make: &impl Fn() -> E) {
    let dir = TempDir::new();
    let file = dir.path.join("two.sst");
    let (low, high) = (keys::shard_range(ShardId(1)), keys::shard_range(ShardId(3)));
    let gap = keys::shard_prefix(ShardId(2));
    let ranges = [
        (low.0.as_slice(), low.1.as_slice()),
        (high.0.as_slice(), high.1.as_slice()),
    ];
    let source = make();
    put(
        &source,
        Cf::Data,
        &[low.0.as_slice(), b"a"].concat(),
        b"low",
    );
    put(
        &source,
        Cf::Data,
        &[high.0.as_slice(), b"b"].concat(),
        b"high",
    );
    put(&source, Cf::Data, &gap, b"not exported");
    assert_eq!(source.export_sst(Cf::Data, &ranges, &file).unwrap(), 2);

    let target = make();
    put(
        &target,
        Cf::Data,
        &[low.0.as_slice(), b"stale"].concat(),
        b"x",
    );
    put(
        &target,
        Cf::Data,
        &[high.0.as_slice(), b"stale"].concat(),
        b"x",
    );
    put(&target, Cf::Data, &gap, b"the neighbour's");
    target.ingest_sst(Cf::Data, &ranges, Some(&file)).unwrap();
    let pairs = |e: &E| -> Vec<(Vec<u8>, Vec<u8>)> {
        e.scan(Cf::Data, &low.0, Some(&high.1), false)
            .map(|r| r.expect("scan item"))
            .collect()
    };
    let all = pairs(&target);
    let want = vec![
        ([low.0.as_slice(), b"a"].concat(), b"low".to_vec()),
        (gap.clone(), b"the neighbour's".to_vec()),
        ([high.0.as_slice(), b"b"].concat(), b"high".to_vec()),
    ];
    assert_eq!(all, want, "both ranges replaced, the gap untouched");

    let backwards = [ranges[1], ranges[0]];
    assert!(source.export_sst(Cf::Data, &backwards, &file).is_err());
    assert!(target.ingest_sst(Cf::Data, &backwards, None).is_err());
    let overlapping = [(low.0.as_slice(), high.1.as_slice()), ranges[1]];
    assert!(target.ingest_sst(Cf::Data, &overlapping, None).is_err());
    assert_eq!(pairs(&target), want, "a refused call changes nothing");
}

fn check_export_ingest_empty<E: Engine>(make: &impl Fn() -> E) {
    let dir = TempDir::new();
    let file = dir.path.join("empty.sst");
    let (s3, e3) = keys::shard_range(ShardId(3));
    let source = make();
    put(
        &source,
        Cf::Data,
        &keys::shard_prefix(ShardId(4)),
        b"outside",
    );
    assert_eq!(
        source.export_sst(Cf::Data, &[(&s3, &e3)], &file).unwrap(),
        0
    );
    assert!(!file.exists(), "no file for an empty range");
    assert_eq!(
        source.export_sst(Cf::Data, &[(&e3, &s3)], &file).unwrap(),
        0
    );

    let target = make();
    put(&target, Cf::Data, &[s3.as_slice(), b"old"].concat(), b"v");
    put(&target, Cf::Data, &keys::shard_prefix(ShardId(4)), b"kept");
    target.ingest_sst(Cf::Data, &[(&s3, &e3)], None).unwrap();
    assert!(scan_all(&target, Cf::Data, &s3, Some(&e3), false).is_empty());
    assert_eq!(
        target
            .get(Cf::Data, &keys::shard_prefix(ShardId(4)))
            .unwrap(),
        Some(b"kept".to_vec())
    );
}

/// An engine whose power loss can be simulated in-process, for [`run_crash_checks`].
pub trait Crashable: Engine {
    /// Simulates a power loss and restart: writes that are not durable may be lost (those that
    /// survive are a prefix of the write order), and the engine then serves what survived.
    fn crash(&self);
}

/// The crash checks, each pinning down one promise of the durability contract.
pub fn crash_checks<E: Crashable>() -> Vec<Check<E>> {
    vec![
        ("synced_write_survives_crash", check_synced_write_survives),
        (
            "sync_wal_makes_earlier_writes_durable",
            check_sync_wal_durable,
        ),
        ("flush_makes_earlier_writes_durable", check_flush_durable),
        ("unsynced_loss_is_a_prefix", check_unsynced_loss_is_prefix),
        (
            "batch_all_or_nothing_across_crash",
            check_batch_atomic_crash,
        ),
        ("ingest_durable_once_it_returns", check_ingest_durable),
    ]
}

/// Runs every crash check on a fresh engine from `make`; panics (naming the check) on the
/// first violation.
pub fn run_crash_checks<E: Crashable>(make: impl Fn() -> E) {
    for (name, check) in crash_checks::<E>() {
        eprintln!("conformance (crash): {name}");
        let engine = make();
        check(&engine);
    }
}

/// Key `i` of the crash checks: inside shard 7's range in every family.
fn crash_key(i: u64) -> Vec<u8> {
    [keys::shard_prefix(ShardId(7)), i.to_be_bytes().to_vec()].concat()
}

/// The family of write `i` in the crash checks: the prefix property holds across families.
fn crash_cf(i: u64) -> Cf {
    Cf::ALL[(i % Cf::ALL.len() as u64) as usize]
}

fn synced_put(e: &impl Engine, cf: Cf, k: &[u8], v: &[u8]) {
    let mut b = WriteBatch::new();
    b.put(cf, k, v);
    e.write(b, true).expect("synced write");
}

fn check_synced_write_survives<E: Crashable>(e: &E) {
    put(e, Cf::Data, &crash_key(1), b"unsynced, then a synced write");
    synced_put(e, Cf::RaftLog, &crash_key(2), b"synced");
    e.crash();
    assert_eq!(
        e.get(Cf::RaftLog, &crash_key(2)).unwrap(),
        Some(b"synced".to_vec()),
        "a synced write survives a crash"
    );
    assert_eq!(
        e.get(Cf::Data, &crash_key(1)).unwrap(),
        Some(b"unsynced, then a synced write".to_vec()),
        "a synced write makes every earlier write durable"
    );
    // The engine works after a crash, and a second crash keeps everything synced.
    synced_put(e, Cf::RaftMeta, &crash_key(3), b"after the crash");
    e.crash();
    assert_eq!(
        e.get(Cf::RaftMeta, &crash_key(3)).unwrap(),
        Some(b"after the crash".to_vec()),
        "a synced write after a crash survives the next crash"
    );
    assert!(e.get(Cf::RaftLog, &crash_key(2)).unwrap().is_some());
    assert!(e.get(Cf::Data, &crash_key(1)).unwrap().is_some());
}

/// Unsynced puts (across families) and a delete, then `sync_wal` (or `flush`), then a crash:
/// all of them survive.
fn check_made_durable_by<E: Crashable>(e: &E, persist: fn(&E) -> crate::Result<()>, how: &str) {
    synced_put(e, Cf::Data, &crash_key(100), b"deleted before the sync");
    for i in 0..10 {
        put(e, crash_cf(i), &crash_key(i), format!("v{i}").as_bytes());
    }
    let mut b = WriteBatch::new();
    b.delete(Cf::Data, crash_key(100));
    e.write(b, false).unwrap();
    persist(e).unwrap();
    e.crash();
    for i in 0..10 {
        assert_eq!(
            e.get(crash_cf(i), &crash_key(i)).unwrap(),
            Some(format!("v{i}").into_bytes()),
            "unsynced write {i} followed by {how} survives a crash"
        );
    }
    assert_eq!(
        e.get(Cf::Data, &crash_key(100)).unwrap(),
        None,
        "an unsynced delete followed by {how} survives a crash"
    );
}

fn check_sync_wal_durable<E: Crashable>(e: &E) {
    check_made_durable_by(e, |e| e.sync_wal(), "sync_wal");
}

fn check_flush_durable<E: Crashable>(e: &E) {
    check_made_durable_by(e, |e| e.flush(), "flush");
}

/// A synced write, then unsynced puts, overwrites and deletes across families, then a crash:
/// the state is the synced state plus some prefix of the unsynced writes (for plain puts:
/// keys 1..=k survive, for some k).
fn check_unsynced_loss_is_prefix<E: Crashable>(e: &E) {
    const N: u64 = 20;
    // One entry per write: (family, key, value after the write; None = deleted).
    let mut writes: Vec<(Cf, Vec<u8>, Option<Vec<u8>>)> = Vec::new();
    synced_put(e, Cf::Data, &crash_key(0), b"base");
    for i in 1..=N {
        let (cf, key, value) = match i {
            // Write 8 overwrites the synced key, write 15 deletes it.
            8 => (Cf::Data, crash_key(0), Some(b"overwritten".to_vec())),
            15 => (Cf::Data, crash_key(0), None),
            _ => (
                crash_cf(i),
                crash_key(i),
                Some(format!("v{i}").into_bytes()),
            ),
        };
        let mut b = WriteBatch::new();
        match &value {
            Some(v) => b.put(cf, key.clone(), v.clone()),
            None => b.delete(cf, key.clone()),
        }
        e.write(b, false).unwrap();
        writes.push((cf, key, value));
    }
    e.crash();

    let touched: Vec<(Cf, Vec<u8>)> = writes
        .iter()
        .map(|(cf, k, _)| (*cf, k.clone()))
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    let observed: BTreeMap<(Cf, Vec<u8>), Option<Vec<u8>>> = touched
        .iter()
        .map(|(cf, k)| ((*cf, k.clone()), e.get(*cf, k).unwrap()))
        .collect();
    // The state after the first `n` unsynced writes.
    let state_after = |n: usize| {
        let mut state: BTreeMap<(Cf, Vec<u8>), Option<Vec<u8>>> = touched
            .iter()
            .map(|(cf, k)| ((*cf, k.clone()), None))
            .collect();
        state.insert((Cf::Data, crash_key(0)), Some(b"base".to_vec()));
        for (cf, k, v) in &writes[..n] {
            state.insert((*cf, k.clone()), v.clone());
        }
        state
    };
    assert!(
        (0..=writes.len()).any(|n| state_after(n) == observed),
        "after a crash the state is the synced state plus a prefix of the later unsynced \
         writes; after the crash: {observed:?}"
    );
}

/// One unsynced batch across every family (puts, a delete of a synced key, a large value),
/// then a crash: the batch survives whole or not at all.
fn check_batch_atomic_crash<E: Crashable>(e: &E) {
    synced_put(e, Cf::Data, &crash_key(0), b"old");
    let mut b = WriteBatch::new();
    for (i, cf) in Cf::ALL.into_iter().enumerate() {
        b.put(cf, crash_key(10 + i as u64), b"batch");
    }
    b.delete(Cf::Data, crash_key(0));
    b.put(Cf::Intents, crash_key(20), vec![7u8; 256 * 1024]);
    e.write(b, false).unwrap();
    e.crash();
    let mut applied: Vec<bool> = Cf::ALL
        .into_iter()
        .enumerate()
        .map(|(i, cf)| e.get(cf, &crash_key(10 + i as u64)).unwrap().is_some())
        .collect();
    applied.push(e.get(Cf::Data, &crash_key(0)).unwrap().is_none());
    applied.push(e.get(Cf::Intents, &crash_key(20)).unwrap().is_some());
    assert!(
        applied.iter().all(|a| *a) || applied.iter().all(|a| !*a),
        "a batch is all-or-nothing across a crash (and the synced write before it survives); \
         ops applied: {applied:?}"
    );
    assert!(
        e.get(Cf::Intents, &crash_key(20))
            .unwrap()
            .is_none_or(|v| v == vec![7u8; 256 * 1024]),
        "a surviving value is whole"
    );
}

/// `ingest_sst` is durable once it returns, so (the survivors being a prefix) every
/// earlier write is durable too; so is a plain range clear (`path = None`).
fn check_ingest_durable<E: Crashable>(e: &E) {
    let dir = TempDir::new();
    let file = dir.path.join("crash.sst");
    let (start, end) = keys::shard_range(ShardId(8));
    let row_key = |i: u32| [start.as_slice(), &i.to_be_bytes()].concat();
    for i in 0..10 {
        put(e, Cf::Data, &row_key(i), format!("row{i}").as_bytes());
    }
    assert_eq!(
        e.export_sst(Cf::Data, &[(&start, &end)], &file).unwrap(),
        10
    );
    let exported: Vec<_> = e
        .scan(Cf::Data, &start, Some(&end), false)
        .map(|r| r.unwrap())
        .collect();
    // Unsynced changes inside the range (replaced by the ingest) and outside it (kept).
    put(e, Cf::Data, &[start.as_slice(), b"stale"].concat(), b"x");
    let mut b = WriteBatch::new();
    b.delete(Cf::Data, row_key(0));
    e.write(b, false).unwrap();
    put(e, Cf::Intents, &crash_key(1), b"written before the ingest");
    e.ingest_sst(Cf::Data, &[(&start, &end)], Some(&file))
        .unwrap();
    e.crash();
    let after: Vec<_> = e
        .scan(Cf::Data, &start, Some(&end), false)
        .map(|r| r.unwrap())
        .collect();
    assert_eq!(
        after, exported,
        "an ingest survives a crash once it returns"
    );
    assert_eq!(
        e.get(Cf::Intents, &crash_key(1)).unwrap(),
        Some(b"written before the ingest".to_vec()),
        "a write before a durable ingest survives a crash"
    );
    e.ingest_sst(Cf::Data, &[(&start, &end)], None).unwrap();
    e.crash();
    assert!(
        scan_all(e, Cf::Data, &start, Some(&end), false).is_empty(),
        "a range clear survives a crash once it returns"
    );
}

/// A scratch directory removed on drop (the `testing` feature cannot use dev-dependencies).
pub struct TempDir {
    pub path: PathBuf,
}

impl TempDir {
    pub fn new() -> TempDir {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let path = std::env::temp_dir().join(format!(
            "meridian-storage-{}-{}-{nanos}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&path).expect("create scratch dir");
        TempDir { path }
    }
}

impl Default for TempDir {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}
