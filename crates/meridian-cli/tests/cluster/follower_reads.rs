//! Cluster test: stale reads served by followers (BOUNDED_STALENESS, EXACT_STALENESS, as_of)
//! never return data newer than their read timestamp nor older than their bound, checked
//! against the known history of a key written while they run; a follower cut off from the
//! rest of the cluster stops serving bounded reads once its bound is exceeded (and still
//! serves an as-of read its closed timestamp covers); an idle, quiesced shard keeps serving
//! follower reads without being woken; a prepared, undecided 2PC intent makes a follower read
//! of its key answer LOCKED, and the client's stale read then goes to the leader.
//!
//! Requests go straight to one node (raw gRPC), so each answer names the node that served it.

use crate::common::*;
use bytes::Bytes;
use meridian_client::fetch_status;
use meridian_client::proto::kv_client::KvClient;
use meridian_client::proto::{
    self, GetRequest, GetResponse, ReadConsistency, ShardInfo, Staleness,
};
use meridian_types::error::ERROR_CODE_HEADER;
use meridian_types::Timestamp;
use nix::sys::signal::Signal;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tonic::transport::Channel;

const BASE_PORT: u16 = 26_200;
const SHARDS: u32 = 2;
const LAG_MS: u64 = 1_000;
const BOUND_MS: u64 = 3_000;
const EXACT_MS: u64 = 2_000;
const WRITES: usize = 40;
const RPC_TIMEOUT: Duration = Duration::from_secs(5);
const QUIESCE_TIMEOUT: Duration = Duration::from_secs(60);

#[test]
fn follower_reads_are_consistent_and_never_staler_than_their_bound() {
    run_scenario(scenario());
}

async fn raw(address: &str) -> KvClient<Channel> {
    KvClient::connect(format!("http://{address}"))
        .await
        .expect("raw connect")
}

/// One stale get sent to `address`; the answer, or the error code it was refused with.
async fn stale_get(
    address: &str,
    key: &Bytes,
    consistency: ReadConsistency,
    staleness: Staleness,
) -> Result<GetResponse, String> {
    let mut client = raw(address).await;
    let request = GetRequest {
        key: key.clone(),
        consistency: consistency as i32,
        staleness: Some(staleness),
        ..Default::default()
    };
    match tokio::time::timeout(RPC_TIMEOUT, client.get(request)).await {
        Err(_) => Err("DEADLINE".into()),
        Ok(Ok(reply)) => Ok(reply.into_inner()),
        Ok(Err(status)) => Err(status
            .metadata()
            .get(ERROR_CODE_HEADER)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
            .unwrap_or_else(|| format!("{:?}", status.code()))),
    }
}

fn bounded(max_ms: u64) -> Staleness {
    Staleness {
        max_staleness_ms: max_ms,
        ..Default::default()
    }
}

fn exact(ms: u64) -> Staleness {
    Staleness {
        exact_staleness_ms: ms,
        ..Default::default()
    }
}

fn as_of(ts: u64) -> Staleness {
    Staleness {
        as_of_ts: ts,
        ..Default::default()
    }
}

/// One answered stale read: when it was sent, what bound it had (ms; 0 = none), the answer.
struct Read {
    sent_ms: u64,
    bound_ms: u64,
    reply: GetResponse,
}

/// Checks one answer against the key's complete history `(commit_ts, value)`, ascending:
/// never newer than its read timestamp, exactly the state at it, never older than its bound.
fn check(read: &Read, history: &[(u64, Bytes)]) {
    let r = &read.reply;
    let at_read: Option<&(u64, Bytes)> = history.iter().rev().find(|(ts, _)| *ts <= r.read_ts);
    match at_read {
        None => assert!(!r.found, "found {:?} before the first write", r.value),
        Some((ts, value)) => {
            assert!(
                r.found,
                "read at {} missed the write at {}",
                Timestamp(r.read_ts),
                Timestamp(*ts)
            );
            assert_eq!(
                (r.version_ts, &r.value),
                (*ts, value),
                "read at {} by node {} is not the state at its timestamp",
                Timestamp(r.read_ts),
                r.served_by
            );
        }
    }
    assert!(
        r.version_ts <= r.read_ts,
        "a version newer than the read timestamp"
    );
    if read.bound_ms != 0 {
        // One host, one clock: the serving node measured the bound on this clock.
        let behind_ms = read
            .sent_ms
            .saturating_sub(Timestamp(r.read_ts).physical_ms());
        assert!(
            behind_ms <= read.bound_ms,
            "node {} served a read {behind_ms} ms stale with a {} ms bound",
            r.served_by,
            read.bound_ms
        );
    }
}

async fn shard_info(
    cluster: &meridian_cli::LocalCluster,
    node: u64,
    shard: u64,
) -> Option<ShardInfo> {
    let addr = cluster.client_addr(node).ok()?;
    let status = fetch_status(&addr, Duration::from_secs(2)).await.ok()?;
    status.shards.into_iter().find(|s| s.shard_id == shard)
}

async fn scenario() {
    let dir = tempfile::tempdir().unwrap();
    let lag = LAG_MS.to_string();
    let args: &[&str] = &["--closed-ts-lag-ms", &lag];
    let cluster = start_cluster(
        BASE_PORT,
        dir.path(),
        SHARDS,
        &[(1, args), (2, args), (3, args)],
    );
    cluster
        .wait_ready(READY_TIMEOUT)
        .await
        .expect("cluster ready");
    let client = connect_client(cluster.endpoints()).await;
    let key = Bytes::from_static(b"follower-read-key");
    let shard = client.route(&key).expect("routable").shard_id;
    let info = shard_info(&cluster, 1, shard).await.expect("status");
    let leader = info.leader_id;
    let followers: Vec<u64> = info
        .replicas
        .iter()
        .copied()
        .filter(|n| *n != leader)
        .collect();
    assert_eq!(followers.len(), 2, "{info:?}");

    // ---- bad input: two staleness fields, or one that does not fit ------------------------
    let follower_addr = cluster.client_addr(followers[0]).unwrap();
    for (consistency, staleness) in [
        (
            ReadConsistency::ExactStaleness,
            Staleness {
                exact_staleness_ms: 1,
                as_of_ts: 1,
                ..Default::default()
            },
        ),
        (ReadConsistency::BoundedStaleness, exact(5)),
        (ReadConsistency::Linearizable, bounded(5)),
    ] {
        let refused = stale_get(&follower_addr, &key, consistency, staleness).await;
        assert_eq!(
            refused.err().as_deref(),
            Some("INVALID_ARGUMENT"),
            "{consistency:?}"
        );
    }

    // ---- 1. reads on both followers while a writer writes versions of the key -------------
    let (tx, mut rx) = mpsc::channel::<(u64, Bytes)>(WRITES);
    let writer = {
        let (client, key) = (client.clone(), key.clone());
        tokio::spawn(async move {
            for i in 0..WRITES {
                let value = Bytes::from(format!("v{i}"));
                let ts = client.put(key.clone(), value.clone()).await.expect("write");
                tx.send((ts.0, value)).await.expect("history");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };
    let mut reads = Vec::new();
    let (mut redirected, mut rounds) = (0, 0);
    let started = Instant::now();
    while !writer.is_finished() || started.elapsed() < Duration::from_secs(3) {
        rounds += 1;
        for node in &followers {
            let addr = cluster.client_addr(*node).unwrap();
            let modes = [
                (
                    ReadConsistency::BoundedStaleness,
                    bounded(BOUND_MS),
                    BOUND_MS,
                ),
                (ReadConsistency::ExactStaleness, exact(EXACT_MS), 0),
            ];
            for (consistency, staleness, bound_ms) in modes {
                let sent_ms = now_ms();
                match stale_get(&addr, &key, consistency, staleness).await {
                    Ok(reply) => {
                        assert_eq!(reply.served_by, *node, "raw requests are served where sent");
                        if consistency == ReadConsistency::ExactStaleness {
                            let want = sent_ms.saturating_sub(EXACT_MS);
                            let got = Timestamp(reply.read_ts).physical_ms();
                            assert!(
                                got.abs_diff(want) <= 1_000,
                                "exact staleness read at {got}, want about {want}"
                            );
                        }
                        reads.push(Read {
                            sent_ms,
                            bound_ms,
                            reply,
                        });
                    }
                    Err(code) if code == "NOT_LEADER" => redirected += 1,
                    Err(code) => panic!("follower {node} refused a stale read with {code}"),
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    writer.await.expect("writer");
    let mut history = Vec::new();
    while let Ok(entry) = rx.try_recv() {
        history.push(entry);
    }
    assert_eq!(history.len(), WRITES);
    // As-of reads at every write's timestamp and just below it, once they are closed.
    tokio::time::sleep(Duration::from_millis(LAG_MS + 1_000)).await;
    for (ts, _) in &history {
        for at in [*ts - 1, *ts] {
            let addr = cluster.client_addr(followers[1]).unwrap();
            let reply = stale_get(&addr, &key, ReadConsistency::ExactStaleness, as_of(at))
                .await
                .unwrap_or_else(|code| panic!("as-of read at {} refused: {code}", Timestamp(at)));
            assert_eq!(reply.read_ts, at);
            reads.push(Read {
                sent_ms: now_ms(),
                bound_ms: 0,
                reply,
            });
        }
    }
    for read in &reads {
        check(read, &history);
    }
    let nonempty = reads.iter().filter(|r| r.reply.found).count();
    eprintln!(
        "{} follower reads checked against {} writes ({nonempty} saw a version), {redirected} redirected, {rounds} rounds",
        reads.len(),
        history.len()
    );
    assert!(
        nonempty > WRITES,
        "too few follower reads saw data to prove anything"
    );

    // ---- 2. an idle, quiesced shard serves follower reads and stays asleep ----------------
    let quiesced_everywhere =
        |infos: &[Option<ShardInfo>]| infos.iter().all(|i| i.as_ref().is_some_and(|i| i.quiesced));
    let waited = Instant::now();
    loop {
        let mut infos = Vec::new();
        for node in cluster.node_ids() {
            infos.push(shard_info(&cluster, node, shard).await);
        }
        if quiesced_everywhere(&infos) {
            break;
        }
        assert!(
            waited.elapsed() < QUIESCE_TIMEOUT,
            "shard {shard} never quiesced: {infos:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let last = history.last().expect("history").clone();
    for _ in 0..10 {
        for node in &followers {
            let addr = cluster.client_addr(*node).unwrap();
            let sent_ms = now_ms();
            let reply = stale_get(
                &addr,
                &key,
                ReadConsistency::BoundedStaleness,
                bounded(BOUND_MS),
            )
            .await
            .unwrap_or_else(|code| panic!("quiesced follower {node} refused: {code}"));
            assert_eq!((reply.version_ts, &reply.value), (last.0, &last.1));
            check(
                &Read {
                    sent_ms,
                    bound_ms: BOUND_MS,
                    reply,
                },
                &history,
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for node in cluster.node_ids() {
        let info = shard_info(&cluster, node, shard).await.expect("status");
        assert!(
            info.quiesced,
            "follower reads woke node {node}'s replica of shard {shard}"
        );
    }
    eprintln!("20 follower reads of quiesced shard {shard} served; it stayed quiesced");

    // ---- the Rust client and the CLI: a region-labelled client reads from its region ------
    const REGIONS: [&str; 3] = ["us-east", "eu-west", "ap-south"];
    for node in &followers {
        let region = REGIONS[(*node as usize - 1) % 3];
        let mut config = meridian_client::ClientConfig::new(cluster.endpoints());
        config.region = Some(region.into());
        let near = meridian_client::Client::connect(config)
            .await
            .expect("client");
        let bounded = meridian_client::ReadConsistency::BoundedStaleness {
            max_staleness: Duration::from_millis(BOUND_MS),
        };
        let sent_ms = now_ms();
        let read = near.get_with(key.clone(), bounded).await.expect("get_with");
        assert_eq!(
            read.served_by, *node,
            "a {region} client reads from node {node}"
        );
        let reply = GetResponse {
            found: read.value.is_some(),
            value: read.value.clone().unwrap_or_default(),
            version_ts: read.version_ts.map_or(0, |t| t.0),
            read_ts: read.read_ts.0,
            served_by: read.served_by,
            ..Default::default()
        };
        check(
            &Read {
                sent_ms,
                bound_ms: BOUND_MS,
                reply,
            },
            &history,
        );
        let output = run_bounded(
            std::process::Command::new(binary())
                .args([
                    "kv",
                    "get",
                    "follower-read-key",
                    "--max-staleness-ms",
                    "3000",
                ])
                .args([
                    "--region",
                    region,
                    "--endpoints",
                    &cluster.endpoints().join(","),
                ]),
            Duration::from_secs(30),
        );
        let (stdout, stderr) = (
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr),
        );
        assert!(output.status.success(), "kv get failed: {stderr}");
        assert_eq!(stdout.trim(), String::from_utf8_lossy(&last.1));
        assert!(stderr.contains(&format!("served_by={node}")), "{stderr}");
    }
    let output = run_bounded(
        std::process::Command::new(binary()).args([
            "cluster",
            "status",
            "--endpoints",
            &cluster.endpoints().join(","),
        ]),
        Duration::from_secs(30),
    );
    let status = String::from_utf8_lossy(&output.stdout);
    assert!(status.contains("CLOSED LAG"), "{status}");
    eprintln!("region-labelled clients and `kv get --max-staleness-ms` read from their region");

    // ---- a prepared, undecided intent blocks follower reads at or above it -----------
    let locked_key = Bytes::from_static(b"follower-read-key/locked");
    assert_eq!(client.route(&locked_key).expect("routable").shard_id, shard);
    // The staged record names a participant on another shard that never prepares (so the
    // transaction is not implicitly committed, and the recovery below aborts it).
    let elsewhere = ["user1", "user5", "user9", "a", "zzz"]
        .into_iter()
        .map(|k| Bytes::from_static(k.as_bytes()))
        .find(|k| client.route(k).expect("routable").shard_id != shard)
        .expect("a key of another shard");
    let prepare = proto::CommitRequest {
        writes: vec![proto::TxnWrite {
            key: locked_key.clone(),
            action: Some(proto::txn_write::Action::PutValue(Bytes::from_static(b"x"))),
        }],
        prepare: Some(proto::TxnPrepare {
            txn: Some(proto::WriteId {
                client_id: 91,
                seq: 1,
            }),
            anchor: locked_key.clone(),
            participants: vec![elsewhere],
            txn_ts: meridian_types::Timestamp::from_physical_ms(now_ms()).0,
            priority: 2,
            age_ts: meridian_types::Timestamp::from_physical_ms(now_ms()).0,
        }),
        ..Default::default()
    };
    // At whichever node leads the shard now (leadership may have moved since the start).
    let mut at_leader = None;
    for _ in 0..50 {
        for node in cluster.node_ids() {
            let addr = cluster.client_addr(node).unwrap();
            if let Ok(Ok(reply)) =
                tokio::time::timeout(RPC_TIMEOUT, raw(&addr).await.commit(prepare.clone())).await
            {
                at_leader = Some((node, reply.into_inner()));
                break;
            }
        }
        if at_leader.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (leader, prepared) = at_leader.expect("a leader took the prepare");
    assert!(prepared.committed, "prepared: {prepared:?}");
    // Once the followers' closed timestamps pass the prepare, a read there must not skip the
    // intent (it may commit at or below the read): LOCKED, while other keys are served.
    tokio::time::sleep(Duration::from_millis(LAG_MS + 1_500)).await;
    let follower = *followers
        .iter()
        .find(|n| **n != leader)
        .expect("a follower");
    let addr = cluster.client_addr(follower).unwrap();
    let refused = stale_get(
        &addr,
        &locked_key,
        ReadConsistency::BoundedStaleness,
        bounded(BOUND_MS),
    )
    .await;
    assert_eq!(
        refused.err().as_deref(),
        Some("LOCKED"),
        "a follower read skipped a prepared intent"
    );
    let below = stale_get(
        &addr,
        &locked_key,
        ReadConsistency::ExactStaleness,
        as_of(prepared.commit_ts - 1),
    )
    .await
    .expect("a read below the intent's prepare timestamp is served");
    assert!(!below.found);
    stale_get(
        &addr,
        &key,
        ReadConsistency::BoundedStaleness,
        bounded(BOUND_MS),
    )
    .await
    .expect("another key of the shard is served");
    // The client falls back to the leader, which waits for the lock and recovers it.
    let region = REGIONS[(follower as usize - 1) % 3];
    let mut config = meridian_client::ClientConfig::new(cluster.endpoints());
    config.region = Some(region.into());
    let near = meridian_client::Client::connect(config)
        .await
        .expect("client");
    let read = near
        .get_with(
            locked_key.clone(),
            meridian_client::ReadConsistency::BoundedStaleness {
                max_staleness: Duration::from_millis(BOUND_MS),
            },
        )
        .await
        .expect("a stale read of a locked key, through the leader");
    assert_eq!(
        (read.value, read.served_by),
        (None, leader),
        "recovered by the leader"
    );
    eprintln!(
        "a prepared intent made follower reads answer LOCKED; the client's fell back to the leader"
    );

    // ---- 3. a follower cut off from the others stops serving past its bound --------------
    let cut = followers[0];
    let others: Vec<u64> = cluster
        .node_ids()
        .into_iter()
        .filter(|n| *n != cut)
        .collect();
    let closed_before = shard_info(&cluster, cut, shard)
        .await
        .expect("status")
        .closed_ts;
    for node in &others {
        cluster.kill(*node, Signal::SIGSTOP).expect("SIGSTOP");
    }
    let stopped_at = Instant::now();
    let addr = cluster.client_addr(cut).unwrap();
    let (mut served, mut refused_after) = (0, 0);
    let mut closed_seen = 0;
    while stopped_at.elapsed() < Duration::from_millis(BOUND_MS + 2_000) {
        let sent_ms = now_ms();
        match stale_get(
            &addr,
            &key,
            ReadConsistency::BoundedStaleness,
            bounded(BOUND_MS),
        )
        .await
        {
            Ok(reply) => {
                served += 1;
                closed_seen = closed_seen.max(reply.read_ts);
                check(
                    &Read {
                        sent_ms,
                        bound_ms: BOUND_MS,
                        reply,
                    },
                    &history,
                );
            }
            Err(code) => {
                assert!(
                    ["NOT_LEADER", "UNAVAILABLE", "DEADLINE"].contains(&code.as_str()),
                    "cut-off follower refused with {code}"
                );
                if stopped_at.elapsed() > Duration::from_millis(BOUND_MS) {
                    refused_after += 1;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Whatever it closed before the cut, it still serves at or below.
    let reply = stale_get(
        &addr,
        &key,
        ReadConsistency::ExactStaleness,
        as_of(closed_before),
    )
    .await
    .unwrap_or_else(|code| panic!("as-of read the cut-off follower has closed refused: {code}"));
    check(
        &Read {
            sent_ms: now_ms(),
            bound_ms: 0,
            reply,
        },
        &history,
    );
    for node in &others {
        cluster.kill(*node, Signal::SIGCONT).expect("SIGCONT");
    }
    assert!(
        refused_after > 0,
        "the cut-off follower never refused past its bound"
    );
    eprintln!(
        "cut-off follower {cut}: {served} bounded reads served (closed up to {}), {refused_after} refused past the bound",
        Timestamp(closed_seen)
    );

    // Healed: the follower serves fresh bounded reads again.
    let healed = Instant::now();
    loop {
        let sent_ms = now_ms();
        match stale_get(
            &addr,
            &key,
            ReadConsistency::BoundedStaleness,
            bounded(BOUND_MS),
        )
        .await
        {
            Ok(reply) => {
                check(
                    &Read {
                        sent_ms,
                        bound_ms: BOUND_MS,
                        reply,
                    },
                    &history,
                );
                break;
            }
            Err(code) => assert!(
                healed.elapsed() < Duration::from_secs(30),
                "still refused after the heal: {code}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for id in cluster.node_ids() {
        let log = cluster.log_contents(id).unwrap();
        assert!(!log.contains("panicked"), "node {id} panicked:\n{log}");
    }
}
