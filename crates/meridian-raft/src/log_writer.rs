//! The node's log writer: one thread writes every shard's Raft log changes to RocksDB and
//! group-commits one fsync for all of them.
//!
//! ```text
//!  shard 1 append ─┐  LogWork{batch, written, flushed}      one merged write(batch, sync=false)
//!  shard 7 trunc. ─┼─► bounded queue ──► [log-writer thread] ─► written hooks run
//!  shard 3 append ─┘   (queue order)          │                  one FlushWAL(sync) if any flush
//!                                             └──────────────────► flushed callbacks fire
//! ```
//!
//! A shard's `append`, `truncate_after`, `purge` and `save_committed` queue their batch here
//! and return at once: Raft's core task never waits on RocksDB for them (a write stall used to
//! stop its heartbeats). The thread takes everything queued so far (up to
//! [`MAX_LOG_BATCH_ENTRIES`] items or [`MAX_LOG_WRITE_BYTES`]), merges the batches in queue
//! order into ONE RocksDB write, runs each item's `written` hook (the log store marks the
//! entries written in its in-memory tail, which kept them readable meanwhile and may now let
//! them go), then, if any item
//! asked for durability, issues one `Engine::sync_wal` (RocksDB `FlushWAL(sync)`): RocksDB has
//! one WAL per DB, so syncing it makes every earlier write durable, and the fsync runs outside
//! RocksDB's write queue, so apply batches keep writing meanwhile. Only then are the appends
//! reported flushed to openraft, which is what lets a leader count its own vote and a follower
//! acknowledge.
//!
//! # A failed write or fsync stops the node
//! After a failed fsync the kernel may have dropped the dirty pages, and a retried fsync can
//! then report success for data that is gone (the PostgreSQL "fsyncgate" lesson). A failed
//! write loses entries openraft already counts as appended. So neither is retried nor reported
//! as a recoverable error: the writer calls its fail-stop hook (the node's default aborts the
//! process with the reason on stderr), and no append waiting for that sync is ever reported
//! flushed. A restarted node recovers from what is really on disk, as after a crash.
//!
//! # Invariants
//! - Items are written in queue order (one shard's appends, truncations and purges keep their
//!   order; different shards' keys never overlap).
//! - A `flushed` callback fires with `Ok` only after an fsync that followed its batch's write.
//! - A `written` hook runs only after its batch is in RocksDB (readable there).
//! - The queue is bounded ([`MAX_PENDING_FLUSHES`]); a full queue makes the sender wait
//!   asynchronously (back pressure) — never a blocking send on a runtime worker.
//!
//! # Not done yet
//! - State-machine apply batches still go to RocksDB on their own (one write per apply call);
//!   folding them into this loop is the rest of the node-wide write loop.
//! - Separate WALs / devices for the log and the state machine.

use crate::types::IOFlushed;
use meridian_storage::{Engine, WriteBatch};
use meridian_types::limits::{MAX_LOG_BATCH_ENTRIES, MAX_LOG_WRITE_BYTES};
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

/// Most items waiting for the writer thread.
pub const MAX_PENDING_FLUSHES: usize = 16 * 1024;

/// Runs on the writer thread once an item's batch is in RocksDB.
pub type WrittenHook = Box<dyn FnOnce() + Send>;

/// One item of the writer's queue: a batch to write (may be empty), a hook to run once it is
/// written, and a callback to fire once it is durable.
#[derive(Default)]
pub struct LogWork {
    pub batch: WriteBatch,
    pub written: Option<WrittenHook>,
    pub flushed: Option<IOFlushed>,
}

/// Handle to the node's log-writer thread. Dropping it closes the queue; the thread syncs what
/// is queued and stops.
pub struct LogWriter {
    /// `None` only inside `drop`, to close the queue before joining the thread.
    tx: Option<mpsc::Sender<LogWork>>,
    thread: Option<std::thread::JoinHandle<()>>,
    stats: Arc<LogWriterStats>,
}

/// The writer's own figures (cumulative since start).
#[derive(Default)]
pub struct LogWriterStats {
    /// Merged RocksDB writes issued.
    pub writes: std::sync::atomic::AtomicU64,
    /// Queue items taken (appends, truncations, purges, committed marks, flushes).
    pub items: std::sync::atomic::AtomicU64,
    /// WAL fsyncs issued.
    pub syncs: std::sync::atomic::AtomicU64,
    /// Flush callbacks fired (appends made durable).
    pub flushes: std::sync::atomic::AtomicU64,
    pub write_micros: std::sync::atomic::AtomicU64,
    pub sync_micros: std::sync::atomic::AtomicU64,
    /// Raft log reads (replication, apply) of this node's shards answered from their
    /// in-memory tails, on the caller's task (`log_tail`).
    pub log_reads_memory: std::sync::atomic::AtomicU64,
    /// Raft log reads that needed RocksDB (on the blocking pool).
    pub log_reads_stored: std::sync::atomic::AtomicU64,
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
        self.submit(LogWork {
            flushed: Some(callback),
            ..Default::default()
        })
        .await
    }

    /// Queues `work` behind everything queued before it. Waits (async) while the queue is full.
    pub async fn submit(&self, work: LogWork) -> std::io::Result<()> {
        let stopped = || std::io::Error::other("raft log writer has stopped");
        let tx = self.tx.as_ref().ok_or_else(stopped)?;
        tx.send(work).await.map_err(|_| stopped())
    }

    pub fn stats(&self) -> &LogWriterStats {
        &self.stats
    }

    /// Items queued and not yet taken by the writer thread (at most `MAX_PENDING_FLUSHES`).
    pub fn queue_depth(&self) -> usize {
        self.tx
            .as_ref()
            .map_or(0, |tx| tx.max_capacity() - tx.capacity())
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
    mut rx: mpsc::Receiver<LogWork>,
    stats: Arc<LogWriterStats>,
    fail_stop: FailStop,
) {
    use std::sync::atomic::Ordering::Relaxed;
    let mut hooks: Vec<WrittenHook> = Vec::with_capacity(256);
    let mut pending: Vec<IOFlushed> = Vec::with_capacity(256);
    // `None`: every handle is gone and the queue is empty.
    while let Some(first) = rx.blocking_recv() {
        let mut batch = WriteBatch::new();
        let mut items = 0usize;
        let mut next = Some(first);
        while let Some(work) = next.take() {
            batch.extend(work.batch);
            hooks.extend(work.written);
            pending.extend(work.flushed);
            items += 1;
            if items < MAX_LOG_BATCH_ENTRIES && batch.size_bytes() < MAX_LOG_WRITE_BYTES {
                next = rx.try_recv().ok();
            }
        }
        stats.items.fetch_add(items as u64, Relaxed);
        if !batch.is_empty() {
            let started = Instant::now();
            let result = engine.write(batch, false);
            stats.writes.fetch_add(1, Relaxed);
            stats
                .write_micros
                .fetch_add(started.elapsed().as_micros() as u64, Relaxed);
            if let Err(e) = result {
                fail_stop(&format!("raft log write failed: {e}"));
                return;
            }
        }
        for hook in hooks.drain(..) {
            hook();
        }
        if pending.is_empty() {
            continue;
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
    use meridian_storage::faulty::FaultyEngine;
    use std::sync::Mutex;

    #[test]
    fn a_failed_sync_calls_the_fail_stop_hook_once_and_stops_the_writer() {
        let reasons: Arc<Mutex<Vec<String>>> = Arc::default();
        let seen = reasons.clone();
        let writer = LogWriter::start_with(
            {
                let engine = FaultyEngine::new();
                engine.fail_syncs();
                Arc::new(engine)
            },
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
