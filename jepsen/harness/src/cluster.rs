//! The cluster under test: a [`LocalCluster`] of real `meridian start` processes, and the
//! per-node uid wrapper that lets nftables tell nodes apart.
//!
//! # Layout
//! Node i: client API 127.0.0.1:<base+i>, Raft 127.0.0.1:<base+100+i>, metrics
//! 127.0.0.1:<base+200+i> (`--metrics-addr`, read after the workload), data and log in a fresh
//! temporary directory (`/var/tmp/meridian-jepsen-<base>-<pid>/`, deleted at the end; logs are
//! copied to the run directory). Every node gets the loopback Raft timings
//! (`--heartbeat-interval-ms 100 --election-timeout-min-ms 600`, so the election timeout and
//! leader lease max is 1.2 s), `--initial-shards <shards>`, `--max-offset-ms 500`, MVCC
//! garbage collection at a 5 s TTL every second (`--gc-ttl-ms 5000 --gc-interval-ms 1000`), so
//! every workload is checked while GC deletes history under it (the default 15 min TTL would
//! never collect within a run), and timestamps closed 1 s back (`--closed-ts-lag-ms 1000`), so
//! followers can serve the bank's stale reads.
//!
//! # The uid wrapper (only for nemeses that partition)
//! [`LocalCluster`] spawns `binary start ...` for every node. For partitioning runs, `binary`
//! is this harness itself, with [`WRAP_ENV_BINARY`] set in its environment: `main` sees
//! `start` as its first argument and calls [`exec_node`], which creates the node's data
//! directory, hands it to uid/gid `61000+i`, drops to that uid, re-arms `PR_SET_PDEATHSIG`
//! (cleared by the uid change) and `exec`s the real `meridian` with the same arguments — same
//! pid, so every signal the harness sends reaches `meridian` itself.

use crate::clocks::FakeClocks;
use crate::nft::NODE_UID_BASE;
use crate::plan::MAX_OFFSET_MS;
use anyhow::{anyhow, bail, Context};
use meridian_cli::{LocalCluster, LocalClusterConfig};
use nix::sys::signal::Signal;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Environment variable naming the real `meridian` binary for the uid wrapper.
pub const WRAP_ENV_BINARY: &str = "MERIDIAN_JEPSEN_NODE_BINARY";
/// Environment variable holding the `LD_PRELOAD` the uid wrapper gives the node (libfaketime).
pub const WRAP_ENV_PRELOAD: &str = "MERIDIAN_JEPSEN_NODE_PRELOAD";
/// Bound on the cluster electing every shard's leader (first start and after healing).
pub const READY_TIMEOUT: Duration = Duration::from_secs(90);
/// Bound on one node's graceful stop before SIGKILL.
pub const STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// The default `meridian` binary: `$CARGO_TARGET_DIR/release/meridian`.
pub fn default_meridian_binary() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/tmp/meridian-target"));
    target.join("release").join("meridian")
}

/// Arguments every node gets (after LocalCluster's loopback Raft timings).
pub fn common_node_args(shards: u32, max_offset_ms: i64) -> Vec<String> {
    vec![
        "--initial-shards".into(),
        shards.to_string(),
        "--max-offset-ms".into(),
        max_offset_ms.to_string(),
        "--gc-ttl-ms".into(),
        GC_TTL_MS.to_string(),
        "--gc-interval-ms".into(),
        "1000".into(),
        "--closed-ts-lag-ms".into(),
        CLOSED_TS_LAG_MS.to_string(),
    ]
}

/// The nodes' closed-timestamp lag: below the bank workload's stale-read staleness
/// (`bank::STALENESS`), so a follower can serve its stale reads.
pub const CLOSED_TS_LAG_MS: u64 = 1_000;

/// The nodes' GC TTL: above the +2 s clock faults of `all` plus max_offset, so no read a
/// skewed clock serves falls below a threshold another clock chose.
pub const GC_TTL_MS: u64 = 5_000;

/// A directory the node uids can traverse (0755), created fresh.
pub fn make_data_dir(base_port: u16) -> anyhow::Result<PathBuf> {
    let dir = PathBuf::from(format!(
        "/var/tmp/meridian-jepsen-{base_port}-{}",
        std::process::id()
    ));
    if dir.exists() {
        std::fs::remove_dir_all(&dir).with_context(|| format!("clearing {}", dir.display()))?;
    }
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755))?;
    Ok(dir)
}

/// Points the uid wrapper at `meridian`. Call before any thread is started (it changes the
/// process environment).
pub fn set_wrapper_env(meridian: &Path) {
    std::env::set_var(WRAP_ENV_BINARY, meridian);
}

/// Starts the nodes (not waiting for them), every one with `--max-offset-ms` [`MAX_OFFSET_MS`].
/// With `per_node_uids`, through the uid wrapper; with `clocks`, on libfaketime.
pub fn start(
    meridian: &Path,
    nodes: usize,
    base_port: u16,
    data_dir: &Path,
    shards: u32,
    per_node_uids: bool,
    clocks: Option<&FakeClocks>,
) -> anyhow::Result<LocalCluster> {
    if !meridian.is_file() {
        bail!(
            "meridian binary not found at {} (build it: cargo build --release --locked -p meridian-cli, \
             or run jepsen/run.sh)",
            meridian.display()
        );
    }
    let binary = if per_node_uids {
        // The wrapper processes inherit the environment; `main` sets this before the runtime
        // starts (see `set_wrapper_env`).
        if std::env::var_os(WRAP_ENV_BINARY).as_deref() != Some(meridian.as_os_str()) {
            bail!("{WRAP_ENV_BINARY} is not set to {}", meridian.display());
        }
        std::env::current_exe().context("locating the harness binary for the uid wrapper")?
    } else {
        meridian.to_path_buf()
    };
    let mut config = LocalClusterConfig::new(binary, nodes, base_port, data_dir)
        .common_args(common_node_args(shards, MAX_OFFSET_MS));
    for node in 1..=nodes as u64 {
        let addr = format!("127.0.0.1:{}", metrics_port(base_port, node));
        config = config.node_args(node, ["--metrics-addr".to_string(), addr]);
    }
    if let Some(clocks) = clocks {
        for node in 1..=nodes as u64 {
            for (key, value) in clocks.env(node) {
                // The uid wrapper must not run with libfaketime itself: its shared memory would
                // belong to root, and the node (another uid) could not open it. The wrapper
                // sets the preload for the exec instead.
                let key = if per_node_uids && key == "LD_PRELOAD" {
                    WRAP_ENV_PRELOAD.to_string()
                } else {
                    key
                };
                config = config.node_env(node, key, value);
            }
        }
    }
    LocalCluster::start(config)
}

/// Node `node`'s metrics port (`--metrics-addr`; see `args::METRICS_PORT_OFFSET`).
pub fn metrics_port(base_port: u16, node: u64) -> u16 {
    (u32::from(base_port) + crate::args::METRICS_PORT_OFFSET + node as u32) as u16
}

/// Fails like `LocalCluster::start` would if a node port is taken, before anything else of the
/// run (nftables table included) is set up.
pub fn ensure_ports_free(base_port: u16, nodes: usize) -> anyhow::Result<()> {
    for id in 1..=nodes as u16 {
        let metrics = metrics_port(base_port, u64::from(id));
        for port in [base_port + id, base_port + 100 + id, metrics] {
            std::net::TcpListener::bind(("127.0.0.1", port)).map_err(|e| {
                anyhow!(
                    "127.0.0.1:{port} is unavailable ({e}); another cluster may be running \
                     there: pick another --base-port"
                )
            })?;
        }
    }
    Ok(())
}

/// The value following `flag` in `args`.
pub fn flag_value<'a>(args: &'a [String], flag: &str) -> Option<&'a str> {
    args.iter()
        .position(|a| a == flag)
        .and_then(|i| args.get(i + 1))
        .map(String::as_str)
}

/// The uid wrapper (see the module docs). `args` are the arguments after the program name
/// (`start --node-id N ...`). Only returns on error.
pub fn exec_node(meridian: &Path, args: &[String]) -> anyhow::Error {
    let inner = || -> anyhow::Result<std::convert::Infallible> {
        let node: u32 = flag_value(args, "--node-id")
            .ok_or_else(|| anyhow!("no --node-id in {args:?}"))?
            .parse()
            .context("--node-id")?;
        let data_dir = flag_value(args, "--data-dir").ok_or_else(|| anyhow!("no --data-dir"))?;
        let uid = NODE_UID_BASE + node;
        std::fs::create_dir_all(data_dir).with_context(|| format!("creating {data_dir}"))?;
        std::os::unix::fs::chown(data_dir, Some(uid), Some(uid))
            .with_context(|| format!("chown {data_dir} to {uid}"))?;
        let mut command = std::process::Command::new(meridian);
        command
            .args(args)
            .env_remove(WRAP_ENV_BINARY)
            .env_remove(WRAP_ENV_PRELOAD)
            .uid(uid)
            .gid(uid);
        if let Some(preload) = std::env::var_os(WRAP_ENV_PRELOAD) {
            command.env("LD_PRELOAD", preload);
        }
        // SAFETY: runs between the uid change and exec in this (single-threaded) process and
        // only makes the prctl syscall.
        unsafe {
            command.pre_exec(|| {
                nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(std::io::Error::from)
            });
        }
        Err(anyhow::Error::from(command.exec()).context(format!("exec {}", meridian.display())))
    };
    match inner() {
        Ok(never) => match never {},
        Err(error) => error,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The wrapper finds its node id and data dir among LocalCluster's arguments.
    #[test]
    fn flag_values() {
        let args: Vec<String> = "start --node-id 2 --data-dir /x/node2 --initial-shards 4"
            .split(' ')
            .map(String::from)
            .collect();
        assert_eq!(flag_value(&args, "--node-id"), Some("2"));
        assert_eq!(flag_value(&args, "--data-dir"), Some("/x/node2"));
        assert_eq!(flag_value(&args, "--region"), None);
        assert_eq!(
            common_node_args(4, 500),
            [
                "--initial-shards",
                "4",
                "--max-offset-ms",
                "500",
                "--gc-ttl-ms",
                "5000",
                "--gc-interval-ms",
                "1000",
                "--closed-ts-lag-ms",
                "1000"
            ]
        );
    }
}
