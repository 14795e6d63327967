//! Cluster test: stop every node with SIGTERM, start them again on the same data
//! directories, and find every write (and delete) still there.

use crate::common::*;
use bytes::Bytes;
use meridian_cli::demo::keys_across_shards;
use std::time::Duration;

const KEYS: usize = 2_000;
const DELETED_EVERY: usize = 20;

/// All writes survive a full-cluster SIGTERM and restart.
#[test]
fn full_cluster_restart_keeps_data() {
    run_scenario(scenario());
}

fn value(index: usize) -> Bytes {
    Bytes::from(format!("persisted-{index}"))
}

async fn scenario() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = start_cluster(21_200, dir.path(), 8, &[]);
    cluster
        .wait_ready(READY_TIMEOUT)
        .await
        .expect("cluster ready");
    let client = connect_client(cluster.endpoints()).await;
    let keys = keys_across_shards(&client.shard_map(), KEYS);

    // Half by batches, half by single puts; then delete every DELETED_EVERY-th key.
    let half = KEYS / 2;
    for (chunk_index, chunk) in keys[..half].chunks(100).enumerate() {
        let entries: Vec<(Bytes, Bytes)> = chunk
            .iter()
            .enumerate()
            .map(|(i, k)| (k.clone(), value(chunk_index * 100 + i)))
            .collect();
        client.batch_put(entries).await.expect("batch_put");
    }
    let puts = futures::future::join_all((half..KEYS).map(|i| {
        let client = client.clone();
        let key = keys[i].clone();
        async move { client.put(key, value(i)).await }
    }))
    .await;
    for result in puts {
        result.expect("put");
    }
    for index in (0..KEYS).step_by(DELETED_EVERY) {
        client.delete(keys[index].clone()).await.expect("delete");
    }
    drop(client);

    let killed = cluster.stop_all(Duration::from_secs(30));
    assert!(
        killed.is_empty(),
        "nodes {killed:?} did not stop on SIGTERM"
    );
    for node_id in cluster.node_ids() {
        cluster.restart(node_id).expect("restart");
    }
    cluster
        .wait_ready(READY_TIMEOUT)
        .await
        .expect("cluster ready after restart");
    let client = connect_client(cluster.endpoints()).await;

    let mut wrong = Vec::new();
    for (chunk_index, chunk) in keys.chunks(500).enumerate() {
        let values = client.batch_get(chunk.to_vec()).await.expect("batch_get");
        for (i, got) in values.into_iter().enumerate() {
            let index = chunk_index * 500 + i;
            let expected = (index % DELETED_EVERY != 0).then(|| value(index));
            if got != expected {
                wrong.push((index, got, expected));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "{} keys wrong after restart, e.g. {:?}",
        wrong.len(),
        &wrong[..wrong.len().min(5)]
    );
    // And the restarted cluster takes writes.
    client
        .put("after-restart", "ok")
        .await
        .expect("put after restart");
    assert_eq!(
        client.get("after-restart").await.unwrap().as_deref(),
        Some(&b"ok"[..])
    );
    let killed = cluster.stop_all(Duration::from_secs(30));
    assert!(
        killed.is_empty(),
        "nodes {killed:?} did not stop on SIGTERM"
    );
}
