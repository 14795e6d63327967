//! Unit tests of `mvcc`: the value encodings, point reads (results and the engine calls they
//! make), scans (slots never returned, paging by budget) and the writers' `MAX` assertion.

use super::encoding::{encode_slot, SLOT_HEADER_BYTES, TAG_LATEST, TAG_SLOT_V2, TAG_TOMBSTONE};
use super::*;
use crate::engine::{Cf, Engine, KvIter, KvPair, WriteBatch};
use crate::error::{Error, Result};
use crate::keys;
use crate::{KeyRange, MemoryEngine};
use meridian_types::{ShardId, Timestamp};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};

#[test]
fn version_value_round_trips_and_rejects_garbage() {
    for v in [
        VersionValue::Put(vec![]),
        VersionValue::Put(b"x".to_vec()),
        VersionValue::Tombstone,
    ] {
        assert_eq!(VersionValue::decode(&v.encode()).unwrap(), v);
    }
    assert!(VersionValue::decode(&[]).is_err());
    assert!(VersionValue::decode(&[5, 1]).is_err());
    assert!(VersionValue::decode(&[TAG_TOMBSTONE, 0]).is_err());
    // A slot value (either format) is never mistaken for a version.
    let slot = encode_slot(Timestamp(7), &VersionValue::Put(b"x".to_vec()).encode());
    assert!(VersionValue::decode(&slot).is_err());
    assert!(VersionValue::decode(&[TAG_SLOT_V2, 0, 0, 0, 0, 0, 0, 0, 7]).is_err());
}

/// Slot values round-trip and are told apart from versions, format-2 slots, wrong
/// lengths, bad embedded versions and MAX.
#[test]
fn slot_value_round_trips_and_rejects_garbage() {
    for ts in [0, 1, 30, keys::MAX_VERSION_TS.0] {
        for v in [
            VersionValue::Put(vec![]),
            VersionValue::Put(b"value".to_vec()),
            VersionValue::Put(vec![TAG_LATEST; 9]),
            VersionValue::Tombstone,
        ] {
            let version = v.encode();
            let raw = encode_slot(Timestamp(ts), &version);
            assert_eq!(raw.len(), SLOT_HEADER_BYTES + version.len());
            assert_eq!(decode_slot(&raw).unwrap(), (Timestamp(ts), v));
        }
    }
    let put = VersionValue::Put(b"v".to_vec()).encode();
    assert!(decode_slot(&[]).is_err());
    assert!(decode_slot(&[TAG_LATEST, 0, 0]).is_err());
    // Header but no version encoding.
    assert!(decode_slot(&[TAG_LATEST, 0, 0, 0, 0, 0, 0, 0, 7]).is_err());
    // The embedded version must itself be valid (and not another slot).
    assert!(decode_slot(&encode_slot(Timestamp(7), &[TAG_TOMBSTONE, 0])).is_err());
    assert!(decode_slot(&encode_slot(Timestamp(7), &[9])).is_err());
    let nested = encode_slot(Timestamp(7), &put);
    assert!(decode_slot(&encode_slot(Timestamp(7), &nested)).is_err());
    assert!(decode_slot(&encode_slot(Timestamp::MAX, &put)).is_err());
    // A format-2 slot (tag 3, timestamp only) is refused with a message saying so.
    let err = decode_slot(&[TAG_SLOT_V2, 0, 0, 0, 0, 0, 0, 0, 7]).unwrap_err();
    assert!(err.to_string().contains("format-2"), "{err}");
    assert!(decode_slot(&put).is_err());
    assert!(decode_slot(&VersionValue::Tombstone.encode()).is_err());
}

#[test]
fn get_follows_the_doc_example() {
    let e = MemoryEngine::new();
    let s = ShardId(1);
    let mut b = WriteBatch::new();
    put(&mut b, s, b"k", Timestamp(10), b"a");
    delete(&mut b, s, b"k", Timestamp(20));
    put(&mut b, s, b"k", Timestamp(30), b"c");
    e.write(b, false).unwrap();
    assert_eq!(
        get(&e, s, b"k", Timestamp(35)).unwrap(),
        Some((Timestamp(30), b"c".to_vec()))
    );
    assert_eq!(get(&e, s, b"k", Timestamp(25)).unwrap(), None);
    assert_eq!(
        get(&e, s, b"k", Timestamp(15)).unwrap(),
        Some((Timestamp(10), b"a".to_vec()))
    );
    assert_eq!(get(&e, s, b"k", Timestamp(5)).unwrap(), None);
    assert_eq!(latest_version_ts(&e, s, b"k").unwrap(), Some(Timestamp(30)));
    assert_eq!(latest_version_ts(&e, s, b"k2").unwrap(), None);
    // Another data shard shares the user keyspace; the metadata shard's is its own.
    assert!(get(&e, ShardId(2), b"k", Timestamp::MAX).unwrap().is_some());
    assert_eq!(get(&e, ShardId::META, b"k", Timestamp::MAX).unwrap(), None);
    // The slot is stored as the doc diagram shows: first in the key's range, naming 30.
    let (start, end) = keys::data_key_versions_range(s, b"k");
    let (first_key, first_value) = e
        .scan(Cf::Data, &start, Some(&end), false)
        .next()
        .unwrap()
        .unwrap();
    assert_eq!(first_key, keys::data_slot_key(s, b"k"));
    assert_eq!(
        decode_slot(&first_value).unwrap(),
        (Timestamp(30), VersionValue::Put(b"c".to_vec()))
    );
}

#[test]
fn a_scan_page_stops_at_its_budget_and_resumes_without_losing_keys() {
    // 20 deleted keys then 3 live ones: a page with a small budget returns early (no rows)
    // with a resume key, and paging on finds exactly the live keys, both directions.
    let e = MemoryEngine::new();
    let shard = ShardId(1);
    let mut b = WriteBatch::new();
    for i in 0..20 {
        let key = format!("dead{i:02}");
        put(&mut b, shard, key.as_bytes(), Timestamp(10), b"x");
        delete(&mut b, shard, key.as_bytes(), Timestamp(11));
    }
    for key in ["live1", "live2", "live3"] {
        put(&mut b, shard, key.as_bytes(), Timestamp(12), b"y");
    }
    e.write(b, false).unwrap();
    for reverse in [false, true] {
        let (mut start, mut end) = (b"".to_vec(), None::<Vec<u8>>);
        let mut found = Vec::new();
        let mut pages = 0;
        loop {
            pages += 1;
            assert!(pages < 100, "paging does not progress");
            let page = scan_with_budget(
                &e,
                shard,
                (&start, end.as_deref()),
                Timestamp(20),
                10,
                reverse,
                8,
            )
            .unwrap();
            found.extend(page.rows.iter().map(|(k, _, _)| k.clone()));
            match page.resume_key {
                Some(k) if reverse => end = Some(k),
                Some(k) => start = k,
                None => break,
            }
        }
        let mut want: Vec<Vec<u8>> = ["live1", "live2", "live3"]
            .iter()
            .map(|k| k.as_bytes().to_vec())
            .collect();
        if reverse {
            want.reverse();
        }
        assert_eq!(found, want, "reverse = {reverse}");
        assert!(
            pages > 2,
            "the budget split the scan (reverse = {reverse}): {pages} pages"
        );
    }
}

/// Scans at `Timestamp::MAX` (where `ts > read_ts` skips nothing) never return slots.
#[test]
fn scans_at_max_skip_slots() {
    let e = MemoryEngine::new();
    let s = ShardId(1);
    let mut b = WriteBatch::new();
    put(&mut b, s, b"a", Timestamp(1), b"1");
    put(&mut b, s, b"b", Timestamp(2), b"2");
    delete(&mut b, s, b"b", Timestamp(3));
    put(&mut b, s, b"c", Timestamp(4), b"3");
    e.write(b, false).unwrap();
    for reverse in [false, true] {
        let page = scan(&e, s, b"", None, Timestamp::MAX, 10, reverse).unwrap();
        let mut want = vec![
            (b"a".to_vec(), Timestamp(1), b"1".to_vec()),
            (b"c".to_vec(), Timestamp(4), b"3".to_vec()),
        ];
        if reverse {
            want.reverse();
        }
        assert_eq!(page.rows, want, "reverse={reverse}");
    }
}

/// A version at `Timestamp::MAX` would overwrite the slot, so it is refused.
#[test]
#[should_panic(expected = "reserved for the latest-version slot")]
fn put_at_max_panics() {
    let mut b = WriteBatch::new();
    put(&mut b, ShardId(1), b"k", Timestamp::MAX, b"v");
}

/// A bad slot (format-2 tag 3, truncated, bad embedded version) is reported as
/// corruption by every reader, at and below its timestamp, never read as `None`.
#[test]
fn corrupt_slots_are_corrupt_for_every_reader() {
    let put = VersionValue::Put(b"v".to_vec()).encode();
    for bad in [
        vec![TAG_SLOT_V2, 0, 0, 0, 0, 0, 0, 0, 5],
        vec![TAG_LATEST, 0, 0, 0, 0, 0, 0, 0, 5],
        encode_slot(Timestamp(5), &[TAG_TOMBSTONE, 1]),
        put.clone(),
    ] {
        let e = MemoryEngine::new();
        let s = ShardId(1);
        let mut b = WriteBatch::new();
        b.put(Cf::Data, keys::data_key(s, b"k", Timestamp(5)), put.clone());
        b.put(Cf::Data, keys::data_slot_key(s, b"k"), bad.clone());
        e.write(b, false).unwrap();
        for read_ts in [Timestamp(9), Timestamp(1)] {
            assert!(
                matches!(get(&e, s, b"k", read_ts), Err(Error::Corrupt { .. })),
                "get {bad:?}@{read_ts:?}"
            );
            assert!(
                matches!(
                    multi_get(&e, s, &[b"k"], read_ts),
                    Err(Error::Corrupt { .. })
                ),
                "multi_get {bad:?}@{read_ts:?}"
            );
        }
        assert!(matches!(
            latest_version_ts(&e, s, b"k"),
            Err(Error::Corrupt { .. })
        ));
    }
}

/// Counts the engine calls MVCC reads make; delegates everything to a MemoryEngine.
#[derive(Default)]
struct CountingEngine {
    inner: MemoryEngine,
    gets: AtomicUsize,
    multi_gets: AtomicUsize,
    multi_get_keys: AtomicUsize,
    scans: AtomicUsize,
    seek_ranges: AtomicUsize,
    seek_calls: AtomicUsize,
}

impl CountingEngine {
    /// `(gets, multi_gets, multi_get_keys, scans, seek_calls, seek_ranges)` since the
    /// last call, then resets.
    fn take(&self) -> [usize; 6] {
        [
            &self.gets,
            &self.multi_gets,
            &self.multi_get_keys,
            &self.scans,
            &self.seek_calls,
            &self.seek_ranges,
        ]
        .map(|c| c.swap(0, Ordering::Relaxed))
    }
}

impl Engine for CountingEngine {
    fn get(&self, cf: Cf, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.gets.fetch_add(1, Ordering::Relaxed);
        self.inner.get(cf, key)
    }
    fn multi_get(&self, cf: Cf, keys: &[&[u8]]) -> Result<Vec<Option<Vec<u8>>>> {
        assert!(
            keys.windows(2).all(|w| w[0] <= w[1]),
            "mvcc passes MultiGet keys sorted"
        );
        self.multi_gets.fetch_add(1, Ordering::Relaxed);
        self.multi_get_keys.fetch_add(keys.len(), Ordering::Relaxed);
        self.inner.multi_get(cf, keys)
    }
    fn scan<'a>(&'a self, cf: Cf, start: &[u8], end: Option<&[u8]>, reverse: bool) -> KvIter<'a> {
        self.scans.fetch_add(1, Ordering::Relaxed);
        self.inner.scan(cf, start, end, reverse)
    }
    fn seek_first_many(&self, cf: Cf, ranges: &[(&[u8], &[u8])]) -> Result<Vec<Option<KvPair>>> {
        self.seek_calls.fetch_add(1, Ordering::Relaxed);
        self.seek_ranges.fetch_add(ranges.len(), Ordering::Relaxed);
        self.inner.seek_first_many(cf, ranges)
    }
    fn write(&self, batch: WriteBatch, sync: bool) -> Result<()> {
        self.inner.write(batch, sync)
    }
    fn flush(&self) -> Result<()> {
        self.inner.flush()
    }
    fn export_sst(&self, cf: Cf, ranges: &[KeyRange<'_>], path: &Path) -> Result<u64> {
        self.inner.export_sst(cf, ranges, path)
    }
    fn ingest_sst(&self, cf: Cf, ranges: &[KeyRange<'_>], path: Option<&Path>) -> Result<()> {
        self.inner.ingest_sst(cf, ranges, path)
    }
}

/// Reads at or above the newest versions are answered by the slots alone: one MultiGet
/// (or one point get) and no iterator; only keys written after `read_ts` seek.
#[test]
fn reads_at_or_above_newest_are_one_lookup() {
    let e = CountingEngine::default();
    let s = ShardId(1);
    let mut b = WriteBatch::new();
    put(&mut b, s, b"a", Timestamp(10), b"a10");
    put(&mut b, s, b"b", Timestamp(11), b"b11");
    put(&mut b, s, b"c", Timestamp(12), b"c12");
    delete(&mut b, s, b"c", Timestamp(13));
    put(&mut b, s, b"a", Timestamp(20), b"a20");
    e.write(b, false).unwrap();
    let query: [&[u8]; 6] = [b"c", b"missing", b"a", b"b", b"a", b""];

    for read_ts in [Timestamp(20), Timestamp(1_000), Timestamp::MAX] {
        let got = multi_get(&e, s, &query, read_ts).unwrap();
        let a = Some((Timestamp(20), b"a20".to_vec()));
        let b_ = Some((Timestamp(11), b"b11".to_vec()));
        assert_eq!(got, vec![None, None, a.clone(), b_, a, None]);
        // One MultiGet of the 6 slots answers everything (c's slot holds its tombstone).
        assert_eq!(e.take(), [0, 1, 6, 0, 0, 0], "multi_get@{read_ts:?}");

        assert_eq!(
            get(&e, s, b"b", read_ts).unwrap(),
            Some((Timestamp(11), b"b11".to_vec()))
        );
        assert_eq!(e.take(), [1, 0, 0, 0, 0, 0], "get@{read_ts:?}");
        assert_eq!(get(&e, s, b"c", read_ts).unwrap(), None);
        assert_eq!(e.take(), [1, 0, 0, 0, 0, 0], "get tombstone@{read_ts:?}");
        assert_eq!(get(&e, s, b"missing", read_ts).unwrap(), None);
        assert_eq!(e.take(), [1, 0, 0, 0, 0, 0], "get missing@{read_ts:?}");
    }

    // At 15, only "a" (newest 20) was written since: one seek range, for it alone.
    let got = multi_get(&e, s, &query, Timestamp(15)).unwrap();
    let a = Some((Timestamp(10), b"a10".to_vec()));
    let b_ = Some((Timestamp(11), b"b11".to_vec()));
    assert_eq!(got, vec![None, None, a.clone(), b_, a, None]);
    // One MultiGet of the 6 slots, then one seek call with a range per "a" in the query.
    assert_eq!(e.take(), [0, 1, 6, 0, 1, 2]);
    assert_eq!(
        get(&e, s, b"a", Timestamp(15)).unwrap(),
        Some((Timestamp(10), b"a10".to_vec()))
    );
    assert_eq!(e.take(), [1, 0, 0, 1, 0, 0]);

    // Nothing to read: no engine call at all.
    assert_eq!(multi_get(&e, s, &[], Timestamp::MAX).unwrap(), vec![]);
    assert_eq!(e.take(), [0; 6]);
    assert_eq!(latest_version_ts(&e, s, b"a").unwrap(), Some(Timestamp(20)));
    assert_eq!(e.take(), [1, 0, 0, 0, 0, 0]);
}
