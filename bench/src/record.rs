//! The one value encoding every driver uses for a YCSB record.
//!
//! A YCSB record is a key with `fieldcount` named fields (`field0` … `field9` by default). All
//! drivers store a record as ONE key whose value holds every field, so the same workload costs
//! the same number of storage operations on Meridian, etcd and RocksDB:
//!
//! ```text
//! u16 field_count
//! repeated field_count times:
//!     u16 name_len | name (UTF-8, name_len bytes) | u32 value_len | value (value_len bytes)
//! ```
//!
//! All integers are big-endian. Fields are written in name order (the record is a sorted map),
//! so equal records encode to equal bytes.
//!
//! Invariants checked on both encode and decode: at most [`MAX_RECORD_BYTES`] in total, names at
//! most `u16::MAX` bytes of valid UTF-8, no duplicate names, no bytes after the last field.
//! Decoding never panics on malformed input; it returns a [`RecordError`].

use std::collections::BTreeMap;

/// Largest encoded record accepted or produced (the default YCSB record is about 1.1 KB; etcd
/// refuses requests over 1.5 MiB).
pub const MAX_RECORD_BYTES: usize = 1024 * 1024;

/// Errors encoding or decoding a record.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RecordError {
    #[error("record truncated: needed {needed_bytes} bytes at offset {offset} of {total_bytes}")]
    Truncated {
        offset: usize,
        needed_bytes: usize,
        total_bytes: usize,
    },
    #[error("record is {size_bytes} bytes, over the limit of {MAX_RECORD_BYTES}")]
    TooLarge { size_bytes: usize },
    #[error("record has {count} fields, more than a u16 can count")]
    TooManyFields { count: usize },
    #[error("field name of {len_bytes} bytes is longer than a u16 can count")]
    NameTooLong { len_bytes: usize },
    #[error("field name at offset {offset} is not valid UTF-8")]
    NameNotUtf8 { offset: usize },
    #[error("field {name:?} appears twice")]
    DuplicateField { name: String },
    #[error("{extra_bytes} bytes follow the last field")]
    TrailingBytes { extra_bytes: usize },
}

/// A YCSB record: field name to value.
pub type Record = BTreeMap<String, Vec<u8>>;

/// Encodes a record; fails only when it breaks a limit.
pub fn encode(record: &Record) -> Result<Vec<u8>, RecordError> {
    let count = u16::try_from(record.len()).map_err(|_| RecordError::TooManyFields {
        count: record.len(),
    })?;
    let size_bytes = 2 + record
        .iter()
        .map(|(name, value)| 2 + name.len() + 4 + value.len())
        .sum::<usize>();
    if size_bytes > MAX_RECORD_BYTES {
        return Err(RecordError::TooLarge { size_bytes });
    }
    let mut out = Vec::with_capacity(size_bytes);
    out.extend_from_slice(&count.to_be_bytes());
    for (name, value) in record {
        let name_len = u16::try_from(name.len()).map_err(|_| RecordError::NameTooLong {
            len_bytes: name.len(),
        })?;
        // value.len() <= MAX_RECORD_BYTES, which fits a u32.
        let value_len = u32::try_from(value.len()).map_err(|_| RecordError::TooLarge {
            size_bytes: value.len(),
        })?;
        out.extend_from_slice(&name_len.to_be_bytes());
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(&value_len.to_be_bytes());
        out.extend_from_slice(value);
    }
    debug_assert_eq!(out.len(), size_bytes);
    Ok(out)
}

/// Decodes a record, keeping only the fields in `wanted` when it is given.
pub fn decode(bytes: &[u8], wanted: Option<&[String]>) -> Result<Record, RecordError> {
    if bytes.len() > MAX_RECORD_BYTES {
        return Err(RecordError::TooLarge {
            size_bytes: bytes.len(),
        });
    }
    let mut reader = Reader { bytes, offset: 0 };
    let count = u16::from_be_bytes(reader.take_array()?);
    let mut record = Record::new();
    for _ in 0..count {
        let name_len = usize::from(u16::from_be_bytes(reader.take_array()?));
        let name_offset = reader.offset;
        let name = std::str::from_utf8(reader.take(name_len)?)
            .map_err(|_| RecordError::NameNotUtf8 {
                offset: name_offset,
            })?
            .to_string();
        let value_len = u32::from_be_bytes(reader.take_array()?) as usize;
        let value = reader.take(value_len)?;
        if record.contains_key(&name) {
            return Err(RecordError::DuplicateField { name });
        }
        // Unwanted fields are kept with an empty value until the end so duplicates are still
        // caught, then dropped.
        let keep = wanted.is_none_or(|fields| fields.contains(&name));
        record.insert(name, if keep { value.to_vec() } else { Vec::new() });
    }
    if reader.offset != bytes.len() {
        return Err(RecordError::TrailingBytes {
            extra_bytes: bytes.len() - reader.offset,
        });
    }
    if let Some(fields) = wanted {
        record.retain(|name, _| fields.contains(name));
    }
    Ok(record)
}

/// Merges `changes` into the encoded record `current` (an update: changed fields replaced, the
/// others kept) and returns the new encoding.
pub fn merge_encoded(current: &[u8], changes: &Record) -> Result<Vec<u8>, RecordError> {
    let mut record = decode(current, None)?;
    for (name, value) in changes {
        record.insert(name.clone(), value.clone());
    }
    encode(&record)
}

struct Reader<'a> {
    bytes: &'a [u8],
    offset: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, len: usize) -> Result<&'a [u8], RecordError> {
        let end = self
            .offset
            .checked_add(len)
            .filter(|end| *end <= self.bytes.len())
            .ok_or(RecordError::Truncated {
                offset: self.offset,
                needed_bytes: len,
                total_bytes: self.bytes.len(),
            })?;
        let slice = &self.bytes[self.offset..end];
        self.offset = end;
        Ok(slice)
    }

    fn take_array<const N: usize>(&mut self) -> Result<[u8; N], RecordError> {
        let slice = self.take(N)?;
        let mut array = [0u8; N];
        array.copy_from_slice(slice);
        Ok(array)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample() -> Record {
        let mut record = Record::new();
        for index in 0..10 {
            record.insert(format!("field{index}"), vec![b'a' + index as u8; 100]);
        }
        record
    }

    /// A ten-field record round-trips and has the documented size.
    #[test]
    fn round_trips_ycsb_record() {
        let record = sample();
        let bytes = encode(&record).expect("encodes");
        assert_eq!(bytes.len(), 2 + 10 * (2 + 6 + 4 + 100));
        assert_eq!(decode(&bytes, None).expect("decodes"), record);
    }

    /// Every strict prefix of an encoding is refused as truncated, never a panic.
    #[test]
    fn truncated_input_errors() {
        let bytes = encode(&sample()).expect("encodes");
        for len in 0..bytes.len() {
            let error = decode(&bytes[..len], None).expect_err("prefix must fail");
            assert!(
                matches!(error, RecordError::Truncated { .. }),
                "len {len}: {error:?}"
            );
        }
    }

    /// Trailing bytes, duplicate names and bad UTF-8 are errors.
    #[test]
    fn malformed_input_errors() {
        let mut bytes = encode(&sample()).expect("encodes");
        bytes.push(0);
        assert_eq!(
            decode(&bytes, None),
            Err(RecordError::TrailingBytes { extra_bytes: 1 })
        );
        let duplicate = [0, 2, 0, 1, b'a', 0, 0, 0, 0, 0, 1, b'a', 0, 0, 0, 0];
        assert!(matches!(
            decode(&duplicate, None),
            Err(RecordError::DuplicateField { .. })
        ));
        let bad_name = [0, 1, 0, 1, 0xff, 0, 0, 0, 0];
        assert!(matches!(
            decode(&bad_name, None),
            Err(RecordError::NameNotUtf8 { .. })
        ));
    }

    /// Oversized records are refused on encode.
    #[test]
    fn oversized_record_is_refused() {
        let mut record = Record::new();
        record.insert("field0".into(), vec![0; MAX_RECORD_BYTES]);
        assert!(matches!(encode(&record), Err(RecordError::TooLarge { .. })));
    }

    /// Field projection and merging keep the other fields.
    #[test]
    fn projection_and_merge() {
        let bytes = encode(&sample()).expect("encodes");
        let wanted = vec!["field3".to_string(), "missing".to_string()];
        let projected = decode(&bytes, Some(&wanted)).expect("decodes");
        assert_eq!(projected.len(), 1);
        assert_eq!(projected["field3"], vec![b'd'; 100]);
        let mut changes = Record::new();
        changes.insert("field3".into(), b"new".to_vec());
        let merged = decode(&merge_encoded(&bytes, &changes).expect("merges"), None).expect("ok");
        assert_eq!(merged.len(), 10);
        assert_eq!(merged["field3"], b"new".to_vec());
        assert_eq!(merged["field4"], vec![b'e'; 100]);
    }

    proptest! {
        /// Arbitrary records round-trip.
        #[test]
        fn arbitrary_records_round_trip(
            record in proptest::collection::btree_map(".{0,20}", proptest::collection::vec(any::<u8>(), 0..200), 0..20)
        ) {
            let bytes = encode(&record).expect("within limits");
            prop_assert_eq!(decode(&bytes, None).expect("decodes"), record);
        }

        /// Arbitrary bytes never make the decoder panic.
        #[test]
        fn arbitrary_bytes_do_not_panic(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            let _ = decode(&bytes, None);
        }
    }
}
