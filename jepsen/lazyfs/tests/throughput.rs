//! Throughput of a sequential write+fdatasync loop through the mount vs directly on the
//! backing dir. Ignored by default (it measures, it does not judge); run it with
//! `cargo test --release -p meridian-lazyfs --test throughput -- --ignored --nocapture`.

mod common;

use common::*;
use std::fs::File;
use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

const RECORD: usize = 4096;
const SYNCED_RECORDS: usize = 2000;
const UNSYNCED_BYTES: usize = 64 * 1024 * 1024;

/// `SYNCED_RECORDS` appends of `RECORD` bytes, each followed by fdatasync.
fn write_fsync_loop(path: &Path) -> Duration {
    let mut file = File::create(path).unwrap();
    let record = pattern(5, 0, RECORD);
    let start = Instant::now();
    for _ in 0..SYNCED_RECORDS {
        file.write_all(&record).unwrap();
        file.sync_data().unwrap();
    }
    start.elapsed()
}

/// `UNSYNCED_BYTES` in 1 MiB writes, one fsync at the end.
fn bulk_write(path: &Path) -> Duration {
    let mut file = File::create(path).unwrap();
    let chunk = pattern(6, 0, 1 << 20);
    let start = Instant::now();
    for _ in 0..UNSYNCED_BYTES / chunk.len() {
        file.write_all(&chunk).unwrap();
    }
    file.sync_all().unwrap();
    start.elapsed()
}

fn report(label: &str, elapsed: Duration, ops: usize, bytes: usize) {
    let seconds = elapsed.as_secs_f64();
    eprintln!(
        "{label:>34}: {:8.0} ops/s {:8.1} MB/s ({:.3} s)",
        ops as f64 / seconds,
        bytes as f64 / seconds / 1e6,
        seconds
    );
}

/// Measures both loops through lazyfs and on the backing dir; checks the data arrived.
#[test]
#[ignore]
fn throughput_write_fsync_mount_vs_backing() {
    let dirs = Dirs::new();
    let Some(fs) = start_or_skip(&dirs, &[], "throughput") else {
        return;
    };
    let direct = write_fsync_loop(&dirs.in_backing("direct.log"));
    let mounted = write_fsync_loop(&dirs.in_mount("mounted.log"));
    let bytes = SYNCED_RECORDS * RECORD;
    report(
        "4 KiB append+fdatasync, backing",
        direct,
        SYNCED_RECORDS,
        bytes,
    );
    report(
        "4 KiB append+fdatasync, lazyfs",
        mounted,
        SYNCED_RECORDS,
        bytes,
    );
    let direct = bulk_write(&dirs.in_backing("direct.bulk"));
    let mounted = bulk_write(&dirs.in_mount("mounted.bulk"));
    report(
        "1 MiB writes + one fsync, backing",
        direct,
        UNSYNCED_BYTES >> 20,
        UNSYNCED_BYTES,
    );
    report(
        "1 MiB writes + one fsync, lazyfs",
        mounted,
        UNSYNCED_BYTES >> 20,
        UNSYNCED_BYTES,
    );
    fs.power_loss();
    let synced = std::fs::metadata(dirs.in_backing("mounted.log"))
        .unwrap()
        .len();
    assert_eq!(synced as usize, bytes);
    let bulk = std::fs::metadata(dirs.in_backing("mounted.bulk"))
        .unwrap()
        .len();
    assert_eq!(bulk as usize, UNSYNCED_BYTES);
}
