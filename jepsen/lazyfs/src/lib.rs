//! Meridian's LazyFS: a FUSE filesystem that loses unsynced writes when it is killed, so the
//! Jepsen harness can cut a node's power.
//!
//! # Why
//!
//! Killing a node with SIGKILL does not test its fsync discipline: the operating system keeps
//! everything the process wrote, synced or not, and the restarted node finds it. A power loss
//! does not. Meridian promises that an acknowledged write is fsynced on a quorum, so several
//! nodes losing power at once must lose no acknowledged write; testing that needs a disk that
//! forgets. Jepsen's LazyFS (C++, libfuse) is such a disk; this is the same idea as a small
//! Rust binary the harness builds with the rest of the workspace.
//!
//! # What
//!
//! ```text
//!   node process ──► /mnt/n1 (FUSE mount) ──► meridian-lazyfs ──► /data/n1 (backing dir)
//!                      write:  kept in lazyfs's memory (pending list per file)
//!                      read:   backing bytes + pending writes applied in order
//!                      fsync:  pending → pwrite to backing, fsync backing, forget
//!                      SIGKILL lazyfs: pending lists vanish = power loss
//!                      SIGTERM lazyfs: pending → backing, fsync, unmount = clean shutdown
//! ```
//!
//! Every file and directory of the backing directory appears at the mount point. Data writes
//! are buffered in the filesystem process until `fsync`/`fdatasync` of that file; close does
//! not make them durable. Metadata operations (create, mkdir, unlink, rmdir, rename, truncate,
//! fallocate, chmod) go to the backing directory at once and so survive a power loss.
//!
//! Power loss, as the harness does it:
//! 1. `kill -KILL <lazyfs pid>` (and the node's own process);
//! 2. `fusermount3 -u -z <mount>` — the dead mount is detached; its kernel page cache goes
//!    with its superblock;
//! 3. start a new `meridian-lazyfs` on the same backing directory and mount point, wait for
//!    `mounted <mount>` on its stdout, restart the node.
//!
//! # Using it (the harness)
//!
//! ```text
//!   meridian-lazyfs --backing B --mount M [--max-pending-bytes N] [--page-cache]
//!     stdout: exactly one line "mounted M" once the mount is live (wait for it, bounded);
//!     stderr: logs (RUST_LOG filters). M must exist and be empty; B must exist.
//!   power loss:      kill -KILL <node pid> <lazyfs pid>; fusermount3 -u -z M
//!                    (as root `umount -l M` is the same); then start lazyfs again on B, M
//!   clean shutdown:  stop the node, then kill -TERM (or -INT) <lazyfs pid>: pending data is
//!                    written back and fsynced, M unmounted, exit 0. `fusermount3 -u M` from
//!                    outside is also a clean end (flush, exit 0).
//!   exit 1:          mount failed (message on stderr, nothing printed on stdout).
//! ```
//!
//! In-process use (tests, tools): [`mount::mount`] returns a [`mount::Mounted`] once live;
//! [`mount::Mounted::shutdown`] is the clean end. The pure model is [`overlay::PendingWrites`].
//!
//! # Invariants
//!
//! - **Only fsync is durable**: after a power loss the backing directory holds, per file,
//!   exactly the bytes present at its last fsync, plus any pending data that was written back
//!   early (memory bound, truncate, non-`KEEP_SIZE` fallocate) — which a real kernel may also
//!   write back at any time, so both outcomes are legal.
//! - **Read your writes**: through the mount, reads and sizes include every acknowledged
//!   write, synced or not.
//! - **Bounded memory**: pending data is capped by `--max-pending-bytes` (default 256 MiB).
//! - **No stale reads after a power loss**: the new mount is a new superblock, and files are
//!   opened with `direct_io` (no kernel page cache), so even a descriptor left open on the dead
//!   mount fails rather than returning lost data (`--page-cache` trades that for speed). The
//!   integration tests read through the new mount and through such a descriptor.
//!
//! # Not modelled
//!
//! - Loss of metadata: names, renames, truncates and directory changes are durable at once,
//!   more durable than ext4 without a directory fsync. Only data writes are volatile.
//! - Torn or reordered writes: the backing file holds a prefix of the write history; a real
//!   disk can persist a later write without an earlier one, or half a write.
//! - Power loss of the whole machine: other processes' writes outside the mount, and the
//!   backing filesystem's own cache, are untouched (the OS keeps the backing files).
//! - Hard links (`link` fails with `EOPNOTSUPP`), symlinks, device nodes and xattrs.
//! - File ownership follows the lazyfs process, not the caller; mtime moves at write-back.
//! - Locks (`flock`, `fcntl`) are the kernel's local locks on the FUSE inode: they work
//!   between processes on this mount, and vanish with the mount like real locks with a crash.
//!
//! # Layout
//!
//! - [`overlay`]: the pure model of one file's pending writes (property-tested, no FUSE).
//! - [`inodes`]: inode numbers ↔ backing paths, lookup counts, per-inode state.
//! - [`state`]: the filesystem state; data operations, memory bound, shutdown flush.
//! - [`namespace`]: metadata operations applied to the backing directory.
//! - [`fuse_ops`]: the `fuser::Filesystem` glue.
//! - [`mount`]: mount, clean shutdown, lazy detach.
//! - [`args`]: the binary's flags.

pub mod args;
pub mod fuse_ops;
pub mod inodes;
pub mod mount;
pub mod namespace;
pub mod overlay;
pub mod state;
