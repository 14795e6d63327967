//! Starting and stopping the three stores of a comparison, each fresh in its own directory.
//!
//! | store | started as | endpoints | stop |
//! |---|---|---|---|
//! | meridian | 3 `meridian start` children (`LocalCluster`, loopback Raft timings) | client addresses | SIGTERM, [`STOP_TIMEOUT`], SIGKILL |
//! | etcd | 3 `etcd` children ([`EtcdCluster`]) | client URLs | SIGTERM, [`STOP_TIMEOUT`], SIGKILL |
//! | rocksdb | nothing: the driver opens the directory in-process per phase | — | — |
//!
//! Before a cluster starts, every port it will listen on is checked to be free, so a leftover
//! server from another run is reported as such instead of as a confusing readiness timeout.
//! The guards inside [`RunningStore`] kill their processes when dropped (errors, Ctrl-C).

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context};
use meridian_cli::local_cluster::{LocalCluster, LocalClusterConfig};

use super::etcd_cluster::{EtcdCluster, EtcdClusterConfig, MEMBERS, PEER_PORT_OFFSET};
use crate::db::DriverKind;

/// Nodes of the Meridian cluster.
pub const MERIDIAN_NODES: usize = 3;
/// How long servers get to stop after SIGTERM before SIGKILL.
pub const STOP_TIMEOUT: Duration = Duration::from_secs(10);
/// Lines of a Meridian node's log quoted when it dies.
const LOG_TAIL_LINES: usize = 20;

/// Where and how to start a store.
#[derive(Debug, Clone)]
pub struct StoreConfig {
    pub meridian_bin: Option<PathBuf>,
    pub etcd_bin: Option<PathBuf>,
    pub meridian_base_port: u16,
    pub etcd_base_port: u16,
    /// A fresh directory for this store's data and logs.
    pub data_dir: PathBuf,
    pub ready_timeout: Duration,
}

/// A started store; dropping it kills its servers.
pub enum RunningStore {
    Meridian(LocalCluster),
    Etcd(EtcdCluster),
    RocksDb { data_dir: PathBuf },
}

impl RunningStore {
    /// Starts `kind` fresh in `config.data_dir` and waits until it serves.
    pub async fn start(kind: DriverKind, config: &StoreConfig) -> anyhow::Result<RunningStore> {
        match kind {
            DriverKind::Meridian => {
                let binary = config
                    .meridian_bin
                    .clone()
                    .context("no meridian binary was located")?;
                let ports: Vec<u16> = (1..=MERIDIAN_NODES as u16)
                    .flat_map(|i| {
                        [
                            config.meridian_base_port + i,
                            config.meridian_base_port + 100 + i,
                        ]
                    })
                    .collect();
                ensure_ports_free(&ports, "Meridian")?;
                let cluster_config = LocalClusterConfig::new(
                    binary,
                    MERIDIAN_NODES,
                    config.meridian_base_port,
                    &config.data_dir,
                );
                let cluster = LocalCluster::start(cluster_config)?;
                // On error the cluster is dropped here, which kills its nodes.
                cluster
                    .wait_ready(config.ready_timeout)
                    .await
                    .context("waiting for every Meridian shard to have a leader")?;
                Ok(RunningStore::Meridian(cluster))
            }
            DriverKind::Etcd => {
                let binary = config
                    .etcd_bin
                    .clone()
                    .context("no etcd binary was located")?;
                let ports: Vec<u16> = (1..=MEMBERS as u16)
                    .flat_map(|i| {
                        [
                            config.etcd_base_port + i,
                            config.etcd_base_port + PEER_PORT_OFFSET + i,
                        ]
                    })
                    .collect();
                ensure_ports_free(&ports, "etcd")?;
                let mut cluster = EtcdCluster::start(&EtcdClusterConfig {
                    binary,
                    base_port: config.etcd_base_port,
                    data_dir: config.data_dir.clone(),
                })?;
                cluster.wait_healthy(config.ready_timeout).await?;
                Ok(RunningStore::Etcd(cluster))
            }
            DriverKind::Rocksdb => {
                std::fs::create_dir_all(&config.data_dir)
                    .with_context(|| format!("creating {}", config.data_dir.display()))?;
                Ok(RunningStore::RocksDb {
                    data_dir: config.data_dir.join("db"),
                })
            }
        }
    }

    /// The driver to use.
    pub fn kind(&self) -> DriverKind {
        match self {
            RunningStore::Meridian(_) => DriverKind::Meridian,
            RunningStore::Etcd(_) => DriverKind::Etcd,
            RunningStore::RocksDb { .. } => DriverKind::Rocksdb,
        }
    }

    /// `--endpoints` for the driver.
    pub fn endpoints(&self) -> Vec<String> {
        match self {
            RunningStore::Meridian(cluster) => cluster.endpoints(),
            RunningStore::Etcd(cluster) => cluster.endpoints(),
            RunningStore::RocksDb { .. } => Vec::new(),
        }
    }

    /// `--data-dir` for the rocksdb driver.
    pub fn rocksdb_dir(&self) -> Option<PathBuf> {
        match self {
            RunningStore::RocksDb { data_dir } => Some(data_dir.clone()),
            _ => None,
        }
    }

    /// One line for the progress output.
    pub fn describe(&self) -> String {
        match self {
            RunningStore::Meridian(cluster) => format!(
                "{MERIDIAN_NODES} nodes, clients {}, logs in {}",
                cluster.endpoints().join(","),
                cluster.data_dir().display()
            ),
            RunningStore::Etcd(cluster) => format!(
                "{MEMBERS} members, clients {}, logs in {}",
                cluster.endpoints().join(","),
                cluster.data_dir().display()
            ),
            RunningStore::RocksDb { data_dir } => format!("embedded, {}", data_dir.display()),
        }
    }

    /// Fails if a server process has exited, quoting its log.
    pub fn check_alive(&mut self) -> anyhow::Result<()> {
        match self {
            RunningStore::Meridian(cluster) => {
                if let Some((node_id, status)) = cluster.exited_nodes().into_iter().next() {
                    bail!(
                        "Meridian node {node_id} exited ({status}); last lines of its log:\n{}",
                        cluster.log_tail(node_id, LOG_TAIL_LINES)
                    );
                }
                Ok(())
            }
            RunningStore::Etcd(cluster) => cluster.check_alive(),
            RunningStore::RocksDb { .. } => Ok(()),
        }
    }

    /// Stops the servers gracefully (bounded); an error says which had to be killed.
    pub fn stop(mut self) -> anyhow::Result<()> {
        let killed: Vec<String> = match &mut self {
            RunningStore::Meridian(cluster) => cluster
                .stop_all(STOP_TIMEOUT)
                .into_iter()
                .map(|id| format!("node {id}"))
                .collect(),
            RunningStore::Etcd(cluster) => cluster.stop(STOP_TIMEOUT),
            RunningStore::RocksDb { .. } => Vec::new(),
        };
        if !killed.is_empty() {
            bail!(
                "{} did not stop within {} s of SIGTERM and were killed",
                killed.join(", "),
                STOP_TIMEOUT.as_secs()
            );
        }
        Ok(())
    }
}

/// Fails, naming the port, if any of `ports` on 127.0.0.1 is already taken.
pub fn ensure_ports_free(ports: &[u16], what: &str) -> anyhow::Result<()> {
    for port in ports {
        if let Err(error) = std::net::TcpListener::bind(("127.0.0.1", *port)) {
            bail!(
                "127.0.0.1:{port}, needed by {what}, is not free ({error}); is a server from \
                 another run still up? Stop it or pick other ports (--base-port, --etcd-base-port)"
            );
        }
    }
    Ok(())
}

/// The `meridian` binary: `explicit`, or `meridian` next to the running executable.
pub fn locate_meridian(explicit: Option<&Path>) -> anyhow::Result<PathBuf> {
    let path = match explicit {
        Some(path) => path.to_path_buf(),
        None => {
            let exe = std::env::current_exe().context("locating this executable")?;
            exe.parent()
                .map(|dir| dir.join("meridian"))
                .context("this executable has no parent directory")?
        }
    };
    if !path.is_file() {
        bail!(
            "meridian binary not found at {}; build it with `cargo build --release -p \
             meridian-cli` or pass --meridian-bin PATH",
            path.display()
        );
    }
    Ok(path)
}

/// The `etcd` binary: `explicit`, or `etcd` on PATH.
pub fn locate_etcd(explicit: Option<&Path>) -> anyhow::Result<PathBuf> {
    if let Some(path) = explicit {
        if !path.is_file() {
            bail!("etcd binary not found at {}", path.display());
        }
        return Ok(path.to_path_buf());
    }
    find_on_path("etcd").context(
        "etcd not found on PATH; install it (Debian: apt-get install etcd-server etcd-client) \
         or pass --etcd-bin PATH",
    )
}

/// The first executable file called `name` in the directories of `PATH`.
pub fn find_on_path(name: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|candidate| {
            std::fs::metadata(candidate)
                .map(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
                .unwrap_or(false)
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A port someone listens on is reported by number; a free one passes.
    #[test]
    fn busy_ports_are_named() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let error = ensure_ports_free(&[port], "test").unwrap_err();
        assert!(error.to_string().contains(&port.to_string()), "{error}");
        drop(listener);
        assert!(ensure_ports_free(&[port], "test").is_ok());
    }

    /// A missing meridian binary gets a message that says how to build it.
    #[test]
    fn missing_meridian_binary() {
        let error = locate_meridian(Some(Path::new("/nonexistent/meridian"))).unwrap_err();
        assert!(error.to_string().contains("cargo build"), "{error}");
    }
}
