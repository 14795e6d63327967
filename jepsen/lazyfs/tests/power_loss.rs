//! Power loss and clean shutdown through a real mount: what survives SIGKILL is exactly what
//! was fsynced; SIGTERM keeps everything.

mod common;

use common::*;
use std::os::unix::fs::FileExt;

const A_SYNCED: usize = 4096;
const A_UNSYNCED: usize = 2048;
const B_UNSYNCED: usize = 3000;

/// Writes A (fsynced), B (never fsynced), then appends to A without fsync; checks the mount
/// shows all of it and the backing dir only the synced part.
fn write_a_and_b(dirs: &Dirs) {
    let mut a = open_rw(&dirs.in_mount("a"));
    write_at(&mut a, 0, &pattern(1, 0, A_SYNCED));
    a.sync_all().unwrap();
    let mut b = open_rw(&dirs.in_mount("b"));
    write_at(&mut b, 0, &pattern(2, 0, B_UNSYNCED));
    append(&mut a, &pattern(1, A_SYNCED, A_UNSYNCED));
    drop((a, b));

    // Visible through the mount: everything, synced or not (read your writes, sizes included).
    assert_eq!(
        read_all(&dirs.in_mount("a")),
        pattern(1, 0, A_SYNCED + A_UNSYNCED)
    );
    assert_eq!(read_all(&dirs.in_mount("b")), pattern(2, 0, B_UNSYNCED));
    let size = std::fs::metadata(dirs.in_mount("a")).unwrap().len();
    assert_eq!(size as usize, A_SYNCED + A_UNSYNCED);
    // The backing dir: the names exist (metadata is durable at once), data only as synced;
    // closing the files did not write anything back.
    assert_eq!(read_all(&dirs.in_backing("a")), pattern(1, 0, A_SYNCED));
    assert!(read_all(&dirs.in_backing("b")).is_empty());
}

/// SIGKILL loses every unsynced write: A keeps its synced prefix, B is empty, on the backing
/// dir and through a new mount (no stale page cache from the dead one).
#[test]
fn power_loss_keeps_only_fsynced_data() {
    power_loss_scenario(&[], "power_loss_keeps_only_fsynced_data");
}

/// The same with the kernel page cache on (`--page-cache`): the new mount still reads only
/// what was synced, although the dead mount had the lost bytes cached.
#[test]
fn power_loss_with_page_cache_keeps_only_fsynced_data() {
    power_loss_scenario(&["--page-cache"], "power_loss_with_page_cache");
}

fn power_loss_scenario(args: &[&str], test: &str) {
    let dirs = Dirs::new();
    let Some(fs) = start_or_skip(&dirs, args, test) else {
        return;
    };
    write_a_and_b(&dirs);
    // Keep A's pages in the old mount's page cache (if it caches) right up to the kill.
    let warm = read_all(&dirs.in_mount("a"));
    assert_eq!(warm.len(), A_SYNCED + A_UNSYNCED);
    fs.power_loss();
    assert!(!is_mounted(&dirs.mount));

    let a = read_all(&dirs.in_backing("a"));
    let b = read_all(&dirs.in_backing("b"));
    eprintln!(
        "after power loss: a kept {} of {} bytes ({} lost), b kept {} of {} ({} lost)",
        a.len(),
        A_SYNCED + A_UNSYNCED,
        A_SYNCED + A_UNSYNCED - a.len(),
        b.len(),
        B_UNSYNCED,
        B_UNSYNCED - b.len()
    );
    assert_eq!(a, pattern(1, 0, A_SYNCED));
    assert!(b.is_empty());

    let Some(fs) = start_or_skip(&dirs, args, test) else {
        return;
    };
    assert_eq!(read_all(&dirs.in_mount("a")), pattern(1, 0, A_SYNCED));
    assert_eq!(
        std::fs::metadata(dirs.in_mount("a")).unwrap().len() as usize,
        A_SYNCED
    );
    assert!(read_all(&dirs.in_mount("b")).is_empty());
    // The restarted filesystem buffers again: a new unsynced write is lost at the next cut.
    let mut b = open_rw(&dirs.in_mount("b"));
    write_at(&mut b, 0, b"second life");
    drop(b);
    fs.power_loss();
    assert!(read_all(&dirs.in_backing("b")).is_empty());
}

/// A descriptor left open across the power loss cannot read the lost data (default
/// `direct_io`): the read fails with ENOTCONN, before and after the mount is detached.
#[test]
fn descriptor_open_across_power_loss_cannot_read_lost_data() {
    let dirs = Dirs::new();
    let Some(mut fs) = start_or_skip(&dirs, &[], "descriptor_open_across_power_loss") else {
        return;
    };
    let mut file = open_rw(&dirs.in_mount("f"));
    write_at(&mut file, 0, b"never synced");
    let mut seen = [0u8; 12];
    file.read_exact_at(&mut seen, 0).unwrap();
    assert_eq!(&seen, b"never synced");
    fs.kill_only();
    let error = file.read_at(&mut seen, 0).unwrap_err();
    assert_eq!(error.raw_os_error(), Some(libc::ENOTCONN));
    detach(&dirs.mount).unwrap();
    let error = file.read_at(&mut seen, 0).unwrap_err();
    assert_eq!(error.raw_os_error(), Some(libc::ENOTCONN));
    assert!(read_all(&dirs.in_backing("f")).is_empty());
}

/// SIGTERM writes everything back and fsyncs it, exits 0 and leaves nothing mounted.
#[test]
fn clean_shutdown_keeps_unsynced_data() {
    let dirs = Dirs::new();
    let Some(fs) = start_or_skip(&dirs, &[], "clean_shutdown_keeps_unsynced_data") else {
        return;
    };
    write_a_and_b(&dirs);
    let status = fs.terminate();
    assert!(status.success(), "exit status {status:?}");
    assert!(!is_mounted(&dirs.mount));
    assert_eq!(
        read_all(&dirs.in_backing("a")),
        pattern(1, 0, A_SYNCED + A_UNSYNCED)
    );
    assert_eq!(read_all(&dirs.in_backing("b")), pattern(2, 0, B_UNSYNCED));
}

/// Past --max-pending-bytes the oldest data is written back without fsync: a power loss then
/// keeps a prefix of the history, never more than was written, and at most the bound is lost.
#[test]
fn memory_bound_writes_back_oldest_data() {
    const BOUND: usize = 64 * 1024;
    const CHUNK: usize = 4096;
    // Not a multiple of the bound, so the last writes are still pending at the cut.
    const TOTAL: usize = 1024 * 1024 + 5 * CHUNK;
    let dirs = Dirs::new();
    let bound = BOUND.to_string();
    let Some(fs) = start_or_skip(
        &dirs,
        &["--max-pending-bytes", &bound],
        "memory_bound_writes_back_oldest_data",
    ) else {
        return;
    };
    let mut file = open_rw(&dirs.in_mount("log"));
    for offset in (0..TOTAL).step_by(CHUNK) {
        write_at(&mut file, offset as u64, &pattern(3, offset, CHUNK));
    }
    drop(file);
    assert_eq!(read_all(&dirs.in_mount("log")), pattern(3, 0, TOTAL));
    fs.power_loss();
    let kept = read_all(&dirs.in_backing("log"));
    eprintln!(
        "memory bound {BOUND}: kept {} of {TOTAL} unsynced bytes, lost {}",
        kept.len(),
        TOTAL - kept.len()
    );
    assert_eq!(kept, pattern(3, 0, kept.len()), "a prefix of the history");
    assert!(TOTAL - kept.len() <= BOUND, "lost more than the bound");
    assert!(kept.len() < TOTAL, "something must still have been pending");
}

/// Writes into the middle of a synced file and past its end are lost together; the synced
/// bytes around them survive untouched (no torn or zeroed synced data).
#[test]
fn overwrites_and_holes_are_lost_exactly() {
    let dirs = Dirs::new();
    let Some(fs) = start_or_skip(&dirs, &[], "overwrites_and_holes_are_lost_exactly") else {
        return;
    };
    let mut file = open_rw(&dirs.in_mount("f"));
    write_at(&mut file, 0, &pattern(4, 0, 8192));
    file.sync_data().unwrap();
    write_at(&mut file, 100, &[0xEE; 50]);
    write_at(&mut file, 20_000, b"past a hole");
    let mut seen = vec![0u8; 20_011];
    file.read_exact_at(&mut seen, 0).unwrap();
    assert_eq!(&seen[100..150], &[0xEE; 50]);
    assert!(
        seen[8192..20_000].iter().all(|&b| b == 0),
        "the hole reads as zeros"
    );
    assert_eq!(&seen[20_000..], b"past a hole");
    drop(file);
    fs.power_loss();
    assert_eq!(read_all(&dirs.in_backing("f")), pattern(4, 0, 8192));
}
