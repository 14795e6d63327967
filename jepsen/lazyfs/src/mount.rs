//! Mounting and unmounting: the library surface the binary (and tests) use.
//!
//! # What
//!
//! [`mount`] puts a [`LazyFs`] over a backing directory at a mount point and returns a
//! [`Mounted`] once the kernel has completed the FUSE handshake (the mount is live: any
//! process can use it). The session runs on its own thread. [`Mounted::shutdown`] is the clean
//! end: flush every pending write to the backing files and fsync them, unmount, join.
//!
//! A power loss has no function here on purpose: it is `SIGKILL` of the process holding the
//! mount, followed by `fusermount3 -u -z <mount>` (or `umount -l`) to clear the dead mount.
//! See the crate essay.
//!
//! # Invariants
//!
//! - **Bounded waits**: the unmount falls back to a lazy detach when the mount is busy, and
//!   joining the session thread waits at most the given timeout.
//! - **Flushed twice**: before the unmount (so a hung unmount loses nothing written so far)
//!   and after the session ends (for writes that arrived in between).

use crate::fuse_ops::{check_backing_dir, LazyFs};
use crate::state::State;
use fuser::{Config, MountOption, Session, SessionACL, SessionUnmounter};
use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

/// How to mount.
#[derive(Debug, Clone)]
pub struct MountConfig {
    /// The directory whose contents appear at the mount point; it holds what survives.
    pub backing: PathBuf,
    /// An existing empty directory.
    pub mountpoint: PathBuf,
    /// Memory bound on unsynced data (see `State`).
    pub max_pending_bytes: u64,
    /// Bypass the kernel page cache for file data (`FOPEN_DIRECT_IO`).
    pub direct_io: bool,
    /// Other users may use the mount (`allow_other`).
    pub allow_other: bool,
}

/// A live mount.
pub struct Mounted {
    state: Arc<Mutex<State>>,
    unmounter: SessionUnmounter,
    mountpoint: PathBuf,
    session_ended: mpsc::Receiver<io::Result<()>>,
}

impl std::fmt::Debug for Mounted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mounted")
            .field("mountpoint", &self.mountpoint)
            .finish_non_exhaustive()
    }
}

/// Mounts; returns when the mount is live. `on_session_end` runs on the session thread after
/// the session ends for any reason (unmount by anyone, or an error).
pub fn mount(
    config: &MountConfig,
    on_session_end: impl FnOnce() + Send + 'static,
) -> io::Result<Mounted> {
    check_backing_dir(&config.backing)?;
    let backing = config.backing.canonicalize()?;
    let state = Arc::new(Mutex::new(State::new(backing, config.max_pending_bytes)));
    let filesystem = LazyFs::new(state.clone(), config.direct_io);
    let mut options = Config::default();
    options.mount_options = vec![
        MountOption::FSName("meridian-lazyfs".to_string()),
        MountOption::Subtype("meridian-lazyfs".to_string()),
        // The kernel checks permissions against our attributes; the process itself runs
        // backing I/O with its own rights.
        MountOption::DefaultPermissions,
    ];
    if config.allow_other {
        options.acl = SessionACL::All;
    }
    options.n_threads = Some(1);
    let mut session = Session::new(filesystem, &config.mountpoint, &options)?;
    let unmounter = session.unmount_callable();
    let (ended_tx, session_ended) = mpsc::sync_channel(1);
    std::thread::Builder::new()
        .name("lazyfs-session".to_string())
        .spawn(move || {
            let result = session.run();
            let _ = ended_tx.send(result);
            on_session_end();
        })?;
    Ok(Mounted {
        state,
        unmounter,
        mountpoint: config.mountpoint.clone(),
        session_ended,
    })
}

impl Mounted {
    pub fn mountpoint(&self) -> &Path {
        &self.mountpoint
    }

    /// The filesystem state (pending bytes, counters), e.g. for tests and logs.
    pub fn state(&self) -> Arc<Mutex<State>> {
        self.state.clone()
    }

    /// Writes every pending write back and fsyncs it; returns the number of files synced.
    pub fn flush_all(&self) -> io::Result<u64> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        state
            .flush_all()
            .map_err(|e| io::Error::from_raw_os_error(e.code()))
    }

    /// Clean shutdown: flush, unmount (lazily if busy), wait up to `timeout` for the session
    /// to end, flush again.
    pub fn shutdown(mut self, timeout: Duration) -> io::Result<u64> {
        let mut synced = self.flush_all()?;
        if let Err(e) = self.unmounter.unmount() {
            tracing::warn!(error = %e, "unmount failed; detaching lazily");
            detach(&self.mountpoint)?;
        }
        match self.session_ended.recv_timeout(timeout) {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "session ended with an error"),
            Err(_) => tracing::warn!(?timeout, "session did not end in time"),
        }
        synced += self.flush_all()?;
        Ok(synced)
    }

    /// Waits until the session ends by itself (someone unmounted), up to `timeout`.
    pub fn wait_session_end(&self, timeout: Duration) -> Option<io::Result<()>> {
        self.session_ended.recv_timeout(timeout).ok()
    }
}

/// Lazy unmount (`umount -l`), what `fusermount3 -u -z` does for root.
pub fn detach(mountpoint: &Path) -> io::Result<()> {
    let path = CString::new(mountpoint.as_os_str().as_bytes())
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: umount2 with a valid C string and a flag.
    if unsafe { libc::umount2(path.as_ptr(), libc::MNT_DETACH) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
