//! Apply refuses a command that touches a key outside its shard's span.
//!
//! MVCC data is keyed by user key alone (see `meridian_storage::keys`): every data shard on a
//! node writes into the one user keyspace, and only the shard's span (the range of user keys
//! it owns) keeps one shard's versions apart from its neighbours'. The `Kv` service routes
//! every key to the shard owning it, but apply must not trust that: a command from a peer, a
//! stale route after a future split, or a routing bug would otherwise write into, or read a
//! conflict check from, another shard's keys on this node, and the replicas of the two shards
//! would silently disagree. So apply checks every key and range a command names against the
//! shard's span and turns a command that strays into a deterministic rejection (nothing
//! written; every replica rejects the same entry).
//!
//! What is checked: the keys a write, compare-and-swap, commit or prepare reads or writes,
//! and the ranges it scanned (a range must lie inside the span; an open end only in the last
//! span). Not checked: a prepare's anchor key (the transaction record may live on another
//! shard) and a GC resume key (GC clamps its page to the span itself).

use crate::types::{Command, RangeCheck, ReadCheck};
use bytes::Bytes;
use meridian_storage::keys::Span;

/// Why `cmd` touches something outside `span`, or `None` if it stays inside.
pub fn outside_span(cmd: &Command, span: &Span) -> Option<String> {
    let key_outside = |key: &Bytes| {
        (!span.contains(key)).then(|| {
            format!(
                "key {:?} is outside the shard's span [{:?}, {:?})",
                String::from_utf8_lossy(key),
                String::from_utf8_lossy(&span.start),
                String::from_utf8_lossy(&span.end)
            )
        })
    };
    let reads_outside = |reads: &[ReadCheck], ranges: &[RangeCheck]| {
        reads
            .iter()
            .find_map(|r| key_outside(&r.key))
            .or_else(|| ranges.iter().find_map(|r| range_outside(r, span)))
    };
    match cmd {
        Command::Fenced { cmd, .. } | Command::Closed { cmd, .. } => outside_span(cmd, span),
        Command::Write { puts, deletes, .. } => puts
            .iter()
            .map(|(k, _)| k)
            .chain(deletes)
            .find_map(key_outside),
        Command::Cas { key, .. } => key_outside(key),
        Command::Txn {
            reads,
            ranges,
            writes,
            ..
        }
        | Command::Prepare {
            reads,
            ranges,
            writes,
            ..
        } => {
            reads_outside(reads, ranges).or_else(|| writes.iter().find_map(|(k, _)| key_outside(k)))
        }
        // A batch's members are checked one by one as each is applied.
        Command::Resolve { .. }
        | Command::Gc { .. }
        | Command::GcRecords { .. }
        | Command::Batch { .. } => None,
    }
}

fn range_outside(range: &RangeCheck, span: &Span) -> Option<String> {
    let starts_inside = span.contains(&range.start);
    let ends_inside = match &range.end {
        None => span.end.is_empty(),
        Some(end) => span.end.is_empty() || end.as_ref() <= span.end.as_slice(),
    };
    (!(starts_inside && ends_inside)).then(|| {
        format!(
            "scanned range [{:?}, {:?}) is not inside the shard's span [{:?}, {:?})",
            String::from_utf8_lossy(&range.start),
            range
                .end
                .as_ref()
                .map(|e| String::from_utf8_lossy(e).into_owned()),
            String::from_utf8_lossy(&span.start),
            String::from_utf8_lossy(&span.end)
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use meridian_storage::keys::Keyspace;

    fn span(start: &str, end: &str) -> Span {
        Span {
            space: Keyspace::User,
            start: start.into(),
            end: end.into(),
        }
    }

    fn write(keys: &[&'static str]) -> Command {
        Command::Write {
            ts: 1,
            puts: keys
                .iter()
                .map(|k| (Bytes::from_static(k.as_bytes()), Bytes::from_static(b"v")))
                .collect(),
            deletes: Vec::new(),
            request: None,
        }
    }

    fn txn(start: &'static str, end: Option<&'static str>) -> Command {
        Command::Txn {
            ts: 1,
            reads: Vec::new(),
            ranges: vec![RangeCheck {
                start: Bytes::from_static(start.as_bytes()),
                end: end.map(|e| Bytes::from_static(e.as_bytes())),
                rows: Vec::new(),
            }],
            writes: vec![(Bytes::from_static(b"m1"), None)],
            request: None,
        }
    }

    #[test]
    fn keys_inside_pass_and_one_outside_is_named() {
        let s = span("m", "n");
        assert_eq!(outside_span(&write(&["m", "m\u{7f}"]), &s), None);
        let why = outside_span(&write(&["m", "n"]), &s).expect("n is the next shard's");
        assert!(why.contains("\"n\""), "{why}");
        assert!(outside_span(&write(&["a"]), &s).is_some());
        let fenced = Command::Fenced {
            term: 1,
            cmd: Box::new(write(&["z"])),
        };
        assert!(outside_span(&fenced, &s).is_some());
        assert_eq!(outside_span(&write(&["z"]), &span("m", "")), None);
    }

    #[test]
    fn a_range_must_lie_inside_and_end_open_only_in_the_last_span() {
        assert_eq!(outside_span(&txn("m", Some("n")), &span("m", "n")), None);
        assert!(outside_span(&txn("m", Some("o")), &span("m", "n")).is_some());
        assert!(outside_span(&txn("l", Some("n")), &span("m", "n")).is_some());
        assert!(outside_span(&txn("m", None), &span("m", "n")).is_some());
        assert_eq!(outside_span(&txn("m", None), &span("m", "")), None);
    }
}
