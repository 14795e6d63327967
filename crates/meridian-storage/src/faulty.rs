//! `FaultyEngine` (feature `testing`): a [`MemoryEngine`] whose writes can be held (a write
//! stall: every `write` waits while the gate is closed) and whose WAL sync can be made to fail
//! (a dying disk), for tests of what sits above the engine.

use crate::{Cf, Engine, Error, KeyRange, KvIter, MemoryEngine, Result, WriteBatch};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex};

#[derive(Default)]
pub struct FaultyEngine {
    inner: MemoryEngine,
    held: Mutex<bool>,
    released: Condvar,
    failing_sync: AtomicBool,
}

impl FaultyEngine {
    pub fn new() -> FaultyEngine {
        FaultyEngine::default()
    }

    /// While held, every `write` (and the default `sync_wal`, which writes) waits.
    pub fn hold_writes(&self, held: bool) {
        *self.held.lock().unwrap_or_else(|p| p.into_inner()) = held;
        self.released.notify_all();
    }

    /// From now on `sync_wal` fails with an I/O error.
    pub fn fail_syncs(&self) {
        self.failing_sync.store(true, Ordering::SeqCst);
    }
}

impl Engine for FaultyEngine {
    fn get(&self, cf: Cf, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.inner.get(cf, key)
    }
    fn multi_get(&self, cf: Cf, keys: &[&[u8]]) -> Result<Vec<Option<Vec<u8>>>> {
        self.inner.multi_get(cf, keys)
    }
    fn scan<'a>(&'a self, cf: Cf, start: &[u8], end: Option<&[u8]>, reverse: bool) -> KvIter<'a> {
        self.inner.scan(cf, start, end, reverse)
    }
    fn write(&self, batch: WriteBatch, sync: bool) -> Result<()> {
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        while *held {
            held = self.released.wait(held).unwrap_or_else(|p| p.into_inner());
        }
        drop(held);
        self.inner.write(batch, sync)
    }
    fn flush(&self) -> Result<()> {
        self.inner.flush()
    }
    fn sync_wal(&self) -> Result<()> {
        if self.failing_sync.load(Ordering::SeqCst) {
            return Err(Error::Io(std::io::Error::other("EIO")));
        }
        self.write(WriteBatch::new(), true)
    }
    fn export_sst(&self, cf: Cf, ranges: &[KeyRange<'_>], path: &Path) -> Result<u64> {
        self.inner.export_sst(cf, ranges, path)
    }
    fn ingest_sst(&self, cf: Cf, ranges: &[KeyRange<'_>], path: Option<&Path>) -> Result<()> {
        self.inner.ingest_sst(cf, ranges, path)
    }
}
