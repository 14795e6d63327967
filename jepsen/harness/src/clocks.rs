//! Wall-clock jumps and strobes on *running* nodes, through libfaketime.
//!
//! The node's own `--clock-offset-ms` is fixed for a process's life, so with it alone a clock
//! fault is a restart (`plan::Fault::Clock`). Real clocks also jump while a process runs (an
//! NTP step, a VM resumed) and strobe (a broken time source flipping between two readings).
//! For nemeses that skew clocks every node runs with Debian's libfaketime preloaded
//! (`LD_PRELOAD`), reading its offset from a file of its own that the nemesis rewrites:
//!
//! - `FAKETIME_TIMESTAMP_FILE=<run clock dir>/node<i>` holds a relative offset in seconds
//!   (`+0.250`, `-2.000`); it is replaced atomically (write a temporary file, rename), so a
//!   reader sees the old or the new offset, never a torn one;
//! - `FAKETIME_NO_CACHE=1`: libfaketime reads the file on every wall-clock call (about 15 µs
//!   here), so a jump takes effect at once and a strobe can flip every few tens of ms;
//! - `DONT_FAKE_MONOTONIC=1`: only the wall clock (`CLOCK_REALTIME`, `gettimeofday`, `time`)
//!   moves. Leases, election timers and every timeout run on the monotonic clock, as a real
//!   wall-clock step leaves it alone.
//!
//! What the node sees is its whole process's wall clock moving: the HLC's physical clock, the
//! clock-offset measurements of `clock_fence`, RocksDB's and the log's timestamps alike.
//!
//! # Invariants
//! - Every offset file exists, world-readable, before any node starts (a node uid must read it),
//!   and holds `+0.000` whenever no clock fault holds.
//! - Only the nemesis thread writes the files (faults never overlap).

use anyhow::{bail, Context};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// Where Debian's `libfaketime` package puts the preload library.
const LIBFAKETIME_CANDIDATES: &[&str] = &[
    "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
    "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
    "/usr/lib/faketime/libfaketime.so.1",
    "/usr/local/lib/faketime/libfaketime.so.1",
];

/// The libfaketime preload library, if installed.
pub fn find_libfaketime() -> Option<PathBuf> {
    LIBFAKETIME_CANDIDATES
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
}

/// libfaketime's relative-offset syntax, in seconds with millisecond precision.
pub fn offset_text(offset_ms: i64) -> String {
    let sign = if offset_ms < 0 { '-' } else { '+' };
    let abs = offset_ms.unsigned_abs();
    format!("{sign}{}.{:03}", abs / 1_000, abs % 1_000)
}

/// Every node's offset file.
#[derive(Debug)]
pub struct FakeClocks {
    library: PathBuf,
    dir: PathBuf,
}

impl FakeClocks {
    /// Creates `dir` (0755) with an offset file per node at `+0.000`.
    pub fn create(dir: &Path, nodes: usize) -> anyhow::Result<FakeClocks> {
        let Some(library) = find_libfaketime() else {
            bail!(
                "libfaketime not found (looked at {}); install Debian's `faketime` package \
                 (jepsen/run.sh does)",
                LIBFAKETIME_CANDIDATES.join(", ")
            );
        };
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))?;
        let clocks = FakeClocks {
            library,
            dir: dir.to_path_buf(),
        };
        for node in 1..=nodes as u64 {
            clocks.set(node, 0)?;
        }
        Ok(clocks)
    }

    fn file(&self, node: u64) -> PathBuf {
        self.dir.join(format!("node{node}"))
    }

    /// The environment node `node` must start with.
    pub fn env(&self, node: u64) -> Vec<(String, String)> {
        vec![
            ("LD_PRELOAD".into(), self.library.display().to_string()),
            (
                "FAKETIME_TIMESTAMP_FILE".into(),
                self.file(node).display().to_string(),
            ),
            ("FAKETIME_NO_CACHE".into(), "1".into()),
            ("DONT_FAKE_MONOTONIC".into(), "1".into()),
        ]
    }

    /// Moves node `node`'s wall clock to `offset_ms` from real time, at once.
    pub fn set(&self, node: u64, offset_ms: i64) -> anyhow::Result<()> {
        let path = self.file(node);
        let tmp = self.dir.join(format!(".node{node}.tmp"));
        std::fs::write(&tmp, format!("{}\n", offset_text(offset_ms)))
            .with_context(|| format!("writing {}", tmp.display()))?;
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o644))?;
        std::fs::rename(&tmp, &path).with_context(|| format!("replacing {}", path.display()))
    }
}

/// Removes the shared-memory files libfaketime leaves in `/dev/shm` when a process it runs in is
/// SIGKILLed (`faketime_shm_<pid>`, `sem.faketime_sem_<pid>`), for processes no longer alive.
/// Returns how many it removed.
pub fn sweep_dead_shm() -> usize {
    let Ok(entries) = std::fs::read_dir("/dev/shm") else {
        return 0;
    };
    let mut removed = 0;
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().to_string();
        let pid = name
            .strip_prefix("faketime_shm_")
            .or_else(|| name.strip_prefix("sem.faketime_sem_"))
            .and_then(|pid| pid.parse::<u32>().ok());
        if let Some(pid) = pid {
            if !Path::new(&format!("/proc/{pid}")).exists()
                && std::fs::remove_file(entry.path()).is_ok()
            {
                removed += 1;
            }
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_in_libfaketime_syntax() {
        assert_eq!(offset_text(0), "+0.000");
        assert_eq!(offset_text(250), "+0.250");
        assert_eq!(offset_text(-75), "-0.075");
        assert_eq!(offset_text(2_000), "+2.000");
        assert_eq!(offset_text(-12_345), "-12.345");
    }

    /// A process started with the environment sees its wall clock move when the file changes,
    /// and its monotonic clock not (skipped where libfaketime is not installed).
    #[test]
    fn a_preloaded_process_follows_its_offset_file() {
        if find_libfaketime().is_none() {
            eprintln!("skipped: libfaketime not installed");
            return;
        }
        let dir = std::env::temp_dir().join(format!("meridian-fakeclock-{}", std::process::id()));
        let clocks = FakeClocks::create(&dir, 1).unwrap();
        let read = |clocks: &FakeClocks| -> i64 {
            let out = std::process::Command::new("date")
                .arg("+%s")
                .envs(clocks.env(1))
                .output()
                .unwrap();
            String::from_utf8(out.stdout)
                .unwrap()
                .trim()
                .parse()
                .unwrap()
        };
        let real = || {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_secs() as i64
        };
        assert!((read(&clocks) - real()).abs() <= 1);
        clocks.set(1, 3_600_000).unwrap();
        assert!((read(&clocks) - real() - 3_600).abs() <= 1);
        clocks.set(1, -7_200_000).unwrap();
        assert!((read(&clocks) - real() + 7_200).abs() <= 1);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
