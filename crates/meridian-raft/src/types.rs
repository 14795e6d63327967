//! openraft type configuration and the commands a shard's Raft log carries.
//!
//! # Commands are checked twice
//! The `Kv` service validates a request before proposing it, but a log entry can also come
//! from a peer (a leader) this node does not control, and a committed entry is re-applied on
//! every restart. So apply re-checks every command with [`Command::validate`], a pure function
//! of the command alone: every replica reaches the same verdict, and a bad command is applied
//! as a deterministic rejection (it advances the applied index and writes nothing), never as a
//! panic that would repeat on every replay.

use bytes::Bytes;
use meridian_types::limits::{
    MAX_BATCH_BYTES, MAX_BATCH_KEYS, MAX_KEY_BYTES, MAX_TXN_PARTICIPANTS, MAX_TXN_RANGES,
    MAX_TXN_READ_KEYS, MAX_VALUE_BYTES,
};
use serde::{Deserialize, Serialize};
use std::io::Cursor;

/// Identifies one logical write across its retries: the client picks a random `client_id`
/// once per client instance and a fresh `seq` per write, and resends the same id on every
/// attempt. The shard remembers applied ids (see `state_machine`'s dedup table), so a retry of
/// a write that already committed is answered with the original result instead of being
/// applied a second time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct RequestId {
    pub client_id: u64,
    pub seq: u64,
}

/// The largest version timestamp a command may carry. Far above any HLC reading for centuries
/// (NTP64 seconds in the upper 32 bits), and far enough below `Timestamp::MAX` (the
/// latest-version slot's key) that `floor + 1` stepping can never reach it.
pub const MAX_COMMAND_TS: u64 = u64::MAX - (1 << 40);

/// One replicated command. The version timestamp is proposed by the leader's HLC; apply raises
/// it to the shard's version floor + 1 if needed so versions stay ordered across leader changes
/// (see `state_machine`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    /// An atomic write of puts and deletes within one shard, all at one timestamp.
    Write {
        ts: u64,
        puts: Vec<(Bytes, Bytes)>,
        deletes: Vec<Bytes>,
        /// Set by clients that deduplicate retries; `None` for writes that are never retried.
        request: Option<RequestId>,
    },
    /// Compare-and-swap on one key: `value` (`None` = delete) is written at `ts` only if the
    /// key's newest version matches `expect` at this command's place in the log. Apply reads
    /// the key (and the writes applied before it in the same batch), so the check and the
    /// write are one atomic step on every replica. Only a swap that happened is remembered in
    /// the dedup table: a mismatch writes nothing, so a retry is simply evaluated again.
    Cas {
        ts: u64,
        key: Bytes,
        expect: Expect,
        value: Option<Bytes>,
        request: Option<RequestId>,
    },
    /// The commit of a single-shard optimistic transaction: `writes` (`None` = delete) are
    /// applied at `ts` only if every read the transaction made still holds at this command's
    /// place in the log — each key in `reads` still has the version it was read at, and each
    /// range in `ranges` still holds exactly the rows it was read with (no phantoms). Checked
    /// like a CAS (see `apply` and `txn_check`); a conflict writes nothing and, like a CAS
    /// mismatch, is not remembered by the dedup table.
    Txn {
        ts: u64,
        reads: Vec<ReadCheck>,
        ranges: Vec<RangeCheck>,
        writes: Vec<(Bytes, Option<Bytes>)>,
        request: Option<RequestId>,
    },
    /// `cmd`, applied only if its entry was appended by the leader of `term`: the term in
    /// which its timestamp was issued. A leader issues data-shard timestamps above a low-water
    /// mark it sets when its term begins (see `issued`); a command whose timestamp was taken
    /// before this node became leader but that reached the log after would escape that mark,
    /// so apply rejects it (deterministically: the entry's term is part of the log) and the
    /// writer gets a definite "not applied". Never nested.
    Fenced { term: u64, cmd: Box<Command> },
    /// Phase one of a multi-shard transaction on one participant (see `locks`): if every read
    /// still holds and no other transaction's lock is in the way, lock the reads, ranges and
    /// writes at a prepare timestamp (`ts`, raised above the shard's floor) and, if
    /// `is_anchor`, write the transaction's record as staging with `participants` (a key of
    /// every other participant shard; empty unless `is_anchor`). Replayed for the same `txn`,
    /// it answers the first prepare's timestamp; a transaction aborted here first (a record or
    /// a recovery's marker) answers `Aborted` and locks nothing.
    Prepare {
        ts: u64,
        txn: RequestId,
        /// The transaction's start timestamp (see `locks::TxnLocks::txn_ts`); a prepare below
        /// the shard's GC threshold is refused (its record may have been collected).
        txn_ts: u64,
        /// The transaction's rank in lock conflicts, kept in its locks so that a prepare that
        /// meets them can tell who gives way (see `meridian_types::txn_rank`).
        rank: meridian_types::TxnRank,
        anchor: Bytes,
        is_anchor: bool,
        reads: Vec<ReadCheck>,
        ranges: Vec<RangeCheck>,
        writes: Vec<(Bytes, Option<Bytes>)>,
        participants: Vec<Bytes>,
    },
    /// Phase two on one participant: on the anchor (`anchor`), decide the record and resolve
    /// the anchor's own locks; elsewhere, resolve the locks as `decision` says. `ts` is only
    /// the proposal's issued timestamp (a commit writes at the decision's timestamp).
    Resolve {
        ts: u64,
        txn: RequestId,
        /// The transaction's start timestamp, as its locks or record say: what a record or
        /// marker written now keeps, and below the GC threshold, what lets a missing record
        /// answer `Forgotten` instead of writing one.
        txn_ts: u64,
        anchor: bool,
        decision: crate::locks::Decision,
    },
    /// One page of MVCC garbage collection (see `meridian_storage::gc`): raise the shard's GC
    /// threshold to `threshold` (never lower it), then delete, from `from` (a resume point
    /// `(user key, version ts)` a previous page returned; `None`: the shard's start), at most
    /// a page of the versions that no read at or above the threshold can see. From the moment
    /// it applies, the shard's readers refuse timestamps below the threshold. Apply runs it
    /// at the start of a RocksDB batch of its own (see `state_machine`), so it sees every
    /// earlier entry and every replica deletes the same versions. Never fenced: it issues no
    /// version timestamp.
    Gc {
        threshold: u64,
        from: Option<(Bytes, u64)>,
    },
    /// [`Command::Fenced`] plus the leader's closed timestamp when it proposed `cmd` (see
    /// `closed_ts`): applied only if its entry was appended by the leader of `term`; then,
    /// whatever `cmd` did (written, mismatched, locked), the replica's closed timestamp rises
    /// to `closed_ts` together with this entry's index. Appended last so that bincode's
    /// variant indices of the older commands (and so old logs) stay as they were. Never
    /// nested, never around a GC page.
    Closed {
        term: u64,
        closed_ts: u64,
        cmd: Box<Command>,
    },
    /// One page of transaction-record collection: from after `from` (a transaction id; `None`:
    /// the first), examine at most a page of the shard's records and markers and delete the
    /// finished ones whose transaction started below the shard's GC threshold (see `locks`,
    /// "Collecting records"). Like [`Command::Gc`], it starts an apply batch of its own and is
    /// never fenced. Appended last (bincode variant indices).
    GcRecords { from: Option<RequestId> },
    /// Several proposals of one leader coalesced into one entry (see `proposals`): each
    /// member is applied, checked and deduplicated exactly as if it had its own entry at this
    /// place in the log, in order, and answers for itself ([`CommandResult::batch`]). Members
    /// are fenced data commands (`Closed` or `Fenced` around a `Write`, `Cas`, `Txn`, `Prepare`
    /// or `Resolve`); at
    /// most [`MAX_PROPOSAL_BATCH`] of them. A node from before this variant cannot decode it
    /// (see `proposals`, "Compatibility"). Appended last (bincode variant indices).
    Batch { cmds: Vec<Command> },
}

/// The most members one [`Command::Batch`] may carry.
pub const MAX_PROPOSAL_BATCH: usize = 256;

/// What one [`Command::Gc`] page did.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GcResult {
    /// The shard's threshold after the page (the command's, or a higher one it already had).
    pub threshold: u64,
    /// Where the pass goes on (`None`: it reached the end of the shard).
    pub resume: Option<(Bytes, u64)>,
    pub versions_deleted: u64,
    pub keys_deleted: u64,
    pub examined: u64,
}

/// What one [`Command::GcRecords`] page did.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GcRecordsResult {
    /// Where the pass goes on (`None`: it reached the shard's last record).
    pub resume: Option<RequestId>,
    /// Records and markers examined, and deleted.
    pub examined: u64,
    pub deleted: u64,
    /// Committed anchor records still unfinished though their transaction started below the
    /// threshold (at most [`crate::apply_2pc::STUCK_PER_GC_PAGE`] a page): their coordinator,
    /// and every recovery since, stopped before resolving every participant and finishing
    /// them, and no lock is left to lead a reader or the sweeper to them. The node's sweeper
    /// finishes them, and a later pass collects them.
    pub stuck: Vec<StuckRecord>,
}

/// A committed, unfinished anchor record a GC page found (see [`GcRecordsResult::stuck`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StuckRecord {
    pub txn: RequestId,
    pub txn_ts: u64,
    pub commit_ts: u64,
}

/// A transaction's point read: `key` had the live version `version` (`None`: absent or
/// deleted) when it was read.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReadCheck {
    pub key: Bytes,
    pub version: Option<u64>,
}

/// A transaction's range read: the live keys of `[start, end)` (`end = None`: to the shard's
/// end) were exactly `rows`, ascending, each with its version timestamp.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RangeCheck {
    pub start: Bytes,
    pub end: Option<Bytes>,
    pub rows: Vec<(Bytes, u64)>,
}

/// The condition of a [`Command::Cas`], on the key's newest version.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Expect {
    /// No live value: never written, or the newest version is a tombstone.
    Absent,
    /// A live value whose version timestamp is exactly this.
    Version(u64),
    /// A live value equal to these bytes.
    Value(Bytes),
}

impl Expect {
    /// Whether the key's newest version, `current` (`None` = absent or deleted), matches.
    pub fn holds(&self, current: Option<(u64, &[u8])>) -> bool {
        match (self, current) {
            (Expect::Absent, None) => true,
            (Expect::Version(want), Some((ts, _))) => *want == ts,
            (Expect::Value(want), Some((_, value))) => want.as_ref() == value,
            _ => false,
        }
    }
}

impl Command {
    /// This command with its proposed version timestamp set to `new_ts`.
    pub fn with_ts(mut self, new_ts: u64) -> Command {
        match &mut self {
            Command::Write { ts, .. }
            | Command::Cas { ts, .. }
            | Command::Txn { ts, .. }
            | Command::Prepare { ts, .. }
            | Command::Resolve { ts, .. } => *ts = new_ts,
            Command::Fenced { cmd, .. } | Command::Closed { cmd, .. } => {
                let inner = std::mem::replace(&mut **cmd, Command::placeholder());
                **cmd = inner.with_ts(new_ts);
            }
            Command::Gc { .. } | Command::GcRecords { .. } | Command::Batch { .. } => {}
        }
        self
    }

    fn placeholder() -> Command {
        Command::Write {
            ts: 0,
            puts: Vec::new(),
            deletes: Vec::new(),
            request: None,
        }
    }

    /// Checks the limits every write must meet, so apply never meets a command it cannot
    /// apply. Pure: every replica reaches the same verdict.
    pub fn validate(&self) -> Result<(), String> {
        match self {
            Command::Closed { closed_ts, .. } if *closed_ts > MAX_COMMAND_TS => Err(format!(
                "closed timestamp {closed_ts} is above MAX_COMMAND_TS"
            )),
            Command::Fenced { cmd, .. } | Command::Closed { cmd, .. } => match **cmd {
                Command::Fenced { .. } | Command::Closed { .. } => {
                    Err("a fenced command inside a fenced command".into())
                }
                // A GC page must start its own apply batch (see `state_machine`), which only
                // an unwrapped one does; and it issues no timestamp to fence.
                Command::Gc { .. } | Command::GcRecords { .. } => {
                    Err("a GC command is never fenced".into())
                }
                Command::Batch { .. } => Err("a batch inside a fenced command".into()),
                ref inner => inner.validate(),
            },
            Command::Write {
                ts, puts, deletes, ..
            } => {
                if *ts > MAX_COMMAND_TS {
                    return Err(format!("timestamp {ts} is above MAX_COMMAND_TS"));
                }
                let count = puts.len() + deletes.len();
                if count == 0 {
                    return Err("write has no keys".into());
                }
                if count > MAX_BATCH_KEYS {
                    return Err(format!(
                        "{count} keys, over MAX_BATCH_KEYS ({MAX_BATCH_KEYS})"
                    ));
                }
                let mut bytes = 0usize;
                for key in puts.iter().map(|(k, _)| k).chain(deletes.iter()) {
                    check_key(key)?;
                    bytes += key.len();
                }
                for (_, value) in puts {
                    check_value(value)?;
                    bytes += value.len();
                }
                if bytes > MAX_BATCH_BYTES {
                    return Err(format!(
                        "write is {bytes} bytes, over MAX_BATCH_BYTES ({MAX_BATCH_BYTES})"
                    ));
                }
                Ok(())
            }
            Command::Cas {
                ts,
                key,
                expect,
                value,
                ..
            } => {
                if *ts > MAX_COMMAND_TS {
                    return Err(format!("timestamp {ts} is above MAX_COMMAND_TS"));
                }
                check_key(key)?;
                let expected = match expect {
                    Expect::Value(v) => Some(v),
                    Expect::Absent | Expect::Version(_) => None,
                };
                value.iter().chain(expected).try_for_each(check_value)
            }
            Command::Txn {
                ts,
                reads,
                ranges,
                writes,
                ..
            } => {
                if *ts > MAX_COMMAND_TS {
                    return Err(format!("timestamp {ts} is above MAX_COMMAND_TS"));
                }
                if writes.is_empty() {
                    return Err("a transaction commit has no writes".into());
                }
                check_txn_reads(reads, ranges)?;
                check_txn_writes(writes)
            }
            Command::Prepare {
                ts,
                txn_ts,
                anchor,
                is_anchor,
                reads,
                ranges,
                writes,
                participants,
                ..
            } => {
                if *ts > MAX_COMMAND_TS {
                    return Err(format!("timestamp {ts} is above MAX_COMMAND_TS"));
                }
                if *txn_ts == 0 || *txn_ts > MAX_COMMAND_TS {
                    return Err(format!(
                        "a prepare's transaction timestamp {txn_ts} is 0 or above MAX_COMMAND_TS"
                    ));
                }
                check_key(anchor)?;
                if participants.len() > MAX_TXN_PARTICIPANTS {
                    return Err(format!(
                        "{} participants, more than MAX_TXN_PARTICIPANTS ({MAX_TXN_PARTICIPANTS})",
                        participants.len()
                    ));
                }
                if !is_anchor && !participants.is_empty() {
                    return Err("only the anchor's prepare lists the participants".into());
                }
                for key in participants {
                    check_key(key)?;
                }
                if reads.is_empty() && ranges.is_empty() && writes.is_empty() {
                    return Err("a prepare has no reads and no writes".into());
                }
                check_txn_reads(reads, ranges)?;
                check_txn_writes(writes)
            }
            Command::Resolve {
                ts,
                txn_ts,
                decision,
                ..
            } => {
                if *txn_ts == 0 || *txn_ts > MAX_COMMAND_TS {
                    return Err(format!(
                        "a resolve's transaction timestamp {txn_ts} is 0 or above MAX_COMMAND_TS"
                    ));
                }
                let commit = match decision {
                    crate::locks::Decision::Commit(c) => *c,
                    _ => 0,
                };
                if (*ts).max(commit) > MAX_COMMAND_TS {
                    return Err("a resolve's timestamp is above MAX_COMMAND_TS".into());
                }
                if commit == 0 && matches!(decision, crate::locks::Decision::Commit(_)) {
                    return Err("a commit decision needs a timestamp".into());
                }
                Ok(())
            }
            Command::GcRecords { .. } => Ok(()),
            // Each member is validated when it is applied (one bad member rejects only
            // itself); here only the batch's shape.
            Command::Batch { cmds } => {
                if cmds.is_empty() {
                    return Err("an empty batch".into());
                }
                if cmds.len() > MAX_PROPOSAL_BATCH {
                    return Err(format!(
                        "{} members, over MAX_PROPOSAL_BATCH ({MAX_PROPOSAL_BATCH})",
                        cmds.len()
                    ));
                }
                for cmd in cmds {
                    let (Command::Fenced { cmd: inner, .. } | Command::Closed { cmd: inner, .. }) =
                        cmd
                    else {
                        return Err(format!("a batch member that is not fenced: {cmd}"));
                    };
                    if !matches!(
                        **inner,
                        Command::Write { .. }
                            | Command::Cas { .. }
                            | Command::Txn { .. }
                            | Command::Prepare { .. }
                            | Command::Resolve { .. }
                    ) {
                        return Err(format!("a batch member of another kind: {cmd}"));
                    }
                }
                Ok(())
            }
            Command::Gc { threshold, from } => {
                if *threshold > MAX_COMMAND_TS {
                    return Err(format!("GC threshold {threshold} is above MAX_COMMAND_TS"));
                }
                match from {
                    Some((key, _)) => check_key(key),
                    None => Ok(()),
                }
            }
        }
    }
}

/// The limits on a transaction's writes: at most `MAX_BATCH_KEYS` keys and `MAX_BATCH_BYTES`
/// bytes, every key and value within its own limit.
pub fn check_txn_writes(writes: &[(Bytes, Option<Bytes>)]) -> Result<(), String> {
    if writes.len() > MAX_BATCH_KEYS {
        return Err(format!(
            "{} writes, over MAX_BATCH_KEYS ({MAX_BATCH_KEYS})",
            writes.len()
        ));
    }
    let mut bytes = 0usize;
    for (key, value) in writes {
        check_key(key)?;
        bytes += key.len();
        if let Some(value) = value {
            check_value(value)?;
            bytes += value.len();
        }
    }
    if bytes > MAX_BATCH_BYTES {
        return Err(format!(
            "writes are {bytes} bytes, over MAX_BATCH_BYTES ({MAX_BATCH_BYTES})"
        ));
    }
    Ok(())
}

/// The limits on a transaction's read set (shared by apply and the `Kv` service): at most
/// `MAX_TXN_READ_KEYS` keys counting every range's rows, at most `MAX_TXN_RANGES` ranges, each
/// non-empty and its rows ascending inside it.
pub fn check_txn_reads(reads: &[ReadCheck], ranges: &[RangeCheck]) -> Result<(), String> {
    if ranges.len() > MAX_TXN_RANGES {
        return Err(format!(
            "{} scanned ranges, over MAX_TXN_RANGES ({MAX_TXN_RANGES})",
            ranges.len()
        ));
    }
    let keys = reads.len() + ranges.iter().map(|r| r.rows.len()).sum::<usize>();
    if keys > MAX_TXN_READ_KEYS {
        return Err(format!(
            "{keys} keys read, over MAX_TXN_READ_KEYS ({MAX_TXN_READ_KEYS})"
        ));
    }
    for read in reads {
        check_key(&read.key)?;
    }
    for range in ranges {
        if range.start.len() > MAX_KEY_BYTES {
            return Err(format!("range start over MAX_KEY_BYTES ({MAX_KEY_BYTES})"));
        }
        if let Some(end) = &range.end {
            check_key(end)?;
            if range.start >= *end {
                return Err("a scanned range is empty or inverted".into());
            }
        }
        let mut previous: Option<&Bytes> = None;
        for (key, _) in &range.rows {
            check_key(key)?;
            let inside = *key >= range.start && range.end.as_ref().is_none_or(|end| key < end);
            if !inside || previous.is_some_and(|p| p >= key) {
                return Err("a scanned range's rows are outside it or not ascending".into());
            }
            previous = Some(key);
        }
    }
    Ok(())
}

fn check_key(key: &Bytes) -> Result<(), String> {
    if key.is_empty() || key.len() > MAX_KEY_BYTES {
        return Err(format!(
            "key of {} bytes is outside 1..=MAX_KEY_BYTES ({MAX_KEY_BYTES})",
            key.len()
        ));
    }
    Ok(())
}

fn check_value(value: &Bytes) -> Result<(), String> {
    if value.len() > MAX_VALUE_BYTES {
        return Err(format!(
            "value of {} bytes, over MAX_VALUE_BYTES ({MAX_VALUE_BYTES})",
            value.len()
        ));
    }
    Ok(())
}

impl std::fmt::Display for Command {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Command::Fenced { term, cmd } => write!(f, "Fenced(term={term}, {cmd})"),
            Command::Closed {
                term,
                closed_ts,
                cmd,
            } => write!(f, "Closed(term={term}, closed_ts={closed_ts}, {cmd})"),
            Command::Write {
                ts,
                puts,
                deletes,
                request,
            } => {
                write!(
                    f,
                    "Write(ts={ts}, puts={}, deletes={}, request={request:?})",
                    puts.len(),
                    deletes.len()
                )
            }
            Command::Cas {
                ts,
                key,
                value,
                request,
                ..
            } => write!(
                f,
                "Cas(ts={ts}, key={} bytes, {}, request={request:?})",
                key.len(),
                if value.is_some() { "put" } else { "delete" }
            ),
            Command::Txn {
                ts,
                reads,
                ranges,
                writes,
                request,
            } => write!(
                f,
                "Txn(ts={ts}, reads={}, ranges={}, writes={}, request={request:?})",
                reads.len(),
                ranges.len(),
                writes.len()
            ),
            Command::Prepare {
                ts,
                txn,
                is_anchor,
                reads,
                ranges,
                writes,
                ..
            } => write!(
                f,
                "Prepare(ts={ts}, txn={txn:?}, anchor={is_anchor}, reads={}, ranges={}, writes={})",
                reads.len(),
                ranges.len(),
                writes.len()
            ),
            Command::Resolve {
                txn,
                anchor,
                decision,
                ..
            } => write!(f, "Resolve(txn={txn:?}, anchor={anchor}, {decision:?})"),
            Command::Gc { threshold, from } => write!(
                f,
                "Gc(threshold={threshold}, from={:?})",
                from.as_ref().map(|(k, ts)| (k.len(), ts))
            ),
            Command::GcRecords { from } => write!(f, "GcRecords(from={from:?})"),
            Command::Batch { cmds } => write!(f, "Batch({} members)", cmds.len()),
        }
    }
}

/// What applying a command produced.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommandResult {
    /// The version timestamp the write was applied at (for a duplicate: the original's).
    pub commit_ts: u64,
    /// The command's request id had already been applied: nothing was written now, and
    /// `commit_ts` is the first application's.
    pub duplicate: bool,
    /// The command failed [`Command::validate`] at apply: nothing was written.
    pub rejected: Option<String>,
    /// A [`Command::Cas`] whose condition did not hold: nothing was written, and this is the
    /// key's newest version it was checked against (`None` = absent or deleted), as
    /// `(version_ts, value)`.
    pub mismatch: Option<Option<(u64, Bytes)>>,
    /// A [`Command::Txn`] whose reads no longer held: nothing was written, and this is the
    /// first key (or range start) found changed.
    pub conflict: Option<Bytes>,
    /// A [`Command::Fenced`] whose entry was appended in another term than the one its
    /// timestamp was issued in: nothing was written (and nothing remembered), so it is safe to
    /// send again.
    pub fenced: bool,
    /// A write (or a prepare) met another transaction's lock: nothing was written; the
    /// writer should wait for the lock to be resolved (see `locks`).
    pub locked: Option<crate::locks::LockInfo>,
    /// A [`Command::Resolve`] on the anchor: the record's state after it (`None`: never
    /// written; `Some(Forgotten)`: none, and the transaction started below the GC threshold).
    /// A [`Command::Prepare`] of a transaction already aborted on its shard, or that started
    /// below its GC threshold, answers `Some(Aborted)` and locks nothing. A `Prevent` answers
    /// `Some(Staging)` with the prepare timestamp in `commit_ts` if the shard is prepared, else
    /// `Some(Aborted)`.
    pub status: Option<crate::locks::TxnStatus>,
    /// A [`Command::Resolve`] on the anchor that found the record `Staging`: a key of every
    /// other participant (what the recovery must check); `commit_ts` is then the anchor's
    /// prepare timestamp.
    pub participants: Vec<Bytes>,
    /// A [`Command::Gc`]: what its page did.
    pub gc: Option<GcResult>,
    /// A [`Command::GcRecords`]: what its page did.
    pub gc_records: Option<GcRecordsResult>,
    /// A [`Command::Batch`]: each member's result, in order (empty if the batch itself was
    /// rejected: then `rejected` says why, for every member). Read only by the leader's own
    /// proposer, never sent: skipped in the encoding, so the `Propose` RPC's reply (a
    /// bincode `CommandResult`) keeps the format older nodes decode.
    #[serde(skip)]
    pub batch: Vec<CommandResult>,
}

openraft::declare_raft_types!(
    /// Meridian's Raft types: node ids are u64, nodes are known by their peer address.
    pub TypeConfig:
        D = Command,
        R = CommandResult,
        NodeId = u64,
        Node = openraft::impls::BasicNode,
);

pub type NodeId = u64;
pub type Raft = openraft::Raft<TypeConfig, crate::state_machine::ShardStateMachine>;
pub type LogId = openraft::alias::LogIdOf<TypeConfig>;
pub type Vote = <TypeConfig as openraft::RaftTypeConfig>::Vote;
pub type Entry = <TypeConfig as openraft::RaftTypeConfig>::Entry;
pub type Node = openraft::impls::BasicNode;
pub type StoredMembership = openraft::alias::StoredMembershipOf<TypeConfig>;
pub type SnapshotMeta = openraft::alias::SnapshotMetaOf<TypeConfig>;
pub type Snapshot = openraft::alias::SnapshotOf<TypeConfig, crate::state_machine::SnapshotFile>;
pub type IOFlushed = openraft::storage::IOFlushed<TypeConfig>;
pub type LogState = openraft::storage::LogState<TypeConfig>;
pub type RaftMetrics = openraft::RaftMetrics<TypeConfig>;
pub type VoteRequest = openraft::raft::VoteRequest<TypeConfig>;
pub type VoteResponse = openraft::raft::VoteResponse<TypeConfig>;
pub type AppendEntriesRequest = openraft::raft::AppendEntriesRequest<TypeConfig>;
pub type AppendEntriesResponse = openraft::raft::AppendEntriesResponse<TypeConfig>;
pub type StreamAppendResult = openraft::raft::StreamAppendResult<TypeConfig>;
pub type StreamAppendError = openraft::raft::StreamAppendError<TypeConfig>;
pub type SnapshotResponse = openraft::raft::SnapshotResponse<TypeConfig>;
pub type TransferLeaderRequest = openraft::raft::TransferLeaderRequest<TypeConfig>;
pub type TransferLeaderResponse = openraft::raft::TransferLeaderResponse<TypeConfig>;
pub type RPCError = openraft::errors::RPCError<TypeConfig>;
pub type StreamingError = openraft::errors::StreamingError<TypeConfig>;
pub type Fatal = openraft::errors::Fatal<TypeConfig>;
pub type ClientWriteError = openraft::errors::ClientWriteError<TypeConfig>;
pub type RaftError<E = openraft::errors::Infallible> = openraft::errors::RaftError<TypeConfig, E>;

/// A failed `client_write` in words an operator can act on: openraft's own text for a write
/// sent to a replica that is not the leader names the leader as `None, None` when there is none.
pub fn write_error_text(error: &RaftError<ClientWriteError>) -> String {
    match error {
        RaftError::APIError(ClientWriteError::ForwardToLeader(f)) => match f.leader_id {
            Some(leader) => format!("this replica is not the leader (node {leader} is)"),
            None => "the group has no leader right now (an election may be under way)".into(),
        },
        other => other.to_string(),
    }
}

/// Binary encoding of everything Raft stores or sends (log entries, votes, messages).
pub mod codec {
    use super::*;

    use bincode::Options;

    fn options() -> impl bincode::Options {
        bincode::DefaultOptions::new()
            .with_fixint_encoding()
            .with_limit(meridian_types::limits::MAX_MESSAGE_BYTES as u64)
    }

    pub fn encode<T: Serialize>(value: &T) -> std::io::Result<Vec<u8>> {
        options()
            .serialize(value)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
    }

    /// The bytes [`encode`] would produce, without encoding; `usize::MAX` for a value over
    /// the message limit (which [`encode`] refuses).
    pub fn encoded_len<T: Serialize>(value: &T) -> usize {
        options()
            .serialized_size(value)
            .map_or(usize::MAX, |n| usize::try_from(n).unwrap_or(usize::MAX))
    }

    /// Decodes `bytes`, rejecting trailing garbage and oversized length prefixes.
    pub fn decode<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> std::io::Result<T> {
        let mut cursor = Cursor::new(bytes);
        let value = options()
            .deserialize_from(&mut cursor)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
        if cursor.position() as usize != bytes.len() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!(
                    "{} trailing bytes after message",
                    bytes.len() - cursor.position() as usize
                ),
            ));
        }
        Ok(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_to_a_group_without_a_leader_says_so() {
        let no_leader = RaftError::APIError(ClientWriteError::ForwardToLeader(
            openraft::errors::ForwardToLeader::empty(),
        ));
        let text = write_error_text(&no_leader);
        assert!(!text.contains("None"), "{text}");
        assert!(text.contains("no leader"), "{text}");
    }

    #[test]
    fn codec_round_trips_and_rejects_truncation() {
        let cmd = Command::Write {
            ts: 7,
            puts: vec![(Bytes::from_static(b"k"), Bytes::from_static(b"v"))],
            deletes: vec![Bytes::from_static(b"d")],
            request: Some(RequestId {
                client_id: 9,
                seq: 3,
            }),
        };
        let bytes = codec::encode(&cmd).unwrap();
        assert_eq!(codec::decode::<Command>(&bytes).unwrap(), cmd);
        assert!(codec::decode::<Command>(&bytes[..bytes.len() - 1]).is_err());
        let mut extra = bytes.clone();
        extra.push(0);
        assert!(codec::decode::<Command>(&extra).is_err());
    }

    fn write(ts: u64, puts: Vec<(Bytes, Bytes)>, deletes: Vec<Bytes>) -> Command {
        Command::Write {
            ts,
            puts,
            deletes,
            request: None,
        }
    }

    #[test]
    fn validate_rejects_what_apply_cannot_apply() {
        let kv = |k: &[u8], v: &[u8]| (Bytes::copy_from_slice(k), Bytes::copy_from_slice(v));
        assert!(write(7, vec![kv(b"k", b"v")], vec![]).validate().is_ok());
        // A timestamp at the slot's key (or close enough to step into it) would panic in apply.
        let e = write(u64::MAX, vec![kv(b"k", b"v")], vec![])
            .validate()
            .unwrap_err();
        assert!(e.contains("MAX_COMMAND_TS"), "{e}");
        assert!(write(MAX_COMMAND_TS + 1, vec![kv(b"k", b"v")], vec![])
            .validate()
            .is_err());
        assert!(write(1, vec![], vec![]).validate().is_err());
        assert!(write(1, vec![kv(b"", b"v")], vec![]).validate().is_err());
        assert!(
            write(1, vec![], vec![Bytes::from(vec![b'k'; MAX_KEY_BYTES + 1])])
                .validate()
                .is_err()
        );
        let big = Bytes::from(vec![0u8; MAX_VALUE_BYTES + 1]);
        assert!(write(1, vec![(Bytes::from_static(b"k"), big)], vec![])
            .validate()
            .is_err());
        let many: Vec<Bytes> = (0..=MAX_BATCH_KEYS)
            .map(|i| Bytes::from(i.to_string()))
            .collect();
        assert!(write(1, vec![], many).validate().is_err());
    }
}
