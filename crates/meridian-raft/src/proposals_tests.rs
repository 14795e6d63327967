//! The proposer: its pure parts (what one entry takes from the queue, which commands
//! coalesce, how an entry's result is split among its members), then the queue against a
//! one-voter shard in this process (coalescing, answers, keeps, a follower's refusal, a sender
//! that ends early). Against a real cluster: meridian-cli's `coalesced_writes` test; apply of
//! a batch: `tests/raft/batch_apply.rs`.

use super::*;
use bytes::Bytes;

fn write(key: &str, value_len: usize) -> Command {
    Command::Write {
        ts: 1,
        puts: vec![(
            Bytes::from(key.to_string()),
            Bytes::from(vec![0u8; value_len]),
        )],
        deletes: vec![],
        request: None,
    }
}

fn closed(cmd: Command) -> Command {
    Command::Closed {
        term: 1,
        closed_ts: 0,
        cmd: Box::new(cmd),
    }
}

fn waiting(bytes: usize) -> (Waiting, oneshot::Receiver<Proposed>) {
    let (reply, answer) = oneshot::channel();
    let w = Waiting {
        cmd: closed(write("k", 0)),
        bytes,
        reply,
        keep: Box::new(()),
    };
    (w, answer)
}

fn queue(sizes: &[usize]) -> VecDeque<Waiting> {
    sizes.iter().map(|&b| waiting(b).0).collect()
}

#[test]
fn a_batch_takes_the_longest_prefix_that_fits() {
    let mut q = queue(&[10; 5]);
    assert_eq!(take_batch(&mut q).len(), 5);
    assert!(q.is_empty());
    assert!(take_batch(&mut q).is_empty(), "nothing waits: no batch");

    let mut q = queue(&vec![1; MAX_PROPOSAL_BATCH + 3]);
    assert_eq!(take_batch(&mut q).len(), MAX_PROPOSAL_BATCH);
    assert_eq!(q.len(), 3, "the rest waits for the next entry");

    let half = MAX_COALESCED_BYTES / 2;
    let mut q = queue(&[half, half, 1, 5]);
    assert_eq!(
        take_batch(&mut q).len(),
        2,
        "two halves fill the byte budget"
    );
    assert_eq!(take_batch(&mut q).len(), 2);

    let mut q = queue(&[MAX_COALESCED_BYTES + 1, 1]);
    assert_eq!(
        take_batch(&mut q).len(),
        1,
        "an oversized proposal still goes, alone"
    );
    assert_eq!(take_batch(&mut q).len(), 1);
}

#[test]
fn only_fenced_data_commands_coalesce() {
    assert!(coalescable(&closed(write("key", 10))));
    let cas = Command::Cas {
        ts: 1,
        key: Bytes::from("ab"),
        expect: crate::types::Expect::Absent,
        value: Some(Bytes::from("xyz")),
        request: None,
    };
    assert!(coalescable(&closed(cas)));
    assert!(!coalescable(&write("key", 10)), "not fenced");
    let gc = Command::Gc {
        threshold: 1,
        from: None,
    };
    assert!(!coalescable(&gc));
    let batch = closed(Command::Batch {
        cmds: vec![closed(write("k", 1))],
    });
    assert!(!coalescable(&batch), "never a batch in a batch");
}

#[test]
fn a_members_size_is_its_encoded_size() {
    let small = closed(write("key", 10));
    let big = closed(write("key", 100_000));
    let (s, b) = (
        crate::types::codec::encoded_len(&small),
        crate::types::codec::encoded_len(&big),
    );
    assert_eq!(s, crate::types::codec::encode(&small).unwrap().len());
    assert_eq!(b - s, 100_000 - 10);
}

#[test]
fn an_entrys_result_is_split_among_its_members() {
    let one = CommandResult {
        commit_ts: 7,
        ..Default::default()
    };
    assert_eq!(split(one.clone(), 1), vec![Ok(one.clone())]);

    let members = vec![
        one.clone(),
        CommandResult {
            fenced: true,
            ..Default::default()
        },
    ];
    let batch = CommandResult {
        batch: members.clone(),
        ..Default::default()
    };
    assert_eq!(
        split(batch, 2),
        members.into_iter().map(Ok).collect::<Vec<_>>()
    );

    let refused = CommandResult {
        rejected: Some("an empty batch".into()),
        ..Default::default()
    };
    let answers = split(refused, 3);
    assert_eq!(answers.len(), 3);
    assert!(answers
        .iter()
        .all(|a| matches!(a, Ok(r) if r.rejected.is_some())));

    let short = CommandResult {
        batch: vec![one],
        ..Default::default()
    };
    assert!(split(short, 2)
        .iter()
        .all(|a| matches!(a, Err(ProposeError::Failed(_)))));
}

/// A one-voter shard on this process (no peers needed), led by node 1.
pub(crate) struct OneNode {
    _dir: tempfile::TempDir,
    _host: Arc<crate::host::MultiRaft>,
    pub(crate) replica: Arc<crate::host::ShardReplica>,
}

pub(crate) async fn one_node(initialize: bool) -> OneNode {
    use meridian_storage::{Engine, MemoryEngine};
    let dir = tempfile::tempdir().unwrap();
    let engine: Arc<dyn Engine> = Arc::new(MemoryEngine::new());
    let clock = Arc::new(meridian_types::Clock::new(
        std::time::Duration::from_millis(500),
    ));
    let config = openraft::Config {
        heartbeat_interval: 50,
        election_timeout_min: 150,
        election_timeout_max: 300,
        ..Default::default()
    };
    let host = crate::host::MultiRaft::new(
        1,
        engine,
        clock,
        config,
        std::time::Duration::from_secs(1),
        dir.path().to_path_buf(),
    )
    .unwrap();
    let replica = host
        .open_shard(
            meridian_types::ShardId(7),
            meridian_storage::keys::Span::user(),
        )
        .await
        .unwrap();
    if initialize {
        let members =
            std::collections::BTreeMap::from([(1u64, crate::types::Node::new("127.0.0.1:1"))]);
        replica.raft.initialize(members).await.unwrap();
        replica
            .raft
            .wait(Some(std::time::Duration::from_secs(10)))
            .current_leader(1, "node 1 leads")
            .await
            .unwrap();
    }
    OneNode {
        _dir: dir,
        _host: host,
        replica,
    }
}

/// A fenced put of `key` in `term`, as the `Kv` service proposes it.
fn put(term: u64, key: usize) -> Command {
    Command::Closed {
        term,
        closed_ts: 0,
        cmd: Box::new(Command::Write {
            ts: 1,
            puts: vec![(Bytes::from(format!("k{key}")), Bytes::from("v"))],
            deletes: vec![],
            request: None,
        }),
    }
}

fn term(replica: &crate::host::ShardReplica) -> u64 {
    use openraft::type_config::async_runtime::WatchReceiver;
    replica.raft.metrics().borrow_watched().current_term
}

/// With one entry in flight, proposals made together wait and go out in few entries; each
/// gets its own result, and each `keep` is dropped once answered.
#[tokio::test]
async fn proposals_made_together_share_entries_and_each_answers() {
    let node = one_node(true).await;
    let proposer = node.replica.proposer.clone();
    proposer.limit.store(1, Ordering::Relaxed);
    let term = term(&node.replica);
    let kept = Arc::new(());
    let answers: Vec<_> = (0..100)
        .map(|i| proposer.propose(put(term, i), Box::new(kept.clone())))
        .collect();
    let mut commits = std::collections::BTreeSet::new();
    for answer in answers {
        let result = answer.await.expect("answered").expect("proposed");
        assert!(!result.fenced && result.rejected.is_none(), "{result:?}");
        commits.insert(result.commit_ts);
    }
    assert_eq!(commits.len(), 100, "each write its own version");
    assert_eq!(Arc::strong_count(&kept), 1, "every keep dropped");
    let stats = &proposer.stats;
    let (proposals, entries) = (
        stats.proposals.load(Ordering::Relaxed),
        stats.entries.load(Ordering::Relaxed),
    );
    assert_eq!(proposals, 100);
    assert!(entries <= 3, "100 writes in {entries} entries");
    assert_eq!(proposer.lock().senders, 0, "the sender ended");
}

/// Coalescing off: every proposal is its own entry.
#[tokio::test]
async fn with_coalescing_off_every_proposal_is_an_entry() {
    let node = one_node(true).await;
    let proposer = node.replica.proposer.clone();
    proposer.limit.store(0, Ordering::Relaxed);
    let term = term(&node.replica);
    let answers: Vec<_> = (0..20)
        .map(|i| proposer.propose(put(term, i), Box::new(())))
        .collect();
    for answer in answers {
        answer.await.unwrap().unwrap();
    }
    assert_eq!(proposer.stats.entries.load(Ordering::Relaxed), 20);
}

/// A node that does not lead answers every member "not leader" (not proposed), and drops
/// every keep.
#[tokio::test]
async fn a_follower_answers_every_member_not_leader() {
    let node = one_node(false).await;
    let proposer = node.replica.proposer.clone();
    proposer.limit.store(1, Ordering::Relaxed);
    let kept = Arc::new(());
    let answers: Vec<_> = (0..10)
        .map(|i| proposer.propose(put(1, i), Box::new(kept.clone())))
        .collect();
    for answer in answers {
        assert!(matches!(
            answer.await.unwrap(),
            Err(ProposeError::NotLeader(_))
        ));
    }
    assert_eq!(Arc::strong_count(&kept), 1);
}

/// A sender that ends without draining (a panic, a cancelled task) gives its place back and
/// starts another for what waits: nothing waits forever.
#[tokio::test]
async fn a_sender_that_ends_early_is_replaced() {
    let node = one_node(true).await;
    let proposer = node.replica.proposer.clone();
    proposer.limit.store(1, Ordering::Relaxed);
    let term = term(&node.replica);
    // What a sender that died mid-flight leaves: its place counted, proposals waiting.
    let (reply, answer) = oneshot::channel();
    {
        let mut queue = proposer.lock();
        queue.senders = 1;
        queue.waiting.push_back(Waiting {
            cmd: put(term, 1),
            bytes: 10,
            reply,
            keep: Box::new(()),
        });
    }
    drop(SenderEnd {
        proposer: proposer.clone(),
        counted: true,
    });
    let result = tokio::time::timeout(std::time::Duration::from_secs(10), answer)
        .await
        .expect("answered, not left waiting")
        .unwrap()
        .unwrap();
    assert!(result.commit_ts > 0);
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    assert_eq!(proposer.lock().senders, 0);
}
