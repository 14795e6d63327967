//! Cluster test: `meridian cluster transfer-leader SHARD NODE` moves a shard's leadership to
//! each voter in turn (from a quiesced shard too), the cluster agrees, writes keep working, and
//! bad requests (no such shard, not a voter) are refused with a clear error and move nothing.

use crate::common::*;
use bytes::Bytes;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

const BASE_PORT: u16 = 29_300;

#[test]
fn leadership_moves_where_the_operator_asks() {
    run_scenario(scenario());
}

fn cli(endpoints: &[String], args: &[&str]) -> Output {
    run_bounded(
        Command::new(binary())
            .arg("cluster")
            .args(args)
            .arg("--endpoints")
            .arg(endpoints.join(",")),
        Duration::from_secs(60),
    )
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Shard `shard`'s leader as every node reports it, once they agree (bounded wait).
async fn agreed_leader(cluster: &meridian_cli::LocalCluster, shard: u64) -> u64 {
    let give_up = Instant::now() + Duration::from_secs(20);
    loop {
        let mut seen = Vec::new();
        for node in 1..=3 {
            let address = cluster.client_addr(node).unwrap();
            if let Ok(status) =
                meridian_client::fetch_status(&address, Duration::from_secs(2)).await
            {
                if let Some(s) = status.shards.iter().find(|s| s.shard_id == shard) {
                    seen.push(s.leader_id);
                }
            }
        }
        if seen.len() == 3 && seen.iter().all(|l| *l == seen[0] && *l != 0) {
            return seen[0];
        }
        assert!(
            Instant::now() < give_up,
            "nodes disagree on shard {shard}'s leader: {seen:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn scenario() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = start_cluster(BASE_PORT, dir.path(), 2, &[]);
    cluster.wait_ready(READY_TIMEOUT).await.expect("ready");
    let endpoints = cluster.endpoints();
    let client = connect_client(endpoints.clone()).await;
    // Let the idle shards quiesce first: a transfer must wake the group it moves.
    tokio::time::sleep(Duration::from_secs(3)).await;

    let shard = 1;
    let first = agreed_leader(&cluster, shard).await;
    let mut order: Vec<u64> = (1..=3).filter(|n| *n != first).collect();
    order.push(first);
    for (i, to) in order.into_iter().enumerate() {
        let started = Instant::now();
        let out = cli(
            &endpoints,
            &["transfer-leader", &shard.to_string(), &to.to_string()],
        );
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        let stdout = text(&out.stdout);
        assert!(
            stdout.starts_with(&format!("shard {shard}: node {to} leads (term ")),
            "{stdout}"
        );
        eprintln!(
            "transfer {i}: shard {shard} to node {to} in {:?}",
            started.elapsed()
        );
        assert_eq!(agreed_leader(&cluster, shard).await, to);
        // The new leader serves writes (the client follows the move).
        client
            .put(Bytes::from(format!("moved/{i}")), Bytes::from("v"))
            .await
            .expect("a write after the transfer");
    }
    // Asking the current leader to lead is a no-op that succeeds.
    let leader = agreed_leader(&cluster, shard).await;
    let out = cli(
        &endpoints,
        &["transfer-leader", &shard.to_string(), &leader.to_string()],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));

    // Bad requests are refused and move nothing.
    let out = cli(&endpoints, &["transfer-leader", "99", "1"]);
    assert_ne!(out.status.code(), Some(0));
    assert!(
        text(&out.stderr).contains("no shard 99"),
        "{}",
        text(&out.stderr)
    );
    let out = cli(&endpoints, &["transfer-leader", &shard.to_string(), "7"]);
    assert_ne!(out.status.code(), Some(0));
    assert!(
        text(&out.stderr).contains("node 7 is not a voter"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(agreed_leader(&cluster, shard).await, leader);

    drop(client);
    cluster.stop_all(Duration::from_secs(10));
}
