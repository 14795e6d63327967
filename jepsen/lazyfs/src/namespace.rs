//! Namespace and metadata operations: attributes, lookup, create, mkdir, unlink, rmdir, rename,
//! setattr (truncate, chmod, chown, utimes), directory listing, fsyncdir and statfs.
//!
//! # What
//!
//! Every operation here is applied to the backing directory at once, so it survives a power
//! loss. That is *more* durable than a real filesystem (where a new name, a rename or a
//! truncate may be lost until the directory or file is fsynced): only data writes are modelled
//! as volatile. The harness therefore tests "unsynced data is lost", not "unsynced metadata is
//! lost".
//!
//! # Invariants
//!
//! - **Attributes include pending writes**: a regular file's size is the visible size
//!   (backing length or the end of the furthest pending write, whichever is larger).
//! - **Size changes are exact**: a truncate writes the file's pending list back (no fsync)
//!   before changing the backing length, so it lands after every earlier write.
//! - **Unlink drops pending writes** once the file is also closed; rename keeps them with the
//!   node (they belong to the inode, not the name).
//! - **Bounded**: at most [`MAX_OPEN_DIRS`] directory listings open at once, each a snapshot
//!   of at most [`MAX_DIR_ENTRIES`] names taken at opendir.
//!
//! # Not modelled
//!
//! - Loss of unsynced metadata (see above); `fsyncdir` only fsyncs the backing directory.
//! - `link` is refused with `EOPNOTSUPP` (RocksDB then copies instead of linking), `symlink`,
//!   `mknod` and extended attributes are not implemented (`ENOSYS`).
//! - Ownership of new files is the filesystem process's user, not the caller's.
//! - Times: a file's mtime is the backing file's, so it moves when pending data is written
//!   back, not at the write.

use crate::inodes::ROOT_INO;
use crate::state::{errno, FsResult, State};
use fuser::{Errno, FileAttr, FileType, INodeNo, TimeOrNow};
use std::collections::HashMap;
use std::ffi::{CString, OsStr, OsString};
use std::fs::{self, DirBuilder, Metadata, OpenOptions};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, DirEntryExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Most directory listings open at once.
pub const MAX_OPEN_DIRS: usize = 4096;

/// Most entries one directory listing snapshots (RocksDB directories hold hundreds).
pub const MAX_DIR_ENTRIES: usize = 1 << 20;

/// One entry of a directory listing snapshot.
#[derive(Debug, Clone)]
pub struct DirEntry {
    pub ino: u64,
    pub kind: FileType,
    pub name: OsString,
}

/// Open directory listings by handle.
#[derive(Debug, Default)]
pub struct DirHandles {
    next: u64,
    open: HashMap<u64, Vec<DirEntry>>,
}

/// statfs figures of the backing filesystem.
#[derive(Debug, Clone, Copy)]
pub struct StatFs {
    pub blocks: u64,
    pub blocks_free: u64,
    pub blocks_available: u64,
    pub files: u64,
    pub files_free: u64,
    pub block_size: u32,
    pub name_max: u32,
    pub fragment_size: u32,
}

/// Which attributes a setattr changes.
#[derive(Debug, Default, Clone, Copy)]
pub struct SetAttr {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<TimeOrNow>,
    pub mtime: Option<TimeOrNow>,
}

fn file_type(metadata: &Metadata) -> FsResult<FileType> {
    FileType::from_std(metadata.file_type()).ok_or(Errno::EIO)
}

fn time(seconds: i64, nanos: i64) -> SystemTime {
    let nanos = u32::try_from(nanos.clamp(0, 999_999_999)).unwrap_or(0);
    if seconds >= 0 {
        UNIX_EPOCH + Duration::new(seconds.unsigned_abs(), nanos)
    } else {
        UNIX_EPOCH - Duration::new(seconds.unsigned_abs(), 0) + Duration::new(0, nanos)
    }
}

fn cstring(path: &Path) -> FsResult<CString> {
    CString::new(path.as_os_str().as_bytes()).map_err(|_| Errno::EINVAL)
}

impl State {
    /// getattr: the backing file's attributes with our inode number and the visible size.
    pub fn attr(&self, ino: u64) -> FsResult<FileAttr> {
        let node = self.node(ino)?;
        let metadata = match &node.file {
            Some(file) => file.metadata(),
            None => {
                let path = self.table.path(ino).ok_or(Errno::ENOENT)?;
                fs::symlink_metadata(path)
            }
        }
        .map_err(errno)?;
        let kind = file_type(&metadata)?;
        let size = match kind {
            FileType::RegularFile => node.pending.visible_len(metadata.len()),
            _ => metadata.len(),
        };
        Ok(FileAttr {
            ino: INodeNo(ino),
            size,
            blocks: metadata.blocks(),
            atime: time(metadata.atime(), metadata.atime_nsec()),
            mtime: time(metadata.mtime(), metadata.mtime_nsec()),
            ctime: time(metadata.ctime(), metadata.ctime_nsec()),
            crtime: UNIX_EPOCH,
            kind,
            perm: (metadata.mode() & 0o7777) as u16,
            nlink: u32::try_from(metadata.nlink()).unwrap_or(u32::MAX),
            uid: metadata.uid(),
            gid: metadata.gid(),
            rdev: u32::try_from(metadata.rdev()).unwrap_or(0),
            blksize: u32::try_from(metadata.blksize()).unwrap_or(4096),
            flags: 0,
        })
    }

    /// lookup: finds `name` in the backing directory and counts one kernel reference.
    pub fn lookup(&mut self, parent: u64, name: &OsStr) -> FsResult<FileAttr> {
        let path = self.table.child_path(parent, name).ok_or(Errno::ENOENT)?;
        fs::symlink_metadata(&path).map_err(errno)?;
        let ino = self.table.node_for(parent, name);
        match self.attr(ino) {
            Ok(attr) => {
                self.node_mut(ino)?.lookups += 1;
                Ok(attr)
            }
            Err(e) => {
                self.table.remove_if_unused(ino);
                Err(e)
            }
        }
    }

    pub fn forget(&mut self, ino: u64, count: u64) {
        self.table.forget(ino, count);
    }

    /// create: creates (or, without `O_EXCL`, opens) the backing file and opens one handle.
    /// `O_TRUNC` of an existing file drops its pending writes, then empties it.
    pub fn create(
        &mut self,
        parent: u64,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
    ) -> FsResult<(FileAttr, u64)> {
        let path = self.table.child_path(parent, name).ok_or(Errno::ENOENT)?;
        let mut options = OpenOptions::new();
        options.read(true).write(true).mode(mode & !umask & 0o7777);
        if flags & libc::O_EXCL != 0 {
            options.create_new(true);
        } else {
            options.create(true);
        }
        let file = options.open(&path).map_err(errno)?;
        let ino = self.table.node_for(parent, name);
        let node = self.node_mut(ino)?;
        if node.file.is_none() {
            node.file = Some(file);
        }
        node.lookups += 1;
        node.open_handles = node.open_handles.saturating_add(1);
        if flags & libc::O_TRUNC != 0 {
            let dropped = node.pending.discard();
            self.pending_bytes -= dropped;
            let node = self.node_mut(ino)?;
            node.file
                .as_ref()
                .expect("set above")
                .set_len(0)
                .map_err(errno)?;
        }
        Ok((self.attr(ino)?, ino))
    }

    pub fn mkdir(
        &mut self,
        parent: u64,
        name: &OsStr,
        mode: u32,
        umask: u32,
    ) -> FsResult<FileAttr> {
        let path = self.table.child_path(parent, name).ok_or(Errno::ENOENT)?;
        DirBuilder::new()
            .mode(mode & !umask & 0o7777)
            .create(&path)
            .map_err(errno)?;
        self.lookup(parent, name)
    }

    /// unlink: removes the backing name; the node's pending writes go with its last handle.
    pub fn unlink(&mut self, parent: u64, name: &OsStr) -> FsResult<()> {
        let path = self.table.child_path(parent, name).ok_or(Errno::ENOENT)?;
        fs::remove_file(&path).map_err(errno)?;
        self.detached(parent, name);
        Ok(())
    }

    pub fn rmdir(&mut self, parent: u64, name: &OsStr) -> FsResult<()> {
        let path = self.table.child_path(parent, name).ok_or(Errno::ENOENT)?;
        fs::remove_dir(&path).map_err(errno)?;
        self.detached(parent, name);
        Ok(())
    }

    /// rename: atomic in the backing directory; a replaced target is unlinked; pending writes
    /// stay with the renamed node. `RENAME_NOREPLACE` is honoured, `RENAME_EXCHANGE` refused.
    pub fn rename(
        &mut self,
        parent: u64,
        name: &OsStr,
        new_parent: u64,
        new_name: &OsStr,
        flags: u32,
    ) -> FsResult<()> {
        let from = self.table.child_path(parent, name).ok_or(Errno::ENOENT)?;
        let to = self
            .table
            .child_path(new_parent, new_name)
            .ok_or(Errno::ENOENT)?;
        if flags & libc::RENAME_EXCHANGE != 0 || flags & !libc::RENAME_NOREPLACE != 0 {
            return Err(Errno::EINVAL);
        }
        if flags & libc::RENAME_NOREPLACE != 0 && fs::symlink_metadata(&to).is_ok() {
            return Err(Errno::EEXIST);
        }
        fs::rename(&from, &to).map_err(errno)?;
        if (parent, name) != (new_parent, new_name) {
            self.detached(new_parent, new_name);
            self.table.rename(parent, name, new_parent, new_name);
        }
        Ok(())
    }

    /// The name is gone from the backing directory: forget it, and drop the node's pending
    /// writes now if no handle is open (otherwise at its last release).
    fn detached(&mut self, parent: u64, name: &OsStr) {
        let Some(ino) = self.table.detach(parent, name) else {
            return;
        };
        if let Some(node) = self.table.get_mut(ino) {
            if node.open_handles == 0 {
                let dropped = node.pending.discard();
                node.file = None;
                self.pending_bytes -= dropped;
                self.stats.discarded_bytes += dropped;
            }
        }
        self.table.remove_if_unused(ino);
    }

    /// setattr: size first (exact truncate), then mode, owner, times.
    pub fn setattr(&mut self, ino: u64, change: SetAttr) -> FsResult<FileAttr> {
        if let Some(size) = change.size {
            self.ensure_file(ino)?;
            let before = self.pending_bytes;
            self.settle(ino, |node| {
                let crate::inodes::Node { pending, file, .. } = node;
                let file = file
                    .as_mut()
                    .ok_or(io::Error::from_raw_os_error(libc::EBADF))?;
                pending.truncate(file, size)
            })?;
            self.stats.early_write_back_bytes += before - self.pending_bytes;
            self.close_if_idle(ino);
        }
        let path = self.table.path(ino);
        let node = self.node(ino)?;
        if let Some(mode) = change.mode {
            let permissions = fs::Permissions::from_mode(mode & 0o7777);
            match (&node.file, &path) {
                (Some(file), _) => file.set_permissions(permissions),
                (None, Some(path)) => fs::set_permissions(path, permissions),
                (None, None) => return Err(Errno::ENOENT),
            }
            .map_err(errno)?;
        }
        if change.uid.is_some() || change.gid.is_some() {
            match (&node.file, &path) {
                (Some(file), _) => std::os::unix::fs::fchown(file, change.uid, change.gid),
                (None, Some(path)) => std::os::unix::fs::lchown(path, change.uid, change.gid),
                (None, None) => return Err(Errno::ENOENT),
            }
            .map_err(errno)?;
        }
        if change.atime.is_some() || change.mtime.is_some() {
            let path = path.ok_or(Errno::ENOENT)?;
            set_times(&path, change.atime, change.mtime)?;
        }
        self.attr(ino)
    }

    /// Closes a node's backing file when no handle and no pending write needs it.
    fn close_if_idle(&mut self, ino: u64) {
        if let Some(node) = self.table.get_mut(ino) {
            if node.open_handles == 0 && node.pending.is_empty() {
                node.file = None;
            }
        }
    }

    /// opendir: snapshots the listing (so offsets stay stable while it is read).
    pub fn opendir(&mut self, ino: u64) -> FsResult<u64> {
        if self.dirs.open.len() >= MAX_OPEN_DIRS {
            return Err(Errno::EMFILE);
        }
        let path = self.table.path(ino).ok_or(Errno::ENOENT)?;
        let parent = if ino == ROOT_INO {
            ROOT_INO
        } else {
            self.node(ino)?.parent
        };
        let mut entries = vec![
            DirEntry {
                ino,
                kind: FileType::Directory,
                name: ".".into(),
            },
            DirEntry {
                ino: parent,
                kind: FileType::Directory,
                name: "..".into(),
            },
        ];
        for entry in fs::read_dir(&path).map_err(errno)? {
            if entries.len() >= MAX_DIR_ENTRIES {
                return Err(Errno::EFBIG);
            }
            let entry = entry.map_err(errno)?;
            let Some(kind) = entry.file_type().ok().and_then(FileType::from_std) else {
                continue;
            };
            let name = entry.file_name();
            // Readdir inode numbers are only hints (lookup assigns the real one): a remembered
            // node's own number, else the backing file's.
            let ino = self.table.find(ino, &name).unwrap_or_else(|| entry.ino());
            entries.push(DirEntry { ino, kind, name });
        }
        self.dirs.next += 1;
        let handle = self.dirs.next;
        self.dirs.open.insert(handle, entries);
        Ok(handle)
    }

    /// The listing entries from `offset` on (each entry's offset is its index + 1).
    pub fn readdir(&self, handle: u64, offset: u64) -> FsResult<&[DirEntry]> {
        let entries = self.dirs.open.get(&handle).ok_or(Errno::EBADF)?;
        let start = usize::try_from(offset)
            .unwrap_or(usize::MAX)
            .min(entries.len());
        Ok(&entries[start..])
    }

    pub fn releasedir(&mut self, handle: u64) {
        self.dirs.open.remove(&handle);
    }

    /// fsyncdir: fsyncs the backing directory (its entries are already there; see the essay).
    pub fn fsyncdir(&self, ino: u64) -> FsResult<()> {
        let path = self.table.path(ino).ok_or(Errno::ENOENT)?;
        fs::File::open(path)
            .and_then(|dir| dir.sync_all())
            .map_err(errno)
    }

    pub fn statfs(&self) -> FsResult<StatFs> {
        let path = cstring(self.table.root_path())?;
        // SAFETY: statvfs writes into the zeroed struct we own; the path is a valid C string.
        let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
        if unsafe { libc::statvfs(path.as_ptr(), &mut stat) } != 0 {
            return Err(errno(io::Error::last_os_error()));
        }
        Ok(StatFs {
            blocks: stat.f_blocks,
            blocks_free: stat.f_bfree,
            blocks_available: stat.f_bavail,
            files: stat.f_files,
            files_free: stat.f_ffree,
            block_size: u32::try_from(stat.f_bsize).unwrap_or(4096),
            name_max: u32::try_from(stat.f_namemax).unwrap_or(255),
            fragment_size: u32::try_from(stat.f_frsize).unwrap_or(4096),
        })
    }
}

fn timespec(time: Option<TimeOrNow>) -> libc::timespec {
    match time {
        None => libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_OMIT,
        },
        Some(TimeOrNow::Now) => libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_NOW,
        },
        Some(TimeOrNow::SpecificTime(at)) => {
            let since = at.duration_since(UNIX_EPOCH).unwrap_or_default();
            libc::timespec {
                tv_sec: i64::try_from(since.as_secs()).unwrap_or(i64::MAX),
                tv_nsec: i64::from(since.subsec_nanos()),
            }
        }
    }
}

fn set_times(path: &Path, atime: Option<TimeOrNow>, mtime: Option<TimeOrNow>) -> FsResult<()> {
    let path = cstring(path)?;
    let times = [timespec(atime), timespec(mtime)];
    // SAFETY: valid C string and a two-element timespec array, as utimensat requires.
    let rc = unsafe {
        libc::utimensat(
            libc::AT_FDCWD,
            path.as_ptr(),
            times.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    if rc != 0 {
        return Err(errno(io::Error::last_os_error()));
    }
    Ok(())
}
