//! The `Kv.Commit` request: validation, the shard it belongs to, and its replicated form.
//!
//! A commit names one shard: every key it read, every range it scanned and every key it writes
//! must lie in that shard (the client splits ranges at shard boundaries). Today's client sends
//! a commit only for transactions that write; a read-only commit (no writes) is still served:
//! its reads are checked against the shard's latest versions at a linearizable point. A request spanning shards is `WRONG_SHARD` — a stale client map, or a
//! multi-shard read-write transaction, which is not implemented yet. Every limit is checked
//! before anything is read or proposed (`INVALID_ARGUMENT` naming the limit).

use crate::error::{invalid, Result, ServerError};
use crate::kv::request_id;
use crate::kv_check::{check_key, check_value};
use crate::shard_map::ShardMap;
use bytes::Bytes;
use meridian_proto::kv::{txn_write, CommitRequest, TxnRead};
use meridian_raft::types::check_txn_reads;
use meridian_raft::{Command, RangeCheck, ReadCheck, RequestId};
use meridian_types::limits::{MAX_BATCH_BYTES, MAX_BATCH_KEYS};
use meridian_types::ShardId;
use std::collections::BTreeSet;

/// A validated commit request.
#[derive(Debug)]
pub struct TxnCommit {
    pub shard: ShardId,
    pub reads: Vec<ReadCheck>,
    pub ranges: Vec<RangeCheck>,
    pub writes: Vec<(Bytes, Option<Bytes>)>,
    pub request: Option<RequestId>,
}

impl TxnCommit {
    /// Validates `req` and finds its shard in `map`.
    pub fn parse(req: CommitRequest, map: &ShardMap) -> Result<TxnCommit> {
        let reads: Vec<ReadCheck> = req.reads.into_iter().map(read_check).collect();
        let ranges: Vec<RangeCheck> = req
            .ranges
            .into_iter()
            .map(|r| RangeCheck {
                start: r.start,
                end: (!r.end.is_empty()).then_some(r.end),
                rows: r
                    .rows
                    .into_iter()
                    .map(|row| (row.key, row.version_ts))
                    .collect(),
            })
            .collect();
        check_txn_reads(&reads, &ranges).map_err(invalid)?;
        let writes = writes(req.writes)?;
        if reads.is_empty() && ranges.is_empty() && writes.is_empty() {
            return Err(invalid("commit has no reads and no writes"));
        }

        let mut shard = None;
        let mut owner = |key: &[u8]| -> Result<()> {
            let id = map.lookup(key).id;
            match shard {
                Some(prev) if prev != id => Err(ServerError::WrongShard(format!(
                    "the commit spans shards {prev} and {id}; a commit must target one shard \
                     (multi-shard read-write transactions are not implemented yet)"
                ))),
                _ => {
                    shard = Some(id);
                    Ok(())
                }
            }
        };
        for key in reads
            .iter()
            .map(|r| &r.key)
            .chain(writes.iter().map(|w| &w.0))
        {
            owner(key)?;
        }
        for range in &ranges {
            owner(&range.start)?;
        }
        let shard = shard.expect("a non-empty commit has a key");
        for range in &ranges {
            let shard_end = &map.lookup(&range.start).end;
            let fits = shard_end.is_empty()
                || range
                    .end
                    .as_ref()
                    .is_some_and(|end| end.as_ref() <= shard_end.as_slice());
            if !fits {
                return Err(ServerError::WrongShard(format!(
                    "a scanned range runs past the end of shard {shard}"
                )));
            }
        }
        Ok(TxnCommit {
            shard,
            reads,
            ranges,
            writes,
            request: request_id(req.write_id),
        })
    }

    /// The replicated command of a commit with writes, proposed at `ts`.
    pub fn into_command(self, ts: u64) -> Command {
        Command::Txn {
            ts,
            reads: self.reads,
            ranges: self.ranges,
            writes: self.writes,
            request: self.request,
        }
    }
}

fn read_check(read: TxnRead) -> ReadCheck {
    ReadCheck {
        key: read.key,
        version: read.found.then_some(read.version_ts),
    }
}

fn writes(writes: Vec<meridian_proto::kv::TxnWrite>) -> Result<Vec<(Bytes, Option<Bytes>)>> {
    if writes.len() > MAX_BATCH_KEYS {
        return Err(invalid(format!(
            "{} writes, over MAX_BATCH_KEYS ({MAX_BATCH_KEYS})",
            writes.len()
        )));
    }
    let mut seen = BTreeSet::new();
    let mut bytes = 0usize;
    let mut out = Vec::with_capacity(writes.len());
    for (i, write) in writes.into_iter().enumerate() {
        check_key(&write.key, &format!("writes[{i}].key"))?;
        if !seen.insert(write.key.clone()) {
            return Err(invalid(format!("writes[{i}]: the key is written twice")));
        }
        let value = match write.action {
            Some(txn_write::Action::PutValue(v)) => {
                check_value(&v)?;
                Some(v)
            }
            Some(txn_write::Action::Delete(true)) => None,
            Some(txn_write::Action::Delete(false)) | None => {
                return Err(invalid(format!(
                    "writes[{i}] needs an action: put_value or delete"
                )))
            }
        };
        bytes += write.key.len() + value.as_ref().map_or(0, |v| v.len());
        out.push((write.key, value));
    }
    if bytes > MAX_BATCH_BYTES {
        return Err(invalid(format!(
            "writes are {bytes} bytes, over MAX_BATCH_BYTES ({MAX_BATCH_BYTES})"
        )));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Member;
    use meridian_proto::kv::{TxnRange, TxnWrite};

    /// Two shards: [.., "m") and ["m", ..).
    fn map() -> ShardMap {
        let member = Member {
            node_id: 1,
            peer_addr: "127.0.0.1:7001".parse().unwrap(),
            region: "r".into(),
            zone: "z".into(),
        };
        ShardMap::founding(&[member], 1, &[b"m".to_vec()], 0)
    }

    fn b(s: &str) -> Bytes {
        Bytes::copy_from_slice(s.as_bytes())
    }

    fn read(key: &str) -> TxnRead {
        TxnRead {
            key: b(key),
            found: true,
            version_ts: 5,
        }
    }

    fn put(key: &str) -> TxnWrite {
        TxnWrite {
            key: b(key),
            action: Some(txn_write::Action::PutValue(b("v"))),
        }
    }

    fn range(start: &str, end: &str) -> TxnRange {
        TxnRange {
            start: b(start),
            end: b(end),
            rows: vec![],
        }
    }

    fn parse(
        reads: Vec<TxnRead>,
        ranges: Vec<TxnRange>,
        writes: Vec<TxnWrite>,
    ) -> Result<TxnCommit> {
        TxnCommit::parse(
            CommitRequest {
                reads,
                ranges,
                writes,
                write_id: None,
            },
            &map(),
        )
    }

    #[test]
    fn a_commit_on_one_shard_parses() {
        let ok = parse(vec![read("a")], vec![range("b", "c")], vec![put("d")]).unwrap();
        assert_eq!(ok.reads[0].version, Some(5));
        assert_eq!(ok.ranges[0].end, Some(b("c")));
        let second = parse(vec![read("x")], vec![range("n", "")], vec![]).unwrap();
        assert_ne!(ok.shard, second.shard);
        assert_eq!(second.ranges[0].end, None, "empty end: to the shard's end");
    }

    #[test]
    fn a_commit_spanning_shards_is_wrong_shard() {
        for bad in [
            parse(vec![read("a")], vec![], vec![put("x")]),
            parse(vec![], vec![range("a", "c")], vec![put("x")]),
            parse(vec![], vec![range("a", "n")], vec![]),
            parse(vec![], vec![range("a", "")], vec![]),
        ] {
            let e = bad.unwrap_err();
            assert!(matches!(e, ServerError::WrongShard(_)), "{e}");
        }
    }

    #[test]
    fn bad_commits_are_invalid_arguments() {
        let no_action = TxnWrite {
            key: b("a"),
            action: None,
        };
        let empty_range = range("c", "c");
        for (bad, want) in [
            (parse(vec![], vec![], vec![]), "no reads and no writes"),
            (
                parse(vec![], vec![], vec![put("a"), put("a")]),
                "written twice",
            ),
            (parse(vec![], vec![], vec![no_action]), "needs an action"),
            (
                parse(vec![], vec![empty_range], vec![]),
                "empty or inverted",
            ),
            (
                parse(vec![read("")], vec![], vec![]),
                "outside 1..=MAX_KEY_BYTES",
            ),
        ] {
            let e = bad.unwrap_err();
            assert!(
                matches!(e, ServerError::InvalidArgument(_)) && e.to_string().contains(want),
                "{e} (want {want})"
            );
        }
    }
}
