//! Checking an optimistic transaction's reads against a shard's current state.
//!
//! A transaction reads with ordinary linearizable reads, buffers its writes in the client, and
//! at commit sends its read set: each key with the version it saw ([`ReadCheck`]) and each
//! scanned range with the rows it saw ([`RangeCheck`]). The transaction is serializable iff
//! every one of those reads still holds at the commit's serialization point — then it behaves
//! as if it had run entirely at that point. For a commit with writes the point is the
//! command's place in the shard's Raft log (apply runs the check, see `apply`); for a
//! read-only transaction it is a linearizable read after all its reads (the `Kv` service runs
//! the check under a lease or ReadIndex).
//!
//! A read "holds" when the key's *newest* version is still the one read — compared by version
//! timestamp, which names a version uniquely because a shard's versions strictly increase in
//! log order. Absent and deleted read the same (`None`). A range holds when its live keys are
//! exactly the rows read, each at the same version: a new key in the range (a phantom), a
//! removed one or a changed one is a conflict.
//!
//! # Invariants
//! - The verdict depends only on the state given (`LatestView`) and the checks: every replica
//!   applying the same log reaches the same verdict.
//! - Storage errors are returned, never turned into a verdict.

use crate::types::{RangeCheck, ReadCheck};
use bytes::Bytes;
use meridian_storage::{keys::MAX_VERSION_TS, mvcc, Engine};
use meridian_types::ShardId;
use std::io;

/// Most scan pages one range check reads (each page makes progress; this only guards bugs).
const MAX_CHECK_PAGES: usize = 10_000;

/// A shard's newest state, as a transaction check sees it.
pub trait LatestView {
    /// The version timestamp of `key`'s live value; `None` if absent or deleted.
    fn latest(&self, key: &Bytes) -> io::Result<Option<u64>>;
    /// The first `want` live keys of `[start, end)` ascending, with their version timestamps.
    fn live_rows(
        &self,
        start: &Bytes,
        end: Option<&Bytes>,
        want: usize,
    ) -> io::Result<Vec<(Bytes, u64)>>;
}

/// The first read that no longer holds: the changed key, or the start of the changed range.
pub fn first_conflict(
    view: &dyn LatestView,
    reads: &[ReadCheck],
    ranges: &[RangeCheck],
) -> io::Result<Option<Bytes>> {
    for read in reads {
        if view.latest(&read.key)? != read.version {
            return Ok(Some(read.key.clone()));
        }
    }
    for range in ranges {
        // One row more than was read: a phantom past the last row shows up as that extra row.
        let now = view.live_rows(&range.start, range.end.as_ref(), range.rows.len() + 1)?;
        if now != range.rows {
            return Ok(Some(range.start.clone()));
        }
    }
    Ok(None)
}

/// A shard's committed state in an engine (no pending writes).
pub struct EngineView<'a> {
    pub engine: &'a dyn Engine,
    pub shard: ShardId,
}

impl LatestView for EngineView<'_> {
    fn latest(&self, key: &Bytes) -> io::Result<Option<u64>> {
        let found = mvcc::get(self.engine, self.shard, key, MAX_VERSION_TS)
            .map_err(|e| io::Error::other(format!("shard {}: txn check: {e}", self.shard)))?;
        Ok(found.map(|(ts, _)| ts.0))
    }

    fn live_rows(
        &self,
        start: &Bytes,
        end: Option<&Bytes>,
        want: usize,
    ) -> io::Result<Vec<(Bytes, u64)>> {
        let mut rows = Vec::new();
        let mut from = start.to_vec();
        for _ in 0..MAX_CHECK_PAGES {
            let page = mvcc::scan(
                self.engine,
                self.shard,
                &from,
                end.map(|e| e.as_ref()),
                MAX_VERSION_TS,
                want - rows.len(),
                false,
            )
            .map_err(|e| io::Error::other(format!("shard {}: txn range check: {e}", self.shard)))?;
            rows.extend(
                page.rows
                    .into_iter()
                    .map(|(key, ts, _)| (Bytes::from(key), ts.0)),
            );
            match page.resume_key {
                Some(next) if rows.len() < want => from = next,
                _ => return Ok(rows),
            }
        }
        Err(io::Error::other(format!(
            "shard {}: txn range check made no progress in {MAX_CHECK_PAGES} pages",
            self.shard
        )))
    }
}
