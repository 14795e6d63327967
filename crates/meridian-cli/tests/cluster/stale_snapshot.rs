//! Cluster test: `Client::stale_snapshot` reads keys on every shard at one timestamp, served
//! near the client. A writer commits generations of a key set spread over the shards, each
//! generation one transaction; every stale snapshot taken meanwhile, from a client in each
//! region, must see one generation on every key (a snapshot, not a mix), at a timestamp about
//! the staleness behind the serving replica's clock, and a scan of the whole keyspace in the
//! same snapshot must see the same generation on every key (half of the snapshots scan first,
//! fixing the timestamp, half after their reads); and replicas of more than one node serve
//! them (the client's region picks the replica, not the leader).

use crate::common::*;
use bytes::Bytes;
use meridian_cli::demo::keys_across_shards;
use meridian_cli::local_cluster::REGIONS;
use meridian_client::{Client, ClientConfig, TxnOptions};
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

const BASE_PORT: u16 = 29_800;
const SHARDS: u32 = 3;
const STALENESS: Duration = Duration::from_millis(1_500);
const SNAPSHOTS_PER_REGION: usize = 12;
/// The nodes' `--max-offset-ms` default: how far a node's clock may be from the test's.
const MAX_OFFSET_MS: u64 = 500;

#[test]
fn stale_snapshots_see_one_generation_across_shards() {
    run_scenario(scenario());
}

async fn region_client(endpoints: Vec<String>, region: &str) -> Client {
    let mut config = ClientConfig::new(endpoints);
    config.call_timeout = Duration::from_secs(20);
    config.region = Some(region.to_string());
    Client::connect(config).await.expect("connecting")
}

async fn scenario() {
    let dir = tempfile::tempdir().unwrap();
    let lag: &[&str] = &["--closed-ts-lag-ms", "1000"];
    let cluster = start_cluster(
        BASE_PORT,
        dir.path(),
        SHARDS,
        &[(1, lag), (2, lag), (3, lag)],
    );
    cluster.wait_ready(READY_TIMEOUT).await.expect("ready");
    let writer = connect_client(cluster.endpoints()).await;
    let keys = keys_across_shards(&writer.shard_map(), SHARDS as usize);
    assert_eq!(keys.len(), SHARDS as usize);

    // Generations 0, 1, 2, ... of every key, one transaction each.
    let (stop, generation) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicU64::new(0)),
    );
    let writing = {
        let (writer, keys, stop, generation) = (
            writer.clone(),
            keys.clone(),
            stop.clone(),
            generation.clone(),
        );
        tokio::spawn(async move {
            let mut next = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let value = Bytes::from(next.to_string());
                writer
                    .txn(TxnOptions::default(), |txn| {
                        let (keys, value) = (keys.clone(), value.clone());
                        Box::pin(async move {
                            for key in keys {
                                txn.put(key, value.clone())?;
                            }
                            Ok::<_, meridian_client::Error>(())
                        })
                    })
                    .await
                    .expect("a generation commits");
                generation.store(next, Ordering::Relaxed);
                next += 1;
                tokio::time::sleep(Duration::from_millis(30)).await;
            }
        })
    };
    // Past the staleness, so every snapshot's timestamp is after generation 0.
    tokio::time::sleep(STALENESS + Duration::from_secs(2)).await;

    let mut served_by = BTreeSet::new();
    let mut generations = BTreeSet::new();
    for region in REGIONS {
        let client = region_client(cluster.endpoints(), region).await;
        for i in 0..SNAPSHOTS_PER_REGION {
            let before = now_ms();
            let mut snapshot = client.stale_snapshot(STALENESS);
            // Half of the snapshots scan first (the scan fixes the timestamp), half after.
            let scan_first = i % 2 == 0;
            let mut scanned = Vec::new();
            if scan_first {
                scanned = snapshot.scan("", None, 100).await.expect("a stale scan");
            }
            let reads = snapshot
                .batch_get(keys.iter().cloned())
                .await
                .expect("a stale snapshot");
            if !scan_first {
                scanned = snapshot.scan("", None, 100).await.expect("a stale scan");
            }
            let read_ts = snapshot.read_ts().expect("fixed by the first read");
            let mut seen: BTreeSet<Option<Bytes>> = reads.iter().map(|r| r.value.clone()).collect();
            seen.extend(scanned.iter().map(|row| Some(row.value.clone())));
            assert_eq!(
                seen.len(),
                1,
                "a snapshot from {region} at {read_ts} mixes generations: {seen:?}"
            );
            let scanned_keys: BTreeSet<Bytes> = scanned.iter().map(|r| r.key.clone()).collect();
            assert_eq!(
                scanned_keys,
                keys.iter().cloned().collect::<BTreeSet<_>>(),
                "the scan crosses every shard"
            );
            assert!(reads.iter().all(|r| r.read_ts == read_ts));
            let value = seen
                .into_iter()
                .next()
                .flatten()
                .expect("generation 0 is older");
            generations.insert(String::from_utf8_lossy(&value).into_owned());
            let (low, high) = (
                before - STALENESS.as_millis() as u64 - MAX_OFFSET_MS,
                now_ms() - STALENESS.as_millis() as u64 + MAX_OFFSET_MS,
            );
            assert!(
                (low..=high).contains(&read_ts.physical_ms()),
                "read_ts {} ms not about {STALENESS:?} back (want {low}..={high})",
                read_ts.physical_ms()
            );
            served_by.extend(reads.iter().map(|r| r.served_by));
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    stop.store(true, Ordering::Relaxed);
    writing.await.expect("writer");
    eprintln!(
        "{} snapshots saw {} generations (writer reached {}), served by nodes {served_by:?}",
        SNAPSHOTS_PER_REGION * REGIONS.len(),
        generations.len(),
        generation.load(Ordering::Relaxed)
    );
    assert!(
        generations.len() > 1,
        "the snapshots never moved: {generations:?}"
    );
    assert!(
        served_by.len() > 1,
        "only {served_by:?} served the snapshots"
    );
    drop(writer);
    cluster.stop_all(Duration::from_secs(10));
}
