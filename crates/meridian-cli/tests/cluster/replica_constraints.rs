//! Cluster test: replica constraints (`--replica-constraints` at bootstrap, `meridian cluster
//! placement SHARD ... --constraints` at run time).
//!
//! Five nodes: 1 and 4 in us-east (zones a, b), 2 and 5 in eu-west (a, b), 3 in ap-south;
//! two data shards, the second (from `user5`) founded under `-region=ap-south`.
//! 1. Bootstrap: shard 2's replicas avoid node 3 and status shows its constraints; shard 1
//!    (no rule) has a replica on node 3.
//! 2. A hand-made `add-replica 2 3` is refused, naming the entry node 3 breaks.
//! 3. A writer runs on shard 1. `placement 1 --home us-east --constraints -region=ap-south`
//!    replaces node 3's replica (add on an allowed node, then remove) and says so; status
//!    lists no breaking replica. Constraints naming an unknown region are refused.
//! 4. Node 2 restarted: it reports both shards' constraints from the map it stored.
//! 5. `--constraints none` clears them: `add-replica 1 3` then succeeds.
//! 6. Shard 1 now has two replicas in one region: removing its lone replica in the other
//!    (not ap-south) is refused for region survival, naming the two crowded ones; removing
//!    one of those goes ahead. Every write the writer had acknowledged reads back.

use crate::common::*;
use meridian_cli::{LocalCluster, LocalClusterConfig};
use meridian_client::{fetch_status, proto::ShardInfo};
use std::time::Duration;

const BASE_PORT: u16 = 23_200;
const NODES: u64 = 5;
const AP_SOUTH: u64 = 3;

#[test]
fn replica_constraints_at_bootstrap_and_at_run_time() {
    run_scenario(scenario());
}

fn start() -> (tempfile::TempDir, LocalCluster) {
    let dir = tempfile::tempdir().unwrap();
    let config = LocalClusterConfig::new(binary(), NODES as usize, BASE_PORT, dir.path())
        .common_args([
            "--initial-shards",
            "2",
            "--replica-constraints",
            "user5:-region=ap-south",
        ])
        .node_labels(1, "us-east", "a")
        .node_labels(2, "eu-west", "a")
        .node_labels(3, "ap-south", "a")
        .node_labels(4, "us-east", "b")
        .node_labels(5, "eu-west", "b");
    let cluster = LocalCluster::start(config).expect("spawning the cluster");
    eprintln!(
        "cluster at ports {BASE_PORT}+, logs in {}",
        dir.path().display()
    );
    (dir, cluster)
}

/// Shard `shard` as node `node` sees it.
async fn shard_at(cluster: &LocalCluster, node: u64, shard: u64) -> ShardInfo {
    let addr = cluster.client_addr(node).unwrap();
    let status = fetch_status(&addr, Duration::from_secs(5))
        .await
        .expect("status");
    status
        .shards
        .into_iter()
        .find(|s| s.shard_id == shard)
        .expect("the shard")
}

/// The CONSTRAINTS cell of `shard`'s row in `meridian cluster status`.
fn constraints_cell(endpoints: &[String], shard: u64) -> String {
    let status = cli(endpoints, &["cluster", "status"]);
    let mut lines = status
        .split("\nSHARDS\n")
        .nth(1)
        .expect("a SHARDS table")
        .lines();
    let header = lines.next().expect("the shards table's header");
    let at = header.find("CONSTRAINTS").expect("a CONSTRAINTS column");
    let end = header.find("MOVES").expect("a MOVES column");
    let row = lines
        .find(|l| l.split_whitespace().next() == Some(&shard.to_string()))
        .expect("the shard's row");
    row[at..end.min(row.len())].trim().to_string()
}

async fn scenario() {
    let (_dir, cluster) = start();
    let status = cluster
        .wait_ready(READY_TIMEOUT)
        .await
        .expect("cluster ready");
    let endpoints: Vec<String> = (1..=NODES)
        .map(|id| cluster.client_addr(id).unwrap())
        .collect();

    // 1. Bootstrap.
    let replicas = |id: u64| {
        status
            .shards
            .iter()
            .find(|s| s.shard_id == id)
            .expect("a data shard")
            .replicas
            .clone()
    };
    let (first, second) = (replicas(1), replicas(2));
    eprintln!("founding replicas: shard 1 {first:?}, shard 2 {second:?}");
    assert!(
        !second.contains(&AP_SOUTH),
        "shard 2 avoids ap-south: {second:?}"
    );
    assert_eq!(second.len(), 3);
    assert!(first.contains(&AP_SOUTH), "shard 1 has no rule: {first:?}");
    assert_eq!(constraints_cell(&endpoints, 2), "-region=ap-south");
    assert_eq!(constraints_cell(&endpoints, 1), "-");

    // 2. A hand-made move the constraints exclude.
    let said = cli_refused(
        [
            "cluster",
            "add-replica",
            "2",
            "3",
            "--endpoints",
            &endpoints.join(","),
        ]
        .map(String::from)
        .to_vec(),
    )
    .await;
    assert!(
        said.contains("node 3 (ap-south/a) breaks shard 2's replica constraints")
            && said.contains(": -region=ap-south)"),
        "{said}"
    );

    // 3. Constraints set at run time move the breaking replica.
    let client = connect_client(endpoints.clone()).await;
    let (acked, stop, writer) = start_writer(&client, "constrained").await;
    let said = cli(
        &endpoints,
        &[
            "cluster",
            "placement",
            "1",
            "--home",
            "us-east",
            "--constraints",
            "-region=ap-south",
        ],
    );
    assert!(
        said.contains("in place of node 3's, which breaks the constraints")
            && said.contains("removed node 3's replica, which breaks the constraints")
            && said.contains("replica constraints -region=ap-south"),
        "{said}"
    );
    let moved = shard_at(&cluster, 1, 1).await;
    assert!(!moved.replicas.contains(&AP_SOUTH), "{:?}", moved.replicas);
    assert_eq!(moved.replicas.len(), 3, "{:?}", moved.replicas);
    assert_eq!(constraints_cell(&endpoints, 1), "-region=ap-south");
    let said = cli_refused(
        [
            "cluster",
            "placement",
            "1",
            "--home",
            "us-east",
            "--constraints",
            "+region=mars",
            "--endpoints",
            &endpoints.join(","),
        ]
        .map(String::from)
        .to_vec(),
    )
    .await;
    assert!(
        said.contains("+region=mars names a region no member has"),
        "{said}"
    );

    // 4. The constraints outlive a restart (read from the stored map).
    cluster
        .kill(2, nix::sys::signal::Signal::SIGKILL)
        .expect("kill");
    cluster.restart(2).expect("restart");
    cluster
        .wait_ready(READY_TIMEOUT)
        .await
        .expect("ready after the restart");
    // Node 2 answers once it serves again (the others may be ready first).
    let addr = cluster.client_addr(2).unwrap();
    let give_up = std::time::Instant::now() + READY_TIMEOUT;
    let seen = loop {
        if let Ok(status) = fetch_status(&addr, Duration::from_secs(2)).await {
            break status;
        }
        assert!(
            std::time::Instant::now() < give_up,
            "node 2 does not answer after its restart"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    for shard in seen.shards.iter().filter(|s| s.shard_id != 0) {
        assert_eq!(shard.constraints, "-region=ap-south", "{shard:?}");
    }

    // 5. Cleared, the node may take a replica again.
    let said = cli(
        &endpoints,
        &[
            "cluster",
            "placement",
            "1",
            "--home",
            "us-east",
            "--constraints",
            "none",
        ],
    );
    assert!(said.contains("replica constraints none"), "{said}");
    cli(&endpoints, &["cluster", "add-replica", "1", "3"]);
    assert!(shard_at(&cluster, 1, 1).await.replicas.contains(&AP_SOUTH));
    assert_eq!(constraints_cell(&endpoints, 1), "-");

    // 6. Region survival: shard 1 has four replicas, two in one region (us-east or eu-west),
    //    one in the other, one in ap-south. Removing the lone one would leave two of three in
    //    the crowded region while removing a crowded one would not: refused, naming those.
    let replicas = shard_at(&cluster, 1, 1).await.replicas;
    let region = meridian_cli::local_cluster::default_region;
    let mut crowded: Vec<u64> = replicas
        .iter()
        .copied()
        .filter(|id| {
            replicas
                .iter()
                .filter(|o| region(**o) == region(*id))
                .count()
                == 2
        })
        .collect();
    crowded.sort_unstable();
    let lone = *replicas
        .iter()
        .find(|id| **id != AP_SOUTH && !crowded.contains(id))
        .expect("a lone replica");
    eprintln!("shard 1: {replicas:?}, crowded {crowded:?}, lone {lone}");
    assert_eq!(crowded.len(), 2, "{replicas:?}");
    let said = cli_refused(
        [
            "cluster",
            "remove-replica",
            "1",
            &lone.to_string(),
            "--endpoints",
            &endpoints.join(","),
        ]
        .map(String::from)
        .to_vec(),
    )
    .await;
    assert!(
        said.contains(&format!(
            "would leave {} with 2 of its 3 replicas",
            region(crowded[0])
        )) && said.contains(&format!(
            "Remove node {}'s or node {}'s replica instead",
            crowded[0], crowded[1]
        )),
        "{said}"
    );
    cli(
        &endpoints,
        &["cluster", "remove-replica", "1", &crowded[0].to_string()],
    );
    let give_up = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let left = shard_at(&cluster, 1, 1).await.replicas;
        if left.len() == 3 {
            break;
        }
        assert!(std::time::Instant::now() < give_up, "{left:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    writer.await.unwrap();
    let written = acked.lock().unwrap().clone();
    eprintln!("{} acknowledged writes", written.len());
    read_back(&client, &written).await;
}
