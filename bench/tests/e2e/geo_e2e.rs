//! A short `meridian-ycsb geo` at half the WAN matrix's delays: it completes every
//! phase, writes its table, JSON and chart, and the harness's own check holds (the oracle mode
//! costs remote clients a round trip, so the WAN and the oracle are really there). The product
//! verdicts (LINE, local latency) are reported by the run, not asserted here: they are timings.
//!
//! Needs the `meridian` binary next to this test's target directory (`<target>/release/
//! meridian`), which `cargo nextest run --workspace` builds.

use meridian_bench::cli::run_cli;

use crate::common::meridian_binary;

/// Nodes 20_001..20_003 (clients) and 20_101..20_103 (Raft), links 20_200..20_205 (peers) and
/// 20_300..20_308 (clients).
const BASE_PORT: u16 = 20_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn short_geo_run_measures_every_phase_and_the_oracle_costs_a_round_trip() {
    let _servers = crate::common::SERVERS.lock().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let out = dir.path().join("out");
    let data = dir.path().join("data");
    let args: Vec<String> = [
        "meridian-ycsb",
        "geo",
        "--ops",
        "12",
        "--concurrency",
        "1",
        "--scale",
        "0.5",
        "--seed",
        "7",
        "--out",
        &out.display().to_string(),
        "--data-dir",
        &data.display().to_string(),
        "--meridian-bin",
        &meridian_binary().display().to_string(),
        "--base-port",
        &BASE_PORT.to_string(),
    ]
    .iter()
    .map(|arg| arg.to_string())
    .collect();
    // `geo` fails when the harness check fails.
    run_cli(args)
        .await
        .unwrap_or_else(|error| panic!("geo failed: {error:#}"));

    let json: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(out.join("results.json")).expect("results.json written"),
    )
    .expect("valid JSON");
    let phases = json["phases"].as_array().expect("phases");
    // 3 single-key + 2 × 2 base + 2 × 2 moved + 2 killed.
    assert_eq!(phases.len(), 13, "{phases:#?}");
    for phase in phases {
        for region in phase["regions"].as_array().expect("regions") {
            assert_eq!(region["count"], 12, "every operation succeeded: {region}");
        }
        if phase["op"].as_str().unwrap().starts_with("txn") {
            assert_eq!(phase["meta_appends"], 0, "{phase}");
        }
    }
    let follower = phases
        .iter()
        .find(|p| p["op"] == "follower-read")
        .expect("a follower-read phase");
    for region in follower["regions"].as_array().unwrap() {
        assert_eq!(
            region["local_pct"], 100.0,
            "served by the local replica: {region}"
        );
        let staleness = region["staleness_p99_ms"].as_f64().unwrap();
        assert!(staleness <= 10_000.0, "within the bound: {region}");
    }
    let checks = json["checks"].as_array().expect("checks");
    let harness: Vec<_> = checks.iter().filter(|c| c["harness"] == true).collect();
    assert_eq!(
        harness.len(),
        4,
        "two remote regions per oracle placement: {harness:#?}"
    );
    assert!(harness.iter().all(|c| c["pass"] == true), "{harness:#?}");
    let markdown = std::fs::read_to_string(out.join("results.md")).expect("results.md");
    assert!(markdown.contains("## Checks"));
    let chart = std::fs::read_to_string(out.join("chart.svg")).expect("chart.svg");
    assert!(chart.starts_with("<svg") && chart.contains("txn-2shard"));
}
