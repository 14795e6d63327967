//! Cluster test: compare-and-swap on a real 3-node cluster.
//!
//! 1. The CLI's `kv cas`: a swap prints the commit timestamp and exits 0; a mismatch writes
//!    nothing, prints the current value and exits 4; a missing condition is a usage error.
//! 2. No lost or doubled updates: concurrent clients increment one counter with optimistic
//!    read-modify-write (read the version, swap on it), and the counter's leader is SIGKILLed
//!    in the middle. The final count must lie between the acknowledged increments and those
//!    plus the increments whose outcome was unknown. A retried swap that had applied but was
//!    not deduplicated would come back as a mismatch, be redone by the worker, and push the
//!    count above that bound; a swap that checked a stale state would lose an increment and
//!    push it below.

use crate::common::*;
use bytes::Bytes;
use meridian_client::{CasOutcome, Client, Error, Expect};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const BASE_PORT: u16 = 22_200;
const WORKERS: usize = 8;
const INCREMENTS_PER_WORKER: usize = 40;
const KILL_AFTER_ACKS: usize = 80;
const COUNTER: &str = "cas/counter";

#[test]
fn compare_and_swap_on_a_cluster() {
    run_scenario(scenario());
}

fn cli(endpoints: &[String], args: &[&str]) -> std::process::Output {
    run_bounded(
        Command::new(binary())
            .arg("kv")
            .args(args)
            .arg("--endpoints")
            .arg(endpoints.join(",")),
        Duration::from_secs(30),
    )
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn check_cli(endpoints: &[String]) {
    let out = cli(endpoints, &["cas", "cli/k", "a", "--expect-absent"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(text(&out.stdout).starts_with("OK commit_ts="), "{out:?}");

    let out = cli(endpoints, &["cas", "cli/k", "b", "--expect-value", "zzz"]);
    assert_eq!(out.status.code(), Some(4), "mismatch: {out:?}");
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("condition not met") && stderr.contains("a (version"),
        "{stderr}"
    );

    let out = cli(endpoints, &["cas", "cli/k", "b", "--expect-value", "a"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let out = cli(endpoints, &["get", "cli/k"]);
    assert_eq!(text(&out.stdout).trim(), "b");

    let out = cli(
        endpoints,
        &["cas", "cli/k", "--delete", "--expect-value", "b"],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let out = cli(endpoints, &["cas", "cli/k", "c", "--expect-value", "b"]);
    assert_eq!(out.status.code(), Some(4), "deleted: {out:?}");
    assert!(text(&out.stderr).contains("no value"), "{out:?}");

    let out = cli(endpoints, &["cas", "cli/k", "c"]);
    assert_eq!(out.status.code(), Some(1), "no condition: {out:?}");
    assert!(
        text(&out.stderr).contains("exactly one of --expect"),
        "{out:?}"
    );
    let out = cli(
        endpoints,
        &[
            "cas",
            "cli/k",
            "c",
            "--expect-absent",
            "--expect-value",
            "x",
        ],
    );
    assert_eq!(out.status.code(), Some(2), "two conditions: {out:?}");
}

/// What one worker saw.
#[derive(Default)]
struct Tally {
    acked: usize,
    unknown: usize,
    mismatches: usize,
}

async fn increment_until(client: Client, acks: Arc<AtomicUsize>) -> Tally {
    let mut tally = Tally::default();
    let give_up = Instant::now() + Duration::from_secs(240);
    while tally.acked < INCREMENTS_PER_WORKER {
        assert!(Instant::now() < give_up, "increments stalled");
        let seen = match client.get_versioned(COUNTER).await {
            Ok(seen) => seen.expect("the counter was created"),
            Err(e) => {
                eprintln!("read failed (retrying): {e}");
                continue;
            }
        };
        let n: u64 = text(&seen.value).parse().expect("a number");
        let next = Bytes::from((n + 1).to_string());
        match client
            .compare_and_swap(COUNTER, Expect::Version(seen.version_ts), Some(next))
            .await
        {
            Ok(CasOutcome::Swapped { .. }) => {
                tally.acked += 1;
                acks.fetch_add(1, Ordering::SeqCst);
            }
            Ok(CasOutcome::Mismatch { .. }) => tally.mismatches += 1,
            Err(Error::Ambiguous { .. }) => tally.unknown += 1,
            Err(e) => eprintln!("swap failed before reaching Raft (retrying): {e}"),
        }
    }
    tally
}

async fn scenario() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = Arc::new(start_cluster(BASE_PORT, dir.path(), 4, &[]));
    cluster
        .wait_ready(READY_TIMEOUT)
        .await
        .expect("cluster ready");
    let endpoints = cluster.endpoints();
    check_cli(&endpoints);

    let client = connect_client(endpoints).await;
    let created = client
        .compare_and_swap(COUNTER, Expect::Absent, Some(Bytes::from("0")))
        .await
        .expect("create the counter");
    assert!(created.swapped(), "{created:?}");

    let acks = Arc::new(AtomicUsize::new(0));
    let killer = kill_leader_after(
        cluster.clone(),
        client.clone(),
        COUNTER.to_string(),
        acks.clone(),
        KILL_AFTER_ACKS,
    );
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..WORKERS {
        workers.spawn(increment_until(client.clone(), acks.clone()));
    }
    let mut total = Tally::default();
    while let Some(tally) = workers.join_next().await {
        let tally = tally.expect("worker");
        total.acked += tally.acked;
        total.unknown += tally.unknown;
        total.mismatches += tally.mismatches;
    }
    let killed = killer.await.expect("killer");
    cluster.restart(killed).expect("restart");

    let value = client
        .get(COUNTER)
        .await
        .expect("final read")
        .expect("counter");
    let count: usize = text(&value).parse().expect("a number");
    eprintln!(
        "counter {count}: {} acknowledged, {} unknown, {} mismatches retried",
        total.acked, total.unknown, total.mismatches
    );
    assert_eq!(total.acked, WORKERS * INCREMENTS_PER_WORKER);
    assert!(
        count >= total.acked,
        "lost updates: {count} < {} acknowledged increments",
        total.acked
    );
    assert!(
        count <= total.acked + total.unknown,
        "doubled updates: {count} > {} acknowledged + {} unknown",
        total.acked,
        total.unknown
    );
    assert!(
        total.mismatches > 0,
        "the workers never raced: the test shows nothing"
    );
    cluster
        .wait_ready(READY_TIMEOUT)
        .await
        .expect("the restarted node rejoins");
}
