//! Versioned writes: [`put`] and [`delete`] add a version and overwrite the key's
//! latest-version slot with a copy of it, in the same `WriteBatch`.

use super::encoding::{encode_put, encode_slot, VersionValue};
use crate::engine::{Cf, WriteBatch};
use crate::keys::{self, Keyspace};
use meridian_types::Timestamp;

/// Adds the version `raw` of `key` at `ts` and overwrites the key's slot with a copy of it.
fn write_version(batch: &mut WriteBatch, space: Keyspace, key: &[u8], ts: Timestamp, raw: Vec<u8>) {
    assert!(
        ts <= keys::MAX_VERSION_TS,
        "version timestamp {} is Timestamp::MAX, reserved for the latest-version slot",
        ts.0
    );
    let slot = encode_slot(ts, &raw);
    batch.put(Cf::Data, keys::data_key(space, key, ts), raw);
    batch.put(Cf::Data, keys::data_slot_key(space, key), slot);
}

/// Adds a version of `key` holding `value` at `ts` to `batch`, and overwrites the key's
/// latest-version slot with `ts` and a copy of `value` in the same batch (so `value` is
/// written twice; see the module docs).
///
/// Preconditions (see the module docs): per key, writes are applied in non-decreasing
/// timestamp order, so `ts` is the key's newest version once the batch is applied;
/// `ts < Timestamp::MAX` (panics otherwise: `MAX` is the slot's key). The empty key is a key
/// like any other here (the API refuses it).
pub fn put(
    batch: &mut WriteBatch,
    space: impl Into<Keyspace>,
    key: &[u8],
    ts: Timestamp,
    value: &[u8],
) {
    write_version(batch, space.into(), key, ts, encode_put(value));
}

/// Adds a tombstone version of `key` at `ts` to `batch`, and overwrites the key's
/// latest-version slot with `ts` and a tombstone in the same batch. Same preconditions as
/// [`put`].
pub fn delete(batch: &mut WriteBatch, space: impl Into<Keyspace>, key: &[u8], ts: Timestamp) {
    write_version(
        batch,
        space.into(),
        key,
        ts,
        VersionValue::Tombstone.encode(),
    );
}
