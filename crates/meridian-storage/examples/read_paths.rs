//! Micro-benchmark of the MVCC read paths on a [`RocksEngine`] in a temp dir.
//!
//! Loads 200k user keys × 1 version with 100-byte values (through `mvcc::put`, so every key
//! also has its latest-version slot), flushes, and then times, on the same keys in the same
//! random order:
//!
//! - point gets by bounded iterator seek (the read path before slots) vs `mvcc::get`
//!   (slot get + exact version get);
//! - batches of 100 keys by `seek_first_many` on sorted ranges (the batched path before
//!   slots) vs `mvcc::multi_get` (one MultiGet of slots + one MultiGet of versions);
//! - point gets of absent keys, and point gets below every version (the seek fallback).
//!
//! Each pair runs `ROUNDS` alternating rounds after a warm-up pass; the median round of each
//! is printed. The block cache holds the whole data set, so this measures CPU per read, not
//! disk I/O (where MultiGet's batching of block reads would matter more).
//!
//! Run: `cargo run --release -p meridian-storage --example read_paths`

use meridian_storage::mvcc::{self, VersionValue, Versioned};
use meridian_storage::{keys, Cf, Engine, EngineOptions, KvPair, RocksEngine, WriteBatch};
use meridian_types::{ShardId, Timestamp};
use std::time::Instant;

const KEY_COUNT: u64 = 200_000;
const VALUE_BYTES: usize = 100;
const POINT_READS: usize = 100_000;
const BATCH_KEYS: usize = 100;
const LOAD_BATCH_KEYS: u64 = 1_000;
const ROUNDS: usize = 5;
const SHARD: ShardId = ShardId(1);

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
}

/// The point read before slots: one bounded iterator seek from `key ‖ !read_ts`.
fn seek_get(e: &dyn Engine, key: &[u8], read_ts: Timestamp) -> Option<Versioned> {
    let start = keys::data_key(SHARD, key, read_ts.min(keys::MAX_VERSION_TS));
    let (_, end) = keys::data_key_versions_range(SHARD, key);
    let (k, v) = e.scan(Cf::Data, &start, Some(&end), false).next()?.unwrap();
    let (_, ts) = keys::split_data_key(&k).unwrap();
    match VersionValue::decode(&v).unwrap() {
        VersionValue::Put(value) => Some((ts, value)),
        VersionValue::Tombstone => None,
    }
}

/// The batched read before slots: sorted bounded seeks on one reused iterator.
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
        out[i] = entry.and_then(|(k, v)| match VersionValue::decode(&v).unwrap() {
            VersionValue::Put(value) => Some((keys::split_data_key(&k).unwrap().1, value)),
            VersionValue::Tombstone => None,
        });
    }
    out
}

/// Times `old` and `new` (each performs `ops` reads and returns how many found a value):
/// one warm-up each, then `ROUNDS` rounds alternating old and new so background load hits
/// both alike. Prints and returns the median reads/s of each.
fn compare(
    old_name: &str,
    new_name: &str,
    ops: usize,
    mut old: impl FnMut() -> usize,
    mut new: impl FnMut() -> usize,
) -> (f64, f64) {
    let found = (old(), new());
    assert_eq!(found.0, found.1, "{old_name} and {new_name} disagree");
    let mut rates = (Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        for (round, rates) in [
            (&mut old as &mut dyn FnMut() -> usize, &mut rates.0),
            (&mut new, &mut rates.1),
        ] {
            let started = Instant::now();
            assert_eq!(round(), found.0, "rounds disagree");
            rates.push(ops as f64 / started.elapsed().as_secs_f64());
        }
    }
    let mut medians = [0.0; 2];
    for (i, (name, rates)) in [(old_name, &mut rates.0), (new_name, &mut rates.1)]
        .into_iter()
        .enumerate()
    {
        rates.sort_by(f64::total_cmp);
        medians[i] = rates[ROUNDS / 2];
        println!(
            "{name:<56} {:>10.0} reads/s  (rounds {:.0}..{:.0}; {} of {ops} found)",
            medians[i],
            rates[0],
            rates[ROUNDS - 1],
            found.0
        );
    }
    println!("{:<56} {:>10.2}x", "  new / old", medians[1] / medians[0]);
    (medians[0], medians[1])
}

fn main() {
    let dir = tempfile::tempdir().expect("tempdir");
    let engine = RocksEngine::open(dir.path(), &EngineOptions::default()).expect("open");
    let e: &dyn Engine = &engine;

    let load_started = Instant::now();
    let value = vec![0xABu8; VALUE_BYTES];
    for first in (0..KEY_COUNT).step_by(LOAD_BATCH_KEYS as usize) {
        let mut batch = WriteBatch::new();
        for i in first..(first + LOAD_BATCH_KEYS).min(KEY_COUNT) {
            // Timestamps increase with the load order, as the state machine assigns them.
            mvcc::put(
                &mut batch,
                SHARD,
                &user_key(i),
                Timestamp(1_000 + i),
                &value,
            );
        }
        e.write(batch, false).expect("write");
    }
    e.flush().expect("flush");
    let sst_files = std::fs::read_dir(dir.path())
        .expect("read dir")
        .filter(|f| {
            f.as_ref()
                .is_ok_and(|f| f.path().extension().is_some_and(|x| x == "sst"))
        })
        .count();
    println!(
        "loaded {KEY_COUNT} keys x 1 version x {VALUE_BYTES} B in {:.2}s ({sst_files} SST \
         files); {POINT_READS} reads per round, median of {ROUNDS} alternating rounds",
        load_started.elapsed().as_secs_f64()
    );

    let mut rng = Rng(42);
    let picks: Vec<Vec<u8>> = (0..POINT_READS)
        .map(|_| user_key(rng.next() % KEY_COUNT))
        .collect();
    let absent: Vec<Vec<u8>> = (0..POINT_READS)
        .map(|_| format!("nope{:010}", rng.next() % KEY_COUNT).into_bytes())
        .collect();
    let now = Timestamp(u64::MAX / 2);
    let before_all = Timestamp(1);

    // The two paths must agree before their speed is worth comparing.
    for key in picks.iter().take(1_000) {
        assert_eq!(
            seek_get(e, key, now),
            mvcc::get(e, SHARD, key, now).unwrap()
        );
    }

    let count = |reads: Vec<Option<Versioned>>| reads.iter().filter(|r| r.is_some()).count();
    compare(
        "get, present keys: iterator seek (old)",
        "get, present keys: slot get + exact get (mvcc::get)",
        POINT_READS,
        || count(picks.iter().map(|k| seek_get(e, k, now)).collect()),
        || {
            count(
                picks
                    .iter()
                    .map(|k| mvcc::get(e, SHARD, k, now).unwrap())
                    .collect(),
            )
        },
    );

    let batches: Vec<Vec<&[u8]>> = picks
        .chunks(BATCH_KEYS)
        .map(|c| c.iter().map(Vec::as_slice).collect())
        .collect();
    compare(
        "multi_get x100: seek_first_many (old)",
        "multi_get x100: 2 MultiGets (mvcc::multi_get)",
        POINT_READS,
        || {
            batches
                .iter()
                .map(|b| count(seek_multi_get(e, b, now)))
                .sum()
        },
        || {
            batches
                .iter()
                .map(|b| count(mvcc::multi_get(e, SHARD, b, now).unwrap()))
                .sum()
        },
    );

    // Diagnostic: the cost of one exact-key lookup per key, by a loop of gets and by one
    // MultiGet per 100 sorted keys (the slots alone; mvcc::multi_get does this twice).
    let slot_batches: Vec<Vec<Vec<u8>>> = batches
        .iter()
        .map(|b| {
            let mut slots: Vec<Vec<u8>> = b.iter().map(|k| keys::data_slot_key(SHARD, k)).collect();
            slots.sort();
            slots
        })
        .collect();
    compare(
        "  raw: 1 engine.get per key (slot keys)",
        "  raw: 1 engine.multi_get per 100 sorted slot keys",
        POINT_READS,
        || {
            slot_batches
                .iter()
                .flatten()
                .filter(|k| e.get(Cf::Data, k).unwrap().is_some())
                .count()
        },
        || {
            slot_batches
                .iter()
                .map(|b| {
                    let refs: Vec<&[u8]> = b.iter().map(Vec::as_slice).collect();
                    let found = e.multi_get(Cf::Data, &refs).unwrap();
                    found.iter().filter(|v| v.is_some()).count()
                })
                .sum()
        },
    );

    compare(
        "get, absent keys: iterator seek (old)",
        "get, absent keys: slot get (mvcc::get)",
        POINT_READS,
        || count(absent.iter().map(|k| seek_get(e, k, now)).collect()),
        || {
            count(
                absent
                    .iter()
                    .map(|k| mvcc::get(e, SHARD, k, now).unwrap())
                    .collect(),
            )
        },
    );

    compare(
        "get below every version: seek (old)",
        "get below every version: slot get + seek (mvcc::get)",
        POINT_READS,
        || count(picks.iter().map(|k| seek_get(e, k, before_all)).collect()),
        || {
            count(
                picks
                    .iter()
                    .map(|k| mvcc::get(e, SHARD, k, before_all).unwrap())
                    .collect(),
            )
        },
    );
}
