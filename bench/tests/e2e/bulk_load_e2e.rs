//! `meridian-ycsb bulk-load` against a real 3-node loopback cluster: every record of the range
//! is written once, under the key `load` would use, with a value `run` can decode; and a `run`
//! of reads finds every record it asks for.

use std::time::Duration;

use meridian_bench::cli::{run_cli, CliOutcome};
use meridian_bench::record;
use meridian_cli::local_cluster::{LocalCluster, LocalClusterConfig};
use meridian_client::{Client, ClientConfig};

const BASE_PORT: u16 = 30_800;
const RECORDS: u64 = 3_000;

fn args(parts: &[&str]) -> Vec<String> {
    parts.iter().map(|s| s.to_string()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bulk_load_writes_every_record_that_run_then_reads() {
    let _servers = crate::common::SERVERS.lock().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let cluster = LocalCluster::start(LocalClusterConfig::new(
        crate::common::meridian_binary(),
        3,
        BASE_PORT,
        dir.path(),
    ))
    .expect("starting the cluster");
    cluster
        .wait_ready(Duration::from_secs(60))
        .await
        .expect("every shard led");
    let endpoints = cluster.endpoints().join(",");

    let outcome = run_cli(args(&[
        "meridian-ycsb",
        "bulk-load",
        "-p",
        &format!("recordcount={RECORDS}"),
        "-p",
        "fieldcount=2",
        "-p",
        "fieldlength=16",
        "--endpoints",
        &endpoints,
        "--batch",
        "400",
        "--concurrency",
        "3",
        "--status-interval",
        "1",
    ]))
    .await
    .unwrap_or_else(|error| panic!("bulk-load failed: {error:#}"));
    let CliOutcome::BulkLoad(summary) = outcome else {
        panic!("bulk-load returns its summary");
    };
    assert_eq!(summary.records, RECORDS);

    // Exactly the records `load` would name, each once, each a 2-field record.
    let client = Client::connect(ClientConfig::new(cluster.endpoints()))
        .await
        .expect("client");
    assert_eq!(
        count_records(&client, 2).await,
        RECORDS,
        "keys in the cluster"
    );

    // A run of reads over the same key space finds every record it asks for.
    let run = run_cli(args(&[
        "meridian-ycsb",
        "run",
        "-p",
        &format!("recordcount={RECORDS}"),
        "-p",
        "fieldcount=2",
        "-p",
        "operationcount=500",
        "-p",
        "readproportion=1",
        "-p",
        "updateproportion=0",
        "--threads",
        "4",
        "--db",
        "meridian",
        "--endpoints",
        &endpoints,
    ]))
    .await
    .expect("run")
    .into_report()
    .expect("a run report");
    let text = run.render_text();
    assert!(text.contains("[READ], Return=OK, 500"), "{text}");
    assert!(!text.contains("NOT_FOUND"), "{text}");

    // Records too large for 1,000 in one batch_put (9 KB each, 8 MiB a call): the chunk is cut
    // by bytes and every record still lands, once.
    let outcome = run_cli(args(&[
        "meridian-ycsb",
        "bulk-load",
        "-p",
        &format!("insertstart={RECORDS}"),
        "-p",
        "insertcount=1000",
        "-p",
        "fieldcount=1",
        "-p",
        "fieldlength=9000",
        "-p",
        "table=big",
        "--endpoints",
        &endpoints,
    ]))
    .await
    .unwrap_or_else(|error| panic!("bulk-load of large records failed: {error:#}"));
    let CliOutcome::BulkLoad(summary) = outcome else {
        panic!("bulk-load returns its summary");
    };
    assert_eq!(summary.records, 1_000);
    assert_eq!(count_records_under(&client, b"big/", 1).await, 1_000);
    cluster.stop_all(Duration::from_secs(10));
}

/// Records of the default table (`user…` keys), each checked to have `fields` fields.
async fn count_records(client: &Client, fields: usize) -> u64 {
    count_records_under(client, b"user", fields).await
}

/// Keys starting with `prefix`, each a YCSB record of `fields` fields.
async fn count_records_under(client: &Client, prefix: &[u8], fields: usize) -> u64 {
    let mut found = 0u64;
    let mut start = bytes::Bytes::copy_from_slice(prefix);
    loop {
        let page = client
            .scan(start.clone(), None, 200, false)
            .await
            .expect("scan");
        let mine: Vec<_> = page
            .iter()
            .filter(|kv| kv.key.starts_with(prefix))
            .collect();
        let Some(last) = mine.last() else { break };
        start = {
            let mut next = last.key.to_vec();
            next.push(0);
            next.into()
        };
        for kv in &mine {
            let record = record::decode(&kv.value, None).expect("a YCSB record");
            assert_eq!(record.len(), fields, "fields of {:?}", kv.key);
            found += 1;
        }
    }
    found
}
