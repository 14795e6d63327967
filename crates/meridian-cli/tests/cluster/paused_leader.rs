//! Cluster test: a leader frozen with SIGSTOP while it replicates, deposed while frozen, serves
//! no stale linearizable read when it wakes.
//!
//! Each round: writers keep the shard's appends in flight; the leader is stopped and the links
//! carrying its peers' own connections to it are cut (as a flood of reset streams made its
//! HTTP/2 server drop them in the Jepsen run), so it learns of its successor only from replies
//! to what it sends after waking; the other two elect a new leader and acknowledge a new value
//! of a register; the node is continued, and linearizable gets of the register go straight to
//! it, 2 ms apart, over the next 80 ms. Every get it answers must see the new value. The woken
//! node still has its followers' replies to appends it sent before the pause unread, and it
//! must not count them as fresh confirmations of its leadership (Jepsen's `register × pause`
//! found a stale read made exactly so). Peer traffic crosses `meridian-wan` links with 20 ms
//! each way, so the replies that depose it take a round trip to arrive. Before the fix
//! (`meridian_raft::append_credit`) about one round in fifteen served stale reads.

use crate::common::*;
use bytes::Bytes;
use meridian_cli::{LocalCluster, LocalClusterConfig};
use meridian_client::fetch_status;
use meridian_client::proto::kv_client::KvClient;
use meridian_client::proto::{GetRequest, ReadConsistency};
use nix::sys::signal::Signal;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tonic::transport::Channel;

/// Nodes at 29501..29503 (client) and 29601..29603 (Raft).
const BASE_PORT: u16 = 29_500;
/// Six peer links, one per ordered node pair: 29700..29705.
const PEER_LINK_BASE_PORT: u16 = 29_700;
const ONE_WAY: Duration = Duration::from_millis(20);
const ROUNDS: usize = 30;
const WRITERS: usize = 6;
/// Gets sent to the woken leader, `GET_SPACING` apart.
const GETS: usize = 40;
const GET_SPACING: Duration = Duration::from_millis(2);
const REGISTER: &str = "paused/register";
const REPLICATION_LOG: &str = "info,openraft::replication=debug";
/// How long the leader stays frozen (an election takes about one).
const PAUSE: Duration = Duration::from_millis(2_500);

#[test]
fn a_leader_woken_from_sigstop_serves_no_stale_read() {
    run_scenario(scenario());
}

/// Shard 1's leader as every running node but `except` reports it, once they agree on one
/// other than `except` (bounded wait).
async fn leader_among(cluster: &meridian_cli::LocalCluster, except: Option<u64>) -> u64 {
    let give_up = Instant::now() + Duration::from_secs(30);
    loop {
        let mut seen = Vec::new();
        for node in (1..=3).filter(|n| Some(*n) != except) {
            let address = cluster.client_addr(node).unwrap();
            if let Ok(status) = fetch_status(&address, Duration::from_secs(1)).await {
                if let Some(s) = status.shards.iter().find(|s| s.shard_id == 1) {
                    seen.push(s.leader_id);
                }
            }
        }
        let want = if except.is_some() { 2 } else { 3 };
        if seen.len() == want
            && seen
                .iter()
                .all(|l| *l == seen[0] && *l != 0 && Some(*l) != except)
        {
            return seen[0];
        }
        assert!(
            Instant::now() < give_up,
            "no agreed leader of shard 1 (except {except:?}): {seen:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// One linearizable get of the register, straight to one node: `Ok(value)` if that node
/// answered it, else why not.
async fn direct_get(mut client: KvClient<Channel>) -> Result<Bytes, String> {
    let request = GetRequest {
        key: Bytes::from(REGISTER),
        consistency: ReadConsistency::Linearizable as i32,
        ..Default::default()
    };
    match tokio::time::timeout(Duration::from_secs(5), client.get(request)).await {
        Ok(Ok(reply)) => Ok(reply.into_inner().value),
        Ok(Err(status)) => Err(format!("{:?}: {}", status.code(), status.message())),
        Err(_) => Err("no answer in 5 s".into()),
    }
}

async fn scenario() {
    let dir = tempfile::tempdir().unwrap();
    let (wan, dial) = peer_wan(3, BASE_PORT, PEER_LINK_BASE_PORT, ONE_WAY).await;
    let per_node: Vec<(u64, Vec<&str>)> = dial
        .iter()
        .map(|(id, args)| (*id, args.iter().map(String::as_str).collect()))
        .collect();
    let mut config = LocalClusterConfig::new(binary(), 3, BASE_PORT, dir.path())
        .common_args(["--initial-shards", "1"]);
    for (id, args) in per_node {
        // Replication's debug log slows a woken leader's replication tasks by the tens of
        // milliseconds a loaded Jepsen node took: the window the stale read needs.
        config = config
            .node_args(id, args)
            .node_env(id, "RUST_LOG", REPLICATION_LOG);
    }
    let cluster = Arc::new(LocalCluster::start(config).expect("spawning the cluster"));
    eprintln!(
        "cluster at ports {BASE_PORT}+, logs in {}",
        dir.path().display()
    );
    cluster.wait_ready(READY_TIMEOUT).await.expect("ready");
    let client = connect_client(cluster.endpoints()).await;

    // Writers keep appends in flight to both followers, so a pause catches replies unread.
    let stop = Arc::new(AtomicBool::new(false));
    let written = Arc::new(AtomicUsize::new(0));
    let mut writers = Vec::new();
    for w in 0..WRITERS {
        let (client, stop, written) = (client.clone(), stop.clone(), written.clone());
        writers.push(tokio::spawn(async move {
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let key = format!("paused/load/{w}/{}", i % 64);
                if client.put(key, Bytes::from(vec![b'x'; 256])).await.is_ok() {
                    written.fetch_add(1, Ordering::Relaxed);
                }
                i += 1;
            }
        }));
    }

    let (mut stale, mut served, mut refused) = (Vec::new(), 0usize, 0usize);
    let mut reasons = std::collections::BTreeMap::new();
    for round in 0..ROUNDS {
        let leader = leader_among(&cluster, None).await;
        let address = cluster.client_addr(leader).unwrap();
        let old = Bytes::from(format!("round-{round}-old"));
        client.put(REGISTER, old.clone()).await.expect("old value");
        // Connected before the pause: the gets below wait in the frozen node's sockets.
        let channel = Channel::from_shared(format!("http://{address}"))
            .unwrap()
            .connect()
            .await
            .expect("connecting to the leader");
        let before = written.load(Ordering::Relaxed);
        while written.load(Ordering::Relaxed) < before + 20 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }

        cluster.kill(leader, Signal::SIGSTOP).expect("SIGSTOP");
        cut_peer_links(&wan, 3, leader, false, true);
        let paused = Instant::now();
        let successor = leader_among(&cluster, Some(leader)).await;
        let others: Vec<String> = (1..=3)
            .filter(|n| *n != leader)
            .map(|n| cluster.client_addr(n).unwrap())
            .collect();
        let bystander = connect_client(others).await;
        let new = Bytes::from(format!("round-{round}-new"));
        bystander
            .put(REGISTER, new.clone())
            .await
            .expect("the new leader acknowledges the new value");
        tokio::time::sleep_until((paused + PAUSE).into()).await;
        cluster.kill(leader, Signal::SIGCONT).expect("SIGCONT");
        // Gets over the first moments after waking (the stale read came 35 ms after it).
        let mut gets = Vec::new();
        for _ in 0..GETS {
            gets.push(tokio::spawn(direct_get(KvClient::new(channel.clone()))));
            tokio::time::sleep(GET_SPACING).await;
        }
        for get in gets {
            match get.await.expect("get task") {
                Ok(value) if value == old => stale.push((round, leader)),
                Ok(value) => {
                    assert_eq!(value, new, "round {round}: an unexpected value");
                    served += 1;
                }
                Err(why) => {
                    refused += 1;
                    *reasons.entry(why).or_insert(0usize) += 1;
                }
            }
        }
        eprintln!(
            "round {round}: node {leader} paused, node {successor} took over; \
             {served} served, {refused} refused, {} stale so far",
            stale.len()
        );
        drop(bystander);
        cut_peer_links(&wan, 3, leader, false, false);
    }

    eprintln!("refusals: {reasons:?}");
    // How often the transport refused to let a late reply vouch for a newer request.
    for id in 1..=3 {
        let log = cluster.log_contents(id).unwrap_or_default();
        let ended = log.matches("append stream ended").count();
        eprintln!("node {id}: {ended} append streams ended on a late reply");
    }
    stop.store(true, Ordering::Relaxed);
    for writer in writers {
        writer.await.expect("writer");
    }
    drop(client);
    cluster.stop_all(Duration::from_secs(10));
    assert!(
        stale.is_empty(),
        "{} stale reads (round, woken leader): {stale:?}; {served} fresh reads served",
        stale.len()
    );
}
