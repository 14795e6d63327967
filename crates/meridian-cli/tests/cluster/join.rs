//! Cluster test: a node joins a running cluster (`meridian start --join`) under a write load,
//! takes over a founding member's replicas (`meridian cluster decommission`), and serves them
//! after the founding member is gone and after its own restart.
//!
//! 1. Three founding members (3 replicas of each of 3 shards: the metadata shard and two data
//!    shards) take writes from a writer that remembers every acknowledged key.
//! 2. A node whose id the cluster already has is refused at once (exit status non-zero, the
//!    reason named), and nothing changes.
//! 3. Node 4 starts with `--join` naming node 1 (in node 1's region). Every founding member's
//!    status lists it with its client address, and the shard map's version went up; node 4's
//!    own status, with no metadata replica to read registrations from, lists every member's
//!    client address (from ping replies).
//! 4. `cluster decommission 1` moves node 1's three replicas to node 4 (the only node without
//!    one); node 1 keeps running. Every shard lists nodes 2, 3 and 4.
//! 5. `cluster forget 2` is refused (node 2 holds replicas); `cluster forget 1` succeeds:
//!    node 1 stops by itself (exit status 79, its first ping refused), every survivor's status
//!    stops listing node 1, and a vote request sent in node 1's name is refused as from a
//!    forgotten member (one in node 3's name is not).
//! 6. Node 4 is killed and started again: it rejoins from its `joined.json`, asking nobody,
//!    and reopens its replicas from the map it adopted. Then node 3 is killed: every write
//!    now needs node 4's vote (nodes 2 and 4 are the only ones up), and writes still succeed.
//! 7. Every acknowledged key reads back.

use crate::common::*;
use meridian_cli::{LocalCluster, LocalClusterConfig};
use meridian_proto::raft::raft_transport_client::RaftTransportClient;
use meridian_proto::raft::RaftRequest;
use nix::sys::signal::Signal;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

const PORT: u16 = 31_600;
/// `meridian_raft::host::EXIT_FORGOTTEN`.
const EXIT_FORGOTTEN: i32 = 79;

#[test]
fn a_joined_node_takes_over_a_decommissioned_nodes_replicas_under_writes() {
    run_scenario(scenario());
}

async fn scenario() {
    let dir = tempfile::tempdir().unwrap();
    let config = LocalClusterConfig::new(binary(), 4, PORT, dir.path())
        .common_args(["--initial-shards", "2"])
        .joining(1);
    let cluster = LocalCluster::start(config).expect("spawning the founding members");
    eprintln!("cluster at ports {PORT}+, logs in {}", dir.path().display());
    cluster
        .wait_ready(READY_TIMEOUT)
        .await
        .expect("cluster ready");
    let founders: Vec<String> = (1..=3).map(|n| cluster.client_addr(n).unwrap()).collect();
    let client = connect_client(founders.clone()).await;
    let before = client.status().await.unwrap();
    assert_eq!(before.nodes.len(), 3, "three founding members");
    assert_eq!(before.shards.len(), 3);

    let (acked, stop, writer) = start_writer(&client, "j").await;

    // A node whose id is taken is refused, and says why.
    let taken = dir.path().join("taken");
    let said = cli_refused(vec![
        "start".into(),
        "--node-id".into(),
        "2".into(),
        "--client-addr".into(),
        format!("127.0.0.1:{}", PORT + 9),
        "--peer-addr".into(),
        format!("127.0.0.1:{}", PORT + 109),
        "--data-dir".into(),
        taken.display().to_string(),
        "--join".into(),
        founders[0].clone(),
    ])
    .await;
    assert!(said.contains("node id 2 is taken"), "{said}");
    assert_eq!(
        client.status().await.unwrap().shard_map_version,
        before.shard_map_version,
        "a refused join changes nothing"
    );

    // Node 4 joins.
    cluster.launch(4).expect("starting node 4");
    let give_up = Instant::now() + Duration::from_secs(60);
    'listed: loop {
        assert!(
            Instant::now() < give_up,
            "node 4 never showed in every member's status:\n{}",
            cluster.log_tail(4, 30)
        );
        let mut everywhere = true;
        for addr in &founders {
            let status = client.node_status(addr).await;
            everywhere &= status.is_ok_and(|s| {
                s.shard_map_version > before.shard_map_version
                    && s.nodes
                        .iter()
                        .any(|n| n.node_id == 4 && !n.client_addr.is_empty() && n.live)
            });
        }
        if everywhere {
            break 'listed;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let shown = cli(&founders, &["cluster", "status"]);
    assert!(shown.contains(&cluster.client_addr(4).unwrap()), "{shown}");
    // Node 4 holds no metadata replica, so no registration: it knows the members' client
    // addresses from their ping replies, and a client that asks it first can route.
    let give_up = Instant::now() + Duration::from_secs(10);
    loop {
        let seen = client
            .node_status(&cluster.client_addr(4).unwrap())
            .await
            .unwrap();
        let addressed: Vec<u64> = seen
            .nodes
            .iter()
            .filter(|n| !n.client_addr.is_empty())
            .map(|n| n.node_id)
            .collect();
        if addressed == [1, 2, 3, 4] {
            break;
        }
        assert!(
            Instant::now() < give_up,
            "node 4's status gives addresses of {addressed:?} only"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // Node 1's replicas move to node 4, then node 1 goes.
    let stdout = cli(
        &founders,
        &["cluster", "decommission", "1", "--timeout-ms", "60000"],
    );
    assert!(
        stdout.contains("node 1 holds no replicas (3 moved): safe to stop"),
        "{stdout}"
    );
    let survivors: Vec<String> = (2..=4).map(|n| cluster.client_addr(n).unwrap()).collect();
    let client = connect_client(survivors.clone()).await;
    for s in &client.status().await.unwrap().shards {
        let mut replicas = s.replicas.clone();
        replicas.sort_unstable();
        assert_eq!(replicas, [2, 3, 4], "shard {}", s.shard_id);
    }

    // Node 1 holds nothing now: it can be forgotten; node 2 cannot.
    let said = cli_refused(vec![
        "cluster".into(),
        "forget".into(),
        "2".into(),
        "--endpoints".into(),
        survivors.join(","),
    ])
    .await;
    assert!(said.contains("node 2 holds replicas"), "{said}");
    let stdout = cli(&survivors, &["cluster", "forget", "1"]);
    assert!(stdout.contains("node 1 forgotten"), "{stdout}");
    let exited = tokio::task::block_in_place(|| cluster.wait_exit(1, Duration::from_secs(20)))
        .expect("node 1's process");
    assert_eq!(
        exited.and_then(|s| s.code()),
        Some(EXIT_FORGOTTEN),
        "a forgotten node stops by itself; log tail:\n{}",
        cluster.log_tail(1, 20)
    );
    assert!(cluster
        .log_contents(1)
        .unwrap()
        .contains("stopping the node: the cluster forgot it"));
    let give_up = Instant::now() + Duration::from_secs(20);
    for addr in &survivors {
        loop {
            let listed = client
                .node_status(addr)
                .await
                .map(|s| s.nodes.iter().any(|n| n.node_id == 1));
            if listed.as_ref().is_ok_and(|l| !l) {
                break;
            }
            assert!(
                Instant::now() < give_up,
                "{addr} still lists node 1: {listed:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let peer_of_2 = format!("127.0.0.1:{}", PORT + 102);
    let vote_from = |from: u64| {
        let peer = peer_of_2.clone();
        async move {
            let mut transport = RaftTransportClient::connect(format!("http://{peer}"))
                .await
                .expect("node 2's peer port");
            let request = RaftRequest {
                shard_id: 1,
                hlc: 0,
                from_node: from,
                payload: vec![0xff; 3].into(),
            };
            transport.vote(request).await.map(|_| ())
        }
    };
    let from_1 = vote_from(1).await;
    assert!(
        matches!(&from_1, Err(s) if s.code() == tonic::Code::PermissionDenied && s.message().contains("forgotten")),
        "{from_1:?}"
    );
    let from_3 = vote_from(3).await;
    assert!(
        matches!(&from_3, Err(s) if s.code() != tonic::Code::PermissionDenied),
        "node 3 is still a member: {from_3:?}"
    );

    // Node 4 restarts from what it recorded, then carries every write with node 2.
    cluster.kill(4, Signal::SIGKILL).expect("killing node 4");
    cluster.launch(4).expect("restarting node 4");
    let log = cluster.log_contents(4).unwrap();
    assert_eq!(
        log.matches("joined the cluster through").count(),
        1,
        "node 4 joined once and restarted from its record"
    );
    cluster.kill(3, Signal::SIGKILL).expect("killing node 3");
    stop.store(true, Ordering::Relaxed);
    writer.await.unwrap();
    let mut written = acked.lock().unwrap().clone();
    eprintln!("{} writes acknowledged before node 3 went", written.len());
    for i in 0..20 {
        let key = format!("after-{i}");
        client
            .put(key.clone(), key.clone())
            .await
            .expect("a write that needs node 4's vote");
        written.push(key);
    }
    read_back(&client, &written).await;
}
