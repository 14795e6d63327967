//! The file operations RocksDB performs, with plain std I/O through a real mount: WAL append
//! with fallocate and fdatasync, SST write and fsync, CURRENT replaced by renaming a temp file,
//! directory fsync, the LOCK file, pread of open and unlinked files, statfs.

mod common;

use common::*;
use std::fs::{self, File};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;

const RECORD: usize = 100;

fn fallocate(file: &File, mode: i32, offset: i64, len: i64) -> std::io::Result<()> {
    // SAFETY: plain syscall on an open fd.
    if unsafe { libc::fallocate(file.as_raw_fd(), mode, offset, len) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// A WAL: preallocated with KEEP_SIZE, appended in records, fdatasync'ed every 10 records; the
/// power loss keeps exactly the synced records and the preallocation never shows as size.
#[test]
fn wal_append_fdatasync_survives_to_the_last_sync() {
    let dirs = Dirs::new();
    let Some(fs) = start_or_skip(&dirs, &[], "wal_append_fdatasync") else {
        return;
    };
    let mut wal = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dirs.in_mount("000012.log"))
        .unwrap();
    fallocate(&wal, libc::FALLOC_FL_KEEP_SIZE, 0, 1 << 20).expect("fallocate KEEP_SIZE");
    assert_eq!(wal.metadata().unwrap().len(), 0, "KEEP_SIZE keeps the size");
    for record in 0..55 {
        wal.write_all(&pattern(record as u8, 0, RECORD)).unwrap();
        if record % 10 == 9 {
            wal.sync_data().unwrap();
        }
    }
    assert_eq!(wal.metadata().unwrap().len() as usize, 55 * RECORD);
    let mut through_mount = Vec::new();
    File::open(dirs.in_mount("000012.log"))
        .unwrap()
        .read_to_end(&mut through_mount)
        .unwrap();
    assert_eq!(through_mount.len(), 55 * RECORD);
    drop(wal);
    fs.power_loss();
    let kept = read_all(&dirs.in_backing("000012.log"));
    eprintln!(
        "wal: kept {} records of 55 (50 synced)",
        kept.len() / RECORD
    );
    assert_eq!(kept.len(), 50 * RECORD);
    for record in 0..50 {
        assert_eq!(
            &kept[record * RECORD..(record + 1) * RECORD],
            &pattern(record as u8, 0, RECORD)[..]
        );
    }
}

/// CURRENT is replaced the RocksDB way (write temp, fsync, rename, fsync dir): it survives.
/// Renaming an unsynced temp file over it survives as a name but loses the data — the bug a
/// power-loss test exists to catch.
#[test]
fn rename_of_temp_file_and_directory_fsync() {
    let dirs = Dirs::new();
    let Some(fs) = start_or_skip(&dirs, &[], "rename_of_temp_file") else {
        return;
    };
    fs::create_dir(dirs.in_mount("db")).unwrap();
    let tmp = dirs.in_mount("db/000001.dbtmp");
    let mut file = File::create(&tmp).unwrap();
    file.write_all(b"MANIFEST-000001\n").unwrap();
    file.sync_all().unwrap();
    drop(file);
    fs::rename(&tmp, dirs.in_mount("db/CURRENT")).unwrap();
    File::open(dirs.in_mount("db"))
        .unwrap()
        .sync_all()
        .expect("fsync of a directory");

    // An OPTIONS file written and renamed without fsync.
    let tmp = dirs.in_mount("db/OPTIONS-000007.dbtmp");
    let mut file = File::create(&tmp).unwrap();
    file.write_all(b"[Version]\n").unwrap();
    drop(file);
    fs::rename(&tmp, dirs.in_mount("db/OPTIONS-000007")).unwrap();
    // Pending writes moved with the inode: still readable under the new name.
    assert_eq!(
        read_all(&dirs.in_mount("db/OPTIONS-000007")),
        b"[Version]\n"
    );
    assert!(!dirs.in_mount("db/OPTIONS-000007.dbtmp").exists());
    let mut names: Vec<_> = fs::read_dir(dirs.in_mount("db"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["CURRENT", "OPTIONS-000007"]);

    fs.power_loss();
    assert_eq!(
        read_all(&dirs.in_backing("db/CURRENT")),
        b"MANIFEST-000001\n"
    );
    assert!(read_all(&dirs.in_backing("db/OPTIONS-000007")).is_empty());
}

/// An SST: written with pwrite at increasing offsets, fsynced, closed, reopened and pread;
/// all of it survives.
#[test]
fn sst_write_fsync_and_pread() {
    let dirs = Dirs::new();
    let Some(fs) = start_or_skip(&dirs, &[], "sst_write_fsync_and_pread") else {
        return;
    };
    let data = pattern(9, 0, 300_000);
    let sst = open_rw(&dirs.in_mount("000020.sst"));
    for (i, chunk) in data.chunks(65_536).enumerate() {
        sst.write_all_at(chunk, (i * 65_536) as u64).unwrap();
    }
    sst.sync_all().unwrap();
    drop(sst);
    let sst = File::open(dirs.in_mount("000020.sst")).unwrap();
    let mut footer = [0u8; 48];
    sst.read_exact_at(&mut footer, 300_000 - 48).unwrap();
    assert_eq!(&footer[..], &data[300_000 - 48..]);
    drop(sst);
    fs.power_loss();
    assert_eq!(read_all(&dirs.in_backing("000020.sst")), data);
}

/// The LOCK file: RocksDB's fcntl(F_SETLK) write lock is granted; open-file-description locks
/// and flock conflict between two opens, so a second opener is refused.
#[test]
fn lock_file_locks_conflict() {
    let dirs = Dirs::new();
    let Some(_fs) = start_or_skip(&dirs, &[], "lock_file_locks_conflict") else {
        return;
    };
    let first = open_rw(&dirs.in_mount("LOCK"));
    let second = open_rw(&dirs.in_mount("LOCK"));
    let lock = |file: &File, command: libc::c_int| {
        // SAFETY: a zeroed flock struct with the fields fcntl reads, on an open fd.
        let mut request: libc::flock = unsafe { std::mem::zeroed() };
        request.l_type = libc::F_WRLCK as libc::c_short;
        request.l_whence = libc::SEEK_SET as libc::c_short;
        if unsafe { libc::fcntl(file.as_raw_fd(), command, &mut request) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    };
    lock(&first, libc::F_SETLK).expect("RocksDB's F_SETLK on LOCK");
    // An open-file-description lock on another open conflicts with that process lock: the
    // kernel really tracks locks on this inode.
    let refused = lock(&second, libc::F_OFD_SETLK).unwrap_err();
    assert_eq!(refused.raw_os_error(), Some(libc::EAGAIN));
    // Two opens of another file: the first OFD lock wins, the second is refused.
    let third = open_rw(&dirs.in_mount("LOCK2"));
    let fourth = open_rw(&dirs.in_mount("LOCK2"));
    lock(&third, libc::F_OFD_SETLK).expect("first OFD lock");
    let refused = lock(&fourth, libc::F_OFD_SETLK).unwrap_err();
    assert_eq!(refused.raw_os_error(), Some(libc::EAGAIN));

    // SAFETY: flock on open fds.
    assert_eq!(
        unsafe { libc::flock(first.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) },
        0
    );
    assert_ne!(
        unsafe { libc::flock(second.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) },
        0
    );
    drop(first);
    assert_eq!(
        unsafe { libc::flock(second.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) },
        0
    );
}

/// fallocate mode 0 extends the file (applied at once, after the pending writes); an open
/// file that is unlinked stays readable with its pending writes; statfs answers.
#[test]
fn fallocate_unlink_while_open_and_statfs() {
    let dirs = Dirs::new();
    let Some(fs) = start_or_skip(&dirs, &[], "fallocate_unlink_while_open_and_statfs") else {
        return;
    };
    let mut file = open_rw(&dirs.in_mount("grow"));
    write_at(&mut file, 0, b"head");
    fallocate(&file, 0, 0, 8192).expect("fallocate mode 0");
    assert_eq!(file.metadata().unwrap().len(), 8192);
    let mut head = [0u8; 4];
    file.read_exact_at(&mut head, 0).unwrap();
    assert_eq!(&head, b"head");

    let mut doomed = open_rw(&dirs.in_mount("obsolete.log"));
    write_at(&mut doomed, 0, b"still readable");
    fs::remove_file(dirs.in_mount("obsolete.log")).unwrap();
    assert!(!dirs.in_backing("obsolete.log").exists());
    let mut text = String::new();
    doomed.seek(SeekFrom::Start(0)).unwrap();
    doomed.read_to_string(&mut text).unwrap();
    assert_eq!(text, "still readable");
    drop(doomed);

    let path = std::ffi::CString::new(dirs.mount.to_str().unwrap()).unwrap();
    // SAFETY: statvfs fills the zeroed struct we own.
    let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
    assert_eq!(
        unsafe { libc::statvfs(path.as_ptr(), &mut stat) },
        0,
        "statfs"
    );
    assert!(stat.f_blocks > 0 && stat.f_bsize > 0);
    drop(file);
    fs.power_loss();
    // Mode-0 fallocate is a size change: the pending "head" went back first, and both survive.
    let kept = read_all(&dirs.in_backing("grow"));
    assert_eq!(kept.len(), 8192);
    assert_eq!(&kept[..4], b"head");
}
