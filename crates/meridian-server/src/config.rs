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

use meridian_types::limits::MAX_INITIAL_SHARDS;

/// The highest `raft.proposals_in_flight` accepted.
pub const MAX_PROPOSALS_IN_FLIGHT: usize = 1_024;
use meridian_types::NodeId;
use serde::Deserialize;
use std::net::SocketAddr;
use std::path::PathBuf;

/// `cluster.gc_ttl_ms` is at least this many `max_offset_ms`.
pub const MIN_GC_TTL_OFFSETS: u64 = 4;
/// `cluster.closed_ts_lag_ms` (unless 0) is at least this many `closed_ts_interval_ms`.
pub const MIN_CLOSED_TS_LAG_INTERVALS: u64 = 4;

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

/// One founding member as listed in `initial_cluster`: `id=peer_addr@region/zone`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    pub node_id: NodeId,
    pub peer_addr: SocketAddr,
    pub region: String,
    pub zone: String,
}

impl Member {
    pub fn parse(s: &str) -> Result<Member, String> {
        let (id, rest) = s
            .split_once('=')
            .ok_or_else(|| format!("{s:?} is not of the form id=peer_addr@region/zone"))?;
        let node_id: NodeId = id
            .trim()
            .parse()
            .map_err(|_| format!("node id {id:?} is not an unsigned integer"))?;
        if node_id == 0 {
            return Err("node id 0 is reserved".into());
        }
        let (addr, location) = rest.split_once('@').unwrap_or((rest, ""));
        let peer_addr: SocketAddr = addr
            .trim()
            .parse()
            .map_err(|e| format!("peer address {addr:?}: {e}"))?;
        let (region, zone) = location.split_once('/').unwrap_or((location, ""));
        let region = if region.is_empty() { "default" } else { region };
        let zone = if zone.is_empty() { "default" } else { zone };
        Ok(Member {
            node_id,
            peer_addr,
            region: region.to_string(),
            zone: zone.to_string(),
        })
    }
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ClusterSection {
    pub initial_shards: u32,
    pub split_points: Vec<String>,
    pub replication_factor: u32,
    pub max_offset_ms: u64,
    /// MVCC history kept, in milliseconds: a shard's leader collects versions that no read
    /// newer than `now - gc_ttl_ms` can see (see `gc`). 0 = never collect. Reads (a
    /// transaction's snapshot) older than that fail with `BELOW_GC_THRESHOLD`.
    pub gc_ttl_ms: u64,
    /// How often each node looks for shards it leads with garbage to collect, in milliseconds.
    pub gc_interval_ms: u64,
    /// A prepared multi-shard transaction still locked this long after its prepare (its
    /// coordinator is likely gone) is settled by the shard leader's sweeper, in milliseconds
    /// (see `sweeper`). 0 = no sweeper (readers that meet the locks settle them).
    pub txn_sweep_after_ms: u64,
    /// `<start key>=<region>` rules: the region that should lead each key range (see `home`).
    pub home_regions: Vec<String>,
    /// `<start key>:<constraints>` rules: which members may hold each key range's replicas
    /// (see `constraints`).
    pub replica_constraints: Vec<String>,
    /// How far behind its clock a shard's leader closes timestamps, in milliseconds (see
    /// `meridian_raft::closed_ts`): followers serve reads at or below a closed timestamp, so
    /// this is how stale a follower read usually is. 0 = closed timestamps off (followers
    /// always redirect stale reads to the leader).
    pub closed_ts_lag_ms: u64,
    /// How often a node publishes the closed timestamps of the shards it leads on the side
    /// channel (idle and quiesced shards; busy ones carry them in their log), in milliseconds.
    pub closed_ts_interval_ms: u64,
}

impl Default for ClusterSection {
    fn default() -> Self {
        ClusterSection {
            initial_shards: 8,
            split_points: Vec::new(),
            replication_factor: 3,
            max_offset_ms: 500,
            // 15 minutes, as YugabyteDB's history retention: far longer than any transaction
            // this store runs, short enough that hot keys do not pile up versions.
            gc_ttl_ms: 900_000,
            gc_interval_ms: 60_000,
            // Far beyond a healthy commit (a few consensus rounds, even across regions).
            txn_sweep_after_ms: 10_000,
            home_regions: Vec::new(),
            replica_constraints: Vec::new(),
            // CockroachDB's default target: stale enough that closing never waits on a write
            // in flight across the WAN, fresh enough for dashboards and local reads.
            closed_ts_lag_ms: 3_000,
            closed_ts_interval_ms: 200,
        }
    }
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RaftSection {
    pub heartbeat_interval_ms: u64,
    pub election_timeout_min_ms: u64,
    pub election_timeout_max_ms: u64,
    pub rpc_timeout_ms: u64,
    /// Raft log entries kept behind a snapshot for slow followers.
    pub logs_to_keep_after_snapshot: u64,
    /// Take a snapshot after this many applied entries since the last one.
    pub snapshot_every_entries: u64,
    /// Idle, caught-up shards stop heartbeats and election timers (meridian-raft `quiesce`).
    pub quiesce: bool,
    /// Followers that hear their leader stop their election tickers (meridian-raft `rest`).
    pub rest_followers: bool,
    /// Entries a shard leader keeps in flight before further writes queue and coalesce into
    /// one entry (meridian-raft `proposals`); 0 = off, every write its own entry.
    pub proposals_in_flight: usize,
}

impl RaftSection {
    /// How long a caller waits for one quorum round (or every reachable member's answer) before
    /// it goes on without: two heartbeat intervals, as every replica's round trip is under one
    /// (`meridian_raft::rtt_watch` warns otherwise).
    pub fn round_wait(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.heartbeat_interval_ms.saturating_mul(2))
    }
}

impl Default for RaftSection {
    fn default() -> Self {
        // WAN-sized defaults. openraft waits for each heartbeat's answer for one heartbeat
        // interval, and a leader whose heartbeats time out cannot renew its lease or confirm
        // leadership: with 150 ms, a shard left with replicas 200 ms apart (us-east and
        // ap-south after an eu-west node died) refused every write. So the interval must exceed
        // the longest round trip between a shard's replicas, with room for a busy node: 400 ms
        // covers RTTs up to ~300 ms. Heartbeats stay at most a third of the election timeout
        // (≥ 5× such an RTT). Loopback clusters may lower them.
        RaftSection {
            heartbeat_interval_ms: 400,
            election_timeout_min_ms: 1_500,
            election_timeout_max_ms: 3_000,
            rpc_timeout_ms: 2_000,
            logs_to_keep_after_snapshot: 5_000,
            snapshot_every_entries: 50_000,
            quiesce: true,
            rest_followers: true,
            proposals_in_flight: meridian_raft::proposals::DEFAULT_IN_FLIGHT,
        }
    }
}

/// The file format; every field optional so flags can supply it.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    pub node_id: Option<NodeId>,
    pub region: Option<String>,
    pub zone: Option<String>,
    pub client_addr: Option<String>,
    pub peer_addr: Option<String>,
    /// Where `GET /metrics` is served (Prometheus text); absent = no metrics endpoint.
    pub metrics_addr: Option<String>,
    pub data_dir: Option<PathBuf>,
    pub initial_cluster: Option<Vec<String>>,
    /// Dial overrides for peers, `id=host:port` (see `--peer-dial`).
    pub peer_dial: Option<Vec<String>>,
    pub join: Option<String>,
    pub clock_offset_ms: Option<i64>,
    #[serde(default)]
    pub cluster: ClusterSection,
    #[serde(default)]
    pub raft: RaftSection,
}

/// Flags of `meridian start`; each overrides the file's field of the same name.
#[derive(Clone, Debug, Default, clap::Args)]
pub struct StartArgs {
    /// TOML config file; flags override its fields.
    #[arg(long, short = 'c')]
    pub config: Option<PathBuf>,
    /// This node's id (unique, > 0, never reused).
    #[arg(long)]
    pub node_id: Option<NodeId>,
    /// Region label (placement spreads replicas across regions first).
    #[arg(long)]
    pub region: Option<String>,
    /// Zone label within the region.
    #[arg(long)]
    pub zone: Option<String>,
    /// Address the public gRPC API listens on.
    #[arg(long)]
    pub client_addr: Option<String>,
    /// Address the internal Raft transport listens on.
    #[arg(long)]
    pub peer_addr: Option<String>,
    /// Address to serve the node's metrics on (`GET /metrics`, Prometheus text format over
    /// HTTP); none by default.
    #[arg(long)]
    pub metrics_addr: Option<String>,
    /// Directory for the node's RocksDB and snapshots.
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Founding members, comma-separated `id=peer_addr@region/zone` (same list on every node).
    #[arg(long, value_delimiter = ',')]
    pub initial_cluster: Option<Vec<String>>,
    /// A running member's client address: join its cluster instead of founding one (no
    /// initial_cluster). The node hosts no replicas until moves place some on it.
    #[arg(long)]
    pub join: Option<String>,
    /// Data shards a new cluster is pre-split into.
    #[arg(long)]
    pub initial_shards: Option<u32>,
    /// Largest clock offset tolerated between nodes, in milliseconds. A node whose clock is
    /// more than 80% of it off from a majority of the cluster, on 3 checks 1 s apart, stops
    /// itself with exit status 5.
    #[arg(long)]
    pub max_offset_ms: Option<u64>,
    /// MVCC history kept for reads in the past, in milliseconds (0 = never collect).
    #[arg(long)]
    pub gc_ttl_ms: Option<u64>,
    /// How often a node looks for garbage in the shards it leads, in milliseconds.
    #[arg(long)]
    pub gc_interval_ms: Option<u64>,
    /// Settle multi-shard transactions still locked this long after their prepare (a gone
    /// coordinator), in milliseconds (0 = no sweeper).
    #[arg(long)]
    pub txn_sweep_after_ms: Option<u64>,
    /// Home regions, comma-separated `<start key>=<region>`: the region that should lead the
    /// keys from that start key to the next rule's (same list on every node).
    #[arg(long, value_delimiter = ',')]
    pub home_regions: Option<Vec<String>>,
    /// Replica constraints, `;`-separated `<start key>:<constraints>` rules, as in
    /// `user5:+region=eu-west,-zone=c`: which members may hold the replicas of the keys from
    /// that start key to the next rule's (same list on every node).
    #[arg(long, value_delimiter = ';')]
    pub replica_constraints: Option<Vec<String>>,
    /// How far behind its clock a shard's leader closes timestamps, in milliseconds: the
    /// usual staleness of a follower read (0 = no follower reads).
    #[arg(long)]
    pub closed_ts_lag_ms: Option<u64>,
    /// How often idle shards' closed timestamps are published, in milliseconds.
    #[arg(long)]
    pub closed_ts_interval_ms: Option<u64>,
    /// Raft heartbeat interval in milliseconds; also how long a leader waits for each
    /// heartbeat's answer, so it must exceed the longest round trip between replicas.
    #[arg(long)]
    pub heartbeat_interval_ms: Option<u64>,
    /// Minimum Raft election timeout in milliseconds. The maximum becomes twice this unless
    /// --election-timeout-max-ms is given too (flags override the config file).
    #[arg(long)]
    pub election_timeout_min_ms: Option<u64>,
    /// Maximum Raft election timeout in milliseconds (must exceed the minimum). The leader lease
    /// and the post-restart vote refusal are sized from it.
    #[arg(long)]
    pub election_timeout_max_ms: Option<u64>,
    /// Shift this node's physical clock (testing clock skew), in milliseconds.
    #[arg(long, allow_hyphen_values = true)]
    pub clock_offset_ms: Option<i64>,
    /// Whether idle shards quiesce (stop heartbeats and election timers); default true.
    #[arg(long)]
    pub quiesce: Option<bool>,
    /// Whether followers that hear their leader stop their election tickers (a node-level loop
    /// restarts them before an election could be due); default true.
    #[arg(long)]
    pub rest_followers: Option<bool>,
    /// Raft entries a shard leader keeps in flight before further writes to the shard queue
    /// and coalesce into one entry; 0 = off (every write its own entry: set it while a rolling
    /// upgrade still runs nodes that predate coalescing). Default 2.
    #[arg(long)]
    pub proposals_in_flight: Option<usize>,
    /// Dial overrides for peers, comma-separated `id=host:port`: this node reaches peer `id` at
    /// that address instead of its `initial_cluster` address (e.g. a `meridian-wan` link that
    /// adds the WAN delay between two regions).
    #[arg(long, value_delimiter = ',')]
    pub peer_dial: Option<Vec<String>>,
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

fn parse_addr(field: &str, value: Option<String>) -> Result<SocketAddr, ConfigError> {
    let value = value.ok_or_else(|| err(field, "is required"))?;
    value
        .parse()
        .map_err(|e| err(field, format!("{value:?} is not a socket address: {e}")))
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

    fn validate(file: FileConfig) -> Result<NodeConfig, ConfigError> {
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
        // A linearizable read is served at a clock reading that may lag the leader that chose
        // the threshold by up to max_offset: the history kept must cover that and more.
        if c.gc_ttl_ms != 0 && c.gc_ttl_ms < MIN_GC_TTL_OFFSETS * c.max_offset_ms {
            return Err(err(
                "cluster.gc_ttl_ms",
                format!(
                    "must be 0 (never collect) or at least {MIN_GC_TTL_OFFSETS} x max_offset_ms ({} ms)",
                    MIN_GC_TTL_OFFSETS * c.max_offset_ms
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
            && c.closed_ts_lag_ms < MIN_CLOSED_TS_LAG_INTERVALS * c.closed_ts_interval_ms
        {
            return Err(err(
                "cluster.closed_ts_lag_ms",
                format!(
                    "must be 0 (no follower reads) or at least {MIN_CLOSED_TS_LAG_INTERVALS} x closed_ts_interval_ms ({} ms)",
                    MIN_CLOSED_TS_LAG_INTERVALS * c.closed_ts_interval_ms
                ),
            ));
        }
        // A joining node takes the cluster's rules when it joins.
        let (home_regions, replica_constraints) = match join {
            Some(_) => (Vec::new(), Vec::new()),
            None => crate::home::parse_rules(c, &initial_cluster)?,
        };
        let r = &file.raft;
        if r.heartbeat_interval_ms == 0 || r.heartbeat_interval_ms * 3 > r.election_timeout_min_ms {
            return Err(err(
                "raft.heartbeat_interval_ms",
                "must be > 0 and at most a third of raft.election_timeout_min_ms",
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
mod tests {
    use super::*;

    #[test]
    fn valid_flags_load() {
        let c = NodeConfig::load(&test_args()).unwrap();
        assert_eq!(c.region, "us");
        assert_eq!(c.initial_cluster[1].zone, "b");
    }

    #[test]
    fn errors_name_the_field() {
        let mut a = test_args();
        a.peer_addr = Some("nope".into());
        assert!(NodeConfig::load(&a)
            .unwrap_err()
            .to_string()
            .contains("\"peer_addr\""));
        let mut a = test_args();
        a.initial_cluster = Some(vec!["1=127.0.0.1:7101".into(), "x=1".into()]);
        assert!(NodeConfig::load(&a)
            .unwrap_err()
            .to_string()
            .contains("initial_cluster[1]"));
        let mut a = test_args();
        a.initial_shards = Some(0);
        assert!(NodeConfig::load(&a)
            .unwrap_err()
            .to_string()
            .contains("cluster.initial_shards"));
    }

    #[test]
    fn gc_and_home_region_flags_are_validated() {
        let c = NodeConfig::load(&test_args()).unwrap();
        assert_eq!(
            (c.cluster.gc_ttl_ms, c.cluster.gc_interval_ms),
            (900_000, 60_000)
        );
        let mut a = test_args();
        a.gc_ttl_ms = Some(0);
        assert!(NodeConfig::load(&a).is_ok(), "0 turns GC off");
        // At max_offset 500 ms, the TTL must cover 4 of them.
        for (ttl, ok) in [(1_999, false), (2_000, true)] {
            let mut a = test_args();
            a.gc_ttl_ms = Some(ttl);
            let loaded = NodeConfig::load(&a);
            assert_eq!(loaded.is_ok(), ok, "{ttl}: {loaded:?}");
            if let Err(e) = loaded {
                assert!(e.to_string().contains("cluster.gc_ttl_ms"), "{e}");
            }
        }
        let mut a = test_args();
        a.gc_interval_ms = Some(0);
        assert!(NodeConfig::load(&a)
            .unwrap_err()
            .to_string()
            .contains("cluster.gc_interval_ms"));
        let mut a = test_args();
        a.home_regions = Some(vec!["user5=eu".into(), "=us".into()]);
        let c = NodeConfig::load(&a).unwrap();
        let starts: Vec<&[u8]> = c.home_regions.iter().map(|r| &r.start[..]).collect();
        assert_eq!(starts, [&b""[..], &b"user5"[..]], "sorted by start key");
        a.home_regions = Some(vec!["=mars".into()]);
        assert!(NodeConfig::load(&a)
            .unwrap_err()
            .to_string()
            .contains("cluster.home_regions[0]"));
    }

    #[test]
    fn replica_constraints_are_checked_at_startup() {
        let mut a = test_args();
        a.initial_cluster = Some(vec![
            "1=127.0.0.1:7101@us/a".into(),
            "2=127.0.0.1:7102@eu/b".into(),
            "3=127.0.0.1:7103@ap/a".into(),
            "4=127.0.0.1:7104@us/c".into(),
        ]);
        a.replica_constraints = Some(vec!["user5:-region=eu".into(), ":-zone=c".into()]);
        let c = NodeConfig::load(&a).unwrap();
        let starts: Vec<&[u8]> = c.replica_constraints.iter().map(|r| &r.start[..]).collect();
        assert_eq!(starts, [&b""[..], &b"user5"[..]], "sorted by start key");
        for (rules, field, want) in [
            (
                vec![":+region=mars"],
                "cluster.replica_constraints[0]",
                "no member has",
            ),
            (
                vec!["a:-zone=b", "b:+region=us,+region=eu"],
                "cluster.replica_constraints[1]",
                "cannot both hold",
            ),
            (
                vec!["a:-zone=a"],
                "cluster.replica_constraints[0]",
                "allow 2 member(s)",
            ),
        ] {
            a.replica_constraints = Some(rules.iter().map(|r| r.to_string()).collect());
            let e = NodeConfig::load(&a).unwrap_err().to_string();
            assert!(e.contains(field) && e.contains(want), "{e}");
        }
        // A home the constraints exclude.
        a.replica_constraints = Some(vec![":-region=eu".into()]);
        a.home_regions = Some(vec!["=eu".into()]);
        let e = NodeConfig::load(&a).unwrap_err().to_string();
        assert!(e.contains("allow 0 member(s) in the home region eu"), "{e}");
    }

    /// The closed-timestamp lag is 0 (off) or at least four publication intervals.
    #[test]
    fn closed_ts_flags_are_validated() {
        let c = NodeConfig::load(&test_args()).unwrap();
        assert_eq!(
            (c.cluster.closed_ts_lag_ms, c.cluster.closed_ts_interval_ms),
            (3_000, 200)
        );
        for (lag, interval, ok) in [
            (0, 200, true),
            (799, 200, false),
            (800, 200, true),
            (800, 0, false),
        ] {
            let mut a = test_args();
            a.closed_ts_lag_ms = Some(lag);
            a.closed_ts_interval_ms = Some(interval);
            let loaded = NodeConfig::load(&a);
            assert_eq!(loaded.is_ok(), ok, "{lag}/{interval}: {loaded:?}");
            if let Err(e) = loaded {
                assert!(e.to_string().contains("cluster.closed_ts_"), "{e}");
            }
        }
    }

    /// A joining node names a member instead of listing the founders; giving both is an error,
    /// and the location it does not give defaults as an `initial_cluster` entry's does.
    #[test]
    fn join_replaces_initial_cluster() {
        let mut a = test_args();
        a.join = Some("127.0.0.1:7001".into());
        let e = NodeConfig::load(&a).unwrap_err().to_string();
        assert!(e.contains("\"join\"") && e.contains("not both"), "{e}");
        a.initial_cluster = None;
        a.node_id = Some(4);
        a.region = Some("eu".into());
        let c = NodeConfig::load(&a).unwrap();
        assert_eq!(c.join.as_deref(), Some("127.0.0.1:7001"));
        assert!(c.initial_cluster.is_empty());
        assert_eq!((c.region.as_str(), c.zone.as_str()), ("eu", "default"));
        a.join = None;
        let e = NodeConfig::load(&a).unwrap_err().to_string();
        assert!(e.contains("initial_cluster") && e.contains("join"), "{e}");
    }

    #[test]
    fn peer_dial_overrides_are_validated() {
        let mut a = test_args();
        a.peer_dial = Some(vec!["2=127.0.0.1:9002".into()]);
        let c = NodeConfig::load(&a).unwrap();
        assert_eq!(c.peer_dial[&2].to_string(), "127.0.0.1:9002");
        for (bad, needle) in [
            ("9=127.0.0.1:1", "not in initial_cluster"),
            ("2", "id=host:port"),
            ("x=127.0.0.1:1", "not a node id"),
            ("2=nowhere", "ip:port"),
        ] {
            let mut a = test_args();
            a.peer_dial = Some(vec![bad.into()]);
            let e = NodeConfig::load(&a).unwrap_err().to_string();
            assert!(
                e.contains("peer_dial[0]") && e.contains(needle),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn repeated_or_empty_split_points_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        let load = |points: &str| {
            std::fs::write(&path, format!("[cluster]\nsplit_points = {points}\n")).unwrap();
            let mut a = test_args();
            a.config = Some(path.clone());
            NodeConfig::load(&a)
        };
        assert!(load(r#"["g", "p"]"#).is_ok());
        let e = load(r#"["g", "p", "g"]"#).unwrap_err().to_string();
        assert!(
            e.contains("cluster.split_points[2]") && e.contains("twice"),
            "{e}"
        );
        let e = load(r#"["g", ""]"#).unwrap_err().to_string();
        assert!(
            e.contains("cluster.split_points[1]") && e.contains("empty"),
            "{e}"
        );
    }

    #[test]
    fn election_timeout_min_flag_sets_the_maximum_to_twice_it() {
        let mut a = test_args();
        a.election_timeout_min_ms = Some(600);
        a.heartbeat_interval_ms = Some(100);
        let c = NodeConfig::load(&a).unwrap();
        assert_eq!(c.raft.election_timeout_min_ms, 600);
        assert_eq!(c.raft.election_timeout_max_ms, 1_200);
        a.election_timeout_max_ms = Some(900);
        assert_eq!(
            NodeConfig::load(&a).unwrap().raft.election_timeout_max_ms,
            900
        );
    }

    #[test]
    fn proposals_in_flight_defaults_to_two_and_is_bounded() {
        let mut a = test_args();
        assert_eq!(NodeConfig::load(&a).unwrap().raft.proposals_in_flight, 2);
        a.proposals_in_flight = Some(0);
        assert_eq!(NodeConfig::load(&a).unwrap().raft.proposals_in_flight, 0);
        a.proposals_in_flight = Some(MAX_PROPOSALS_IN_FLIGHT + 1);
        let e = NodeConfig::load(&a).unwrap_err().to_string();
        assert!(e.contains("raft.proposals_in_flight"), "{e}");
    }

    #[test]
    fn election_timeout_min_at_or_above_max_is_rejected() {
        let mut a = test_args();
        a.election_timeout_min_ms = Some(600);
        a.election_timeout_max_ms = Some(600);
        a.heartbeat_interval_ms = Some(100);
        let e = NodeConfig::load(&a).unwrap_err().to_string();
        assert!(e.contains("raft.election_timeout_max_ms"), "{e}");
        assert!(e.contains("must exceed"), "{e}");
    }

    #[test]
    fn unknown_file_fields_are_rejected() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(&path, "node_id = 1\nbogus = 2\n").unwrap();
        let a = StartArgs {
            config: Some(path),
            ..Default::default()
        };
        let e = NodeConfig::load(&a).unwrap_err().to_string();
        assert!(e.contains("bogus"), "{e}");
    }
}
