//! Cluster test: writes to one shard under load coalesce into shared Raft entries
//! (meridian-raft `proposals`) and each still answers for itself.
//!
//! A 3-node cluster with one data shard and `--proposals-in-flight 1` (the strongest
//! coalescing): 48 writers put distinct keys while 8 workers increment one counter with
//! optimistic compare-and-swap (read the version, swap on it, start over on a mismatch).
//! - Every acknowledged put reads back with its value.
//! - The counter ends at exactly the number of acknowledged swaps: two swaps on one version in
//!   one entry would both succeed if members were checked against the state before the entry
//!   instead of each at its place, and the count would come out short.
//! - The leaders' metrics show fewer entries than proposals (coalescing happened).
//!
//! Negative control: the same workload with `--proposals-in-flight 0` (coalescing off)
//! shows exactly one entry per proposal, so the "fewer entries" check can fail.

use crate::common::*;
use meridian_client::{CasOutcome, Client, Expect};
use std::sync::Arc;

const SHARDS: u32 = 1;
const WRITERS: usize = 48;
const PUTS_PER_WRITER: usize = 15;
const CAS_WORKERS: usize = 8;
const INCREMENTS_PER_WORKER: usize = 10;
const COUNTER: &str = "coalesce/counter";

#[test]
fn writes_under_load_coalesce_and_each_answers_for_itself() {
    run_scenario(scenario(19_300, 1));
}

#[test]
fn negative_control_without_coalescing_every_proposal_is_an_entry() {
    run_scenario(scenario(19_400, 0));
}

fn metrics_port(base: u16, node: u64) -> u16 {
    base + 50 + node as u16
}

async fn scenario(base: u16, in_flight: usize) {
    let dir = tempfile::tempdir().unwrap();
    let flags: Vec<Vec<String>> = (1..=3)
        .map(|n| {
            vec![
                "--metrics-addr".to_string(),
                format!("127.0.0.1:{}", metrics_port(base, n)),
                "--proposals-in-flight".to_string(),
                in_flight.to_string(),
            ]
        })
        .collect();
    let cluster = start_cluster_with_args(base, dir.path(), SHARDS, &flags);
    cluster.wait_ready(READY_TIMEOUT).await.expect("ready");
    let client = Arc::new(connect_client(cluster.endpoints()).await);
    client.put(COUNTER, "0").await.expect("counter");
    let totals = |name: &str| -> f64 {
        (1..=3)
            .map(|n| sample(&scrape_metrics(metrics_port(base, n)), name))
            .sum()
    };
    let (proposals_before, entries_before) = (
        totals("meridian_proposal_proposals_total"),
        totals("meridian_proposal_entries_total"),
    );

    let mut tasks = Vec::new();
    for w in 0..WRITERS {
        let client = client.clone();
        tasks.push(tokio::spawn(async move {
            for i in 0..PUTS_PER_WRITER {
                let key = format!("coalesce/{w}/{i}");
                client.put(key.clone(), key).await.expect("put");
            }
            0
        }));
    }
    for _ in 0..CAS_WORKERS {
        let client = client.clone();
        tasks.push(tokio::spawn(async move {
            let mut swapped = 0;
            while swapped < INCREMENTS_PER_WORKER {
                if increment(&client).await {
                    swapped += 1;
                }
            }
            swapped
        }));
    }
    let mut swaps = 0;
    for task in tasks {
        swaps += task.await.expect("worker");
    }

    for w in 0..WRITERS {
        for i in 0..PUTS_PER_WRITER {
            let key = format!("coalesce/{w}/{i}");
            let got = client.get(key.clone()).await.expect("get");
            assert_eq!(got.as_deref(), Some(key.as_bytes()), "{key}");
        }
    }
    let counter = client.get(COUNTER).await.expect("get").expect("counter");
    let counter: usize = std::str::from_utf8(&counter).unwrap().parse().unwrap();
    assert_eq!(
        counter, swaps,
        "every acknowledged swap counted once, none lost"
    );
    assert_eq!(swaps, CAS_WORKERS * INCREMENTS_PER_WORKER);

    let proposals = totals("meridian_proposal_proposals_total") - proposals_before;
    let entries = totals("meridian_proposal_entries_total") - entries_before;
    eprintln!(
        "in flight {in_flight}: {proposals} proposals in {entries} entries ({:.2} per entry)",
        proposals / entries.max(1.0)
    );
    let writes = (WRITERS * PUTS_PER_WRITER + swaps) as f64;
    assert!(
        proposals >= writes,
        "{proposals} proposals for {writes} acknowledged writes"
    );
    if in_flight == 0 {
        assert_eq!(entries, proposals, "coalescing off: one entry per proposal");
    } else {
        assert!(
            entries < proposals,
            "under load some proposals must share entries: {proposals} in {entries}"
        );
    }
    assert_no_panics(&cluster, &[1, 2, 3]);
}

/// One optimistic increment of the counter: whether the swap applied.
async fn increment(client: &Client) -> bool {
    let current = client
        .get_versioned(COUNTER)
        .await
        .expect("read")
        .expect("counter");
    let n: usize = std::str::from_utf8(&current.value)
        .unwrap()
        .parse()
        .unwrap();
    let outcome = client
        .compare_and_swap(
            COUNTER,
            Expect::Version(current.version_ts),
            Some((n + 1).to_string().into()),
        )
        .await
        .expect("swap");
    matches!(outcome, CasOutcome::Swapped { .. })
}
