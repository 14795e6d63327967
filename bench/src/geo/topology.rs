//! The geo run's cluster: three regions, one to three nodes each, a WAN between them, and one
//! client group per region.
//!
//! ```text
//!   region    nodes     keys (two data shards each, homed there)     client group
//!   us-east   1 4 7     us-east/a…  us-east/b…                        dials every node via its
//!   eu-west   2 5 8     eu-west/a…  eu-west/b…                        region's links
//!   ap-south  3 6 9     ap-south/a… ap-south/b…
//! ```
//!
//! Node `i` sits in region `REGIONS[(i - 1) % 3]`, zone `a`, `b`, `c` for its first, second,
//! third node there; nodes 1, 2, 3 exist in every layout (`--nodes-per-region` 1 to 3). With
//! `--survive zone` every data shard's home rule ends in `:zone`, so its three replicas in the
//! home region vote and its replicas elsewhere are learners (see the server's `survival`).
//!
//! The WAN is `meridian-wan`'s links run in this process: one per ordered node pair (each node
//! dials its peers through them, `--peer-dial`; two nodes of one region get a link without
//! delay) and one per (client region, node) (clients dial through them,
//! `ClientConfig::dial`), with the one-way delay of the latency matrix. Ports: nodes' clients
//! P+1..9, Raft P+101..109, peer links from P+200 (at most 72), client links from P+300 (at
//! most 27). Nodes use the server's WAN-sized Raft timings. Operator calls (status, leader
//! transfers) go straight to the nodes, without delay, so they do not disturb what is
//! measured.

use anyhow::{bail, Context};
use meridian_cli::local_cluster::{LocalCluster, LocalClusterConfig};
use meridian_client::proto::StatusResponse;
use meridian_client::{fetch_status, Client, ClientConfig};
use meridian_wan::matrix::{format_dial_map, plan_client_links, plan_peer_links};
use meridian_wan::{LatencyMatrix, LinkOptions, NodeEndpoint, Wan};

use super::args::GeoArgs;
use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;
use std::time::{Duration, Instant};

/// Region of node `i` is `REGIONS[i - 1]`: `LocalCluster` labels its nodes from this list.
pub use meridian_cli::local_cluster::REGIONS;
/// The default matrix's round trips, in milliseconds, before `--scale`.
pub const RTT_MS: [(&str, &str, f64); 3] = [
    ("us-east", "eu-west", 80.0),
    ("eu-west", "ap-south", 130.0),
    ("us-east", "ap-south", 200.0),
];
/// Keys per data shard the workloads pick from (uniformly).
pub const KEYS_PER_SHARD: u64 = 1_000;
/// Timeout of one operator status call.
const STATUS_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the metadata shard's log must stay unchanged before a phase.
const META_STABLE: Duration = Duration::from_secs(3);
/// How often waits poll the cluster.
const POLL: Duration = Duration::from_millis(250);

/// The region of node `node` (1-based id): `LocalCluster`'s default labels.
pub use meridian_cli::local_cluster::default_region as region_of;

/// The first node in `region` (1-based id), which every layout has.
pub fn node_of(region: &str) -> u64 {
    REGIONS
        .iter()
        .position(|r| *r == region)
        .map_or(0, |i| i as u64 + 1)
}

/// The round trip between two regions, in milliseconds, at `scale` (0 within a region).
pub fn rtt_ms(a: &str, b: &str, scale: f64) -> f64 {
    RTT_MS
        .iter()
        .find(|(x, y, _)| (*x == a && *y == b) || (*x == b && *y == a))
        .map_or(0.0, |(_, _, rtt)| rtt * scale)
}

/// The key `n` of region `region`'s shard `shard` (`'a'` or `'b'`).
pub fn key(region: &str, shard: char, n: u64) -> String {
    format!("{region}/{shard}{n:06}")
}

/// A running geo cluster.
pub struct GeoCluster {
    pub cluster: LocalCluster,
    _wan: Wan,
    /// Region → its client group's client (Meridian's own timestamps).
    pub clients: BTreeMap<String, Client>,
    /// Region → a client in oracle mode (`ClientConfig::timestamp_oracle`).
    pub oracle_clients: BTreeMap<String, Client>,
    /// Every node's client address, dialled directly (no delay).
    direct: Vec<String>,
}

/// The node config file: split points giving each region two shards, and their home regions
/// with survival goal `survive` (`region` or `zone`).
/// Raft timings for the matrix at `scale`: `(heartbeat, election minimum, election maximum)`
/// in milliseconds. openraft waits for each heartbeat's answer one heartbeat interval, so the
/// interval stays 1.5× above the longest round trip (the server's defaults, 400 / 1,500 /
/// 3,000, while they do), and elections 3× to 6× the interval.
pub fn raft_timings(scale: f64) -> (u64, u64, u64) {
    let longest = RTT_MS
        .iter()
        .map(|(_, _, rtt)| rtt * scale)
        .fold(0.0, f64::max);
    let heartbeat = ((1.5 * longest).ceil() as u64).max(400);
    let election_min = (3 * heartbeat).max(1_500);
    (heartbeat, election_min, 2 * election_min)
}

fn config_file(survive: &str, scale: f64) -> String {
    let mut splits = Vec::new();
    let mut homes = Vec::new();
    let mut by_key: Vec<&str> = REGIONS.to_vec();
    by_key.sort_unstable();
    for (i, region) in by_key.iter().enumerate() {
        // The first region's first shard starts at the beginning of the keyspace.
        if i > 0 {
            splits.push(format!("\"{region}/\""));
        }
        splits.push(format!("\"{region}/b\""));
        let start = if i == 0 {
            String::new()
        } else {
            format!("{region}/")
        };
        let goal = if survive == "zone" { ":zone" } else { "" };
        homes.push(format!("\"{start}={region}{goal}\""));
    }
    let (heartbeat, election_min, election_max) = raft_timings(scale);
    format!(
        "[cluster]\nsplit_points = [{}]\nhome_regions = [{}]\n\n[raft]\n\
         heartbeat_interval_ms = {heartbeat}\nelection_timeout_min_ms = {election_min}\n\
         election_timeout_max_ms = {election_max}\n",
        splits.join(", "),
        homes.join(", ")
    )
}

impl GeoCluster {
    /// Starts the WAN links, the nodes (`args.nodes_per_region` per region) and the clients;
    /// waits until every shard has a leader.
    pub async fn start(
        binary: &Path,
        data_dir: &Path,
        args: &GeoArgs,
        ready: Duration,
    ) -> anyhow::Result<GeoCluster> {
        let (base_port, scale) = (args.base_port, args.scale);
        let nodes = (REGIONS.len() * args.nodes_per_region) as u16;
        let ip = IpAddr::V4(Ipv4Addr::LOCALHOST);
        let mut matrix = LatencyMatrix::new(Duration::ZERO);
        for (a, b, rtt) in RTT_MS {
            matrix.set_rtt(a, b, Duration::from_secs_f64(rtt * scale / 1_000.0))?;
        }
        let endpoint = |offset: u16| -> Vec<NodeEndpoint> {
            (1..=nodes)
                .map(|i| NodeEndpoint {
                    id: u64::from(i),
                    region: region_of(u64::from(i)).to_string(),
                    addr: SocketAddr::new(ip, base_port + offset + i),
                })
                .collect()
        };
        let peers = plan_peer_links(&matrix, &endpoint(100), ip, base_port + 200)?;
        let regions: Vec<String> = REGIONS.iter().map(|r| r.to_string()).collect();
        let clients = plan_client_links(&matrix, &regions, &endpoint(0), ip, base_port + 300)?;
        let mut links = peers.links.clone();
        links.extend(clients.links.clone());
        let wan = Wan::start(links, &LinkOptions::default())
            .await
            .context("starting the WAN links")?;

        std::fs::create_dir_all(data_dir)
            .with_context(|| format!("creating {}", data_dir.display()))?;
        let config_path = data_dir.join("geo.toml");
        std::fs::write(&config_path, config_file(&args.survive, args.scale))
            .with_context(|| format!("writing {}", config_path.display()))?;
        let mut config = LocalClusterConfig::new(binary, usize::from(nodes), base_port, data_dir);
        for id in 1..=u64::from(nodes) {
            let zone = ["a", "b", "c"][(id as usize - 1) / REGIONS.len()];
            config = config.node_labels(id, region_of(id), zone);
        }
        // The server's own (WAN-sized) Raft timings, not the loopback ones.
        config.common_args = vec!["--config".into(), config_path.display().to_string()];
        for (id, dial) in &peers.dial_maps {
            config = config.node_args(*id, ["--peer-dial".to_string(), format_dial_map(dial)]);
        }
        let cluster = LocalCluster::start(config)?;
        cluster
            .wait_ready(ready)
            .await
            .context("waiting for every shard to elect a leader")?;

        let direct = cluster.endpoints();
        let mut geo = GeoCluster {
            cluster,
            _wan: wan,
            clients: BTreeMap::new(),
            oracle_clients: BTreeMap::new(),
            direct,
        };
        for region in REGIONS {
            let node = node_of(region);
            let mut config = ClientConfig::new([geo.cluster.client_addr(node)?]);
            config.region = Some(region.to_string());
            config.call_timeout = Duration::from_secs(30);
            config.rpc_timeout = Duration::from_secs(10);
            for (id, link) in &clients.dial_maps[region] {
                config
                    .dial
                    .insert(geo.cluster.client_addr(*id)?, link.to_string());
            }
            let client = Client::connect(config.clone())
                .await
                .with_context(|| format!("connecting the {region} client"))?;
            config.timestamp_oracle = true;
            let oracle = Client::connect(config)
                .await
                .with_context(|| format!("connecting the {region} oracle-mode client"))?;
            geo.clients.insert(region.to_string(), client);
            geo.oracle_clients.insert(region.to_string(), oracle);
        }
        Ok(geo)
    }

    /// The status as the first live node sees it (directly).
    pub async fn status(&self) -> anyhow::Result<StatusResponse> {
        let mut last = None;
        for (i, address) in self.direct.iter().enumerate() {
            if !self.cluster.is_running(i as u64 + 1)? {
                continue;
            }
            match fetch_status(address, STATUS_TIMEOUT).await {
                Ok(status) => return Ok(status),
                Err(error) => last = Some(error),
            }
        }
        bail!("no node answered its status: {last:?}")
    }

    /// The region of `node` in `status`.
    fn region_in(status: &StatusResponse, node: u64) -> Option<&str> {
        status
            .nodes
            .iter()
            .find(|n| n.node_id == node)
            .map(|n| n.region.as_str())
    }

    /// Waits until every data shard is led from its home region (the leader-follow loop) and,
    /// under zone survival, has voters there only (the survival step).
    pub async fn wait_leaders_home(&self, timeout: Duration) -> anyhow::Result<()> {
        let give_up = Instant::now() + timeout;
        loop {
            // Every node's view combined: with more nodes than replicas, no node hosts every
            // shard, and a node names leaders only for those it hosts.
            let Some((status, _, _)) = self.cluster.probe().await else {
                bail!("no node answered its status");
            };
            let away: Vec<u64> = status
                .shards
                .iter()
                .filter(|s| s.shard_id != 0 && !s.home_region.is_empty())
                .filter(|s| Self::region_in(&status, s.leader_id) != Some(s.home_region.as_str()))
                .map(|s| s.shard_id)
                .collect();
            let mut voting_abroad = Vec::new();
            if away.is_empty() {
                for shard in status.shards.iter().filter(|s| s.survival == "zone") {
                    if !self.votes_at_home(shard.shard_id, shard.leader_id).await {
                        voting_abroad.push(shard.shard_id);
                    }
                }
                if voting_abroad.is_empty() {
                    return Ok(());
                }
            }
            if Instant::now() >= give_up {
                bail!(
                    "after {timeout:?}: shards {away:?} not led from their home regions, shards \
                     {voting_abroad:?} (zone survival) with voters outside them"
                );
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Whether `shard`'s leader `leader` reports voters in the shard's home region only, not
    /// joint (zone survival's roles reached).
    async fn votes_at_home(&self, shard: u64, leader: u64) -> bool {
        let Some(address) = self.direct.get((leader as usize).wrapping_sub(1)) else {
            return false;
        };
        let Ok(status) = fetch_status(address, STATUS_TIMEOUT).await else {
            return false;
        };
        status
            .shards
            .iter()
            .find(|s| s.shard_id == shard)
            .is_some_and(|s| {
                !s.joint
                    && !s.voters.is_empty()
                    && s.voters.iter().all(|v| region_of(*v) == s.home_region)
            })
    }

    /// The metadata shard's leader.
    pub async fn meta_leader(&self) -> anyhow::Result<u64> {
        let status = self.status().await?;
        Ok(status
            .shards
            .iter()
            .find(|s| s.shard_id == 0)
            .map_or(0, |s| s.leader_id))
    }

    /// Moves the metadata shard's leadership to `node`.
    pub async fn move_meta_leader(&self, node: u64) -> anyhow::Result<()> {
        let mut config = ClientConfig::new(self.direct.clone());
        config.call_timeout = Duration::from_secs(60);
        let admin = Client::connect(config).await?;
        admin
            .transfer_leader(0, node)
            .await
            .with_context(|| format!("moving the metadata shard's leader to node {node}"))?;
        Ok(())
    }

    /// Waits until the metadata shard has a leader other than `not`.
    pub async fn wait_meta_leader_not(&self, not: u64, timeout: Duration) -> anyhow::Result<u64> {
        let give_up = Instant::now() + timeout;
        loop {
            if let Ok(leader) = self.meta_leader().await {
                if leader != 0 && leader != not {
                    return Ok(leader);
                }
            }
            if Instant::now() >= give_up {
                bail!("the metadata shard has no new leader after {timeout:?}");
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Waits until every running node reports the same last log index for the metadata shard
    /// and it has not changed for [`META_STABLE`], so the entries a leader change appends (a
    /// new term's blank entry, what the new leader writes after a failover) are not counted
    /// against the phase after it.
    pub async fn wait_meta_settled(&self, timeout: Duration) -> anyhow::Result<()> {
        let give_up = Instant::now() + timeout;
        let mut seen = self.meta_log().await?;
        let mut since = Instant::now();
        loop {
            tokio::time::sleep(POLL).await;
            let now = self.meta_log().await?;
            if now != seen {
                seen = now;
                since = Instant::now();
            } else if seen.values().min() == seen.values().max() && since.elapsed() >= META_STABLE {
                return Ok(());
            }
            if Instant::now() >= give_up {
                bail!("the metadata shard's log did not settle in {timeout:?}: {seen:?}");
            }
        }
    }

    /// The metadata shard's last log index and term on every running node holding a replica
    /// of it (node id → (index, term)).
    pub async fn meta_log(&self) -> anyhow::Result<BTreeMap<u64, (u64, u64)>> {
        let mut out = BTreeMap::new();
        for (i, address) in self.direct.iter().enumerate() {
            let node = i as u64 + 1;
            if !self.cluster.is_running(node)? {
                continue;
            }
            let status = fetch_status(address, STATUS_TIMEOUT).await?;
            // Only the metadata shard's replicas have its log.
            if let Some(meta) = status
                .shards
                .iter()
                .find(|s| s.shard_id == 0 && s.replicas.contains(&node))
            {
                out.insert(node, (meta.last_log_index, meta.term));
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_region_gets_two_shards_homed_there() {
        let text = config_file("region", 1.0);
        assert_eq!(
            text,
            "[cluster]\nsplit_points = [\"ap-south/b\", \"eu-west/\", \"eu-west/b\", \
             \"us-east/\", \"us-east/b\"]\nhome_regions = [\"=ap-south\", \
             \"eu-west/=eu-west\", \"us-east/=us-east\"]\n\n[raft]\n\
             heartbeat_interval_ms = 400\nelection_timeout_min_ms = 1500\n\
             election_timeout_max_ms = 3000\n"
        );
        // Every region's keys fall in its two shards: a… below its b split, b… above it.
        for region in REGIONS {
            assert!(key(region, 'a', 7) < format!("{region}/b"));
            assert!(key(region, 'b', 7) >= format!("{region}/b"));
        }
    }

    #[test]
    fn raft_timings_grow_with_the_scaled_round_trips() {
        // Scale 1: the server's defaults (the longest round trip, 200 ms, is below 400 / 1.5).
        assert_eq!(raft_timings(1.0), (400, 1_500, 3_000));
        assert_eq!(raft_timings(0.5), (400, 1_500, 3_000));
        // Scale 5: 1,000 ms round trips need 1,500 ms heartbeats and elections 3× that.
        assert_eq!(raft_timings(5.0), (1_500, 4_500, 9_000));
        for scale in [1.0, 2.0, 3.5, 10.0] {
            let (heartbeat, min, max) = raft_timings(scale);
            assert!(heartbeat as f64 >= 1.5 * 200.0 * scale && 3 * heartbeat <= min && min < max);
        }
    }

    #[test]
    fn zone_survival_marks_every_home_rule() {
        let text = config_file("zone", 1.0);
        assert!(
            text.contains(
                "home_regions = [\"=ap-south:zone\", \"eu-west/=eu-west:zone\", \
                           \"us-east/=us-east:zone\"]"
            ),
            "{text}"
        );
    }

    #[test]
    fn round_trips_follow_the_matrix() {
        assert_eq!(rtt_ms("eu-west", "us-east", 1.0), 80.0);
        assert_eq!(rtt_ms("ap-south", "us-east", 0.5), 100.0);
        assert_eq!(rtt_ms("eu-west", "eu-west", 1.0), 0.0);
        assert_eq!(node_of("ap-south"), 3);
        assert_eq!(
            (region_of(1), region_of(5), region_of(9)),
            ("us-east", "eu-west", "ap-south")
        );
    }
}
