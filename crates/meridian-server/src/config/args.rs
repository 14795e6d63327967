//! The flags of `meridian start`. Each field's doc comment is its `--help` text; each flag
//! overrides the config file's field of the same name (see `NodeConfig::load`).

use meridian_types::NodeId;
use std::path::PathBuf;

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
    /// Largest clock offset tolerated between nodes, in milliseconds (1 to 60000). A node
    /// whose clock is more than 80% of it off from a majority of the cluster, on 3 checks 1 s
    /// apart, stops itself with exit status 5.
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
