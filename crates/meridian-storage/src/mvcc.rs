//! Multi-version reads and writes over an [`Engine`]'s `Cf::Data`, at HLC timestamps.
//!
//! Every write creates a new *version* of a user key at a timestamp; nothing is overwritten
//! in place. A read at `read_ts` sees, per key, the newest version with `ts <= read_ts`; if
//! that version is a tombstone the key does not exist at `read_ts`.
//!
//! ```text
//!  Cf::Data, one user key "k" (versions newest first thanks to !ts):
//!
//!    s ‖ enc("k") ‖ !30  → Put("c")        read at 35 → "c"@30
//!    s ‖ enc("k") ‖ !20  → Tombstone       read at 25 → none
//!    s ‖ enc("k") ‖ !10  → Put("a")        read at 15 → "a"@10,  read at 5 → none
//! ```
//!
//! # Value encoding
//! The first byte of a version's value is a tag: `1` = Put (the value bytes follow),
//! `2` = Tombstone (nothing follows). Anything else is `Error::Corrupt`.
//!
//! # Reads
//! - **Point read** ([`get`]): seek to `data_key(shard, key, read_ts)`; the first entry at or
//!   after it, if it is still a version of `key`, is the answer (a bounded seek: the upper
//!   bound is the end of the key's versions).
//! - **Batched read** ([`multi_get`]): RocksDB's MultiGet needs *exact* keys, but a versioned
//!   read does not know the timestamp of the version it wants, so MultiGet cannot serve it.
//!   Instead the keys are sorted and each does one bounded seek, all on one reused iterator
//!   ([`Engine::seek_first_many`]), which keeps the access pattern sequential. A "latest
//!   version" index (a column family `key → newest ts`) would make reads at `Timestamp::MAX`
//!   exact-key lookups that MultiGet could batch; it is not built yet.
//! - **Scan** ([`scan`]): one iterator over the user-key range; per key, the newest visible
//!   version. Forward iteration meets a key's newest version first and skips the rest.
//!   Reverse iteration meets the *oldest* version first, so it keeps the latest candidate with
//!   `ts <= read_ts` and emits it when the user key changes.
//!
//! # Invariants
//! - Writers never create two versions of a key at one timestamp with different values (the
//!   state machine enforces this; a second write at the same timestamp replaces the first).
//! - Reads never see versions above `read_ts`.
//!
//! # Not done yet
//! - No garbage collection of versions below a GC threshold.
//! - Intents are not consulted here; the transaction layer checks them around these reads.
//! - Scans skip invisible versions one by one (no re-seek past a key's remaining versions),
//!   so keys with very many versions make scans slower.

use crate::engine::{Cf, Engine, KvIter, KvPair, WriteBatch};
use crate::error::{Error, Result};
use crate::keys;
use meridian_types::{ShardId, Timestamp};

/// A visible version: its timestamp and value.
pub type Versioned = (Timestamp, Vec<u8>);

const TAG_PUT: u8 = 1;
const TAG_TOMBSTONE: u8 = 2;

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
        match raw.split_first() {
            Some((&TAG_PUT, value)) => Ok(VersionValue::Put(value.to_vec())),
            Some((&TAG_TOMBSTONE, [])) => Ok(VersionValue::Tombstone),
            Some((&TAG_TOMBSTONE, rest)) => Err(Error::corrupt(
                "version value",
                format!("tombstone with {} trailing bytes", rest.len()),
            )),
            Some((tag, _)) => Err(Error::corrupt(
                "version value",
                format!("unknown tag {tag}"),
            )),
            None => Err(Error::corrupt("version value", "empty")),
        }
    }
}

fn encode_put(value: &[u8]) -> Vec<u8> {
    let mut raw = Vec::with_capacity(1 + value.len());
    raw.push(TAG_PUT);
    raw.extend_from_slice(value);
    raw
}

/// Adds a version of `key` holding `value` at `ts` to `batch`.
pub fn put(batch: &mut WriteBatch, shard: ShardId, key: &[u8], ts: Timestamp, value: &[u8]) {
    batch.put(Cf::Data, keys::data_key(shard, key, ts), encode_put(value));
}

/// Adds a tombstone version of `key` at `ts` to `batch`.
pub fn delete(batch: &mut WriteBatch, shard: ShardId, key: &[u8], ts: Timestamp) {
    batch.put(
        Cf::Data,
        keys::data_key(shard, key, ts),
        VersionValue::Tombstone.encode(),
    );
}

/// Turns the first entry found at or after `data_key(shard, key, read_ts)` into a read result.
fn visible(found: Option<KvPair>) -> Result<Option<Versioned>> {
    let Some((k, v)) = found else {
        return Ok(None);
    };
    let (_, ts) = keys::split_data_key(&k)?;
    match VersionValue::decode(&v)? {
        VersionValue::Put(value) => Ok(Some((ts, value))),
        VersionValue::Tombstone => Ok(None),
    }
}

/// The newest version of `key` with `ts <= read_ts`, as `(ts, value)`; `None` if there is
/// none or it is a tombstone.
pub fn get(
    engine: &dyn Engine,
    shard: ShardId,
    key: &[u8],
    read_ts: Timestamp,
) -> Result<Option<Versioned>> {
    let start = keys::data_key(shard, key, read_ts);
    let (_, end) = keys::data_key_versions_range(shard, key);
    let first = engine
        .scan(Cf::Data, &start, Some(&end), false)
        .next()
        .transpose()?;
    visible(first)
}

/// [`get`] for many keys; results in the order of `keys`. Duplicates are allowed.
pub fn multi_get(
    engine: &dyn Engine,
    shard: ShardId,
    keys: &[&[u8]],
    read_ts: Timestamp,
) -> Result<Vec<Option<Versioned>>> {
    let mut order: Vec<usize> = (0..keys.len()).collect();
    order.sort_by(|&a, &b| keys[a].cmp(keys[b]));
    let bounds: Vec<KvPair> = order
        .iter()
        .map(|&i| {
            let (_, end) = keys::data_key_versions_range(shard, keys[i]);
            (keys::data_key(shard, keys[i], read_ts), end)
        })
        .collect();
    let ranges: Vec<(&[u8], &[u8])> = bounds
        .iter()
        .map(|(s, e)| (s.as_slice(), e.as_slice()))
        .collect();
    let found = engine.seek_first_many(Cf::Data, &ranges)?;
    if found.len() != keys.len() {
        return Err(Error::corrupt(
            "seek_first_many result",
            format!("{} results for {} ranges", found.len(), keys.len()),
        ));
    }
    let mut out = vec![None; keys.len()];
    for (&i, entry) in order.iter().zip(found) {
        out[i] = visible(entry)?;
    }
    Ok(out)
}

/// One page of a [`scan`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ScanPage {
    /// `(user_key, version_ts, value)` in scan order.
    pub rows: Vec<(Vec<u8>, Timestamp, Vec<u8>)>,
    /// Where the next page starts, or `None` if the range holds no further visible key.
    /// Forward: the next page's inclusive `start` (the first visible key not returned).
    /// Reverse: the next page's exclusive `end` (the last key returned).
    pub resume_key: Option<Vec<u8>>,
}

/// Visible user keys in `[start, end)` (`end = None`: to the end of the shard) at `read_ts`,
/// each at its newest version `<= read_ts`, tombstoned and invisible keys skipped, at most
/// `limit` rows (a `limit` of 0 is treated as 1), ascending or (`reverse`) descending.
pub fn scan(
    engine: &dyn Engine,
    shard: ShardId,
    start: &[u8],
    end: Option<&[u8]>,
    read_ts: Timestamp,
    limit: usize,
    reverse: bool,
) -> Result<ScanPage> {
    let limit = limit.max(1);
    let lower = keys::data_key_seek(shard, start);
    let upper = match end {
        Some(end) => keys::data_key_seek(shard, end),
        None => keys::shard_data_range(shard).1,
    };
    let iter = engine.scan(Cf::Data, &lower, Some(&upper), reverse);
    if reverse {
        scan_reverse(iter, read_ts, limit)
    } else {
        scan_forward(iter, read_ts, limit)
    }
}

type RawIter<'a> = KvIter<'a>;

fn decode_user_key(prefix: &[u8]) -> Result<Vec<u8>> {
    // `prefix` is `shard ‖ encode_bytes(user_key)`; split_data_key checked it has 8+ bytes.
    let (user_key, rest) = keys::decode_bytes(prefix.get(8..).unwrap_or_default())?;
    if !rest.is_empty() {
        return Err(Error::corrupt(
            "data key",
            "bytes between user key and timestamp",
        ));
    }
    Ok(user_key)
}

fn scan_forward(iter: RawIter<'_>, read_ts: Timestamp, limit: usize) -> Result<ScanPage> {
    let mut page = ScanPage::default();
    // The version prefix of the key whose visible version was already decided.
    let mut done_prefix: Option<Vec<u8>> = None;
    for item in iter {
        let (k, v) = item?;
        let (prefix, ts) = keys::split_data_key(&k)?;
        if done_prefix.as_deref() == Some(prefix) || ts > read_ts {
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
    Ok(page)
}

fn scan_reverse(iter: RawIter<'_>, read_ts: Timestamp, limit: usize) -> Result<ScanPage> {
    let mut page = ScanPage::default();
    // Versions of one key arrive oldest first; keep the newest one at or below read_ts.
    let mut group: Option<Vec<u8>> = None;
    let mut candidate: Option<Versioned> = None;

    for item in iter {
        let (k, v) = item?;
        let (prefix, ts) = keys::split_data_key(&k)?;
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
pub fn latest_version_ts(
    engine: &dyn Engine,
    shard: ShardId,
    key: &[u8],
) -> Result<Option<Timestamp>> {
    let (start, end) = keys::data_key_versions_range(shard, key);
    match engine
        .scan(Cf::Data, &start, Some(&end), false)
        .next()
        .transpose()?
    {
        Some((k, _)) => Ok(Some(keys::split_data_key(&k)?.1)),
        None => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemoryEngine;

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
        assert!(VersionValue::decode(&[3, 1]).is_err());
        assert!(VersionValue::decode(&[TAG_TOMBSTONE, 0]).is_err());
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
        assert_eq!(get(&e, ShardId(2), b"k", Timestamp::MAX).unwrap(), None);
    }
}
