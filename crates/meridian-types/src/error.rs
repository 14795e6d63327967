//! Stable error codes shared by server and client. The server maps each crate's error to one
//! code in one place (`meridian-server::status`); the code travels in the gRPC status details
//! header `meridian-code` so the client can classify errors without parsing messages.

use std::fmt;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    /// The request is malformed or over a limit. Never retryable.
    InvalidArgument,
    /// This node is not the shard's leader; the status carries a leader hint. Retryable.
    NotLeader,
    /// The key is not in this shard's range, or the shard is unknown here. Retryable after a
    /// shard map refresh.
    WrongShard,
    /// The shard has no quorum or is overloaded right now. Retryable with backoff.
    Unavailable,
    /// A clock offset beyond `max_offset` was detected. Not retryable by the client.
    ClockOffset,
    /// The deadline passed before the operation finished. Outcome unknown for writes.
    DeadlineExceeded,
    /// A storage or internal failure. Not retryable.
    Internal,
    /// A write may or may not have taken effect: it reached Raft, and then the answer was lost
    /// (leader change that discarded the entry, node stopping, deadline). The server answers it
    /// only when it cannot know; the client retries such a write with the same request id,
    /// which the shard deduplicates, and reports it to the caller only when retrying cannot
    /// settle the outcome. Never reported for reads.
    Ambiguous,
    /// Another transaction's prepared lock is in the way; nothing was done. The status carries
    /// the lock (`LOCK_HEADER`). Retryable once the lock is resolved.
    Locked,
    /// A read at a timestamp below the shard's GC threshold: the versions it would need may
    /// have been garbage-collected (`cluster.gc_ttl_ms` of history is kept). Nothing was read.
    /// Not retryable at that timestamp: a transaction that runs longer than the GC TTL must
    /// start again.
    BelowGcThreshold,
}

impl ErrorCode {
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::InvalidArgument => "INVALID_ARGUMENT",
            ErrorCode::NotLeader => "NOT_LEADER",
            ErrorCode::WrongShard => "WRONG_SHARD",
            ErrorCode::Unavailable => "UNAVAILABLE",
            ErrorCode::ClockOffset => "CLOCK_OFFSET",
            ErrorCode::DeadlineExceeded => "DEADLINE_EXCEEDED",
            ErrorCode::Internal => "INTERNAL",
            ErrorCode::Ambiguous => "AMBIGUOUS",
            ErrorCode::Locked => "LOCKED",
            ErrorCode::BelowGcThreshold => "BELOW_GC_THRESHOLD",
        }
    }

    pub fn parse(s: &str) -> Option<ErrorCode> {
        Some(match s {
            "INVALID_ARGUMENT" => ErrorCode::InvalidArgument,
            "NOT_LEADER" => ErrorCode::NotLeader,
            "WRONG_SHARD" => ErrorCode::WrongShard,
            "UNAVAILABLE" => ErrorCode::Unavailable,
            "CLOCK_OFFSET" => ErrorCode::ClockOffset,
            "DEADLINE_EXCEEDED" => ErrorCode::DeadlineExceeded,
            "INTERNAL" => ErrorCode::Internal,
            "AMBIGUOUS" => ErrorCode::Ambiguous,
            "LOCKED" => ErrorCode::Locked,
            "BELOW_GC_THRESHOLD" => ErrorCode::BelowGcThreshold,
            _ => return None,
        })
    }

    /// Whether a client may retry the same request (after refreshing routing where relevant).
    pub fn is_retryable(self) -> bool {
        matches!(
            self,
            ErrorCode::NotLeader | ErrorCode::WrongShard | ErrorCode::Unavailable
        )
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// gRPC metadata key carrying the [`ErrorCode`] of a failed call.
pub const ERROR_CODE_HEADER: &str = "meridian-code";
/// gRPC metadata key carrying a leader hint (`node_id@address`) with `NOT_LEADER`.
pub const LEADER_HINT_HEADER: &str = "meridian-leader";
/// gRPC metadata key carrying the sender's HLC timestamp (decimal u64) on internal RPCs.
pub const HLC_HEADER: &str = "meridian-hlc";
/// gRPC binary metadata key carrying the prost-encoded `LockInfo` with `LOCKED`.
pub const LOCK_HEADER: &str = "meridian-lock-bin";
