//! A short `meridian-ycsb compare` over all three stores: it completes, writes its table, JSON
//! and chart, and leaves no server process or port behind.
//!
//! Needs `etcd` on PATH (scripts/test.sh installs it): without it the test is skipped with a
//! note, except under CI (`CI` set), where it fails. Needs the `meridian` binary next to this
//! test's target directory (`<target>/release/meridian`), which `cargo nextest run --workspace`
//! builds; it is not built here.

use crate::common::meridian_binary;

use meridian_bench::cli::run_cli;
use meridian_bench::compare::stores::find_on_path;

/// Meridian's ports: clients 27501-27503, Raft 27601-27603 (distinct from every other test).
const MERIDIAN_BASE_PORT: u16 = 27_500;
/// etcd's ports: clients 23851-23853, peers 23861-23863.
const ETCD_BASE_PORT: u16 = 23_850;

const STORES: [&str; 3] = ["meridian", "etcd", "rocksdb"];
const WORKLOADS: [&str; 6] = ["A", "B", "C", "F", "D", "E"];

fn etcd_available() -> bool {
    if find_on_path("etcd").is_some() {
        return true;
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "CI is set but etcd is not on PATH: CI must install etcd-server (scripts/test.sh does)"
    );
    eprintln!("note: skipping the comparison test; install etcd (apt-get install etcd-server)");
    false
}

/// Children of this process whose command name is `etcd` or `meridian` (reaped or not).
fn server_children() -> Vec<String> {
    let me = std::process::id().to_string();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut found = Vec::new();
    for entry in entries.flatten() {
        let Ok(status) = std::fs::read_to_string(entry.path().join("status")) else {
            continue;
        };
        let field = |name: &str| {
            status
                .lines()
                .find_map(|line| line.strip_prefix(name))
                .map(|value| value.trim().to_string())
                .unwrap_or_default()
        };
        let name = field("Name:");
        if field("PPid:") == me && (name == "etcd" || name == "meridian") {
            found.push(format!(
                "{} (pid {})",
                name,
                entry.file_name().to_string_lossy()
            ));
        }
    }
    found
}

/// All three stores through all six workloads and the closed economy on a small data set:
/// results.md has a row per store and workload plus the ratios and the economy's table,
/// results.json has 18 finished runs, 6 loads and 3 validated economy runs, chart.svg is an
/// SVG, and every server is gone with its ports free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn short_comparison_of_all_stores() {
    let _servers = crate::common::SERVERS.lock().await;
    if !etcd_available() {
        return;
    }
    let meridian = meridian_binary();
    let dir = tempfile::tempdir().expect("temp dir");
    let out = dir.path().join("out");
    let data = dir.path().join("data");
    let args: Vec<String> = [
        "meridian-ycsb",
        "compare",
        "--records",
        "500",
        "--operations",
        "1000",
        "--threads",
        "4",
        "--out",
        &out.display().to_string(),
        "--data-dir",
        &data.display().to_string(),
        "--meridian-bin",
        &meridian.display().to_string(),
        "--base-port",
        &MERIDIAN_BASE_PORT.to_string(),
        "--etcd-base-port",
        &ETCD_BASE_PORT.to_string(),
        "--status-interval",
        "5",
    ]
    .iter()
    .map(|arg| arg.to_string())
    .collect();
    let outcome = run_cli(args).await;
    let leftovers = server_children();
    let outcome = outcome.unwrap_or_else(|error| panic!("compare failed: {error:#}"));
    assert!(
        outcome.into_report().is_none(),
        "compare returns no single report"
    );
    assert!(leftovers.is_empty(), "server processes left: {leftovers:?}");

    let markdown = std::fs::read_to_string(out.join("results.md")).expect("results.md written");
    for workload in WORKLOADS {
        let heading = format!("## Workload {workload}:");
        let start = markdown
            .find(&heading)
            .unwrap_or_else(|| panic!("no section {heading:?} in:\n{markdown}"));
        let section = &markdown[start..];
        let section = &section[..section[3..]
            .find("\n## ")
            .map_or(section.len(), |end| end + 3)];
        for store in STORES {
            let row = format!("| {store} | ");
            let line = section
                .lines()
                .find(|line| line.starts_with(&row))
                .unwrap_or_else(|| panic!("no {store} row for workload {workload}:\n{section}"));
            assert!(
                !line.contains("failed") && !line.contains("skipped"),
                "{line}"
            );
        }
    }
    assert!(markdown.contains("## Ratios"), "{markdown}");
    assert!(markdown.contains("Meridian/etcd throughput"), "{markdown}");
    assert!(
        markdown.contains("Meridian/RocksDB throughput"),
        "{markdown}"
    );
    assert!(markdown.contains("## Durability"), "{markdown}");
    let economy = &markdown[markdown
        .find("## Closed economy (transactions)")
        .unwrap_or_else(|| panic!("no closed-economy section in:\n{markdown}"))..];
    for store in STORES {
        let line = economy
            .lines()
            .find(|line| line.starts_with(&format!("| {store} | ")))
            .unwrap_or_else(|| panic!("no {store} economy row:\n{economy}"));
        assert!(line.ends_with("| PASSED |"), "{line}");
    }
    assert!(
        economy.contains("Meridian/etcd committed transactions/s"),
        "{economy}"
    );

    let json: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(out.join("results.json")).expect("results.json written"),
    )
    .expect("results.json parses");
    let phases = json["phases"].as_array().expect("phases array");
    assert_eq!(phases.len(), 18, "3 stores × 6 workloads");
    for phase in phases {
        assert_eq!(phase["status"], "ok", "{phase}");
        assert!(
            phase["throughput_ops_per_sec"].as_f64().unwrap_or(0.0) > 0.0,
            "{phase}"
        );
        assert_eq!(phase["report"]["properties"]["operationcount"], "1000");
        let file = phase["text_report_file"]
            .as_str()
            .expect("text report named");
        let text = std::fs::read_to_string(out.join(file)).expect("text report written");
        let report = meridian_bench::report::parse_text(&text).expect("text report parses");
        let operations: u64 = report
            .operations
            .iter()
            .filter(|op| ["READ", "UPDATE", "INSERT", "SCAN"].contains(&op.name.as_str()))
            .map(|op| op.operations)
            .sum();
        // F's read-modify-writes count one READ and one UPDATE each, so F has more.
        assert!(operations >= 1000, "{file}: {operations} operations");
    }
    let runs = json["economy"].as_array().expect("economy array");
    assert_eq!(runs.len(), 3, "one closed-economy run per store");
    for run in runs {
        assert_eq!(
            (&run["status"], &run["validation"]),
            (&serde_json::json!("ok"), &serde_json::json!("PASSED")),
            "{run}"
        );
        assert!(
            run["committed_per_sec"].as_f64().unwrap_or(0.0) > 0.0,
            "{run}"
        );
        let file = run["text_report_file"].as_str().expect("text report named");
        let text = std::fs::read_to_string(out.join(file)).expect("economy report written");
        assert!(text.contains("[VALIDATION], Status, PASSED"), "{text}");
    }
    let loads = json["loads"].as_array().expect("loads array");
    assert_eq!(loads.len(), 6, "3 stores × 2 data sets");
    for load in loads {
        assert_eq!(load["status"], "ok", "{load}");
    }
    assert_eq!(json["context"]["records"], 500);
    assert_eq!(json["context"]["threads"], 4);
    assert!(json["context"]["nproc"].as_u64().unwrap_or(0) >= 1);

    let svg = std::fs::read_to_string(out.join("chart.svg")).expect("chart.svg written");
    assert!(
        svg.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\""),
        "{svg}"
    );
    assert!(svg.trim_end().ends_with("</svg>"));
    assert_eq!(svg.matches("<svg").count(), 1);
    assert!(svg.contains("Workload E") && svg.contains("meridian") && svg.contains("<rect"));

    for port in (1..=3)
        .flat_map(|i| [MERIDIAN_BASE_PORT + i, MERIDIAN_BASE_PORT + 100 + i])
        .chain((1..=3).flat_map(|i| [ETCD_BASE_PORT + i, ETCD_BASE_PORT + 10 + i]))
    {
        std::net::TcpListener::bind(("127.0.0.1", port))
            .unwrap_or_else(|error| panic!("port {port} still taken after compare: {error}"));
    }
    assert!(
        !data.join("meridian-1").exists(),
        "store data removed without --keep-data"
    );
}
