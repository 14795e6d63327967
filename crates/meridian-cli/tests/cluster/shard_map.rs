//! Cluster test: the shard map is one versioned record in the metadata shard. Requests carry
//! the route (shard and range generation) they were sent by, and a node refuses a stale one;
//! a node restarted with a configuration that gives another map refuses to start.

use crate::common::*;
use bytes::Bytes;
use meridian_client::fetch_status;
use meridian_client::proto::kv_client::KvClient;
use meridian_client::proto::{GetRequest, PutRequest, Route};
use meridian_types::error::ERROR_CODE_HEADER;
use std::time::{Duration, Instant};
use tonic::Code;

const BASE_PORT: u16 = 25_600;

#[test]
fn the_stored_shard_map_routes_and_fences_a_misconfigured_node() {
    run_scenario(scenario());
}

fn code_of(status: &tonic::Status) -> String {
    status
        .metadata()
        .get(ERROR_CODE_HEADER)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string()
}

async fn scenario() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = start_cluster(BASE_PORT, dir.path(), 4, &[]);
    let status = cluster
        .wait_ready(READY_TIMEOUT)
        .await
        .expect("cluster ready");
    assert_eq!(status.shard_map_version, 1);
    assert!(
        status.shards.iter().all(|s| s.generation == 1),
        "founding generations: {:?}",
        status
            .shards
            .iter()
            .map(|s| (s.shard_id, s.generation))
            .collect::<Vec<_>>()
    );

    // The founding map gets stored once; every node sees it stored (its own or a match).
    let give_up = Instant::now() + Duration::from_secs(30);
    loop {
        let logs: Vec<String> = (1..=3)
            .map(|n| cluster.log_contents(n).unwrap_or_default())
            .collect();
        let stored = logs
            .iter()
            .filter(|l| l.contains("stored the founding shard map"))
            .count();
        let matched = logs
            .iter()
            .filter(|l| l.contains("the stored shard map matches this node's"))
            .count();
        // (A node whose write applied but whose answer was lost sees a match on its retry.)
        if stored + matched == 3 {
            break;
        }
        assert!(
            stored <= 1,
            "the map must be written exactly once, {stored} nodes wrote it"
        );
        assert!(
            Instant::now() < give_up,
            "nodes did not store and check the map: {stored} stored, {matched} matched"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // A write through the client (its routes carry generation 1) works.
    let client = connect_client(cluster.endpoints()).await;
    client.put("user1", "v1").await.expect("routed put");
    let shard = client.route(b"user1").expect("a route").shard_id;
    let other = client
        .shard_map()
        .shards()
        .iter()
        .map(|s| s.shard_id)
        .find(|id| *id != shard)
        .expect("4 shards");

    // Raw requests with stale routes: refused before anything is read or proposed, by any node.
    for (what, route) in [
        (
            "a newer generation",
            Route {
                shard_id: shard,
                generation: 2,
            },
        ),
        (
            "another shard",
            Route {
                shard_id: other,
                generation: 1,
            },
        ),
    ] {
        for address in cluster.endpoints() {
            let mut kv = KvClient::connect(format!("http://{address}"))
                .await
                .expect("connect");
            let status = kv
                .get(GetRequest {
                    key: Bytes::from("user1"),
                    route: Some(route),
                    ..Default::default()
                })
                .await
                .expect_err("a stale route is refused");
            assert_eq!(status.code(), Code::NotFound, "{what}: {status:?}");
            assert_eq!(code_of(&status), "WRONG_SHARD", "{what}: {status:?}");
            let status = kv
                .put(PutRequest {
                    key: Bytes::from("user1"),
                    value: Bytes::from("stale"),
                    route: Some(route),
                    ..Default::default()
                })
                .await
                .expect_err("a stale write is refused");
            assert_eq!(code_of(&status), "WRONG_SHARD", "{what}: {status:?}");
        }
        eprintln!("{what}: WRONG_SHARD from every node");
    }
    assert_eq!(
        client.get("user1").await.expect("get").as_deref(),
        Some(&b"v1"[..]),
        "no stale write landed"
    );

    // Node 3 restarted with other home regions (another replica order, another map): it
    // refuses to start, naming the difference; the others keep serving.
    let (_, graceful) = cluster
        .stop(3, Duration::from_secs(20))
        .expect("stop node 3");
    assert!(graceful, "node 3 ignored SIGTERM");
    cluster
        .restart_with_args(3, &["--home-regions".into(), "=ap-south".into()])
        .expect("restart node 3 misconfigured");
    let exit = cluster
        .wait_exit(3, Duration::from_secs(30))
        .expect("wait for node 3")
        .expect("node 3 refused to start");
    assert!(!exit.success(), "{exit:?}");
    let log = cluster.log_contents(3).unwrap_or_default();
    assert!(
        log.contains("differs from the one this node's configuration gives"),
        "node 3's log names the mismatch: {}",
        cluster.log_tail(3, 20)
    );
    client
        .put("user1", "v2")
        .await
        .expect("nodes 1 and 2 serve");

    // With its founding configuration it starts and serves again.
    cluster.restart(3).expect("restart node 3");
    cluster
        .wait_ready(READY_TIMEOUT)
        .await
        .expect("ready with node 3 back");
    // Ready may be reported by nodes 1 and 2 while node 3 still waits out its HLC ceiling.
    let address = cluster.client_addr(3).unwrap();
    let give_up = Instant::now() + READY_TIMEOUT;
    let status = loop {
        match fetch_status(&address, Duration::from_secs(2)).await {
            Ok(status) => break status,
            Err(e) => {
                assert!(Instant::now() < give_up, "node 3 never answered: {e}");
                assert!(
                    cluster.is_running(3).unwrap_or(false),
                    "node 3 exited with its founding configuration: {}",
                    cluster.log_tail(3, 20)
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    };
    assert_eq!(status.shard_map_version, 1);
    assert_eq!(
        client.get("user1").await.expect("get").as_deref(),
        Some(&b"v2"[..])
    );
    cluster.stop_all(Duration::from_secs(20));
}
