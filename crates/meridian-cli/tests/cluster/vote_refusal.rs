//! Cluster test: a node refuses votes and pre-votes for `election_timeout_max` after it starts.
//!
//! A leader serves lease reads until `election_timeout_max` after its last quorum
//! acknowledgement, trusting that no follower that acknowledged it votes for anyone else before
//! then. openraft keeps that promise in memory only, so a follower that restarts would forget
//! it and could help elect a second leader while the first still reads from its lease. The
//! node therefore refuses every vote for `election_timeout_max` after start
//! (`MultiRaft::refuses_votes`). This test restarts a follower with a 6 s maximum and sends it
//! vote requests straight over the peer transport: refused at once, answered after the window.

use crate::common::*;
use meridian_proto::raft::raft_transport_client::RaftTransportClient;
use meridian_proto::raft::RaftRequest;
use nix::sys::signal::Signal;
use std::time::{Duration, Instant};

const WINDOW_MS: u64 = 6_000;

#[test]
fn a_restarted_node_refuses_votes_for_election_timeout_max() {
    run_scenario(scenario());
}

/// Sends a vote (or pre-vote) request with an undecodable payload: the refusal comes before
/// decoding, so a refusing node answers UNAVAILABLE and any other says the payload is bad.
async fn ask(peer: &str, pre_vote: bool) -> Result<(), tonic::Status> {
    let mut client = loop {
        match RaftTransportClient::connect(format!("http://{peer}")).await {
            Ok(c) => break c,
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    };
    let request = RaftRequest {
        shard_id: 1,
        hlc: 0,
        from_node: 1,
        payload: vec![0xff; 3].into(),
    };
    let result = if pre_vote {
        client.pre_vote(request).await
    } else {
        client.vote(request).await
    };
    result.map(|_| ())
}

fn refused(result: &Result<(), tonic::Status>) -> bool {
    matches!(result, Err(s) if s.code() == tonic::Code::Unavailable && s.message().contains("refuses votes"))
}

async fn scenario() {
    let dir = tempfile::tempdir().unwrap();
    let window = WINDOW_MS.to_string();
    let cluster = start_cluster(
        22_800,
        dir.path(),
        2,
        &[(2, &["--election-timeout-max-ms", window.as_str()])],
    );
    cluster
        .wait_ready(READY_TIMEOUT)
        .await
        .expect("cluster ready");
    let peer = cluster.spec(2).expect("node 2").peer_addr.clone();

    cluster.kill(2, Signal::SIGKILL).expect("SIGKILL node 2");
    cluster.restart(2).expect("restart node 2");
    let restarted = Instant::now();

    // Within the window: both kinds of vote are refused.
    let vote = ask(&peer, false).await;
    let pre_vote = ask(&peer, true).await;
    let asked_after = restarted.elapsed();
    assert!(
        asked_after < Duration::from_millis(WINDOW_MS / 2),
        "the node took {asked_after:?} to answer; too close to the window's end to test it"
    );
    assert!(refused(&vote), "vote right after restart: {vote:?}");
    assert!(
        refused(&pre_vote),
        "pre-vote right after restart: {pre_vote:?}"
    );

    // After the window: the request reaches Raft (and fails on its bad payload instead).
    let after = Duration::from_millis(WINDOW_MS + 1_000);
    tokio::time::sleep(after.saturating_sub(restarted.elapsed())).await;
    let vote = ask(&peer, false).await;
    assert!(!refused(&vote), "vote after the window: {vote:?}");
    assert!(
        matches!(&vote, Err(s) if s.code() == tonic::Code::InvalidArgument),
        "vote after the window should fail on its payload: {vote:?}"
    );
    eprintln!("refused {asked_after:?} after restart; answered after {WINDOW_MS} ms");
}
