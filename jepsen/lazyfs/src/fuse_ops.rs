//! The FUSE glue: [`LazyFs`] implements `fuser::Filesystem` by locking the shared [`State`],
//! calling one method and turning its result into a reply.
//!
//! # Invariants
//!
//! - **One request at a time**: the session runs one thread and every request takes the state
//!   lock, so operations are atomic with respect to each other (an fsync blocks other requests
//!   while it runs; the filesystem is a test tool, not a fast one).
//! - **No panics on kernel input**: every failure is an errno reply; a poisoned lock (a panic
//!   in an earlier request, which would be a bug) is recovered rather than propagated.
//! - **No stale page cache**: by default files are opened with `FOPEN_DIRECT_IO`, so no file
//!   data is cached in the kernel: every read reaches lazyfs, and after a power loss a file
//!   descriptor still open on the dead mount fails with `ENOTCONN` instead of returning the
//!   lost data. (Without it — `--page-cache` — such a descriptor was measured to keep reading
//!   the lost bytes from the page cache; only new mounts, being new superblocks, start
//!   clean.) `FOPEN_KEEP_CACHE` is never set.
//! - **Locks are the kernel's**: `getlk`/`setlk`/`flock` are not implemented and the session
//!   does not ask for `FUSE_POSIX_LOCKS`/`FUSE_FLOCK_LOCKS`, so the kernel keeps locks locally
//!   on the FUSE inode, which is what RocksDB's LOCK file needs within one machine.

use crate::namespace::SetAttr;
use crate::state::State;
use fuser::{
    Errno, FileAttr, FileHandle, Filesystem, FopenFlags, Generation, INodeNo, LockOwner, OpenFlags,
    RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry,
    ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};
use std::ffi::OsStr;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime};

/// How long the kernel may cache names and attributes. Every change goes through this
/// filesystem (which the kernel sees), so a short cache is safe; it only bounds how long a
/// change made behind our back would stay invisible.
const TTL: Duration = Duration::from_secs(1);

/// The FUSE filesystem: a handle on the shared state.
#[derive(Debug, Clone)]
pub struct LazyFs {
    state: Arc<Mutex<State>>,
    open_flags: FopenFlags,
}

impl LazyFs {
    /// `direct_io` makes every read and write of a file bypass the kernel page cache.
    pub fn new(state: Arc<Mutex<State>>, direct_io: bool) -> Self {
        let open_flags = if direct_io {
            FopenFlags::FOPEN_DIRECT_IO
        } else {
            FopenFlags::empty()
        };
        LazyFs { state, open_flags }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A file or directory made for another user is handed to it, as a kernel filesystem would:
/// lazyfs creates backing files with its own uid, and with `default_permissions` the kernel
/// would then refuse the creator its own file (the Jepsen harness mounts as root and runs each
/// node as its own uid). Only root may hand files over; others keep their own.
fn hand_over(state: &mut State, req: &Request, attr: FileAttr) -> Result<FileAttr, Errno> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    if (attr.uid, attr.gid) == (req.uid(), req.gid()) || !root {
        return Ok(attr);
    }
    let change = SetAttr {
        uid: Some(req.uid()),
        gid: Some(req.gid()),
        ..SetAttr::default()
    };
    state.setattr(attr.ino.0, change)
}

fn entry(reply: ReplyEntry, result: Result<FileAttr, Errno>) {
    match result {
        Ok(attr) => reply.entry(&TTL, &attr, Generation(0)),
        Err(e) => reply.error(e),
    }
}

fn empty(reply: ReplyEmpty, result: Result<(), Errno>) {
    match result {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(e),
    }
}

impl Filesystem for LazyFs {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        entry(reply, self.state().lookup(parent.0, name));
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.state().forget(ino.0, nlookup);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.state().attr(ino.0) {
            Ok(attr) => reply.attr(&TTL, &attr),
            Err(e) => reply.error(e),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let change = SetAttr {
            mode,
            uid,
            gid,
            size,
            atime,
            mtime,
        };
        match self.state().setattr(ino.0, change) {
            Ok(attr) => reply.attr(&TTL, &attr),
            Err(e) => reply.error(e),
        }
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let mut state = self.state();
        let made = state
            .mkdir(parent.0, name, mode, umask)
            .and_then(|attr| hand_over(&mut state, req, attr));
        entry(reply, made);
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        empty(reply, self.state().unlink(parent.0, name));
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        empty(reply, self.state().rmdir(parent.0, name));
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let result = self
            .state()
            .rename(parent.0, name, newparent.0, newname, flags.bits());
        empty(reply, result);
    }

    fn link(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _newparent: INodeNo,
        _newname: &OsStr,
        reply: ReplyEntry,
    ) {
        // EOPNOTSUPP rather than fuser's default EPERM: RocksDB treats it as "not supported
        // here" and copies the file instead.
        reply.error(Errno::EOPNOTSUPP);
    }

    fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.state().open(ino.0) {
            Ok(fh) => reply.opened(FileHandle(fh), self.open_flags),
            Err(e) => reply.error(e),
        }
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let mut state = self.state();
        let made = state
            .create(parent.0, name, mode, umask, flags)
            .and_then(|(attr, fh)| Ok((hand_over(&mut state, req, attr)?, fh)));
        drop(state);
        match made {
            Ok((attr, fh)) => {
                reply.created(&TTL, &attr, Generation(0), FileHandle(fh), self.open_flags)
            }
            Err(e) => reply.error(e),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        match self.state().read(ino.0, offset, size) {
            Ok(data) => reply.data(&data),
            Err(e) => reply.error(e),
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        match self.state().write(ino.0, offset, data) {
            Ok(written) => reply.written(written),
            Err(e) => reply.error(e),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // close(2) makes nothing durable.
        reply.ok();
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        empty(reply, self.state().release(ino.0));
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        empty(reply, self.state().fsync(ino.0, datasync));
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.state().opendir(ino.0) {
            Ok(handle) => reply.opened(FileHandle(handle), FopenFlags::empty()),
            Err(e) => reply.error(e),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let state = self.state();
        let entries = match state.readdir(fh.0, offset) {
            Ok(entries) => entries,
            Err(e) => return reply.error(e),
        };
        for (index, dir_entry) in entries.iter().enumerate() {
            let next_offset = offset + index as u64 + 1;
            if reply.add(
                INodeNo(dir_entry.ino),
                next_offset,
                dir_entry.kind,
                &dir_entry.name,
            ) {
                break;
            }
        }
        reply.ok();
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.state().releasedir(fh.0);
        reply.ok();
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        empty(reply, self.state().fsyncdir(ino.0));
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        match self.state().statfs() {
            Ok(s) => reply.statfs(
                s.blocks,
                s.blocks_free,
                s.blocks_available,
                s.files,
                s.files_free,
                s.block_size,
                s.name_max,
                s.fragment_size,
            ),
            Err(e) => reply.error(e),
        }
    }

    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        empty(reply, self.state().fallocate(ino.0, offset, length, mode));
    }

    fn getxattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _name: &OsStr,
        _size: u32,
        reply: ReplyXattr,
    ) {
        // Extended attributes are not modelled. The kernel asks for `security.capability` on
        // the first write; EOPNOTSUPP answers "none" without fuser's not-implemented warning.
        reply.error(Errno::EOPNOTSUPP);
    }

    fn listxattr(&self, _req: &Request, _ino: INodeNo, _size: u32, reply: ReplyXattr) {
        reply.error(Errno::EOPNOTSUPP);
    }

    fn destroy(&mut self) {
        // The session ends (unmount): a clean end, so make everything durable.
        if let Err(e) = self.state().flush_all() {
            tracing::error!(error = ?e, "flush at unmount failed");
        }
    }
}

/// Checks that `path` is an existing directory (the backing directory must be).
pub fn check_backing_dir(path: &Path) -> std::io::Result<()> {
    let metadata = std::fs::metadata(path)?;
    if !metadata.is_dir() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::NotADirectory,
            format!("{} is not a directory", path.display()),
        ));
    }
    Ok(())
}
