//! Unit tests of `quiesce`: idle thresholds and the parking decisions of leaders and followers.

use super::*;
use crate::types::TypeConfig;

fn log_id(term: u64, leader: NodeId, index: u64) -> LogId {
    openraft::testing::log_id::<TypeConfig>(term, leader, index)
}

fn committed_vote(term: u64, leader: NodeId) -> Vote {
    Vote::new_committed(term, leader)
}

/// A 3-voter group led by node 1 in term 2, everything at index 10.
fn leader_view() -> GroupView {
    let last = log_id(2, 1, 10);
    GroupView {
        state: ServerState::Leader,
        leader: Some(1),
        vote: committed_vote(2, 1),
        last_log_index: Some(10),
        committed: Some(last),
        applied: Some(last),
        membership_settled: true,
        voters: vec![1, 2, 3],
        matched: vec![(1, Some(last)), (2, Some(last)), (3, Some(last))],
    }
}

#[test]
fn a_shard_woken_soon_after_parking_waits_longer_before_the_next_quiesce() {
    let base = 1_000;
    // Woken 1.5 s after parking (< 2 × 1 s): the threshold doubles, and keeps doubling...
    assert_eq!(next_idle_threshold(0, base, 1_500), 2_000);
    assert_eq!(next_idle_threshold(2_000, base, 3_999), 4_000);
    // ... up to 8 × the base.
    assert_eq!(MAX_IDLE_THRESHOLD_FACTOR, 8);
    assert_eq!(next_idle_threshold(4_000, base, 1_000), 8_000);
    assert_eq!(
        next_idle_threshold(8_000, base, 1_000),
        base * MAX_IDLE_THRESHOLD_FACTOR
    );
    // Parked long enough (≥ 2 × its threshold): back to the base.
    assert_eq!(next_idle_threshold(4_000, base, 8_000), base);
    assert_eq!(next_idle_threshold(0, base, 2_000), base);
}

#[test]
fn a_caught_up_leader_may_quiesce() {
    assert!(leader_view().leader_can_quiesce(1));
}

#[test]
fn a_leader_with_a_lagging_voter_or_unapplied_entries_may_not() {
    let mut v = leader_view();
    v.matched[2].1 = Some(log_id(2, 1, 9));
    assert!(!v.leader_can_quiesce(1), "voter 3 lags");
    let mut v = leader_view();
    v.matched.retain(|(id, _)| *id != 3);
    assert!(!v.leader_can_quiesce(1), "voter 3 unknown");
    let mut v = leader_view();
    v.last_log_index = Some(11);
    assert!(!v.leader_can_quiesce(1), "an uncommitted entry");
    let mut v = leader_view();
    v.applied = Some(log_id(2, 1, 9));
    assert!(!v.leader_can_quiesce(1), "not applied yet");
    let mut v = leader_view();
    v.membership_settled = false;
    assert!(!v.leader_can_quiesce(1), "membership change in flight");
    assert!(!leader_view().leader_can_quiesce(2), "not this node's lead");
    let mut v = leader_view();
    v.state = ServerState::Follower;
    assert!(!v.leader_can_quiesce(1));
}

fn follower_view() -> GroupView {
    GroupView {
        state: ServerState::Follower,
        matched: Vec::new(),
        ..leader_view()
    }
}

fn request() -> QuiesceRequest {
    QuiesceRequest {
        vote: committed_vote(2, 1),
        last_log_id: Some(log_id(2, 1, 10)),
    }
}

#[test]
fn a_follower_parks_only_for_its_leader_at_the_same_log() {
    assert!(follower_view().follower_can_park(1, &request()));
    assert!(
        !follower_view().follower_can_park(3, &request()),
        "not its leader"
    );
    let mut r = request();
    r.vote = committed_vote(3, 1);
    assert!(!follower_view().follower_can_park(1, &r), "another term");
    let mut r = request();
    r.vote = Vote::new(2, 1);
    assert!(
        !follower_view().follower_can_park(1, &r),
        "uncommitted vote"
    );
    let mut r = request();
    r.last_log_id = Some(log_id(2, 1, 11));
    assert!(!follower_view().follower_can_park(1, &r), "leader is ahead");
    let mut v = follower_view();
    v.committed = Some(log_id(2, 1, 9));
    assert!(
        !v.follower_can_park(1, &request()),
        "not committed here yet"
    );
    let mut v = follower_view();
    v.state = ServerState::Candidate;
    assert!(!v.follower_can_park(1, &request()));
}

/// A `Wake` that arrives while a quiesce round is running is answered only once the round has
/// ended, and counts as activity (so the round gives up, or parks and resumes at once): an
/// answer given between the round's last check and its parking would release a follower's
/// promise that the new parking still counts (found by review; `parked_promise`).
#[tokio::test]
async fn a_wake_waits_out_a_quiesce_round_and_counts_as_activity() {
    let node = crate::proposals::tests::one_node(true).await;
    let replica = node.replica.clone();
    replica.quiet.last_activity_ms.store(0, SeqCst);
    replica.quiet.attempting.store(true, SeqCst);
    let woken = tokio::spawn({
        let replica = replica.clone();
        async move { replica.wake_requested().await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!woken.is_finished(), "answered while the round was running");
    assert!(
        replica.quiet.last_activity_ms.load(SeqCst) > 0,
        "a Wake is activity, which ends the round"
    );
    replica.quiet.attempting.store(false, SeqCst);
    assert!(woken.await.unwrap(), "answered once the round ended");
    assert!(!replica.is_quiesced());
}
