//! The config file's format: `FileConfig`, whose fields are all optional so flags can supply
//! them, and its `[cluster]` and `[raft]` sections with their defaults (and why they are what
//! they are). Unknown fields are refused; nothing here is validated (see `validate`).

use meridian_types::NodeId;
use serde::Deserialize;
use std::path::PathBuf;

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
