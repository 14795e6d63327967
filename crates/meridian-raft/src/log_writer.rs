//! Group commit: one fsync covers the Raft log appends of every shard on the node.
//!
//! ```text
//!  shard 1 append ─┐  write(batch, sync=false)   (visible at once, ordered in RocksDB's WAL)
//!  shard 7 append ─┼─► flush requests ──► [log-writer thread] ─► one write(marker, sync=true)
//!  shard 3 append ─┘   (bounded channel)          │                 └► all callbacks fire
//! ```
//!
//! Each `append` writes its entries without syncing, so they are readable immediately, then
//! asks this thread for durability. The thread takes every request queued so far (up to
//! [`MAX_LOG_BATCH_ENTRIES`]) and issues one `Engine::sync_wal` (RocksDB `FlushWAL(sync)`):
//! RocksDB has one WAL per DB, so syncing it makes every earlier write durable too, and the
//! fsync runs outside RocksDB's write queue, so other shards keep writing meanwhile. Only then does it
//! report the appends as flushed to openraft, which is what lets a leader count its own vote
//! and a follower acknowledge.
//!
//! # A failed fsync stops the node
//! After a failed fsync the kernel may have dropped the dirty pages, and a retried fsync can
//! then report success for data that is gone (the PostgreSQL "fsyncgate" lesson). So a sync
//! failure is never retried and never reported as a recoverable error: the writer calls its
//! fail-stop hook (the node's default aborts the process with the reason on stderr), and no
//! append waiting for that sync is ever reported flushed. A restarted node recovers from what
//! is really on disk, as after a crash.
//!
//! # Invariants
//! - A callback fires with `Ok` only after an fsync that followed the append's write.
//! - The queue is bounded ([`MAX_PENDING_FLUSHES`]); a full queue makes the appender wait
//!   asynchronously (back pressure) — never a blocking send on a runtime worker.
//!
//! # Not done yet
//! - Separate WALs / devices for the log and the state machine.

use crate::types::IOFlushed;
use meridian_storage::Engine;
use meridian_types::limits::MAX_LOG_BATCH_ENTRIES;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::mpsc;

/// Called once when a sync fails; must not return control to normal operation.
pub type FailStop = Arc<dyn Fn(&str) + Send + Sync>;

/// The node's fail-stop: the reason on stderr (and in the log), then abort.
pub fn abort_process() -> FailStop {
    Arc::new(|reason: &str| {
        tracing::error!(%reason, "stopping the node: a Raft log fsync failed");
        eprintln!("fatal: {reason}; stopping the node (fsync failures are never retried)");
        std::process::abort();
    })
}

/// Most flush requests waiting for the writer thread.
pub const MAX_PENDING_FLUSHES: usize = 16 * 1024;

/// Handle to the node's log-writer thread. Dropping it closes the queue; the thread syncs what
/// is queued and stops.
pub struct LogWriter {
    /// `None` only inside `drop`, to close the queue before joining the thread.
    tx: Option<mpsc::Sender<IOFlushed>>,
    thread: Option<std::thread::JoinHandle<()>>,
    stats: Arc<LogWriterStats>,
}

#[derive(Default)]
pub struct LogWriterStats {
    pub syncs: std::sync::atomic::AtomicU64,
    pub flushes: std::sync::atomic::AtomicU64,
    pub sync_micros: std::sync::atomic::AtomicU64,
}

impl LogWriter {
    /// A writer whose sync failure aborts the process (what a node runs).
    pub fn start(engine: Arc<dyn Engine>) -> LogWriter {
        LogWriter::start_with(engine, abort_process())
    }

    /// A writer with its own fail-stop hook (tests).
    pub fn start_with(engine: Arc<dyn Engine>, fail_stop: FailStop) -> LogWriter {
        let (tx, rx) = mpsc::channel(MAX_PENDING_FLUSHES);
        let stats = Arc::new(LogWriterStats::default());
        let thread_stats = stats.clone();
        let thread = std::thread::Builder::new()
            .name("raft-log-writer".into())
            .spawn(move || run(engine, rx, thread_stats, fail_stop))
            .expect("spawning the log writer thread");
        LogWriter {
            tx: Some(tx),
            thread: Some(thread),
            stats,
        }
    }

    /// Reports `callback` flushed once a sync after this call completes. Waits (async) while
    /// the queue is full.
    pub async fn flush(&self, callback: IOFlushed) -> std::io::Result<()> {
        let stopped = || std::io::Error::other("raft log writer has stopped");
        let tx = self.tx.as_ref().ok_or_else(stopped)?;
        tx.send(callback).await.map_err(|_| stopped())
    }

    pub fn stats(&self) -> &LogWriterStats {
        &self.stats
    }
}

impl Drop for LogWriter {
    fn drop(&mut self) {
        // Closing the queue is the stop signal: the thread drains what is queued, then exits.
        drop(self.tx.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn run(
    engine: Arc<dyn Engine>,
    mut rx: mpsc::Receiver<IOFlushed>,
    stats: Arc<LogWriterStats>,
    fail_stop: FailStop,
) {
    use std::sync::atomic::Ordering::Relaxed;
    let mut pending: Vec<IOFlushed> = Vec::with_capacity(256);
    // `None`: every handle is gone and the queue is empty.
    while let Some(first) = rx.blocking_recv() {
        pending.push(first);
        while pending.len() < MAX_LOG_BATCH_ENTRIES {
            match rx.try_recv() {
                Ok(cb) => pending.push(cb),
                Err(_) => break,
            }
        }
        let started = Instant::now();
        let result = engine.sync_wal();
        stats.syncs.fetch_add(1, Relaxed);
        stats.flushes.fetch_add(pending.len() as u64, Relaxed);
        stats
            .sync_micros
            .fetch_add(started.elapsed().as_micros() as u64, Relaxed);
        if let Err(e) = result {
            // Never retried, never reported flushed (see the module docs). The pending
            // callbacks are dropped with the thread.
            fail_stop(&format!("raft log fsync failed: {e}"));
            return;
        }
        for cb in pending.drain(..) {
            cb.io_completed(Ok(()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use meridian_storage::{Cf, KvIter, MemoryEngine, WriteBatch};
    use std::path::Path;
    use std::sync::Mutex;

    /// An engine whose WAL sync always fails (a dying disk).
    struct FailingSync(MemoryEngine);

    impl Engine for FailingSync {
        fn get(&self, cf: Cf, key: &[u8]) -> meridian_storage::Result<Option<Vec<u8>>> {
            self.0.get(cf, key)
        }
        fn multi_get(
            &self,
            cf: Cf,
            keys: &[&[u8]],
        ) -> meridian_storage::Result<Vec<Option<Vec<u8>>>> {
            self.0.multi_get(cf, keys)
        }
        fn scan<'a>(
            &'a self,
            cf: Cf,
            start: &[u8],
            end: Option<&[u8]>,
            reverse: bool,
        ) -> KvIter<'a> {
            self.0.scan(cf, start, end, reverse)
        }
        fn write(&self, batch: WriteBatch, sync: bool) -> meridian_storage::Result<()> {
            self.0.write(batch, sync)
        }
        fn flush(&self) -> meridian_storage::Result<()> {
            self.0.flush()
        }
        fn sync_wal(&self) -> meridian_storage::Result<()> {
            Err(meridian_storage::Error::Io(std::io::Error::other("EIO")))
        }
        fn export_range_sst(
            &self,
            cf: Cf,
            start: &[u8],
            end: &[u8],
            path: &Path,
        ) -> meridian_storage::Result<u64> {
            self.0.export_range_sst(cf, start, end, path)
        }
        fn ingest_range_sst(
            &self,
            cf: Cf,
            start: &[u8],
            end: &[u8],
            path: Option<&Path>,
        ) -> meridian_storage::Result<()> {
            self.0.ingest_range_sst(cf, start, end, path)
        }
    }

    #[test]
    fn a_failed_sync_calls_the_fail_stop_hook_once_and_stops_the_writer() {
        let reasons: Arc<Mutex<Vec<String>>> = Arc::default();
        let seen = reasons.clone();
        let writer = LogWriter::start_with(
            Arc::new(FailingSync(MemoryEngine::new())),
            Arc::new(move |reason: &str| seen.lock().unwrap().push(reason.to_string())),
        );
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        runtime.block_on(async {
            writer.flush(IOFlushed::noop()).await.unwrap();
        });
        let give_up = Instant::now() + std::time::Duration::from_secs(10);
        while reasons.lock().unwrap().is_empty() {
            assert!(Instant::now() < give_up, "fail-stop hook never called");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        // The writer is gone: later appends fail instead of waiting for a sync that never
        // comes (or, worse, being reported flushed by a retried fsync).
        let later = runtime.block_on(async {
            let give_up = Instant::now() + std::time::Duration::from_secs(10);
            loop {
                if let Err(e) = writer.flush(IOFlushed::noop()).await {
                    return e;
                }
                assert!(Instant::now() < give_up, "writer kept accepting flushes");
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
        });
        assert!(later.to_string().contains("stopped"), "{later}");
        let reasons = reasons.lock().unwrap();
        assert_eq!(reasons.len(), 1, "{reasons:?}");
        assert!(reasons[0].contains("fsync failed"), "{}", reasons[0]);
    }
}
