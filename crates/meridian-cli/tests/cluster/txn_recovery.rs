//! Cluster test: multi-shard transactions whose coordinator vanished, settled by the readers
//! that meet their locks (see `meridian-client`'s `locks` and `txn_recover`). The coordinator
//! is played by hand with raw `Kv.Commit` (prepare) and `Kv.Resolve` requests on a real 3-node
//! cluster with 4 data shards, then never heard of again.
//!
//! 1. Staged on the anchor, never prepared on the other shard (the coordinator died before
//!    its ack): a raw read of the anchor key answers `LOCKED` (the control: the lock is there
//!    and readers do meet it); a client's plain read then answers the old value (the reader
//!    prevented the other shard and aborted the transaction); the coordinator's late prepare
//!    there fails, its late decision finds the record aborted, and writes go through.
//! 2. Prepared on both shards, never decided (the coordinator may have acknowledged it):
//!    the transaction is implicitly committed, and a reader commits it at the largest prepare
//!    timestamp, the one the coordinator would have acknowledged.
//! 3. Decided, never resolved: a client's read of the other shard's key answers the new value
//!    at the decided timestamp (the reader found the record committed and resolved the lock as
//!    a commit), and a transaction reads both new values.
//!
//! That cluster runs without the sweeper (`--txn-sweep-after-ms 0`), and ends with the
//! sweeper test's control: a lock nobody reads stays `SWEEP_CONTROL_WAIT` later.
//!
//! The third leaves a committed record that nothing leads to: the coordinator resolved the
//! other shard's lock and decided the anchor, then stopped before finishing the record, so no
//! lock is left for a reader or the sweeper to meet. With a 2 s GC TTL, the GC passes over
//! the anchor's records report it stuck, the sweeper finishes it, and a later pass collects
//! it: the anchor answers `Forgotten`. The control, on a cluster without the sweeper: after a
//! GC pass reported it, the record is still there, committed and unfinished.
//!
//! The second test runs the sweeper (`--txn-sweep-after-ms 1000`) and no reader at all: a
//! transaction staged on the anchor only, then one prepared on both shards, are each settled
//! by the shard leaders' sweepers (aborted, and committed at the acknowledged timestamp) —
//! raw reads, which never recover anything themselves, stop meeting their locks.

use crate::common::*;
use bytes::Bytes;
use meridian_client::proto::{self, resolve_request, TxnState};
use meridian_client::{Client, Error, TxnOptions};
use std::sync::atomic::Ordering::SeqCst;
use std::time::Duration;

const BASE_PORT: u16 = 24_800;
const SWEEPER_PORT: u16 = 31_200;
const STUCK_PORT: u16 = 31_800;
const STUCK_CONTROL_PORT: u16 = 32_000;
/// Bound on GC passes reporting a stuck record, and on the sweeper finishing it and GC
/// collecting it.
const STUCK_TIMEOUT: Duration = Duration::from_secs(40);
/// The sweeper test's age of an abandoned transaction, and how long a lock stays without it.
const SWEEP_AFTER_MS: &str = "1000";
const SWEEP_CONTROL_WAIT: Duration = Duration::from_secs(3);
/// Bound on the sweepers settling a transaction (a pass runs every half age).
const SWEEP_TIMEOUT: Duration = Duration::from_secs(20);
/// Keys of two different shards of `--initial-shards 4` (splits user305584, user511168,
/// user716752); the first is the anchor.
const ANCHOR: &str = "user1rec/a";
const OTHER: &str = "user8rec/b";

#[test]
fn readers_resolve_the_locks_of_a_vanished_coordinator() {
    run_scenario(scenario());
}

#[test]
fn the_sweeper_settles_abandoned_transactions_without_readers() {
    run_scenario(sweeper_scenario());
}

#[test]
fn a_committed_record_nothing_leads_to_is_finished_and_collected() {
    run_scenario(stuck_record_scenario());
}

fn b(s: &str) -> Bytes {
    Bytes::copy_from_slice(s.as_bytes())
}

/// The raw prepare of `txn` writing `value` to `key` (the anchor's prepare names the other
/// participant); returns the answer.
async fn try_prepare(
    endpoints: &[String],
    txn: proto::WriteId,
    key: &str,
    value: &str,
) -> proto::CommitResponse {
    let message = proto::CommitRequest {
        writes: vec![proto::TxnWrite {
            key: b(key),
            action: Some(proto::txn_write::Action::PutValue(b(value))),
        }],
        prepare: Some(proto::TxnPrepare {
            txn: Some(txn),
            txn_ts: txn_ts(),
            priority: 2,
            age_ts: txn_ts(),
            anchor: b(ANCHOR),
            participants: match key == ANCHOR {
                true => vec![b(OTHER)],
                false => vec![],
            },
        }),
        ..Default::default()
    };
    at_leader(endpoints, |mut kv| {
        let message = message.clone();
        async move { kv.commit(message).await.map(|r| r.into_inner()) }
    })
    .await
    .expect("prepare")
}

/// [`try_prepare`] that must succeed; returns the prepare timestamp.
async fn prepare(endpoints: &[String], txn: proto::WriteId, key: &str, value: &str) -> u64 {
    let reply = try_prepare(endpoints, txn, key, value).await;
    assert!(reply.committed, "prepared: {reply:?}");
    reply.commit_ts
}

/// Hand-made transactions' start timestamp (see [`txn_ts`]); 0 until first asked.
static TXN_TS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Every hand-made transaction's start timestamp: when it was first asked for, or last
/// [`restart_txn_ts`].
fn txn_ts() -> u64 {
    let now = meridian_types::Timestamp::from_physical_ms(now_ms()).0;
    match TXN_TS.compare_exchange(0, now, SeqCst, SeqCst) {
        Ok(_) => now,
        Err(set) => set,
    }
}

/// Starts later hand-made transactions now: on a cluster with a short GC TTL, a start
/// timestamp from before the cluster was up may already be below a shard's GC threshold.
fn restart_txn_ts() {
    TXN_TS.store(0, SeqCst);
}

/// The coordinator's decision at the anchor.
async fn decide(
    endpoints: &[String],
    txn: proto::WriteId,
    commit_ts: u64,
) -> proto::ResolveResponse {
    let decision = resolve_request::Decision::CommitTs(commit_ts);
    raw_resolve(endpoints, txn, ANCHOR, decision).await
}

/// A raw `Kv.Resolve` of `txn` on `key`'s shard (as the anchor when `key` is [`ANCHOR`]).
async fn raw_resolve(
    endpoints: &[String],
    txn: proto::WriteId,
    key: &str,
    decision: resolve_request::Decision,
) -> proto::ResolveResponse {
    let message = proto::ResolveRequest {
        txn: Some(txn),
        key: b(key),
        anchor: key == ANCHOR,
        decision: Some(decision),
        txn_ts: txn_ts(),
        ..Default::default()
    };
    at_leader(endpoints, |mut kv| {
        let message = message.clone();
        async move { kv.resolve(message).await.map(|r| r.into_inner()) }
    })
    .await
    .expect("resolve")
}

async fn value(client: &Client, key: &str) -> (String, u64) {
    let found = client
        .get_versioned(key.to_string())
        .await
        .expect("read")
        .expect("present");
    (
        String::from_utf8_lossy(&found.value).into_owned(),
        found.version_ts.0,
    )
}

async fn staged_never_prepared_elsewhere(endpoints: &[String], client: &Client) {
    let txn = proto::WriteId {
        client_id: 77,
        seq: 1,
    };
    let staged = prepare(endpoints, txn, ANCHOR, "new1").await;
    // The control: a read of a locked key meets the lock.
    match raw_get(endpoints, ANCHOR).await {
        Err(Error::Locked { lock }) => {
            assert_eq!(
                (lock.txn, lock.anchor.clone(), lock.write),
                (txn, b(ANCHOR), true)
            );
        }
        other => panic!("a read of a prepared key must meet its lock: {other:?}"),
    }
    // The reader waits, then prevents OTHER and aborts the transaction.
    assert_eq!(value(client, ANCHOR).await.0, "old");
    let late = try_prepare(endpoints, txn, OTHER, "new1").await;
    assert!(
        late.aborted && !late.committed,
        "the coordinator's late prepare was prevented: {late:?}"
    );
    let late = decide(endpoints, txn, staged).await;
    assert_eq!(
        TxnState::try_from(late.state),
        Ok(TxnState::Aborted),
        "the coordinator's late decision loses: {late:?}"
    );
    assert_eq!(value(client, OTHER).await.0, "old");
    client.put(ANCHOR, "after").await.expect("the lock is gone");
    assert_eq!(value(client, ANCHOR).await.0, "after");
}

async fn prepared_never_decided(endpoints: &[String], client: &Client) {
    let txn = proto::WriteId {
        client_id: 77,
        seq: 3,
    };
    let prepared = [
        prepare(endpoints, txn, OTHER, "new3").await,
        prepare(endpoints, txn, ANCHOR, "new3").await,
    ];
    let commit_ts = prepared[0].max(prepared[1]);
    // Implicitly committed: the reader of OTHER commits it, at the acknowledged timestamp.
    assert_eq!(value(client, OTHER).await, ("new3".to_string(), commit_ts));
    assert_eq!(value(client, ANCHOR).await, ("new3".to_string(), commit_ts));
    let late = decide(endpoints, txn, commit_ts).await;
    assert_eq!(
        (TxnState::try_from(late.state), late.commit_ts),
        (Ok(TxnState::Committed), commit_ts),
        "the coordinator's late decision agrees: {late:?}"
    );
}

async fn decided_never_resolved(endpoints: &[String], client: &Client) {
    let txn = proto::WriteId {
        client_id: 77,
        seq: 2,
    };
    let prepared = [
        prepare(endpoints, txn, ANCHOR, "new2").await,
        prepare(endpoints, txn, OTHER, "new2").await,
    ];
    let commit_ts = prepared[0].max(prepared[1]);
    let decided = decide(endpoints, txn, commit_ts).await;
    assert_eq!(TxnState::try_from(decided.state), Ok(TxnState::Committed));
    assert_eq!(decided.commit_ts, commit_ts);
    // OTHER's lock is still there: its reader resolves it as the anchor decided.
    assert_eq!(value(client, OTHER).await, ("new2".to_string(), commit_ts));
    assert_eq!(value(client, ANCHOR).await, ("new2".to_string(), commit_ts));
    let (both, _) = client
        .txn(TxnOptions::default(), |txn| {
            Box::pin(async move {
                let a = txn.get_str(ANCHOR).await?;
                let b = txn.get_str(OTHER).await?;
                Ok::<_, Error>((a, b))
            })
        })
        .await
        .expect("a transaction reads both");
    assert_eq!(both, ("new2".to_string(), "new2".to_string()));
}

/// Polls raw reads of `key` until none meets a lock; returns the value then.
async fn unlocked(endpoints: &[String], key: &str) -> proto::GetResponse {
    let started = std::time::Instant::now();
    loop {
        match raw_get(endpoints, key).await {
            Ok(reply) => return reply,
            Err(Error::Locked { .. }) if started.elapsed() < SWEEP_TIMEOUT => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            other => panic!("{key}: still locked after {SWEEP_TIMEOUT:?}, or failed: {other:?}"),
        }
    }
}

/// A ready 3-node cluster with 4 shards whose nodes settle transactions prepared
/// `sweep_after_ms` ago ("0": no sweeper), its client endpoints and a client.
async fn cluster_with_sweeper(
    port: u16,
    dir: &std::path::Path,
    sweep_after_ms: &str,
) -> (meridian_cli::LocalCluster, Vec<String>, Client) {
    cluster_with(port, dir, &["--txn-sweep-after-ms", sweep_after_ms]).await
}

/// [`cluster_with_sweeper`] with any node arguments.
async fn cluster_with(
    port: u16,
    dir: &std::path::Path,
    args: &[&str],
) -> (meridian_cli::LocalCluster, Vec<String>, Client) {
    let per_node: Vec<(u64, &[&str])> = (1..=3).map(|id| (id, args)).collect();
    let cluster = start_cluster(port, dir, 4, &per_node);
    cluster
        .wait_ready(READY_TIMEOUT)
        .await
        .expect("cluster ready");
    let endpoints = cluster.endpoints();
    let client = connect_client(endpoints.clone()).await;
    (cluster, endpoints, client)
}

async fn sweeper_scenario() {
    let dir = tempfile::tempdir().unwrap();
    let (_cluster, endpoints, client) =
        cluster_with_sweeper(SWEEPER_PORT, dir.path(), SWEEP_AFTER_MS).await;
    for key in [ANCHOR, OTHER] {
        client.put(key, "old").await.expect("put");
    }
    // Staged on the anchor only: the sweeper aborts it.
    let txn = proto::WriteId {
        client_id: 78,
        seq: 1,
    };
    let started = std::time::Instant::now();
    prepare(&endpoints, txn, ANCHOR, "new1").await;
    let reply = unlocked(&endpoints, ANCHOR).await;
    eprintln!("aborted by the sweeper after {:?}", started.elapsed());
    assert_eq!(reply.value, b("old"), "aborted: {reply:?}");
    let late = try_prepare(&endpoints, txn, OTHER, "new1").await;
    assert!(late.aborted, "the late prepare was prevented: {late:?}");

    // Prepared on both: implicitly committed; the sweepers commit it where they meet it.
    let txn = proto::WriteId {
        client_id: 78,
        seq: 2,
    };
    let started = std::time::Instant::now();
    let prepared = [
        prepare(&endpoints, txn, OTHER, "new2").await,
        prepare(&endpoints, txn, ANCHOR, "new2").await,
    ];
    let commit_ts = prepared[0].max(prepared[1]);
    for key in [ANCHOR, OTHER] {
        let reply = unlocked(&endpoints, key).await;
        assert_eq!(
            (reply.value, reply.version_ts),
            (b("new2"), commit_ts),
            "{key}: committed at the acknowledged timestamp"
        );
    }
    eprintln!("committed by the sweeper after {:?}", started.elapsed());
}

async fn scenario() {
    let dir = tempfile::tempdir().unwrap();
    let (_cluster, endpoints, client) = cluster_with_sweeper(BASE_PORT, dir.path(), "0").await;
    let shard = |key: &str| client.route(key.as_bytes()).expect("routed").shard_id;
    assert_ne!(shard(ANCHOR), shard(OTHER), "two shards");
    for key in [ANCHOR, OTHER] {
        client.put(key, "old").await.expect("put");
    }
    staged_never_prepared_elsewhere(&endpoints, &client).await;
    for key in [ANCHOR, OTHER] {
        client.put(key, "old").await.expect("put");
    }
    prepared_never_decided(&endpoints, &client).await;
    decided_never_resolved(&endpoints, &client).await;

    // The sweeper test's control: without a sweeper or a reader, a lock stays.
    let txn = proto::WriteId {
        client_id: 77,
        seq: 4,
    };
    prepare(&endpoints, txn, ANCHOR, "new4").await;
    tokio::time::sleep(SWEEP_CONTROL_WAIT).await;
    assert!(
        matches!(raw_get(&endpoints, ANCHOR).await, Err(Error::Locked { .. })),
        "with no sweeper, nothing settles a lock nobody reads"
    );
}

/// Leaves `txn` committed at both shards with its record unfinished and no lock anywhere (see
/// the module docs); returns its commit timestamp.
async fn leave_stuck_record(endpoints: &[String], client: &Client, txn: proto::WriteId) -> u64 {
    for key in [ANCHOR, OTHER] {
        client.put(key, "old").await.expect("put");
    }
    restart_txn_ts();
    let prepared = [
        prepare(endpoints, txn, ANCHOR, "stuck").await,
        prepare(endpoints, txn, OTHER, "stuck").await,
    ];
    let c = prepared[0].max(prepared[1]);
    let commit = resolve_request::Decision::CommitTs(c);
    // A participant keeps no record: its answer states nothing; the read below shows it.
    raw_resolve(endpoints, txn, OTHER, commit).await;
    let decided = decide(endpoints, txn, c).await;
    assert_eq!(TxnState::try_from(decided.state), Ok(TxnState::Committed));
    for key in [ANCHOR, OTHER] {
        let reply = raw_get(endpoints, key).await.expect("no lock is left");
        assert_eq!((reply.value, reply.version_ts), (b("stuck"), c), "{key}");
    }
    assert_eq!(record_state(endpoints, txn).await, (TxnState::Committed, 1));
    c
}

/// The anchor's record of `txn`: its state, and how many participants it still lists (an
/// unfinished committed record lists them).
async fn record_state(endpoints: &[String], txn: proto::WriteId) -> (TxnState, usize) {
    let asked = raw_resolve(
        endpoints,
        txn,
        ANCHOR,
        resolve_request::Decision::Abort(true),
    )
    .await;
    (
        TxnState::try_from(asked.state).expect("a state"),
        asked.participants.len(),
    )
}

/// Writes to the anchor's shard every 200 ms until stopped: a GC pass runs only while its
/// shard has a version above the threshold.
fn keep_writing(
    client: &Client,
) -> (
    std::sync::Arc<std::sync::atomic::AtomicBool>,
    tokio::task::JoinHandle<()>,
) {
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (flag, client) = (stop.clone(), client.clone());
    let task = tokio::spawn(async move {
        while !flag.load(std::sync::atomic::Ordering::Relaxed) {
            let _ = client.put("user1rec/tick", "t").await;
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    });
    (stop, task)
}

async fn stuck_record_scenario() {
    let gc = ["--gc-ttl-ms", "2000", "--gc-interval-ms", "300"];
    let txn = proto::WriteId {
        client_id: 79,
        seq: 1,
    };
    // The control: no sweeper, so the record stays once a pass reported it.
    let dir = tempfile::tempdir().unwrap();
    let args: Vec<&str> = gc
        .iter()
        .copied()
        .chain(["--txn-sweep-after-ms", "0"])
        .collect();
    let (cluster, endpoints, client) = cluster_with(STUCK_CONTROL_PORT, dir.path(), &args).await;
    leave_stuck_record(&endpoints, &client, txn).await;
    let (stop, writer) = keep_writing(&client);
    let started = std::time::Instant::now();
    while !cluster.node_ids().into_iter().any(|id| {
        cluster
            .log_contents(id)
            .unwrap_or_default()
            .contains("queued for the sweeper")
    }) {
        assert!(
            started.elapsed() < STUCK_TIMEOUT,
            "no GC pass reported the stuck record"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        record_state(&endpoints, txn).await,
        (TxnState::Committed, 1),
        "without the sweeper, the record stays unfinished"
    );
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    writer.await.unwrap();
    drop(cluster);

    // With the sweeper: finished, then collected.
    let dir = tempfile::tempdir().unwrap();
    let args: Vec<&str> = gc
        .iter()
        .copied()
        .chain(["--txn-sweep-after-ms", SWEEP_AFTER_MS])
        .collect();
    let (_cluster, endpoints, client) = cluster_with(STUCK_PORT, dir.path(), &args).await;
    let c = leave_stuck_record(&endpoints, &client, txn).await;
    let (stop, writer) = keep_writing(&client);
    let started = std::time::Instant::now();
    loop {
        let state = record_state(&endpoints, txn).await;
        if state.0 == TxnState::Forgotten {
            break;
        }
        assert!(
            started.elapsed() < STUCK_TIMEOUT,
            "the stuck record is still {state:?} after {STUCK_TIMEOUT:?}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    eprintln!("finished and collected after {:?}", started.elapsed());
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    writer.await.unwrap();
    for key in [ANCHOR, OTHER] {
        assert_eq!(value(&client, key).await, ("stuck".to_string(), c), "{key}");
    }
}
