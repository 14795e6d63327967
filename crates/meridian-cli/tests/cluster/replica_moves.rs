//! Cluster test: moving a shard's replica from one node to another under a write load, on a
//! real 4-node cluster (3 replicas per shard), with `meridian cluster add-replica` and
//! `remove-replica` semantics through the client.
//!
//! 1. Shard S has replicas on three nodes; T is the fourth. A writer keeps writing keys of S
//!    (every acknowledged key is remembered) while S gets a replica on T, then loses the one
//!    on V (a replica that does not lead).
//! 2. The answers name the groups: T votes after the add, V is gone after the remove, and the
//!    stored map's version went up by one each time; every node's status lists the new
//!    replicas.
//! 3. T is restarted: it reopens its replica from the map it adopted (no founding replica of
//!    S, so nothing else would open it) and catches up; then it takes S's lead, one of the
//!    other voters is killed, and S still takes writes with T and the last one: T is a voter
//!    holding the data. Every acknowledged key is read back.
//! 4. V retired its replica: stopped, its RocksDB holds no Raft log and no data of S, while
//!    the nodes still hosting S hold both (the control: the same count finds S where it is).
//!
//! A third scenario runs `meridian cluster decommission` on a node of a 4-node cluster under
//! writes, one of whose shards has a fourth replica (as a run cut between an add and its
//! remove leaves it; that shard's replica is only removed): the command reports it safe to stop, no shard lists it any more, and with it killed
//! every shard still takes writes and every acknowledged key reads back.
//!
//! Another stops a move half way: the target node is down, so the add leaves it a learner that
//! cannot catch up (the call is abandoned after a few seconds). `meridian cluster status`
//! shows the move in its MOVES column (`T learning`); with the node back, asking again
//! finishes the move and the column shows `-`.
//!
//! A second scenario removes a shard's *leader* from its group (it steps down once the change
//! commits; the other two elect a new leader and keep taking writes), then adds that node
//! back: its replica was deleted, so it starts empty and catches up, and reads everything.

use crate::common::*;
use meridian_cli::LocalCluster;
use meridian_client::Client;
use meridian_storage::keys::{self, Keyspace, Span};
use meridian_storage::{Cf, Engine, EngineOptions, RocksEngine};
use meridian_types::ShardId;
use nix::sys::signal::Signal;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

const BASE_PORT: u16 = 28_400;
const READD_PORT: u16 = 28_600;
const DECOMMISSION_PORT: u16 = 28_800;
const HALF_WAY_PORT: u16 = 31_400;
const SHARDS: u32 = 2;
const STOP_TIMEOUT: Duration = Duration::from_secs(20);

#[test]
fn a_replica_moves_to_another_node_under_writes() {
    run_scenario(scenario());
}

#[test]
fn a_decommissioned_node_can_be_stopped_without_losing_anything() {
    run_scenario(decommission_scenario());
}

#[test]
fn a_move_stopped_half_way_shows_in_status_and_asking_again_finishes_it() {
    run_scenario(half_way_scenario());
}

#[test]
fn a_leader_removed_from_its_group_can_be_added_back() {
    run_scenario(readd_scenario());
}

/// (data range, raft log) key counts of `shard` (owning `span`) in a stopped node's RocksDB.
fn stored_keys_of(data_dir: &Path, shard: ShardId, span: &Span) -> (usize, usize) {
    let engine = RocksEngine::open(&data_dir.join("db"), &EngineOptions::default())
        .expect("opening a stopped node's RocksDB");
    let (start, end) = span.data_range();
    let data = engine.scan(Cf::Data, &start, Some(&end), false).count();
    let (start, end) = keys::raft_log_range(shard);
    let log = engine.scan(Cf::RaftLog, &start, Some(&end), false).count();
    (data, log)
}

/// Keys `key-<i>` that route to `shard`, from `from` on.
fn keys_of(client: &Client, shard: u64, from: u64, n: usize) -> Vec<String> {
    (from..)
        .map(|i| format!("key-{i:06}"))
        .filter(|k| client.route(k.as_bytes()).expect("routable").shard_id == shard)
        .take(n)
        .collect()
}

/// A 4-node cluster (3 replicas per shard, `SHARDS` data shards) with every leader elected.
async fn four_nodes(port: u16, dir: &Path) -> (Arc<LocalCluster>, Client) {
    let config = meridian_cli::LocalClusterConfig::new(binary(), 4, port, dir)
        .common_args(["--initial-shards".to_string(), SHARDS.to_string()]);
    let cluster = Arc::new(LocalCluster::start(config).expect("spawning the cluster"));
    eprintln!("cluster at ports {port}+, logs in {}", dir.display());
    cluster
        .wait_ready(READY_TIMEOUT)
        .await
        .expect("cluster ready");
    let client = connect_client(cluster.endpoints()).await;
    (cluster, client)
}

/// The shard's replicas and leader as node `node` reports them.
async fn view(
    cluster: &LocalCluster,
    client: &Client,
    node: u64,
    shard: u64,
) -> (Vec<u64>, u64, u64) {
    let addr = cluster.client_addr(node).unwrap();
    let status = client.node_status(&addr).await.expect("node status");
    let info = status
        .shards
        .iter()
        .find(|s| s.shard_id == shard)
        .expect("the shard in the node's status")
        .clone();
    (info.replicas, info.leader_id, status.shard_map_version)
}

async fn scenario() {
    let dir = tempfile::tempdir().unwrap();
    let (cluster, client) = four_nodes(BASE_PORT, dir.path()).await;

    // A data shard without a replica on some node: 3 replicas per shard over 4 nodes.
    let status = client.status().await.unwrap();
    let (shard, replicas, target) = status
        .shards
        .iter()
        .filter(|s| s.shard_id != 0)
        .find_map(|s| {
            let t = (1..=4).find(|n| !s.replicas.contains(n))?;
            Some((s.shard_id, s.replicas.clone(), t))
        })
        .expect("a shard one node does not host");
    let info = status
        .shards
        .iter()
        .find(|s| s.shard_id == shard)
        .unwrap()
        .clone();
    let span = Span {
        space: Keyspace::from(ShardId(shard)),
        start: info.start.to_vec(),
        end: info.end.to_vec(),
    };
    eprintln!("shard {shard}: replicas {replicas:?}, moving to node {target}");

    // The writer: keys of S, one after another, each remembered once acknowledged.
    let (acked, stop, writer) = spawn_writer(&client, keys_of(&client, shard, 0, 100_000));
    tokio::time::sleep(Duration::from_millis(500)).await;

    // 1-2. Add on T, then remove V (a replica that does not lead S).
    let added = client
        .add_replica(shard, target)
        .await
        .expect("add-replica");
    eprintln!("added: {added:?}");
    assert!(added.voters.contains(&target), "{added:?}");
    assert_eq!(added.voters.len(), 4, "{added:?}");
    assert!(added.learners.is_empty(), "{added:?}");
    assert_eq!(added.map_version, 2);
    let again = client.add_replica(shard, target).await;
    assert!(
        matches!(&again, Err(e) if e.to_string().contains("voter of shard")),
        "adding a voter again is refused: {again:?}"
    );

    let leader = client
        .status()
        .await
        .unwrap()
        .shards
        .iter()
        .find(|s| s.shard_id == shard)
        .unwrap()
        .leader_id;
    let removed_node = *replicas.iter().find(|n| **n != leader).expect("a follower");
    let removed = client
        .remove_replica(shard, removed_node)
        .await
        .expect("remove-replica");
    eprintln!("removed node {removed_node}: {removed:?}");
    assert!(!removed.voters.contains(&removed_node), "{removed:?}");
    assert!(removed.voters.contains(&target), "{removed:?}");
    assert_eq!(removed.voters.len(), 3, "{removed:?}");
    assert_eq!(removed.map_version, 3);
    // Asked again: refused as a mistake, unless asked as a retry of a request whose answer
    // was lost, which the leader answers with the group as it stands.
    let again = client.remove_replica(shard, removed_node).await;
    assert!(
        matches!(&again, Err(e) if e.to_string().contains("holds no replica")),
        "removing a removed replica again is refused: {again:?}"
    );
    let leader_addr = cluster
        .spec(leader_of(&client, shard).await)
        .unwrap()
        .client_addr
        .clone();
    let mut raw = meridian_client::proto::cluster_client::ClusterClient::connect(format!(
        "http://{leader_addr}"
    ))
    .await
    .unwrap();
    let retry = |node_id| meridian_client::proto::ChangeReplicaRequest {
        shard_id: shard,
        node_id,
        retried: true,
    };
    let done = raw
        .remove_replica(retry(removed_node))
        .await
        .expect("a retried remove of a removed replica")
        .into_inner();
    assert_eq!(
        (done.map_version, done.voters.len()),
        (3, 3),
        "the group as it stands: {done:?}"
    );
    let done = raw
        .add_replica(retry(target))
        .await
        .expect("a retried add of a voter")
        .into_inner();
    assert!(done.voters.contains(&target), "{done:?}");
    let mut expected: Vec<u64> = replicas
        .iter()
        .copied()
        .filter(|n| *n != removed_node)
        .collect();
    expected.push(target);
    expected.sort();
    for node in 1..=4 {
        let (mut listed, _, version) = view(&cluster, &client, node, shard).await;
        listed.sort();
        assert_eq!(
            (listed, version),
            (expected.clone(), 3),
            "node {node}'s map"
        );
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, Ordering::Relaxed);
    writer.await.unwrap();
    let written = acked.lock().unwrap().clone();
    eprintln!("{} writes acknowledged during the moves", written.len());
    assert!(
        written.len() >= 20,
        "the writer made progress: {}",
        written.len()
    );

    // 3. T restarts from its adopted map, catches up, leads; another voter dies; S still works.
    cluster.stop(target, STOP_TIMEOUT).expect("stopping T");
    cluster.restart(target).expect("restarting T");
    let give_up = Instant::now() + Duration::from_secs(60);
    let (led_by, term) = loop {
        match client.transfer_leader(shard, target).await {
            Ok(done) => break done,
            Err(e) if Instant::now() < give_up => {
                eprintln!("transfer to the restarted T not yet: {e}");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(e) => panic!("node {target} never took shard {shard}'s lead: {e}"),
        }
    };
    assert_eq!(led_by, target, "term {term}");
    assert!(cluster
        .log_contents(target)
        .unwrap()
        .contains("hosting the replicas of a changed shard map"));
    let victim = *expected.iter().find(|n| **n != target).unwrap();
    cluster
        .kill(victim, Signal::SIGKILL)
        .expect("killing a voter");
    let later = keys_of(&client, shard, 200_000, 20);
    for key in &later {
        client
            .put(key.clone(), "after")
            .await
            .expect("a write with T and one other voter");
    }
    for key in written.iter().chain(&later) {
        let got = client.get(key.clone()).await.expect("reading back");
        assert!(got.is_some(), "acknowledged key {key} lost");
    }

    // 4. V deleted S's replica; the nodes hosting S hold it (the control).
    cluster.stop_all(STOP_TIMEOUT);
    let (data, log) = stored_keys_of(
        &cluster.spec(removed_node).unwrap().data_dir,
        ShardId(shard),
        &span,
    );
    assert_eq!(
        (data, log),
        (0, 0),
        "node {removed_node} still holds shard {shard}'s data or log"
    );
    assert!(cluster
        .log_contents(removed_node)
        .unwrap()
        .contains("retired this node's replica"));
    for node in expected.iter().filter(|n| **n != victim) {
        let (data, log) = stored_keys_of(
            &cluster.spec(*node).unwrap().data_dir,
            ShardId(shard),
            &span,
        );
        assert!(
            data >= 2 * written.len() && log > 0,
            "node {node} hosts shard {shard}: {data} data keys, {log} log entries"
        );
    }
}

/// The leader of `shard` as the cluster's status reports it, waiting for one.
async fn leader_of(client: &Client, shard: u64) -> u64 {
    let give_up = Instant::now() + Duration::from_secs(30);
    loop {
        let status = client.status().await.expect("status");
        let leader = status
            .shards
            .iter()
            .find(|s| s.shard_id == shard)
            .map_or(0, |s| s.leader_id);
        if leader != 0 {
            return leader;
        }
        assert!(Instant::now() < give_up, "shard {shard} has no leader");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn readd_scenario() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = start_cluster(READD_PORT, dir.path(), 1, &[]);
    cluster
        .wait_ready(READY_TIMEOUT)
        .await
        .expect("cluster ready");
    let client = connect_client(cluster.endpoints()).await;
    let shard = 1;
    let first = keys_of(&client, shard, 0, 50);
    for key in &first {
        client.put(key.clone(), "v").await.expect("write");
    }
    let leader = leader_of(&client, shard).await;
    let removed = client
        .remove_replica(shard, leader)
        .await
        .expect("removing the leader");
    eprintln!("removed the leader, node {leader}: {removed:?}");
    assert_eq!(removed.voters.len(), 2, "{removed:?}");
    assert!(!removed.voters.contains(&leader), "{removed:?}");
    let second = keys_of(&client, shard, 100_000, 50);
    for key in &second {
        client
            .put(key.clone(), "v")
            .await
            .expect("a write to the two left");
    }
    let new_leader = leader_of(&client, shard).await;
    assert_ne!(new_leader, leader, "the removed node does not lead");
    assert!(cluster
        .log_contents(leader)
        .unwrap()
        .contains("retired this node's replica"));

    let added = client
        .add_replica(shard, leader)
        .await
        .expect("adding it back");
    eprintln!("added node {leader} back: {added:?}");
    assert_eq!(added.voters.len(), 3, "{added:?}");
    assert_eq!(added.map_version, 3);
    // The re-added replica holds everything: it can take the lead and serve every key.
    let give_up = Instant::now() + Duration::from_secs(60);
    loop {
        match client.transfer_leader(shard, leader).await {
            Ok((now, _)) if now == leader => break,
            other if Instant::now() < give_up => {
                eprintln!("transfer back not yet: {other:?}");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            other => panic!("node {leader} never led again: {other:?}"),
        }
    }
    for key in first.iter().chain(&second) {
        let got = client.get(key.clone()).await.expect("read");
        assert_eq!(got.as_deref(), Some(&b"v"[..]), "key {key}");
    }
}

async fn decommission_scenario() {
    let dir = tempfile::tempdir().unwrap();
    let (cluster, client) = four_nodes(DECOMMISSION_PORT, dir.path()).await;
    let status = client.status().await.unwrap();
    // The node with the most replicas leaves (the metadata shard's among them, likely).
    let leaving = (1..=4u64)
        .max_by_key(|n| {
            status
                .shards
                .iter()
                .filter(|s| s.replicas.contains(n))
                .count()
        })
        .unwrap();
    let held = status
        .shards
        .iter()
        .filter(|s| s.replicas.contains(&leaving))
        .count();
    eprintln!("decommissioning node {leaving}, which holds {held} replicas");
    // One of its shards as a run cut between a move's add and its remove leaves it: a fourth
    // replica on the node that had none. The decommission only removes the leaving one.
    let (extra_shard, extra_node) = status
        .shards
        .iter()
        .filter(|s| s.replicas.contains(&leaving))
        .find_map(|s| Some((s.shard_id, (1..=4).find(|n| !s.replicas.contains(n))?)))
        .expect("a shard of the leaving node that some node does not hold");
    let added = client
        .add_replica(extra_shard, extra_node)
        .await
        .expect("adding the extra replica");
    assert_eq!(added.voters.len(), 4, "{added:?}");

    // Some writes before the moves start, so the ones read back at the end span all of them.
    let (acked, stop, writer) = start_writer(&client, "d").await;
    let endpoints = cluster.endpoints().join(",");
    let output = tokio::task::spawn_blocking(move || {
        run_bounded(
            std::process::Command::new(binary()).args([
                "cluster",
                "decommission",
                &leaving.to_string(),
                "--endpoints",
                &endpoints,
                "--timeout-ms",
                "60000",
            ]),
            Duration::from_secs(300),
        )
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).to_string();
    eprintln!("{stdout}{}", String::from_utf8_lossy(&output.stderr));
    assert!(output.status.success(), "decommission failed");
    assert!(
        stdout.contains(&format!(
            "node {leaving} holds no replicas ({held} moved): safe to stop"
        )),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!(
            "shard {extra_shard}: removed node {leaving}'s replica (enough without it)"
        )),
        "{stdout}"
    );
    stop.store(true, Ordering::Relaxed);
    writer.await.unwrap();

    let status = client.status().await.unwrap();
    for s in &status.shards {
        assert!(
            !s.replicas.contains(&leaving),
            "shard {} still lists node {leaving}",
            s.shard_id
        );
        assert_eq!(s.replicas.len(), 3, "shard {} keeps 3 replicas", s.shard_id);
    }
    cluster
        .kill(leaving, Signal::SIGKILL)
        .expect("stopping the decommissioned node");
    let written = acked.lock().unwrap().clone();
    eprintln!(
        "{} writes acknowledged during the decommission",
        written.len()
    );
    assert!(
        written.len() > 50,
        "the writer made progress during the moves"
    );
    for i in 0..20 {
        client
            .put(format!("after-{i}"), "v")
            .await
            .expect("a write without the node");
    }
    read_back(&client, &written).await;
}

/// The MOVES cell of `shard`'s row in `meridian cluster status` (the row's last column).
fn moves_column(cluster: &LocalCluster, shard: u64) -> String {
    let out = run_bounded(
        std::process::Command::new(binary())
            .args(["cluster", "status", "--endpoints"])
            .arg(cluster.endpoints().join(",")),
        Duration::from_secs(30),
    );
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "cluster status: {out:?}");
    let shards = text
        .split("\nSHARDS\n")
        .nth(1)
        .expect("a SHARDS table")
        .lines()
        .take_while(|line| !line.trim().is_empty());
    let header = shards.clone().next().expect("a header").to_string();
    let at = header.find("MOVES").expect("a MOVES column");
    let row = shards
        .skip(1)
        .find(|line| line.split_whitespace().next() == Some(&shard.to_string()))
        .unwrap_or_else(|| panic!("shard {shard} in:\n{text}"));
    row.get(at..).unwrap_or("").trim().to_string()
}

async fn half_way_scenario() {
    let dir = tempfile::tempdir().unwrap();
    let (cluster, client) = four_nodes(HALF_WAY_PORT, dir.path()).await;
    let status = client.status().await.unwrap();
    let (shard, target) = status
        .shards
        .iter()
        .filter(|s| s.shard_id != 0)
        .find_map(|s| Some((s.shard_id, (1..=4).find(|n| !s.replicas.contains(n))?)))
        .expect("a shard one node does not host");
    assert_eq!(moves_column(&cluster, shard), "-", "no move yet");
    cluster.stop(target, STOP_TIMEOUT).expect("stopping T");

    // T cannot catch up: the add lists it and makes it a learner, then waits; give up on it.
    let abandoned =
        tokio::time::timeout(Duration::from_secs(3), client.add_replica(shard, target)).await;
    assert!(
        !matches!(abandoned, Ok(Ok(_))),
        "an add to a stopped node cannot finish: {abandoned:?}"
    );
    let give_up = Instant::now() + Duration::from_secs(20);
    let learning = format!("{target} learning");
    loop {
        let moves = moves_column(&cluster, shard);
        if moves == learning {
            break;
        }
        assert!(
            Instant::now() < give_up,
            "the half-done move never showed as {learning:?}: {moves:?}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }

    // With T back, asking again finishes the move. The leader's survival step may finish it
    // first (it promotes a listed learner that caught up): then the add finds T voting.
    cluster.restart(target).expect("restarting T");
    let give_up = Instant::now() + Duration::from_secs(60);
    loop {
        match client.add_replica(shard, target).await {
            Ok(done) => {
                assert!(
                    done.voters.contains(&target) && done.learners.is_empty(),
                    "{done:?}"
                );
                break;
            }
            Err(e) if e.to_string().contains("voter of shard") => {
                eprintln!("the survival step finished the add first: {e}");
                break;
            }
            Err(e) if Instant::now() < give_up => {
                eprintln!("finishing the add: not yet: {e}");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(e) => panic!("the add never finished: {e}"),
        }
    }
    let give_up = Instant::now() + Duration::from_secs(20);
    loop {
        let moves = moves_column(&cluster, shard);
        if moves == "-" {
            break;
        }
        assert!(
            Instant::now() < give_up,
            "the move never finished: {moves:?}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    cluster.stop_all(STOP_TIMEOUT);
}
