//! The context a comparison records next to its numbers: what ran, on what machine, when, from
//! which commit, and how busy the machine was before and after (other processes skew loopback
//! benchmarks on a small machine, so the load average is part of the result).
//!
//! Everything here is best effort: a missing `/proc` file or `git` leaves its field `null`
//! rather than failing the comparison. External commands run with a deadline
//! ([`COMMAND_TIMEOUT`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::Serialize;

use super::{CompareArgs, WorkloadId};
use crate::cli::driver_name;
use crate::client::civil_from_days;
use crate::db::DriverKind;

/// Deadline of `git` and `etcd --version`.
pub const COMMAND_TIMEOUT: Duration = Duration::from_secs(5);
/// Most bytes of command output kept.
const MAX_COMMAND_OUTPUT_BYTES: usize = 4096;

/// A UTC instant as text.
#[derive(Debug, Clone)]
pub struct UtcNow {
    /// `YYYY-MM-DD`.
    pub date: String,
    /// `YYYY-MM-DDTHH:MM:SSZ`.
    pub date_time: String,
}

/// Now, in UTC.
pub fn utc_now() -> UtcNow {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|elapsed| elapsed.as_secs())
        .unwrap_or_default();
    utc_from_unix_secs(secs)
}

/// `secs` since the Unix epoch, in UTC.
pub fn utc_from_unix_secs(secs: u64) -> UtcNow {
    let days = i64::try_from(secs / 86_400).unwrap_or(i64::MAX / 2);
    let (year, month, day) = civil_from_days(days);
    let date = format!("{year:04}-{month:02}-{day:02}");
    let date_time = format!(
        "{date}T{:02}:{:02}:{:02}Z",
        secs % 86_400 / 3_600,
        secs % 3_600 / 60,
        secs % 60
    );
    UtcNow { date, date_time }
}

/// The run's context in `results.json` and `results.md`.
#[derive(Debug, Clone, Serialize)]
pub struct RunContext {
    pub tool: &'static str,
    pub records: u64,
    pub operations: u64,
    pub threads: usize,
    pub stores: Vec<String>,
    pub workloads: Vec<String>,
    pub timeout_ms: u64,
    /// Logical CPUs (`nproc`).
    pub nproc: usize,
    pub cpu_model: Option<String>,
    pub memory_total_kib: Option<u64>,
    pub kernel: Option<String>,
    /// The UTC date the comparison started (`YYYY-MM-DD`, the default output directory's name).
    pub date: String,
    pub started_at_utc: String,
    pub finished_at_utc: Option<String>,
    pub git_commit: Option<String>,
    /// Whether the working tree had uncommitted changes (the binary may include them).
    pub git_dirty: Option<bool>,
    /// `/proc/loadavg`'s 1, 5 and 15 minute averages when the comparison started.
    pub load_average_before: Option<[f64; 3]>,
    pub load_average_after: Option<[f64; 3]>,
    pub etcd_version: Option<String>,
    pub meridian_binary: Option<String>,
    pub data_dir: String,
    /// What an acknowledged write means for each store.
    pub durability: BTreeMap<String, String>,
    /// How each store was set up.
    pub setup: BTreeMap<String, String>,
}

impl RunContext {
    /// Collects the context at the start of a comparison.
    #[allow(clippy::too_many_arguments)]
    pub fn gather(
        args: &CompareArgs,
        stores: &[DriverKind],
        workloads: &[WorkloadId],
        started: &UtcNow,
        repo_root: Option<&Path>,
        meridian_bin: Option<&Path>,
        etcd_bin: Option<&Path>,
        data_dir: &Path,
    ) -> RunContext {
        let (git_commit, git_dirty) = match repo_root {
            Some(root) => git_state(root),
            None => (None, None),
        };
        let etcd_version = etcd_bin.and_then(|binary| {
            run_bounded(Command::new(binary).arg("--version")).and_then(|out| {
                // "etcd Version: 3.4.23" → "3.4.23".
                let first = out.lines().next()?.trim();
                Some(
                    first
                        .strip_prefix("etcd Version:")
                        .unwrap_or(first)
                        .trim()
                        .to_string(),
                )
            })
        });
        let mut durability = BTreeMap::new();
        let mut setup = BTreeMap::new();
        for store in stores {
            let (durable, how) = match store {
                DriverKind::Meridian => (
                    "acknowledged after a quorum (2 of 3 nodes) has fsynced the Raft log entry \
                     (group commit)",
                    "3 `meridian start` processes on loopback, default shard layout (8 data \
                     shards, replication factor 3), loopback Raft timings \
                     (--heartbeat-interval-ms 100 --election-timeout-min-ms 600), linearizable \
                     reads",
                ),
                DriverKind::Etcd => (
                    "acknowledged after a quorum (2 of 3 members) has fsynced its WAL (etcd's \
                     default)",
                    "3 `etcd` processes on loopback, --quota-backend-bytes 8589934592, default \
                     --snapshot-count, linearizable reads",
                ),
                DriverKind::Rocksdb => (
                    "none: WAL written without fsync, single process, no replication (the \
                     storage engine's ceiling, not a like-for-like competitor)",
                    "embedded RocksDB in this process (the `rocksdb` driver, --sync-writes off)",
                ),
            };
            durability.insert(driver_name(*store).to_string(), durable.to_string());
            setup.insert(driver_name(*store).to_string(), how.to_string());
        }
        RunContext {
            tool: "meridian-ycsb compare",
            records: args.records,
            operations: args.operations,
            threads: args.threads,
            stores: stores.iter().map(|s| driver_name(*s).to_string()).collect(),
            workloads: workloads.iter().map(|w| w.letter().to_string()).collect(),
            timeout_ms: args.timeout_ms,
            nproc: std::thread::available_parallelism().map_or(1, |n| n.get()),
            cpu_model: cpu_model(),
            memory_total_kib: memory_total_kib(),
            kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .ok()
                .map(|text| text.trim().to_string()),
            date: started.date.clone(),
            started_at_utc: started.date_time.clone(),
            finished_at_utc: None,
            git_commit,
            git_dirty,
            load_average_before: load_average(),
            load_average_after: None,
            etcd_version,
            meridian_binary: meridian_bin.map(|path| path.display().to_string()),
            data_dir: data_dir.display().to_string(),
            durability,
            setup,
        }
    }

    /// Records the end time and load average.
    pub fn finish(&mut self) {
        self.finished_at_utc = Some(utc_now().date_time);
        self.load_average_after = load_average();
    }
}

/// The repository root: the first directory holding `bench/Cargo.toml` of `meridian-bench`
/// above this executable, else above the current directory, else the checkout this binary was
/// built from (the target directory usually lives outside the clone).
pub fn find_repo_root() -> Option<PathBuf> {
    let mut starts = Vec::new();
    if let Ok(exe) = std::env::current_exe() {
        starts.push(exe);
    }
    if let Ok(cwd) = std::env::current_dir() {
        starts.push(cwd);
    }
    starts.push(PathBuf::from(env!("CARGO_MANIFEST_DIR")));
    starts.iter().find_map(|start| {
        start
            .ancestors()
            .find(|dir| is_repo_root(dir))
            .map(Path::to_path_buf)
    })
}

fn is_repo_root(dir: &Path) -> bool {
    dir.join("Cargo.toml").is_file()
        && std::fs::read_to_string(dir.join("bench").join("Cargo.toml"))
            .map(|text| text.contains("name = \"meridian-bench\""))
            .unwrap_or(false)
}

/// `git rev-parse HEAD` and whether `git status --porcelain` lists anything.
fn git_state(root: &Path) -> (Option<String>, Option<bool>) {
    let commit = run_bounded(
        Command::new("git")
            .arg("-C")
            .arg(root)
            .args(["rev-parse", "HEAD"]),
    )
    .map(|out| out.trim().to_string())
    .filter(|hash| !hash.is_empty());
    let dirty = commit.as_ref().and_then(|_| {
        run_bounded(Command::new("git").arg("-C").arg(root).args([
            "status",
            "--porcelain",
            "--untracked-files=no",
        ]))
        .map(|out| !out.trim().is_empty())
    });
    (commit, dirty)
}

/// Runs a command with [`COMMAND_TIMEOUT`]; its stdout if it succeeded in time.
pub fn run_bounded(command: &mut Command) -> Option<String> {
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let give_up = Instant::now() + COMMAND_TIMEOUT;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() < give_up => std::thread::sleep(Duration::from_millis(10)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
        }
    };
    if !status.success() {
        return None;
    }
    let mut out = Vec::new();
    if let Some(mut stdout) = child.stdout.take() {
        use std::io::Read;
        let _ = stdout
            .by_ref()
            .take(MAX_COMMAND_OUTPUT_BYTES as u64)
            .read_to_end(&mut out);
    }
    Some(String::from_utf8_lossy(&out).into_owned())
}

/// `/proc/loadavg`'s three averages.
pub fn load_average() -> Option<[f64; 3]> {
    let text = std::fs::read_to_string("/proc/loadavg").ok()?;
    let mut fields = text.split_whitespace().map(|f| f.parse::<f64>().ok());
    Some([fields.next()??, fields.next()??, fields.next()??])
}

fn cpu_model() -> Option<String> {
    let text = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    text.lines()
        .find(|line| line.starts_with("model name"))
        .and_then(|line| line.split_once(':'))
        .map(|(_, model)| model.trim().to_string())
}

fn memory_total_kib() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    text.lines()
        .find(|line| line.starts_with("MemTotal:"))
        .and_then(|line| line.split_whitespace().nth(1))
        .and_then(|kib| kib.parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Unix seconds format as UTC dates and times.
    #[test]
    fn utc_formatting() {
        let now = utc_from_unix_secs(0);
        assert_eq!(now.date, "1970-01-01");
        assert_eq!(now.date_time, "1970-01-01T00:00:00Z");
        // 2024-02-29 12:34:56 UTC.
        let leap = utc_from_unix_secs(1_709_210_096);
        assert_eq!(leap.date_time, "2024-02-29T12:34:56Z");
    }

    /// The crate's own checkout is found as the repository root from its manifest directory.
    #[test]
    fn repo_root_is_recognised() {
        let bench = Path::new(env!("CARGO_MANIFEST_DIR"));
        let root = bench.parent().expect("bench has a parent");
        assert!(is_repo_root(root));
        assert!(!is_repo_root(bench));
    }
}
