//! Point reads at a read timestamp: [`get`], [`multi_get`] and [`latest_version_ts`]. Each
//! is answered by the key's latest-version slot (one exact-key lookup, batched by MultiGet),
//! and seeks only for keys written after `read_ts`.

use super::encoding::{decode_version_ref, split_slot};
use super::Versioned;
use crate::engine::{Cf, Engine, KvPair};
use crate::error::{Error, Result};
use crate::keys::{self, Keyspace};
use meridian_types::Timestamp;

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
