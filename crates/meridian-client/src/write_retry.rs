//! Retrying writes without applying them twice, and saying so when the outcome is unknown.
//!
//! Every write call gets a [`WriteId`] — the client's random `client_id` and a fresh `seq` —
//! sent unchanged on every attempt of that call. The shard remembers applied ids (server side:
//! `meridian-raft`'s dedup table), so a retry of a write that already committed is answered with
//! the original commit timestamp instead of being applied again. That makes retrying after any
//! failure safe, including the failures after which the write may have committed: a transport
//! error or timeout after the request left, or an `AMBIGUOUS` answer (the leader changed after
//! appending the entry).
//!
//! # When the client gives up
//! The shard remembers an id for `DEDUP_WINDOW_MS`; the client sends no attempt later than
//! [`MAX_WRITE_RETRY_MS`] after the first, so every retry lands inside the window. When the call
//! ends in failure (deadline, attempts, retry horizon) after an attempt that may have reached
//! Raft, the caller gets [`Error::Ambiguous`] — "outcome unknown" — never a plain error: the
//! write may be visible to other readers.
//!
//! [`MAX_WRITE_RETRY_MS`]: meridian_types::limits::MAX_WRITE_RETRY_MS

use crate::error::Error;
use meridian_proto::kv::WriteId;
use meridian_types::limits::MAX_WRITE_RETRY_MS;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Hands out write ids for one client instance.
#[derive(Debug)]
pub(crate) struct WriteIds {
    client_id: u64,
    next_seq: AtomicU64,
}

impl WriteIds {
    /// `client_id` must be random (two clients sharing one would deduplicate each other's
    /// writes); zero means "no id" on the wire, so it is replaced.
    pub(crate) fn new(client_id: u64) -> WriteIds {
        WriteIds {
            client_id: client_id.max(1),
            next_seq: AtomicU64::new(1),
        }
    }

    pub(crate) fn next(&self) -> WriteId {
        WriteId {
            client_id: self.client_id,
            seq: self.next_seq.fetch_add(1, Ordering::Relaxed),
        }
    }
}

/// What one write call's attempts have shown so far.
#[derive(Debug)]
pub(crate) struct WriteAttempts {
    first_sent: Option<Instant>,
    maybe_applied: bool,
    retry_horizon: Duration,
}

impl WriteAttempts {
    pub(crate) fn new() -> WriteAttempts {
        WriteAttempts {
            first_sent: None,
            maybe_applied: false,
            retry_horizon: Duration::from_millis(MAX_WRITE_RETRY_MS),
        }
    }

    /// Whether another attempt may still be sent (inside the shard's dedup window).
    pub(crate) fn may_send(&self) -> bool {
        self.first_sent
            .is_none_or(|first| first.elapsed() < self.retry_horizon)
    }

    /// Records that an attempt is about to leave.
    pub(crate) fn sending(&mut self) {
        self.first_sent.get_or_insert_with(Instant::now);
    }

    /// Records an attempt's failure: did the write possibly reach the shard's log?
    pub(crate) fn failed(&mut self, error: &Error) {
        if may_have_reached_raft(error) {
            self.maybe_applied = true;
        }
    }

    /// The error the caller sees when the call gives up with `error`.
    pub(crate) fn settle(&self, error: Error) -> Error {
        if !self.maybe_applied || matches!(error, Error::Ambiguous { .. }) {
            return error;
        }
        Error::Ambiguous {
            message: format!("the write may or may not have taken effect; {error}"),
        }
    }
}

/// Failures after which the write may have been appended to the shard's log. Everything else
/// the server answers (`NOT_LEADER`, `WRONG_SHARD`, `UNAVAILABLE`, `INVALID_ARGUMENT`,
/// `CLOCK_OFFSET`) is given before proposing.
fn may_have_reached_raft(error: &Error) -> bool {
    matches!(error, Error::Transport { .. } | Error::Ambiguous { .. })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_unique_per_call_and_never_zero() {
        let ids = WriteIds::new(0);
        let (a, b) = (ids.next(), ids.next());
        assert_ne!(a.client_id, 0);
        assert_eq!(a.client_id, b.client_id);
        assert_ne!(a.seq, b.seq);
    }

    #[test]
    fn a_failure_after_a_possible_commit_is_reported_as_ambiguous() {
        let mut attempts = WriteAttempts::new();
        attempts.sending();
        attempts.failed(&Error::Transport {
            address: "n1".into(),
            message: "reset".into(),
        });
        // A later definite "not proposed" answer does not make the first attempt's fate known.
        let last = Error::NotLeader {
            message: "no".into(),
            leader: None,
        };
        attempts.failed(&last);
        let settled = attempts.settle(Error::DeadlineExceeded {
            elapsed_ms: 5,
            attempts: 2,
            last: Some(Box::new(last)),
        });
        assert!(matches!(settled, Error::Ambiguous { .. }), "{settled}");
        assert!(settled.to_string().contains("outcome unknown"), "{settled}");
    }

    #[test]
    fn a_write_that_never_reached_raft_keeps_its_error() {
        let mut attempts = WriteAttempts::new();
        attempts.sending();
        let error = Error::Unavailable {
            message: "node overloaded".into(),
        };
        attempts.failed(&error);
        assert_eq!(attempts.settle(error.clone()), error);
    }

    #[test]
    fn no_attempt_is_sent_after_the_retry_horizon() {
        let mut attempts = WriteAttempts::new();
        attempts.retry_horizon = Duration::from_millis(0);
        assert!(attempts.may_send(), "the first attempt always goes");
        attempts.sending();
        assert!(!attempts.may_send());
    }
}
