//! Tests of the key encodings (`keys`): layouts, order, round trips, and that the keyspaces
//! never meet.

use super::*;
use proptest::prelude::*;
use std::cmp::Reverse;

const U: Keyspace = Keyspace::User;

proptest! {
    /// Whatever the user key, its data keys stay in its keyspace and never meet the
    /// shard-local keys or the other keyspace.
    #[test]
    fn keyspaces_and_the_local_region_never_meet(key in proptest::collection::vec(any::<u8>(), 0..24), ts in any::<u64>(), shard in 0u64..1_000) {
        let (ls, le) = shard_local_range(ShardId(shard));
        for space in [Keyspace::System, Keyspace::User] {
            let (ss, se) = space.range();
            for k in [data_key(space, &key, Timestamp(ts)), data_slot_key(space, &key), data_key_seek(space, &key)] {
                prop_assert!(k < ls || k >= le, "{k:?}");
                prop_assert!(ss <= k && k < se, "{k:?}");
            }
        }
        for k in [txn_key(ShardId(shard), TxnKeyKind::Locks, ts, 1), gc_threshold_key(ShardId(shard))] {
            prop_assert!(ls <= k && k < le);
            prop_assert!(k < Keyspace::System.range().0);
        }
    }

    /// A span's data range holds exactly the versions and slots of the span's keys.
    #[test]
    fn a_span_holds_exactly_its_keys(
        bounds in (small_key(), small_key()),
        open_start in any::<bool>(),
        open_end in any::<bool>(),
        key in small_key(),
        ts in any::<u64>(),
    ) {
        let (mut a, mut b) = bounds;
        if a > b { std::mem::swap(&mut a, &mut b); }
        let span = Span {
            space: U,
            start: if open_start { Vec::new() } else { a },
            end: if open_end { Vec::new() } else { b },
        };
        let (start, end) = span.data_range();
        for k in [data_key(U, &key, Timestamp(ts)), data_slot_key(U, &key)] {
            prop_assert_eq!(start <= k && k < end, span.contains(&key), "{:?} {:?}", span, key);
            let other = data_key(Keyspace::System, &key, Timestamp(ts));
            prop_assert!(!(start <= other && other < end));
        }
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
        let (rs, re) = shard_local_range(shard);
        assert!(k >= rs && k < re);
        let (_, other_end) = shard_local_range(ShardId(3));
        assert!(k >= other_end);
    }
    assert!(decode_txn_key(&data_key_seek(U, b"a")).is_err());
    assert!(decode_txn_key(&gc_threshold_key(shard)).is_err());
}

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
    assert!(decode_data_key(&[]).is_err());
    assert!(decode_data_key(&[3, 0]).is_err());
    assert!(decode_data_key(&data_key(U, b"k", Timestamp(5))[..6]).is_err());
    let mut foreign = data_key(U, b"k", Timestamp(5));
    foreign[0] = SHARD_LOCAL_PREFIX;
    assert!(decode_data_key(&foreign).is_err(), "not a keyspace");
    assert!(decode_raft_log_key(&[0; 15]).is_err());
    assert!(decode_raft_meta_key(&[0; 10]).is_err());
    assert!(decode_raft_meta_key(&[0, 0, 0, 0, 0, 0, 0, 1, 99]).is_err());
    assert!(decode_raft_meta_key(FORMAT_VERSION_KEY).is_err());
    assert!(decode_version_prefix(&[3, b'k', 0, 0, 9]).is_err());
    assert_eq!(
        decode_version_prefix(&data_key_seek(U, b"k")).unwrap(),
        b"k"
    );
}

/// A slot sorts before every version of its key, after every entry of smaller keys, and
/// lies inside the key's versions range.
#[test]
fn slot_key_sorts_first_among_its_versions() {
    let slot = data_slot_key(U, b"a");
    assert_eq!(slot, data_key(U, b"a", SLOT_TS));
    assert!(slot.ends_with(&[0u8; 8]));
    for ts in [0, 1, 30, MAX_VERSION_TS.0] {
        assert!(slot < data_key(U, b"a", Timestamp(ts)));
        assert!(data_key(U, b"", Timestamp(ts)) < slot);
        assert!(data_key(U, b"a", Timestamp(ts)) < data_slot_key(U, b"a\0"));
    }
    let (vs, ve) = data_key_versions_range(U, b"a");
    assert!(vs <= slot && slot < ve);
    let (_, ts) = split_data_key(&slot).unwrap();
    assert!(is_slot_ts(ts));
    assert!(!is_slot_ts(MAX_VERSION_TS));
    // A seek at any real read timestamp starts after the slot.
    assert!(slot < data_key(U, b"a", MAX_VERSION_TS));
}

#[test]
fn the_metadata_shard_has_the_system_keyspace() {
    assert_eq!(Keyspace::from(ShardId::META), Keyspace::System);
    assert_eq!(Keyspace::from(ShardId(1)), Keyspace::User);
    assert_ne!(
        data_key(ShardId::META, b"node/1", Timestamp(1)),
        data_key(ShardId(1), b"node/1", Timestamp(1))
    );
}

#[test]
fn reserved_keys_sort_after_every_shard() {
    let (_, end) = shard_range(ShardId(MAX_SHARD_ID));
    assert!(end.as_slice() <= FORMAT_VERSION_KEY);
    assert!(end.as_slice() <= CLUSTER_ID_KEY);
    assert!(end.as_slice() <= SHARD_MAP_CACHE_KEY);
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
}

fn small_key() -> impl Strategy<Value = Vec<u8>> {
    // Bias towards 0x00/0xFF and short keys so escapes and prefixes actually collide.
    proptest::collection::vec(
        prop_oneof![Just(0u8), Just(0xFFu8), Just(1u8), any::<u8>()],
        0..6,
    )
}

fn space() -> impl Strategy<Value = Keyspace> {
    prop_oneof![Just(Keyspace::System), Just(Keyspace::User)]
}

fn triple() -> impl Strategy<Value = (Keyspace, Vec<u8>, u64)> {
    (
        space(),
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

    /// Data keys order by (keyspace, user key, newest ts first) and round-trip.
    #[test]
    fn data_key_order_and_round_trip(x in triple(), y in triple()) {
        let kx = data_key(x.0, &x.1, Timestamp(x.2));
        let ky = data_key(y.0, &y.1, Timestamp(y.2));
        let ox = (x.0, x.1.clone(), Reverse(x.2));
        let oy = (y.0, y.1.clone(), Reverse(y.2));
        prop_assert_eq!(ox.cmp(&oy), kx.cmp(&ky));
        prop_assert_eq!(decode_data_key(&kx).unwrap(), (x.0, x.1.clone(), Timestamp(x.2)));
        let (prefix, ts) = split_data_key(&kx).unwrap();
        let seek = data_key_seek(x.0, &x.1);
        prop_assert_eq!(prefix, seek.as_slice());
        prop_assert_eq!(decode_version_prefix(prefix).unwrap(), x.1.clone());
        prop_assert_eq!(ts, Timestamp(x.2));
        // The version range of x's key holds kx and holds ky iff ky is a version of x's key.
        let (vs, ve) = data_key_versions_range(x.0, &x.1);
        prop_assert!(vs <= kx && kx < ve);
        prop_assert_eq!(vs <= ky && ky < ve, x.0 == y.0 && x.1 == y.1);
        // The keyspace's range holds exactly its keys.
        let (ss, se) = x.0.range();
        prop_assert!(ss <= kx && kx < se);
        prop_assert_eq!(ss <= ky && ky < se, x.0 == y.0);
    }

    /// Decoding arbitrary bytes never panics.
    #[test]
    fn decoders_never_panic(raw in proptest::collection::vec(any::<u8>(), 0..40)) {
        let _ = decode_data_key(&raw);
        let _ = decode_raft_log_key(&raw);
        let _ = decode_raft_meta_key(&raw);
        let _ = decode_txn_key(&raw);
        let _ = decode_version_prefix(&raw);
        let _ = split_data_key(&raw);
    }
}
