//! The commands a shard's Raft log carries, and what applying one produced.
//!
//! A [`Command`] is one log entry's payload; its bincode encoding (see `types::codec`) is
//! what the log stores and peers send, so variants are only ever appended, never reordered,
//! and a variant's fields never change. Apply answers each command with a [`CommandResult`].
//! The checks apply runs on every command before it touches anything are in `command_check`;
//! the openraft type configuration built from these two types is in `types`, which
//! re-exports everything here (`crate::types::Command` is the usual path).

use bytes::Bytes;
use serde::{Deserialize, Serialize};

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
