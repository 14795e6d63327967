//! `Client::txn` against the in-process fake cluster (`fake`), whose commit checks reads the
//! way a shard's state machine does: buffered writes, read-your-writes, re-runs on conflicts
//! (point reads and phantoms in scanned ranges), read-only transactions at one snapshot across
//! shards, restarts after uncertain reads, and how a transaction that writes two shards
//! prepares.

mod fake;

use bytes::Bytes;
use fake::*;
use meridian_client::{Client, Error, Isolation, TxnOptions};
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

fn b(s: &str) -> Bytes {
    Bytes::copy_from_slice(s.as_bytes())
}

#[tokio::test]
async fn writes_are_buffered_until_commit_and_read_back_by_the_transaction() {
    let (fake, client) = setup().await;
    client.put("a", "1").await.unwrap();
    let mut txn = client.begin();
    assert_eq!(txn.get("a").await.unwrap(), Some(b("1")));
    txn.put("a", "2").unwrap();
    txn.delete("b").unwrap();
    txn.put("c", "3").unwrap();
    assert_eq!(
        txn.get("a").await.unwrap(),
        Some(b("2")),
        "read your writes"
    );
    assert_eq!(txn.get("b").await.unwrap(), None);
    assert_eq!(
        client.get("a").await.unwrap(),
        Some(b("1")),
        "nothing sent yet"
    );
    let rows = txn.scan("", Some(b("m")), 10).await.unwrap();
    let keys: Vec<&[u8]> = rows.iter().map(|r| &r.key[..]).collect();
    assert_eq!(
        keys,
        vec![&b"a"[..], b"c"],
        "the scan merges the write buffer"
    );
    fake.served();
    let ts = txn.commit().await.unwrap().expect("a commit with writes");
    let served = fake.served();
    assert_eq!(
        served.iter().filter(|(_, m)| *m == "commit").count(),
        1,
        "one commit request: {served:?}"
    );
    assert_eq!(
        client.get_versioned("a").await.unwrap().unwrap().version_ts,
        ts
    );
    assert_eq!(client.get("c").await.unwrap(), Some(b("3")));
}

#[tokio::test]
async fn a_conflict_reruns_the_whole_closure() {
    let (_fake, client) = setup().await;
    client.put("counter", "0").await.unwrap();
    let runs = Arc::new(AtomicU32::new(0));
    let (other, runs2) = (client.clone(), runs.clone());
    let (value, info) = client
        .txn(TxnOptions::default(), move |txn| {
            let (other, runs) = (other.clone(), runs2.clone());
            Box::pin(async move {
                let n: u64 = txn.get_str("counter").await?.parse().unwrap();
                if runs.fetch_add(1, Ordering::SeqCst) == 0 {
                    // Someone else increments between our read and our commit.
                    other.put("counter", (n + 1).to_string()).await?;
                }
                txn.put("counter", (n + 1).to_string())?;
                Ok::<_, Error>(n + 1)
            })
        })
        .await
        .unwrap();
    assert_eq!((value, info.attempts), (2, 2));
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    assert_eq!(
        client.get("counter").await.unwrap(),
        Some(b("2")),
        "no lost update"
    );
    assert!(info.commit_ts.is_some());
}

#[tokio::test]
async fn a_phantom_in_a_scanned_range_is_a_conflict() {
    let (_fake, client) = setup().await;
    client.put("b/1", "x").await.unwrap();
    let mut txn = client.begin();
    assert_eq!(txn.scan("b/", Some(b("b0")), 10).await.unwrap().len(), 1);
    txn.put("count", "1").unwrap();
    client.put("b/2", "y").await.unwrap();
    let e = txn.commit().await.unwrap_err();
    assert!(
        matches!(&e, Error::TxnConflict { key } if key == "b/"),
        "{e}"
    );
    assert_eq!(client.get("count").await.unwrap(), None, "nothing written");
}

#[tokio::test]
async fn read_only_transactions_read_one_snapshot_across_shards_and_commit_nothing() {
    let (fake, client) = setup().await;
    client.put("a", "1").await.unwrap();
    client.put("z", "2").await.unwrap();
    let mut txn = client.begin();
    txn.get("a").await.unwrap();
    txn.get("z").await.unwrap();
    txn.scan("", None, 100).await.unwrap();
    let values = txn.batch_get(["z", "a", "nope", "z"]).await.unwrap();
    assert_eq!(values, vec![Some(b("2")), Some(b("1")), None, Some(b("2"))]);
    fake.served();
    assert_eq!(txn.commit().await.unwrap(), None);
    assert!(fake.served().is_empty(), "a read-only commit sends nothing");
    let reads = std::mem::take(&mut *fake.world.snapshot_reads.lock().unwrap());
    assert_eq!(reads[0], 0, "the first read lets its node pick: {reads:?}");
    assert!(
        reads.len() >= 4 && reads[1] != 0 && reads[1..].iter().all(|&t| t == reads[1]),
        "every later read, on both shards, at the picked timestamp: {reads:?}"
    );

    // A multi-shard batch as the first read: one shard picks, then the others read there.
    let mut txn = client.begin();
    txn.batch_get(["a", "z"]).await.unwrap();
    let reads = std::mem::take(&mut *fake.world.snapshot_reads.lock().unwrap());
    assert_eq!(reads.len(), 2, "{reads:?}");
    assert!(reads[0] == 0 && reads[1] != 0, "{reads:?}");
}

#[tokio::test]
async fn an_uncertain_read_reruns_the_closure_at_the_newer_version() {
    let (_fake, client) = setup().await;
    client.put("a", "1").await.unwrap();
    client.put("z", "2").await.unwrap();
    let runs = Arc::new(AtomicU32::new(0));
    let (other, runs2) = (client.clone(), runs.clone());
    let (values, info) = client
        .txn(TxnOptions::default(), move |txn| {
            let (other, runs) = (other.clone(), runs2.clone());
            Box::pin(async move {
                let a = txn.get_str("a").await?;
                if runs.fetch_add(1, Ordering::SeqCst) == 0 {
                    // Written after the snapshot was picked: the fake answers "uncertain".
                    other.put("z", "3").await?;
                }
                let z = match txn.get_str("z").await {
                    Ok(z) => z,
                    // Whatever the closure makes of the restart, the attempt is over.
                    Err(Error::TxnUncertain { .. }) => "swallowed".to_string(),
                    Err(e) => return Err(e),
                };
                Ok::<_, Error>((a, z))
            })
        })
        .await
        .unwrap();
    assert_eq!(values, ("1".to_string(), "3".to_string()));
    assert_eq!((info.attempts, info.commit_ts), (2, None));

    // By hand: the attempt reports the restart and refuses further reads and the commit.
    let mut txn = client.begin();
    txn.get("a").await.unwrap();
    client.put("z", "4").await.unwrap();
    let e = txn.get("z").await.unwrap_err();
    assert!(matches!(e, Error::TxnUncertain { .. }), "{e}");
    assert!(matches!(
        txn.get("q").await,
        Err(Error::TxnUncertain { .. })
    ));
    assert!(matches!(
        txn.commit().await,
        Err(Error::TxnUncertain { .. })
    ));
}

#[tokio::test]
async fn a_transaction_that_writes_two_shards_prepares_each_under_one_id_and_anchor() {
    let (fake, client) = setup().await;
    let mut txn = client.begin();
    txn.get("y").await.unwrap();
    txn.put("b", "1").unwrap();
    txn.put("a", "1").unwrap();
    txn.put("z", "1").unwrap();
    // The fake refuses prepares (a multi-shard commit runs against real nodes in meridian-cli's
    // tests/cluster/txn.rs): the refusal comes back, and the transaction is aborted at its anchor.
    let e = txn.commit().await.unwrap_err();
    assert!(e.to_string().contains("the fake does not prepare"), "{e}");
    let prepares = fake.world.prepares.lock().unwrap().clone();
    assert_eq!(prepares.len(), 2, "{prepares:?}");
    assert!(prepares
        .iter()
        .all(|(p, _)| p.anchor == b("a") && p.txn == prepares[0].0.txn));
    let mut writes: Vec<usize> = prepares.iter().map(|(_, n)| *n).collect();
    writes.sort();
    assert_eq!(writes, vec![1, 2], "a and b in one shard, z in the other");
    assert!(
        fake.served().iter().any(|(_, m)| *m == "resolve"),
        "the abort went to the anchor"
    );
    assert_eq!(client.get("a").await.unwrap(), None);
}

/// A multi-shard commit whose prepare on shard 2 is staged but never answered: the
/// coordinator recovers the transaction, finds every participant prepared, and so settles it
/// committed at the largest prepare timestamp. With `linearizable` that commit must still
/// wait out the clock uncertainty (the lost answer carried the participant's own wait), so
/// the client asks `Kv.CommitWait` on it before returning; a failed wait is an ambiguous
/// error, not a success, and without `linearizable` nothing waits.
#[tokio::test]
async fn a_commit_settled_by_recovery_waits_on_its_timestamp_when_linearizable() {
    let fake = Fake::start(&["m"]).await;
    let mut config = meridian_client::ClientConfig::new(vec![fake.address(1)]);
    config.max_attempts = 2;
    config.backoff_initial = Duration::from_millis(5);
    config.backoff_max = Duration::from_millis(20);
    config.jitter_seed = Some(7);
    let client = Client::connect(config).await.unwrap();
    let commit = |linearizable: bool| {
        let client = client.clone();
        let options = TxnOptions {
            linearizable,
            max_attempts: 1,
            ..TxnOptions::default()
        };
        async move {
            client
                .txn(options, |txn| {
                    Box::pin(async move {
                        txn.put("a", "1")?;
                        txn.put("z", "1")?;
                        Ok::<_, Error>(())
                    })
                })
                .await
                .map(|(_, info)| info.commit_ts.expect("it wrote").0)
        }
    };
    let lose_shard_2 = |fail_commit_wait: bool| {
        *fake.world.two_phase.lock().unwrap() = Some(TwoPhase {
            lose_reply_on: [2].into(),
            fail_commit_wait,
            ..TwoPhase::default()
        });
    };
    let seen = |what: fn(&TwoPhase) -> Vec<u64>| {
        what(fake.world.two_phase.lock().unwrap().as_ref().unwrap())
    };
    let largest_prepare = |t: &TwoPhase| vec![t.staged.values().map(|(ts, _)| *ts).max().unwrap()];

    for linearizable in [true, false] {
        lose_shard_2(false);
        let ts = commit(linearizable).await.unwrap();
        assert_eq!(
            vec![ts],
            seen(largest_prepare),
            "committed at the largest prepare"
        );
        let resolves = fake
            .world
            .two_phase
            .lock()
            .unwrap()
            .as_ref()
            .unwrap()
            .resolves
            .clone();
        assert_eq!(
            resolves,
            vec![
                (1, "abort"),
                (2, "prevent"),
                (1, "commit"),
                (2, "commit"),
                (1, "finish")
            ],
            "the recovery's steps"
        );
        let waits = seen(|t| t.commit_waits.clone());
        match linearizable {
            true => assert_eq!(
                waits,
                vec![ts],
                "the recovered commit waits on its timestamp"
            ),
            false => assert_eq!(waits, Vec::<u64>::new(), "nothing waits"),
        }
    }

    lose_shard_2(true);
    let e = commit(true).await.unwrap_err();
    assert!(
        matches!(&e, Error::Ambiguous { message }
            if message.contains("was settled as committed at")
                && message.contains("but its commit-wait failed")),
        "{e}"
    );
}

#[tokio::test]
async fn conflicts_stop_after_max_attempts_and_closure_errors_end_the_call() {
    let (_fake, client) = setup().await;
    let other = client.clone();
    let options = TxnOptions {
        max_attempts: 3,
        ..TxnOptions::default()
    };
    let runs = Arc::new(AtomicU32::new(0));
    let runs2 = runs.clone();
    let e = client
        .txn(options, move |txn| {
            let (other, runs) = (other.clone(), runs2.clone());
            Box::pin(async move {
                runs.fetch_add(1, Ordering::SeqCst);
                txn.get("hot").await?;
                other.put("hot", "x").await?;
                txn.put("hot", "mine")?;
                Ok::<_, Error>(())
            })
        })
        .await
        .unwrap_err();
    assert!(matches!(e, Error::TxnConflict { .. }), "{e}");
    assert_eq!(runs.load(Ordering::SeqCst), 3);

    let e = client
        .txn(TxnOptions::default(), |txn| {
            Box::pin(async move {
                txn.put("k", "v")?;
                Err::<(), _>(Error::InvalidArgument {
                    message: "user abort".into(),
                })
            })
        })
        .await
        .unwrap_err();
    assert!(e.to_string().contains("user abort"), "{e}");
    assert_eq!(
        client.get("k").await.unwrap(),
        None,
        "an aborted closure writes nothing"
    );
}

#[tokio::test]
async fn snapshot_isolation_allows_write_skew_and_serializable_does_not() {
    let (_fake, client) = setup().await;
    for isolation in [Isolation::Snapshot, Isolation::Serializable] {
        client.put("x", "on").await.unwrap();
        client.put("y", "on").await.unwrap();
        // Two on-call doctors: each goes off call only if the other is still on.
        let mut first = client.begin_with(isolation);
        let mut second = client.begin_with(isolation);
        for txn in [&mut first, &mut second] {
            assert_eq!(txn.get("x").await.unwrap(), Some(b("on")));
            assert_eq!(txn.get("y").await.unwrap(), Some(b("on")));
        }
        first.put("x", "off").unwrap();
        second.put("y", "off").unwrap();
        first.commit().await.expect("the first commits");
        let second = second.commit().await;
        let both_off = client.get("x").await.unwrap() == Some(b("off"))
            && client.get("y").await.unwrap() == Some(b("off"));
        match isolation {
            Isolation::Snapshot => {
                assert!(second.is_ok(), "{second:?}");
                assert!(both_off, "write skew under snapshot isolation");
            }
            Isolation::Serializable => {
                assert!(
                    matches!(&second, Err(Error::TxnConflict { key }) if key == "x"),
                    "{second:?}"
                );
                assert!(!both_off, "no write skew when serializable");
            }
        }
    }

    // Snapshot isolation still prevents lost updates: both read and write the same key.
    client.put("n", "0").await.unwrap();
    let mut first = client.begin_with(Isolation::Snapshot);
    let mut second = client.begin_with(Isolation::Snapshot);
    first.get("n").await.unwrap();
    second.get("n").await.unwrap();
    first.put("n", "1").unwrap();
    second.put("n", "1").unwrap();
    first.commit().await.unwrap();
    assert!(matches!(
        second.commit().await,
        Err(Error::TxnConflict { .. })
    ));
}

/// Oracle mode (test-only, for `bench/geo`): each transaction attempt fetches its read
/// timestamp from the metadata shard's leader before its first read, following a NOT_LEADER
/// hint from the seed, and caches the oracle; without it nothing asks for a timestamp and the
/// first read lets its node pick one.
#[tokio::test]
async fn oracle_mode_takes_each_attempts_read_timestamp_from_the_metadata_leader() {
    let fake = Fake::start(&["m"]).await;
    fake.set_leader(0, 2);
    let mut config = meridian_client::ClientConfig::new(vec![fake.address(1)]);
    config.timestamp_oracle = true;
    config.jitter_seed = Some(7);
    let client = Client::connect(config).await.unwrap();
    let plain = fake
        .client(vec![fake.address(1)], Duration::from_secs(5))
        .await;
    let bump = |client: Client| async move {
        client
            .txn(TxnOptions::default(), |txn| {
                Box::pin(async move {
                    let n: u64 = txn.get_str("a").await?.parse().unwrap_or(0);
                    txn.put("a", (n + 1).to_string())?;
                    Ok::<_, Error>(())
                })
            })
            .await
            .unwrap();
    };

    // The control: a transaction without the oracle.
    fake.served();
    fake.world.snapshot_reads.lock().unwrap().clear();
    bump(plain.clone()).await;
    assert!(asked_for_timestamps(&fake).is_empty());
    assert_eq!(
        fake.world.snapshot_reads.lock().unwrap()[0],
        0,
        "the node picks"
    );

    fake.world.snapshot_reads.lock().unwrap().clear();
    bump(client.clone()).await;
    assert_eq!(
        asked_for_timestamps(&fake),
        vec![1, 2],
        "the seed points at the metadata leader"
    );
    let reads = fake.world.snapshot_reads.lock().unwrap().clone();
    assert!(reads[0] != 0, "the first read sends the oracle's timestamp");

    bump(client.clone()).await;
    assert_eq!(
        asked_for_timestamps(&fake),
        vec![2],
        "the oracle's address is cached"
    );
    assert_eq!(client.get("a").await.unwrap(), Some(b("3")));
}

/// The nodes asked for a timestamp since the last look, in order.
fn asked_for_timestamps(fake: &Fake) -> Vec<u64> {
    fake.served()
        .iter()
        .filter(|(_, what)| *what == "timestamp")
        .map(|(node, _)| *node)
        .collect()
}
