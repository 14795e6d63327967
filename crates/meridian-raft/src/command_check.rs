//! The checks apply runs on every command before it touches anything, and the limits on a
//! transaction's reads and writes that the `Kv` service shares with it.
//!
//! # Commands are checked twice
//! The `Kv` service validates a request before proposing it, but a log entry can also come
//! from a peer (a leader) this node does not control, and a committed entry is re-applied on
//! every restart. So apply re-checks every command with [`Command::validate`], a pure function
//! of the command alone: every replica reaches the same verdict, and a bad command is applied
//! as a deterministic rejection (it advances the applied index and writes nothing), never as a
//! panic that would repeat on every replay.

use crate::command::{Command, Expect, RangeCheck, ReadCheck, MAX_COMMAND_TS, MAX_PROPOSAL_BATCH};
use bytes::Bytes;
use meridian_types::limits::{
    MAX_BATCH_BYTES, MAX_BATCH_KEYS, MAX_KEY_BYTES, MAX_TXN_PARTICIPANTS, MAX_TXN_RANGES,
    MAX_TXN_READ_KEYS, MAX_VALUE_BYTES,
};

impl Command {
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

#[cfg(test)]
mod tests {
    use super::*;

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
