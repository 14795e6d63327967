//! [`CrashEngine`]: an in-memory [`Engine`] that can lose power (feature `testing`).
//!
//! # Why
//! Killing a process (SIGKILL) cannot test `sync`: the OS page cache keeps everything the
//! killed process wrote, so an engine, or a caller, that never fsyncs passes every kill test.
//! Only losing the machine (power loss, kernel panic) loses unsynced writes, and a test cannot
//! pull the plug. `CrashEngine` simulates it in memory: it keeps the *durable* state apart from
//! the writes that are not durable yet, and [`CrashEngine::crash`] throws the latter away.
//!
//! # Model (the durability contract of [`crate::engine`])
//! - Reads see every write, durable or not, in write order, as on a live engine.
//! - `write(batch, sync = false)` appends the batch to an ordered list of pending writes.
//! - `write(batch, sync = true)`, `sync_wal` and `flush` make every pending write (and the
//!   batch) durable. `flush` persists because a RocksDB flush writes the memtables to SST files.
//! - `ingest_sst` clears the range as a synced write would (every pending write becomes
//!   durable first, as RocksEngine clears with a synced write), and the ingested keys are
//!   durable once it returns, as RocksDB's ingest is. Invalid files change nothing, as in
//!   [`MemoryEngine`].
//! - [`CrashEngine::crash`] drops every pending write; reads then see the durable state.
//!   [`CrashEngine::crash_keeping`]`(n)` keeps the first `n` pending writes instead: any prefix
//!   of the pending writes is a legal crash outcome.
//!
//! # Invariant
//! The live state is always the durable state plus the pending writes applied in order. After
//! `crash()` the state is exactly the durable prefix of the write order: every write up to the
//! last sync point and nothing after it (after `crash_keeping(n)`: that plus `n` more writes).
//!
//! # Not simulated
//! - Torn writes within a batch: a batch survives whole or not at all (RocksDB checksums each
//!   WAL record, and recovery stops at the first bad one).
//! - Lying disks (an fsync that returns without persisting), bit rot, lost or truncated files.
//! - Crashes in the middle of a call, e.g. an ingest that cleared its range but had not yet
//!   ingested the file: `crash` runs between calls.
//!
//! [`ForgetfulEngine`] is the same engine with `sync` ignored. It is only a negative control:
//! the crash checks of `crate::conformance` must fail on it.

use crate::conformance::Crashable;
use crate::engine::{Cf, Engine, KeyRange, KvIter, KvPair, WriteBatch};
use crate::error::Result;
use crate::memory::MemoryEngine;
use std::path::Path;
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

const INFALLIBLE: &str = "MemoryEngine reads and writes do not fail";

/// An [`Engine`] that simulates power loss: see the [module docs](self).
#[derive(Debug)]
pub struct CrashEngine {
    state: RwLock<State>,
    /// `false` only for [`ForgetfulEngine`]: synced writes and `sync_wal` persist nothing.
    honors_sync: bool,
}

#[derive(Debug, Default)]
struct State {
    /// What survives a crash.
    durable: MemoryEngine,
    /// Writes already applied to `live` but not to `durable`, oldest first.
    pending: Vec<WriteBatch>,
    /// `durable` with every `pending` write applied: what reads see.
    live: MemoryEngine,
}

impl State {
    /// Makes the first `n` pending writes durable (all of them if there are fewer).
    fn persist(&mut self, n: usize) {
        let n = n.min(self.pending.len());
        for batch in self.pending.drain(..n) {
            self.durable.write(batch, true).expect(INFALLIBLE);
        }
    }

    fn persist_all(&mut self) {
        self.persist(self.pending.len());
    }
}

/// A copy of every column family of `src`.
fn copy_of(src: &MemoryEngine) -> MemoryEngine {
    let mut batch = WriteBatch::new();
    for cf in Cf::ALL {
        for row in src.scan(cf, b"", None, false) {
            let (k, v) = row.expect(INFALLIBLE);
            batch.put(cf, k, v);
        }
    }
    let copy = MemoryEngine::new();
    copy.write(batch, true).expect(INFALLIBLE);
    copy
}

impl CrashEngine {
    /// An empty engine with nothing pending.
    pub fn new() -> CrashEngine {
        CrashEngine::with_sync(true)
    }

    fn with_sync(honors_sync: bool) -> CrashEngine {
        CrashEngine {
            state: RwLock::new(State::default()),
            honors_sync,
        }
    }

    /// Simulates a power loss and restart: every write that is not durable is lost, and the
    /// engine then serves the durable state. The engine stays usable.
    pub fn crash(&self) {
        self.crash_keeping(0);
    }

    /// Like [`crash`](Self::crash), but the first `n` pending writes survive (all of them if
    /// there are fewer): another legal crash outcome, for tests that try every one.
    pub fn crash_keeping(&self, n: usize) {
        let mut state = self.write_lock();
        state.persist(n);
        state.pending.clear();
        state.live = copy_of(&state.durable);
    }

    /// Number of writes (batches) a crash would lose now.
    pub fn pending_writes(&self) -> usize {
        self.read().pending.len()
    }

    fn read(&self) -> RwLockReadGuard<'_, State> {
        // Nothing below panics between the mutations of `live`, `pending` and `durable`, so a
        // poisoned lock's state is still consistent.
        self.state.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write_lock(&self) -> RwLockWriteGuard<'_, State> {
        self.state.write().unwrap_or_else(|e| e.into_inner())
    }
}

impl Default for CrashEngine {
    fn default() -> Self {
        CrashEngine::new()
    }
}

impl Engine for CrashEngine {
    fn get(&self, cf: Cf, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.read().live.get(cf, key)
    }

    fn multi_get(&self, cf: Cf, keys: &[&[u8]]) -> Result<Vec<Option<Vec<u8>>>> {
        self.read().live.multi_get(cf, keys)
    }

    fn scan<'a>(&'a self, cf: Cf, start: &[u8], end: Option<&[u8]>, reverse: bool) -> KvIter<'a> {
        // MemoryEngine materializes the range anyway; collecting lets the lock go.
        let rows: Vec<Result<KvPair>> = self.read().live.scan(cf, start, end, reverse).collect();
        Box::new(rows.into_iter())
    }

    fn seek_first_many(&self, cf: Cf, ranges: &[(&[u8], &[u8])]) -> Result<Vec<Option<KvPair>>> {
        self.read().live.seek_first_many(cf, ranges)
    }

    fn write(&self, batch: WriteBatch, sync: bool) -> Result<()> {
        let mut state = self.write_lock();
        state.live.write(batch.clone(), false)?;
        if sync && self.honors_sync {
            state.persist_all();
            state.durable.write(batch, true)?;
        } else {
            state.pending.push(batch);
        }
        Ok(())
    }

    fn flush(&self) -> Result<()> {
        self.write_lock().persist_all();
        Ok(())
    }

    fn sync_wal(&self) -> Result<()> {
        if self.honors_sync {
            self.write_lock().persist_all();
        }
        Ok(())
    }

    fn export_sst(&self, cf: Cf, ranges: &[KeyRange<'_>], path: &Path) -> Result<u64> {
        self.read().live.export_sst(cf, ranges, path)
    }

    fn ingest_sst(&self, cf: Cf, ranges: &[KeyRange<'_>], path: Option<&Path>) -> Result<()> {
        let mut state = self.write_lock();
        // Validates the file before touching anything: on error nothing changed.
        state.live.ingest_sst(cf, ranges, path)?;
        // The clear is a synced write: it and every earlier write become durable. Then the
        // ingested keys are durable too, so `durable` ends equal to `live`.
        state.persist_all();
        let mut replace = WriteBatch::new();
        for &(start, end) in ranges {
            replace.delete_range(cf, start, end);
            for row in state.live.scan(cf, start, Some(end), false) {
                let (k, v) = row?;
                replace.put(cf, k, v);
            }
        }
        state.durable.write(replace, true)
    }
}

impl Crashable for CrashEngine {
    fn crash(&self) {
        CrashEngine::crash(self);
    }
}

/// A [`CrashEngine`] that ignores `sync`: every write is unsynced and `sync_wal` does nothing
/// (`flush` and `ingest_sst` still persist). It models an engine that never fsyncs its
/// WAL, which the ordinary conformance suite cannot tell from a correct one. Only a negative
/// control for the crash checks; never use it to test anything else.
#[derive(Debug)]
pub struct ForgetfulEngine(CrashEngine);

impl ForgetfulEngine {
    pub fn new() -> ForgetfulEngine {
        ForgetfulEngine(CrashEngine::with_sync(false))
    }

    /// Simulates a power loss: every write since the last `flush` or ingest is lost.
    pub fn crash(&self) {
        self.0.crash();
    }
}

impl Default for ForgetfulEngine {
    fn default() -> Self {
        ForgetfulEngine::new()
    }
}

impl Engine for ForgetfulEngine {
    fn get(&self, cf: Cf, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.0.get(cf, key)
    }

    fn multi_get(&self, cf: Cf, keys: &[&[u8]]) -> Result<Vec<Option<Vec<u8>>>> {
        self.0.multi_get(cf, keys)
    }

    fn scan<'a>(&'a self, cf: Cf, start: &[u8], end: Option<&[u8]>, reverse: bool) -> KvIter<'a> {
        self.0.scan(cf, start, end, reverse)
    }

    fn seek_first_many(&self, cf: Cf, ranges: &[(&[u8], &[u8])]) -> Result<Vec<Option<KvPair>>> {
        self.0.seek_first_many(cf, ranges)
    }

    fn write(&self, batch: WriteBatch, sync: bool) -> Result<()> {
        self.0.write(batch, sync)
    }

    fn flush(&self) -> Result<()> {
        self.0.flush()
    }

    fn sync_wal(&self) -> Result<()> {
        self.0.sync_wal()
    }

    fn export_sst(&self, cf: Cf, ranges: &[KeyRange<'_>], path: &Path) -> Result<u64> {
        self.0.export_sst(cf, ranges, path)
    }

    fn ingest_sst(&self, cf: Cf, ranges: &[KeyRange<'_>], path: Option<&Path>) -> Result<()> {
        self.0.ingest_sst(cf, ranges, path)
    }
}

impl Crashable for ForgetfulEngine {
    fn crash(&self) {
        ForgetfulEngine::crash(self);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conformance;
    use std::panic::{catch_unwind, AssertUnwindSafe};

    /// Every key and value of every column family.
    fn dump(e: &impl Engine) -> Vec<(Cf, KvPair)> {
        Cf::ALL
            .into_iter()
            .flat_map(|cf| e.scan(cf, b"", None, false).map(move |r| (cf, r.unwrap())))
            .collect()
    }

    #[test]
    fn crash_engine_passes_the_conformance_suite() {
        conformance::run_all(CrashEngine::new);
    }

    #[test]
    fn crash_engine_passes_the_crash_checks() {
        conformance::run_crash_checks(CrashEngine::new);
    }

    /// An engine that ignores `sync` still passes the ordinary suite: that is why the crash
    /// checks exist.
    #[test]
    fn forgetful_engine_passes_the_ordinary_suite() {
        conformance::run_all(ForgetfulEngine::new);
    }

    /// Negative control: the crash checks catch an engine that ignores `sync`.
    #[test]
    fn forgetful_engine_fails_the_crash_checks() {
        let failed: Vec<&str> = conformance::crash_checks::<ForgetfulEngine>()
            .into_iter()
            .filter(|(_, check)| {
                let engine = ForgetfulEngine::new();
                catch_unwind(AssertUnwindSafe(|| check(&engine))).is_err()
            })
            .map(|(name, _)| name)
            .collect();
        assert!(
            failed.contains(&"synced_write_survives_crash"),
            "failed: {failed:?}"
        );
        assert!(
            failed.contains(&"sync_wal_makes_earlier_writes_durable"),
            "failed: {failed:?}"
        );
        assert!(catch_unwind(|| conformance::run_crash_checks(ForgetfulEngine::new)).is_err());
    }

    /// Six writes: write 2 is synced, so a crash after all six keeps 2 and may lose 4.
    fn script() -> Vec<(WriteBatch, bool)> {
        let mut writes = Vec::new();
        let mut b = WriteBatch::new();
        b.put(Cf::Data, b"a", b"1");
        writes.push((b, false));
        let mut b = WriteBatch::new();
        b.put(Cf::Data, b"b", b"1");
        b.put(Cf::RaftMeta, b"m", b"1");
        writes.push((b, true));
        let mut b = WriteBatch::new();
        b.delete(Cf::Data, b"a");
        writes.push((b, false));
        let mut b = WriteBatch::new();
        b.put(Cf::Data, b"c", b"2");
        b.delete_range(Cf::Data, b"b", b"c");
        b.put(Cf::RaftLog, b"x", b"2");
        writes.push((b, false));
        let mut b = WriteBatch::new();
        b.put(Cf::Data, b"a", b"3");
        b.put(Cf::RaftMeta, b"m", b"3");
        writes.push((b, false));
        writes.push((WriteBatch::new(), false));
        writes
    }

    fn run_script(e: &impl Engine, n: usize) {
        for (batch, sync) in script().into_iter().take(n) {
            e.write(batch, sync).unwrap();
        }
    }

    /// `crash_keeping(k)` leaves exactly the durable writes plus the next `k`, for every `k`;
    /// before the crash, reads see every write.
    #[test]
    fn every_crash_prefix_is_exact() {
        let model_after = |n: usize| {
            let model = MemoryEngine::new();
            run_script(&model, n);
            dump(&model)
        };
        for k in 0..=5 {
            let e = CrashEngine::new();
            run_script(&e, 6);
            assert_eq!(e.pending_writes(), 4);
            assert_eq!(dump(&e), model_after(6), "reads see every write");
            e.crash_keeping(k);
            assert_eq!(e.pending_writes(), 0);
            let expected = model_after(2 + k.min(4));
            assert_eq!(dump(&e), expected, "kept {k}");
            // What survived is durable now.
            e.crash();
            assert_eq!(dump(&e), expected, "kept {k}, then crashed again");
        }
    }

    /// `sync_wal` and `flush` persist what is pending; a failed ingest changes nothing.
    #[test]
    fn sync_points_and_failed_ingest() {
        let e = CrashEngine::new();
        run_script(&e, 6);
        e.sync_wal().unwrap();
        assert_eq!(e.pending_writes(), 0);
        let synced = dump(&e);
        e.crash();
        assert_eq!(dump(&e), synced);

        let mut b = WriteBatch::new();
        b.put(Cf::Intents, b"i", b"1");
        e.write(b, false).unwrap();
        e.flush().unwrap();
        e.crash();
        assert_eq!(e.get(Cf::Intents, b"i").unwrap(), Some(b"1".to_vec()));

        let dir = conformance::TempDir::new();
        let bad = dir.path.join("bad");
        std::fs::write(&bad, b"not a snapshot file").unwrap();
        let mut b = WriteBatch::new();
        b.put(Cf::Data, b"a", b"pending");
        e.write(b, false).unwrap();
        let before = dump(&e);
        assert!(e.ingest_sst(Cf::Data, &[(b"a", b"z")], Some(&bad)).is_err());
        assert_eq!(dump(&e), before);
        assert_eq!(e.pending_writes(), 1);
    }
}
