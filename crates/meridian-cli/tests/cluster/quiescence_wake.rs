//! Cluster test: quiesced shards wake for a membership change and across a partition that
//! heals (the wake paths `quiescence.rs` does not take: it covers a write, a read and a killed
//! leader).
//!
//! Peer traffic crosses `meridian-wan` links (2 ms each way) so that one node can be cut off.
//! 1. **Membership change.** Every replica quiesced: a follower of shard S is removed from S's
//!    group, then added back. Both changes need S's replication, which a parked group does not
//!    run: they must wake it. S then takes a write that reads back, and every replica quiesces
//!    again (the new group too).
//! 2. **Partition and heal.** Every replica quiesced: every link to and from node V, which leads
//!    the most shards, is cut. Its parked followers hear no pings from V and elect new leaders
//!    (V's replicas, still parked, know nothing); every shard takes writes on the majority.
//!    The links heal: V's stale leaders must learn of their successors and follow them. Every
//!    node then reports the same live leader for every shard, a read through V's client port
//!    sees the writes, and every replica, V's included, quiesces again.

use crate::common::*;
use bytes::Bytes;
use meridian_cli::demo::keys_across_shards;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// Nodes at 19501..19503 (client) and 19601..19603 (Raft).
const BASE_PORT: u16 = 19_500;
/// Six peer links, one per ordered node pair: 19660..19665.
const PEER_LINK_BASE_PORT: u16 = 19_660;
const ONE_WAY: Duration = Duration::from_millis(2);
const SHARDS: u32 = 6;
/// Bound on the majority electing leaders for the cut-off node's shards, and on every node
/// agreeing on leaders after the heal (election timeouts are 0.6–1.2 s).
const ELECTION_BOUND: Duration = Duration::from_secs(30);

#[test]
fn quiesced_shards_wake_for_membership_changes_and_partition_heals() {
    run_scenario(scenario());
}

/// Every shard's leader as each of `nodes` reports it, once all of them report the same live
/// one (not 0) for every shard (bounded wait).
async fn agreed_leaders(cluster: &meridian_cli::LocalCluster, nodes: &[u64]) -> BTreeMap<u64, u64> {
    let started = Instant::now();
    loop {
        let statuses = node_statuses(cluster, nodes).await;
        let mut seen: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
        for status in &statuses {
            for shard in &status.shards {
                seen.entry(shard.shard_id)
                    .or_default()
                    .push(shard.leader_id);
            }
        }
        let agreed = statuses.len() == nodes.len()
            && seen
                .values()
                .all(|l| l.len() == nodes.len() && l[0] != 0 && l.iter().all(|x| *x == l[0]));
        if agreed {
            return seen.into_iter().map(|(s, l)| (s, l[0])).collect();
        }
        assert!(
            started.elapsed() < ELECTION_BOUND,
            "nodes {nodes:?} do not agree on live leaders after {ELECTION_BOUND:?}: {seen:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn scenario() {
    let dir = tempfile::tempdir().unwrap();
    let (wan, dial) = peer_wan(3, BASE_PORT, PEER_LINK_BASE_PORT, ONE_WAY).await;
    let flags: Vec<Vec<String>> = dial.iter().map(|(_, args)| args.to_vec()).collect();
    let cluster = start_cluster_with_args(BASE_PORT, dir.path(), SHARDS, &flags);
    cluster.wait_ready(READY_TIMEOUT).await.expect("ready");
    let nodes = cluster.node_ids();
    let client = connect_client(cluster.endpoints()).await;
    let keys = keys_across_shards(&client.shard_map(), SHARDS as usize);
    let took = wait_all_quiesced(&cluster, &nodes).await;
    eprintln!("all replicas quiesced {took:?} after the cluster was ready");

    // 1. A membership change of a quiesced shard: remove a follower, add it back.
    let key = keys[0].clone();
    let route = client.route(&key).expect("routable");
    let shard = route.shard_id;
    let leader = route.leader_id.expect("a known leader");
    let follower = *nodes.iter().find(|n| **n != leader).unwrap();
    let removed = tokio::time::timeout(ELECTION_BOUND, client.remove_replica(shard, follower))
        .await
        .expect("the removal from a quiesced group finishes")
        .expect("remove a follower of a quiesced shard");
    assert!(
        !removed.voters.contains(&follower),
        "node {follower} left shard {shard}: {removed:?}"
    );
    let took = wait_all_quiesced(&cluster, &nodes).await;
    eprintln!("shard {shard} without node {follower} quiesced again {took:?} after the removal");
    let added = tokio::time::timeout(ELECTION_BOUND, client.add_replica(shard, follower))
        .await
        .expect("the add to a quiesced group finishes")
        .expect("add the follower back to the quiesced shard");
    assert!(
        added.voters.contains(&follower),
        "node {follower} votes in shard {shard} again: {added:?}"
    );
    client
        .put(key.clone(), Bytes::from_static(b"after-move"))
        .await
        .expect("a write after the membership changes");
    let got = client.get(key.clone()).await.expect("read back");
    assert_eq!(got.as_deref(), Some(&b"after-move"[..]));
    let took = wait_all_quiesced(&cluster, &nodes).await;
    eprintln!("every replica, node {follower}'s new one included, quiesced again {took:?} later");

    // 2. Cut the busiest leader off while everything is quiesced.
    let (victim, led) = busiest_leader(&cluster, &nodes).await;
    assert!(led > 0, "some node leads shards");
    cut_peer_links(&wan, 3, victim, true, true);
    let cut_at = Instant::now();
    let majority: Vec<u64> = nodes.iter().copied().filter(|n| *n != victim).collect();
    let took = wait_for_live_leaders(&cluster, &majority, victim, cut_at, ELECTION_BOUND).await;
    eprintln!("node {victim} (leading {led} quiesced shards) cut off: the majority had leaders for all {took:?} later");
    let majority_client = connect_to(&cluster, &majority).await;
    put_every_key(
        &majority_client,
        &keys,
        b"during-cut",
        &format!("on the majority while node {victim} is cut off"),
    )
    .await;

    // Heal: the cut-off node's stale leaders must follow the new ones.
    cut_peer_links(&wan, 3, victim, true, false);
    let healed_at = Instant::now();
    let leaders = agreed_leaders(&cluster, &nodes).await;
    eprintln!(
        "links healed: all three nodes agreed on every shard's leader {:?} later: {leaders:?}",
        healed_at.elapsed()
    );
    let through_victim = connect_client(vec![cluster.client_addr(victim).expect("address")]).await;
    for key in &keys {
        let got = through_victim
            .get(key.clone())
            .await
            .unwrap_or_else(|e| panic!("read through node {victim} after the heal: {e}"));
        assert_eq!(
            got.as_deref(),
            Some(&b"during-cut"[..]),
            "node {victim}'s client sees the majority's write of {key:?}"
        );
    }
    let took = wait_all_quiesced(&cluster, &nodes).await;
    eprintln!("every replica, node {victim}'s included, quiesced again {took:?} after the reads");
    assert_no_panics(&cluster, &nodes);
}
