//! Client-side input checks against `meridian_types::limits`.
//!
//! The server checks the same limits (it must: not every client is this one); checking here
//! too turns a doomed round trip into an immediate [`Error::InvalidArgument`] whose message
//! names the limit.

use crate::error::{Error, Result};
use meridian_types::limits::{
    MAX_BATCH_BYTES, MAX_BATCH_KEYS, MAX_KEY_BYTES, MAX_SCAN_LIMIT, MAX_VALUE_BYTES,
};

pub(crate) fn key(key: &[u8]) -> Result<()> {
    if key.is_empty() {
        return Err(Error::invalid("key must not be empty"));
    }
    if key.len() > MAX_KEY_BYTES {
        return Err(Error::invalid(format!(
            "key is {} bytes, over MAX_KEY_BYTES ({MAX_KEY_BYTES})",
            key.len()
        )));
    }
    Ok(())
}

pub(crate) fn value(value: &[u8]) -> Result<()> {
    if value.len() > MAX_VALUE_BYTES {
        return Err(Error::invalid(format!(
            "value is {} bytes, over MAX_VALUE_BYTES ({MAX_VALUE_BYTES})",
            value.len()
        )));
    }
    Ok(())
}

pub(crate) fn batch_len(len: usize) -> Result<()> {
    if len > MAX_BATCH_KEYS {
        return Err(Error::invalid(format!(
            "batch has {len} keys, over MAX_BATCH_KEYS ({MAX_BATCH_KEYS})"
        )));
    }
    Ok(())
}

pub(crate) fn batch_bytes(bytes: usize) -> Result<()> {
    if bytes > MAX_BATCH_BYTES {
        return Err(Error::invalid(format!(
            "batch carries {bytes} bytes of keys and values, over MAX_BATCH_BYTES ({MAX_BATCH_BYTES})"
        )));
    }
    Ok(())
}

/// `start` may be empty (beginning of the keyspace); `end` `None` or empty is the end.
pub(crate) fn scan(start: &[u8], end: Option<&[u8]>, limit: u32) -> Result<()> {
    if limit == 0 || limit > MAX_SCAN_LIMIT {
        return Err(Error::invalid(format!(
            "scan limit {limit} is outside 1..=MAX_SCAN_LIMIT ({MAX_SCAN_LIMIT})"
        )));
    }
    if start.len() > MAX_KEY_BYTES {
        return Err(Error::invalid(format!(
            "scan start is {} bytes, over MAX_KEY_BYTES ({MAX_KEY_BYTES})",
            start.len()
        )));
    }
    if let Some(end) = end.filter(|e| !e.is_empty()) {
        if end.len() > MAX_KEY_BYTES {
            return Err(Error::invalid(format!(
                "scan end is {} bytes, over MAX_KEY_BYTES ({MAX_KEY_BYTES})",
                end.len()
            )));
        }
        if start > end {
            return Err(Error::invalid("scan range is inverted: start is after end"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each limit is enforced and named in the message.
    #[test]
    fn limits_are_named() {
        assert!(key(b"").unwrap_err().to_string().contains("empty"));
        assert!(key(&vec![b'k'; MAX_KEY_BYTES + 1])
            .unwrap_err()
            .to_string()
            .contains("MAX_KEY_BYTES"));
        assert!(key(&vec![b'k'; MAX_KEY_BYTES]).is_ok());
        assert!(value(&vec![0; MAX_VALUE_BYTES + 1])
            .unwrap_err()
            .to_string()
            .contains("MAX_VALUE_BYTES"));
        assert!(value(b"").is_ok());
        assert!(batch_len(MAX_BATCH_KEYS + 1)
            .unwrap_err()
            .to_string()
            .contains("MAX_BATCH_KEYS"));
        assert!(batch_bytes(MAX_BATCH_BYTES + 1).is_err());
        assert!(scan(b"a", None, 0)
            .unwrap_err()
            .to_string()
            .contains("MAX_SCAN_LIMIT"));
        assert!(scan(b"a", None, MAX_SCAN_LIMIT + 1).is_err());
        assert!(scan(b"b", Some(b"a"), 10)
            .unwrap_err()
            .to_string()
            .contains("inverted"));
        assert!(scan(b"", Some(b""), 10).is_ok());
        assert!(scan(b"a", Some(b"a"), 10).is_ok());
    }
}
