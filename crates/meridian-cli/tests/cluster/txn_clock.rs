//! Cluster test: transactions under clock skew within `max_offset` (node 3 runs 300 ms ahead;
//! max offset 500 ms; 8 data shards).
//!
//! 1. The uncertainty window, with raw snapshot reads (`BatchGet` with a `TxnSnapshot`): after
//!    a put acknowledged at `w`, a snapshot read of the key at `T = w - 200 ms` (what a clock
//!    200 ms behind the writer's could pick) must answer "uncertain at `w`"; the same read
//!    declaring the node's clock reading to be `T` (a closed window; the node has served
//!    snapshot reads as leader since before the write, so it honours it) returns the previous
//!    value. The second read is the control: it shows the version really lies above `T`, so
//!    without the window the first read would have been stale.
//! 2. End to end: on every shard, a put, then a read-only transaction that reads a key of
//!    another shard first (that shard's leader picks the snapshot) and then the written key:
//!    it must see the write, whichever nodes' clocks were involved. Restarts are reported.
//! 3. The same for two-shard transactions (parallel commits, whose commit timestamp is the
//!    largest prepare timestamp, so often node 3's clock): after each commit, a read-only
//!    transaction through the client reads both keys and must see both new values.
//!
//! The metadata shard's log does not grow during 2 and 3 (no oracle, no registry on the path).

use crate::common::*;
use bytes::Bytes;
use meridian_cli::demo::named_keys_across_shards;
use meridian_client::proto::kv_client::KvClient;
use meridian_client::proto::{BatchGetRequest, ObservedTs, TxnSnapshot};
use meridian_client::{Client, Error, Timestamp, TxnOptions};
use std::collections::BTreeMap;

const BASE_PORT: u16 = 24_400;
const SHARDS: u32 = 8;

#[test]
fn transactions_under_clock_skew() {
    run_scenario(scenario());
}

/// Shard id → its leader's client address, from the cluster's status.
async fn leaders(client: &Client, cluster: &meridian_cli::LocalCluster) -> BTreeMap<u64, String> {
    let status = client.status().await.expect("status");
    status
        .shards
        .iter()
        .filter(|s| s.shard_id != 0 && s.leader_id != 0)
        .map(|s| {
            let addr = cluster.client_addr(s.leader_id).expect("leader address");
            (s.shard_id, addr)
        })
        .collect()
}

async fn snapshot_get(
    addr: &str,
    key: &Bytes,
    read_ts: Timestamp,
    observed: Option<(u64, Timestamp)>,
) -> meridian_client::proto::BatchGetResponse {
    let mut kv = KvClient::connect(format!("http://{addr}"))
        .await
        .expect("connect to the leader");
    let request = BatchGetRequest {
        keys: vec![key.clone()],
        snapshot: Some(TxnSnapshot {
            read_ts: read_ts.0,
            observed: observed
                .map(|(node_id, ts)| ObservedTs { node_id, ts: ts.0 })
                .into_iter()
                .collect(),
            uncertainty_limit: 0,
        }),
        ..Default::default()
    };
    kv.batch_get(request)
        .await
        .expect("snapshot batch_get")
        .into_inner()
}

async fn uncertainty_window(client: &Client, cluster: &meridian_cli::LocalCluster, keys: &[Bytes]) {
    let leaders = leaders(client, cluster).await;
    let key = keys[0].clone();
    let shard = client.route(&key).expect("routed").shard_id;
    let addr = leaders.get(&shard).expect("the shard has a leader").clone();
    // A first snapshot read marks when this leader started serving them (a reading of this
    // node counts for the window only after that mark, see `kv_snapshot`).
    snapshot_get(&addr, &key, Timestamp::ZERO, None).await;
    client.put(key.clone(), "old").await.expect("put old");
    // "old" well below w - 200 ms.
    tokio::time::sleep(std::time::Duration::from_millis(400)).await;
    let w = client.put(key.clone(), "new").await.expect("put new");
    let before = Timestamp(w.0 - Timestamp::from_physical_ms(200).0);

    let uncertain = snapshot_get(&addr, &key, before, None).await;
    let reply = uncertain.snapshot.expect("a snapshot reply");
    eprintln!(
        "read at w - 200 ms from node {}: uncertain_ts {} (w = {w}), observed {}",
        reply.node_id,
        Timestamp(reply.uncertain_ts),
        Timestamp(reply.observed_ts)
    );
    assert_eq!(
        Timestamp(reply.uncertain_ts),
        w,
        "the acknowledged version lies in the uncertainty window"
    );
    assert!(
        uncertain.results.is_empty(),
        "an uncertain read answers nothing"
    );

    // Control: the same read with the window closed at T reads below the write.
    let closed = snapshot_get(&addr, &key, before, Some((reply.node_id, before))).await;
    let reply = closed.snapshot.expect("a snapshot reply");
    assert_eq!(reply.uncertain_ts, 0, "a closed window is never uncertain");
    let result = closed.results.first().expect("one result");
    assert_eq!(
        (result.found, &result.value[..]),
        (true, &b"old"[..]),
        "control: without the window the read misses the acknowledged write"
    );
}

/// The metadata shard's last log index, as every node reports it.
async fn meta_log(cluster: &meridian_cli::LocalCluster) -> Vec<u64> {
    let mut out = Vec::new();
    for node in cluster.node_ids() {
        let addr = cluster.client_addr(node).expect("address");
        let status = meridian_client::fetch_status(&addr, std::time::Duration::from_secs(5))
            .await
            .expect("status");
        let meta = status
            .shards
            .iter()
            .find(|s| s.shard_id == 0)
            .expect("meta");
        out.push(meta.last_log_index);
    }
    out
}

async fn reads_after_writes(client: &Client, keys: &[Bytes]) {
    let mut restarted = 0;
    for round in 0..3 {
        for (i, written) in keys.iter().enumerate() {
            let first = keys[(i + 1) % keys.len()].clone();
            let value = format!("round{round}-{i}");
            client
                .put(written.clone(), value.clone())
                .await
                .expect("put");
            let written = written.clone();
            let (seen, info) = client
                .txn(TxnOptions::default(), |txn| {
                    let (first, written) = (first.clone(), written.clone());
                    Box::pin(async move {
                        txn.get(first).await?;
                        txn.get(written).await
                    })
                })
                .await
                .expect("read-only transaction");
            assert_eq!(
                seen.as_deref(),
                Some(value.as_bytes()),
                "a transaction begun after the put must see it"
            );
            restarted += usize::from(info.attempts > 1);
        }
    }
    eprintln!(
        "{} read-only transactions after writes, {restarted} restarted after an uncertain read",
        3 * keys.len()
    );
}

async fn two_shard_writes_then_reads(client: &Client, keys: &[Bytes]) {
    let mut restarted = 0;
    for i in 0..keys.len() {
        let pair = [keys[i].clone(), keys[(i + 1) % keys.len()].clone()];
        let value = format!("pair-{i}");
        let (_, info) = client
            .txn(TxnOptions::default(), |txn| {
                let (pair, value) = (pair.clone(), value.clone());
                Box::pin(async move {
                    for key in pair {
                        txn.put(key, value.clone())?;
                    }
                    Ok::<_, Error>(())
                })
            })
            .await
            .expect("a two-shard transaction");
        assert!(info.commit_ts.is_some(), "it wrote: {info:?}");
        let (seen, info) = client
            .txn(TxnOptions::default(), |txn| {
                let pair = pair.clone();
                Box::pin(async move { txn.batch_get(pair.iter().cloned()).await })
            })
            .await
            .expect("read-only transaction");
        let want = Some(bytes::Bytes::from(value));
        assert_eq!(
            seen,
            vec![want.clone(), want],
            "both writes, after the commit"
        );
        restarted += usize::from(info.attempts > 1);
    }
    eprintln!(
        "{} two-shard commits each read back by a transaction, {restarted} reads restarted",
        keys.len()
    );
}

async fn scenario() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = start_cluster(
        BASE_PORT,
        dir.path(),
        SHARDS,
        &[
            (1, &["--max-offset-ms", "500"]),
            (2, &["--max-offset-ms", "500"]),
            (3, &["--max-offset-ms", "500", "--clock-offset-ms", "300"]),
        ],
    );
    cluster
        .wait_ready(READY_TIMEOUT)
        .await
        .expect("cluster ready");
    let client = connect_client(cluster.endpoints()).await;
    let keys = named_keys_across_shards(&client.shard_map(), SHARDS as usize, "clock");
    uncertainty_window(&client, &cluster, &keys).await;
    let meta_before = meta_log(&cluster).await;
    reads_after_writes(&client, &keys).await;
    two_shard_writes_then_reads(&client, &keys).await;
    assert_eq!(
        meta_log(&cluster).await,
        meta_before,
        "transactions never touch the metadata shard: nothing was appended to its log"
    );
}
