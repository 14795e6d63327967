//! The proposer's pure parts: what one entry takes from the queue, which commands coalesce,
//! and how an entry's result is split among its members. (The queue against a live cluster:
//! meridian-cli's `coalesced_writes` test; apply of a batch: `tests/batch_apply.rs`.)

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
fn only_fenced_single_shard_writes_coalesce() {
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
