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
//! # Invariants
//! - A callback fires with `Ok` only after an fsync that followed the append's write.
//! - The queue is bounded ([`MAX_PENDING_FLUSHES`]); a full queue blocks the appender (back
//!   pressure) rather than growing memory.
//!
//! # Not done yet
//! - Separate WALs / devices for the log and the state machine.

use crate::types::IOFlushed;
use meridian_storage::Engine;
use meridian_types::limits::MAX_LOG_BATCH_ENTRIES;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Instant;

/// Most flush requests waiting for the writer thread.
pub const MAX_PENDING_FLUSHES: usize = 16 * 1024;

enum Request {
    Flush(IOFlushed),
    Shutdown,
}

/// Handle to the node's log-writer thread. Dropping the last handle stops the thread.
pub struct LogWriter {
    tx: mpsc::SyncSender<Request>,
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
    pub fn start(engine: Arc<dyn Engine>) -> LogWriter {
        let (tx, rx) = mpsc::sync_channel(MAX_PENDING_FLUSHES);
        let stats = Arc::new(LogWriterStats::default());
        let thread_stats = stats.clone();
        let thread = std::thread::Builder::new()
            .name("raft-log-writer".into())
            .spawn(move || run(engine, rx, thread_stats))
            .expect("spawning the log writer thread");
        LogWriter {
            tx,
            thread: Some(thread),
            stats,
        }
    }

    /// Reports `callback` flushed once a sync after this call completes.
    pub fn flush(&self, callback: IOFlushed) -> std::io::Result<()> {
        self.tx
            .send(Request::Flush(callback))
            .map_err(|_| std::io::Error::other("raft log writer has stopped"))
    }

    pub fn stats(&self) -> &LogWriterStats {
        &self.stats
    }
}

impl Drop for LogWriter {
    fn drop(&mut self) {
        let _ = self.tx.send(Request::Shutdown);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn run(engine: Arc<dyn Engine>, rx: mpsc::Receiver<Request>, stats: Arc<LogWriterStats>) {
    use std::sync::atomic::Ordering::Relaxed;
    let mut pending: Vec<IOFlushed> = Vec::with_capacity(256);
    loop {
        let mut shutdown = false;
        match rx.recv() {
            Ok(Request::Flush(cb)) => pending.push(cb),
            Ok(Request::Shutdown) | Err(_) => shutdown = true,
        }
        while !shutdown && pending.len() < MAX_LOG_BATCH_ENTRIES {
            match rx.try_recv() {
                Ok(Request::Flush(cb)) => pending.push(cb),
                Ok(Request::Shutdown) => shutdown = true,
                Err(_) => break,
            }
        }
        if !pending.is_empty() {
            let started = Instant::now();
            let result = engine.sync_wal();
            stats.syncs.fetch_add(1, Relaxed);
            stats.flushes.fetch_add(pending.len() as u64, Relaxed);
            stats
                .sync_micros
                .fetch_add(started.elapsed().as_micros() as u64, Relaxed);
            for cb in pending.drain(..) {
                let r = match &result {
                    Ok(()) => Ok(()),
                    Err(e) => Err(std::io::Error::other(format!("raft log fsync failed: {e}"))),
                };
                cb.io_completed(r);
            }
        }
        if shutdown {
            return;
        }
    }
}
