//! A local Meridian cluster made of real `meridian start` child processes on loopback.
//!
//! `meridian demo` and the cluster tests (`tests/*.rs`) both use it, so the tests exercise
//! exactly what a user runs. Node `i` (ids `1..=n`) gets
//!
//! ```text
//!   client API   127.0.0.1:<base_port + i>
//!   Raft peers   127.0.0.1:<base_port + 100 + i>
//!   data         <data_dir>/node<i>/
//!   stdout+err   <data_dir>/node<i>.log   (appended across restarts)
//!   labels       region = us-east, eu-west, ap-south (cycling), zone = a (or `node_labels`)
//! ```
//!
//! The last `joining` nodes (0 by default) are not founding members: they start later
//! ([`LocalCluster::launch`]) with `--join` naming node 1.
//!
//! # Process hygiene
//! Leaving no process behind is the point of this module:
//! - each child runs in its own process group, so a Ctrl-C in the terminal reaches only the
//!   parent, which then stops the children in order (SIGTERM, bounded wait, SIGKILL);
//! - [`LocalCluster`]'s `Drop` SIGKILLs and reaps every child still running (panics, `?`
//!   early returns, failed assertions);
//! - each child has `PR_SET_PDEATHSIG = SIGKILL`, so even a SIGKILLed parent takes its
//!   children with it. Linux delivers it when the *thread* that spawned the child exits, so
//!   start and restart nodes from a long-lived thread (the main or test thread, or a runtime
//!   worker), never from `spawn_blocking`.
//!
//! # Files
//! - `mod.rs` (this file): the layout, and the child processes' lifecycle.
//! - `ready`: readiness (every shard led by a running, registered node).
//!
//! # Not done yet
//! - Ports are fixed by `base_port`; callers pick disjoint ranges (no port-0 discovery, since
//!   every node must know every peer's address up front).

mod ready;

use anyhow::{anyhow, bail, Context};
use nix::sys::signal::{self, Signal};
use nix::unistd::Pid;
use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Most nodes a local cluster may have (peer ports sit 100 above client ports).
pub const MAX_LOCAL_NODES: usize = 99;
/// Region labels given to nodes in turn.
pub const REGIONS: [&str; 3] = ["us-east", "eu-west", "ap-south"];

/// The region node `node_id` (1-based) is labelled with unless `node_labels` says otherwise:
/// [`REGIONS`] in turn.
pub fn default_region(node_id: u64) -> &'static str {
    REGIONS[(node_id.max(1) as usize - 1) % REGIONS.len()]
}
/// Raft timings that suit loopback (the server's defaults are WAN-sized).
pub const LOOPBACK_RAFT_ARGS: [&str; 4] = [
    "--heartbeat-interval-ms",
    "100",
    "--election-timeout-min-ms",
    "600",
];
/// How often readiness and exit polls look again.
const POLL_INTERVAL: Duration = Duration::from_millis(200);

/// How to lay out a local cluster.
#[derive(Clone, Debug)]
pub struct LocalClusterConfig {
    /// The `meridian` binary (`std::env::current_exe()` or `env!("CARGO_BIN_EXE_meridian")`).
    pub binary: PathBuf,
    pub nodes: usize,
    pub base_port: u16,
    pub data_dir: PathBuf,
    /// Arguments every node gets after the generated ones (default: [`LOOPBACK_RAFT_ARGS`]).
    pub common_args: Vec<String>,
    /// Extra arguments per node, index 0 = node 1 (missing entries = none).
    pub extra_args_per_node: Vec<Vec<String>>,
    /// Extra environment variables per node, index 0 = node 1 (e.g. a libfaketime preload).
    pub env_per_node: Vec<Vec<(String, String)>>,
    /// How many of the last nodes are not founding members: they are laid out with
    /// `--join <node 1's client address>` instead of `--initial-cluster`, and are not started
    /// with the others ([`LocalCluster::launch`] starts one).
    pub joining: usize,
    /// Region and zone per node, index 0 = node 1 (missing entries: the regions of
    /// [`REGIONS`] in turn, zone `a`).
    pub labels: Vec<Option<(String, String)>>,
}

impl LocalClusterConfig {
    pub fn new(
        binary: impl Into<PathBuf>,
        nodes: usize,
        base_port: u16,
        data_dir: impl Into<PathBuf>,
    ) -> LocalClusterConfig {
        LocalClusterConfig {
            binary: binary.into(),
            nodes,
            base_port,
            data_dir: data_dir.into(),
            common_args: LOOPBACK_RAFT_ARGS.iter().map(|s| s.to_string()).collect(),
            extra_args_per_node: Vec::new(),
            env_per_node: Vec::new(),
            joining: 0,
            labels: Vec::new(),
        }
    }

    /// Makes the last `count` nodes join the cluster the others found (see `joining`).
    pub fn joining(mut self, count: usize) -> Self {
        self.joining = count;
        self
    }

    /// Adds arguments for every node.
    pub fn common_args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.common_args.extend(args.into_iter().map(Into::into));
        self
    }

    /// Adds arguments for node `node_id` (1-based).
    pub fn node_args<I, S>(mut self, node_id: u64, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let index = (node_id as usize).saturating_sub(1);
        if self.extra_args_per_node.len() <= index {
            self.extra_args_per_node.resize(index + 1, Vec::new());
        }
        self.extra_args_per_node[index].extend(args.into_iter().map(Into::into));
        self
    }

    /// Places node `node_id` (1-based) in `region` and `zone` instead of the default labels.
    pub fn node_labels(mut self, node_id: u64, region: &str, zone: &str) -> Self {
        let index = (node_id as usize).saturating_sub(1);
        if self.labels.len() <= index {
            self.labels.resize(index + 1, None);
        }
        self.labels[index] = Some((region.to_string(), zone.to_string()));
        self
    }

    /// Sets environment variable `key` to `value` for node `node_id` (1-based), on every start.
    pub fn node_env(
        mut self,
        node_id: u64,
        key: impl Into<String>,
        value: impl Into<String>,
    ) -> Self {
        let index = (node_id as usize).saturating_sub(1);
        if self.env_per_node.len() <= index {
            self.env_per_node.resize(index + 1, Vec::new());
        }
        self.env_per_node[index].push((key.into(), value.into()));
        self
    }
}

/// One node's fixed layout.
#[derive(Clone, Debug)]
pub struct NodeSpec {
    pub node_id: u64,
    pub region: String,
    pub zone: String,
    pub client_addr: String,
    pub peer_addr: String,
    pub data_dir: PathBuf,
    pub log_path: PathBuf,
    /// The full argument list after `meridian`.
    pub args: Vec<String>,
    /// Environment variables set on top of the parent's.
    pub env: Vec<(String, String)>,
}

/// A running local cluster; see the module docs. Methods take `&self` so tests can share it
/// (e.g. in an `Arc`) between a workload and a fault injector.
pub struct LocalCluster {
    binary: PathBuf,
    data_dir: PathBuf,
    specs: Vec<NodeSpec>,
    children: Mutex<Vec<Option<Child>>>,
}

impl LocalCluster {
    /// Lays out and spawns every node. Does not wait for them; see [`LocalCluster::wait_ready`].
    pub fn start(config: LocalClusterConfig) -> anyhow::Result<LocalCluster> {
        if config.nodes == 0 || config.nodes > MAX_LOCAL_NODES {
            bail!(
                "nodes must be in 1..={MAX_LOCAL_NODES}, got {}",
                config.nodes
            );
        }
        let highest = u32::from(config.base_port) + 100 + config.nodes as u32;
        if highest > u32::from(u16::MAX) {
            bail!(
                "base_port {} leaves no room for {} nodes",
                config.base_port,
                config.nodes
            );
        }
        ensure_ports_free(config.base_port, config.nodes)?;
        std::fs::create_dir_all(&config.data_dir)
            .with_context(|| format!("creating {}", config.data_dir.display()))?;
        if config.joining >= config.nodes {
            bail!(
                "joining ({}) must leave at least one founding member of {} nodes",
                config.joining,
                config.nodes
            );
        }
        let founders = config.nodes - config.joining;
        let members: Vec<(u64, String, String, String)> = (1..=config.nodes as u64)
            .map(|id| {
                let (region, zone) = config
                    .labels
                    .get(id as usize - 1)
                    .cloned()
                    .flatten()
                    .unwrap_or_else(|| (default_region(id).to_string(), "a".to_string()));
                let peer = format!("127.0.0.1:{}", config.base_port as u64 + 100 + id);
                (id, peer, region, zone)
            })
            .collect();
        let initial_cluster = members[..founders]
            .iter()
            .map(|(id, peer, region, zone)| format!("{id}={peer}@{region}/{zone}"))
            .collect::<Vec<_>>()
            .join(",");
        let specs = members
            .iter()
            .map(|(id, peer, region, zone)| {
                let client_addr = format!("127.0.0.1:{}", config.base_port as u64 + id);
                let data_dir = config.data_dir.join(format!("node{id}"));
                let mut args: Vec<String> = vec![
                    "start".into(),
                    "--node-id".into(),
                    id.to_string(),
                    "--region".into(),
                    region.clone(),
                    "--zone".into(),
                    zone.clone(),
                    "--client-addr".into(),
                    client_addr.clone(),
                    "--peer-addr".into(),
                    peer.clone(),
                    "--data-dir".into(),
                    data_dir.display().to_string(),
                ];
                if *id as usize <= founders {
                    args.extend(["--initial-cluster".into(), initial_cluster.clone()]);
                } else {
                    args.extend([
                        "--join".into(),
                        format!("127.0.0.1:{}", config.base_port as u64 + 1),
                    ]);
                }
                args.extend(config.common_args.iter().cloned());
                if let Some(extra) = config.extra_args_per_node.get(*id as usize - 1) {
                    args.extend(extra.iter().cloned());
                }
                NodeSpec {
                    node_id: *id,
                    region: region.clone(),
                    zone: zone.clone(),
                    client_addr,
                    peer_addr: peer.clone(),
                    log_path: config.data_dir.join(format!("node{id}.log")),
                    data_dir,
                    args,
                    env: config
                        .env_per_node
                        .get(*id as usize - 1)
                        .cloned()
                        .unwrap_or_default(),
                }
            })
            .collect::<Vec<_>>();
        let cluster = LocalCluster {
            binary: config.binary,
            data_dir: config.data_dir,
            children: Mutex::new((0..specs.len()).map(|_| None).collect()),
            specs,
        };
        for spec in &cluster.specs[..founders] {
            // On error, `cluster` is dropped here and kills the nodes already spawned.
            cluster.spawn(spec.node_id)?;
        }
        Ok(cluster)
    }

    /// Starts node `node_id`, one not started yet (a joining node) or stopped; the same as
    /// [`LocalCluster::restart`].
    pub fn launch(&self, node_id: u64) -> anyhow::Result<()> {
        self.restart(node_id)
    }

    /// The directory holding every node's data and log.
    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    pub fn node_ids(&self) -> Vec<u64> {
        self.specs.iter().map(|s| s.node_id).collect()
    }

    /// Node `node_id`'s layout.
    pub fn spec(&self, node_id: u64) -> anyhow::Result<&NodeSpec> {
        node_id
            .checked_sub(1)
            .and_then(|i| self.specs.get(i as usize))
            .ok_or_else(|| anyhow!("no node {node_id} in this cluster of {}", self.specs.len()))
    }

    pub fn client_addr(&self, node_id: u64) -> anyhow::Result<String> {
        Ok(self.spec(node_id)?.client_addr.clone())
    }

    /// Every node's client address (running or not).
    pub fn endpoints(&self) -> Vec<String> {
        self.specs.iter().map(|s| s.client_addr.clone()).collect()
    }

    pub fn log_path(&self, node_id: u64) -> anyhow::Result<PathBuf> {
        Ok(self.spec(node_id)?.log_path.clone())
    }

    /// Everything node `node_id` has logged so far (all runs).
    pub fn log_contents(&self, node_id: u64) -> anyhow::Result<String> {
        let path = self.log_path(node_id)?;
        let bytes = std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    fn children(&self) -> MutexGuard<'_, Vec<Option<Child>>> {
        // Children are plain handles; a panic elsewhere cannot corrupt them.
        self.children
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn index(&self, node_id: u64) -> anyhow::Result<usize> {
        self.spec(node_id).map(|_| node_id as usize - 1)
    }

    fn spawn(&self, node_id: u64) -> anyhow::Result<()> {
        self.spawn_with(node_id, &[])
    }

    fn spawn_with(&self, node_id: u64, extra_args: &[String]) -> anyhow::Result<()> {
        let spec = self.spec(node_id)?;
        let args: Vec<String> = spec.args.iter().chain(extra_args).cloned().collect();
        let index = self.index(node_id)?;
        let mut children = self.children();
        if children[index].is_some() {
            bail!("node {node_id} is already running");
        }
        let mut log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&spec.log_path)
            .with_context(|| format!("opening {}", spec.log_path.display()))?;
        writeln!(log, "=== {} {} ===", self.binary.display(), args.join(" "))?;
        let mut command = Command::new(&self.binary);
        command
            .args(&args)
            .envs(spec.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .process_group(0);
        // SAFETY: the closure runs between fork and exec and only makes the prctl syscall,
        // which is async-signal-safe; it touches no locks or allocations of the parent.
        unsafe {
            command.pre_exec(|| {
                nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(std::io::Error::from)
            });
        }
        let child = command
            .spawn()
            .with_context(|| format!("spawning node {node_id} ({})", self.binary.display()))?;
        children[index] = Some(child);
        Ok(())
    }

    /// The process id of node `node_id`, if it is running.
    pub fn pid(&self, node_id: u64) -> anyhow::Result<Option<u32>> {
        let index = self.index(node_id)?;
        Ok(self.children()[index].as_ref().map(|c| c.id()))
    }

    /// Whether node `node_id`'s process is alive (reaps it if it exited).
    pub fn is_running(&self, node_id: u64) -> anyhow::Result<bool> {
        let index = self.index(node_id)?;
        let mut children = self.children();
        Ok(match children[index].as_mut() {
            Some(child) => match child.try_wait()? {
                None => true,
                Some(_) => {
                    children[index] = None;
                    false
                }
            },
            None => false,
        })
    }

    /// Nodes whose process has exited on its own, with their exit status (and reaps them).
    pub fn exited_nodes(&self) -> Vec<(u64, ExitStatus)> {
        let mut exited = Vec::new();
        let mut children = self.children();
        for (index, slot) in children.iter_mut().enumerate() {
            if let Some(child) = slot.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    exited.push((index as u64 + 1, status));
                    *slot = None;
                }
            }
        }
        exited
    }

    /// Sends `signal` to node `node_id`. After SIGKILL the process is reaped before returning.
    pub fn kill(&self, node_id: u64, signal: Signal) -> anyhow::Result<()> {
        let index = self.index(node_id)?;
        let mut children = self.children();
        let child = children[index]
            .as_mut()
            .ok_or_else(|| anyhow!("node {node_id} is not running"))?;
        let pid = Pid::from_raw(i32::try_from(child.id()).context("pid out of range")?);
        signal::kill(pid, signal).with_context(|| format!("sending {signal} to node {node_id}"))?;
        if signal == Signal::SIGKILL {
            child.wait()?;
            children[index] = None;
        }
        Ok(())
    }

    /// Waits up to `timeout` for node `node_id` to exit; `None` if it is still running.
    pub fn wait_exit(&self, node_id: u64, timeout: Duration) -> anyhow::Result<Option<ExitStatus>> {
        let index = self.index(node_id)?;
        let give_up = Instant::now() + timeout;
        loop {
            {
                let mut children = self.children();
                let Some(child) = children[index].as_mut() else {
                    bail!("node {node_id} is not running");
                };
                if let Some(status) = child.try_wait()? {
                    children[index] = None;
                    return Ok(Some(status));
                }
            }
            if Instant::now() >= give_up {
                return Ok(None);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGTERM, wait up to `timeout`, then SIGKILL. Returns the exit status, and whether the
    /// node stopped by itself.
    pub fn stop(&self, node_id: u64, timeout: Duration) -> anyhow::Result<(ExitStatus, bool)> {
        self.kill(node_id, Signal::SIGTERM)?;
        if let Some(status) = self.wait_exit(node_id, timeout)? {
            return Ok((status, true));
        }
        let index = self.index(node_id)?;
        let mut children = self.children();
        let child = children[index]
            .as_mut()
            .ok_or_else(|| anyhow!("node {node_id} vanished"))?;
        child.kill()?;
        let status = child.wait()?;
        children[index] = None;
        Ok((status, false))
    }

    /// Stops every running node: SIGTERM to all, one shared bounded wait, SIGKILL for the rest.
    /// Returns the ids of nodes that had to be SIGKILLed.
    pub fn stop_all(&self, timeout: Duration) -> Vec<u64> {
        let mut children = self.children();
        for child in children.iter().flatten() {
            if let Ok(pid) = i32::try_from(child.id()) {
                // ESRCH (already exited) is fine: the wait below reaps it.
                let _ = signal::kill(Pid::from_raw(pid), Signal::SIGTERM);
            }
        }
        let give_up = Instant::now() + timeout;
        loop {
            for slot in children.iter_mut() {
                if let Some(child) = slot.as_mut() {
                    if matches!(child.try_wait(), Ok(Some(_))) {
                        *slot = None;
                    }
                }
            }
            if children.iter().all(Option::is_none) || Instant::now() >= give_up {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let mut killed = Vec::new();
        for (index, slot) in children.iter_mut().enumerate() {
            if let Some(mut child) = slot.take() {
                let _ = child.kill();
                let _ = child.wait();
                killed.push(index as u64 + 1);
            }
        }
        killed
    }

    /// Starts node `node_id` again with the same arguments and data directory.
    pub fn restart(&self, node_id: u64) -> anyhow::Result<()> {
        if self.is_running(node_id)? {
            bail!("node {node_id} is still running; stop or kill it first");
        }
        self.spawn(node_id)
    }

    /// Starts node `node_id` again with `extra_args` appended to its usual arguments, for this
    /// run only (e.g. a clock offset it did not have before). Pass only flags the node does not
    /// already have: `meridian start` rejects a repeated flag.
    pub fn restart_with_args(&self, node_id: u64, extra_args: &[String]) -> anyhow::Result<()> {
        if self.is_running(node_id)? {
            bail!("node {node_id} is still running; stop or kill it first");
        }
        self.spawn_with(node_id, extra_args)
    }

    /// The last `lines` lines of node `node_id`'s log.
    pub fn log_tail(&self, node_id: u64, lines: usize) -> String {
        let text = self.log_contents(node_id).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }
}

/// Fails if a node's port is taken. Without this check a second cluster on the same ports
/// would have its nodes die on bind while readiness probes and clients, dialing the same
/// addresses, happily talk to the first cluster.
fn ensure_ports_free(base_port: u16, nodes: usize) -> anyhow::Result<()> {
    for id in 1..=nodes as u16 {
        for (role, port) in [("client", base_port + id), ("raft", base_port + 100 + id)] {
            if let Err(error) = std::net::TcpListener::bind(("127.0.0.1", port)) {
                bail!(
                    "127.0.0.1:{port} (node {id} {role} port) is unavailable ({error}); another \
                     cluster may be running there: stop it or pick another base port"
                );
            }
        }
    }
    Ok(())
}

impl Drop for LocalCluster {
    fn drop(&mut self) {
        let mut children = self.children();
        for mut child in children.iter_mut().filter_map(Option::take) {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// Node layout: ports, labels, data dirs and the shared initial_cluster.
    #[test]
    fn layout_of_three_nodes() {
        let dir = tempfile::tempdir().unwrap();
        // `true` ignores its arguments and exits: enough to check the layout.
        let config =
            LocalClusterConfig::new("/bin/true", 3, 30000, dir.path()).node_args(2, ["--x"]);
        let cluster = LocalCluster::start(config).unwrap();
        let spec = cluster.spec(2).unwrap();
        assert_eq!(spec.client_addr, "127.0.0.1:30002");
        assert_eq!(spec.peer_addr, "127.0.0.1:30102");
        assert_eq!(spec.region, "eu-west");
        assert_eq!(spec.data_dir, dir.path().join("node2"));
        let ic = spec
            .args
            .iter()
            .position(|a| a == "--initial-cluster")
            .unwrap();
        assert_eq!(
            spec.args[ic + 1],
            "1=127.0.0.1:30101@us-east/a,2=127.0.0.1:30102@eu-west/a,3=127.0.0.1:30103@ap-south/a"
        );
        assert_eq!(spec.args.last().unwrap(), "--x");
        assert!(cluster.spec(4).is_err());
        assert_eq!(cluster.endpoints().len(), 3);
        // Each node's stdout/stderr goes to its log, which starts with the command line.
        assert!(cluster.log_contents(1).unwrap().contains("--node-id 1"));
    }

    /// A taken port is refused up front, naming the port.
    #[test]
    fn busy_ports_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        // Ports no other test uses (tests run in parallel): bench's geo_e2e sits at 30_300.
        let _taken = std::net::TcpListener::bind("127.0.0.1:30902").unwrap();
        let config = LocalClusterConfig::new("/bin/true", 3, 30_800, dir.path());
        let error = LocalCluster::start(config).err().unwrap().to_string();
        assert!(
            error.contains("127.0.0.1:30902 (node 2 raft port)"),
            "{error}"
        );
    }

    /// Stopping, killing and restarting real child processes, and Drop reaping them.
    #[test]
    fn process_lifecycle() {
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("fake-node.sh");
        // A stand-in for `meridian start`: runs until signalled.
        std::fs::write(&script, "#!/bin/sh\nexec sleep 600\n").unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        let config = LocalClusterConfig::new(&script, 3, 30_600, dir.path().join("c"));
        let cluster = LocalCluster::start(config).unwrap();
        assert!(cluster.is_running(1).unwrap());
        cluster.kill(1, Signal::SIGKILL).unwrap();
        assert!(!cluster.is_running(1).unwrap());
        assert!(cluster.kill(1, Signal::SIGTERM).is_err());
        cluster.restart(1).unwrap();
        assert!(
            cluster.restart(1).is_err(),
            "restarting a running node is refused"
        );
        let (_, graceful) = cluster.stop(2, Duration::from_secs(5)).unwrap();
        assert!(graceful);
        let pid = cluster.pid(3).unwrap().unwrap();
        assert!(cluster.stop_all(Duration::from_secs(5)).is_empty());
        assert!(
            signal::kill(Pid::from_raw(pid as i32), None).is_err(),
            "node 3 is gone"
        );
        cluster.restart(3).unwrap();
        let pid = cluster.pid(3).unwrap().unwrap();
        drop(cluster);
        assert!(
            signal::kill(Pid::from_raw(pid as i32), None).is_err(),
            "Drop reaped node 3"
        );
    }
}
