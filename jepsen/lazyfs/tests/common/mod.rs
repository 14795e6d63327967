//! Shared helpers: run the real `meridian-lazyfs` binary over temp dirs, cut its power, restart
//! it, and always clean the mount up (a Drop guard), with bounded waits and PIDs only.

#![allow(dead_code)]

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Longest wait for `mounted <M>` on stdout, or for the process to exit.
pub const WAIT: Duration = Duration::from_secs(15);

/// A backing dir and a mount point, in one temp dir that outlives restarts.
pub struct Dirs {
    _root: tempfile::TempDir,
    pub backing: PathBuf,
    pub mount: PathBuf,
}

impl Dirs {
    pub fn new() -> Self {
        let root = tempfile::tempdir().expect("temp dir");
        let backing = root.path().join("backing");
        let mount = root.path().join("mount");
        std::fs::create_dir(&backing).unwrap();
        std::fs::create_dir(&mount).unwrap();
        Dirs {
            _root: root,
            backing,
            mount,
        }
    }

    pub fn in_mount(&self, name: &str) -> PathBuf {
        self.mount.join(name)
    }

    pub fn in_backing(&self, name: &str) -> PathBuf {
        self.backing.join(name)
    }
}

/// A running lazyfs. Dropping it SIGKILLs the process (if still running) and detaches the mount.
pub struct LazyFs {
    child: Option<Child>,
    mount: PathBuf,
    pub stderr_log: PathBuf,
}

/// Why a mount could not be tested here.
pub enum Start {
    Running(LazyFs),
    Skip(String),
}

/// Starts lazyfs, or says why this machine cannot (no /dev/fuse, mount not permitted). Panics
/// on any other failure: on a machine with FUSE these tests must run.
pub fn start(dirs: &Dirs, extra_args: &[&str]) -> Start {
    if !Path::new("/dev/fuse").exists() {
        return Start::Skip("/dev/fuse is missing".into());
    }
    let stderr_log = dirs.backing.parent().unwrap().join(format!(
        "lazyfs-stderr-{}.log",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    ));
    let mut child = Command::new(env!("CARGO_BIN_EXE_meridian-lazyfs"))
        .arg("--backing")
        .arg(&dirs.backing)
        .arg("--mount")
        .arg(&dirs.mount)
        .args(extra_args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(File::create(&stderr_log).unwrap())
        .spawn()
        .expect("spawn meridian-lazyfs");
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(stdout).read_line(&mut line);
        let _ = tx.send(line);
    });
    let mut fs = LazyFs {
        child: Some(child),
        mount: dirs.mount.clone(),
        stderr_log,
    };
    let expected = format!("mounted {}\n", dirs.mount.display());
    match rx.recv_timeout(WAIT) {
        Ok(line) if line == expected => Start::Running(fs),
        other => {
            let status = fs.wait_exit(Duration::from_secs(2));
            let stderr = std::fs::read_to_string(&fs.stderr_log).unwrap_or_default();
            if stderr.contains("Permission denied") || stderr.contains("Operation not permitted") {
                return Start::Skip(format!("mount not permitted: {stderr}"));
            }
            panic!("lazyfs did not mount: stdout {other:?}, status {status:?}, stderr:\n{stderr}");
        }
    }
}

/// `start`, or print why the test is skipped and return None.
pub fn start_or_skip(dirs: &Dirs, extra_args: &[&str], test: &str) -> Option<LazyFs> {
    match start(dirs, extra_args) {
        Start::Running(fs) => Some(fs),
        Start::Skip(reason) => {
            eprintln!("SKIPPED {test}: {reason}");
            None
        }
    }
}

impl LazyFs {
    pub fn pid(&self) -> Pid {
        Pid::from_raw(self.child.as_ref().expect("running").id() as i32)
    }

    /// Power loss: SIGKILL, reap, then detach the dead mount (`fusermount3 -u -z`).
    pub fn power_loss(mut self) {
        kill(self.pid(), Signal::SIGKILL).expect("SIGKILL lazyfs");
        self.wait_exit(WAIT).expect("lazyfs exits after SIGKILL");
        detach(&self.mount).expect("detach dead mount");
    }

    /// SIGKILL and reap, leaving the dead mount in place (Drop or `detach` clears it).
    pub fn kill_only(&mut self) {
        kill(self.pid(), Signal::SIGKILL).expect("SIGKILL lazyfs");
        self.wait_exit(WAIT).expect("lazyfs exits after SIGKILL");
    }

    /// Clean shutdown: SIGTERM and wait; returns the exit status.
    pub fn terminate(mut self) -> ExitStatus {
        kill(self.pid(), Signal::SIGTERM).expect("SIGTERM lazyfs");
        self.wait_exit(WAIT).expect("lazyfs exits after SIGTERM")
    }

    /// Waits up to `timeout` for the process to exit (polling, so the wait is bounded).
    fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let child = self.child.as_mut()?;
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                self.child = None;
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for LazyFs {
    fn drop(&mut self) {
        if let Some(child) = self.child.as_mut() {
            let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGKILL);
            let _ = self.wait_exit(WAIT);
        }
        let _ = detach(&self.mount);
    }
}

/// `fusermount3 -u -z <mount>`; falls back to `umount -l` where fusermount3 is missing.
/// Succeeds when nothing is mounted there any more.
pub fn detach(mount: &Path) -> std::io::Result<()> {
    if is_mounted(mount) {
        let ran = Command::new("fusermount3")
            .args(["-u", "-z"])
            .arg(mount)
            .stderr(Stdio::null())
            .status();
        if !matches!(ran, Ok(status) if status.success()) {
            let _ = Command::new("umount").arg("-l").arg(mount).status();
        }
    }
    if is_mounted(mount) {
        return Err(std::io::Error::other(format!(
            "{} still mounted",
            mount.display()
        )));
    }
    Ok(())
}

/// Whether `/proc/self/mounts` lists `mount`.
pub fn is_mounted(mount: &Path) -> bool {
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    let target = mount.to_string_lossy();
    mounts
        .lines()
        .any(|line| line.split(' ').nth(1) == Some(&*target))
}

/// Bytes `0..len` of a deterministic pattern unique to `seed`.
pub fn pattern(seed: u8, start: usize, len: usize) -> Vec<u8> {
    (start..start + len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

pub fn read_all(path: &Path) -> Vec<u8> {
    let mut data = Vec::new();
    File::open(path)
        .unwrap_or_else(|e| panic!("open {}: {e}", path.display()))
        .read_to_end(&mut data)
        .unwrap();
    data
}

pub fn open_rw(path: &Path) -> File {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .unwrap_or_else(|e| panic!("open {}: {e}", path.display()))
}

/// Appends at the current end (the size seen through the mount).
pub fn append(file: &mut File, data: &[u8]) {
    let end = file.metadata().unwrap().len();
    file.write_all_at(data, end).unwrap();
}

pub fn write_at(file: &mut File, offset: u64, data: &[u8]) {
    file.write_all_at(data, offset).unwrap();
    let _ = file.flush();
}
