//! Unit tests of `kv_early_lock`: waits, wounds, refusals, term clears, dropped requests and
//! commit guards, and the sweep.

use super::*;
use meridian_types::TxnPriority;

fn owner(seq: u64) -> RequestId {
    RequestId { client_id: 7, seq }
}

fn rank(age: u64) -> TxnRank {
    TxnRank::new(TxnPriority::Normal, age)
}

fn keys(names: &[&str]) -> Vec<Bytes> {
    names.iter().map(|k| Bytes::from(k.to_string())).collect()
}

const SHARD: ShardId = ShardId(3);
const WAIT: Duration = Duration::from_millis(200);

fn tracked(start: CommitStart<'_>) -> CommitGuard<'_> {
    match start {
        CommitStart::Tracked(guard) => guard,
        CommitStart::Untracked => panic!("untracked"),
        CommitStart::Wounded => panic!("wounded"),
    }
}

#[tokio::test]
async fn a_free_key_is_held_and_a_junior_waits_for_the_holders_commit() {
    let locks = std::sync::Arc::new(EarlyLocks::default());
    let k = keys(&["a"]);
    let first = locks.acquire(SHARD, 1, owner(1), rank(10), &k, WAIT).await;
    assert_eq!(first.held, vec![true]);
    assert_eq!(first.waited_us, 0);
    let (l2, k2) = (locks.clone(), k.clone());
    let junior = tokio::spawn(async move {
        l2.acquire(SHARD, 1, owner(2), rank(20), &k2, Duration::from_secs(5))
            .await
    });
    tokio::time::sleep(Duration::from_millis(20)).await;
    tracked(locks.begin_commit(SHARD, owner(1), true)).finish(true);
    let reply = junior.await.unwrap();
    assert_eq!(reply.held, vec![true]);
    assert!(reply.waited_us > 0);
    assert_eq!(locks.stats.waited.load(Ordering::Relaxed), 1);
    assert_eq!(locks.gauges(), (1, 0));
}

#[tokio::test]
async fn a_wait_that_runs_out_reads_unlocked_and_leaves_no_waiter() {
    let locks = EarlyLocks::default();
    let k = keys(&["a"]);
    locks.acquire(SHARD, 1, owner(1), rank(10), &k, WAIT).await;
    let reply = locks
        .acquire(SHARD, 1, owner(2), rank(20), &k, Duration::from_millis(30))
        .await;
    assert_eq!(reply.held, vec![false]);
    assert_eq!(locks.gauges(), (1, 0));
}

#[tokio::test]
async fn a_senior_wounds_a_junior_holder_who_is_told_so() {
    let locks = EarlyLocks::default();
    let k = keys(&["a"]);
    locks.acquire(SHARD, 1, owner(2), rank(20), &k, WAIT).await;
    let senior = locks.acquire(SHARD, 1, owner(1), rank(10), &k, WAIT).await;
    assert_eq!(senior.held, vec![true]);
    let junior = locks
        .acquire(SHARD, 1, owner(2), rank(20), &k, Duration::ZERO)
        .await;
    assert_eq!(junior.held, vec![false]);
    assert!(junior.wounded);
}

#[tokio::test]
async fn a_newer_term_clears_the_table_and_an_older_one_is_refused() {
    let locks = EarlyLocks::default();
    let k = keys(&["a"]);
    locks.acquire(SHARD, 1, owner(1), rank(10), &k, WAIT).await;
    let next = locks.acquire(SHARD, 2, owner(2), rank(20), &k, WAIT).await;
    assert_eq!(next.held, vec![true], "the old term's holder is gone");
    let stale = locks.acquire(SHARD, 1, owner(3), rank(5), &k, WAIT).await;
    assert_eq!(stale.held, vec![false]);
    assert_eq!(
        locks.stats.clears.load(Ordering::Relaxed),
        1,
        "a new table is no clear"
    );
}

#[tokio::test]
async fn a_commit_that_did_not_apply_keeps_the_locks_and_one_without_an_answer_drops_them() {
    let locks = EarlyLocks::default();
    let k = keys(&["a"]);
    locks.acquire(SHARD, 1, owner(1), rank(10), &k, WAIT).await;
    tracked(locks.begin_commit(SHARD, owner(1), true)).finish(false);
    let other = locks
        .acquire(SHARD, 1, owner(2), rank(20), &k, Duration::ZERO)
        .await;
    assert_eq!(other.held, vec![false], "a conflict keeps the locks");
    // A handler that ended without an answer: its commit may yet apply.
    drop(tracked(locks.begin_commit(SHARD, owner(1), true)));
    assert_eq!(locks.release(SHARD, owner(1)), 0, "dropped with the guard");
    let other = locks
        .acquire(SHARD, 1, owner(2), rank(20), &k, Duration::ZERO)
        .await;
    assert_eq!(other.held, vec![true]);
    assert!(matches!(
        locks.begin_commit(ShardId(99), owner(1), true),
        CommitStart::Untracked
    ));
}

#[tokio::test]
async fn a_wounded_owners_next_commit_is_refused_once() {
    let locks = EarlyLocks::default();
    let k = keys(&["a"]);
    locks.acquire(SHARD, 1, owner(2), rank(20), &k, WAIT).await;
    let senior = locks.acquire(SHARD, 1, owner(1), rank(10), &k, WAIT).await;
    assert_eq!(senior.held, vec![true]);
    assert!(matches!(
        locks.begin_commit(SHARD, owner(2), true),
        CommitStart::Wounded
    ));
    assert_eq!(locks.stats.wounded_commits.load(Ordering::Relaxed), 1);
    // Wounded again: a resend (not a first send) is never refused, the flag stays.
    locks
        .acquire(SHARD, 1, owner(2), rank(20), &keys(&["b"]), WAIT)
        .await;
    locks
        .acquire(SHARD, 1, owner(1), rank(10), &keys(&["b"]), WAIT)
        .await;
    tracked(locks.begin_commit(SHARD, owner(2), false)).finish(false);
    assert!(matches!(
        locks.begin_commit(SHARD, owner(2), true),
        CommitStart::Wounded
    ));
    // Its next attempt's commit goes ahead (and is checked as usual).
    tracked(locks.begin_commit(SHARD, owner(2), true)).finish(false);
    // The senior, committing, cannot be wounded by anyone.
    let guard = tracked(locks.begin_commit(SHARD, owner(1), true));
    let most_senior = locks
        .acquire(SHARD, 1, owner(0), rank(1), &k, Duration::ZERO)
        .await;
    assert_eq!(most_senior.held, vec![false]);
    guard.finish(true);
}

#[tokio::test]
async fn an_idle_owner_loses_its_locks_to_the_next_acquire() {
    let locks = EarlyLocks::new(20);
    let k = keys(&["a"]);
    locks.acquire(SHARD, 1, owner(1), rank(10), &k, WAIT).await;
    tokio::time::sleep(Duration::from_millis(40)).await;
    let next = locks
        .acquire(SHARD, 1, owner(2), rank(20), &k, Duration::ZERO)
        .await;
    assert_eq!(next.held, vec![true]);
}

#[tokio::test]
async fn the_sweep_expires_idle_owners_and_drops_empty_tables() {
    let locks = EarlyLocks::new(20);
    locks
        .acquire(SHARD, 1, owner(1), rank(10), &keys(&["a"]), WAIT)
        .await;
    locks.sweep();
    assert_eq!(locks.gauges(), (1, 0), "not idle yet");
    tokio::time::sleep(Duration::from_millis(40)).await;
    locks.sweep();
    assert_eq!(locks.gauges(), (0, 0));
    assert!(
        locks.shards.lock().unwrap().is_empty(),
        "the empty table is dropped"
    );
}

#[tokio::test]
async fn a_dropped_request_leaves_no_waiter() {
    let locks = std::sync::Arc::new(EarlyLocks::default());
    let k = keys(&["a"]);
    locks.acquire(SHARD, 1, owner(1), rank(10), &k, WAIT).await;
    let (l2, k2) = (locks.clone(), k.clone());
    let waiting = tokio::spawn(async move {
        l2.acquire(SHARD, 1, owner(2), rank(20), &k2, Duration::from_secs(5))
            .await
    });
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(locks.gauges(), (1, 1));
    waiting.abort();
    let _ = waiting.await;
    assert_eq!(locks.gauges(), (1, 0));
}
