//! [`MemoryEngine`]: the [`Engine`] on one `BTreeMap` per column family under a `RwLock`.
//!
//! For unit tests, property tests and deterministic simulation. It has the same semantics as
//! [`RocksEngine`](crate::RocksEngine) (both pass `crate::conformance`) except durability:
//! nothing survives the process, so `sync` and `flush` are no-ops.
//!
//! # Snapshot file format
//! `export_sst` writes its own format so the snapshot code path (export, ship the file,
//! ingest) runs unchanged in tests:
//!
//! ```text
//! magic "MRDNMEM1" ‖ count u64 BE ‖ count × (key_len u32 BE ‖ value_len u32 BE ‖ key ‖ value)
//!                  ‖ crc32 u32 BE over everything before it
//! ```
//!
//! Reading checks the magic, every length against [`MAX_ENTRY_BYTES`], the key order, the
//! range and the checksum before touching the map, so ingest is all-or-nothing.
//!
//! # Not done yet
//! - `scan` materializes the whole range under the read lock (fine for tests, not for
//!   millions of keys).

use crate::engine::{BatchOp, Cf, Engine, KeyRange, KvIter, KvPair, WriteBatch, MAX_ENTRY_BYTES};
use crate::error::{Error, Result};
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::ops::Bound;
use std::path::Path;
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

const FILE_MAGIC: &[u8; 8] = b"MRDNMEM1";

type Tree = BTreeMap<Vec<u8>, Vec<u8>>;

/// The in-memory engine.
#[derive(Debug, Default)]
pub struct MemoryEngine {
    trees: RwLock<[Tree; 5]>,
}

impl MemoryEngine {
    pub fn new() -> MemoryEngine {
        MemoryEngine::default()
    }

    fn read(&self) -> RwLockReadGuard<'_, [Tree; 5]> {
        // A panic while holding the lock cannot leave a tree half-updated (every mutation
        // below completes before it can panic), so a poisoned lock's data is still valid.
        self.trees.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write_lock(&self) -> RwLockWriteGuard<'_, [Tree; 5]> {
        self.trees.write().unwrap_or_else(|e| e.into_inner())
    }
}

fn range_bounds<'k>(start: &'k [u8], end: Option<&'k [u8]>) -> (Bound<&'k [u8]>, Bound<&'k [u8]>) {
    (
        Bound::Included(start),
        end.map_or(Bound::Unbounded, Bound::Excluded),
    )
}

fn delete_range(tree: &mut Tree, start: &[u8], end: &[u8]) {
    if start >= end {
        return;
    }
    let doomed: Vec<Vec<u8>> = tree
        .range::<[u8], _>(range_bounds(start, Some(end)))
        .map(|(k, _)| k.clone())
        .collect();
    for k in doomed {
        tree.remove(&k);
    }
}

impl Engine for MemoryEngine {
    fn get(&self, cf: Cf, key: &[u8]) -> Result<Option<Vec<u8>>> {
        Ok(self.read()[cf.index()].get(key).cloned())
    }

    fn multi_get(&self, cf: Cf, keys: &[&[u8]]) -> Result<Vec<Option<Vec<u8>>>> {
        let trees = self.read();
        let tree = &trees[cf.index()];
        Ok(keys.iter().map(|k| tree.get(*k).cloned()).collect())
    }

    fn scan<'a>(&'a self, cf: Cf, start: &[u8], end: Option<&[u8]>, reverse: bool) -> KvIter<'a> {
        if end.is_some_and(|end| end <= start) {
            return Box::new(std::iter::empty());
        }
        let trees = self.read();
        let range = trees[cf.index()].range::<[u8], _>(range_bounds(start, end));
        let mut rows: Vec<KvPair> = range.map(|(k, v)| (k.clone(), v.clone())).collect();
        if reverse {
            rows.reverse();
        }
        Box::new(rows.into_iter().map(Ok))
    }

    fn write(&self, batch: WriteBatch, _sync: bool) -> Result<()> {
        let mut trees = self.write_lock();
        for op in batch.into_ops() {
            match op {
                BatchOp::Put { cf, key, value } => {
                    trees[cf.index()].insert(key, value);
                }
                BatchOp::Delete { cf, key } => {
                    trees[cf.index()].remove(&key);
                }
                BatchOp::DeleteRange { cf, start, end } => {
                    delete_range(&mut trees[cf.index()], &start, &end)
                }
            }
        }
        Ok(())
    }

    fn flush(&self) -> Result<()> {
        Ok(())
    }

    fn export_sst(&self, cf: Cf, ranges: &[KeyRange<'_>], path: &Path) -> Result<u64> {
        crate::engine::check_ranges(ranges)?;
        let rows: Vec<KvPair> = {
            let trees = self.read();
            ranges
                .iter()
                .filter(|(s, e)| s < e)
                .flat_map(|&(start, end)| {
                    trees[cf.index()]
                        .range::<[u8], _>(range_bounds(start, Some(end)))
                        .map(|(k, v)| (k.clone(), v.clone()))
                })
                .collect()
        };
        if rows.is_empty() {
            return Ok(0);
        }
        let mut buf = Vec::new();
        buf.extend_from_slice(FILE_MAGIC);
        buf.extend_from_slice(&(rows.len() as u64).to_be_bytes());
        for (k, v) in &rows {
            let key_len =
                u32::try_from(k.len()).map_err(|_| Error::corrupt("entry", "key too large"))?;
            let value_len =
                u32::try_from(v.len()).map_err(|_| Error::corrupt("entry", "value too large"))?;
            buf.extend_from_slice(&key_len.to_be_bytes());
            buf.extend_from_slice(&value_len.to_be_bytes());
            buf.extend_from_slice(k);
            buf.extend_from_slice(v);
        }
        let crc = crc32fast::hash(&buf);
        buf.extend_from_slice(&crc.to_be_bytes());
        let mut file = std::fs::File::create(path)?;
        file.write_all(&buf)?;
        file.sync_all()?;
        Ok(rows.len() as u64)
    }

    fn ingest_sst(&self, cf: Cf, ranges: &[KeyRange<'_>], path: Option<&Path>) -> Result<()> {
        crate::engine::check_ranges(ranges)?;
        let rows = match path {
            Some(path) => read_snapshot_file(path, ranges)?,
            None => Vec::new(),
        };
        let mut trees = self.write_lock();
        let tree = &mut trees[cf.index()];
        for &(start, end) in ranges {
            delete_range(tree, start, end);
        }
        tree.extend(rows);
        Ok(())
    }
}

/// Reads and fully validates a snapshot file written by `export_sst`.
fn read_snapshot_file(path: &Path, ranges: &[KeyRange<'_>]) -> Result<Vec<KvPair>> {
    const WHAT: &str = "memory snapshot file";
    let mut raw = Vec::new();
    std::fs::File::open(path)?.read_to_end(&mut raw)?;
    if raw.len() < FILE_MAGIC.len() + 8 + 4 {
        return Err(Error::corrupt(
            WHAT,
            format!("{} bytes, too short", raw.len()),
        ));
    }
    let (body, crc_bytes) = raw.split_at(raw.len() - 4);
    let stored_crc = u32::from_be_bytes(take::<4>(crc_bytes, WHAT)?);
    if crc32fast::hash(body) != stored_crc {
        return Err(Error::corrupt(WHAT, "checksum mismatch"));
    }
    let (magic, mut rest) = body.split_at(FILE_MAGIC.len());
    if magic != FILE_MAGIC {
        return Err(Error::corrupt(WHAT, "bad magic"));
    }
    let count = u64::from_be_bytes(take::<8>(rest, WHAT)?);
    rest = &rest[8..];
    let mut rows: Vec<KvPair> = Vec::new();
    for _ in 0..count {
        let header = take::<8>(rest, WHAT)?;
        rest = &rest[8..];
        let key_len = u32::from_be_bytes([header[0], header[1], header[2], header[3]]) as usize;
        let value_len = u32::from_be_bytes([header[4], header[5], header[6], header[7]]) as usize;
        if key_len > MAX_ENTRY_BYTES || value_len > MAX_ENTRY_BYTES {
            return Err(Error::corrupt(WHAT, "entry length over MAX_ENTRY_BYTES"));
        }
        if rest.len() < key_len + value_len {
            return Err(Error::corrupt(WHAT, "truncated entry"));
        }
        let (key, tail) = rest.split_at(key_len);
        let (value, tail) = tail.split_at(value_len);
        rest = tail;
        if !crate::engine::in_ranges(ranges, key) {
            return Err(Error::corrupt(WHAT, "key outside the ingested ranges"));
        }
        if rows.last().is_some_and(|(prev, _)| prev.as_slice() >= key) {
            return Err(Error::corrupt(WHAT, "keys not strictly ascending"));
        }
        rows.push((key.to_vec(), value.to_vec()));
    }
    if !rest.is_empty() {
        return Err(Error::corrupt(WHAT, "trailing bytes"));
    }
    Ok(rows)
}

fn take<const N: usize>(input: &[u8], what: &'static str) -> Result<[u8; N]> {
    input
        .get(..N)
        .and_then(|s| s.try_into().ok())
        .ok_or_else(|| Error::corrupt(what, "truncated header"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A flipped bit or a truncation in a snapshot file is refused and leaves the range intact.
    #[test]
    fn corrupt_snapshot_file_is_refused_without_side_effects() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("snap");
        let source = MemoryEngine::new();
        let mut b = WriteBatch::new();
        b.put(Cf::Data, b"k1".to_vec(), b"v1".to_vec());
        b.put(Cf::Data, b"k2".to_vec(), b"v2".to_vec());
        source.write(b, false).unwrap();
        assert_eq!(
            source.export_sst(Cf::Data, &[(b"k", b"l")], &path).unwrap(),
            2
        );
        let good = std::fs::read(&path).unwrap();

        let target = MemoryEngine::new();
        let mut b = WriteBatch::new();
        b.put(Cf::Data, b"k0".to_vec(), b"old".to_vec());
        target.write(b, false).unwrap();
        for bad in [
            {
                let mut f = good.clone();
                f[20] ^= 0x01;
                f
            },
            good[..good.len() - 1].to_vec(),
            Vec::new(),
        ] {
            std::fs::write(&path, &bad).unwrap();
            let err = target
                .ingest_sst(Cf::Data, &[(b"k", b"l")], Some(&path))
                .unwrap_err();
            assert!(matches!(err, Error::Corrupt { .. }), "{err}");
            assert_eq!(target.get(Cf::Data, b"k0").unwrap(), Some(b"old".to_vec()));
        }
        // Keys outside the ingested range are refused too.
        std::fs::write(&path, &good).unwrap();
        assert!(target
            .ingest_sst(Cf::Data, &[(b"k", b"k2")], Some(&path))
            .is_err());
        target
            .ingest_sst(Cf::Data, &[(b"k", b"l")], Some(&path))
            .unwrap();
        assert_eq!(target.get(Cf::Data, b"k0").unwrap(), None);
        assert_eq!(target.get(Cf::Data, b"k2").unwrap(), Some(b"v2".to_vec()));
    }
}
