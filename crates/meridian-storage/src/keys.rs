//! Order-preserving key encodings, one documented layout per keyspace.
//!
//! One RocksDB database serves every shard on a node, so every key starts with its shard id
//! as a big-endian `u64`: a shard's keys are one contiguous range in each column family, and a
//! range delete or an SST export of `[prefix(shard), prefix(shard + 1))` touches exactly that
//! shard.
//!
//! # Layouts
//! ```text
//! Cf::Data        shard u64 BE ‖ encode_bytes(user_key) ‖ 0x00×8    (latest-version slot:
//!                                                           newest ts + copy of its value)
//!                 shard u64 BE ‖ encode_bytes(user_key) ‖ !ts u64 BE     (versions newest first)
//! Cf::RaftLog     shard u64 BE ‖ index u64 BE
//! Cf::RaftMeta    shard u64 BE ‖ MetaKind u8
//!                 0xFF×8 ‖ name                                        (node-wide reserved keys)
//! Cf::Intents     shard u64 BE ‖ encode_bytes(user_key)
//! ```
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
//! `data_key(shard, key, read_ts)` that still has the key's prefix ([`data_key_seek`]).
//!
//! # Latest-version slot
//! `Timestamp::MAX` is not a version timestamp: `data_key(shard, key, Timestamp::MAX)`
//! ([`data_slot_key`], suffix `!u64::MAX` = eight `0x00` bytes) is the key's *slot*, whose
//! value holds the newest version's timestamp and a copy of that version's value (see
//! `mvcc`). It is an exact key a point get or a MultiGet can find without knowing any
//! timestamp, so a read at or above the newest version is one lookup; and it sorts *before*
//! every version of its key, inside [`data_key_versions_range`]:
//!
//! ```text
//!   s ‖ enc("k") ‖ 00 00 00 00 00 00 00 00   slot  → ts 30 + Put("c")  (copy of !30's value)
//!   s ‖ enc("k") ‖ !30                        version → Put("c")
//!   s ‖ enc("k") ‖ !10                        version → Put("a")
//!   s ‖ enc("k\0") ‖ 00×8                     next user key's slot
//! ```
//!
//! A seek from `data_key(shard, key, read_ts)` with `read_ts < Timestamp::MAX` starts after
//! the slot; scans over a key's range meet it and must skip it ([`is_slot_ts`]).
//!
//! # Reserved keys
//! Shard id `u64::MAX` is reserved (see [`MAX_SHARD_ID`]), so keys starting with `0xFF×8`
//! belong to no shard. Node-wide keys ([`FORMAT_VERSION_KEY`], [`CLUSTER_ID_KEY`]) live there
//! in `Cf::RaftMeta`: they sort after every shard and no shard range ever covers them.
//!
//! # Invariants
//! - Decoders never panic on arbitrary input; they return `Error::Corrupt`.
//! - `shard_*_range(shard)` is exactly the set of keys whose first 8 bytes are `shard`.
//!
//! # Not done yet
//! - Intent and transaction record layouts beyond the shard prefix belong to `meridian-txn`;
//!   only [`intent_key`] is fixed here.

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
// Cf::Data

/// `shard ‖ encode_bytes(user_key) ‖ !ts`: one MVCC version.
pub fn data_key(shard: ShardId, user_key: &[u8], ts: Timestamp) -> Vec<u8> {
    let mut k = Vec::with_capacity(SHARD_BYTES + user_key.len() + 4 + TS_BYTES);
    k.extend_from_slice(&shard_bytes(shard));
    encode_bytes(&mut k, user_key);
    k.extend_from_slice(&(!ts.0).to_be_bytes());
    k
}

/// The timestamp of [`data_slot_key`]s. No version may carry it.
pub const SLOT_TS: Timestamp = Timestamp::MAX;

/// Newest timestamp a version may carry (`Timestamp::MAX - 1`): `Timestamp::MAX` is the slot.
pub const MAX_VERSION_TS: Timestamp = Timestamp(u64::MAX - 1);

/// `shard ‖ encode_bytes(user_key) ‖ 0x00×8`: the key's latest-version slot, i.e.
/// `data_key(shard, user_key, SLOT_TS)`. Sorts before every version of `user_key`.
pub fn data_slot_key(shard: ShardId, user_key: &[u8]) -> Vec<u8> {
    data_key(shard, user_key, SLOT_TS)
}

/// Whether a data key's timestamp (from [`split_data_key`] or [`decode_data_key`]) marks the
/// latest-version slot rather than a version.
pub fn is_slot_ts(ts: Timestamp) -> bool {
    ts == SLOT_TS
}

/// Decodes a [`data_key`] into `(shard, user_key, ts)`. A slot decodes with `ts = SLOT_TS`.
pub fn decode_data_key(k: &[u8]) -> Result<(ShardId, Vec<u8>, Timestamp)> {
    let (shard, rest) = decode_shard(k, "data key")?;
    let (user_key, rest) = decode_bytes(rest)?;
    let ts = decode_inverted_ts(rest)?;
    Ok((shard, user_key, ts))
}

/// Splits a data key into its version prefix (`shard ‖ encode_bytes(user_key)`, identical for
/// all versions of one user key) and its timestamp, without decoding the user key.
pub fn split_data_key(k: &[u8]) -> Result<(&[u8], Timestamp)> {
    if k.len() < SHARD_BYTES + 2 + TS_BYTES {
        return Err(Error::corrupt(
            "data key",
            format!("{} bytes, too short", k.len()),
        ));
    }
    let (prefix, ts) = k.split_at(k.len() - TS_BYTES);
    Ok((prefix, decode_inverted_ts(ts)?))
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

/// The 8-byte prefix of `shard`'s data keys (same as [`shard_prefix`]).
pub fn shard_data_prefix(shard: ShardId) -> Vec<u8> {
    shard_prefix(shard)
}

/// `[prefix(shard), prefix(shard + 1))` in `Cf::Data`.
pub fn shard_data_range(shard: ShardId) -> (Vec<u8>, Vec<u8>) {
    shard_range(shard)
}

/// `shard ‖ encode_bytes(user_key)`: sorts before every version of `user_key` and after every
/// version of smaller user keys, i.e. the start of that key's versions. Also the exclusive
/// bound "all keys before `user_key`".
pub fn data_key_seek(shard: ShardId, user_key: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(SHARD_BYTES + user_key.len() + 2);
    k.extend_from_slice(&shard_bytes(shard));
    encode_bytes(&mut k, user_key);
    k
}

/// `[start, end)` holding exactly `user_key`'s slot (first) and versions. The end replaces
/// the final terminator byte `0x00` with `0x01`: no valid encoding continues `… 0x00 0x01`,
/// so nothing but this key's slot and versions lies in between.
pub fn data_key_versions_range(shard: ShardId, user_key: &[u8]) -> (Vec<u8>, Vec<u8>) {
    let start = data_key_seek(shard, user_key);
    let mut end = start.clone();
    if let Some(last) = end.last_mut() {
        *last = 0x01;
    }
    (start, end)
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
// Cf::Data: the shard's transaction region

/// `shard ‖ 0x00 0x01`: the start of the shard's *transaction region* in `Cf::Data`, where the
/// prepared locks and the transaction records of multi-shard transactions live (see
/// `meridian-raft`'s `locks`). No user key encodes to anything starting `0x00 0x01` (after a
/// `0x00`, [`encode_bytes`] writes only `0xFF` or the terminator `0x00`), so the region never
/// meets a user key; and being inside the shard's data range, it travels with every snapshot
/// (SST export and ingest) and goes with every range delete of the shard.
pub fn txn_region_prefix(shard: ShardId) -> Vec<u8> {
    let mut k = shard_prefix(shard);
    k.extend_from_slice(&[0x00, 0x01]);
    k
}

/// `[shard ‖ 00 01, shard ‖ 00 02)`: the whole transaction region of `shard`.
pub fn txn_region_range(shard: ShardId) -> (Vec<u8>, Vec<u8>) {
    let start = txn_region_prefix(shard);
    let mut end = shard_prefix(shard);
    end.extend_from_slice(&[0x00, 0x02]);
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

/// `shard ‖ 00 01 ‖ kind ‖ client_id u64 BE ‖ seq u64 BE`.
pub fn txn_key(shard: ShardId, kind: TxnKeyKind, client_id: u64, seq: u64) -> Vec<u8> {
    let mut k = txn_region_prefix(shard);
    k.push(kind as u8);
    k.extend_from_slice(&client_id.to_be_bytes());
    k.extend_from_slice(&seq.to_be_bytes());
    k
}

/// `[start, end)` of every key of one `kind` in `shard`'s transaction region.
pub fn txn_kind_range(shard: ShardId, kind: TxnKeyKind) -> (Vec<u8>, Vec<u8>) {
    let mut start = txn_region_prefix(shard);
    start.push(kind as u8);
    let mut end = txn_region_prefix(shard);
    end.push(kind as u8 + 1);
    (start, end)
}

/// `shard ‖ 00 01 ‖ 'G'`: the shard's GC threshold (`u64` BE; see `gc` and `meridian-raft`'s
/// `Command::Gc`). In the transaction region, so it travels with snapshots like the locks.
/// `'G'` lies outside the lock (`'L'`) and record (`'R'`) kinds' ranges ([`txn_kind_range`]),
/// so loading locks or records never meets it.
pub fn gc_threshold_key(shard: ShardId) -> Vec<u8> {
    let mut k = txn_region_prefix(shard);
    k.push(b'G');
    k
}

/// The `(client_id, seq)` of a [`txn_key`].
pub fn decode_txn_key(k: &[u8]) -> Result<(TxnKeyKind, u64, u64)> {
    let (_, rest) = decode_shard(k, "txn key")?;
    let [0x00, 0x01, kind, id @ ..] = rest else {
        return Err(Error::corrupt("txn key", "not in the transaction region"));
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

/// The lower bound of a scan of user keys from `start`: [`data_key_seek`], but never inside
/// the transaction region (an empty `start`, the first shard's, would otherwise begin there).
pub fn data_scan_lower(shard: ShardId, start: &[u8]) -> Vec<u8> {
    let seek = data_key_seek(shard, start);
    let past_region = txn_region_range(shard).1;
    seek.max(past_region)
}

// ---------------------------------------------------------------------------------------------
// Cf::Intents

/// `shard ‖ encode_bytes(user_key)`: at most one intent per user key.
pub fn intent_key(shard: ShardId, user_key: &[u8]) -> Vec<u8> {
    data_key_seek(shard, user_key)
}

pub fn decode_intent_key(k: &[u8]) -> Result<(ShardId, Vec<u8>)> {
    let (shard, rest) = decode_shard(k, "intent key")?;
    let (user_key, rest) = decode_bytes(rest)?;
    if !rest.is_empty() {
        return Err(Error::corrupt("intent key", "trailing bytes"));
    }
    Ok((shard, user_key))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn no_user_key_falls_in_the_transaction_region(key in proptest::collection::vec(any::<u8>(), 1..24), ts in any::<u64>()) {
            let shard = ShardId(9);
            let (start, end) = txn_region_range(shard);
            for k in [data_key(shard, &key, Timestamp(ts)), data_slot_key(shard, &key), data_key_seek(shard, &key)] {
                prop_assert!(k < start || k >= end, "{k:?}");
            }
            prop_assert!(data_scan_lower(shard, &key) >= end);
        }
    }

    #[test]
    fn txn_keys_round_trip_inside_their_kind_range() {
        let shard = ShardId(4);
        for kind in [TxnKeyKind::Locks, TxnKeyKind::Record] {
            let k = txn_key(shard, kind, 7, u64::MAX);
            assert_eq!(decode_txn_key(&k).unwrap(), (kind, 7, u64::MAX));
            let (start, end) = txn_kind_range(shard, kind);
            assert!(k >= start && k < end);
            let (rs, re) = txn_region_range(shard);
            assert!(k >= rs && k < re);
        }
        assert!(decode_txn_key(&data_key_seek(shard, b"a")).is_err());
        assert!(data_scan_lower(shard, b"") == txn_region_range(shard).1);
    }
    use std::cmp::Reverse;

    fn enc(b: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        encode_bytes(&mut out, b);
        out
    }

    #[test]
    fn encode_bytes_examples() {
        assert_eq!(enc(b""), vec![0, 0]);
        assert_eq!(enc(b"a"), vec![0x61, 0, 0]);
        assert_eq!(enc(b"a\0"), vec![0x61, 0, 0xFF, 0, 0]);
        assert!(enc(b"a") < enc(b"a\0") && enc(b"a\0") < enc(b"ab"));
    }

    #[test]
    fn decode_bytes_rejects_truncated_and_bad_escapes() {
        assert!(decode_bytes(b"").is_err());
        assert!(decode_bytes(b"ab").is_err());
        assert!(decode_bytes(b"a\0").is_err());
        assert!(decode_bytes(b"a\0\x01").is_err());
        let (v, rest) = decode_bytes(b"a\0\xff\0\0xyz").unwrap();
        assert_eq!((v.as_slice(), rest), (&b"a\0"[..], &b"xyz"[..]));
    }

    #[test]
    fn decoders_reject_wrong_lengths() {
        assert!(decode_data_key(&[0; 7]).is_err());
        assert!(decode_data_key(&data_key(ShardId(1), b"k", Timestamp(5))[..12]).is_err());
        assert!(decode_raft_log_key(&[0; 15]).is_err());
        assert!(decode_raft_meta_key(&[0; 10]).is_err());
        assert!(decode_raft_meta_key(&[0, 0, 0, 0, 0, 0, 0, 1, 99]).is_err());
        assert!(decode_raft_meta_key(FORMAT_VERSION_KEY).is_err());
    }

    /// A slot sorts before every version of its key, after every entry of smaller keys, and
    /// lies inside the key's versions range.
    #[test]
    fn slot_key_sorts_first_among_its_versions() {
        let s = ShardId(4);
        let slot = data_slot_key(s, b"a");
        assert_eq!(slot, data_key(s, b"a", SLOT_TS));
        assert!(slot.ends_with(&[0u8; 8]));
        for ts in [0, 1, 30, MAX_VERSION_TS.0] {
            assert!(slot < data_key(s, b"a", Timestamp(ts)));
            assert!(data_key(s, b"", Timestamp(ts)) < slot);
            assert!(data_key(s, b"a", Timestamp(ts)) < data_slot_key(s, b"a\0"));
        }
        let (vs, ve) = data_key_versions_range(s, b"a");
        assert!(vs <= slot && slot < ve);
        let (_, ts) = split_data_key(&slot).unwrap();
        assert!(is_slot_ts(ts));
        assert!(!is_slot_ts(MAX_VERSION_TS));
        // A seek at any real read timestamp starts after the slot.
        assert!(slot < data_key(s, b"a", MAX_VERSION_TS));
    }

    #[test]
    fn reserved_keys_sort_after_every_shard() {
        let (_, end) = shard_range(ShardId(MAX_SHARD_ID));
        assert!(end.as_slice() <= FORMAT_VERSION_KEY);
        assert!(end.as_slice() <= CLUSTER_ID_KEY);
        assert!(end.as_slice() <= HLC_CEILING_KEY);
    }

    #[test]
    fn meta_and_log_keys_round_trip() {
        for kind in MetaKind::ALL {
            let k = raft_meta_key(ShardId(7), kind);
            assert_eq!(decode_raft_meta_key(&k).unwrap(), (ShardId(7), kind));
        }
        let k = raft_log_key(ShardId(3), 42);
        assert_eq!(decode_raft_log_key(&k).unwrap(), (ShardId(3), 42));
        let (s, e) = raft_log_range(ShardId(3));
        assert!(s <= k && k < e);
        let k = intent_key(ShardId(3), b"x\0y");
        assert_eq!(
            decode_intent_key(&k).unwrap(),
            (ShardId(3), b"x\0y".to_vec())
        );
    }

    fn small_key() -> impl Strategy<Value = Vec<u8>> {
        // Bias towards 0x00/0xFF and short keys so escapes and prefixes actually collide.
        proptest::collection::vec(
            prop_oneof![Just(0u8), Just(0xFFu8), Just(1u8), any::<u8>()],
            0..6,
        )
    }

    fn triple() -> impl Strategy<Value = (u64, Vec<u8>, u64)> {
        (
            prop_oneof![0u64..3, Just(MAX_SHARD_ID)],
            small_key(),
            prop_oneof![Just(0u64), Just(u64::MAX), any::<u64>(), 0u64..4],
        )
    }

    proptest! {
        /// encode_bytes preserves byte order and decodes back.
        #[test]
        fn encode_bytes_preserves_order(a in small_key(), b in small_key()) {
            let (ea, eb) = (enc(&a), enc(&b));
            prop_assert_eq!(a.cmp(&b), ea.cmp(&eb));
            let (da, rest) = decode_bytes(&ea).unwrap();
            prop_assert_eq!(da, a.clone());
            prop_assert!(rest.is_empty());
            // Prefix-free: a distinct encoding is never a prefix of another.
            if a != b {
                prop_assert!(!eb.starts_with(&ea));
            }
        }

        /// Data keys order by (shard, user key, newest ts first) and round-trip.
        #[test]
        fn data_key_order_and_round_trip(x in triple(), y in triple()) {
            let kx = data_key(ShardId(x.0), &x.1, Timestamp(x.2));
            let ky = data_key(ShardId(y.0), &y.1, Timestamp(y.2));
            let ox = (x.0, x.1.clone(), Reverse(x.2));
            let oy = (y.0, y.1.clone(), Reverse(y.2));
            prop_assert_eq!(ox.cmp(&oy), kx.cmp(&ky));
            prop_assert_eq!(decode_data_key(&kx).unwrap(), (ShardId(x.0), x.1.clone(), Timestamp(x.2)));
            let (prefix, ts) = split_data_key(&kx).unwrap();
            let seek = data_key_seek(ShardId(x.0), &x.1);
            prop_assert_eq!(prefix, seek.as_slice());
            prop_assert_eq!(ts, Timestamp(x.2));
            // The version range of x's key holds kx and holds ky iff ky is a version of x's key.
            let (vs, ve) = data_key_versions_range(ShardId(x.0), &x.1);
            prop_assert!(vs <= kx && kx < ve);
            prop_assert_eq!(vs <= ky && ky < ve, x.0 == y.0 && x.1 == y.1);
            // The shard range holds exactly the shard's keys.
            let (ss, se) = shard_data_range(ShardId(x.0));
            prop_assert!(ss <= kx && kx < se);
            prop_assert_eq!(ss <= ky && ky < se, x.0 == y.0);
        }

        /// Decoding arbitrary bytes never panics.
        #[test]
        fn decoders_never_panic(raw in proptest::collection::vec(any::<u8>(), 0..40)) {
            let _ = decode_data_key(&raw);
            let _ = decode_raft_log_key(&raw);
            let _ = decode_raft_meta_key(&raw);
            let _ = decode_intent_key(&raw);
            let _ = split_data_key(&raw);
        }
    }
}
