//! MVCC visibility against a simple model, on both engines.
//!
//! Random histories of puts and deletes on a few adversarial keys, applied in non-decreasing
//! timestamp order (the writers' precondition: the Raft state machine assigns increasing
//! per-shard timestamps; repeats of one timestamp are allowed and the last write wins), with
//! timestamps up to the largest a version may carry (`Timestamp::MAX - 1`). Then every read
//! API at read timestamps below, between, at and above the versions (including
//! `Timestamp::MAX`, the slot's own timestamp) is compared with a
//! `BTreeMap<key, BTreeMap<ts, Option<value>>>` model: `get` and `multi_get` (exact-key slot
//! path and seek fallback), `latest_version_ts`, and paged forward and reverse scans stitched
//! together through `resume_key`, which must never surface a latest-version slot as a row,
//! and the snapshot reads' windowed scans (forward and reverse: the same rows, and the newest
//! version inside the uncertainty window).
//! Finally the raw layout: one slot per written key, holding a copy of its newest version.

use meridian_storage::mvcc::{self, ScanPage, VersionValue};
use meridian_storage::{keys, Cf, Engine, EngineOptions, MemoryEngine, RocksEngine, WriteBatch};
use meridian_types::{ShardId, Timestamp};
use proptest::prelude::*;
use std::collections::BTreeMap;
use std::sync::OnceLock;

type Model = BTreeMap<Vec<u8>, BTreeMap<u64, Option<Vec<u8>>>>;
type Row = (Vec<u8>, Timestamp, Vec<u8>);

/// Keys chosen to stress the encoding: the empty key (the API refuses it, storage does not),
/// 0x00 alone and inside, prefixes of each other, 0xFF.
const KEYS: [&[u8]; 7] = [b"", b"\x00", b"\x00\x00", b"a", b"a\x00", b"ab", b"\xff"];

#[derive(Clone, Debug)]
struct Op {
    key: usize,
    ts: u64,
    value: Option<u8>,
}

/// The largest timestamp a version may carry.
const TS_TOP: u64 = u64::MAX - 1;

fn op() -> impl Strategy<Value = Op> {
    (
        0..KEYS.len(),
        prop_oneof![12 => 1u64..12, 1 => Just(TS_TOP)],
        proptest::option::weighted(0.75, any::<u8>()),
    )
        .prop_map(|(key, ts, value)| Op { key, ts, value })
}

fn visible(model: &Model, key: &[u8], read_ts: u64) -> Option<(Timestamp, Vec<u8>)> {
    let (ts, v) = model.get(key)?.range(..=read_ts).next_back()?;
    v.as_ref().map(|v| (Timestamp(*ts), v.clone()))
}

fn model_scan(
    model: &Model,
    start: &[u8],
    end: Option<&[u8]>,
    read_ts: u64,
    reverse: bool,
) -> Vec<Row> {
    let mut rows: Vec<Row> = model
        .keys()
        .filter(|k| k.as_slice() >= start && end.is_none_or(|e| k.as_slice() < e))
        .filter_map(|k| visible(model, k, read_ts).map(|(ts, v)| (k.clone(), ts, v)))
        .collect();
    if reverse {
        rows.reverse();
    }
    rows
}

fn paged_scan(
    e: &dyn Engine,
    shard: ShardId,
    start: &[u8],
    end: Option<&[u8]>,
    read_ts: Timestamp,
    limit: usize,
    reverse: bool,
) -> Vec<Row> {
    let (mut start, mut end) = (start.to_vec(), end.map(|e| e.to_vec()));
    let mut out = Vec::new();
    for _ in 0..=KEYS.len() + 1 {
        let ScanPage { rows, resume_key } =
            mvcc::scan(e, shard, &start, end.as_deref(), read_ts, limit, reverse).unwrap();
        assert!(rows.len() <= limit);
        out.extend(rows);
        match resume_key {
            None => return out,
            Some(k) if reverse => end = Some(k),
            Some(k) => start = k,
        }
    }
    panic!("scan did not finish");
}

fn check_history(e: &dyn Engine, shard: ShardId, ops: &[Op], limit: usize, bounds: (usize, usize)) {
    // Writers apply versions in non-decreasing timestamp order; a stable sort keeps the order
    // of same-timestamp writes, so the later one wins in the engine and in the model alike.
    let mut ops = ops.to_vec();
    ops.sort_by_key(|op| op.ts);
    let mut model = Model::new();
    for chunk in ops.chunks(3) {
        let mut batch = WriteBatch::new();
        for op in chunk {
            let key = KEYS[op.key];
            let ts = Timestamp(op.ts);
            match op.value {
                Some(v) => mvcc::put(&mut batch, shard, key, ts, &[v]),
                None => mvcc::delete(&mut batch, shard, key, ts),
            }
            model
                .entry(key.to_vec())
                .or_default()
                .insert(op.ts, op.value.map(|v| vec![v]));
        }
        e.write(batch, false).unwrap();
    }
    let (lo, hi) = (bounds.0.min(bounds.1), bounds.0.max(bounds.1));
    let start = KEYS[lo];
    let end = if hi == lo { None } else { Some(KEYS[hi]) };
    let read_tss = (0..14u64).chain([TS_TOP - 1, TS_TOP, u64::MAX]);
    for read_ts in read_tss {
        let rts = Timestamp(read_ts);
        for key in KEYS {
            assert_eq!(
                mvcc::get(e, shard, key, rts).unwrap(),
                visible(&model, key, read_ts),
                "get {key:?}@{read_ts}"
            );
        }
        // Unsorted, with duplicates, and (below) every subset shape from one key to all.
        let query: Vec<&[u8]> = KEYS
            .iter()
            .rev()
            .chain(KEYS.iter().take(2))
            .copied()
            .collect();
        for len in [1, 3, query.len()] {
            let query = &query[query.len() - len..];
            let expect: Vec<_> = query.iter().map(|k| visible(&model, k, read_ts)).collect();
            assert_eq!(
                mvcc::multi_get(e, shard, query, rts).unwrap(),
                expect,
                "multi_get {query:?}@{read_ts}"
            );
        }
        for reverse in [false, true] {
            let want = model_scan(&model, start, end, read_ts, reverse);
            let got = paged_scan(e, shard, start, end, rts, limit, reverse);
            assert_eq!(
                got, want,
                "scan reverse={reverse} @{read_ts} limit={limit} [{start:?},{end:?})"
            );
        }
        // A snapshot read's windowed scan, one page of it: the same rows, and the newest version
        // (tombstones too) above read_ts and at or below the window's end of every key it
        // decided.
        for width in [0u64, 2, 5] {
            let window_end = read_ts.saturating_add(width);
            let in_range =
                |k: &Vec<u8>| k.as_slice() >= start && end.is_none_or(|e| k.as_slice() < e);
            let want_uncertain = model
                .iter()
                .filter(|(k, _)| in_range(k))
                .flat_map(|(_, versions)| versions.keys().copied())
                .filter(|ts| *ts > read_ts && *ts <= window_end)
                .max()
                .map(Timestamp);
            let window_max = |within: &dyn Fn(&[u8]) -> bool| {
                model
                    .iter()
                    .filter(|(k, _)| in_range(k) && within(k))
                    .flat_map(|(_, versions)| versions.keys().copied())
                    .filter(|ts| *ts > read_ts && *ts <= window_end)
                    .max()
                    .map(Timestamp)
            };
            for (reverse, page_limit) in [false, true]
                .into_iter()
                .flat_map(|r| [(r, limit), (r, KEYS.len() + 1)])
            {
                let (page, uncertain) = mvcc::scan_in_window(
                    e,
                    shard,
                    (start, end),
                    (rts, Timestamp(window_end)),
                    page_limit,
                    reverse,
                )
                .unwrap();
                let what = format!(
                    "windowed scan reverse={reverse} limit={page_limit} ({read_ts}, {window_end}]"
                );
                let want = model_scan(&model, start, end, read_ts, reverse);
                assert_eq!(page.rows, want[..want.len().min(page_limit)], "{what}");
                // Every key the page decided (before its resume key, or at and after it in
                // reverse) must have its window versions reported; nothing is reported beyond
                // the range's own newest one. A whole range must be exact.
                let decided = |k: &[u8]| match (&page.resume_key, reverse) {
                    (None, _) => true,
                    (Some(r), false) => k < r.as_slice(),
                    (Some(r), true) => k >= r.as_slice(),
                };
                let must = window_max(&decided);
                assert!(uncertain >= must, "{what}: {uncertain:?} misses {must:?}");
                assert!(uncertain <= want_uncertain, "{what}: {uncertain:?}");
                if page.resume_key.is_none() {
                    assert_eq!(uncertain, want_uncertain, "{what}");
                }
            }
        }
    }
    for key in KEYS {
        let want = model
            .get(key)
            .and_then(|vs| vs.keys().next_back().copied())
            .map(Timestamp);
        assert_eq!(mvcc::latest_version_ts(e, shard, key).unwrap(), want);
    }
    // Raw layout: each written key has exactly one slot, first in its range, holding its
    // newest version's timestamp and a byte-identical copy of that version's value, plus one
    // entry per distinct version timestamp; nothing else is in the keyspace.
    let (start, end) = keys::Keyspace::from(shard).range();
    let raw: Vec<(Vec<u8>, Vec<u8>)> = e
        .scan(Cf::Data, &start, Some(&end), false)
        .map(|r| r.unwrap())
        .collect();
    let slots = raw
        .iter()
        .filter(|(k, _)| keys::is_slot_ts(keys::split_data_key(k).unwrap().1))
        .count();
    let versions: usize = model.values().map(BTreeMap::len).sum();
    assert_eq!((slots, raw.len() - slots), (model.len(), versions));
    for (key, history) in &model {
        let (vs, ve) = keys::data_key_versions_range(shard, key);
        let mut entries = raw.iter().filter(|(k, _)| *k >= vs && *k < ve);
        let (slot_key, slot_value) = entries.next().unwrap();
        assert_eq!(*slot_key, keys::data_slot_key(shard, key));
        let (newest, value) = history.iter().next_back().unwrap();
        let want = match value {
            Some(v) => VersionValue::Put(v.clone()),
            None => VersionValue::Tombstone,
        };
        assert_eq!(
            mvcc::decode_slot(slot_value).unwrap(),
            (Timestamp(*newest), want.clone())
        );
        // Versions follow newest first; the first is the one the slot copies.
        let (version_key, version_value) = entries.next().unwrap();
        assert_eq!(*version_key, keys::data_key(shard, key, Timestamp(*newest)));
        assert_eq!(VersionValue::decode(version_value).unwrap(), want);
    }
}

/// One RocksDB for all cases (opening one per case is slow); each case clears the user
/// keyspace first.
fn rocks() -> &'static (RocksEngine, tempfile::TempDir) {
    static ENGINE: OnceLock<(RocksEngine, tempfile::TempDir)> = OnceLock::new();
    ENGINE.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let opts = EngineOptions {
            block_cache_bytes: 8 << 20,
            write_buffer_bytes: 4 << 20,
            ..EngineOptions::default()
        };
        (RocksEngine::open(dir.path(), &opts).unwrap(), dir)
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// MemoryEngine: MVCC reads match the model.
    #[test]
    fn mvcc_matches_model_memory(ops in proptest::collection::vec(op(), 0..24), limit in 1usize..4, bounds in (0..KEYS.len(), 0..KEYS.len())) {
        let e = MemoryEngine::new();
        check_history(&e, ShardId(1), &ops, limit, bounds);
    }

    /// RocksEngine: MVCC reads match the model.
    #[test]
    fn mvcc_matches_model_rocks(ops in proptest::collection::vec(op(), 0..24), limit in 1usize..4, bounds in (0..KEYS.len(), 0..KEYS.len())) {
        let e = &rocks().0;
        let (start, end) = keys::Keyspace::User.range();
        e.ingest_sst(Cf::Data, &[(&start, &end)], None).unwrap();
        check_history(e, ShardId(1), &ops, limit, bounds);
    }
}
