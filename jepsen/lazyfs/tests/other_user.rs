//! A mount shared with other users (`--allow-other`), as the Jepsen harness uses it: root mounts,
//! each node runs as its own uid. What such a user creates must be its own, or the kernel's
//! permission checks (`default_permissions`) refuse it its own files.

mod common;

use common::*;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::process::Command;

const NOBODY: u32 = 65_534;

/// A file and a directory created through the mount by uid 65534 belong to it (also in the
/// backing directory), and it can reopen the file for appending.
#[test]
fn what_another_user_creates_is_its_own() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("SKIPPED what_another_user_creates_is_its_own: needs root");
        return;
    }
    let dirs = Dirs::new();
    let parent = dirs.mount.parent().unwrap().to_path_buf();
    std::fs::set_permissions(&parent, std::fs::Permissions::from_mode(0o755)).unwrap();
    let Some(_fs) = start_or_skip(&dirs, &["--allow-other"], "what_another_user_creates") else {
        return;
    };
    std::fs::set_permissions(&dirs.mount, std::fs::Permissions::from_mode(0o777)).unwrap();
    let script = "echo one > f && echo two >> f && mkdir d && echo three > d/g && cat f d/g";
    let output = Command::new("sh")
        .arg("-c")
        .arg(script)
        .current_dir(&dirs.mount)
        .uid(NOBODY)
        .gid(NOBODY)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "as uid {NOBODY}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&output.stdout), "one\ntwo\nthree\n");
    for name in ["f", "d", "d/g"] {
        for path in [dirs.in_mount(name), dirs.in_backing(name)] {
            let meta = std::fs::metadata(&path).unwrap();
            assert_eq!(
                (meta.uid(), meta.gid()),
                (NOBODY, NOBODY),
                "{}",
                path.display()
            );
        }
    }
}
