//! The commit of a transaction that writes: its read set and writes grouped by shard into one
//! `Kv.Commit` (one shard) or the prepares of a parallel commit (several, see `txn_2pc`), and
//! the reply's reading.

use crate::client::kv_client;
use crate::client::request;
use crate::error::{Error, Result};
use crate::routing::{Routed, ShardMap};
use crate::txn::Isolation;
use bytes::Bytes;
use meridian_proto::kv::{self as proto, txn_write};
use meridian_types::limits::MAX_TXN_RANGES;
use meridian_types::Timestamp;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

/// A range a transaction scanned: every live key of `[start, end)` (`end = None`: +inf) and
/// its version.
#[derive(Clone, Debug)]
pub(crate) struct ScannedRange {
    pub start: Bytes,
    pub end: Option<Bytes>,
    pub rows: Vec<(Bytes, u64)>,
}

/// What a transaction hands to its commit.
pub(crate) struct CommitParts<'a> {
    pub reads: &'a BTreeMap<Bytes, Option<(Bytes, u64)>>,
    pub ranges: &'a [ScannedRange],
    /// Keys read with `Txn::get_for_update`: checked under either isolation.
    pub for_update: &'a BTreeSet<Bytes>,
    pub writes: &'a BTreeMap<Bytes, Option<Bytes>>,
    pub isolation: Isolation,
    pub write_id: proto::WriteId,
}

/// How a transaction with writes commits.
pub(crate) enum Plan {
    /// Everything in one shard: one `Kv.Commit` (one Raft entry).
    One(u64, Box<proto::CommitRequest>),
    /// Parallel commit (see `txn_2pc`): each participant's reads, ranges and writes, and the
    /// anchor key (the first key written).
    Many {
        groups: BTreeMap<u64, proto::CommitRequest>,
        anchor: Bytes,
    },
}

/// Groups the read set and the writes by shard. Under [`Isolation::Snapshot`] only the reads
/// of written keys and of keys read for update are checked (first committer wins on each: the
/// caller has read each one), and no range.
pub(crate) fn plan(map: &ShardMap, parts: CommitParts<'_>) -> Result<Plan> {
    let mut groups = match parts.isolation {
        Isolation::Serializable => group(map, parts.reads, parts.ranges)?,
        Isolation::Snapshot => {
            let written: BTreeMap<Bytes, Option<(Bytes, u64)>> = parts
                .reads
                .iter()
                .filter(|(key, _)| {
                    parts.writes.contains_key(*key) || parts.for_update.contains(*key)
                })
                .map(|(key, read)| (key.clone(), read.clone()))
                .collect();
            group(map, &written, &[])?
        }
    };
    for (key, value) in parts.writes {
        let shard = map
            .shard_for_key(key)
            .ok_or_else(|| Error::WrongShard {
                message: format!("no shard in the cached map owns key {key:?}"),
            })?
            .shard_id;
        groups
            .entry(shard)
            .or_default()
            .writes
            .push(proto::TxnWrite {
                key: key.clone(),
                action: Some(match value {
                    Some(v) => txn_write::Action::PutValue(v.clone()),
                    None => txn_write::Action::Delete(true),
                }),
            });
    }
    let anchor = parts
        .writes
        .keys()
        .next()
        .cloned()
        .ok_or_else(|| Error::internal("a commit plan without writes"))?;
    if groups.len() == 1 {
        let (shard, mut message) = groups.pop_first().expect("one group");
        message.write_id = Some(parts.write_id);
        return Ok(Plan::One(shard, Box::new(message)));
    }
    Ok(Plan::Many { groups, anchor })
}

/// One `Kv.Commit` attempt.
/// `message` routed for one send, marked `first_send` on the first only (`first` turns
/// false): only a first send may be refused for a wounded early-lock owner, since no earlier
/// send of its write id can still apply (see `CommitRequest.first_send`).
pub(crate) fn first_send(
    message: &proto::CommitRequest,
    route: Option<proto::Route>,
    first: &mut bool,
) -> proto::CommitRequest {
    let mut message = message.routed(route);
    message.first_send = std::mem::take(first);
    message
}

pub(crate) async fn send_commit(
    channel: tonic::transport::Channel,
    timeout: Duration,
    message: proto::CommitRequest,
) -> std::result::Result<proto::CommitResponse, tonic::Status> {
    kv_client(channel)
        .commit(request(message, timeout))
        .await
        .map(|r| r.into_inner())
}

/// The commit timestamp of a committed answer, or the conflict.
pub(crate) fn outcome(response: proto::CommitResponse) -> Result<Timestamp> {
    if response.committed {
        Ok(Timestamp(response.commit_ts))
    } else {
        Err(Error::TxnConflict {
            key: response.conflict_key,
        })
    }
}

fn read_message(key: &Bytes, read: Option<u64>) -> proto::TxnRead {
    proto::TxnRead {
        key: key.clone(),
        found: read.is_some(),
        version_ts: read.unwrap_or(0),
    }
}

/// The read set split by shard: point reads by owner, ranges cut at shard boundaries.
fn group(
    map: &ShardMap,
    reads: &BTreeMap<Bytes, Option<(Bytes, u64)>>,
    ranges: &[ScannedRange],
) -> Result<BTreeMap<u64, proto::CommitRequest>> {
    let mut groups: BTreeMap<u64, proto::CommitRequest> = BTreeMap::new();
    let unowned = |key: &[u8]| Error::WrongShard {
        message: format!("no shard in the cached map owns key {key:?}"),
    };
    for (key, read) in reads {
        let shard = map.shard_for_key(key).ok_or_else(|| unowned(key))?;
        groups
            .entry(shard.shard_id)
            .or_default()
            .reads
            .push(read_message(key, read.as_ref().map(|(_, ts)| *ts)));
    }
    for range in ranges {
        for piece in split_range(map, range)? {
            let group = groups.entry(piece.0).or_default();
            group.ranges.push(piece.1);
            if group.ranges.len() > MAX_TXN_RANGES {
                return Err(Error::invalid(format!(
                    "the transaction scanned more than MAX_TXN_RANGES ({MAX_TXN_RANGES}) ranges of shard {}",
                    piece.0
                )));
            }
        }
    }
    Ok(groups)
}

/// Cuts a scanned range at the shard boundaries of `map`: one piece per shard it overlaps,
/// each with its rows.
fn split_range(map: &ShardMap, range: &ScannedRange) -> Result<Vec<(u64, proto::TxnRange)>> {
    let mut pieces = Vec::new();
    let mut cursor = range.start.clone();
    loop {
        let shard = map
            .shard_for_key(&cursor)
            .ok_or_else(|| Error::WrongShard {
                message: format!("no shard in the cached map owns key {cursor:?}"),
            })?;
        let shard_end = (!shard.end.is_empty()).then(|| shard.end.clone());
        let (piece_end, last) = match (&range.end, &shard_end) {
            (None, None) => (None, true),
            (Some(end), None) => (Some(end.clone()), true),
            (None, Some(se)) => (Some(se.clone()), false),
            (Some(end), Some(se)) if end <= se => (Some(end.clone()), true),
            (Some(_), Some(se)) => (Some(se.clone()), false),
        };
        let rows = range
            .rows
            .iter()
            .filter(|(k, _)| *k >= cursor && piece_end.as_ref().is_none_or(|e| k < e))
            .map(|(k, ts)| read_message(k, Some(*ts)))
            .collect();
        pieces.push((
            shard.shard_id,
            proto::TxnRange {
                start: cursor.clone(),
                end: piece_end.clone().unwrap_or_default(),
                rows,
            },
        ));
        if last {
            return Ok(pieces);
        }
        cursor = piece_end.expect("a piece that is not the last ends at its shard's end");
    }
}
