//! The `Kv.Commit` and `Kv.Resolve` requests: validation, the shard they belong to, their
//! replicated form.
//!
//! A commit names one shard: every key it read, every range it scanned and every key it writes
//! must lie in that shard (the client splits ranges at shard boundaries); a request spanning
//! shards is `WRONG_SHARD` (a stale client map). Plain, it is a one-shard transaction's commit
//! (one Raft entry, see `meridian_raft::apply`); with `prepare`, phase one of a multi-shard
//! transaction on this shard ([`Command::Prepare`]; the node decides whether the shard owns the
//! anchor key, never the client). A read-only commit (no writes) is still served: its reads are
//! checked at a linearizable point (today's client never sends one). Every limit is checked
//! before anything is read or proposed (`INVALID_ARGUMENT` naming the limit).
//!
//! A resolve ([`Command::Resolve`]) decides (or finishes) a transaction on its anchor, or
//! resolves its locks on another participant or prevents it there (see
//! `meridian_raft::locks`). Prepares and resolves carry the transaction's start timestamp,
//! which GC compares with the shard's threshold (a missing record below it is `FORGOTTEN`). A commit
//! timestamp came from a node's clock through the client: the leader waits until its own clock
//! has passed it (at most `max_offset`, `CLOCK_OFFSET` beyond) before proposing, so the
//! timestamp is never ahead of the clock of the node that applies it as leader.
//!
//! **Commit-wait** (`CommitRequest.commit_wait`): a committed or prepared answer is held until
//! this node's *physical* clock is more than `max_offset` past the commit timestamp
//! ([`KvService::commit_wait_on`]; a failed wait is `AMBIGUOUS`, the commit having applied).
//! `Kv.CommitWait` is the same wait on a timestamp the client names (a read-only
//! transaction's read timestamp, a commit settled by a recovery).
//! Every clock within `max_offset` of this one has then passed it, so a transaction that
//! begins after the answer draws a larger timestamp from whichever node it asks. A prepare
//! waits on its own timestamp; the largest of them is the commit timestamp, so the
//! participant that set it waited on it. The wait is at most `2 x max_offset` (a commit
//! timestamp is at most `max_offset` ahead of a correct clock) and holds no lock of the
//! node's: the transaction's own locks stay, as they would until its resolution.

use crate::admission::Admitted;
use crate::error::{invalid, Result, ServerError};
use crate::kv::{request_id, KvService};
use crate::kv_check::{check_key, check_route, check_value};
use crate::kv_early_lock::CommitStart;
use crate::shard_map::{ShardDescriptor, ShardMap};
use bytes::Bytes;
use meridian_proto::kv::{
    resolve_request, txn_write, CommitRequest, CommitResponse, ReadConsistency, ResolveRequest,
    ResolveResponse, TxnRead, TxnState,
};
use meridian_raft::locks::{Decision, TxnStatus};
use meridian_raft::types::check_txn_reads;
use meridian_raft::{Command, RangeCheck, ReadCheck, RequestId};
use meridian_types::limits::{MAX_BATCH_BYTES, MAX_BATCH_KEYS, MAX_TXN_PARTICIPANTS};
use meridian_types::Timestamp;
use meridian_types::{ShardId, TxnRank};
use std::collections::BTreeSet;

/// A validated commit request.
#[derive(Debug)]
pub struct TxnCommit {
    pub shard: ShardId,
    pub reads: Vec<ReadCheck>,
    pub ranges: Vec<RangeCheck>,
    pub writes: Vec<(Bytes, Option<Bytes>)>,
    pub request: Option<RequestId>,
    /// Phase one of a multi-shard transaction: its id, start timestamp and rank, anchor key,
    /// and whether this shard owns the anchor.
    pub prepare: Option<((RequestId, u64, TxnRank), Bytes, bool)>,
    /// The anchor's prepare only: a key of every other participant shard.
    pub participants: Vec<Bytes>,
    /// Answer a committed (or prepared) request only after a commit-wait (see
    /// `CommitRequest.commit_wait`).
    pub commit_wait: bool,
    /// The owner of early locks this commit releases once applied (`CommitRequest.lock_owner`,
    /// see `kv_early_lock`).
    pub lock_owner: Option<RequestId>,
    /// `CommitRequest.first_send`: only such a commit may be refused for a wound.
    pub first_send: bool,
}

impl TxnCommit {
    /// Validates `req` and finds its shard in `map`.
    pub fn parse(req: CommitRequest, map: &ShardMap) -> Result<TxnCommit> {
        let (route, commit_wait) = (req.route, req.commit_wait);
        let prepare = match req.prepare {
            None => None,
            Some(p) => {
                let txn = request_id(p.txn)
                    .ok_or_else(|| invalid("prepare.txn needs a non-zero client_id"))?;
                check_key(&p.anchor, "prepare.anchor")?;
                let on_anchor = map.lookup(&p.anchor).id;
                if p.participants.len() > MAX_TXN_PARTICIPANTS {
                    return Err(invalid(format!(
                        "prepare.participants has {} keys, more than MAX_TXN_PARTICIPANTS \
                         ({MAX_TXN_PARTICIPANTS})",
                        p.participants.len()
                    )));
                }
                let mut shards = BTreeSet::new();
                for key in &p.participants {
                    check_key(key, "prepare.participants")?;
                    let shard = map.lookup(key).id;
                    if shard == on_anchor || !shards.insert(shard) {
                        return Err(invalid(
                            "prepare.participants must name each other participant shard once, \
                             never the anchor's",
                        ));
                    }
                }
                if p.txn_ts == 0 || p.txn_ts > meridian_raft::types::MAX_COMMAND_TS {
                    return Err(invalid(
                        "prepare.txn_ts (the transaction's start timestamp) must be set and \
                         at most MAX_COMMAND_TS",
                    ));
                }
                if p.age_ts == 0 || p.age_ts > meridian_raft::types::MAX_COMMAND_TS {
                    return Err(invalid(
                        "prepare.age_ts (the timestamp of the transaction's first attempt) must \
                         be set and at most MAX_COMMAND_TS",
                    ));
                }
                let rank = TxnRank {
                    priority: p.priority,
                    age_ts: p.age_ts,
                };
                Some(((txn, p.txn_ts, rank), p.anchor, on_anchor, p.participants))
            }
        };
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

        let mut owner_desc: Option<&ShardDescriptor> = None;
        let mut owner = |key: &[u8]| -> Result<()> {
            let desc = map.lookup(key);
            match owner_desc {
                Some(prev) if prev.id != desc.id => Err(ServerError::WrongShard(format!(
                    "the commit spans shards {} and {}; a commit (or a prepare) must \
                     target one shard",
                    prev.id, desc.id
                ))),
                _ => {
                    owner_desc = Some(desc);
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
        let desc = owner_desc.expect("a non-empty commit has a key");
        check_route(desc, route.as_ref())?;
        let shard = desc.id;
        for range in &ranges {
            // Every range starts in `desc` (checked above).
            let shard_end = &desc.end;
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
        let (prepare, participants) = match prepare {
            None => (None, Vec::new()),
            Some((txn, anchor, owner, participants)) => {
                let is_anchor = owner == shard;
                if is_anchor == participants.is_empty() {
                    // A staged record without its participants would be committed by a
                    // recovery as soon as the anchor alone is prepared.
                    return Err(invalid(
                        "prepare.participants must list the other participants in the prepare \
                         on the anchor's shard, and only there",
                    ));
                }
                (Some((txn, anchor, is_anchor)), participants)
            }
        };
        Ok(TxnCommit {
            shard,
            reads,
            ranges,
            writes,
            request: request_id(req.write_id),
            prepare,
            participants,
            commit_wait,
            lock_owner: request_id(req.lock_owner),
            first_send: req.first_send,
        })
    }

    /// The replicated command of a commit with writes (or of a prepare), proposed at `ts`.
    pub fn into_command(self, ts: u64) -> Command {
        match self.prepare {
            Some(((txn, txn_ts, rank), anchor, is_anchor)) => Command::Prepare {
                ts,
                txn,
                txn_ts,
                rank,
                anchor,
                is_anchor,
                reads: self.reads,
                ranges: self.ranges,
                writes: self.writes,
                participants: self.participants,
            },
            None => Command::Txn {
                ts,
                reads: self.reads,
                ranges: self.ranges,
                writes: self.writes,
                request: self.request,
            },
        }
    }
}

impl KvService {
    /// Serves a validated `Kv.Commit`.
    pub(crate) async fn commit_txn(
        &self,
        txn: TxnCommit,
        permit: Admitted,
    ) -> Result<CommitResponse> {
        let (shard, commit_wait) = (txn.shard, txn.commit_wait);
        let replica = self.node.replica(shard)?;
        // The owner's early locks stay put while its commit is in flight; a wounded owner's
        // commit is refused before it is proposed (see `kv_early_lock`).
        let early = txn.lock_owner.map(|owner| {
            self.node
                .early_locks
                .begin_commit(shard, owner, txn.first_send)
        });
        let early = match early {
            Some(CommitStart::Wounded) => {
                let key = txn.writes.first().map(|w| w.0.clone());
                let key = key.or_else(|| txn.reads.first().map(|r| r.key.clone()));
                return Ok(answer(shard, 0, Some(key.unwrap_or_default()), false));
            }
            Some(CommitStart::Tracked(guard)) => Some(guard),
            Some(CommitStart::Untracked) | None => None,
        };
        let response = if txn.writes.is_empty() && txn.prepare.is_none() {
            // Read-only: check the reads at a linearizable point, propose nothing.
            let read_ts = self
                .linearize(shard, &replica, ReadConsistency::Linearizable as i32)
                .await?;
            let (reads, ranges) = (txn.reads.clone(), txn.ranges.clone());
            let conflict = self
                .read_unlocked(
                    &replica,
                    read_ts,
                    move |locks| {
                        reads
                            .iter()
                            .find_map(|r| locks.write_intent(&r.key, None, u64::MAX))
                            .or_else(|| {
                                ranges.iter().find_map(|r| {
                                    locks.write_intent_in(
                                        &r.start,
                                        r.end.as_deref(),
                                        None,
                                        u64::MAX,
                                    )
                                })
                            })
                    },
                    move |engine, _| {
                        let view = meridian_raft::txn_check::EngineView { engine, shard };
                        meridian_raft::txn_check::first_conflict(&view, &txn.reads, &txn.ranges)
                            .map_err(meridian_storage::Error::Io)
                    },
                )
                .await?;
            answer(shard, read_ts.0, conflict, false)
        } else {
            let result = self
                .propose_for_result(shard, &replica, txn.into_command(0), permit)
                .await?;
            let aborted = result.status == Some(TxnStatus::Aborted);
            answer(shard, result.commit_ts, result.conflict, aborted)
        };
        // Applied: committed, or prepared (its own locks guard the keys from now on). Before
        // any commit-wait, so waiters read the write without waiting it out too.
        if let Some(early) = early {
            early.finish(response.committed);
        }
        if commit_wait && response.committed {
            let ts = Timestamp(response.commit_ts);
            // Applied already: a failed wait must not read as "nothing happened".
            self.commit_wait_on(ts).await.map_err(|e| {
                ServerError::Ambiguous(format!(
                    "committed at {ts}, but the commit-wait failed ({e}); asking again with the \
                     same write id answers the commit"
                ))
            })?;
        }
        Ok(response)
    }

    /// Serves a `Kv.Resolve`.
    pub(crate) async fn resolve_txn(
        &self,
        req: ResolveRequest,
        permit: Admitted,
    ) -> Result<ResolveResponse> {
        let txn = request_id(req.txn).ok_or_else(|| invalid("txn needs a non-zero client_id"))?;
        check_key(&req.key, "key")?;
        let decision =
            match req.decision {
                Some(resolve_request::Decision::CommitTs(c)) if c > 0 => Decision::Commit(c),
                Some(resolve_request::Decision::Abort(true)) => Decision::Abort,
                Some(resolve_request::Decision::AbortStaging(true)) if req.anchor => {
                    Decision::AbortStaging
                }
                Some(resolve_request::Decision::Prevent(true)) if !req.anchor => Decision::Prevent,
                Some(resolve_request::Decision::Finish(true)) if req.anchor => Decision::Finish,
                _ => return Err(invalid(
                    "decision must be a non-zero commit_ts, abort, abort_staging or finish (on \
                     the anchor) or prevent (elsewhere)",
                )),
            };
        if req.txn_ts == 0 || req.txn_ts > meridian_raft::types::MAX_COMMAND_TS {
            return Err(invalid(
                "txn_ts (the transaction's start timestamp) must be set and at most \
                 MAX_COMMAND_TS",
            ));
        }
        let (desc, replica) = self.node.route(&req.key)?;
        check_route(&desc, req.route.as_ref())?;
        if req.anchor {
            // `key` must be the anchor key: a record decided on another shard would let a
            // transaction commit on one shard and abort on another.
            let table = replica.sm.locks();
            let table = table.read().unwrap_or_else(|p| p.into_inner());
            if let Some(locks) = table.get(&txn) {
                if self.node.map().lookup(&locks.anchor).id != desc.id {
                    return Err(invalid(
                        "anchor is set but the key's shard is not the transaction's anchor shard",
                    ));
                }
            }
        }
        if let Decision::Commit(c) = decision {
            if c > meridian_raft::types::MAX_COMMAND_TS {
                return Err(invalid("commit_ts is above MAX_COMMAND_TS"));
            }
            self.wait_past(Timestamp(c), "commit timestamp").await?;
        }
        let cmd = Command::Resolve {
            ts: 0,
            txn,
            txn_ts: req.txn_ts,
            anchor: req.anchor,
            decision,
        };
        let result = self
            .propose_for_result(desc.id, &replica, cmd, permit)
            .await?;
        let state = match result.status {
            None => TxnState::Unknown,
            Some(TxnStatus::Staging) => TxnState::Staging,
            Some(TxnStatus::Committed(_)) => TxnState::Committed,
            Some(TxnStatus::Aborted) => TxnState::Aborted,
            Some(TxnStatus::Forgotten) => TxnState::Forgotten,
        };
        Ok(ResolveResponse {
            state: state as i32,
            commit_ts: result.commit_ts,
            shard_id: desc.id.0,
            participants: result.participants,
        })
    }
}

fn answer(shard: ShardId, ts: u64, conflict: Option<Bytes>, aborted: bool) -> CommitResponse {
    let committed = conflict.is_none() && !aborted;
    CommitResponse {
        committed,
        commit_ts: if committed { ts } else { 0 },
        conflict_key: conflict.unwrap_or_default(),
        shard_id: shard.0,
        aborted,
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
                prepare: None,
                ..Default::default()
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
