//! A 3-member etcd cluster of child processes on loopback, owned by a guard.
//!
//! Member `i` (`m1`..`m3`) gets
//!
//! ```text
//!   clients   http://127.0.0.1:<base_port + i>
//!   peers     http://127.0.0.1:<base_port + 10 + i>
//!   data      <data_dir>/m<i>/
//!   log       <data_dir>/m<i>.log
//! ```
//!
//! and etcd's defaults otherwise: the WAL is fsynced before a write is acknowledged and
//! `--snapshot-count` is left alone. Only the backend quota is raised
//! ([`QUOTA_BACKEND_BYTES`]), so large loads do not hit the 2 GiB default and turn into
//! `mvcc: database space exceeded` errors.
//!
//! # Process hygiene
//! Same rules as `meridian_cli::LocalCluster`: each member runs in its own process group (a
//! terminal Ctrl-C reaches only this process, which then stops the members), has
//! `PR_SET_PDEATHSIG = SIGKILL` (a killed parent takes its members along), and [`EtcdCluster`]'s
//! `Drop` SIGKILLs and reaps any member still running. [`EtcdCluster::stop`] is the graceful
//! path: SIGTERM, a bounded wait, then SIGKILL.
//!
//! Readiness ([`EtcdCluster::wait_healthy`]): every member answers a `Status` call and names a
//! leader, and a linearizable read through all endpoints succeeds (what `etcdctl endpoint
//! health` checks), within a deadline; a member that exits meanwhile fails the wait at once
//! with the end of its log.

use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use nix::sys::signal::{self, Signal};
use nix::unistd::Pid;

/// Members in the cluster.
pub const MEMBERS: usize = 3;
/// Backend quota: 8 GiB (etcd's maximum recommended), instead of the 2 GiB default.
pub const QUOTA_BACKEND_BYTES: u64 = 8 * 1024 * 1024 * 1024;
/// Peer ports sit this far above client ports.
pub const PEER_PORT_OFFSET: u16 = 10;
/// Cluster token, so a member never joins a stray cluster from an earlier run.
pub const CLUSTER_TOKEN: &str = "meridian-ycsb-compare";
/// Pause between readiness probes.
const POLL_INTERVAL: Duration = Duration::from_millis(200);
/// Deadline of one readiness call.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);
/// Lines of a member's log quoted when it dies.
pub const LOG_TAIL_LINES: usize = 20;

/// Where and how to run the cluster.
#[derive(Debug, Clone)]
pub struct EtcdClusterConfig {
    pub binary: PathBuf,
    pub base_port: u16,
    pub data_dir: PathBuf,
}

struct Member {
    name: String,
    client_url: String,
    log_path: PathBuf,
    child: Option<Child>,
}

/// A running cluster; see the module docs.
pub struct EtcdCluster {
    data_dir: PathBuf,
    members: Vec<Member>,
}

impl EtcdCluster {
    /// Spawns the members. Does not wait for them; see [`EtcdCluster::wait_healthy`].
    pub fn start(config: &EtcdClusterConfig) -> anyhow::Result<EtcdCluster> {
        let highest = u32::from(config.base_port) + u32::from(PEER_PORT_OFFSET) + MEMBERS as u32;
        if highest > u32::from(u16::MAX) {
            bail!(
                "etcd base port {} leaves no room for 3 members",
                config.base_port
            );
        }
        std::fs::create_dir_all(&config.data_dir)
            .with_context(|| format!("creating {}", config.data_dir.display()))?;
        let port = |offset: u16, index: usize| config.base_port + offset + index as u16 + 1;
        let peer_url = |index: usize| format!("http://127.0.0.1:{}", port(PEER_PORT_OFFSET, index));
        let initial_cluster = (0..MEMBERS)
            .map(|index| format!("m{}={}", index + 1, peer_url(index)))
            .collect::<Vec<_>>()
            .join(",");
        let mut cluster = EtcdCluster {
            data_dir: config.data_dir.clone(),
            members: Vec::with_capacity(MEMBERS),
        };
        for index in 0..MEMBERS {
            let name = format!("m{}", index + 1);
            let client_url = format!("http://127.0.0.1:{}", port(0, index));
            let log_path = config.data_dir.join(format!("{name}.log"));
            let args: Vec<String> = vec![
                "--name".into(),
                name.clone(),
                "--data-dir".into(),
                config.data_dir.join(&name).display().to_string(),
                "--listen-client-urls".into(),
                client_url.clone(),
                "--advertise-client-urls".into(),
                client_url.clone(),
                "--listen-peer-urls".into(),
                peer_url(index),
                "--initial-advertise-peer-urls".into(),
                peer_url(index),
                "--initial-cluster".into(),
                initial_cluster.clone(),
                "--initial-cluster-state".into(),
                "new".into(),
                "--initial-cluster-token".into(),
                CLUSTER_TOKEN.into(),
                "--quota-backend-bytes".into(),
                QUOTA_BACKEND_BYTES.to_string(),
            ];
            // On error `cluster` is dropped here, which kills the members already started.
            let child = spawn_member(&config.binary, &args, &log_path)
                .with_context(|| format!("starting etcd member {name}"))?;
            cluster.members.push(Member {
                name,
                client_url,
                log_path,
                child: Some(child),
            });
        }
        Ok(cluster)
    }

    /// The client URLs of all members.
    pub fn endpoints(&self) -> Vec<String> {
        self.members.iter().map(|m| m.client_url.clone()).collect()
    }

    /// The directory with the members' data and logs.
    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// Members whose process exited on its own, with their status and log tail (reaps them).
    pub fn exited_members(&mut self) -> Vec<(String, ExitStatus, String)> {
        let mut exited = Vec::new();
        for member in &mut self.members {
            if let Some(child) = member.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    member.child = None;
                    exited.push((
                        member.name.clone(),
                        status,
                        log_tail(&member.log_path, LOG_TAIL_LINES),
                    ));
                }
            }
        }
        exited
    }

    /// Fails if any member has exited, quoting the first one's log.
    pub fn check_alive(&mut self) -> anyhow::Result<()> {
        if let Some((name, status, tail)) = self.exited_members().into_iter().next() {
            bail!("etcd member {name} exited ({status}); last lines of its log:\n{tail}");
        }
        Ok(())
    }

    /// Waits until every member is up with a leader and a linearizable read succeeds.
    pub async fn wait_healthy(&mut self, timeout: Duration) -> anyhow::Result<()> {
        let give_up = Instant::now() + timeout;
        loop {
            self.check_alive()?;
            let last_problem = match self.probe().await {
                Ok(()) => return Ok(()),
                Err(problem) => problem,
            };
            if Instant::now() >= give_up {
                bail!(
                    "etcd cluster not healthy after {} s ({last_problem}); logs in {}",
                    timeout.as_secs(),
                    self.data_dir.display()
                );
            }
            tokio::time::sleep(POLL_INTERVAL).await;
        }
    }

    async fn probe(&self) -> Result<(), String> {
        let options = etcd_client::ConnectOptions::new()
            .with_connect_timeout(PROBE_TIMEOUT)
            .with_timeout(PROBE_TIMEOUT);
        for member in &self.members {
            let call = async {
                let mut client = etcd_client::Client::connect(
                    [member.client_url.as_str()],
                    Some(options.clone()),
                )
                .await?;
                client.status().await
            };
            let status = tokio::time::timeout(PROBE_TIMEOUT, call)
                .await
                .map_err(|_| format!("{}: status timed out", member.name))?
                .map_err(|error| format!("{}: {error}", member.name))?;
            if status.leader() == 0 {
                return Err(format!("{} has no leader yet", member.name));
            }
        }
        let read = async {
            let mut client =
                etcd_client::Client::connect(self.endpoints(), Some(options.clone())).await?;
            client.get("meridian-ycsb-health", None).await
        };
        tokio::time::timeout(PROBE_TIMEOUT, read)
            .await
            .map_err(|_| "linearizable read timed out".to_string())?
            .map_err(|error| format!("linearizable read: {error}"))?;
        Ok(())
    }

    /// Stops every member: SIGTERM to all, one shared bounded wait, SIGKILL for the rest.
    /// Returns the names of members that had to be SIGKILLed.
    pub fn stop(&mut self, timeout: Duration) -> Vec<String> {
        for member in &self.members {
            if let Some(child) = &member.child {
                if let Ok(pid) = i32::try_from(child.id()) {
                    // ESRCH (already exited) is fine: the wait below reaps it.
                    let _ = signal::kill(Pid::from_raw(pid), Signal::SIGTERM);
                }
            }
        }
        let give_up = Instant::now() + timeout;
        loop {
            for member in &mut self.members {
                if let Some(child) = member.child.as_mut() {
                    if matches!(child.try_wait(), Ok(Some(_))) {
                        member.child = None;
                    }
                }
            }
            if self.members.iter().all(|m| m.child.is_none()) || Instant::now() >= give_up {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let mut killed = Vec::new();
        for member in &mut self.members {
            if let Some(mut child) = member.child.take() {
                let _ = child.kill();
                let _ = child.wait();
                killed.push(member.name.clone());
            }
        }
        killed
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for member in &mut self.members {
            if let Some(mut child) = member.child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

fn spawn_member(binary: &Path, args: &[String], log_path: &Path) -> anyhow::Result<Child> {
    let mut log = OpenOptions::new()
        .create(true)
        .append(true)
        .open(log_path)
        .with_context(|| format!("opening {}", log_path.display()))?;
    writeln!(log, "=== {} {} ===", binary.display(), args.join(" "))
        .with_context(|| format!("writing {}", log_path.display()))?;
    let mut command = Command::new(binary);
    command
        .args(args)
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .process_group(0);
    // SAFETY: the closure runs between fork and exec and only makes the prctl syscall, which is
    // async-signal-safe; it touches no locks or allocations of the parent.
    unsafe {
        command.pre_exec(|| {
            nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(std::io::Error::from)
        });
    }
    command
        .spawn()
        .with_context(|| format!("spawning {}", binary.display()))
}

/// The last `lines` lines of a log file (empty if it cannot be read).
pub fn log_tail(path: &Path, lines: usize) -> String {
    let bytes = std::fs::read(path).unwrap_or_default();
    let text = String::from_utf8_lossy(&bytes);
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
