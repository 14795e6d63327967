//! Order-preserving key encodings, one documented layout per keyspace.
//!
//! One RocksDB database serves every shard on a node. **MVCC data is keyed by user key
//! alone**: a shard owns a range of user keys, and that range is metadata (the shard map), not
//! part of the stored keys. A split or a merge moves no data, and a replica move ships a plain
//! key range (as TiKV's regions and CockroachDB's ranges do). What belongs to one Raft group
//! and to no user key (its Raft log and state, its dedup table, its transaction region and GC
//! threshold) is keyed by shard id.
//!
//! # Layouts (format 6)
//! ```text
//! Cf::Data        01 ‖ shard u64 BE ‖ kind ‖ ...                (shard-local: transaction
//!                                                                region, GC threshold)
//!                 space ‖ encode_bytes(key) ‖ 0x00×8               (latest-version slot:
//!                                                                newest ts + copy of its value)
//!                 space ‖ encode_bytes(key) ‖ !ts u64 BE           (versions newest first)
//!                   space = 02: the metadata shard's keys (node records, shard descriptors)
//!                   space = 03: user keys, one keyspace shared by every data shard
//! Cf::RaftLog     shard u64 BE ‖ index u64 BE
//! Cf::RaftMeta    shard u64 BE ‖ MetaKind u8
//!                 0xFF×8 ‖ name                                        (node-wide reserved keys)
//! ```
//! A shard's data is [`Span::data_range`]: the versions of every user key in `[start, end)`
//! of its keyspace. Data shards partition the user keyspace, so no two shards' spans overlap;
//! the metadata shard's span is the whole system keyspace. A snapshot of a shard is its span's
//! data range plus its shard-local range ([`shard_local_range`]).
//!
//! # Byte-string encoding
//! [`encode_bytes`] escapes each `0x00` as `0x00 0xFF` and terminates with `0x00 0x00`. This is
//! *order-preserving* (`a < b` ⇔ `enc(a) < enc(b)`) and *prefix-free* (no encoding is a prefix
//! of another), so anything appended after it (the inverted timestamp) never changes the order
//! of user keys. Example: `"a"` < `"a\0"` < `"ab"` encode to `61 00 00` < `61 00 FF 00 00` <
//! `61 62 00 00`.
//!
//! # MVCC versions
//! The timestamp is stored inverted (`!ts`) so that, for one user key, newer versions sort
//! first. "The newest version at or below `read_ts`" is then the first *version* at or after
//! `data_key(space, key, read_ts)` that still has the key's prefix ([`data_key_seek`]).
//!
//! # Latest-version slot
//! `Timestamp::MAX` is not a version timestamp: `data_key(space, key, Timestamp::MAX)`
//! ([`data_slot_key`], suffix `!u64::MAX` = eight `0x00` bytes) is the key's *slot*, whose
//! value holds the newest version's timestamp and a copy of that version's value (see
//! `mvcc`). It is an exact key a point get or a MultiGet can find without knowing any
//! timestamp, so a read at or above the newest version is one lookup; and it sorts *before*
//! every version of its key, inside [`data_key_versions_range`]:
//!
//! ```text
//!   03 ‖ enc("k") ‖ 00 00 00 00 00 00 00 00   slot  → ts 30 + Put("c")  (copy of !30's value)
//!   03 ‖ enc("k") ‖ !30                        version → Put("c")
//!   03 ‖ enc("k") ‖ !10                        version → Put("a")
//!   03 ‖ enc("k\0") ‖ 00×8                     next user key's slot
//! ```
//!
//! A seek from `data_key(space, key, read_ts)` with `read_ts < Timestamp::MAX` starts after
//! the slot; scans over a key's range meet it and must skip it ([`is_slot_ts`]).
//!
//! # Reserved keys
//! Shard id `u64::MAX` is reserved (see [`MAX_SHARD_ID`]), so keys starting with `0xFF×8`
//! belong to no shard. Node-wide keys ([`FORMAT_VERSION_KEY`], [`CLUSTER_ID_KEY`]) live there
//! in `Cf::RaftMeta`: they sort after every shard and no shard range ever covers them.
//!
//! # Invariants
//! - Decoders never panic on arbitrary input; they return `Error::Corrupt`.
//! - `shard_*_range(shard)` is exactly the set of keys whose first 8 bytes are `shard`;
//!   [`shard_local_range`] exactly the shard-local keys of `shard`.
//! - The three `Cf::Data` prefixes (01, 02, 03) never meet: a user key, however chosen,
//!   encodes inside its keyspace, and [`Span::data_range`] holds exactly the versions and
//!   slots of the span's keys (property-tested below).
//!
//! # Not done yet
//! - Splitting a shard's local range (its prepared locks and records) at a split key: no
//!   split exists yet.

use crate::error::{Error, Result};
use meridian_types::{ShardId, Timestamp};

/// Largest usable shard id. `u64::MAX` is reserved so that `prefix(shard + 1)` always exists
/// and so reserved keys (`0xFF×8 ‖ name`) cannot collide with any shard's keys.
pub const MAX_SHARD_ID: u64 = u64::MAX - 1;

/// Prefix of node-wide reserved keys in `Cf::RaftMeta`.
pub const RESERVED_PREFIX: [u8; 8] = [0xFF; 8];

/// `Cf::RaftMeta` key holding the on-disk format version (`u32` BE).
pub const FORMAT_VERSION_KEY: &[u8] = b"\xff\xff\xff\xff\xff\xff\xff\xffformat_version";

/// `Cf::RaftMeta` key holding the cluster id (UTF-8).
pub const CLUSTER_ID_KEY: &[u8] = b"\xff\xff\xff\xff\xff\xff\xff\xffcluster_id";

/// `Cf::RaftMeta` key holding the node's HLC ceiling (`u64` BE, milliseconds since the Unix
/// epoch): no timestamp this node issued is above it (see `meridian-server`'s `hlc_ceiling`).
pub const HLC_CEILING_KEY: &[u8] = b"\xff\xff\xff\xff\xff\xff\xff\xffhlc_ceiling";

/// `Cf::RaftMeta` key holding the newest shard map this node adopted (the metadata shard's
/// record, see `meridian-server`'s `shard_map_store`): which replicas it hosts after a restart.
pub const SHARD_MAP_CACHE_KEY: &[u8] = b"\xff\xff\xff\xff\xff\xff\xff\xffshard_map";

/// Length of the inverted timestamp suffix of a data key.
const TS_BYTES: usize = 8;
/// Length of the shard prefix of every key.
const SHARD_BYTES: usize = 8;

/// Appends the order-preserving, prefix-free encoding of `b` to `out`.
pub fn encode_bytes(out: &mut Vec<u8>, b: &[u8]) {
    out.reserve(b.len() + 2);
    for &byte in b {
        if byte == 0x00 {
            out.extend_from_slice(&[0x00, 0xFF]);
        } else {
            out.push(byte);
        }
    }
    out.extend_from_slice(&[0x00, 0x00]);
}

/// Decodes one [`encode_bytes`] string from the front of `input`; returns it and the rest.
pub fn decode_bytes(input: &[u8]) -> Result<(Vec<u8>, &[u8])> {
    let mut out = Vec::with_capacity(input.len());
    let mut i = 0;
    while i < input.len() {
        let byte = input[i];
        if byte != 0x00 {
            out.push(byte);
            i += 1;
            continue;
        }
        match input.get(i + 1) {
            Some(0xFF) => {
                out.push(0x00);
                i += 2;
            }
            Some(0x00) => return Ok((out, &input[i + 2..])),
            Some(other) => {
                return Err(Error::corrupt(
                    "encoded bytes",
                    format!("invalid escape 0x00 0x{other:02x} at offset {i}"),
                ))
            }
            None => break,
        }
    }
    Err(Error::corrupt(
        "encoded bytes",
        "missing 0x00 0x00 terminator",
    ))
}

fn shard_bytes(shard: ShardId) -> [u8; 8] {
    assert!(
        shard.0 <= MAX_SHARD_ID,
        "shard id u64::MAX is reserved for node-wide keys"
    );
    shard.0.to_be_bytes()
}

fn decode_shard<'k>(k: &'k [u8], what: &'static str) -> Result<(ShardId, &'k [u8])> {
    if k.len() < SHARD_BYTES {
        return Err(Error::corrupt(
            what,
            format!("{} bytes, too short", k.len()),
        ));
    }
    let (head, rest) = k.split_at(SHARD_BYTES);
    let mut id = [0u8; 8];
    id.copy_from_slice(head);
    Ok((ShardId(u64::from_be_bytes(id)), rest))
}

/// The 8-byte prefix shared by all of `shard`'s keys in any column family.
pub fn shard_prefix(shard: ShardId) -> Vec<u8> {
    shard_bytes(shard).to_vec()
}

/// `[prefix(shard), prefix(shard + 1))`: every key of `shard` in any shard-prefixed family.
pub fn shard_range(shard: ShardId) -> (Vec<u8>, Vec<u8>) {
    let start = shard_prefix(shard);
    // shard <= MAX_SHARD_ID (asserted above), so shard + 1 <= u64::MAX does not overflow.
    let end = (shard.0 + 1).to_be_bytes().to_vec();
    (start, end)
}

// ---------------------------------------------------------------------------------------------
// Cf::Data: keyspaces and spans

/// The MVCC keyspaces of `Cf::Data`; the discriminant is the first byte of every data key in
/// the space (stable on disk).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum Keyspace {
    /// The metadata shard's keys (node records, shard descriptors).
    System = 0x02,
    /// User keys, shared by every data shard; each owns a [`Span`] of it.
    User = 0x03,
}

impl Keyspace {
    /// `[space, space + 1)`: every data key of the keyspace.
    pub fn range(self) -> (Vec<u8>, Vec<u8>) {
        (vec![self as u8], vec![self as u8 + 1])
    }

    fn from_byte(b: u8) -> Result<Keyspace> {
        match b {
            0x02 => Ok(Keyspace::System),
            0x03 => Ok(Keyspace::User),
            other => Err(Error::corrupt(
                "data key",
                format!("unknown keyspace {other:#04x}"),
            )),
        }
    }
}

/// The keyspace a shard's MVCC data lives in: the metadata shard's own, or the user keyspace.
impl From<ShardId> for Keyspace {
    fn from(shard: ShardId) -> Keyspace {
        if shard.is_meta() {
            Keyspace::System
        } else {
            Keyspace::User
        }
    }
}

/// The user keys a shard owns: `[start, end)` of its keyspace (`end` empty = to the
/// keyspace's end; `start` empty = from its beginning).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Span {
    pub space: Keyspace,
    pub start: Vec<u8>,
    pub end: Vec<u8>,
}

impl Span {
    /// The whole of `space`.
    pub fn whole(space: Keyspace) -> Span {
        Span {
            space,
            start: Vec::new(),
            end: Vec::new(),
        }
    }

    /// The whole user keyspace: the span of a cluster's only data shard.
    pub fn user() -> Span {
        Span::whole(Keyspace::User)
    }

    /// `[start, end)` of `Cf::Data` holding exactly the slots and versions of the span's keys.
    pub fn data_range(&self) -> (Vec<u8>, Vec<u8>) {
        let (space_start, space_end) = self.space.range();
        let start = if self.start.is_empty() {
            space_start
        } else {
            data_key_seek(self.space, &self.start)
        };
        let end = if self.end.is_empty() {
            space_end
        } else {
            data_key_seek(self.space, &self.end)
        };
        (start, end)
    }

    /// Whether `key` is one of the span's user keys.
    pub fn contains(&self, key: &[u8]) -> bool {
        key >= self.start.as_slice() && (self.end.is_empty() || key < self.end.as_slice())
    }
}

// ---------------------------------------------------------------------------------------------
// Cf::Data: MVCC versions

/// Length of a data key's keyspace prefix.
pub const SPACE_BYTES: usize = 1;

/// `space ‖ encode_bytes(user_key) ‖ !ts`: one MVCC version.
pub fn data_key(space: impl Into<Keyspace>, user_key: &[u8], ts: Timestamp) -> Vec<u8> {
    let mut k = Vec::with_capacity(SPACE_BYTES + user_key.len() + 4 + TS_BYTES);
    k.push(space.into() as u8);
    encode_bytes(&mut k, user_key);
    k.extend_from_slice(&(!ts.0).to_be_bytes());
    k
}

/// The timestamp of [`data_slot_key`]s. No version may carry it.
pub const SLOT_TS: Timestamp = Timestamp::MAX;

/// Newest timestamp a version may carry (`Timestamp::MAX - 1`): `Timestamp::MAX` is the slot.
pub const MAX_VERSION_TS: Timestamp = Timestamp(u64::MAX - 1);

/// `space ‖ encode_bytes(user_key) ‖ 0x00×8`: the key's latest-version slot, i.e.
/// `data_key(space, user_key, SLOT_TS)`. Sorts before every version of `user_key`.
pub fn data_slot_key(space: impl Into<Keyspace>, user_key: &[u8]) -> Vec<u8> {
    data_key(space, user_key, SLOT_TS)
}

/// Whether a data key's timestamp (from [`split_data_key`] or [`decode_data_key`]) marks the
/// latest-version slot rather than a version.
pub fn is_slot_ts(ts: Timestamp) -> bool {
    ts == SLOT_TS
}

/// Decodes a [`data_key`] into `(space, user_key, ts)`. A slot decodes with `ts = SLOT_TS`.
pub fn decode_data_key(k: &[u8]) -> Result<(Keyspace, Vec<u8>, Timestamp)> {
    let Some((&space, rest)) = k.split_first() else {
        return Err(Error::corrupt("data key", "empty"));
    };
    let space = Keyspace::from_byte(space)?;
    let (user_key, rest) = decode_bytes(rest)?;
    let ts = decode_inverted_ts(rest)?;
    Ok((space, user_key, ts))
}

/// Splits a data key into its version prefix (`space ‖ encode_bytes(user_key)`, identical for
/// all versions of one user key) and its timestamp, without decoding the user key.
pub fn split_data_key(k: &[u8]) -> Result<(&[u8], Timestamp)> {
    if k.len() < SPACE_BYTES + 2 + TS_BYTES {
        return Err(Error::corrupt(
            "data key",
            format!("{} bytes, too short", k.len()),
        ));
    }
    let (prefix, ts) = k.split_at(k.len() - TS_BYTES);
    Ok((prefix, decode_inverted_ts(ts)?))
}

/// The user key of a version prefix from [`split_data_key`].
pub fn decode_version_prefix(prefix: &[u8]) -> Result<Vec<u8>> {
    let (user_key, rest) = decode_bytes(prefix.get(SPACE_BYTES..).unwrap_or_default())?;
    if !rest.is_empty() {
        return Err(Error::corrupt(
            "data key",
            "trailing bytes after the user key",
        ));
    }
    Ok(user_key)
}

fn decode_inverted_ts(rest: &[u8]) -> Result<Timestamp> {
    let raw: [u8; TS_BYTES] = rest.try_into().map_err(|_| {
        Error::corrupt(
            "data key",
            format!("timestamp suffix is {} bytes, want {TS_BYTES}", rest.len()),
        )
    })?;
    Ok(Timestamp(!u64::from_be_bytes(raw)))
}

/// `space ‖ encode_bytes(user_key)`: sorts before every version of `user_key` and after every
/// version of smaller user keys, i.e. the start of that key's versions. Also the exclusive
/// bound "all keys before `user_key`".
pub fn data_key_seek(space: impl Into<Keyspace>, user_key: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(SPACE_BYTES + user_key.len() + 2);
    k.push(space.into() as u8);
    encode_bytes(&mut k, user_key);
    k
}

/// `[start, end)` holding exactly `user_key`'s slot (first) and versions. The end replaces
/// the final terminator byte `0x00` with `0x01`: no valid encoding continues `… 0x00 0x01`,
/// so nothing but this key's slot and versions lies in between.
pub fn data_key_versions_range(space: impl Into<Keyspace>, user_key: &[u8]) -> (Vec<u8>, Vec<u8>) {
    let start = data_key_seek(space, user_key);
    let mut end = start.clone();
    if let Some(last) = end.last_mut() {
        *last = 0x01;
    }
    (start, end)
}

/// The bounds of a scan of `space`'s user keys in `[start, end)` (`end = None`: to the
/// keyspace's end; an empty `start`: from its beginning).
pub fn data_scan_bounds(
    space: impl Into<Keyspace>,
    start: &[u8],
    end: Option<&[u8]>,
) -> (Vec<u8>, Vec<u8>) {
    let space = space.into();
    let lower = data_key_seek(space, start);
    let upper = match end {
        Some(end) => data_key_seek(space, end),
        None => space.range().1,
    };
    (lower, upper)
}

// ---------------------------------------------------------------------------------------------
// Cf::RaftLog

/// `shard ‖ index`.
pub fn raft_log_key(shard: ShardId, index: u64) -> Vec<u8> {
    let mut k = Vec::with_capacity(16);
    k.extend_from_slice(&shard_bytes(shard));
    k.extend_from_slice(&index.to_be_bytes());
    k
}

pub fn decode_raft_log_key(k: &[u8]) -> Result<(ShardId, u64)> {
    let (shard, rest) = decode_shard(k, "raft log key")?;
    let raw: [u8; 8] = rest
        .try_into()
        .map_err(|_| Error::corrupt("raft log key", format!("{} bytes, want 16", k.len())))?;
    Ok((shard, u64::from_be_bytes(raw)))
}

/// Every log key of `shard`.
pub fn raft_log_range(shard: ShardId) -> (Vec<u8>, Vec<u8>) {
    shard_range(shard)
}

// ---------------------------------------------------------------------------------------------
// Cf::RaftMeta

/// The kinds of per-shard metadata. The discriminant is the key's last byte: stable on disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum MetaKind {
    Vote = 1,
    Committed = 2,
    LastPurged = 3,
    /// The state machine's applied log id; written in the same batch as the data it applied.
    Applied = 4,
    Membership = 5,
    SnapshotMeta = 6,
    /// Lowest timestamp a new version of this shard may carry (e.g. after a restart).
    VersionFloor = 7,
    /// Prefix of the shard's write-dedup entries: `shard ‖ 8 ‖ client_id BE ‖ seq BE` →
    /// commit ts BE (see [`dedup_key`]).
    Dedup = 8,
    /// A snapshot install in progress: written (synced) before the shard's data range is
    /// replaced, removed in the batch that records the install, redone on open if present.
    InstallMarker = 9,
}

impl MetaKind {
    pub const ALL: [MetaKind; 9] = [
        MetaKind::Vote,
        MetaKind::Committed,
        MetaKind::LastPurged,
        MetaKind::Applied,
        MetaKind::Membership,
        MetaKind::SnapshotMeta,
        MetaKind::VersionFloor,
        MetaKind::Dedup,
        MetaKind::InstallMarker,
    ];
}

impl TryFrom<u8> for MetaKind {
    type Error = Error;
    fn try_from(b: u8) -> Result<MetaKind> {
        MetaKind::ALL
            .into_iter()
            .find(|k| *k as u8 == b)
            .ok_or_else(|| Error::corrupt("raft meta key", format!("unknown kind {b}")))
    }
}

/// `shard ‖ kind` (9 bytes).
pub fn raft_meta_key(shard: ShardId, kind: MetaKind) -> Vec<u8> {
    let mut k = Vec::with_capacity(9);
    k.extend_from_slice(&shard_bytes(shard));
    k.push(kind as u8);
    k
}

pub fn decode_raft_meta_key(k: &[u8]) -> Result<(ShardId, MetaKind)> {
    let (shard, rest) = decode_shard(k, "raft meta key")?;
    match rest {
        [kind] => Ok((shard, MetaKind::try_from(*kind)?)),
        _ => Err(Error::corrupt(
            "raft meta key",
            format!("{} bytes, want 9", k.len()),
        )),
    }
}

/// One write-dedup entry of `shard`: `shard ‖ Dedup ‖ client_id BE ‖ seq BE` (25 bytes).
pub fn dedup_key(shard: ShardId, client_id: u64, seq: u64) -> Vec<u8> {
    let mut k = raft_meta_key(shard, MetaKind::Dedup);
    k.extend_from_slice(&client_id.to_be_bytes());
    k.extend_from_slice(&seq.to_be_bytes());
    k
}

/// Decodes a [`dedup_key`] into `(client_id, seq)`.
pub fn decode_dedup_key(k: &[u8]) -> Result<(u64, u64)> {
    let (_, rest) = decode_shard(k, "dedup key")?;
    match rest {
        [kind, ids @ ..] if *kind == MetaKind::Dedup as u8 && ids.len() == 16 => {
            let client_id = u64::from_be_bytes(ids[..8].try_into().expect("16 bytes"));
            let seq = u64::from_be_bytes(ids[8..].try_into().expect("16 bytes"));
            Ok((client_id, seq))
        }
        _ => Err(Error::corrupt(
            "dedup key",
            format!(
                "{} bytes, want 25 with kind {}",
                k.len(),
                MetaKind::Dedup as u8
            ),
        )),
    }
}

/// Every write-dedup key of `shard`.
pub fn dedup_range(shard: ShardId) -> (Vec<u8>, Vec<u8>) {
    let start = raft_meta_key(shard, MetaKind::Dedup);
    let mut end = start.clone();
    *end.last_mut().expect("9 bytes") += 1;
    (start, end)
}

/// Every metadata key of `shard` (reserved node-wide keys are never inside).
pub fn raft_meta_range(shard: ShardId) -> (Vec<u8>, Vec<u8>) {
    shard_range(shard)
}

// ---------------------------------------------------------------------------------------------
// Cf::Data: shard-local keys (the transaction region and the GC threshold)

/// First byte of every shard-local key in `Cf::Data`; sorts before both MVCC keyspaces.
pub const SHARD_LOCAL_PREFIX: u8 = 0x01;

/// `01 ‖ shard`: the prefix of `shard`'s local keys in `Cf::Data`, where the prepared locks
/// and the transaction records of multi-shard transactions live (see `meridian-raft`'s
/// `locks`) and the GC threshold. They belong to the Raft group, not to a user key, so they
/// are keyed by shard id; they travel with every snapshot of the shard (exported and ingested
/// with its data range).
fn shard_local_prefix(shard: ShardId) -> Vec<u8> {
    let mut k = Vec::with_capacity(1 + SHARD_BYTES + 1 + 16);
    k.push(SHARD_LOCAL_PREFIX);
    k.extend_from_slice(&shard_bytes(shard));
    k
}

/// `[01 ‖ shard, 01 ‖ shard + 1)`: every shard-local key of `shard`.
pub fn shard_local_range(shard: ShardId) -> (Vec<u8>, Vec<u8>) {
    let start = shard_local_prefix(shard);
    let mut end = vec![SHARD_LOCAL_PREFIX];
    // shard <= MAX_SHARD_ID (asserted in shard_bytes), so shard + 1 does not overflow.
    end.extend_from_slice(&(shard.0 + 1).to_be_bytes());
    (start, end)
}

/// What a key of the transaction region holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TxnKeyKind {
    /// A transaction's prepared locks on this shard.
    Locks = b'L' as isize,
    /// A transaction's record (its status), on its anchor shard.
    Record = b'R' as isize,
}

/// `01 ‖ shard ‖ kind ‖ client_id u64 BE ‖ seq u64 BE`.
pub fn txn_key(shard: ShardId, kind: TxnKeyKind, client_id: u64, seq: u64) -> Vec<u8> {
    let mut k = shard_local_prefix(shard);
    k.push(kind as u8);
    k.extend_from_slice(&client_id.to_be_bytes());
    k.extend_from_slice(&seq.to_be_bytes());
    k
}

/// `[start, end)` of every key of one `kind` in `shard`'s transaction region.
pub fn txn_kind_range(shard: ShardId, kind: TxnKeyKind) -> (Vec<u8>, Vec<u8>) {
    let mut start = shard_local_prefix(shard);
    start.push(kind as u8);
    let mut end = shard_local_prefix(shard);
    end.push(kind as u8 + 1);
    (start, end)
}

/// `01 ‖ shard ‖ 'G'`: the shard's GC threshold (`u64` BE; see `gc` and `meridian-raft`'s
/// `Command::Gc`). Shard-local, so it travels with snapshots like the locks. `'G'` lies
/// outside the lock (`'L'`) and record (`'R'`) kinds' ranges ([`txn_kind_range`]), so loading
/// locks or records never meets it.
pub fn gc_threshold_key(shard: ShardId) -> Vec<u8> {
    let mut k = shard_local_prefix(shard);
    k.push(b'G');
    k
}

/// The `(kind, client_id, seq)` of a [`txn_key`].
pub fn decode_txn_key(k: &[u8]) -> Result<(TxnKeyKind, u64, u64)> {
    let [SHARD_LOCAL_PREFIX, rest @ ..] = k else {
        return Err(Error::corrupt("txn key", "not a shard-local key"));
    };
    let (_, rest) = decode_shard(rest, "txn key")?;
    let [kind, id @ ..] = rest else {
        return Err(Error::corrupt("txn key", "no kind"));
    };
    let kind = match *kind {
        b'L' => TxnKeyKind::Locks,
        b'R' => TxnKeyKind::Record,
        other => {
            return Err(Error::corrupt(
                "txn key",
                format!("unknown kind {other:#x}"),
            ))
        }
    };
    if id.len() != 16 {
        return Err(Error::corrupt(
            "txn key",
            format!("{} id bytes, want 16", id.len()),
        ));
    }
    let client_id = u64::from_be_bytes(id[..8].try_into().expect("8 bytes"));
    let seq = u64::from_be_bytes(id[8..].try_into().expect("8 bytes"));
    Ok((kind, client_id, seq))
}

#[cfg(test)]
#[path = "keys_tests.rs"]
mod tests;
