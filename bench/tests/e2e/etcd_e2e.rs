//! End-to-end load and run against a live etcd given by `MERIDIAN_BENCH_ETCD`
//! (e.g. `http://127.0.0.1:2379`; comma-separated for several members).
//!
//! Without the variable the test is skipped with a note, except under CI (`CI` set), where a
//! missing etcd is a failure: CI must start one (see `bench/scripts/etcd-cluster.sh`).

use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use meridian_bench::cli::run_cli;

const ENDPOINT_VAR: &str = "MERIDIAN_BENCH_ETCD";

fn endpoint() -> Option<String> {
    match std::env::var(ENDPOINT_VAR) {
        Ok(value) if !value.trim().is_empty() => Some(value),
        _ => {
            assert!(
                std::env::var_os("CI").is_none(),
                "CI is set but {ENDPOINT_VAR} is not: CI must start etcd and export \
                 {ENDPOINT_VAR}=http://127.0.0.1:PORT"
            );
            eprintln!(
                "note: skipping the etcd end-to-end test; set {ENDPOINT_VAR}=http://127.0.0.1:2379 \
                 to run it against a live etcd"
            );
            None
        }
    }
}

fn workload(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("workloads")
        .join(name)
        .display()
        .to_string()
}

/// Load 300 records into etcd, then run workloads A (read/update) and E (scan/insert) on them
/// with every operation OK; the test's table is deleted afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_load_and_run() {
    let Some(endpoints) = endpoint() else {
        return;
    };
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|elapsed| elapsed.as_nanos())
        .unwrap_or_default();
    let table = format!("meridianbenchtest{nanos}");
    let phase = |phase: &'static str, name: &'static str| {
        let table = table.clone();
        let endpoints = endpoints.clone();
        async move {
            run_cli([
                "meridian-ycsb".to_string(),
                phase.to_string(),
                "-P".to_string(),
                workload(name),
                "-p".to_string(),
                "recordcount=300".to_string(),
                "-p".to_string(),
                "operationcount=600".to_string(),
                "-p".to_string(),
                format!("table={table}"),
                "--threads".to_string(),
                "4".to_string(),
                "--db".to_string(),
                "etcd".to_string(),
                "--endpoints".to_string(),
                endpoints,
                "--timeout-ms".to_string(),
                "10000".to_string(),
            ])
            .await
            .unwrap_or_else(|error| panic!("{phase} {name} against etcd failed: {error:#}"))
            .into_report()
            .expect("load and run return their report")
        }
    };

    let load = phase("load", "workloada").await;
    assert_eq!(load.return_count("INSERT", "OK"), 300, "{load:?}");

    let run_a = phase("run", "workloada").await;
    assert_eq!(
        run_a.return_count("READ", "OK") + run_a.return_count("UPDATE", "OK"),
        600,
        "{run_a:?}"
    );

    let run_e = phase("run", "workloade").await;
    assert_eq!(
        run_e.return_count("SCAN", "OK") + run_e.return_count("INSERT", "OK"),
        600,
        "{run_e:?}"
    );

    // Remove the test's table.
    let client = etcd_client::Client::connect(endpoints.split(',').collect::<Vec<_>>(), None)
        .await
        .expect("connect for cleanup");
    let mut kv = client.kv_client();
    let prefix = format!("{table}/");
    kv.delete(
        prefix.clone(),
        Some(etcd_client::DeleteOptions::new().with_prefix()),
    )
    .await
    .expect("delete test table");
}
