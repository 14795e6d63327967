//! The power-loss nemesis's storage: every node's data directory is a `meridian-lazyfs` mount.
//!
//! SIGKILL alone cannot test what Meridian promises about fsync: the operating system keeps
//! every write a killed process made. So for `--nemesis power-loss` each node's data directory
//! (`<data dir>/node<i>`) is a FUSE mount of `meridian-lazyfs` (`jepsen/lazyfs`) over a backing
//! directory (`<data dir>/backing/node<i>`). lazyfs holds every write in its own memory until
//! the file is fsynced; a **power loss** of a node is:
//!
//! 1. SIGKILL the node (the nemesis does this first, so nothing writes any more);
//! 2. SIGKILL its lazyfs ([`PowerSupply::cut`]): every write not fsynced is gone, as from a
//!    machine's page cache; `fusermount3 -u -z` detaches the dead mount;
//! 3. at the heal, a new lazyfs on the same backing directory ([`PowerSupply::restore`]),
//!    ready once it prints `mounted <dir>`; then the node restarts on what was synced.
//!
//! Several nodes may lose power at once, a majority or all of them: an acknowledged write was
//! fsynced by a quorum, so it must survive that too (the checkers decide).
//!
//! The mounts live as long as the run: the replica checks read each node's RocksDB through
//! them after the nodes stopped, then [`PowerSupply::shutdown`] (SIGTERM: lazyfs writes back
//! and fsyncs what it holds, unmounts, exits 0) releases them before the data directory goes.
//!
//! # Invariants
//! - A node's lazyfs is cut only after the node itself was killed.
//! - Every mount this process made is gone when [`PowerSupply`] is dropped (SIGTERM, then a lazy
//!   unmount if lazyfs did not exit in time); a harness that dies takes its lazyfs processes
//!   with it (`PR_SET_PDEATHSIG`), and the next run's fresh data directory never reuses a mount.
//!
//! # Not modelled (see lazyfs's essay)
//! Metadata operations (create, rename, unlink) reach the backing directory at once, so only
//! data writes are lost; no torn writes.

use anyhow::{anyhow, bail, Context};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Mutex};
use std::time::{Duration, Instant};

/// Bound on a lazyfs mount becoming live.
const MOUNT_TIMEOUT: Duration = Duration::from_secs(20);
/// Bound on a lazyfs's clean exit (write back, fsync, unmount) at the end of a run.
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(20);

/// The default lazyfs binary: next to the `meridian` binary the run uses.
pub fn default_lazyfs_binary(meridian: &Path) -> PathBuf {
    meridian.with_file_name("meridian-lazyfs")
}

struct Mount {
    backing: PathBuf,
    point: PathBuf,
    log: PathBuf,
    child: Option<Child>,
}

/// Every node's lazyfs mount.
pub struct PowerSupply {
    binary: PathBuf,
    /// Mount with `--allow-other` (nodes run as their own uids when the run partitions).
    allow_other: bool,
    mounts: Mutex<BTreeMap<u64, Mount>>,
}

impl PowerSupply {
    /// Mounts a lazyfs for each of `nodes` at `<data_dir>/node<i>` (empty, created here);
    /// `allow_other` when the nodes run as other uids than this process's.
    pub fn start(
        binary: &Path,
        data_dir: &Path,
        nodes: usize,
        allow_other: bool,
    ) -> anyhow::Result<PowerSupply> {
        if !binary.is_file() {
            bail!(
                "meridian-lazyfs not found at {} (build it: cargo build --release --locked -p \
                 meridian-lazyfs, or run jepsen/run.sh)",
                binary.display()
            );
        }
        let supply = PowerSupply {
            binary: binary.to_path_buf(),
            allow_other,
            mounts: Mutex::new(BTreeMap::new()),
        };
        for node in 1..=nodes as u64 {
            let backing = data_dir.join("backing").join(format!("node{node}"));
            let point = data_dir.join(format!("node{node}"));
            for dir in [&backing, &point] {
                std::fs::create_dir_all(dir)
                    .with_context(|| format!("creating {}", dir.display()))?;
            }
            let log = data_dir.join(format!("lazyfs{node}.log"));
            supply.lock().insert(
                node,
                Mount {
                    backing,
                    point,
                    log,
                    child: None,
                },
            );
            supply.restore(node)?;
        }
        Ok(supply)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, Mount>> {
        self.mounts.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Power loss of `node`'s storage: its lazyfs is SIGKILLed (every unsynced write is lost)
    /// and the dead mount detached. Kill the node first.
    pub fn cut(&self, node: u64) -> anyhow::Result<()> {
        let mut mounts = self.lock();
        let mount = mounts
            .get_mut(&node)
            .ok_or_else(|| anyhow!("n{node} has no lazyfs mount"))?;
        if let Some(mut child) = mount.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        detach(&mount.point)
    }

    /// Power back on: a new lazyfs over `node`'s backing directory, live when this returns.
    pub fn restore(&self, node: u64) -> anyhow::Result<()> {
        let mut mounts = self.lock();
        let mount = mounts
            .get_mut(&node)
            .ok_or_else(|| anyhow!("n{node} has no lazyfs mount"))?;
        if mount.child.is_some() {
            return Ok(());
        }
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&mount.log)
            .with_context(|| format!("opening {}", mount.log.display()))?;
        let mut command = Command::new(&self.binary);
        command
            .arg("--backing")
            .arg(&mount.backing)
            .arg("--mount")
            .arg(&mount.point)
            .args(self.allow_other.then_some("--allow-other"))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log);
        // SAFETY: the closure runs between fork and exec and only makes the prctl syscall.
        unsafe {
            command.pre_exec(|| {
                nix::sys::prctl::set_pdeathsig(Signal::SIGTERM).map_err(std::io::Error::from)
            });
        }
        let mut child = command
            .spawn()
            .with_context(|| format!("starting {}", self.binary.display()))?;
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        match rx.recv_timeout(MOUNT_TIMEOUT) {
            Ok(line) if line.starts_with("mounted") => {
                mount.child = Some(child);
                Ok(())
            }
            answer => {
                let _ = child.kill();
                let _ = child.wait();
                let _ = detach(&mount.point);
                bail!(
                    "lazyfs for n{node} did not mount {} within {MOUNT_TIMEOUT:?} ({answer:?}); \
                     see {}",
                    mount.point.display(),
                    mount.log.display()
                )
            }
        }
    }

    /// Ends every mount cleanly (lazyfs writes back what it holds); stop the nodes first.
    /// Returns what went wrong, if anything.
    pub fn shutdown(&self) -> Vec<String> {
        let mut errors = Vec::new();
        for (node, mount) in self.lock().iter_mut() {
            let Some(mut child) = mount.child.take() else {
                continue;
            };
            let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM);
            let deadline = Instant::now() + SHUTDOWN_TIMEOUT;
            let clean = loop {
                match child.try_wait() {
                    Ok(Some(status)) => break status.success(),
                    Ok(None) if Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(50))
                    }
                    _ => {
                        let _ = child.kill();
                        let _ = child.wait();
                        break false;
                    }
                }
            };
            if !clean {
                errors.push(format!(
                    "lazyfs of n{node} did not shut down cleanly (see {})",
                    mount.log.display()
                ));
                if let Err(e) = detach(&mount.point) {
                    errors.push(format!("{e:#}"));
                }
            }
        }
        errors
    }
}

impl Drop for PowerSupply {
    fn drop(&mut self) {
        for e in self.shutdown() {
            eprintln!("meridian-jepsen: {e}");
        }
    }
}

/// Detaches a (possibly dead) FUSE mount at `point`; fine if nothing is mounted there.
fn detach(point: &Path) -> anyhow::Result<()> {
    let output = Command::new("fusermount3")
        .arg("-u")
        .arg("-z")
        .arg(point)
        .stdin(Stdio::null())
        .output()
        .context("running fusermount3 (Debian package fuse3)")?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    if output.status.success() || stderr.contains("not mounted") || stderr.contains("not found") {
        Ok(())
    } else {
        bail!("fusermount3 -u -z {}: {}", point.display(), stderr.trim())
    }
}
