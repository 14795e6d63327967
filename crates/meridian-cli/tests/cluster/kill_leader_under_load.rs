//! Cluster test: SIGKILL a busy shard's leader in the middle of 10,000 concurrent writes;
//! every acknowledged write must survive, and the restarted node must catch up.
//!
//! A write call the test retries uses a new value each time (`value-<key>-<call>`), so a call
//! that was applied twice, or an old call applied over a newer acknowledged one, shows up as
//! a value the final read must not return: for each key, the read must return the value of
//! the last acknowledged call, or of a call whose outcome the client reported unknown.

use crate::common::*;
use bytes::Bytes;
use meridian_cli::demo::keys_across_shards;
use meridian_client::fetch_status;
use nix::sys::signal::Signal;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const KEYS: usize = 10_000;
const WRITERS: usize = 32;
const KILL_AFTER_ACKS: usize = 2_000;
/// Calls per key before a write counts as failed (each call retries internally).
const CALLS_PER_WRITE: usize = 3;
const CATCH_UP_TIMEOUT: Duration = Duration::from_secs(120);

/// Acknowledged writes survive a leader SIGKILL under load; the killed node catches up.
#[test]
fn kill_leader_under_load() {
    run_scenario(scenario());
}

async fn scenario() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = Arc::new(start_cluster(21_000, dir.path(), 8, &[]));
    cluster
        .wait_ready(READY_TIMEOUT)
        .await
        .expect("cluster ready");
    let client = connect_client(cluster.endpoints()).await;
    let map = client.shard_map();
    assert_eq!(map.shards().len(), 8, "8 data shards");
    let keys = Arc::new(keys_across_shards(&map, KEYS));

    let next = Arc::new(AtomicUsize::new(0));
    let acks = Arc::new(AtomicUsize::new(0));
    let acked: Arc<Mutex<BTreeMap<usize, Bytes>>> = Arc::default();
    // Values of calls answered "outcome unknown" (they may or may not have been applied).
    let unknown: Arc<Mutex<BTreeMap<usize, Vec<Bytes>>>> = Arc::default();
    let failures: Arc<Mutex<Vec<String>>> = Arc::default();
    let started = Instant::now();

    // The fault: once KILL_AFTER_ACKS writes are acknowledged, SIGKILL the leader of the shard
    // the next write goes to.
    let killer = {
        let (cluster, client, keys, next, acks) = (
            cluster.clone(),
            client.clone(),
            keys.clone(),
            next.clone(),
            acks.clone(),
        );
        tokio::spawn(async move {
            let give_up = Instant::now() + Duration::from_secs(120);
            while acks.load(Ordering::SeqCst) < KILL_AFTER_ACKS {
                assert!(Instant::now() < give_up, "writes stalled before the kill");
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            let key = keys[next.load(Ordering::SeqCst).min(KEYS - 1)].clone();
            let mut route = client.route(&key).expect("key is routable");
            if route.leader_id.is_none() {
                client.refresh_shard_map().await.expect("refresh");
                route = client.route(&key).expect("key is routable");
            }
            let leader = route.leader_id.expect("busy shard has a known leader");
            cluster
                .kill(leader, Signal::SIGKILL)
                .expect("SIGKILL leader");
            eprintln!(
                "killed node {leader} (leader of shard {}) after {} acks, {:.2} s in",
                route.shard_id,
                acks.load(Ordering::SeqCst),
                started.elapsed().as_secs_f64()
            );
            (leader, route.shard_id)
        })
    };

    let mut writers = tokio::task::JoinSet::new();
    for _ in 0..WRITERS {
        let (client, keys, next, acks, acked, failures, unknown) = (
            client.clone(),
            keys.clone(),
            next.clone(),
            acks.clone(),
            acked.clone(),
            failures.clone(),
            unknown.clone(),
        );
        writers.spawn(async move {
            loop {
                let index = next.fetch_add(1, Ordering::SeqCst);
                if index >= KEYS {
                    return;
                }
                let mut last_error = None;
                for call in 0..CALLS_PER_WRITE {
                    let value = Bytes::from(format!("value-{index}-{call}"));
                    match client.put(keys[index].clone(), value.clone()).await {
                        Ok(_) => {
                            acked.lock().unwrap().insert(index, value.clone());
                            acks.fetch_add(1, Ordering::SeqCst);
                            last_error = None;
                            break;
                        }
                        Err(error) => {
                            if matches!(error, meridian_client::Error::Ambiguous { .. }) {
                                unknown
                                    .lock()
                                    .unwrap()
                                    .entry(index)
                                    .or_default()
                                    .push(value);
                            }
                            last_error = Some(error);
                        }
                    }
                }
                if let Some(error) = last_error {
                    failures
                        .lock()
                        .unwrap()
                        .push(format!("key {index}: {error}"));
                }
            }
        });
    }
    while let Some(joined) = writers.join_next().await {
        joined.expect("writer task");
    }
    let write_secs = started.elapsed().as_secs_f64();
    let (killed, killed_shard) = killer.await.expect("killer task");
    let acked = acked.lock().unwrap().clone();
    let unknown = unknown.lock().unwrap().clone();
    let failures = failures.lock().unwrap().clone();
    eprintln!(
        "{} acked, {} failed in {write_secs:.2} s; first failures: {:?}",
        acked.len(),
        failures.len(),
        &failures[..failures.len().min(5)]
    );
    assert!(
        failures.len() <= KEYS / 100,
        "more than 1% of writes failed despite retries: {:?}",
        &failures[..failures.len().min(10)]
    );

    // Every acknowledged write reads back (linearizable reads, node still down): the value of
    // the last acknowledged call, or of a call whose outcome was reported unknown.
    let indexes: Vec<usize> = acked.keys().copied().collect();
    let mut lost = Vec::new();
    let mut settled_by_unknown = 0usize;
    for chunk in indexes.chunks(500) {
        let batch: Vec<Bytes> = chunk.iter().map(|&i| keys[i].clone()).collect();
        let values = client.batch_get(batch).await.expect("reading back");
        for (&index, value) in chunk.iter().zip(values) {
            let allowed_unknown = unknown.get(&index).cloned().unwrap_or_default();
            match value {
                Some(v) if v == acked[&index] => {}
                Some(v) if allowed_unknown.contains(&v) => settled_by_unknown += 1,
                other => lost.push((index, other)),
            }
        }
    }
    assert!(
        lost.is_empty(),
        "{} acknowledged writes lost or overwritten by an older call, e.g. {:?}",
        lost.len(),
        &lost[..lost.len().min(5)]
    );
    eprintln!(
        "all {} acknowledged writes read back ({} calls reported outcome unknown, {settled_by_unknown} keys hold such a value)",
        acked.len(),
        unknown.values().map(Vec::len).sum::<usize>()
    );

    // The killed node restarts and catches up: for every shard it replicates, its applied
    // index reaches what the shard's leader had applied once the writes were over.
    cluster.restart(killed).expect("restart");
    let restarted_at = Instant::now();
    let status = client.status().await.expect("status");
    let mut targets: BTreeMap<u64, u64> = BTreeMap::new();
    for shard in status
        .shards
        .iter()
        .filter(|s| s.replicas.contains(&killed))
    {
        let leader = client
            .shard_map()
            .nodes()
            .get(&shard.leader_id)
            .map(|n| n.address.clone());
        let mut target = shard.applied_index;
        if let Some(address) = leader {
            if let Ok(view) = fetch_status(&address, Duration::from_secs(2)).await {
                if let Some(own) = view.shards.iter().find(|s| s.shard_id == shard.shard_id) {
                    target = target.max(own.applied_index);
                }
            }
        }
        targets.insert(shard.shard_id, target);
    }
    assert!(targets.contains_key(&killed_shard));
    let address = cluster.client_addr(killed).unwrap();
    loop {
        let behind: Vec<(u64, u64, u64)> =
            match fetch_status(&address, Duration::from_secs(2)).await {
                Ok(view) => targets
                    .iter()
                    .filter_map(|(shard_id, target)| {
                        let applied = view
                            .shards
                            .iter()
                            .find(|s| s.shard_id == *shard_id)
                            .map_or(0, |s| s.applied_index);
                        (applied < *target).then_some((*shard_id, applied, *target))
                    })
                    .collect(),
                Err(_) => targets.iter().map(|(s, t)| (*s, 0, *t)).collect(),
            };
        if behind.is_empty() {
            eprintln!(
                "node {killed} caught up on {} shards in {:.2} s",
                targets.len(),
                restarted_at.elapsed().as_secs_f64()
            );
            break;
        }
        assert!(
            restarted_at.elapsed() < CATCH_UP_TIMEOUT,
            "node {killed} still behind after {CATCH_UP_TIMEOUT:?}: (shard, applied, target) {behind:?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let killed_nodes = cluster.stop_all(Duration::from_secs(20));
    assert!(
        killed_nodes.is_empty(),
        "nodes {killed_nodes:?} ignored SIGTERM"
    );
}
