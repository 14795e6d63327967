//! The overlay model: one file's writes that are not durable yet, kept in memory.
//!
//! # What
//!
//! A [`PendingWrites`] is the ordered list of `(offset, bytes)` writes a file received since its
//! last fsync. The file's *visible* contents are the backing file's bytes with those writes
//! applied in order; its *durable* contents (what a power loss leaves) are the backing file's
//! bytes alone.
//!
//! ```text
//!   backing file:   [ synced bytes ..................... ]
//!   pending:              [w1 ....]        [w2 ......................]   (w2 past the end)
//!   visible:        [ synced | w1 | synced | w2 ......................]
//!   fsync:          pwrite w1, pwrite w2, fsync(backing), forget both
//!   power loss:     forget both (the backing file never saw them)
//! ```
//!
//! The model does no I/O of its own: it works on any [`Backing`] (a real [`std::fs::File`] in
//! the filesystem, a [`MemoryBacking`] in tests), so it can be property-tested against a naive
//! byte-vector model without FUSE.
//!
//! # Invariants
//!
//! - **Order**: writes are applied (to reads and to the backing file) in the order they
//!   arrived; a later write wins where two overlap. Coalescing only ever extends or patches the
//!   *last* write, which keeps that order.
//! - **Prefix write-back**: [`PendingWrites::write_back`] applies writes oldest first and keeps
//!   the ones it could not apply, so after an I/O error the backing file holds a prefix of the
//!   history and the rest is still pending (re-applying later gives the same result).
//! - **Size**: the visible length is `max(backing length, end of the furthest pending write)`.
//!   This holds because every size-changing operation other than a write (truncate, fallocate
//!   that extends) first writes the pending list back ([`PendingWrites::truncate`]), so the
//!   list never straddles a size change.
//! - **Accounting**: [`PendingWrites::cost_bytes`] is the data plus a fixed
//!   [`WRITE_OVERHEAD_BYTES`] per entry; the filesystem sums it to enforce its memory bound.
//!
//! # Not modelled
//!
//! - Torn writes: a power loss keeps or loses whole pending lists (what the filesystem wrote
//!   back early, at the memory bound or before a truncate, survives whole). A real disk can also
//!   persist part of a write, or later writes without earlier ones; here the backing file only
//!   ever holds a prefix of the write history.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

/// Bookkeeping charged per pending write on top of its bytes (the entry, the allocation).
pub const WRITE_OVERHEAD_BYTES: u64 = 64;

/// A write appended right after the previous one is merged into it up to this size, so a WAL
/// written in small appends costs one entry per MiB instead of one per append.
pub const MAX_COALESCED_WRITE_BYTES: usize = 1024 * 1024;

/// The storage under a file: what survives a power loss.
pub trait Backing {
    /// Current length in bytes.
    fn len(&self) -> io::Result<u64>;
    /// Whether the length is zero.
    fn is_empty(&self) -> io::Result<bool> {
        Ok(self.len()? == 0)
    }
    /// Reads up to `buf.len()` bytes at `offset`; returns how many were read (fewer only at EOF).
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize>;
    /// Writes all of `data` at `offset`, extending the file (with zeros in a gap) if needed.
    fn write_all_at(&mut self, data: &[u8], offset: u64) -> io::Result<()>;
    /// Makes everything written so far durable (`fsync`, or `fdatasync` when `data_only`).
    fn sync(&mut self, data_only: bool) -> io::Result<()>;
    /// Truncates or extends (with zeros) to `len`.
    fn set_len(&mut self, len: u64) -> io::Result<()>;
}

impl Backing for File {
    fn len(&self) -> io::Result<u64> {
        Ok(self.metadata()?.len())
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let mut done = 0;
        while done < buf.len() {
            let position = offset
                .checked_add(done as u64)
                .ok_or_else(|| io::Error::from_raw_os_error(libc::EOVERFLOW))?;
            match FileExt::read_at(self, &mut buf[done..], position) {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(done)
    }

    fn write_all_at(&mut self, data: &[u8], offset: u64) -> io::Result<()> {
        FileExt::write_all_at(self, data, offset)
    }

    fn sync(&mut self, data_only: bool) -> io::Result<()> {
        if data_only {
            self.sync_data()
        } else {
            self.sync_all()
        }
    }

    fn set_len(&mut self, len: u64) -> io::Result<()> {
        File::set_len(self, len)
    }
}

/// An in-memory [`Backing`] for tests: `contents` is what a power loss leaves (the OS keeps
/// every write of a killed process), `syncs` counts fsyncs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MemoryBacking {
    pub contents: Vec<u8>,
    pub syncs: u64,
}

impl Backing for MemoryBacking {
    fn len(&self) -> io::Result<u64> {
        Ok(self.contents.len() as u64)
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let start = usize::try_from(offset).unwrap_or(usize::MAX);
        if start >= self.contents.len() {
            return Ok(0);
        }
        let n = buf.len().min(self.contents.len() - start);
        buf[..n].copy_from_slice(&self.contents[start..start + n]);
        Ok(n)
    }

    fn write_all_at(&mut self, data: &[u8], offset: u64) -> io::Result<()> {
        let start =
            usize::try_from(offset).map_err(|_| io::Error::from_raw_os_error(libc::EFBIG))?;
        let end = start + data.len();
        if self.contents.len() < end {
            self.contents.resize(end, 0);
        }
        self.contents[start..end].copy_from_slice(data);
        Ok(())
    }

    fn sync(&mut self, _data_only: bool) -> io::Result<()> {
        self.syncs += 1;
        Ok(())
    }

    fn set_len(&mut self, len: u64) -> io::Result<()> {
        let len = usize::try_from(len).map_err(|_| io::Error::from_raw_os_error(libc::EFBIG))?;
        self.contents.resize(len, 0);
        Ok(())
    }
}

#[derive(Clone, Debug)]
struct PendingWrite {
    offset: u64,
    data: Vec<u8>,
}

impl PendingWrite {
    fn end(&self) -> u64 {
        self.offset + self.data.len() as u64
    }
}

/// One file's unsynced writes, oldest first.
#[derive(Clone, Debug, Default)]
pub struct PendingWrites {
    writes: Vec<PendingWrite>,
    /// Sum of `data.len()` over `writes`.
    data_bytes: u64,
    /// Largest `offset + len` over `writes` (0 when empty).
    end: u64,
}

impl PendingWrites {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn is_empty(&self) -> bool {
        self.writes.is_empty()
    }

    /// Number of entries (after coalescing).
    pub fn len(&self) -> usize {
        self.writes.len()
    }

    /// Memory this list is charged for: its bytes plus a fixed overhead per entry.
    pub fn cost_bytes(&self) -> u64 {
        self.data_bytes + WRITE_OVERHEAD_BYTES * self.writes.len() as u64
    }

    /// Records a write. Errors with `EFBIG` when `offset + len` overflows `u64`.
    pub fn write(&mut self, offset: u64, data: &[u8]) -> io::Result<()> {
        let end = offset
            .checked_add(data.len() as u64)
            .ok_or_else(|| io::Error::from_raw_os_error(libc::EFBIG))?;
        if data.is_empty() {
            return Ok(());
        }
        // Patch or extend the newest write when the new one starts inside it or right after
        // it: nothing was written after it, so the result is the same as keeping both.
        if let Some(last) = self.writes.last_mut() {
            let last_end = last.end();
            let merged_len = end.max(last_end) - last.offset;
            if offset >= last.offset
                && offset <= last_end
                && merged_len <= MAX_COALESCED_WRITE_BYTES as u64
            {
                let start = (offset - last.offset) as usize;
                let merged_len = merged_len as usize;
                let grown = merged_len - last.data.len();
                if last.data.len() < merged_len {
                    last.data.resize(merged_len, 0);
                }
                last.data[start..start + data.len()].copy_from_slice(data);
                self.data_bytes += grown as u64;
                self.end = self.end.max(end);
                return Ok(());
            }
        }
        self.writes.push(PendingWrite {
            offset,
            data: data.to_vec(),
        });
        self.data_bytes += data.len() as u64;
        self.end = self.end.max(end);
        Ok(())
    }

    /// The visible length of a file whose backing file is `backing_len` long.
    pub fn visible_len(&self, backing_len: u64) -> u64 {
        backing_len.max(self.end)
    }

    /// Reads `size` bytes at `offset` of the visible contents (fewer at the visible end).
    pub fn read(&self, backing: &impl Backing, offset: u64, size: u32) -> io::Result<Vec<u8>> {
        let visible_len = self.visible_len(backing.len()?);
        if offset >= visible_len {
            return Ok(Vec::new());
        }
        let end = visible_len.min(offset.saturating_add(u64::from(size)));
        let mut buf = vec![0; (end - offset) as usize];
        // Past the backing file's end (a hole up to a pending write) the bytes stay zero.
        backing.read_at(&mut buf, offset)?;
        for write in &self.writes {
            let from = write.offset.max(offset);
            let to = write.end().min(end);
            if from < to {
                let src = (from - write.offset) as usize..(to - write.offset) as usize;
                let dst = (from - offset) as usize..(to - offset) as usize;
                buf[dst].copy_from_slice(&write.data[src]);
            }
        }
        Ok(buf)
    }

    /// Applies every pending write to `backing` in order, without syncing, and forgets them.
    /// Returns the cost (see [`Self::cost_bytes`]) released. On an error the writes not yet
    /// applied stay pending.
    pub fn write_back(&mut self, backing: &mut impl Backing) -> io::Result<u64> {
        let before = self.cost_bytes();
        let mut applied = 0;
        let mut result = Ok(());
        for write in &self.writes {
            if let Err(e) = backing.write_all_at(&write.data, write.offset) {
                result = Err(e);
                break;
            }
            applied += 1;
        }
        self.writes.drain(..applied);
        self.recompute();
        result.map(|()| before - self.cost_bytes())
    }

    /// fsync: writes everything back, then syncs the backing file. Returns the cost released.
    pub fn sync(&mut self, backing: &mut impl Backing, data_only: bool) -> io::Result<u64> {
        let released = self.write_back(backing)?;
        backing.sync(data_only)?;
        Ok(released)
    }

    /// truncate (or extend) to `len`: writes everything back first (no sync), so the size change
    /// lands after every earlier write, exactly as on a real file. Returns the cost released.
    pub fn truncate(&mut self, backing: &mut impl Backing, len: u64) -> io::Result<u64> {
        let released = self.write_back(backing)?;
        backing.set_len(len)?;
        Ok(released)
    }

    /// Power loss (or unlink): forgets every pending write. Returns the cost released.
    pub fn discard(&mut self) -> u64 {
        let released = self.cost_bytes();
        self.writes.clear();
        self.recompute();
        released
    }

    fn recompute(&mut self) {
        self.data_bytes = self.writes.iter().map(|w| w.data.len() as u64).sum();
        self.end = self.writes.iter().map(PendingWrite::end).max().unwrap_or(0);
    }
}

#[cfg(test)]
mod tests;
