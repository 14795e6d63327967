//! Cluster test: parked leases serve reads, and parked followers keep their promises
//! (meridian-raft `parked_promise`), on real processes.
//!
//! 1. Idle, every group parks and holds its parked lease; every follower replica holds a
//!    promise to its leader (`meridian_raft_parked_promises`).
//! 2. Linearizable reads of every key are served on the parked leases: they return what was
//!    written, `meridian_raft_parked_reads_total` counts them, and no group wakes; so are a
//!    batch read and a one-page scan of every key (one count per shard asked). A
//!    ReadIndex read (which asks for a quorum round) wakes its group instead: the control
//!    that the count and the quiet state tell the two paths apart.
//! 3. A vote request for another candidate, sent straight over the peer transport to a
//!    parked follower, is refused: the follower promised its leader. The control: once the
//!    leader's node has been frozen (SIGSTOP) for longer than `election_timeout_max`, the
//!    promise has lapsed and the same request is granted.

use crate::common::*;
use meridian_proto::raft::raft_transport_client::RaftTransportClient;
use meridian_proto::raft::RaftRequest;
use meridian_raft::types::{codec, TypeConfig, Vote, VoteRequest, VoteResponse};
use nix::sys::signal::Signal;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

const BASE_PORT: u16 = 27_100;
const SHARDS: u32 = 4;
const KEYS: usize = 40;
/// The cluster's `election_timeout_max` (twice the minimum the local cluster sets).
const ELECTION_TIMEOUT_MAX: Duration = Duration::from_millis(1_200);

fn metrics_port(node: u64) -> u16 {
    BASE_PORT + 50 + node as u16
}

/// One metric summed over nodes 1..=3, read now.
fn total(name: &str) -> u64 {
    (1..=3)
        .map(|n| sample(&scrape_metrics(metrics_port(n)), name) as u64)
        .sum()
}

/// Every group's leader, once every node reports the same one.
async fn leaders(cluster: &meridian_cli::LocalCluster, nodes: &[u64]) -> BTreeMap<u64, u64> {
    let started = Instant::now();
    loop {
        let mut seen: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
        let statuses = node_statuses(cluster, nodes).await;
        for shard in statuses.iter().flat_map(|s| s.shards.iter()) {
            seen.entry(shard.shard_id)
                .or_default()
                .push(shard.leader_id);
        }
        if statuses.len() == nodes.len()
            && seen
                .values()
                .all(|l| l.len() == nodes.len() && l[0] != 0 && l.iter().all(|x| *x == l[0]))
        {
            return seen.into_iter().map(|(s, l)| (s, l[0])).collect();
        }
        assert!(started.elapsed() < Duration::from_secs(30), "{seen:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Sends `candidate`'s vote request (a term and a log far ahead of the group's) for `shard` to
/// the peer transport at `peer`; openraft's answer.
async fn ask_vote(peer: &str, shard: u64, candidate: u64) -> VoteResponse {
    let mut client = RaftTransportClient::connect(format!("http://{peer}"))
        .await
        .expect("connecting to the peer transport");
    let far = 1_000_000;
    let rpc = VoteRequest::new(
        Vote::new(far, candidate),
        Some(openraft::testing::log_id::<TypeConfig>(far, candidate, far)),
    );
    let mut request = tonic::Request::new(RaftRequest {
        shard_id: shard,
        hlc: 0,
        from_node: candidate,
        payload: codec::encode(&rpc).unwrap().into(),
    });
    request.set_timeout(Duration::from_secs(5));
    let reply = client.vote(request).await.expect("the vote is answered");
    let answer: Result<VoteResponse, String> = codec::decode(&reply.into_inner().payload).unwrap();
    answer.expect("openraft answers the vote")
}

#[test]
fn parked_leases_serve_reads_and_parked_followers_refuse_other_candidates() {
    run_scenario(scenario());
}

async fn scenario() {
    let dir = tempfile::tempdir().unwrap();
    let cluster =
        start_cluster_with_args(BASE_PORT, dir.path(), SHARDS, &metrics_flags(metrics_port));
    cluster.wait_ready(READY_TIMEOUT).await.expect("ready");
    let nodes = cluster.node_ids();
    let client = connect_client(cluster.endpoints()).await;
    let keys: Vec<bytes::Bytes> = (0..KEYS)
        .map(|i| bytes::Bytes::from(format!("parked-{i:03}")))
        .collect();
    put_every_key(&client, &keys, b"v1", "before parking").await;

    // 1. Every group parks and holds its lease; each follower replica holds a promise.
    let groups = u64::from(SHARDS) + 1;
    wait_all_quiesced(&cluster, &nodes).await;
    let leased = || total("meridian_raft_parked_leases");
    wait_for("parked leases", Duration::from_secs(30), leased, |n| {
        *n == groups
    })
    .await;
    let promises = total("meridian_raft_parked_promises");
    assert_eq!(promises, 2 * groups, "two followers of each group promised");

    // 2. Reads are served on the parked leases without waking anything.
    let before = total("meridian_raft_parked_reads_total");
    for key in &keys {
        let got = client.get(key.clone()).await.expect("read");
        assert_eq!(got.as_deref(), Some(&b"v1"[..]), "{key:?}");
    }
    let served = total("meridian_raft_parked_reads_total") - before;
    assert!(
        served >= KEYS as u64,
        "{served} of {KEYS} reads were served on parked leases"
    );
    let (quiet, all) = quiesced(&node_statuses(&cluster, &nodes).await);
    assert_eq!(quiet, all, "no group woke for the parked reads");
    // So are batch reads and scan pages, one count per shard asked.
    let before = total("meridian_raft_parked_reads_total");
    let got = client.batch_get(keys.clone()).await.expect("batch read");
    assert!(
        got.iter().all(|v| v.as_deref() == Some(&b"v1"[..])),
        "{got:?}"
    );
    let batched = total("meridian_raft_parked_reads_total") - before;
    let before = total("meridian_raft_parked_reads_total");
    // The keys sit in the first shard (below the split points' "user"): one page answers the
    // scan. (A scan that needs more pages reads them again at one snapshot, which wakes the
    // shards it reads: see the client's `multi`.)
    let rows = client
        .scan("parked-", Some(bytes::Bytes::from("parked.")), 1_000, false)
        .await
        .expect("scan");
    let scanned: Vec<_> = rows.iter().map(|r| r.key.clone()).collect();
    assert_eq!(scanned, keys, "the scan returns every key once, in order");
    let paged = total("meridian_raft_parked_reads_total") - before;
    assert!(
        batched >= 1 && paged >= 1,
        "served on parked leases: {batched} batch parts, {paged} scan pages"
    );
    let (quiet, all) = quiesced(&node_statuses(&cluster, &nodes).await);
    assert_eq!(quiet, all, "no group woke for the batch read or the scan");
    // The control: a ReadIndex read takes a quorum round, so it wakes its group.
    let mut config = meridian_client::ClientConfig::new(cluster.endpoints());
    config.read_consistency = meridian_client::ReadConsistency::LinearizableReadIndex;
    let read_index = meridian_client::Client::connect(config).await.unwrap();
    let before = total("meridian_raft_parked_reads_total");
    let got = read_index
        .get(keys[0].clone())
        .await
        .expect("ReadIndex read");
    assert_eq!(got.as_deref(), Some(&b"v1"[..]));
    assert_eq!(total("meridian_raft_parked_reads_total"), before);
    let (quiet, all) = quiesced(&node_statuses(&cluster, &nodes).await);
    assert!(
        quiet < all,
        "a ReadIndex read wakes its group ({quiet} of {all} quiesced)"
    );

    // 3. A parked follower refuses a vote for another candidate: once every group is parked
    //    again, and for longer than election_timeout_max (so openraft's own lease from the
    //    last heartbeat is over), ask a follower of a data shard to vote for the other.
    wait_all_quiesced(&cluster, &nodes).await;
    wait_for(
        "parked leases again",
        Duration::from_secs(30),
        leased,
        |n| *n == groups,
    )
    .await;
    tokio::time::sleep(ELECTION_TIMEOUT_MAX + Duration::from_millis(200)).await;
    let by_shard = leaders(&cluster, &nodes).await;
    let (&shard, &leader) = by_shard
        .iter()
        .find(|(s, _)| **s != 0)
        .expect("a data shard");
    let followers: Vec<u64> = nodes.iter().copied().filter(|n| *n != leader).collect();
    let (voter, candidate) = (followers[0], followers[1]);
    let peer = cluster.spec(voter).expect("voter").peer_addr.clone();
    let refused = ask_vote(&peer, shard, candidate).await;
    assert!(
        !refused.vote_granted,
        "node {voter}, parked under {leader}, granted shard {shard}'s vote to {candidate}: {refused:?}"
    );
    // The control: with the leader's node (and the candidate's, so that no real election
    // gives the voter a new leader's lease) frozen past election_timeout_max, the promise has
    // lapsed and the same request is granted.
    for n in [leader, candidate] {
        cluster.kill(n, Signal::SIGSTOP).expect("SIGSTOP");
    }
    tokio::time::sleep(ELECTION_TIMEOUT_MAX + Duration::from_millis(500)).await;
    let granted = ask_vote(&peer, shard, candidate).await;
    for n in [leader, candidate] {
        cluster.kill(n, Signal::SIGCONT).expect("SIGCONT");
    }
    assert!(
        granted.vote_granted,
        "with its leader silent, node {voter} should grant the vote: {granted:?}"
    );
    eprintln!("shard {shard}: node {voter} refused {candidate} while parked under {leader}, granted once {leader} was silent");

    assert_no_panics(&cluster, &nodes);
    cluster.stop_all(Duration::from_secs(10));
}
