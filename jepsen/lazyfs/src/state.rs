//! The filesystem's state and its data operations: open, read, write, fsync, release, the
//! memory bound, and the shutdown flush.
//!
//! # What
//!
//! [`State`] is everything the filesystem process holds: the [`InodeTable`] (with each file's
//! [`PendingWrites`](crate::overlay::PendingWrites)), the running total of pending bytes, and counters. The FUSE glue
//! (`fuse_ops`) locks it for each request and calls one method; the methods return an
//! [`Errno`] rather than replying, so they read as plain file-system code. Namespace operations
//! (lookup, create, rename, setattr, ...) live in `namespace`.
//!
//! # Invariants
//!
//! - **`pending_bytes` is the sum of every node's `pending.cost_bytes()`**: each method that
//!   changes a pending list adjusts it by the difference (one private helper, `settle`, does it).
//! - **Memory bound**: after a write, while `pending_bytes > max_pending_bytes`, the file whose
//!   oldest pending write is oldest is written back *without* fsync; one file never holds more
//!   than [`MAX_PENDING_WRITES_PER_FILE`] entries (past it, it is written back the same way).
//!   Early write-back is what a real kernel's page cache may do at any time, so a power loss
//!   keeping that data is a legal outcome, as is losing it.
//! - **Durability point**: only `fsync`/`fdatasync` (and the clean shutdown) fsync a backing
//!   file; `flush` and `release` (close) do not make data durable.

use crate::inodes::{InodeTable, Node};
use fuser::Errno;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::path::PathBuf;

/// Past this many entries in one file's pending list, the list is written back (no fsync) so
/// reads, which walk the list, stay cheap.
pub const MAX_PENDING_WRITES_PER_FILE: usize = 4096;

/// Default memory bound on pending data (see `--max-pending-bytes`).
pub const DEFAULT_MAX_PENDING_BYTES: u64 = 256 * 1024 * 1024;

/// Result of a filesystem operation: a value or the errno the kernel passes to the caller.
pub type FsResult<T> = Result<T, Errno>;

/// The errno of an I/O error (EIO when it carries none).
pub fn errno(error: io::Error) -> Errno {
    Errno::from(error)
}

/// Counters for the logs and tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Write requests received.
    pub writes: u64,
    /// Bytes received in write requests.
    pub bytes_written: u64,
    /// fsync/fdatasync requests on files.
    pub fsyncs: u64,
    /// Pending cost written back without fsync (memory bound, entry bound, truncate, fallocate).
    pub early_write_back_bytes: u64,
    /// Pending cost dropped because its file was unlinked and closed.
    pub discarded_bytes: u64,
}

/// The filesystem process's state.
#[derive(Debug)]
pub struct State {
    pub(crate) table: InodeTable,
    pub(crate) pending_bytes: u64,
    pub(crate) max_pending_bytes: u64,
    next_write_seq: u64,
    pub(crate) stats: Stats,
    pub(crate) dirs: crate::namespace::DirHandles,
}

impl State {
    pub fn new(backing: PathBuf, max_pending_bytes: u64) -> Self {
        State {
            table: InodeTable::new(backing),
            pending_bytes: 0,
            max_pending_bytes,
            next_write_seq: 0,
            stats: Stats::default(),
            dirs: Default::default(),
        }
    }

    /// Bytes of unsynced data (with per-entry overhead) held in memory.
    pub fn pending_bytes(&self) -> u64 {
        self.pending_bytes
    }

    pub fn stats(&self) -> Stats {
        self.stats
    }

    pub(crate) fn node(&self, ino: u64) -> FsResult<&Node> {
        self.table.get(ino).ok_or(Errno::ENOENT)
    }

    pub(crate) fn node_mut(&mut self, ino: u64) -> FsResult<&mut Node> {
        self.table.get_mut(ino).ok_or(Errno::ENOENT)
    }

    /// Opens the node's backing file if it is not open yet (read-write so pending writes can be
    /// written back; read-only when the backing file refuses writing).
    pub(crate) fn ensure_file(&mut self, ino: u64) -> FsResult<()> {
        if self.node(ino)?.file.is_some() {
            return Ok(());
        }
        let path = self.table.path(ino).ok_or(Errno::ENOENT)?;
        let file = match OpenOptions::new().read(true).write(true).open(&path) {
            Ok(file) => file,
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EACCES | libc::EROFS | libc::EISDIR)
                ) =>
            {
                File::open(&path).map_err(errno)?
            }
            Err(e) => return Err(errno(e)),
        };
        self.node_mut(ino)?.file = Some(file);
        Ok(())
    }

    /// FUSE open: one more handle on the node. The handle number is the inode number (no
    /// per-handle state is needed).
    pub fn open(&mut self, ino: u64) -> FsResult<u64> {
        self.ensure_file(ino)?;
        let node = self.node_mut(ino)?;
        node.open_handles = node.open_handles.checked_add(1).ok_or(Errno::EMFILE)?;
        Ok(ino)
    }

    /// FUSE release (last close of a handle): nothing becomes durable. An unlinked file's
    /// pending writes are dropped with its last handle; the backing file is closed once no
    /// handle and no pending write needs it.
    pub fn release(&mut self, ino: u64) -> FsResult<()> {
        let node = self.node_mut(ino)?;
        node.open_handles = node.open_handles.saturating_sub(1);
        if node.open_handles == 0 {
            if node.unlinked {
                let dropped = node.pending.discard();
                self.pending_bytes -= dropped;
                self.stats.discarded_bytes += dropped;
            }
            let node = self.node_mut(ino)?;
            if node.pending.is_empty() {
                node.file = None;
            }
        }
        self.table.remove_if_unused(ino);
        Ok(())
    }

    /// FUSE read: backing bytes with the pending writes applied.
    pub fn read(&mut self, ino: u64, offset: u64, size: u32) -> FsResult<Vec<u8>> {
        self.ensure_file(ino)?;
        let node = self.node(ino)?;
        let file = node.file.as_ref().ok_or(Errno::EBADF)?;
        node.pending.read(file, offset, size).map_err(errno)
    }

    /// FUSE write: recorded in memory only, then the memory bound is enforced.
    pub fn write(&mut self, ino: u64, offset: u64, data: &[u8]) -> FsResult<u32> {
        let size = u32::try_from(data.len()).map_err(|_| Errno::EINVAL)?;
        self.ensure_file(ino)?;
        let seq = self.next_write_seq;
        self.next_write_seq += 1;
        let node = self.node_mut(ino)?;
        if node.pending.is_empty() {
            node.oldest_pending_seq = seq;
        }
        let before = node.pending.cost_bytes();
        node.pending.write(offset, data).map_err(errno)?;
        let after = node.pending.cost_bytes();
        let too_many_entries = node.pending.len() > MAX_PENDING_WRITES_PER_FILE;
        self.pending_bytes = self.pending_bytes - before + after;
        self.stats.writes += 1;
        self.stats.bytes_written += u64::from(size);
        if too_many_entries {
            self.write_back(ino)?;
        }
        self.enforce_memory_bound()?;
        Ok(size)
    }

    /// FUSE fsync/fdatasync: pending writes go to the backing file, which is then synced.
    pub fn fsync(&mut self, ino: u64, data_only: bool) -> FsResult<()> {
        self.ensure_file(ino)?;
        self.stats.fsyncs += 1;
        self.sync_node(ino, data_only)
    }

    /// Writes a node's pending list to its backing file and syncs the file.
    fn sync_node(&mut self, ino: u64, data_only: bool) -> FsResult<()> {
        self.settle(ino, |node| {
            let Node { pending, file, .. } = node;
            let file = file
                .as_mut()
                .ok_or(io::Error::from_raw_os_error(libc::EBADF))?;
            pending.sync(file, data_only)
        })
    }

    /// Writes a node's pending list to its backing file without fsync (early write-back).
    pub(crate) fn write_back(&mut self, ino: u64) -> FsResult<()> {
        let before = self.pending_bytes;
        self.settle(ino, |node| {
            let Node { pending, file, .. } = node;
            match file.as_mut() {
                Some(file) => pending.write_back(file),
                None if pending.is_empty() => Ok(0),
                None => Err(io::Error::from_raw_os_error(libc::EBADF)),
            }
        })?;
        self.stats.early_write_back_bytes += before - self.pending_bytes;
        Ok(())
    }

    /// Runs `operation` on a node's pending list and backing file, keeping `pending_bytes`
    /// equal to the sum of the lists whether it succeeds or not.
    pub(crate) fn settle(
        &mut self,
        ino: u64,
        operation: impl FnOnce(&mut Node) -> io::Result<u64>,
    ) -> FsResult<()> {
        let node = self.table.get_mut(ino).ok_or(Errno::ENOENT)?;
        let before = node.pending.cost_bytes();
        let result = operation(node);
        let after = node.pending.cost_bytes();
        self.pending_bytes = self.pending_bytes - before + after;
        result.map(|_| ()).map_err(errno)
    }

    /// Writes back (no fsync) the files with the oldest pending data until under the bound.
    fn enforce_memory_bound(&mut self) -> FsResult<()> {
        while self.pending_bytes > self.max_pending_bytes {
            let oldest = self
                .table
                .inos()
                .into_iter()
                .filter_map(|ino| {
                    let node = self.table.get(ino)?;
                    (!node.pending.is_empty()).then_some((node.oldest_pending_seq, ino))
                })
                .min();
            let Some((_, ino)) = oldest else {
                return Ok(());
            };
            let before = self.pending_bytes;
            self.write_back(ino)?;
            if self.pending_bytes >= before {
                return Err(Errno::EIO);
            }
            tracing::debug!(
                ino,
                bytes = before - self.pending_bytes,
                "memory bound: wrote back"
            );
        }
        Ok(())
    }

    /// FUSE fallocate. `FALLOC_FL_KEEP_SIZE` alone (RocksDB's preallocation) changes no content
    /// or size, so it passes straight to the backing file; every other mode writes the pending
    /// list back first, like a truncate, so it applies after every earlier write.
    pub fn fallocate(&mut self, ino: u64, offset: u64, length: u64, mode: i32) -> FsResult<()> {
        self.ensure_file(ino)?;
        if mode != libc::FALLOC_FL_KEEP_SIZE {
            self.write_back(ino)?;
        }
        let offset = i64::try_from(offset).map_err(|_| Errno::EINVAL)?;
        let length = i64::try_from(length).map_err(|_| Errno::EINVAL)?;
        let file = self.node(ino)?.file.as_ref().ok_or(Errno::EBADF)?;
        // SAFETY: plain syscall on an fd this node owns; no memory is passed.
        let rc = unsafe { libc::fallocate(file.as_raw_fd(), mode, offset, length) };
        if rc != 0 {
            return Err(errno(io::Error::last_os_error()));
        }
        Ok(())
    }

    /// Clean shutdown: every pending write goes to its backing file, which is then fsynced.
    /// Returns the number of files synced; keeps going past errors and reports the first.
    pub fn flush_all(&mut self) -> FsResult<u64> {
        let mut synced = 0;
        let mut first_error = None;
        for ino in self.table.inos() {
            let has_pending = self.table.get(ino).is_some_and(|n| !n.pending.is_empty());
            if !has_pending {
                continue;
            }
            match self.sync_node(ino, false) {
                Ok(()) => synced += 1,
                Err(e) => {
                    tracing::error!(ino, error = ?e, "shutdown flush failed");
                    first_error.get_or_insert(e);
                }
            }
            let node = self.table.get_mut(ino).expect("listed above");
            if node.open_handles == 0 && node.pending.is_empty() {
                node.file = None;
            }
            self.table.remove_if_unused(ino);
        }
        first_error.map_or(Ok(synced), Err)
    }
}
