//! The binary's command line.

use crate::mount::MountConfig;
use crate::state::DEFAULT_MAX_PENDING_BYTES;
use clap::Parser;
use std::path::PathBuf;

/// A FUSE filesystem that keeps writes in memory until fsync: SIGKILL it and every unsynced
/// write is gone (a power loss); SIGTERM/SIGINT write everything back, fsync and unmount.
///
/// Prints `mounted <MOUNT>` on stdout once the mount is live; logs go to stderr.
/// After a SIGKILL, clear the dead mount with `fusermount3 -u -z <MOUNT>` before mounting
/// again on the same backing directory.
#[derive(Debug, Clone, Parser)]
#[command(name = "meridian-lazyfs", version)]
pub struct Args {
    /// Directory holding the real files (what survives a power loss).
    #[arg(long, value_name = "DIR")]
    pub backing: PathBuf,

    /// Existing empty directory to mount on.
    #[arg(long, value_name = "DIR")]
    pub mount: PathBuf,

    /// Memory bound on unsynced data; past it the oldest pending data is written back to the
    /// backing files without fsync (a power loss may then keep it).
    #[arg(long, value_name = "BYTES", default_value_t = DEFAULT_MAX_PENDING_BYTES)]
    pub max_pending_bytes: u64,

    /// Let the kernel cache file data (no `direct_io`). Faster reads, but a process that keeps
    /// a file open across a power loss can still read the lost data from the dead mount's page
    /// cache; by default every read and write reaches lazyfs, so such a read fails (ENOTCONN).
    #[arg(long)]
    pub page_cache: bool,

    /// Let users other than the one mounting reach the mount (FUSE's `allow_other`; needs root
    /// or `user_allow_other` in /etc/fuse.conf). The Jepsen harness runs each node as its own
    /// uid when it partitions, on mounts root made.
    #[arg(long)]
    pub allow_other: bool,
}

impl Args {
    pub fn mount_config(&self) -> MountConfig {
        MountConfig {
            backing: self.backing.clone(),
            mountpoint: self.mount.clone(),
            max_pending_bytes: self.max_pending_bytes,
            direct_io: !self.page_cache,
            allow_other: self.allow_other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The documented flags parse, with the default memory bound.
    #[test]
    fn parses_flags() {
        let args =
            Args::try_parse_from(["meridian-lazyfs", "--backing", "/b", "--mount", "/m"]).unwrap();
        assert_eq!(args.max_pending_bytes, DEFAULT_MAX_PENDING_BYTES);
        assert!(args.mount_config().direct_io, "direct_io by default");
        assert!(!args.mount_config().allow_other);
        let args = Args::try_parse_from([
            "meridian-lazyfs",
            "--backing",
            "/b",
            "--mount",
            "/m",
            "--max-pending-bytes",
            "4096",
            "--page-cache",
            "--allow-other",
        ])
        .unwrap();
        assert!(args.mount_config().allow_other);
        assert_eq!(args.mount_config().max_pending_bytes, 4096);
        assert!(!args.mount_config().direct_io);
        assert!(Args::try_parse_from(["meridian-lazyfs", "--backing", "/b"]).is_err());
    }
}
