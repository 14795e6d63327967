//! Multi-version reads and writes over an [`Engine`]'s `Cf::Data`, at HLC timestamps.
//!
//! Every write creates a new *version* of a user key at a timestamp; nothing is overwritten
//! in place except the key's *latest-version slot*. A read at `read_ts` sees, per key, the
//! newest version with `ts <= read_ts`; if that version is a tombstone the key does not exist
//! at `read_ts`.
//!
//! ```text
//!  Cf::Data, one user key "k" (slot first, then versions newest first thanks to !ts):
//!
//!    03 ‖ enc("k") ‖ 0x00×8 → Latest(30, Put("c"))  copy of the newest version, by exact key
//!    03 ‖ enc("k") ‖ !30    → Put("c")      read at 35 → "c"@30 (answered by the slot alone)
//!    03 ‖ enc("k") ‖ !20    → Tombstone     read at 25 → none
//!    03 ‖ enc("k") ‖ !10    → Put("a")      read at 15 → "a"@10,  read at 5 → none
//! ```
//!
//! # Value encoding
//! The first byte of a `Cf::Data` value is a tag:
//! - `1` = Put, the value bytes follow;
//! - `2` = Tombstone, nothing follows;
//! - `4` = Latest, only ever under a slot key: the newest version's timestamp as a `u64` BE,
//!   then that version's own encoding (`1 ‖ value` or `2`), so at least 10 bytes.
//!
//! Tag `3` was the format-2 slot (timestamp only, no value); format 3 never writes or accepts
//! it, and `RocksEngine::open` refuses format-2 directories. Anything else, or a slot value
//! where a version is expected (and vice versa), is `Error::Corrupt`.
//!
//! # The latest-version slot
//! RocksDB's MultiGet needs *exact* keys, but a version's key contains its timestamp, which a
//! reader does not know. So every [`put`] and [`delete`] also overwrites, in the same
//! `WriteBatch`, the key's slot ([`keys::data_slot_key`], i.e. `data_key(space, key,
//! Timestamp::MAX)`) with the timestamp **and the value** it wrote. A read at or above the
//! newest version is then one exact-key lookup, the same count as a single-version KV store,
//! and MultiGet batches it across keys.
//!
//! **Every value is written twice**, once in its version and once in the slot, on purpose:
//! the hot reads (point reads and BatchGet at "now") must be single exact-key lookups that
//! MultiGet can batch and bloom filters can answer, not iterator seeks nor two dependent
//! lookups (the Flipkart lesson). The version copy is still needed: it is the history for
//! reads below the newest version and for scans. The slot copy is overwritten by the next
//! write to the key and disappears at compaction, so the cost is per write, not per key kept:
//! - WAL and memtable bytes per write about double (key + value twice, plus 9 bytes);
//! - flush and compaction rewrite the live slot copies, about one extra value per live key
//!   at each level it passes through (overwritten slots are dropped when compaction merges
//!   them);
//! - space: one extra copy of each key's newest value (a key with one version takes about
//!   twice its value's bytes; a key with many versions, one value more).
//!
//! The previous format (2) stored only the timestamp in the slot and paid a second, dependent
//! lookup for the value; see "what it costs" for why that was not good enough.
//!
//! Preconditions of the writers (they are what makes the slot right):
//! - **Per key, writes are applied in non-decreasing timestamp order.** The slot holds the
//!   *last write applied*, which is the newest version only because the Raft state machine
//!   gives every write a timestamp above the shard's version floor, and a multi-shard
//!   transaction's write (at its commit timestamp, which may lie below other keys' newer
//!   versions) goes to a key that was locked, so got no version, since its prepare timestamp
//!   was taken above the floor (see `meridian-raft`'s `locks`). A write below the slot's
//!   timestamp would make the slot claim it is the newest and hide the newer version from
//!   reads at or above it.
//! - **Version timestamps are below `Timestamp::MAX`** (at most [`keys::MAX_VERSION_TS`]):
//!   `Timestamp::MAX` is the slot's key. Asserted (in release builds too: a version at `MAX`
//!   would silently overwrite the slot).
//!
//! # Reads
//! - **Point read** ([`get`]): point-get the slot. No slot: the key was never written (every
//!   version is written in one atomic batch with its slot, and snapshots carry the whole data
//!   range), so `None`. Slot ts `<= read_ts`: the slot's copy is the answer (a tombstone reads
//!   as `None`); no second lookup. Slot ts `> read_ts` (a read in the past of a key written
//!   since): fall back to a bounded seek from `data_key(space, key, read_ts)`, which starts
//!   after the slot because the slot sorts first.
//! - **Batched read** ([`multi_get`]): the keys are sorted (the slot keys then come out sorted
//!   too, since the encoding preserves order), and **one** [`Engine::multi_get`] fetches every
//!   slot, which answers every key whose newest version is at or below `read_ts`. Only keys
//!   written after `read_ts` fall back to a seek, all on one reused iterator
//!   ([`Engine::seek_first_many`]). A read at "now" of keys not written in the meantime is one
//!   MultiGet and never creates an iterator.
//! - **Scan** ([`scan`]): one iterator over the user-key range; slots are skipped; per key,
//!   the newest visible version. Forward iteration meets a key's newest version first and
//!   skips the rest. Reverse iteration meets the *oldest* version first, so it keeps the latest
//!   candidate with `ts <= read_ts` and emits it when the user key changes. Scans do not read
//!   the slots' copies: the iterator has to step over the key's versions anyway (it cannot
//!   re-seek past them cheaply; see "not done yet"), so answering from the slot would save
//!   nothing and add a second way to get the same row.
//!
//! # What it costs (measured by `examples/read_paths.rs`)
//! 200k keys × 1 version × 100 random bytes, loaded once per layout, everything in the block
//! cache (CPU per read, not disk I/O); a 2-core machine shared with other builds (load average
//! 3.2–4.4), medians of 7 rotating rounds, median of 3 runs. Throughput relative to format 2
//! (slot = timestamp only, then the exact version) and to format 1 (iterator seek):
//!
//! ```text
//!                              format 3 / format 2    format 3 / seek
//!   get, hit                          1.17x               1.48x
//!   multi_get, 100 hits               1.21x               1.02x
//!   get, miss                         1.00x               5.6x
//!   get below every version           0.92x               0.70x
//! ```
//!
//! - A hit is now one lookup. Batched hits went from 0.86× to about 1.0× the reused-iterator
//!   seeks that format 1 used (in cache, one MultiGet lookup costs about 0.8× a get; a seek on
//!   a warm reused iterator is about as cheap); the gain over seeks should be larger when
//!   blocks come from disk, which MultiGet batches.
//! - A miss is unchanged: one bloom-filtered get.
//! - A read below the newest version pays the slot get (now carrying a value) before its seek:
//!   about 0.92× format 2 and 0.70× a plain seek. Reads in the past are the rare case.
//! - Writes: the keys and values written per version grew from 33.2 to 52.5 MiB (+58%) for
//!   this data set, and that is what the WAL, memtables and the (uncompressed) block cache
//!   carry; loading took about 1.25× as long (noisy). On disk, LZ4 finds the copy in the same
//!   block (the slot sorts right before its newest version): SSTs grew only from 25.2 to
//!   27.1 MiB (+7.5%). Values larger than a block (4 KiB), or a slot and its version split
//!   across a block boundary, pay the copy on disk too.
//!
//! Old versions are garbage-collected below a threshold by `gc` (reads below it must then be
//! refused by the caller).
//!
//! # Invariants
//! - Every user key with at least one version has exactly one slot, holding its newest
//!   version's timestamp and a byte-identical copy of that version's value; no slot exists
//!   without versions.
//! - Writers never create two versions of a key at one timestamp with different values (the
//!   state machine enforces this; a second write at the same timestamp replaces the first,
//!   and the slot is replaced by the same batch either way).
//! - Reads never see versions above `read_ts`, and never return a slot as a row.
//!
//! # Not done yet
//! - Intents are not consulted here; the transaction layer checks them around these reads.
//! - Scans skip invisible versions one by one (no re-seek past a key's remaining versions),
//!   so keys with very many versions make scans slower.
//! - Writes out of timestamp order (e.g. importing history) are not supported: they would
//!   need a read of the current slot before overwriting it.
//! - Large values pay the double write in full; a size threshold above which the slot holds
//!   only the timestamp (two lookups, as in format 2) would bound it.

use crate::engine::{Cf, Engine, KvIter, KvPair, WriteBatch};
use crate::error::{Error, Result};
use crate::keys::{self, Keyspace};
use meridian_types::limits::MAX_SCAN_ENTRIES_PER_PAGE;
use meridian_types::Timestamp;

/// A visible version: its timestamp and value.
pub type Versioned = (Timestamp, Vec<u8>);

const TAG_PUT: u8 = 1;
const TAG_TOMBSTONE: u8 = 2;
/// The format-2 slot tag (timestamp only). Never written; rejected with a clear message.
const TAG_SLOT_V2: u8 = 3;
const TAG_LATEST: u8 = 4;
/// `TAG_LATEST ‖ ts u64 BE`, before the version's own encoding.
const SLOT_HEADER_BYTES: usize = 9;

/// The value of one version.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum VersionValue {
    Put(Vec<u8>),
    Tombstone,
}

impl VersionValue {
    pub fn encode(&self) -> Vec<u8> {
        match self {
            VersionValue::Put(v) => encode_put(v),
            VersionValue::Tombstone => vec![TAG_TOMBSTONE],
        }
    }

    pub fn decode(raw: &[u8]) -> Result<VersionValue> {
        Ok(match decode_version_ref(raw)? {
            Some(value) => VersionValue::Put(value.to_vec()),
            None => VersionValue::Tombstone,
        })
    }
}

/// Decodes a version's encoding without copying: `Some(value)` for a Put, `None` for a
/// tombstone.
pub(crate) fn decode_version_ref(raw: &[u8]) -> Result<Option<&[u8]>> {
    match raw.split_first() {
        Some((&TAG_PUT, value)) => Ok(Some(value)),
        Some((&TAG_TOMBSTONE, [])) => Ok(None),
        Some((&TAG_TOMBSTONE, rest)) => Err(Error::corrupt(
            "version value",
            format!("tombstone with {} trailing bytes", rest.len()),
        )),
        Some((&TAG_LATEST | &TAG_SLOT_V2, _)) => Err(Error::corrupt(
            "version value",
            "latest-version slot value under a version key",
        )),
        Some((tag, _)) => Err(Error::corrupt(
            "version value",
            format!("unknown tag {tag}"),
        )),
        None => Err(Error::corrupt("version value", "empty")),
    }
}

fn encode_put(value: &[u8]) -> Vec<u8> {
    let mut raw = Vec::with_capacity(1 + value.len());
    raw.push(TAG_PUT);
    raw.extend_from_slice(value);
    raw
}

/// The value of a latest-version slot: `newest` and a copy of that version's encoding.
fn encode_slot(newest: Timestamp, version: &[u8]) -> Vec<u8> {
    let mut raw = Vec::with_capacity(SLOT_HEADER_BYTES + version.len());
    raw.push(TAG_LATEST);
    raw.extend_from_slice(&newest.0.to_be_bytes());
    raw.extend_from_slice(version);
    raw
}

/// Splits a latest-version slot value into the newest version's timestamp and its encoding
/// (checked: a Put or a tombstone), without copying the value.
pub(crate) fn split_slot(raw: &[u8]) -> Result<(Timestamp, Option<&[u8]>)> {
    const WHAT: &str = "latest-version slot";
    match raw.split_first() {
        Some((&TAG_LATEST, rest)) => {
            if rest.len() < SLOT_HEADER_BYTES {
                return Err(Error::corrupt(
                    WHAT,
                    format!(
                        "{} bytes, want at least {}",
                        raw.len(),
                        SLOT_HEADER_BYTES + 1
                    ),
                ));
            }
            let (ts, version) = rest.split_at(8);
            let mut be = [0u8; 8];
            be.copy_from_slice(ts);
            let ts = Timestamp(u64::from_be_bytes(be));
            if keys::is_slot_ts(ts) {
                return Err(Error::corrupt(
                    WHAT,
                    "names Timestamp::MAX, which no version may carry",
                ));
            }
            Ok((ts, decode_version_ref(version)?))
        }
        Some((&TAG_SLOT_V2, _)) => Err(Error::corrupt(
            WHAT,
            "tag 3 is the format-2 slot (timestamp only); this build reads format 3",
        )),
        Some((tag, _)) => Err(Error::corrupt(
            WHAT,
            format!("tag {tag}, want {TAG_LATEST}"),
        )),
        None => Err(Error::corrupt(WHAT, "empty")),
    }
}

/// Decodes a latest-version slot value into the newest version's timestamp and value.
pub fn decode_slot(raw: &[u8]) -> Result<(Timestamp, VersionValue)> {
    let (ts, value) = split_slot(raw)?;
    let value = match value {
        Some(v) => VersionValue::Put(v.to_vec()),
        None => VersionValue::Tombstone,
    };
    Ok((ts, value))
}

/// Adds the version `raw` of `key` at `ts` and overwrites the key's slot with a copy of it.
fn write_version(batch: &mut WriteBatch, space: Keyspace, key: &[u8], ts: Timestamp, raw: Vec<u8>) {
    assert!(
        ts <= keys::MAX_VERSION_TS,
        "version timestamp {} is Timestamp::MAX, reserved for the latest-version slot",
        ts.0
    );
    let slot = encode_slot(ts, &raw);
    batch.put(Cf::Data, keys::data_key(space, key, ts), raw);
    batch.put(Cf::Data, keys::data_slot_key(space, key), slot);
}

/// Adds a version of `key` holding `value` at `ts` to `batch`, and overwrites the key's
/// latest-version slot with `ts` and a copy of `value` in the same batch (so `value` is
/// written twice; see the module docs).
///
/// Preconditions (see the module docs): per key, writes are applied in non-decreasing
/// timestamp order, so `ts` is the key's newest version once the batch is applied;
/// `ts < Timestamp::MAX` (panics otherwise: `MAX` is the slot's key). The empty key is a key
/// like any other here (the API refuses it).
pub fn put(
    batch: &mut WriteBatch,
    space: impl Into<Keyspace>,
    key: &[u8],
    ts: Timestamp,
    value: &[u8],
) {
    write_version(batch, space.into(), key, ts, encode_put(value));
}

/// Adds a tombstone version of `key` at `ts` to `batch`, and overwrites the key's
/// latest-version slot with `ts` and a tombstone in the same batch. Same preconditions as
/// [`put`].
pub fn delete(batch: &mut WriteBatch, space: impl Into<Keyspace>, key: &[u8], ts: Timestamp) {
    write_version(
        batch,
        space.into(),
        key,
        ts,
        VersionValue::Tombstone.encode(),
    );
}

/// Turns the first entry found by a seek from `data_key(space, key, read_ts)` into a read
/// result.
pub(crate) fn visible(found: Option<KvPair>) -> Result<Option<Versioned>> {
    let Some((k, v)) = found else {
        return Ok(None);
    };
    let (_, ts) = keys::split_data_key(&k)?;
    if keys::is_slot_ts(ts) {
        // Seeks start at a real read timestamp, which sorts after the slot.
        return Err(Error::corrupt(
            "data key",
            "seek for a version landed on a latest-version slot",
        ));
    }
    visible_at(ts, &v)
}

/// The read result of version `raw` at `ts`: tombstones read as `None`.
fn visible_at(ts: Timestamp, raw: &[u8]) -> Result<Option<Versioned>> {
    Ok(decode_version_ref(raw)?.map(|v| (ts, v.to_vec())))
}

/// `[start, end)` of a bounded seek for the newest version of `key` at or below `read_ts`.
/// `read_ts` is clamped to [`keys::MAX_VERSION_TS`] (no version is newer) so the seek never
/// starts at the slot.
pub(crate) fn seek_bounds(space: Keyspace, key: &[u8], read_ts: Timestamp) -> KvPair {
    let start = keys::data_key(space, key, read_ts.min(keys::MAX_VERSION_TS));
    let (_, end) = keys::data_key_versions_range(space, key);
    (start, end)
}

/// The newest version of `key` with `ts <= read_ts`, as `(ts, value)`; `None` if there is
/// none or it is a tombstone.
///
/// One point get of the key's slot, which answers directly when the newest version is
/// visible at `read_ts` (the common case); only a read below the newest version also seeks.
/// See the module docs.
pub fn get(
    engine: &dyn Engine,
    space: impl Into<Keyspace>,
    key: &[u8],
    read_ts: Timestamp,
) -> Result<Option<Versioned>> {
    let space = space.into();
    let Some(slot) = engine.get(Cf::Data, &keys::data_slot_key(space, key))? else {
        return Ok(None);
    };
    let (newest, value) = split_slot(&slot)?;
    if newest <= read_ts {
        return Ok(value.map(|v| (newest, v.to_vec())));
    }
    let (start, end) = seek_bounds(space, key, read_ts);
    let first = engine
        .scan(Cf::Data, &start, Some(&end), false)
        .next()
        .transpose()?;
    visible(first)
}

fn check_len(what: &'static str, got: usize, want: usize) -> Result<()> {
    if got == want {
        Ok(())
    } else {
        Err(Error::corrupt(
            what,
            format!("{got} results for {want} keys"),
        ))
    }
}

/// [`get`] for many keys; results in the order of `keys`. Duplicates are allowed.
///
/// One [`Engine::multi_get`] of the keys' slots (sorted ascending), which answers every key
/// whose newest version is at or below `read_ts`, plus one [`Engine::seek_first_many`] for
/// the others (none when `read_ts` is at or above every key's newest version).
pub fn multi_get(
    engine: &dyn Engine,
    space: impl Into<Keyspace>,
    keys: &[&[u8]],
    read_ts: Timestamp,
) -> Result<Vec<Option<Versioned>>> {
    let space = space.into();
    let mut out = vec![None; keys.len()];
    if keys.is_empty() {
        return Ok(out);
    }
    // Sorting the user keys sorts the slot keys too: the encoding preserves order and
    // distinct user keys differ before the timestamp suffix.
    let mut order: Vec<usize> = (0..keys.len()).collect();
    order.sort_by(|&a, &b| keys[a].cmp(keys[b]));

    let slot_keys: Vec<Vec<u8>> = order
        .iter()
        .map(|&i| keys::data_slot_key(space, keys[i]))
        .collect();
    let slot_refs: Vec<&[u8]> = slot_keys.iter().map(Vec::as_slice).collect();
    let slots = engine.multi_get(Cf::Data, &slot_refs)?;
    check_len("multi_get result", slots.len(), slot_keys.len())?;

    // Keys whose newest version is visible: answered by the slot. The rest: seek.
    let mut past: Vec<usize> = Vec::new();
    let mut past_bounds: Vec<KvPair> = Vec::new();
    for (&i, slot) in order.iter().zip(slots) {
        let Some(slot) = slot else {
            continue; // never written: stays None
        };
        let (newest, value) = split_slot(&slot)?;
        if newest <= read_ts {
            out[i] = value.map(|v| (newest, v.to_vec()));
        } else {
            past.push(i);
            past_bounds.push(seek_bounds(space, keys[i], read_ts));
        }
    }

    if !past_bounds.is_empty() {
        let ranges: Vec<(&[u8], &[u8])> = past_bounds
            .iter()
            .map(|(s, e)| (s.as_slice(), e.as_slice()))
            .collect();
        let found = engine.seek_first_many(Cf::Data, &ranges)?;
        check_len("seek_first_many result", found.len(), ranges.len())?;
        for (i, entry) in past.into_iter().zip(found) {
            out[i] = visible(entry)?;
        }
    }
    Ok(out)
}

/// One page of a [`scan`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ScanPage {
    /// `(user_key, version_ts, value)` in scan order.
    pub rows: Vec<(Vec<u8>, Timestamp, Vec<u8>)>,
    /// Where the next page starts, or `None` if the range holds no further visible key.
    /// Forward: the next page's inclusive `start` (the first key not yet decided).
    /// Reverse: the next page's exclusive `end` (the last key decided).
    /// Set also when the page stopped at its budget of examined entries
    /// ([`MAX_SCAN_ENTRIES_PER_PAGE`]), possibly with fewer than `limit` rows, or none.
    pub resume_key: Option<Vec<u8>>,
}

/// Visible user keys in `[start, end)` (`end = None`: to the end of the keyspace; a shard's
/// caller bounds it by the shard's span) at `read_ts`,
/// each at its newest version `<= read_ts`, tombstoned and invisible keys skipped, at most
/// `limit` rows (a `limit` of 0 is treated as 1), ascending or (`reverse`) descending. A page
/// examines at most [`MAX_SCAN_ENTRIES_PER_PAGE`] stored entries (finishing the key it is on)
/// and then returns early with a `resume_key`.
pub fn scan(
    engine: &dyn Engine,
    space: impl Into<Keyspace>,
    start: &[u8],
    end: Option<&[u8]>,
    read_ts: Timestamp,
    limit: usize,
    reverse: bool,
) -> Result<ScanPage> {
    scan_with_budget(
        engine,
        space,
        (start, end),
        read_ts,
        limit,
        reverse,
        MAX_SCAN_ENTRIES_PER_PAGE,
    )
}

/// [`scan`] with an explicit budget of examined entries (tests use small ones).
pub fn scan_with_budget(
    engine: &dyn Engine,
    space: impl Into<Keyspace>,
    (start, end): (&[u8], Option<&[u8]>),
    read_ts: Timestamp,
    limit: usize,
    reverse: bool,
    budget: usize,
) -> Result<ScanPage> {
    let limit = limit.max(1);
    let (lower, upper) = keys::data_scan_bounds(space, start, end);
    let iter = engine.scan(Cf::Data, &lower, Some(&upper), reverse);
    let budget = budget.max(1);
    if reverse {
        scan_reverse(iter, read_ts, limit, budget)
    } else {
        scan_forward(iter, (read_ts, read_ts), limit, budget).map(|(page, _)| page)
    }
}

/// A forward [`scan`] at `read_ts` that also reports the newest version timestamp of the
/// examined keys in the window `(read_ts, window_end]` (tombstones included), if any: a
/// snapshot read's uncertainty check (see `uncertainty`).
pub fn scan_in_window(
    engine: &dyn Engine,
    space: impl Into<Keyspace>,
    (start, end): (&[u8], Option<&[u8]>),
    (read_ts, window_end): (Timestamp, Timestamp),
    limit: usize,
) -> Result<(ScanPage, Option<Timestamp>)> {
    let (lower, upper) = keys::data_scan_bounds(space, start, end);
    let iter = engine.scan(Cf::Data, &lower, Some(&upper), false);
    scan_forward(
        iter,
        (read_ts, window_end),
        limit.max(1),
        MAX_SCAN_ENTRIES_PER_PAGE,
    )
}

type RawIter<'a> = KvIter<'a>;

pub(crate) fn decode_user_key(prefix: &[u8]) -> Result<Vec<u8>> {
    keys::decode_version_prefix(prefix)
}

fn scan_forward(
    iter: RawIter<'_>,
    (read_ts, window_end): (Timestamp, Timestamp),
    limit: usize,
    budget: usize,
) -> Result<(ScanPage, Option<Timestamp>)> {
    let mut page = ScanPage::default();
    let mut uncertain: Option<Timestamp> = None;
    // The version prefix of the key whose visible version was already decided.
    let mut done_prefix: Option<Vec<u8>> = None;
    // The key group the iterator is in, and how many entries were examined.
    let mut current: Option<Vec<u8>> = None;
    let mut examined = 0usize;
    for item in iter {
        let (k, v) = item?;
        let (prefix, ts) = keys::split_data_key(&k)?;
        examined += 1;
        if current.as_deref() != Some(prefix) {
            // At a key boundary: stop here if over budget, once at least one key is behind us
            // (so the next page starts strictly later and every page makes progress).
            if examined > budget && current.is_some() {
                page.resume_key = Some(decode_user_key(prefix)?);
                break;
            }
            current = Some(prefix.to_vec());
        }
        // The slot sorts first in its key's group; `ts > read_ts` alone would not skip it at
        // `read_ts = Timestamp::MAX`.
        if keys::is_slot_ts(ts) || done_prefix.as_deref() == Some(prefix) {
            continue;
        }
        if ts > read_ts {
            if ts <= window_end {
                uncertain = uncertain.max(Some(ts));
            }
            continue;
        }
        // First version of this key at or below read_ts: the visible one.
        done_prefix = Some(prefix.to_vec());
        if let VersionValue::Put(value) = VersionValue::decode(&v)? {
            let user_key = decode_user_key(prefix)?;
            if page.rows.len() == limit {
                page.resume_key = Some(user_key);
                break;
            }
            page.rows.push((user_key, ts, value));
        }
    }
    Ok((page, uncertain))
}

fn scan_reverse(
    iter: RawIter<'_>,
    read_ts: Timestamp,
    limit: usize,
    budget: usize,
) -> Result<ScanPage> {
    let mut page = ScanPage::default();
    // Versions of one key arrive oldest first; keep the newest one at or below read_ts.
    let mut group: Option<Vec<u8>> = None;
    let mut candidate: Option<Versioned> = None;
    let mut examined = 0usize;

    for item in iter {
        let (k, v) = item?;
        let (prefix, ts) = keys::split_data_key(&k)?;
        examined += 1;
        if examined > budget && group.as_deref().is_some_and(|g| g != prefix) {
            // Over budget at a key boundary: finish the group behind us and resume below it.
            let prev = group.take().expect("checked");
            if finish_group(&prev, candidate.take(), &mut page, limit)? {
                page.resume_key = Some(decode_user_key(&prev)?);
            }
            return Ok(page);
        }
        if keys::is_slot_ts(ts) {
            // Arrives last in its key's group (it sorts first); never a row.
            continue;
        }
        if group.as_deref() != Some(prefix) {
            if let Some(prev) = group.take() {
                if !finish_group(&prev, candidate.take(), &mut page, limit)? {
                    return Ok(page);
                }
            }
            group = Some(prefix.to_vec());
            candidate = None;
        }
        if ts <= read_ts {
            candidate = Some((ts, v));
        }
    }
    if let Some(prev) = group {
        finish_group(&prev, candidate, &mut page, limit)?;
    }
    Ok(page)
}

/// Emits a finished reverse-scan group's visible version (if a Put); returns false (and sets
/// the resume key) when the page is already full.
fn finish_group(
    prefix: &[u8],
    candidate: Option<Versioned>,
    page: &mut ScanPage,
    limit: usize,
) -> Result<bool> {
    let Some((ts, raw)) = candidate else {
        return Ok(true);
    };
    if let VersionValue::Put(value) = VersionValue::decode(&raw)? {
        if page.rows.len() == limit {
            page.resume_key = page.rows.last().map(|(k, _, _)| k.clone());
            return Ok(false);
        }
        page.rows.push((decode_user_key(prefix)?, ts, value));
    }
    Ok(true)
}

/// The timestamp of `key`'s newest version (tombstones included), or `None` if it has none.
/// One point get of the key's latest-version slot (its value copy is checked, not copied).
pub fn latest_version_ts(
    engine: &dyn Engine,
    space: impl Into<Keyspace>,
    key: &[u8],
) -> Result<Option<Timestamp>> {
    engine
        .get(Cf::Data, &keys::data_slot_key(space, key))?
        .map(|raw| split_slot(&raw).map(|(ts, _)| ts))
        .transpose()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{KeyRange, MemoryEngine};
    use meridian_types::ShardId;
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

    /// Scans at `Timestamp::MAX` (where `ts > read_ts` skips nothing) never return slots.
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
        fn scan<'a>(
            &'a self,
            cf: Cf,
            start: &[u8],
            end: Option<&[u8]>,
            reverse: bool,
        ) -> KvIter<'a> {
            self.scans.fetch_add(1, Ordering::Relaxed);
            self.inner.scan(cf, start, end, reverse)
        }
        fn seek_first_many(
            &self,
            cf: Cf,
            ranges: &[(&[u8], &[u8])],
        ) -> Result<Vec<Option<KvPair>>> {
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
}
