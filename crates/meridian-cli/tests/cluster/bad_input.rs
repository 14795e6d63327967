//! Cluster test: malformed requests are refused with INVALID_ARGUMENT (by the server, not only
//! the client), write nothing, and leave the node serving; bad node configurations fail to
//! start with errors that name the problem.

use crate::common::*;
use bytes::Bytes;
use meridian_client::proto::kv_client::KvClient;
use meridian_client::proto::{
    BatchGetRequest, BatchPutRequest, GetRequest, KeyValue, PutRequest, ScanRequest,
};
use meridian_client::Error;
use meridian_types::error::ERROR_CODE_HEADER;
use meridian_types::limits::{MAX_BATCH_KEYS, MAX_KEY_BYTES, MAX_SCAN_LIMIT, MAX_VALUE_BYTES};
use std::future::Future;
use std::process::Command;
use std::time::Duration;
use tonic::transport::Channel;
use tonic::Code;

const BASE_PORT: u16 = 21_800;

/// Bad requests → InvalidArgument naming the problem, nothing written, node still serving;
/// bad data dir / flags / config fields → non-zero exit naming the problem.
#[test]
fn bad_input() {
    run_scenario(scenario());
}

async fn raw_client(address: &str) -> KvClient<Channel> {
    KvClient::connect(format!("http://{address}"))
        .await
        .expect("raw connect")
        .max_encoding_message_size(64 * 1024 * 1024)
        .max_decoding_message_size(64 * 1024 * 1024)
}

/// Sends a raw request to each node until one answers with something other than NOT_LEADER
/// (a node may check leadership before validating); returns that status.
async fn refused<T, F, Fut>(endpoints: &[String], what: &str, call: F) -> tonic::Status
where
    F: Fn(KvClient<Channel>) -> Fut,
    Fut: Future<Output = Result<T, tonic::Status>>,
{
    for address in endpoints {
        let client = raw_client(address).await;
        match tokio::time::timeout(Duration::from_secs(10), call(client)).await {
            Err(_) => panic!("{what}: no answer from {address}"),
            Ok(Ok(_)) => panic!("{what}: accepted by {address}"),
            Ok(Err(status)) => {
                let code = status
                    .metadata()
                    .get(ERROR_CODE_HEADER)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("")
                    .to_string();
                if code == "NOT_LEADER" {
                    continue;
                }
                return status;
            }
        }
    }
    panic!("{what}: every node answered NOT_LEADER")
}

fn assert_invalid(status: &tonic::Status, what: &str, any_of: &[&str]) {
    assert_eq!(status.code(), Code::InvalidArgument, "{what}: {status:?}");
    let message = status.message().to_lowercase();
    assert!(
        any_of.iter().any(|word| message.contains(word)),
        "{what}: message {message:?} names none of {any_of:?}"
    );
    eprintln!("{what}: INVALID_ARGUMENT {:?}", status.message());
}

async fn scenario() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = start_cluster(BASE_PORT, dir.path(), 4, &[]);
    cluster
        .wait_ready(READY_TIMEOUT)
        .await
        .expect("cluster ready");
    let client = connect_client(cluster.endpoints()).await;
    let endpoints = cluster.endpoints();
    let map = client.shard_map();

    // ---- raw requests over the limits ----------------------------------------------------
    let status = refused(&endpoints, "empty key", |mut c| async move {
        c.put(PutRequest {
            key: Bytes::new(),
            value: Bytes::from("v"),
            write_id: None,
            ..Default::default()
        })
        .await
    })
    .await;
    assert_invalid(&status, "put with empty key", &["key"]);

    let status = refused(&endpoints, "empty get key", |mut c| async move {
        c.get(GetRequest {
            key: Bytes::new(),
            consistency: 0,
            ..Default::default()
        })
        .await
    })
    .await;
    assert_invalid(&status, "get with empty key", &["key"]);

    let big_key = Bytes::from(vec![b'k'; MAX_KEY_BYTES + 1]);
    let status = refused(&endpoints, "big key", |mut c| {
        let key = big_key.clone();
        async move {
            c.put(PutRequest {
                key,
                value: Bytes::from("v"),
                write_id: None,
                ..Default::default()
            })
            .await
        }
    })
    .await;
    assert_invalid(&status, "put with key over MAX_KEY_BYTES", &["key"]);

    let big_value_key = Bytes::from("bad-input/big-value");
    let big_value = Bytes::from(vec![b'v'; MAX_VALUE_BYTES + 1]);
    let status = refused(&endpoints, "big value", |mut c| {
        let (key, value) = (big_value_key.clone(), big_value.clone());
        async move {
            c.put(PutRequest {
                key,
                value,
                write_id: None,
                ..Default::default()
            })
            .await
        }
    })
    .await;
    assert_invalid(&status, "put with value over MAX_VALUE_BYTES", &["value"]);

    let status = refused(&endpoints, "inverted scan", |mut c| async move {
        c.scan(ScanRequest {
            start: Bytes::from("m"),
            end: Bytes::from("c"),
            limit: 10,
            ..Default::default()
        })
        .await
    })
    .await;
    assert_invalid(
        &status,
        "scan with start > end",
        &["inverted", "range", "start", "end"],
    );

    for limit in [0, MAX_SCAN_LIMIT + 1] {
        let status = refused(&endpoints, "scan limit", |mut c| async move {
            c.scan(ScanRequest {
                start: Bytes::from("a"),
                limit,
                ..Default::default()
            })
            .await
        })
        .await;
        assert_invalid(&status, &format!("scan with limit {limit}"), &["limit"]);
    }

    // Oversized batches whose keys all sit in one shard, so only the size is wrong.
    let shard = &map.shards()[1];
    let batch_keys: Vec<Bytes> = (0..=MAX_BATCH_KEYS)
        .map(|i| {
            Bytes::from([shard.start.as_ref(), format!("bad-batch-{i:05}").as_bytes()].concat())
        })
        .collect();
    assert!(batch_keys.iter().all(|k| shard.contains(k)));
    let status = refused(&endpoints, "big batch_put", |mut c| {
        let entries = batch_keys
            .iter()
            .map(|k| KeyValue {
                key: k.clone(),
                value: Bytes::from("v"),
                version_ts: 0,
            })
            .collect();
        async move {
            c.batch_put(BatchPutRequest {
                entries,
                deletes: Vec::new(),
                write_id: None,
                ..Default::default()
            })
            .await
        }
    })
    .await;
    assert_invalid(
        &status,
        "batch_put over MAX_BATCH_KEYS",
        &["batch", "keys", "entries"],
    );
    let status = refused(&endpoints, "big batch_get", |mut c| {
        let keys = batch_keys.clone();
        async move {
            c.batch_get(BatchGetRequest {
                keys,
                ..Default::default()
            })
            .await
        }
    })
    .await;
    assert_invalid(&status, "batch_get over MAX_BATCH_KEYS", &["batch", "keys"]);

    // Nothing was written.
    assert_eq!(client.get(big_value_key.clone()).await.expect("get"), None);
    let sample: Vec<Bytes> = batch_keys.iter().step_by(100).cloned().collect();
    let values = client.batch_get(sample).await.expect("batch_get");
    assert!(
        values.iter().all(Option::is_none),
        "a refused batch wrote something"
    );

    // The client refuses the same inputs before sending them.
    let invalid = |result: Result<(), Error>, what: &str| {
        assert!(
            matches!(result, Err(Error::InvalidArgument { .. })),
            "{what}: {result:?}"
        );
    };
    invalid(client.put("", "v").await.map(|_| ()), "client empty key");
    invalid(
        client.put(big_key.clone(), "v").await.map(|_| ()),
        "client big key",
    );
    invalid(
        client.put("k", big_value.clone()).await.map(|_| ()),
        "client big value",
    );
    invalid(
        client
            .scan("m", Some(Bytes::from("c")), 10, false)
            .await
            .map(|_| ()),
        "client inverted",
    );
    invalid(
        client.scan("a", None, 0, false).await.map(|_| ()),
        "client limit 0",
    );
    invalid(
        client.batch_get(batch_keys.clone()).await.map(|_| ()),
        "client big batch",
    );

    // The node keeps serving.
    client
        .put("bad-input/after", "still-serving")
        .await
        .expect("put after bad input");
    assert_eq!(
        client.get("bad-input/after").await.unwrap().as_deref(),
        Some(&b"still-serving"[..])
    );

    // ---- a data dir from another cluster ------------------------------------------------
    let (_, graceful) = cluster
        .stop(1, Duration::from_secs(20))
        .expect("stop node 1");
    assert!(graceful, "node 1 did not stop on SIGTERM");
    let foreign = dir.path().join("foreign-copy");
    copy_dir(&cluster.spec(1).unwrap().data_dir, &foreign);
    let output = run_bounded(
        Command::new(binary())
            .args(["start", "--node-id", "7", "--client-addr"])
            .arg(format!("127.0.0.1:{}", BASE_PORT + 150))
            .arg("--peer-addr")
            .arg(format!("127.0.0.1:{}", BASE_PORT + 160))
            .arg("--data-dir")
            .arg(&foreign)
            .arg("--initial-cluster")
            .arg(format!("7=127.0.0.1:{}@solo/a", BASE_PORT + 160))
            .args([
                "--heartbeat-interval-ms",
                "100",
                "--election-timeout-min-ms",
                "600",
            ]),
        Duration::from_secs(60),
    );
    let stderr = String::from_utf8_lossy(&output.stderr).to_string();
    eprintln!(
        "foreign data dir: {} / stderr tail: {}",
        output.status,
        tail(&stderr)
    );
    assert!(
        !output.status.success(),
        "a node started on another cluster's data dir"
    );
    let lower = stderr.to_lowercase();
    assert!(
        lower.contains("cluster") || lower.contains("node id") || lower.contains("node_id"),
        "the error does not say what is wrong: {stderr}"
    );
    cluster.restart(1).expect("restart node 1");
    cluster
        .wait_ready(READY_TIMEOUT)
        .await
        .expect("ready after node 1 restart");

    // ---- bad flags and config fields ----------------------------------------------------
    let output = run_bounded(
        Command::new(binary()).args(["start", "--bogus-flag", "1"]),
        Duration::from_secs(30),
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(
        stderr.contains("--bogus-flag"),
        "unknown flag not named: {stderr}"
    );

    let config_path = dir.path().join("bad.toml");
    std::fs::write(&config_path, "node_id = 1\nbogus_field = 3\n").unwrap();
    let output = run_bounded(
        Command::new(binary())
            .arg("start")
            .arg("--config")
            .arg(&config_path),
        Duration::from_secs(30),
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(
        stderr.contains("bogus_field"),
        "unknown config field not named: {stderr}"
    );

    let output = run_bounded(
        Command::new(binary()).args([
            "start",
            "--node-id",
            "1",
            "--client-addr",
            "not-an-address",
            "--peer-addr",
            "127.0.0.1:21990",
            "--data-dir",
            "/nonexistent/meridian",
            "--initial-cluster",
            "1=127.0.0.1:21990",
        ]),
        Duration::from_secs(30),
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(
        stderr.contains("client_addr"),
        "bad field not named: {stderr}"
    );

    // Zone survival in a region whose three members use two zones: losing zone a would
    // leave one voter of three, so founding the cluster is refused before anything starts.
    let output = run_bounded(
        Command::new(binary())
            .args([
                "start",
                "--node-id",
                "1",
                "--client-addr",
                "127.0.0.1:21991",
            ])
            .args(["--peer-addr", "127.0.0.1:21992", "--data-dir"])
            .arg(dir.path().join("zone-rule"))
            .args([
                "--initial-cluster",
                "1=127.0.0.1:21992@us/a,2=127.0.0.1:21993@us/a,3=127.0.0.1:21994@us/b",
                "--home-regions",
                "=us:zone",
            ]),
        Duration::from_secs(30),
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(
        stderr.contains("cluster.home_regions: shard 1")
            && stderr.contains("2 of its 3 replicas there are in zone \"a\" (nodes [1, 2])"),
        "the zone rule's problem not named: {stderr}"
    );

    let killed = cluster.stop_all(Duration::from_secs(20));
    assert!(killed.is_empty(), "nodes {killed:?} ignored SIGTERM");
}

fn tail(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(5)..].join("\n")
}
