//! Micro-benchmark of the MVCC read paths on [`RocksEngine`]s in temp dirs.
//!
//! Loads 200k user keys × 1 version with 100-byte pseudo-random values twice:
//!
//! - **format 3** (this build): through `mvcc::put`, so every key has its version and a slot
//!   holding the newest timestamp *and a copy of the value*;
//! - **format 2** (the previous layout, rebuilt here with raw engine writes): the version and
//!   a slot holding only the newest timestamp (tag 3).
//!
//! It flushes both, prints load time and SST bytes of each (the write amplification of the
//! value copy), and then times, on the same keys in the same random order:
//!
//! - point gets of present keys: iterator seek (format 1's read path, on the format-3 data)
//!   vs format 2 (slot get, then exact version get) vs `mvcc::get` (one slot get);
//! - batches of 100 present keys: `seek_first_many` on sorted ranges (format 1) vs format 2
//!   (MultiGet of slots, then MultiGet of versions) vs `mvcc::multi_get` (one MultiGet);
//! - point gets of absent keys, and point gets below every version (the seek fallback).
//!
//! Each contender runs `ROUNDS` rounds, rotating through the contenders round by round so
//! background load hits them alike, after one warm-up pass each; the median round of each is
//! printed, with its ratio to the first contender and to the one before it. The block caches
//! hold the whole data sets, so this measures CPU per read, not disk I/O (where MultiGet's
//! batching of block reads would matter more).
//!
//! Run: `cargo run --release -p meridian-storage --example read_paths`

use meridian_storage::mvcc::{self, VersionValue, Versioned};
use meridian_storage::{keys, Cf, Engine, EngineOptions, KvPair, RocksEngine, WriteBatch};
use meridian_types::{ShardId, Timestamp};
use std::path::Path;
use std::time::Instant;

const KEY_COUNT: u64 = 200_000;
const VALUE_BYTES: usize = 100;
const POINT_READS: usize = 100_000;
const BATCH_KEYS: usize = 100;
const LOAD_BATCH_KEYS: u64 = 1_000;
const ROUNDS: usize = 7;
const SHARD: ShardId = ShardId(1);
const MIB: f64 = (1 << 20) as f64;

/// A batched read path: one batch of keys in, one result per key out.
type BatchRead<'a> = dyn Fn(&[&[u8]]) -> Vec<Option<Versioned>> + 'a;

fn user_key(i: u64) -> Vec<u8> {
    format!("user{i:010}").into_bytes()
}

/// splitmix64: a fixed-seed generator so every run reads the same keys.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

fn decode_version(k: &[u8], v: &[u8]) -> Option<Versioned> {
    let (_, ts) = keys::split_data_key(k).unwrap();
    match VersionValue::decode(v).unwrap() {
        VersionValue::Put(value) => Some((ts, value)),
        VersionValue::Tombstone => None,
    }
}

/// Format 1's point read: one bounded iterator seek from `key ‖ !read_ts`.
fn seek_get(e: &dyn Engine, key: &[u8], read_ts: Timestamp) -> Option<Versioned> {
    let start = keys::data_key(SHARD, key, read_ts.min(keys::MAX_VERSION_TS));
    let (_, end) = keys::data_key_versions_range(SHARD, key);
    let (k, v) = e.scan(Cf::Data, &start, Some(&end), false).next()?.unwrap();
    decode_version(&k, &v)
}

/// Format 1's batched read: sorted bounded seeks on one reused iterator.
fn seek_multi_get(e: &dyn Engine, batch: &[&[u8]], read_ts: Timestamp) -> Vec<Option<Versioned>> {
    let mut order: Vec<usize> = (0..batch.len()).collect();
    order.sort_by(|&a, &b| batch[a].cmp(batch[b]));
    let bounds: Vec<KvPair> = order
        .iter()
        .map(|&i| {
            let (_, end) = keys::data_key_versions_range(SHARD, batch[i]);
            (keys::data_key(SHARD, batch[i], read_ts), end)
        })
        .collect();
    let ranges: Vec<(&[u8], &[u8])> = bounds
        .iter()
        .map(|(s, e)| (s.as_slice(), e.as_slice()))
        .collect();
    let found = e.seek_first_many(Cf::Data, &ranges).unwrap();
    let mut out = vec![None; batch.len()];
    for (&i, entry) in order.iter().zip(found) {
        out[i] = entry.and_then(|(k, v)| decode_version(&k, &v));
    }
    out
}

/// Format 2's slot value: tag 3 ‖ newest ts u64 BE.
fn v2_slot(ts: Timestamp) -> Vec<u8> {
    let mut raw = vec![3];
    raw.extend_from_slice(&ts.0.to_be_bytes());
    raw
}

fn v2_slot_ts(raw: &[u8]) -> Timestamp {
    assert_eq!((raw.len(), raw[0]), (9, 3), "format-2 slot");
    Timestamp(u64::from_be_bytes(raw[1..].try_into().unwrap()))
}

/// Format 2's point read: slot get, then the exact version it names (or a seek below it).
fn v2_get(e: &dyn Engine, key: &[u8], read_ts: Timestamp) -> Option<Versioned> {
    let newest = v2_slot_ts(&e.get(Cf::Data, &keys::data_slot_key(SHARD, key)).unwrap()?);
    if newest > read_ts {
        return seek_get(e, key, read_ts);
    }
    let raw = e
        .get(Cf::Data, &keys::data_key(SHARD, key, newest))
        .unwrap()
        .expect("format-2 slot names a version");
    match VersionValue::decode(&raw).unwrap() {
        VersionValue::Put(value) => Some((newest, value)),
        VersionValue::Tombstone => None,
    }
}

/// Format 2's batched read at or above every key's newest version: MultiGet of the sorted
/// slots, then MultiGet of the exact versions they name.
fn v2_multi_get(e: &dyn Engine, batch: &[&[u8]], read_ts: Timestamp) -> Vec<Option<Versioned>> {
    let mut order: Vec<usize> = (0..batch.len()).collect();
    order.sort_by(|&a, &b| batch[a].cmp(batch[b]));
    let slot_keys: Vec<Vec<u8>> = order
        .iter()
        .map(|&i| keys::data_slot_key(SHARD, batch[i]))
        .collect();
    let refs: Vec<&[u8]> = slot_keys.iter().map(Vec::as_slice).collect();
    let slots = e.multi_get(Cf::Data, &refs).unwrap();
    let mut exact: Vec<(usize, Timestamp)> = Vec::new();
    let mut exact_keys: Vec<Vec<u8>> = Vec::new();
    for (&i, slot) in order.iter().zip(slots) {
        let Some(slot) = slot else { continue };
        let newest = v2_slot_ts(&slot);
        assert!(
            newest <= read_ts,
            "benchmark reads at or above every version"
        );
        exact.push((i, newest));
        exact_keys.push(keys::data_key(SHARD, batch[i], newest));
    }
    let refs: Vec<&[u8]> = exact_keys.iter().map(Vec::as_slice).collect();
    let found = e.multi_get(Cf::Data, &refs).unwrap();
    let mut out = vec![None; batch.len()];
    for ((i, newest), raw) in exact.into_iter().zip(found) {
        out[i] = match VersionValue::decode(&raw.expect("named version")).unwrap() {
            VersionValue::Put(value) => Some((newest, value)),
            VersionValue::Tombstone => None,
        };
    }
    out
}

/// Times each contender (each performs `ops` reads and returns how many found a value): one
/// warm-up each, then `ROUNDS` rounds rotating through the contenders so background load hits
/// all alike. Prints the median reads/s of each, its ratio to the first and to the previous.
fn compare(ops: usize, contenders: &mut [(&str, &mut dyn FnMut() -> usize)]) {
    let found: Vec<usize> = contenders.iter_mut().map(|(_, f)| f()).collect();
    assert!(
        found.iter().all(|&n| n == found[0]),
        "contenders disagree: {found:?}"
    );
    let mut rates = vec![Vec::new(); contenders.len()];
    for _ in 0..ROUNDS {
        for ((_, round), rates) in contenders.iter_mut().zip(&mut rates) {
            let started = Instant::now();
            assert_eq!(round(), found[0], "rounds disagree");
            rates.push(ops as f64 / started.elapsed().as_secs_f64());
        }
    }
    let medians: Vec<f64> = rates
        .iter_mut()
        .map(|rates| {
            rates.sort_by(f64::total_cmp);
            rates[ROUNDS / 2]
        })
        .collect();
    for (i, ((name, _), rates)) in contenders.iter().zip(&rates).enumerate() {
        let vs_prev = match i {
            0 => String::new(),
            _ => format!("{:.2}x prev", medians[i] / medians[i - 1]),
        };
        println!(
            "{name:<50} {:>9.0} reads/s {:>6.2}x {vs_prev:>10}  \
             (rounds {:.0}..{:.0}; {} of {ops} found)",
            medians[i],
            medians[i] / medians[0],
            rates[0],
            rates[ROUNDS - 1],
            found[0]
        );
    }
    println!();
}

fn sst_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .expect("read dir")
        .filter_map(|f| f.ok())
        .filter(|f| f.path().extension().is_some_and(|x| x == "sst"))
        .map(|f| f.metadata().map_or(0, |m| m.len()))
        .sum()
}

/// Loads every key at `Timestamp(1_000 + i)` (increasing with the load order, as the state
/// machine assigns them), flushes, and reports the time and SST bytes.
fn load(
    name: &str,
    dir: &Path,
    write: impl Fn(&mut WriteBatch, &[u8], Timestamp, &[u8]),
) -> RocksEngine {
    let engine = RocksEngine::open(dir, &EngineOptions::default()).expect("open");
    let mut rng = Rng(7);
    let started = Instant::now();
    for first in (0..KEY_COUNT).step_by(LOAD_BATCH_KEYS as usize) {
        let mut batch = WriteBatch::new();
        for i in first..(first + LOAD_BATCH_KEYS).min(KEY_COUNT) {
            write(
                &mut batch,
                &user_key(i),
                Timestamp(1_000 + i),
                &rng.bytes(VALUE_BYTES),
            );
        }
        engine.write(batch, false).expect("write");
    }
    engine.flush().expect("flush");
    let elapsed = started.elapsed().as_secs_f64();
    let logical: usize = engine
        .scan(Cf::Data, b"", None, false)
        .map(|kv| kv.map(|(k, v)| k.len() + v.len()).expect("scan"))
        .sum();
    println!(
        "{name}: loaded {KEY_COUNT} keys x 1 version x {VALUE_BYTES} B in {elapsed:.2}s; \
         {:.1} MiB of keys+values, {:.1} MiB of SST",
        logical as f64 / MIB,
        sst_bytes(dir) as f64 / MIB
    );
    engine
}

fn main() {
    let (dir3, dir2) = (
        tempfile::tempdir().expect("tempdir"),
        tempfile::tempdir().expect("tempdir"),
    );
    let f3 = load("format 3", dir3.path(), |b, k, ts, v| {
        mvcc::put(b, SHARD, k, ts, v)
    });
    let f2 = load("format 2", dir2.path(), |b, k, ts, v| {
        b.put(
            Cf::Data,
            keys::data_key(SHARD, k, ts),
            VersionValue::Put(v.to_vec()).encode(),
        );
        b.put(Cf::Data, keys::data_slot_key(SHARD, k), v2_slot(ts));
    });
    let (e, e2): (&dyn Engine, &dyn Engine) = (&f3, &f2);
    println!("{POINT_READS} reads per round, median of {ROUNDS} rotating rounds\n");

    let mut rng = Rng(42);
    let picks: Vec<Vec<u8>> = (0..POINT_READS)
        .map(|_| user_key(rng.next() % KEY_COUNT))
        .collect();
    let absent: Vec<Vec<u8>> = (0..POINT_READS)
        .map(|_| format!("nope{:010}", rng.next() % KEY_COUNT).into_bytes())
        .collect();
    let now = Timestamp(u64::MAX / 2);
    let before_all = Timestamp(1);

    // The paths must agree before their speed is worth comparing.
    for key in picks.iter().take(1_000) {
        let want = mvcc::get(e, SHARD, key, now).unwrap();
        assert!(want.is_some());
        assert_eq!(seek_get(e, key, now), want);
        assert_eq!(v2_get(e2, key, now), want);
    }

    let count = |reads: Vec<Option<Versioned>>| reads.iter().filter(|r| r.is_some()).count();
    let point = |keys: &[Vec<u8>], read: &dyn Fn(&[u8]) -> Option<Versioned>| {
        count(keys.iter().map(|k| read(k)).collect())
    };

    compare(
        POINT_READS,
        &mut [
            ("get hit: iterator seek (format 1)", &mut || {
                point(&picks, &|k| seek_get(e, k, now))
            }),
            ("get hit: slot get + exact get (format 2)", &mut || {
                point(&picks, &|k| v2_get(e2, k, now))
            }),
            ("get hit: slot get (format 3, mvcc::get)", &mut || {
                point(&picks, &|k| mvcc::get(e, SHARD, k, now).unwrap())
            }),
        ],
    );

    let batches: Vec<Vec<&[u8]>> = picks
        .chunks(BATCH_KEYS)
        .map(|c| c.iter().map(Vec::as_slice).collect())
        .collect();
    let batched = |read: &BatchRead| -> usize { batches.iter().map(|b| count(read(b))).sum() };
    compare(
        POINT_READS,
        &mut [
            ("multi_get x100: seek_first_many (format 1)", &mut || {
                batched(&|b| seek_multi_get(e, b, now))
            }),
            ("multi_get x100: 2 MultiGets (format 2)", &mut || {
                batched(&|b| v2_multi_get(e2, b, now))
            }),
            ("multi_get x100: 1 MultiGet (format 3, mvcc)", &mut || {
                batched(&|b| mvcc::multi_get(e, SHARD, b, now).unwrap())
            }),
        ],
    );

    // Diagnostic: one exact-key lookup per key, by a loop of gets and by one MultiGet per 100
    // sorted keys (format 3's slot keys: exactly what mvcc::get / multi_get read).
    let slot_batches: Vec<Vec<Vec<u8>>> = batches
        .iter()
        .map(|b| {
            let mut slots: Vec<Vec<u8>> = b.iter().map(|k| keys::data_slot_key(SHARD, k)).collect();
            slots.sort();
            slots
        })
        .collect();
    compare(
        POINT_READS,
        &mut [
            ("  raw: 1 engine.get per slot key", &mut || {
                slot_batches
                    .iter()
                    .flatten()
                    .filter(|k| e.get(Cf::Data, k).unwrap().is_some())
                    .count()
            }),
            (
                "  raw: 1 engine.multi_get per 100 sorted slot keys",
                &mut || {
                    slot_batches
                        .iter()
                        .map(|b| {
                            let refs: Vec<&[u8]> = b.iter().map(Vec::as_slice).collect();
                            let found = e.multi_get(Cf::Data, &refs).unwrap();
                            found.iter().filter(|v| v.is_some()).count()
                        })
                        .sum()
                },
            ),
        ],
    );

    compare(
        POINT_READS,
        &mut [
            ("get miss: iterator seek (format 1)", &mut || {
                point(&absent, &|k| seek_get(e, k, now))
            }),
            ("get miss: slot get (format 2)", &mut || {
                point(&absent, &|k| v2_get(e2, k, now))
            }),
            ("get miss: slot get (format 3, mvcc::get)", &mut || {
                point(&absent, &|k| mvcc::get(e, SHARD, k, now).unwrap())
            }),
        ],
    );

    compare(
        POINT_READS,
        &mut [
            ("get below all: seek (format 1)", &mut || {
                point(&picks, &|k| seek_get(e, k, before_all))
            }),
            ("get below all: slot get + seek (format 2)", &mut || {
                point(&picks, &|k| v2_get(e2, k, before_all))
            }),
            (
                "get below all: slot get + seek (format 3, mvcc)",
                &mut || point(&picks, &|k| mvcc::get(e, SHARD, k, before_all).unwrap()),
            ),
        ],
    );
}
