//! The closed-economy workload end to end against embedded RocksDB (an
//! `OptimisticTransactionDB`), through `run_cli`: contended transfers conserve the total and
//! the validation says so; transfers done without a transaction would not (see the Meridian
//! cluster test `crates/meridian-cli/tests/cluster/txn.rs` for that control on a real cluster).

use std::path::Path;

use meridian_bench::cli::{run_cli, CliOutcome};

fn workload() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("workloads")
        .join("closedeconomy")
        .display()
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contended_transfers_keep_the_total() {
    let _servers = crate::common::SERVERS.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let args: Vec<String> = [
        "meridian-ycsb",
        "economy",
        "-P",
        &workload(),
        "-p",
        "recordcount=20",
        "-p",
        "totalcash=2000",
        "-p",
        "operationcount=4000",
        "-p",
        "seed=7",
        "--threads",
        "16",
        "--db",
        "rocksdb",
        "--data-dir",
        &dir.path().display().to_string(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let outcome = run_cli(args).await.expect("economy run");
    let CliOutcome::Economy(text) = outcome else {
        panic!("economy returns its text report");
    };
    assert!(text.contains("[VALIDATION], Status, PASSED"), "{text}");
    assert!(text.contains("[VALIDATION], Total, 2000"), "{text}");
    let retries: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("[TRANSFER], Retries, "))
        .and_then(|n| n.trim().parse().ok())
        .expect("a retries line");
    assert!(
        retries > 0,
        "16 threads over 20 accounts never conflicted: {text}"
    );
}
