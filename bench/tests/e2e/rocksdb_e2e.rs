//! End-to-end runs of `meridian-ycsb` against the embedded RocksDB driver, through the same
//! `run_cli` entry point the binary uses.

use std::path::{Path, PathBuf};

use meridian_bench::cli::run_cli;
use meridian_bench::report::Report;

fn workload(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("workloads")
        .join(name)
        .display()
        .to_string()
}

async fn ycsb(phase: &str, workload_name: &str, data_dir: &Path, extra: &[&str]) -> Report {
    let mut args: Vec<String> = vec![
        "meridian-ycsb".into(),
        phase.into(),
        "-P".into(),
        workload(workload_name),
        "-p".into(),
        "recordcount=1000".into(),
        "-p".into(),
        "operationcount=2000".into(),
        "--threads".into(),
        "4".into(),
        "--db".into(),
        "rocksdb".into(),
        "--data-dir".into(),
        data_dir.display().to_string(),
        "--status-interval".into(),
        "1".into(),
    ];
    args.extend(extra.iter().map(|arg| arg.to_string()));
    run_cli(args)
        .await
        .unwrap_or_else(|error| panic!("{phase} {workload_name} failed: {error:#}"))
        .into_report()
        .expect("load and run return their report")
}

fn ops(report: &Report, name: &str) -> u64 {
    report.operation(name).map_or(0, |entry| entry.operations)
}

/// Loading 1000 records and running workload A leaves every operation OK and counts add up;
/// the JSON report matches the text one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn load_then_run_workload_a() {
    let dir = tempfile::tempdir().expect("temp dir");
    let data_dir = dir.path().join("db");
    let json_path: PathBuf = dir.path().join("run.json");

    let load = ycsb("load", "workloada", &data_dir, &[]).await;
    assert_eq!(ops(&load, "INSERT"), 1000);
    assert_eq!(load.return_count("INSERT", "OK"), 1000);
    assert!(load.operation("INSERT-FAILED").is_none());
    assert_eq!(ops(&load, "CLEANUP"), 4);

    let json_arg = json_path.display().to_string();
    let run = ycsb("run", "workloada", &data_dir, &["--json-out", &json_arg]).await;
    let reads = run.return_count("READ", "OK");
    let updates = run.return_count("UPDATE", "OK");
    assert_eq!(reads + updates, 2000, "every operation OK: {run:?}");
    assert!(
        reads > 800 && updates > 800,
        "about half each: {reads} / {updates}"
    );
    assert_eq!(run.return_count("READ", "NOT_FOUND"), 0);
    assert!(run.throughput_ops_per_sec > 0.0);

    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json_path).expect("json written"))
            .expect("valid json");
    assert_eq!(json["phase"], "run");
    assert_eq!(json["db"], "rocksdb");
    assert_eq!(json["properties"]["recordcount"], "1000");
    assert_eq!(json["runtime_ms"], run.runtime_ms);
    let parsed = meridian_bench::report::parse_text(&run.render_text()).expect("parses");
    assert_eq!(parsed, run);
}

/// Workloads B-F run over the same loaded table with no errors; D and E insert, E scans, F
/// records READ-MODIFY-WRITE; a throttled run records intended-start latencies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workloads_b_to_f_and_throttling() {
    let dir = tempfile::tempdir().expect("temp dir");
    let data_dir = dir.path().join("db");
    ycsb("load", "workloada", &data_dir, &[]).await;

    for name in [
        "workloadb",
        "workloadc",
        "workloadd",
        "workloade",
        "workloadf",
    ] {
        let run = ycsb("run", name, &data_dir, &["-p", "seed=7"]).await;
        for entry in &run.operations {
            assert!(
                !entry.name.ends_with("-FAILED"),
                "{name}: failures in {}: {run:?}",
                entry.name
            );
        }
        match name {
            "workloadd" => assert!(run.return_count("INSERT", "OK") > 0),
            "workloade" => {
                assert!(run.return_count("SCAN", "OK") > 1500);
                assert!(run.return_count("INSERT", "OK") > 0);
            }
            "workloadf" => {
                let rmw = ops(&run, "READ-MODIFY-WRITE");
                assert!(rmw > 800, "read-modify-writes: {rmw}");
                // Each read-modify-write is also one READ and one UPDATE.
                assert_eq!(run.return_count("UPDATE", "OK"), rmw);
                assert_eq!(run.return_count("READ", "OK"), 2000);
            }
            _ => assert!(run.return_count("READ", "OK") > 0),
        }
    }

    let throttled = ycsb(
        "run",
        "workloadc",
        &data_dir,
        &["-p", "operationcount=400", "--target", "2000"],
    )
    .await;
    assert_eq!(throttled.return_count("READ", "OK"), 400);
    assert_eq!(ops(&throttled, "Intended-READ"), 400);
    // 400 operations at 2000 ops/s take at least ~0.2 s.
    assert!(
        throttled.runtime_ms >= 150,
        "runtime {}",
        throttled.runtime_ms
    );
}

/// `--db meridian` against an address where no node listens fails with a clear error within
/// the call deadline instead of hanging.
#[tokio::test]
async fn meridian_driver_reports_unreachable_cluster() {
    let error = run_cli([
        "meridian-ycsb",
        "run",
        "-P",
        &workload("workloada"),
        "--db",
        "meridian",
        "--endpoints",
        "127.0.0.1:1",
        "--timeout-ms",
        "2000",
    ])
    .await
    .expect_err("must fail");
    let text = format!("{error:#}");
    assert!(text.contains("127.0.0.1:1"), "{text}");
}
