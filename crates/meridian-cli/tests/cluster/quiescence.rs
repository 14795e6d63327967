//! Cluster test: idle shards quiesce (no heartbeats, no election timers), a write wakes its
//! shard, a read sees it, and when the node leading quiesced shards is SIGKILLed their followers notice through
//! node-level pings alone — no client traffic — and elect new leaders.

use crate::common::*;
use bytes::Bytes;
use meridian_cli::demo::keys_across_shards;
use meridian_client::fetch_status;
use meridian_client::proto::kv_client::KvClient;
use meridian_client::proto::{PutRequest, StatusResponse};
use meridian_client::Timestamp;
use std::time::{Duration, Instant};

const SHARDS: u32 = 16;
const STATUS_TIMEOUT: Duration = Duration::from_secs(2);
/// Bound on every shard having a live leader again after its leader's node died.
const FAILOVER_TIMEOUT: Duration = Duration::from_secs(60);
/// The cluster's `max_offset_ms` (the default).
const MAX_OFFSET_MS: u64 = 500;

#[test]
fn idle_shards_quiesce_and_elect_when_their_leader_dies() {
    run_scenario(scenario());
}

async fn statuses(cluster: &meridian_cli::LocalCluster, nodes: &[u64]) -> Vec<StatusResponse> {
    node_statuses(cluster, nodes).await
}

async fn scenario() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = start_cluster(22_000, dir.path(), SHARDS, &[]);
    cluster
        .wait_ready(READY_TIMEOUT)
        .await
        .expect("cluster ready");
    let nodes = cluster.node_ids();

    // 1. Idle: every replica of every shard (metadata included) quiesces.
    let took = wait_all_quiesced(&cluster, &nodes).await;
    eprintln!("all replicas quiesced {took:?} after the cluster was ready");

    // 2. A write wakes its shard (and succeeds); the shard quiesces again afterwards.
    let client = connect_client(cluster.endpoints()).await;
    let map = client.shard_map();
    let keys = keys_across_shards(&map, SHARDS as usize);
    let key = keys[0].clone();
    let before = fetch_status(&cluster.endpoints()[0], STATUS_TIMEOUT)
        .await
        .expect("status before the first write")
        .hlc_now;
    let written = client
        .put(key.clone(), Bytes::from_static(b"v1"))
        .await
        .expect("write to a quiesced shard");
    // The shard's leader was elected long ago (every replica has quiesced since), so its
    // term's `max_offset` wait is over: the first write of the term is issued at once. (It
    // used to start that wait at the term's first issue, so this write waited the whole
    // 500 ms and its version lay at least that far past the clock reading taken before it.)
    let issued_after_ms = written
        .physical_ms()
        .saturating_sub(Timestamp(before).physical_ms());
    eprintln!(
        "the first write of its leader's term was issued {issued_after_ms} ms after a clock \
         reading taken before it"
    );
    assert!(
        issued_after_ms < MAX_OFFSET_MS,
        "the first write after quiescence waited out the term's max_offset ({issued_after_ms} ms \
         after the reading before it); the wait should have begun at the election"
    );
    let shard = client.route(&key).expect("routable").shard_id;
    let awake_after_write = statuses(&cluster, &nodes)
        .await
        .iter()
        .flat_map(|s| s.shards.iter().filter(|sh| sh.shard_id == shard))
        .any(|sh| !sh.quiesced);
    assert!(
        awake_after_write,
        "the written shard {shard} should be awake"
    );
    let took = wait_all_quiesced(&cluster, &nodes).await;
    eprintln!("shard {shard} quiesced again {took:?} after the write");

    // A linearizable read of a quiesced shard sees the write: served on the parked lease
    // (`parked_reads` checks that path), or after a wake when that lease does not hold.
    let read_at = Instant::now();
    let got = client
        .get(key.clone())
        .await
        .expect("read of a quiesced shard");
    assert_eq!(got.as_deref(), Some(&b"v1"[..]), "the read sees the write");
    eprintln!(
        "a read of quiesced shard {shard} took {:?}",
        read_at.elapsed()
    );
    let took = wait_all_quiesced(&cluster, &nodes).await;
    eprintln!("shard {shard} quiesced again {took:?} after the read");

    // One Put RPC, no retries, straight to the leader of another quiesced shard: it succeeds.
    // (A parked leader's quorum lease has lapsed and openraft refuses writes until a quorum
    // round renews it; the leader used to answer NOT_LEADER with no hint and leave the retry,
    // and its backoff, to the client.)
    let other = keys
        .iter()
        .find(|k| client.route(k).is_some_and(|r| r.shard_id != shard))
        .expect("a key of another shard")
        .clone();
    let other_shard = client.route(&other).expect("routable").shard_id;
    let other_leader = statuses(&cluster, &nodes)
        .await
        .iter()
        .flat_map(|s| s.shards.iter())
        .find(|sh| sh.shard_id == other_shard && sh.leader_id != 0)
        .map(|sh| sh.leader_id)
        .expect("the other shard has a leader");
    let address = cluster.client_addr(other_leader).expect("leader address");
    let mut kv = KvClient::connect(format!("http://{address}"))
        .await
        .expect("connect to the leader");
    let put_at = Instant::now();
    kv.put(PutRequest {
        key: other.clone(),
        value: Bytes::from_static(b"v2"),
        ..Default::default()
    })
    .await
    .unwrap_or_else(|e| {
        panic!("one Put to shard {other_shard}'s parked leader (node {other_leader}) failed: {e}")
    });
    eprintln!(
        "one Put to quiesced shard {other_shard}'s leader took {:?}",
        put_at.elapsed()
    );

    // 3. SIGKILL the node leading the most (quiesced) shards; with no client traffic, the
    //    survivors must notice through pings and elect leaders for all of them.
    let (victim, orphaned, survivors, took) = kill_busiest_leader(&cluster, FAILOVER_TIMEOUT).await;
    eprintln!(
        "node {victim} led {orphaned} quiesced shards; all had live leaders {took:?} after SIGKILL, with no client traffic"
    );

    // 4. Every shard serves writes on the surviving majority.
    put_every_key(&client, &keys, b"v2", "after failover").await;
    assert_no_panics(&cluster, &survivors);
}
