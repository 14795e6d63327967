//! Garbage collection of old MVCC versions below a *GC threshold*.
//!
//! Every write adds a version (see `mvcc`), so a key updated a million times holds a million
//! versions until something removes them. History is only needed for reads in the past:
//! transactions' snapshot reads, at most a few seconds old. GC picks a threshold `T` (the
//! shard's leader proposes `now - gc_ttl`, see `meridian-raft`'s `Command::Gc`) and removes
//! every version that no read at or above `T` can see.
//!
//! # What is removed
//! Per user key, versions newest first, the *keeper* is the first version with `ts <= T`: the
//! one a read at any timestamp in `[T, next newer version)` returns. Then:
//! - every version older than the keeper is removed (no read at `>= T` reaches past it);
//! - a keeper that is a tombstone is removed too (with nothing older left, a read there finds
//!   nothing, which reads the same as the tombstone);
//! - a key whose keeper is a tombstone *and* which has no version above `T` is removed whole,
//!   latest-version slot included (it reads as never written, the same as deleted).
//!
//! ```text
//!   before, T = 25                         after
//!   k  slot → 30 Put("c")                  k  slot → 30 Put("c")
//!   k  !30  Put("c")                       k  !30  Put("c")
//!   k  !20  Put("b")   ← keeper            k  !20  Put("b")
//!   k  !10  Put("a")   ← removed
//!   j  slot → 20 Tombstone                 (j removed whole)
//!   j  !20  Tombstone  ← keeper
//!   j  !10  Put("x")   ← removed
//! ```
//!
//! # Invariants (what makes this safe)
//! - **Every read at `read_ts >= T` returns after GC exactly what it returned before**: point
//!   reads, batched reads and scans, forward and reverse (property-tested below against a
//!   model of the full history). Reads below `T` are *not* answered correctly any more; the
//!   caller must refuse them (the shard records its threshold and its readers check it).
//! - The newest state of every key is unchanged, up to a tombstone becoming "never written",
//!   which reads the same: a compare-and-swap or a transaction's read check (which compare
//!   newest versions) reaches the same verdict before and after GC.
//! - The slot invariant of `mvcc` holds: a key keeps its slot exactly as long as it keeps a
//!   version (the slot goes only with the key's last version).
//! - Work per call is bounded: [`gc_page`] examines at most `budget` stored entries (at least
//!   one version, so a page always makes progress) and returns a [`GcCursor`] to resume from,
//!   which may sit in the middle of one key's versions. A resumed page knows whether the
//!   key's keeper is behind it from the cursor alone: the keeper was passed iff the last
//!   version examined had `ts <= T`.
//! - A page never leaves its span (a shard's keys: data shards share one keyspace), whatever
//!   its resume cursor says.
//! - A page only reads the engine and adds deletes to the caller's batch: it must see every
//!   write applied before it (the Raft state machine applies a GC command on its own, after
//!   writing the batch before it), and writes after it in the same batch win (a later put of
//!   a removed key writes its slot again after the delete).
//!
//! # Not done yet
//! - A full pass examines every stored entry of the span, garbage or not; there are no
//!   per-shard statistics (live vs. total bytes) to skip shards or spans with little garbage.
//! - Deletes are point deletes, one per version (RocksDB drops them at compaction); a key with
//!   very many versions could use one range delete instead.

use crate::engine::{Cf, Engine, WriteBatch};
use crate::error::Result;
use crate::keys::{self, Span};
use crate::mvcc::{decode_user_key, decode_version_ref};
use meridian_types::Timestamp;

/// Default budget of a [`gc_page`]: entries examined per page (one Raft command's work).
pub const GC_PAGE_ENTRIES: usize = 4096;

/// Where a GC pass resumes: after version `ts` of user key `key`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GcCursor {
    pub key: Vec<u8>,
    pub ts: Timestamp,
}

/// What one [`gc_page`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GcPage {
    /// `None`: the pass reached the end of the shard.
    pub resume: Option<GcCursor>,
    /// Versions deleted (tombstones included, slots not counted).
    pub versions_deleted: u64,
    /// User keys removed whole (their slot with them).
    pub keys_deleted: u64,
    /// Stored entries examined (versions and slots).
    pub examined: u64,
}

/// The per-key state of a pass.
struct KeyState {
    prefix: Vec<u8>,
    /// A version with `ts <= threshold` (the keeper) was examined.
    passed_keeper: bool,
    /// A version with `ts > threshold` was examined (or lies before the resume point).
    had_newer: bool,
}

/// Adds to `batch` the deletes of one page of the garbage below `threshold` among the keys of
/// `span` (a shard's; see the module docs), starting at the beginning of the span or after
/// `from`.
pub fn gc_page(
    engine: &dyn Engine,
    batch: &mut WriteBatch,
    span: &Span,
    threshold: Timestamp,
    from: Option<&GcCursor>,
    budget: usize,
) -> Result<GcPage> {
    let budget = budget.max(1);
    let (span_start, upper) = span.data_range();
    let lower = match from {
        None => span_start.clone(),
        // Versions below `ts` sort after it (inverted timestamps); at ts 0 nothing is below.
        Some(c) if c.ts.0 > 0 => keys::data_key(span.space, &c.key, Timestamp(c.ts.0 - 1)),
        Some(c) => keys::data_key_versions_range(span.space, &c.key).1,
    };
    // A cursor from before the span (a malformed command) must not reach a neighbour's keys.
    let lower = lower.max(span_start);
    let mut state = from.map(|c| KeyState {
        prefix: keys::data_key_seek(span.space, &c.key),
        passed_keeper: c.ts <= threshold,
        had_newer: true,
    });
    let mut page = GcPage::default();
    // The last version examined: where the next page resumes.
    let mut last: Option<(Vec<u8>, Timestamp)> = None;
    for item in engine.scan(Cf::Data, &lower, Some(&upper), false) {
        let (k, raw) = item?;
        if page.examined >= budget as u64 && last.is_some() {
            let (prefix, ts) = last.take().expect("checked");
            page.resume = Some(GcCursor {
                key: decode_user_key(&prefix)?,
                ts,
            });
            return Ok(page);
        }
        page.examined += 1;
        let (prefix, ts) = keys::split_data_key(&k)?;
        if state.as_ref().is_none_or(|s| s.prefix != prefix) {
            state = Some(KeyState {
                prefix: prefix.to_vec(),
                passed_keeper: false,
                had_newer: false,
            });
        }
        let key = state.as_mut().expect("set above");
        if keys::is_slot_ts(ts) {
            continue;
        }
        if ts > threshold {
            key.had_newer = true;
        } else if key.passed_keeper {
            batch.delete(Cf::Data, k.to_vec());
            page.versions_deleted += 1;
        } else {
            key.passed_keeper = true;
            if decode_version_ref(&raw)?.is_none() {
                batch.delete(Cf::Data, k.to_vec());
                page.versions_deleted += 1;
                if !key.had_newer {
                    let user_key = decode_user_key(prefix)?;
                    batch.delete(Cf::Data, keys::data_slot_key(span.space, &user_key));
                    page.keys_deleted += 1;
                }
            }
        }
        last = Some((prefix.to_vec(), ts));
    }
    Ok(page)
}

/// Runs whole passes of [`gc_page`] over `span` until it is done, writing each page's batch
/// (tests and tools; the Raft state machine replicates one page per command instead).
pub fn gc_span(
    engine: &dyn Engine,
    span: &Span,
    threshold: Timestamp,
    budget: usize,
) -> Result<GcPage> {
    let mut total = GcPage::default();
    let mut from = None;
    loop {
        let mut batch = WriteBatch::new();
        let page = gc_page(engine, &mut batch, span, threshold, from.as_ref(), budget)?;
        engine.write(batch, false)?;
        total.versions_deleted += page.versions_deleted;
        total.keys_deleted += page.keys_deleted;
        total.examined += page.examined;
        match page.resume {
            Some(c) => from = Some(c),
            None => return Ok(total),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::MemoryEngine;
    use crate::mvcc;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    use meridian_types::ShardId;

    const SHARD: ShardId = ShardId(3);

    fn whole() -> Span {
        Span::whole(keys::Keyspace::User)
    }

    /// A shard's GC pass stays inside its span: the neighbours' garbage is theirs to collect.
    #[test]
    fn a_pass_collects_only_inside_its_span() {
        let engine = MemoryEngine::new();
        let mut model = Model::new();
        for key in [&b"a"[..], b"m", b"m2", b"z"] {
            for ts in [10, 20] {
                write(&engine, &mut model, key, ts, Some(b"v"));
            }
        }
        let span = Span {
            space: keys::Keyspace::User,
            start: b"m".to_vec(),
            end: b"n".to_vec(),
        };
        gc_span(&engine, &span, Timestamp(25), GC_PAGE_ENTRIES).unwrap();
        let versions = |key: &[u8]| -> Vec<u64> {
            stored(&engine)
                .into_iter()
                .filter(|(k, ts, _)| k == key && !keys::is_slot_ts(*ts))
                .map(|(_, ts, _)| ts.0)
                .collect()
        };
        assert_eq!(versions(b"m"), [20]);
        assert_eq!(versions(b"m2"), [20]);
        assert_eq!(versions(b"a"), [20, 10], "left of the span: untouched");
        assert_eq!(versions(b"z"), [20, 10], "right of the span: untouched");
        // Nor does a resume cursor from before the span lead it there.
        let stray = GcCursor {
            key: b"a".to_vec(),
            ts: Timestamp(30),
        };
        let mut batch = WriteBatch::new();
        gc_page(&engine, &mut batch, &span, Timestamp(25), Some(&stray), 100).unwrap();
        engine.write(batch, false).unwrap();
        assert_eq!(versions(b"a"), [20, 10], "a stray cursor stays in the span");
    }

    /// The full history of every key: `ts → value` (`None` = tombstone).
    type Model = BTreeMap<Vec<u8>, BTreeMap<u64, Option<Vec<u8>>>>;

    fn write(engine: &MemoryEngine, model: &mut Model, key: &[u8], ts: u64, v: Option<&[u8]>) {
        let mut batch = WriteBatch::new();
        match v {
            Some(v) => mvcc::put(&mut batch, SHARD, key, Timestamp(ts), v),
            None => mvcc::delete(&mut batch, SHARD, key, Timestamp(ts)),
        }
        engine.write(batch, false).unwrap();
        model
            .entry(key.to_vec())
            .or_default()
            .insert(ts, v.map(<[u8]>::to_vec));
    }

    fn model_get(model: &Model, key: &[u8], at: u64) -> Option<(Timestamp, Vec<u8>)> {
        let (ts, v) = model.get(key)?.range(..=at).next_back()?;
        v.clone().map(|v| (Timestamp(*ts), v))
    }

    fn model_scan(model: &Model, at: u64) -> Vec<(Vec<u8>, Timestamp, Vec<u8>)> {
        model
            .keys()
            .filter_map(|k| model_get(model, k, at).map(|(ts, v)| (k.clone(), ts, v)))
            .collect()
    }

    /// Every stored MVCC entry of the user keyspace: `(user_key, ts, is_tombstone)`, slots as
    /// `ts = MAX` (shard-local keys are not MVCC data).
    fn stored(engine: &MemoryEngine) -> Vec<(Vec<u8>, Timestamp, bool)> {
        let (lo, hi) = keys::Keyspace::User.range();
        engine
            .scan(Cf::Data, &lo, Some(&hi), false)
            .map(|item| {
                let (k, v) = item.unwrap();
                let (_, key, ts) = keys::decode_data_key(&k).unwrap();
                let tomb = !keys::is_slot_ts(ts) && decode_version_ref(&v).unwrap().is_none();
                (key, ts, tomb)
            })
            .collect()
    }

    /// Reads at `at` (>= the threshold) agree with the full history, by every read path.
    fn assert_reads_match(engine: &MemoryEngine, model: &Model, at: u64) {
        let ts = Timestamp(at);
        let mut want = model_scan(model, at);
        let keys: Vec<&[u8]> = model.keys().map(Vec::as_slice).collect();
        let got = mvcc::multi_get(engine, SHARD, &keys, ts).unwrap();
        for (k, got) in keys.iter().zip(got) {
            assert_eq!(got, model_get(model, k, at), "multi_get {k:?} at {at}");
            assert_eq!(
                mvcc::get(engine, SHARD, k, ts).unwrap(),
                model_get(model, k, at),
                "get {k:?} at {at}"
            );
        }
        let forward = mvcc::scan(engine, SHARD, b"", None, ts, 1000, false).unwrap();
        assert_eq!(forward.rows, want, "forward scan at {at}");
        let reverse = mvcc::scan(engine, SHARD, b"", None, ts, 1000, true).unwrap();
        want.reverse();
        assert_eq!(reverse.rows, want, "reverse scan at {at}");
    }

    /// What GC at `threshold` must have removed: per key at most one version at or below it,
    /// a live one; and a slot exactly for the keys with versions.
    fn assert_collected(engine: &MemoryEngine, threshold: u64) {
        let entries = stored(engine);
        // Per key: whether it has a slot, and its versions (timestamp, is a tombstone).
        type Stored = (bool, Vec<(Timestamp, bool)>);
        let mut by_key: BTreeMap<Vec<u8>, Stored> = BTreeMap::new();
        for (key, ts, tomb) in entries {
            let e = by_key.entry(key).or_default();
            if keys::is_slot_ts(ts) {
                e.0 = true;
            } else {
                e.1.push((ts, tomb));
            }
        }
        for (key, (slot, versions)) in by_key {
            assert_eq!(
                slot,
                !versions.is_empty(),
                "slot of {key:?} vs its versions"
            );
            let old: Vec<_> = versions
                .iter()
                .filter(|(ts, _)| ts.0 <= threshold)
                .collect();
            assert!(
                old.len() <= 1,
                "{key:?} keeps {old:?} at or below {threshold}"
            );
            assert!(
                old.iter().all(|(_, tomb)| !tomb),
                "{key:?} keeps a tombstone at or below {threshold}"
            );
        }
    }

    #[test]
    fn collects_the_doc_example() {
        let (engine, mut model) = (MemoryEngine::new(), Model::new());
        write(&engine, &mut model, b"k", 10, Some(b"a"));
        write(&engine, &mut model, b"j", 10, Some(b"x"));
        write(&engine, &mut model, b"k", 20, Some(b"b"));
        write(&engine, &mut model, b"j", 20, None);
        write(&engine, &mut model, b"k", 30, Some(b"c"));
        let done = gc_span(&engine, &whole(), Timestamp(25), GC_PAGE_ENTRIES).unwrap();
        assert_eq!((done.versions_deleted, done.keys_deleted), (3, 1));
        assert_eq!(
            stored(&engine),
            vec![
                (b"k".to_vec(), Timestamp::MAX, false),
                (b"k".to_vec(), Timestamp(30), false),
                (b"k".to_vec(), Timestamp(20), false),
            ]
        );
        for at in 25..=31 {
            assert_reads_match(&engine, &model, at);
        }
        // Nothing left to collect at the same threshold.
        let again = gc_span(&engine, &whole(), Timestamp(25), GC_PAGE_ENTRIES).unwrap();
        assert_eq!((again.versions_deleted, again.keys_deleted), (0, 0));
    }

    #[test]
    fn pages_resume_inside_a_key_and_leave_the_transaction_region_alone() {
        let (engine, mut model) = (MemoryEngine::new(), Model::new());
        for ts in 1..=20 {
            write(
                &engine,
                &mut model,
                b"hot",
                ts,
                Some(format!("v{ts}").as_bytes()),
            );
        }
        let mut batch = WriteBatch::new();
        let record = keys::txn_key(SHARD, keys::TxnKeyKind::Record, 1, 1);
        batch.put(Cf::Data, record.clone(), b"not a version".to_vec());
        engine.write(batch, false).unwrap();
        let mut from = None;
        let mut pages = 0;
        loop {
            let mut batch = WriteBatch::new();
            let page = gc_page(
                &engine,
                &mut batch,
                &whole(),
                Timestamp(15),
                from.as_ref(),
                3,
            )
            .unwrap();
            assert!(page.examined <= 3, "{page:?}");
            engine.write(batch, false).unwrap();
            pages += 1;
            match page.resume {
                Some(c) => from = Some(c),
                None => break,
            }
        }
        assert!(pages >= 6, "{pages} pages");
        assert_collected(&engine, 15);
        let hot: Vec<_> = stored(&engine).into_iter().map(|(_, ts, _)| ts.0).collect();
        assert_eq!(hot, [u64::MAX, 20, 19, 18, 17, 16, 15]);
        assert!(engine.get(Cf::Data, &record).unwrap().is_some());
        assert_reads_match(&engine, &model, 15);
    }

    #[derive(Clone, Debug)]
    enum Op {
        Write { key: u8, gap: u64, delete: bool },
        Gc { back: u64, budget: usize },
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (0u8..4, 1u64..4, any::<bool>())
                .prop_map(|(key, gap, delete)| Op::Write { key, gap, delete }),
            1 => (0u64..12, 1usize..7).prop_map(|(back, budget)| Op::Gc { back, budget }),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]
        /// Random writes and GC passes (small pages, thresholds anywhere below now): reads at
        /// or above the highest threshold so far always match the full history, and each pass
        /// removed everything it should have (`assert_collected`: a GC that deletes nothing
        /// fails it, one that deletes too much fails the reads).
        #[test]
        fn reads_at_or_above_the_threshold_match_the_full_history(
            ops in proptest::collection::vec(op(), 1..60),
        ) {
            let names: [&[u8]; 4] = [b"a", b"a\0", b"b", b"\xff"];
            let (engine, mut model) = (MemoryEngine::new(), Model::new());
            let (mut now, mut threshold) = (1u64, 0u64);
            for op in ops {
                match op {
                    Op::Write { key, gap, delete } => {
                        now += gap;
                        let value = format!("{now}");
                        let v = (!delete).then_some(value.as_bytes());
                        write(&engine, &mut model, names[key as usize], now, v);
                    }
                    Op::Gc { back, budget } => {
                        threshold = threshold.max(now.saturating_sub(back));
                        gc_span(&engine, &whole(), Timestamp(threshold), budget).unwrap();
                        assert_collected(&engine, threshold);
                    }
                }
                for at in threshold.max(1)..=now + 1 {
                    assert_reads_match(&engine, &model, at);
                }
            }
        }
    }
}
