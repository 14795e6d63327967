//! Validation: turns the file, with the flags laid over it, into a `NodeConfig`, or into a
//! `ConfigError` naming the first offending field. Also the limits those checks enforce.
//! It checks each node's config on its own: it cannot tell whether the other nodes were
//! given the same `initial_cluster` or cluster rules.

use super::{err, ConfigError, FileConfig, Member, NodeConfig};
use meridian_types::limits::MAX_INITIAL_SHARDS;
use meridian_types::NodeId;
use std::net::SocketAddr;

/// The highest `raft.proposals_in_flight` accepted.
pub const MAX_PROPOSALS_IN_FLIGHT: usize = 1_024;
/// `cluster.gc_ttl_ms` is at least this many `max_offset_ms`.
pub const MIN_GC_TTL_OFFSETS: u64 = 4;
/// The largest `cluster.max_offset_ms` accepted: a minute.
pub const MAX_MAX_OFFSET_MS: u64 = 60_000;
/// `cluster.closed_ts_lag_ms` (unless 0) is at least this many `closed_ts_interval_ms`.
pub const MIN_CLOSED_TS_LAG_INTERVALS: u64 = 4;

fn parse_addr(field: &str, value: Option<String>) -> Result<SocketAddr, ConfigError> {
    let value = value.ok_or_else(|| err(field, "is required"))?;
    value
        .parse()
        .map_err(|e| err(field, format!("{value:?} is not a socket address: {e}")))
}

impl NodeConfig {
    /// Checks the file with the flags laid over it; the error names the first offending field.
    pub(super) fn validate(file: FileConfig) -> Result<NodeConfig, ConfigError> {
        let node_id = file.node_id.ok_or_else(|| err("node_id", "is required"))?;
        if node_id == 0 {
            return Err(err("node_id", "0 is reserved; use an id > 0"));
        }
        let join = file.join.clone();
        if let Some(via) = &join {
            if file.initial_cluster.is_some() {
                return Err(err(
                    "join",
                    format!("a founding member lists initial_cluster, a joining node names a member to join ({via}); give one, not both"),
                ));
            }
            if via.trim().is_empty() {
                return Err(err(
                    "join",
                    "is empty; give a member's client address (host:port)",
                ));
            }
        }
        let client_addr = parse_addr("client_addr", file.client_addr)?;
        let peer_addr = parse_addr("peer_addr", file.peer_addr)?;
        let metrics_addr = file
            .metrics_addr
            .map(|a| parse_addr("metrics_addr", Some(a)))
            .transpose()?;
        let data_dir = file
            .data_dir
            .ok_or_else(|| err("data_dir", "is required"))?;
        // A joining node learns the founding members when it joins (`join::prepare`).
        let raw = match (&join, file.initial_cluster) {
            (Some(_), _) => Vec::new(),
            (None, raw) => raw.ok_or_else(|| {
                err(
                    "initial_cluster",
                    "is required (id=peer_addr@region/zone,...), unless the node joins a running cluster (join)",
                )
            })?,
        };
        let mut initial_cluster = Vec::new();
        for (i, s) in raw.iter().enumerate() {
            let m = Member::parse(s).map_err(|e| err(format!("initial_cluster[{i}]"), e))?;
            if initial_cluster
                .iter()
                .any(|o: &Member| o.node_id == m.node_id)
            {
                return Err(err(
                    format!("initial_cluster[{i}]"),
                    format!("node id {} listed twice", m.node_id),
                ));
            }
            initial_cluster.push(m);
        }
        let (region, zone) = if join.is_some() {
            // As `initial_cluster` defaults a member's location.
            let or_default = |v: Option<String>| {
                v.filter(|v| !v.is_empty())
                    .unwrap_or_else(|| "default".into())
            };
            (or_default(file.region), or_default(file.zone))
        } else {
            let me = initial_cluster
                .iter()
                .find(|m| m.node_id == node_id)
                .ok_or_else(|| {
                    err(
                        "initial_cluster",
                        format!("does not list this node ({node_id})"),
                    )
                })?;
            if me.peer_addr != peer_addr {
                return Err(err(
                    "peer_addr",
                    format!(
                        "{peer_addr} differs from this node's entry in initial_cluster ({})",
                        me.peer_addr
                    ),
                ));
            }
            (
                file.region.unwrap_or_else(|| me.region.clone()),
                file.zone.unwrap_or_else(|| me.zone.clone()),
            )
        };
        let c = &file.cluster;
        if c.split_points.is_empty() && !(1..=MAX_INITIAL_SHARDS).contains(&c.initial_shards) {
            return Err(err(
                "cluster.initial_shards",
                format!("{} is outside 1..={MAX_INITIAL_SHARDS}", c.initial_shards),
            ));
        }
        if c.split_points.len() as u32 >= MAX_INITIAL_SHARDS {
            return Err(err(
                "cluster.split_points",
                format!("more than {MAX_INITIAL_SHARDS} shards"),
            ));
        }
        // Every split point must make a shard: an empty or repeated one would silently give
        // fewer shards than listed.
        let mut seen = std::collections::HashSet::new();
        for (i, point) in c.split_points.iter().enumerate() {
            if point.is_empty() {
                return Err(err(format!("cluster.split_points[{i}]"), "is empty"));
            }
            if !seen.insert(point) {
                return Err(err(
                    format!("cluster.split_points[{i}]"),
                    format!("{point:?} is listed twice"),
                ));
            }
        }
        if c.replication_factor == 0 || c.replication_factor.is_multiple_of(2) {
            return Err(err("cluster.replication_factor", "must be odd and > 0"));
        }
        if c.max_offset_ms == 0 {
            return Err(err("cluster.max_offset_ms", "must be > 0"));
        }
        // Every wait it sets (a new leader's, a commit's, a restarted node's) is that long,
        // and HLC admission converts it to uhlc's 32.32 fixed point, where ~4.3e12 ms wraps.
        if c.max_offset_ms > MAX_MAX_OFFSET_MS {
            return Err(err(
                "cluster.max_offset_ms",
                format!("must be at most {MAX_MAX_OFFSET_MS} (a minute)"),
            ));
        }
        // A linearizable read is served at a clock reading that may lag the leader that chose
        // the threshold by up to max_offset: the history kept must cover that and more.
        if c.gc_ttl_ms != 0 && c.gc_ttl_ms < MIN_GC_TTL_OFFSETS.saturating_mul(c.max_offset_ms) {
            return Err(err(
                "cluster.gc_ttl_ms",
                format!(
                    "must be 0 (never collect) or at least {MIN_GC_TTL_OFFSETS} x max_offset_ms ({} ms)",
                    MIN_GC_TTL_OFFSETS.saturating_mul(c.max_offset_ms)
                ),
            ));
        }
        if c.gc_interval_ms == 0 {
            return Err(err("cluster.gc_interval_ms", "must be > 0"));
        }
        if c.closed_ts_interval_ms == 0 {
            return Err(err("cluster.closed_ts_interval_ms", "must be > 0"));
        }
        // An idle shard's closed timestamp is republished every interval; a lag of a few
        // intervals keeps a follower's bound from lapsing between two rounds.
        if c.closed_ts_lag_ms != 0
            && c.closed_ts_lag_ms
                < MIN_CLOSED_TS_LAG_INTERVALS.saturating_mul(c.closed_ts_interval_ms)
        {
            return Err(err(
                "cluster.closed_ts_lag_ms",
                format!(
                    "must be 0 (no follower reads) or at least {MIN_CLOSED_TS_LAG_INTERVALS} x closed_ts_interval_ms ({} ms)",
                    MIN_CLOSED_TS_LAG_INTERVALS.saturating_mul(c.closed_ts_interval_ms)
                ),
            ));
        }
        // A joining node takes the cluster's rules when it joins.
        let (home_regions, replica_constraints) = match join {
            Some(_) => (Vec::new(), Vec::new()),
            None => crate::home::parse_rules(c, &initial_cluster)?,
        };
        let r = &file.raft;
        // openraft wants the widest gap between heartbeats, 2 intervals plus a tick of at least
        // 1 ms, below the minimum election timeout: at 1 ms a third is not enough.
        if r.heartbeat_interval_ms < 2
            || r.heartbeat_interval_ms.saturating_mul(3) > r.election_timeout_min_ms
        {
            return Err(err(
                "raft.heartbeat_interval_ms",
                "must be at least 2 and at most a third of raft.election_timeout_min_ms",
            ));
        }
        if r.election_timeout_max_ms <= r.election_timeout_min_ms {
            return Err(err(
                "raft.election_timeout_max_ms",
                "must exceed raft.election_timeout_min_ms",
            ));
        }
        if r.rpc_timeout_ms == 0 {
            return Err(err("raft.rpc_timeout_ms", "must be > 0"));
        }
        if r.proposals_in_flight > MAX_PROPOSALS_IN_FLIGHT {
            return Err(err(
                "raft.proposals_in_flight",
                format!("must be at most {MAX_PROPOSALS_IN_FLIGHT} (0 = coalescing off)"),
            ));
        }
        let mut peer_dial = std::collections::BTreeMap::new();
        for (i, entry) in file.peer_dial.unwrap_or_default().iter().enumerate() {
            let field = format!("peer_dial[{i}]");
            let (id, addr) = entry
                .split_once('=')
                .ok_or_else(|| err(&field, format!("{entry:?} is not of the form id=host:port")))?;
            let id: NodeId = id
                .trim()
                .parse()
                .map_err(|_| err(&field, format!("{id:?} is not a node id")))?;
            // A joining node does not know the members yet; an entry naming no member is unused.
            if join.is_none() && !initial_cluster.iter().any(|m| m.node_id == id) {
                return Err(err(&field, format!("node {id} is not in initial_cluster")));
            }
            let addr: SocketAddr = addr
                .trim()
                .parse()
                .map_err(|e| err(&field, format!("{addr:?} is not an ip:port address: {e}")))?;
            peer_dial.insert(id, addr);
        }
        Ok(NodeConfig {
            node_id,
            region,
            zone,
            client_addr,
            metrics_addr,
            peer_addr,
            data_dir,
            initial_cluster,
            join,
            clock_offset_ms: file.clock_offset_ms.unwrap_or(0),
            peer_dial,
            home_regions,
            replica_constraints,
            cluster: file.cluster,
            raft: file.raft,
        })
    }
}
