//! The value encoding of `Cf::Data` (see "Value encoding" in `mvcc`'s docs): a version's
//! value (a Put or a tombstone) and a latest-version slot's value (the newest version's
//! timestamp and a copy of its encoding), with the decoders that tell them apart.

use crate::error::{Error, Result};
use crate::keys;
use meridian_types::Timestamp;

const TAG_PUT: u8 = 1;
pub(super) const TAG_TOMBSTONE: u8 = 2;
/// The format-2 slot tag (timestamp only). Never written; rejected with a clear message.
pub(super) const TAG_SLOT_V2: u8 = 3;
pub(super) const TAG_LATEST: u8 = 4;
/// `TAG_LATEST ‖ ts u64 BE`, before the version's own encoding.
pub(super) const SLOT_HEADER_BYTES: usize = 9;

/// The value of one version.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum VersionValue {
    Put(Vec<u8>),
    Tombstone,
}

impl VersionValue {
    pub fn encode(&self) -> Vec<u8> {
        match self {
            VersionValue::Put(v) => encode_put(v),
            VersionValue::Tombstone => vec![TAG_TOMBSTONE],
        }
    }

    pub fn decode(raw: &[u8]) -> Result<VersionValue> {
        Ok(match decode_version_ref(raw)? {
            Some(value) => VersionValue::Put(value.to_vec()),
            None => VersionValue::Tombstone,
        })
    }
}

/// Decodes a version's encoding without copying: `Some(value)` for a Put, `None` for a
/// tombstone.
pub(crate) fn decode_version_ref(raw: &[u8]) -> Result<Option<&[u8]>> {
    match raw.split_first() {
        Some((&TAG_PUT, value)) => Ok(Some(value)),
        Some((&TAG_TOMBSTONE, [])) => Ok(None),
        Some((&TAG_TOMBSTONE, rest)) => Err(Error::corrupt(
            "version value",
            format!("tombstone with {} trailing bytes", rest.len()),
        )),
        Some((&TAG_LATEST | &TAG_SLOT_V2, _)) => Err(Error::corrupt(
            "version value",
            "latest-version slot value under a version key",
        )),
        Some((tag, _)) => Err(Error::corrupt(
            "version value",
            format!("unknown tag {tag}"),
        )),
        None => Err(Error::corrupt("version value", "empty")),
    }
}

pub(super) fn encode_put(value: &[u8]) -> Vec<u8> {
    let mut raw = Vec::with_capacity(1 + value.len());
    raw.push(TAG_PUT);
    raw.extend_from_slice(value);
    raw
}

/// The value of a latest-version slot: `newest` and a copy of that version's encoding.
pub(super) fn encode_slot(newest: Timestamp, version: &[u8]) -> Vec<u8> {
    let mut raw = Vec::with_capacity(SLOT_HEADER_BYTES + version.len());
    raw.push(TAG_LATEST);
    raw.extend_from_slice(&newest.0.to_be_bytes());
    raw.extend_from_slice(version);
    raw
}

/// Splits a latest-version slot value into the newest version's timestamp and its encoding
/// (checked: a Put or a tombstone), without copying the value.
pub(crate) fn split_slot(raw: &[u8]) -> Result<(Timestamp, Option<&[u8]>)> {
    const WHAT: &str = "latest-version slot";
    match raw.split_first() {
        Some((&TAG_LATEST, rest)) => {
            if rest.len() < SLOT_HEADER_BYTES {
                return Err(Error::corrupt(
                    WHAT,
                    format!(
                        "{} bytes, want at least {}",
                        raw.len(),
                        SLOT_HEADER_BYTES + 1
                    ),
                ));
            }
            let (ts, version) = rest.split_at(8);
            let mut be = [0u8; 8];
            be.copy_from_slice(ts);
            let ts = Timestamp(u64::from_be_bytes(be));
            if keys::is_slot_ts(ts) {
                return Err(Error::corrupt(
                    WHAT,
                    "names Timestamp::MAX, which no version may carry",
                ));
            }
            Ok((ts, decode_version_ref(version)?))
        }
        Some((&TAG_SLOT_V2, _)) => Err(Error::corrupt(
            WHAT,
            "tag 3 is the format-2 slot (timestamp only); this build reads format 3",
        )),
        Some((tag, _)) => Err(Error::corrupt(
            WHAT,
            format!("tag {tag}, want {TAG_LATEST}"),
        )),
        None => Err(Error::corrupt(WHAT, "empty")),
    }
}

/// Decodes a latest-version slot value into the newest version's timestamp and value.
pub fn decode_slot(raw: &[u8]) -> Result<(Timestamp, VersionValue)> {
    let (ts, value) = split_slot(raw)?;
    let value = match value {
        Some(v) => VersionValue::Put(v.to_vec()),
        None => VersionValue::Tombstone,
    };
    Ok((ts, value))
}
