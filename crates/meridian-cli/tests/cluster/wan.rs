//! Cluster test over an emulated WAN: three nodes in three regions whose every peer and client
//! connection crosses a `meridian-wan` link. Writes and reads pay the cross-region round trips
//! (checked as lower bounds), a region cut off from the other two does not stop them committing,
//! and after the heal the cut-off node catches up.
//!
//! ```text
//!   node 1 us-east ──peer-1-to-2 (20 ms each way)──► node 2 eu-west
//!        │  ▲                                          │  ▲
//!        │  └──────────── peer-2-to-1 ◄────────────────┘  │   (one link per ordered pair,
//!        └─ peer-1-to-3 (50 ms) ─► node 3 ap-south ◄──────┘    32.5 ms eu-west↔ap-south)
//!
//!   client in region R ──client-R-to-j──► node j     (0 ms when R is node j's region)
//! ```
//!
//! The round trips are half the emulator's default matrix (40/65/100 ms instead of 80/130/200)
//! to keep the test short. Only lower bounds are asserted: a busy 2-core machine can make
//! anything slower, never faster than the emulated delay.

use crate::common::*;
use bytes::Bytes;
use meridian_cli::demo::keys_across_shards;
use meridian_cli::local_cluster::REGIONS;
use meridian_cli::LocalCluster;
use meridian_client::proto::StatusResponse;
use meridian_client::{fetch_status, Client, ClientConfig};
use meridian_wan::control::{execute, Command};
use meridian_wan::matrix::{format_dial_map, plan_client_links, plan_peer_links, ClientPlan};
use meridian_wan::{LatencyMatrix, LinkOptions, NodeEndpoint, Wan};
use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

/// Nodes at 22401..22403 (client) and 22501..22503 (Raft).
const BASE_PORT: u16 = 22_400;
/// Six peer links, one per ordered node pair: 22600..22605.
const PEER_LINK_BASE_PORT: u16 = 22_600;
/// Nine client links, one per (client region, node): 22620..22628.
const CLIENT_LINK_BASE_PORT: u16 = 22_620;
const LOOPBACK: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);
const SHARDS: u32 = 6;
/// Operations per (client region, shard, kind); the bound is checked on the fastest.
const SAMPLES: usize = 4;
/// Round trips between regions in milliseconds: the default matrix scaled by 0.5.
const RTT_MS: [(&str, &str, u64); 3] = [
    ("us-east", "eu-west", 40),
    ("eu-west", "ap-south", 65),
    ("us-east", "ap-south", 100),
];
/// The region cut off from the other two in the partition step (node 3's).
const ISOLATED_REGION: &str = "ap-south";
const STATUS_TIMEOUT: Duration = Duration::from_secs(2);
/// Bound on the isolated node applying everything the majority committed without it.
const CATCH_UP_TIMEOUT: Duration = Duration::from_secs(60);
/// Attempts at measuring one shard while its leader stays put.
const MEASURE_ATTEMPTS: usize = 3;

#[test]
fn wan_latency_is_paid_and_a_cut_off_region_catches_up() {
    run_scenario(scenario());
}

fn matrix() -> LatencyMatrix {
    let mut matrix = LatencyMatrix::new(Duration::ZERO);
    for (a, b, rtt_ms) in RTT_MS {
        matrix
            .set_rtt(a, b, Duration::from_millis(rtt_ms))
            .expect("valid regions");
    }
    matrix
}

fn region_of(node_id: u64) -> &'static str {
    REGIONS[(node_id as usize - 1) % REGIONS.len()]
}

/// The emulated round trip between two regions (0 within one).
fn rtt(a: &str, b: &str) -> Duration {
    2 * matrix().one_way(a, b).expect("known regions")
}

/// The fastest quorum round from a leader in `region`: with three replicas in three regions,
/// one follower's acknowledgement makes a majority, so the nearest other region decides.
fn quorum_rtt(region: &str) -> Duration {
    REGIONS
        .iter()
        .filter(|other| **other != region)
        .map(|other| rtt(region, other))
        .min()
        .expect("other regions")
}

/// A client sitting in `region`: every node is dialled through that region's link to it.
async fn region_client(
    cluster: &LocalCluster,
    plan: &ClientPlan,
    region: &str,
    call_timeout: Duration,
) -> Client {
    let mut config = ClientConfig::new(cluster.endpoints());
    config.call_timeout = call_timeout;
    config.rpc_timeout = Duration::from_secs(2).min(call_timeout);
    for id in cluster.node_ids() {
        let link = plan.dial_maps[region][&id];
        config
            .dial
            .insert(cluster.client_addr(id).unwrap(), link.to_string());
    }
    Client::connect(config)
        .await
        .unwrap_or_else(|e| panic!("client in {region}: {e}"))
}

/// Each node's own status, asked directly (not through the emulated WAN).
async fn statuses(cluster: &LocalCluster) -> BTreeMap<u64, StatusResponse> {
    let mut out = BTreeMap::new();
    for id in cluster.node_ids() {
        if let Ok(status) = fetch_status(&cluster.client_addr(id).unwrap(), STATUS_TIMEOUT).await {
            out.insert(id, status);
        }
    }
    out
}

/// Shard → (leader, its own row's applied index), from the nodes that claim leadership (the
/// highest term wins if two do).
async fn leaders(cluster: &LocalCluster) -> BTreeMap<u64, (u64, u64)> {
    let mut best: BTreeMap<u64, (u64, u64, u64)> = BTreeMap::new();
    for (id, status) in statuses(cluster).await {
        for shard in status.shards.iter().filter(|s| s.leader_id == id) {
            let entry = best.entry(shard.shard_id).or_insert((0, 0, 0));
            if shard.term >= entry.0 {
                *entry = (shard.term, id, shard.applied_index);
            }
        }
    }
    best.into_iter()
        .map(|(shard, (_, leader, applied))| (shard, (leader, applied)))
        .collect()
}

/// The fastest put and get of `SAMPLES` each from `client` to `key`, and the leader that served
/// them (unchanged from before the first to after the last operation).
async fn measure(
    cluster: &LocalCluster,
    client: &Client,
    key: &Bytes,
    shard: u64,
) -> (u64, Duration, Duration) {
    for attempt in 1..=MEASURE_ATTEMPTS {
        let before = leaders(cluster).await.get(&shard).map(|l| l.0);
        let (mut put_min, mut get_min) = (Duration::MAX, Duration::MAX);
        for sample in 0..SAMPLES {
            let value = Bytes::from(format!("v{attempt}-{sample}"));
            let started = Instant::now();
            client
                .put(key.clone(), value.clone())
                .await
                .unwrap_or_else(|e| panic!("put to shard {shard}: {e}"));
            put_min = put_min.min(started.elapsed());
            let started = Instant::now();
            let read = client
                .get(key.clone())
                .await
                .unwrap_or_else(|e| panic!("get from shard {shard}: {e}"));
            get_min = get_min.min(started.elapsed());
            assert_eq!(read, Some(value), "shard {shard} reads its last write");
        }
        let after = leaders(cluster).await.get(&shard).map(|l| l.0);
        match (before, after) {
            (Some(before), Some(after)) if before == after => return (before, put_min, get_min),
            _ => {
                eprintln!("shard {shard}: leader moved ({before:?} -> {after:?}); measuring again")
            }
        }
    }
    panic!("shard {shard}'s leader kept moving over {MEASURE_ATTEMPTS} measurements");
}

async fn scenario() {
    let dir = tempfile::tempdir().unwrap();

    // 1. The WAN: peer links between every ordered node pair, client links from every region
    //    to every node. Links are up before the nodes; connects meanwhile just fail and retry.
    let peer_nodes: Vec<NodeEndpoint> = (1..=3u64)
        .map(|id| NodeEndpoint {
            id,
            region: region_of(id).to_string(),
            addr: format!("127.0.0.1:{}", BASE_PORT as u64 + 100 + id)
                .parse()
                .unwrap(),
        })
        .collect();
    let client_nodes: Vec<NodeEndpoint> = peer_nodes
        .iter()
        .map(|node| NodeEndpoint {
            addr: format!("127.0.0.1:{}", BASE_PORT as u64 + node.id)
                .parse()
                .unwrap(),
            ..node.clone()
        })
        .collect();
    let regions: Vec<String> = REGIONS.iter().map(|r| r.to_string()).collect();
    let peer_plan =
        plan_peer_links(&matrix(), &peer_nodes, LOOPBACK, PEER_LINK_BASE_PORT).expect("peer plan");
    let client_plan = plan_client_links(
        &matrix(),
        &regions,
        &client_nodes,
        LOOPBACK,
        CLIENT_LINK_BASE_PORT,
    )
    .expect("client plan");
    let links = peer_plan
        .links
        .iter()
        .chain(&client_plan.links)
        .cloned()
        .collect::<Vec<_>>();
    let wan = Wan::start(links, &LinkOptions::default())
        .await
        .expect("starting the WAN links");

    // 2. The nodes, each dialling its peers through its own links.
    let dial_args: Vec<(u64, [String; 2])> = peer_plan
        .dial_maps
        .iter()
        .map(|(id, map)| (*id, ["--peer-dial".to_string(), format_dial_map(map)]))
        .collect();
    let dial_refs: Vec<(u64, Vec<&str>)> = dial_args
        .iter()
        .map(|(id, args)| (*id, args.iter().map(String::as_str).collect()))
        .collect();
    let per_node: Vec<(u64, &[&str])> = dial_refs
        .iter()
        .map(|(id, args)| (*id, args.as_slice()))
        .collect();
    let cluster = start_cluster(BASE_PORT, dir.path(), SHARDS, &per_node);
    cluster
        .wait_ready(READY_TIMEOUT)
        .await
        .expect("cluster ready");
    for id in cluster.node_ids() {
        let log = cluster.log_contents(id).unwrap();
        assert!(
            log.contains("dialling a peer through an override"),
            "node {id} does not use its --peer-dial links"
        );
    }

    // 3. From each region, puts and linearizable gets on every shard; the fastest of each must
    //    pay the emulated round trips.
    let mut clients = BTreeMap::new();
    for region in REGIONS {
        let client = region_client(&cluster, &client_plan, region, Duration::from_secs(20)).await;
        clients.insert(region, client);
    }
    let map = clients["us-east"].shard_map();
    let keys = keys_across_shards(&map, SHARDS as usize);
    let mut cross_region = 0;
    for region in REGIONS {
        let client = &clients[region];
        for key in &keys {
            let shard = client.route(key).expect("routable key").shard_id;
            let (leader, put_min, get_min) = measure(&cluster, client, key, shard).await;
            let leader_region = region_of(leader);
            let to_leader = rtt(region, leader_region);
            let put_bound = to_leader + quorum_rtt(leader_region);
            eprintln!(
                "client {region:>8} -> shard {shard} led in {leader_region:>8}: \
                 put min {put_min:>10.1?} (bound {put_bound:?}), get min {get_min:>10.1?} (bound {to_leader:?})"
            );
            assert!(
                put_min >= put_bound,
                "a put from {region} to shard {shard} (leader in {leader_region}) took {put_min:?}, \
                 less than the client-leader round trip plus the leader's quorum round trip \
                 ({put_bound:?}): the traffic is not crossing the WAN links"
            );
            assert!(
                get_min >= to_leader,
                "a get from {region} to shard {shard} (leader in {leader_region}) took {get_min:?}, \
                 less than the client-leader round trip ({to_leader:?})"
            );
            cross_region += usize::from(region != leader_region);
        }
    }
    assert!(cross_region > 0, "no operation crossed regions");

    // 4. Cut ap-south off from the other regions (its own client link stays up). The majority
    //    keeps committing on every shard, electing new leaders where node 3 led.
    let isolated_node = cluster
        .node_ids()
        .into_iter()
        .find(|id| region_of(*id) == ISOLATED_REGION)
        .expect("a node in the isolated region");
    let others: Vec<&str> = REGIONS
        .iter()
        .copied()
        .filter(|r| *r != ISOLATED_REGION)
        .collect();
    let led_by_isolated = leaders(&cluster)
        .await
        .values()
        .filter(|(leader, _)| *leader == isolated_node)
        .count();
    // Made before the cut, so it has the shard map; its calls give up after 3 s.
    let isolated_client = region_client(
        &cluster,
        &client_plan,
        ISOLATED_REGION,
        Duration::from_secs(3),
    )
    .await;
    for other in &others {
        let command = Command::DropRegion(ISOLATED_REGION.to_string(), other.to_string());
        let answer = execute(&wan, &command).expect("drop-region");
        eprintln!("{answer}");
    }
    let cut_at = Instant::now();
    let mut written = Vec::new();
    for region in &others {
        for key in &keys {
            let value = Bytes::from(format!("during-partition-from-{region}"));
            clients[region]
                .put(key.clone(), value.clone())
                .await
                .unwrap_or_else(|e| panic!("majority write from {region} during the cut: {e}"));
            written.push((key.clone(), value));
        }
    }
    eprintln!(
        "node {isolated_node} ({ISOLATED_REGION}) led {led_by_isolated} shards; \
         the majority committed a write to every shard {:?} after the cut",
        cut_at.elapsed()
    );
    // The cut-off region cannot commit: a write from there fails within its deadline.
    let probe = isolated_client
        .put(
            Bytes::from_static(b"isolated-probe"),
            Bytes::from_static(b"x"),
        )
        .await;
    assert!(
        probe.is_err(),
        "a write from the cut-off region committed: {probe:?}"
    );
    // Where each shard stands once the majority has written it: the isolated node must reach it.
    let targets = leaders(&cluster).await;
    let data_shards: Vec<u64> = keys
        .iter()
        .map(|key| clients["us-east"].route(key).expect("routable").shard_id)
        .collect();
    for (shard, (leader, _)) in targets.iter().filter(|(s, _)| data_shards.contains(s)) {
        assert_ne!(
            *leader, isolated_node,
            "shard {shard} is still led by the cut-off node"
        );
    }

    // 5. Heal; the isolated node applies everything the majority committed without it, and a
    //    client in its region reads the majority's writes and writes again.
    for other in &others {
        let command = Command::HealRegion(ISOLATED_REGION.to_string(), other.to_string());
        eprintln!("{}", execute(&wan, &command).expect("heal-region"));
    }
    let healed_at = Instant::now();
    loop {
        let own = statuses(&cluster).await.remove(&isolated_node);
        let behind: Vec<(u64, u64, u64)> = targets
            .iter()
            .filter_map(|(shard, (_, target))| {
                let applied = own
                    .as_ref()?
                    .shards
                    .iter()
                    .find(|s| s.shard_id == *shard)
                    .map_or(0, |s| s.applied_index);
                (applied < *target).then_some((*shard, applied, *target))
            })
            .collect();
        if own.is_some() && behind.is_empty() {
            break;
        }
        assert!(
            healed_at.elapsed() < CATCH_UP_TIMEOUT,
            "node {isolated_node} has not caught up {CATCH_UP_TIMEOUT:?} after the heal \
             (shard, applied, target): {behind:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    eprintln!(
        "node {isolated_node} caught up on {} shards {:?} after the heal",
        targets.len(),
        healed_at.elapsed()
    );
    let isolated_client = &clients[ISOLATED_REGION];
    let mut last_value = BTreeMap::new();
    for (key, value) in &written {
        last_value.insert(key.clone(), value.clone());
    }
    for (key, value) in &last_value {
        let read = isolated_client
            .get(key.clone())
            .await
            .unwrap_or_else(|e| panic!("read from {ISOLATED_REGION} after the heal: {e}"));
        assert_eq!(
            read.as_ref(),
            Some(value),
            "the majority's write is visible"
        );
    }
    isolated_client
        .put(keys[0].clone(), Bytes::from_static(b"after-heal"))
        .await
        .unwrap_or_else(|e| panic!("write from {ISOLATED_REGION} after the heal: {e}"));

    for id in cluster.node_ids() {
        let log = cluster.log_contents(id).unwrap();
        assert!(!log.contains("panicked"), "node {id} panicked:\n{log}");
    }
    wan.shutdown();
}
