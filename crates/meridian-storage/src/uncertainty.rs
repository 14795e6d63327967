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
//! One `MultiGet` of the keys' latest-version slots answers keys whose newest version is at or
//! below `read_ts` (nothing in the window) or inside the window (that one is the newest);
//! only keys whose newest version is beyond the window need a seek for their newest version at
//! or below `window_end`.

use crate::engine::{Cf, Engine, KvPair};
use crate::error::Result;
use crate::keys;
use crate::mvcc::{seek_bounds, split_slot};
use meridian_types::{ShardId, Timestamp};

/// The newest version timestamp in `(read_ts, window_end]` among `keys`' versions, or `None`.
pub fn newest_in_window(
    engine: &dyn Engine,
    shard: ShardId,
    keys: &[&[u8]],
    read_ts: Timestamp,
    window_end: Timestamp,
) -> Result<Option<Timestamp>> {
    if window_end <= read_ts || keys.is_empty() {
        return Ok(None);
    }
    let mut sorted: Vec<&[u8]> = keys.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let slot_keys: Vec<Vec<u8>> = sorted
        .iter()
        .map(|k| keys::data_slot_key(shard, k))
        .collect();
    let slot_refs: Vec<&[u8]> = slot_keys.iter().map(Vec::as_slice).collect();
    let slots = engine.multi_get(Cf::Data, &slot_refs)?;
    let mut newest: Option<Timestamp> = None;
    let mut beyond: Vec<KvPair> = Vec::new();
    for (key, slot) in sorted.iter().zip(slots) {
        let Some(slot) = slot else { continue };
        let (ts, _) = split_slot(&slot)?;
        if ts <= read_ts {
            continue;
        }
        if ts <= window_end {
            newest = newest.max(Some(ts));
        } else {
            beyond.push(seek_bounds(shard, key, window_end));
        }
    }
    if !beyond.is_empty() {
        let ranges: Vec<(&[u8], &[u8])> = beyond
            .iter()
            .map(|(s, e)| (s.as_slice(), e.as_slice()))
            .collect();
        for (k, _) in engine
            .seek_first_many(Cf::Data, &ranges)?
            .into_iter()
            .flatten()
        {
            let (_, ts) = keys::split_data_key(&k)?;
            if ts > read_ts && ts <= window_end {
                newest = newest.max(Some(ts));
            }
        }
    }
    Ok(newest)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::WriteBatch;
    use crate::memory::MemoryEngine;
    use crate::mvcc;

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

    fn window(engine: &MemoryEngine, keys: &[&str], read: u64, end: u64) -> Option<u64> {
        let keys: Vec<&[u8]> = keys.iter().map(|k| k.as_bytes()).collect();
        newest_in_window(engine, SHARD, &keys, Timestamp(read), Timestamp(end))
            .unwrap()
            .map(|t| t.0)
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
        let scan = |read: u64, end: u64| {
            mvcc::scan_in_window(
                &engine,
                SHARD,
                (b"", None),
                (Timestamp(read), Timestamp(end)),
                10,
            )
            .unwrap()
        };
        let (page, uncertain) = scan(20, 30);
        let keys: Vec<&[u8]> = page.rows.iter().map(|(k, _, _)| k.as_slice()).collect();
        assert_eq!(keys, vec![&b"a"[..], b"b"], "rows at the read timestamp");
        assert_eq!(uncertain, Some(Timestamp(25)));
        assert_eq!(scan(20, 20).1, None);
        assert_eq!(scan(30, 45).1, Some(Timestamp(40)));
        assert_eq!(scan(40, 45).1, None);
    }
}
