//! `TxnOptions::early_locks` against the in-process fake cluster (`fake`), which grants every
//! lock and records what it was sent: one owner and rank on every attempt of a transaction,
//! the owner on its commit (which releases the locks there), `Kv.ReleaseLocks` for shards a
//! transaction locked and did not commit on, and nothing at all with the option off.

mod fake;

use fake::*;
use meridian_client::{Client, Error, TxnOptions};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

async fn setup() -> (Fake, Client) {
    let fake = Fake::start(&["m"]).await;
    let client = fake
        .client(vec![fake.address(1)], Duration::from_secs(5))
        .await;
    (fake, client)
}

fn early() -> TxnOptions {
    TxnOptions {
        early_locks: true,
        lock_wait: Duration::from_millis(40),
        ..TxnOptions::default()
    }
}

/// Waits (bounded) until the fake has seen `n` releases; returns them.
async fn releases(fake: &Fake, n: usize) -> Vec<meridian_client::proto::WriteId> {
    for _ in 0..100 {
        if fake.world.releases.lock().unwrap().len() >= n {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    fake.world.releases.lock().unwrap().clone()
}

#[tokio::test]
async fn every_attempt_locks_as_one_owner_and_the_commit_carries_it() {
    let (fake, client) = setup().await;
    client.put("counter", "0").await.unwrap();
    let runs = Arc::new(AtomicU32::new(0));
    let (other, runs2) = (client.clone(), runs.clone());
    let (_, info) = client
        .txn(early(), move |txn| {
            let (other, runs) = (other.clone(), runs2.clone());
            Box::pin(async move {
                let n: u64 = match txn.get_for_update("counter").await? {
                    Some(v) => std::str::from_utf8(&v).unwrap().parse().unwrap(),
                    None => 0,
                };
                if runs.fetch_add(1, Ordering::SeqCst) == 0 {
                    // The fake grants every lock: a plain write still races the first attempt.
                    other.put("counter", (n + 1).to_string()).await?;
                }
                txn.put("counter", (n + 1).to_string())?;
                Ok::<_, Error>(())
            })
        })
        .await
        .unwrap();
    assert_eq!(info.attempts, 2);
    let locks = fake.world.lock_requests.lock().unwrap().clone();
    assert_eq!(locks.len(), 2, "one locking read per attempt");
    assert_eq!(
        locks[0], locks[1],
        "the same owner, rank and wait on every attempt"
    );
    let owner = locks[0].owner.expect("an owner");
    assert_ne!(owner.client_id, 0);
    assert_eq!((locks[0].priority, locks[0].wait_ms), (2, 40));
    assert_ne!(locks[0].age_ts, 0);
    let commits = fake.world.commit_lock_owners.lock().unwrap().clone();
    assert_eq!(commits, vec![Some(owner); 2], "both commits name the owner");
    assert_eq!(
        fake.world.commit_first_sends.lock().unwrap().clone(),
        vec![true; 2],
        "each attempt's commit is the first send of its own write id"
    );
    assert!(
        releases(&fake, 1).await.is_empty(),
        "the committed shard's locks went with the commit: nothing to release"
    );
}

/// A commit sent again with its write id (its first send's outcome unknown) is not a first
/// send: only a first send may be refused for a wounded owner, since an earlier send may
/// still apply (see `CommitRequest.first_send`).
#[tokio::test]
async fn only_the_first_send_of_a_commit_is_marked_first() {
    let (fake, client) = setup().await;
    client.put("k", "0").await.unwrap();
    fake.world.drop_next_commit.store(true, Ordering::SeqCst);
    let (_, info) = client
        .txn(early(), |txn| {
            Box::pin(async move {
                txn.get_for_update("k").await?;
                txn.put("k", "1")?;
                Ok::<_, Error>(())
            })
        })
        .await
        .unwrap();
    assert_eq!(info.attempts, 1, "the resend, not a new attempt, committed");
    // The client keeps away from the node whose connection failed for a while, so the resend
    // may first meet the other nodes (NOT_LEADER) before it reaches the leader again.
    let sends = fake.world.commit_first_sends.lock().unwrap().clone();
    assert!(sends.len() >= 2, "the commit was sent again: {sends:?}");
    assert!(sends[0], "the first send is marked first");
    assert!(
        sends[1..].iter().all(|first| !first),
        "no later send is marked first: {sends:?}"
    );
    let owners = fake.world.commit_lock_owners.lock().unwrap().clone();
    assert!(
        owners[0].is_some() && owners.iter().all(|o| *o == owners[0]),
        "every send names the owner: {owners:?}"
    );
    assert_eq!(client.get("k").await.unwrap().as_deref(), Some(&b"1"[..]));
}

#[tokio::test]
async fn a_transaction_that_ends_without_committing_releases_its_locks() {
    let (fake, client) = setup().await;
    client.put("a", "1").await.unwrap();
    client.put("z", "2").await.unwrap();
    // Read-only: nothing commits, so both shards it locked are released.
    client
        .txn(early(), |txn| {
            Box::pin(async move {
                txn.batch_get_for_update(["a", "z"]).await?;
                Ok::<_, Error>(())
            })
        })
        .await
        .unwrap();
    let owner = fake.world.lock_requests.lock().unwrap()[0].owner.unwrap();
    assert_eq!(releases(&fake, 2).await, vec![owner; 2], "one per shard");
    // A closure error ends the call: its shard is released too.
    let failed = client
        .txn(early(), |txn| {
            Box::pin(async move {
                txn.get_for_update("a").await?;
                Err::<(), _>(Error::InvalidArgument {
                    message: "the closure gives up".into(),
                })
            })
        })
        .await;
    assert!(failed.is_err());
    assert_eq!(releases(&fake, 3).await.len(), 3);
}

#[tokio::test]
async fn without_early_locks_nothing_is_locked_or_released() {
    let (fake, client) = setup().await;
    client.put("a", "1").await.unwrap();
    client
        .txn(TxnOptions::default(), |txn| {
            Box::pin(async move {
                txn.batch_get_for_update(["a", "b"]).await?;
                txn.put("a", "2")?;
                Ok::<_, Error>(())
            })
        })
        .await
        .unwrap();
    assert!(fake.world.lock_requests.lock().unwrap().is_empty());
    assert_eq!(
        fake.world.commit_lock_owners.lock().unwrap().clone(),
        vec![None]
    );
    assert!(releases(&fake, 1).await.is_empty());
}
