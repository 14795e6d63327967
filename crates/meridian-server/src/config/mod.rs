//! Node configuration: a TOML file and/or command-line flags (flags win), validated up front.
//!
//! Every error names the offending field, e.g. `config field "initial_cluster[1]": ...`, so an
//! operator can fix it without reading code. Durations are milliseconds and say so in the name.
//!
//! ```toml
//! node_id = 1
//! region = "us-east"
//! zone = "a"
//! client_addr = "127.0.0.1:7001"
//! peer_addr = "127.0.0.1:7101"
//! data_dir = "/var/lib/meridian/1"
//! # id=peer_addr@region/zone for every founding member (same list on every node)
//! initial_cluster = ["1=127.0.0.1:7101@us-east/a", "2=127.0.0.1:7102@eu-west/a", "3=127.0.0.1:7103@ap-south/a"]
//!
//! [cluster]
//! initial_shards = 8            # data shards a new cluster is pre-split into
//! split_points = []             # explicit split keys (overrides initial_shards)
//! replication_factor = 3
//! max_offset_ms = 500
//! gc_ttl_ms = 900000            # history kept for reads in the past (0 = never collect)
//! gc_interval_ms = 60000        # how often a leader looks for garbage in its shards
//! txn_sweep_after_ms = 10000    # settle transactions prepared this long ago (0 = no sweeper)
//! home_regions = []             # "<start key>=<region>[:zone]": who leads that key range (`home`)
//! replica_constraints = []      # "<start key>:+region=eu-west,-zone=c": who may hold replicas (`constraints`)
//! closed_ts_lag_ms = 3000       # how far behind now leaders close timestamps (0 = no follower reads)
//! closed_ts_interval_ms = 200   # how often leaders publish closed timestamps of idle shards
//!
//! [raft]
//! heartbeat_interval_ms = 400  # also each heartbeat's timeout: keep it above every replica RTT
//! election_timeout_min_ms = 1500
//! election_timeout_max_ms = 3000
//! rpc_timeout_ms = 2000
//! quiesce = true               # idle shards stop heartbeats and election timers
//! rest_followers = true        # followers that hear their leader stop their election tickers
//! proposals_in_flight = 2      # a shard leader's entries in flight before writes coalesce (0 = off)
//! ```
//!
//! # Layout
//!
//! - `member`: a founding member (`initial_cluster` entry) and its parsing.
//! - `file`: the file format (`FileConfig`) and its `[cluster]` and `[raft]` sections, with
//!   their defaults.
//! - `args`: the flags of `meridian start` (`StartArgs`).
//! - `validate`: the checks that turn the merged file into a `NodeConfig`, and their limits.
//! - here: the error type, the validated `NodeConfig`, and `NodeConfig::load`, which reads the
//!   file and lays the flags over it.

mod args;
mod file;
mod member;
mod validate;

pub use args::StartArgs;
pub use file::{ClusterSection, FileConfig, RaftSection};
pub use member::Member;
pub use validate::{
    MAX_MAX_OFFSET_MS, MAX_PROPOSALS_IN_FLIGHT, MIN_CLOSED_TS_LAG_INTERVALS, MIN_GC_TTL_OFFSETS,
};

use meridian_types::NodeId;
use std::net::SocketAddr;
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
#[error("config field \"{field}\": {message}")]
pub struct ConfigError {
    pub field: String,
    pub message: String,
}

fn err(field: impl Into<String>, message: impl Into<String>) -> ConfigError {
    ConfigError {
        field: field.into(),
        message: message.into(),
    }
}

/// A validated node configuration.
#[derive(Clone, Debug)]
pub struct NodeConfig {
    pub node_id: NodeId,
    pub region: String,
    pub zone: String,
    pub client_addr: SocketAddr,
    pub peer_addr: SocketAddr,
    pub metrics_addr: Option<SocketAddr>,
    pub data_dir: PathBuf,
    /// The founding members (for a joined node: as the cluster answered, see `join`).
    pub initial_cluster: Vec<Member>,
    /// A member's client address to join through (`--join`; see `join`), for a node that is
    /// not a founding member.
    pub join: Option<String>,
    /// Peers dialled at another address than their `initial_cluster` one (a WAN proxy).
    pub peer_dial: std::collections::BTreeMap<NodeId, SocketAddr>,
    pub clock_offset_ms: i64,
    pub cluster: ClusterSection,
    pub raft: RaftSection,
    /// `cluster.home_regions`, parsed and sorted.
    pub home_regions: Vec<crate::home::HomeRule>,
    /// `cluster.replica_constraints`, parsed and sorted.
    pub replica_constraints: Vec<crate::constraints::ConstraintRule>,
}

impl NodeConfig {
    /// Reads the file (if any), applies flags, validates.
    pub fn load(args: &StartArgs) -> Result<NodeConfig, ConfigError> {
        let mut file = match &args.config {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .map_err(|e| err("config", format!("cannot read {}: {e}", path.display())))?;
                toml::from_str::<FileConfig>(&text).map_err(|e| {
                    let field = e.span().map(|s| {
                        let line = text[..s.start].lines().count();
                        format!("config (line {line})")
                    });
                    err(
                        field.unwrap_or_else(|| "config".into()),
                        e.message().to_string(),
                    )
                })?
            }
            None => FileConfig::default(),
        };
        macro_rules! flag {
            ($name:ident) => {
                if let Some(v) = args.$name.clone() {
                    file.$name = Some(v);
                }
            };
        }
        flag!(node_id);
        flag!(region);
        flag!(zone);
        flag!(client_addr);
        flag!(peer_addr);
        flag!(metrics_addr);
        flag!(data_dir);
        flag!(initial_cluster);
        flag!(join);
        flag!(clock_offset_ms);
        flag!(peer_dial);
        if let Some(v) = args.initial_shards {
            file.cluster.initial_shards = v;
        }
        if let Some(v) = args.max_offset_ms {
            file.cluster.max_offset_ms = v;
        }
        if let Some(v) = args.gc_ttl_ms {
            file.cluster.gc_ttl_ms = v;
        }
        if let Some(v) = args.gc_interval_ms {
            file.cluster.gc_interval_ms = v;
        }
        if let Some(v) = args.txn_sweep_after_ms {
            file.cluster.txn_sweep_after_ms = v;
        }
        if let Some(v) = &args.home_regions {
            file.cluster.home_regions = v.clone();
        }
        if let Some(v) = &args.replica_constraints {
            file.cluster.replica_constraints = v.clone();
        }
        if let Some(v) = args.closed_ts_lag_ms {
            file.cluster.closed_ts_lag_ms = v;
        }
        if let Some(v) = args.closed_ts_interval_ms {
            file.cluster.closed_ts_interval_ms = v;
        }
        if let Some(v) = args.heartbeat_interval_ms {
            file.raft.heartbeat_interval_ms = v;
        }
        if let Some(v) = args.election_timeout_min_ms {
            file.raft.election_timeout_min_ms = v;
            file.raft.election_timeout_max_ms = v.saturating_mul(2);
        }
        if let Some(v) = args.election_timeout_max_ms {
            file.raft.election_timeout_max_ms = v;
        }
        if let Some(v) = args.quiesce {
            file.raft.quiesce = v;
        }
        if let Some(v) = args.rest_followers {
            file.raft.rest_followers = v;
        }
        if let Some(v) = args.proposals_in_flight {
            file.raft.proposals_in_flight = v;
        }
        Self::validate(file)
    }
}

/// Minimal valid flags for a two-member cluster (tests).
#[cfg(test)]
pub(crate) fn test_args() -> StartArgs {
    StartArgs {
        node_id: Some(1),
        client_addr: Some("127.0.0.1:7001".into()),
        peer_addr: Some("127.0.0.1:7101".into()),
        data_dir: Some("/tmp/x".into()),
        initial_cluster: Some(vec![
            "1=127.0.0.1:7101@us/a".into(),
            "2=127.0.0.1:7102@eu/b".into(),
        ]),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests;
