//! The uncertainty check of a snapshot read: is there a version of these keys in the window
//! `(read_ts, window_end]`?
//!
//! A transaction reads every shard at one timestamp `read_ts`, picked from one node's clock.
//! Another node's clock may be ahead by up to `max_offset`, so a write acknowledged before the
//! transaction began can carry a timestamp above `read_ts`. The reader cannot tell such a
//! version from one written after it began, so a version inside the window makes the read
//! *uncertain*: the transaction must restart at a timestamp at or above it (see the `Kv`
//! service's snapshot reads and the client's transactions). Tombstones count: a delete in the
//! window is as uncertain as a put.
//!
//! [`multi_get_in_window`] reads the keys at `read_ts` and checks the window in the same pass:
//! one `MultiGet` of the keys' latest-version slots answers every key whose newest version is
//! at or below `read_ts` (its value) or inside the window (uncertain); only keys whose newest
//! version is beyond the window need a seek, for their newest version at or below
//! `window_end`, which is either inside the window (uncertain) or the one visible at
//! `read_ts`. So a snapshot read costs what a plain `BatchGet` at `read_ts` costs.

use crate::engine::{Cf, Engine};
use crate::error::Result;
use crate::keys::{self, Keyspace};
use crate::mvcc::{seek_bounds, split_slot, visible, Versioned};
use meridian_types::Timestamp;

/// `keys` read at `read_ts` (in input order, duplicates allowed, as `mvcc::multi_get`), and the
/// newest version timestamp in `(read_ts, window_end]` among their versions, if any. When the
/// second is `Some`, the first is incomplete and must not be used.
pub fn multi_get_in_window(
    engine: &dyn Engine,
    space: impl Into<Keyspace>,
    keys: &[&[u8]],
    read_ts: Timestamp,
    window_end: Timestamp,
) -> Result<(Vec<Option<Versioned>>, Option<Timestamp>)> {
    let space = space.into();
    let mut out: Vec<Option<Versioned>> = vec![None; keys.len()];
    if keys.is_empty() {
        return Ok((out, None));
    }
    let window_end = window_end.max(read_ts);
    // Sorted user keys sort their slot keys too (see `mvcc::multi_get`).
    let mut order: Vec<usize> = (0..keys.len()).collect();
    order.sort_by(|&a, &b| keys[a].cmp(keys[b]));
    let slot_keys: Vec<Vec<u8>> = order
        .iter()
        .map(|&i| keys::data_slot_key(space, keys[i]))
        .collect();
    let slot_refs: Vec<&[u8]> = slot_keys.iter().map(Vec::as_slice).collect();
    let slots = engine.multi_get(Cf::Data, &slot_refs)?;
    let mut uncertain: Option<Timestamp> = None;
    let mut beyond: Vec<usize> = Vec::new();
    for (&i, slot) in order.iter().zip(slots) {
        let Some(slot) = slot else { continue };
        let (ts, value) = split_slot(&slot)?;
        if ts <= read_ts {
            out[i] = value.map(|v| (ts, v.to_vec()));
        } else if ts <= window_end {
            uncertain = uncertain.max(Some(ts));
        } else {
            beyond.push(i);
        }
    }
    if !beyond.is_empty() {
        let bounds: Vec<_> = beyond
            .iter()
            .map(|&i| seek_bounds(space, keys[i], window_end))
            .collect();
        let ranges: Vec<(&[u8], &[u8])> = bounds
            .iter()
            .map(|(s, e)| (s.as_slice(), e.as_slice()))
            .collect();
        for (i, found) in beyond
            .into_iter()
            .zip(engine.seek_first_many(Cf::Data, &ranges)?)
        {
            let Some((k, v)) = found else { continue };
            let (_, ts) = keys::split_data_key(&k)?;
            if ts > read_ts {
                uncertain = uncertain.max(Some(ts));
            } else {
                out[i] = visible(Some((k, v)))?;
            }
        }
    }
    Ok((out, uncertain))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::WriteBatch;
    use crate::memory::MemoryEngine;
    use crate::mvcc;
    use meridian_types::ShardId;

    const SHARD: ShardId = ShardId(2);

    fn write(engine: &MemoryEngine, key: &str, ts: u64, value: Option<&str>) {
        let mut batch = WriteBatch::new();
        match value {
            Some(v) => mvcc::put(
                &mut batch,
                SHARD,
                key.as_bytes(),
                Timestamp(ts),
                v.as_bytes(),
            ),
            None => mvcc::delete(&mut batch, SHARD, key.as_bytes(), Timestamp(ts)),
        }
        engine.write(batch, false).unwrap();
    }

    /// The window's newest version; when there is none, the values must be `multi_get`'s.
    fn window(engine: &MemoryEngine, keys: &[&str], read: u64, end: u64) -> Option<u64> {
        let keys: Vec<&[u8]> = keys.iter().map(|k| k.as_bytes()).collect();
        let (values, uncertain) =
            multi_get_in_window(engine, SHARD, &keys, Timestamp(read), Timestamp(end)).unwrap();
        if uncertain.is_none() {
            let plain = mvcc::multi_get(engine, SHARD, &keys, Timestamp(read)).unwrap();
            assert_eq!(values, plain, "a certain read answers as multi_get does");
        }
        uncertain.map(|t| t.0)
    }

    #[test]
    fn finds_the_newest_version_inside_the_window_by_slot_or_by_seek() {
        let engine = MemoryEngine::new();
        write(&engine, "a", 10, Some("a10"));
        write(&engine, "b", 10, Some("b10"));
        write(&engine, "b", 25, None); // a tombstone inside the window counts
        write(&engine, "c", 22, Some("c22"));
        write(&engine, "c", 40, Some("c40")); // newest beyond the window: found by a seek
        write(&engine, "d", 50, Some("d50")); // only beyond the window
                                              // Window (20, 30].
        assert_eq!(window(&engine, &["a"], 20, 30), None);
        assert_eq!(window(&engine, &["b"], 20, 30), Some(25));
        assert_eq!(window(&engine, &["c"], 20, 30), Some(22));
        assert_eq!(window(&engine, &["d"], 20, 30), None);
        assert_eq!(window(&engine, &["missing"], 20, 30), None);
        assert_eq!(
            window(&engine, &["d", "c", "a", "b", "c"], 20, 30),
            Some(25)
        );
        // An empty window (no uncertainty) never reports.
        assert_eq!(window(&engine, &["b", "c"], 20, 20), None);
        // The bounds: read_ts excluded, window_end included.
        assert_eq!(window(&engine, &["b"], 25, 30), None);
        assert_eq!(window(&engine, &["b"], 24, 25), Some(25));
    }

    #[test]
    fn a_windowed_scan_reports_versions_above_its_read_timestamp_inside_the_window() {
        let engine = MemoryEngine::new();
        write(&engine, "a", 10, Some("a10"));
        write(&engine, "b", 10, Some("b10"));
        write(&engine, "b", 25, None);
        write(&engine, "c", 40, Some("c40"));
        for reverse in [false, true] {
            let scan = |read: u64, end: u64| {
                mvcc::scan_in_window(
                    &engine,
                    SHARD,
                    (b"", None),
                    (Timestamp(read), Timestamp(end)),
                    10,
                    reverse,
                )
                .unwrap()
            };
            let (page, uncertain) = scan(20, 30);
            let mut keys: Vec<&[u8]> = page.rows.iter().map(|(k, _, _)| k.as_slice()).collect();
            if reverse {
                keys.reverse();
            }
            assert_eq!(keys, vec![&b"a"[..], b"b"], "rows at the read timestamp");
            assert_eq!(uncertain, Some(Timestamp(25)), "reverse {reverse}");
            assert_eq!(scan(20, 20).1, None);
            assert_eq!(scan(30, 45).1, Some(Timestamp(40)), "reverse {reverse}");
            assert_eq!(scan(40, 45).1, None);
            // The same rows as the plain scan when certain.
            let plain = mvcc::scan(&engine, SHARD, b"", None, Timestamp(40), 10, reverse);
            assert_eq!(scan(40, 45).0.rows, plain.unwrap().rows);
        }
    }
}
