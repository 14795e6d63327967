//! The client's error type and the one place where gRPC statuses become [`Error`]s.
//!
//! The server puts a stable [`ErrorCode`] in the `meridian-code` metadata of every status it
//! returns, and for `NOT_LEADER` a leader hint `"<node_id>@<client_addr>"` in `meridian-leader`.
//! [`Error::from_status`] reads those headers; it never parses human-readable messages, so
//! servers may reword messages freely.
//!
//! A status *without* a `meridian-code` header did not come from Meridian's request handling: it
//! is a transport failure (connection refused or reset, HTTP/2 error, per-attempt timeout) and
//! becomes [`Error::Transport`], which the retry loop treats as "this node may be down".
//!
//! # Invariants
//! - Nothing read from the network is trusted: a malformed hint is dropped, never unwrapped.
//! - [`Error::is_retryable`] is the single classification the retry loop and callers use.

use meridian_types::error::{ERROR_CODE_HEADER, LEADER_HINT_HEADER, LOCK_HEADER};
use meridian_types::ErrorCode;
use std::fmt;

/// Longest leader hint or node address accepted from the network, in bytes.
pub const MAX_ADDRESS_BYTES: usize = 256;

/// Where the server believes a shard's leader is, from a `NOT_LEADER` answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaderHint {
    /// The leader's node id (never 0).
    pub node_id: u64,
    /// The leader's client address (`host:port`).
    pub address: String,
}

impl LeaderHint {
    /// Parses `"<node_id>@<client_addr>"`. Returns `None` for anything malformed: a hint is an
    /// optimisation, so a bad one is ignored rather than reported.
    ///
    /// ```
    /// use meridian_client::LeaderHint;
    /// let hint = LeaderHint::parse("2@127.0.0.1:7002").unwrap();
    /// assert_eq!(hint.node_id, 2);
    /// assert_eq!(hint.address, "127.0.0.1:7002");
    /// assert!(LeaderHint::parse("0@x:1").is_none());
    /// ```
    pub fn parse(text: &str) -> Option<LeaderHint> {
        if text.len() > MAX_ADDRESS_BYTES {
            return None;
        }
        let (id, address) = text.trim().split_once('@')?;
        let node_id: u64 = id.parse().ok()?;
        let address = address.trim();
        if node_id == 0 || address.is_empty() || address.contains(char::is_whitespace) {
            return None;
        }
        Some(LeaderHint {
            node_id,
            address: address.to_string(),
        })
    }
}

impl fmt::Display for LeaderHint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "node {} at {}", self.node_id, self.address)
    }
}

/// Everything a [`crate::Client`] call can fail with.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The request is malformed or over a limit (checked by the client and again by the server).
    /// Never retryable.
    #[error("invalid argument: {message}")]
    InvalidArgument { message: String },

    /// The node asked does not lead the shard. The client follows `leader` when it has one.
    #[error("not the shard leader: {message}{}", leader_suffix(.leader))]
    NotLeader {
        message: String,
        leader: Option<LeaderHint>,
    },

    /// The key is not in the shard the node was asked about: the client's shard map is stale.
    #[error("wrong shard: {message}")]
    WrongShard { message: String },

    /// The shard has no quorum or is overloaded right now; or no replica could be chosen.
    #[error("unavailable: {message}")]
    Unavailable { message: String },

    /// A node detected a clock offset beyond `max_offset`. Not retryable: an operator must fix
    /// the clocks.
    #[error("clock offset: {message}")]
    ClockOffset { message: String },

    /// The call's deadline (`ClientConfig::call_timeout`) passed, or the next retry could not
    /// start before it; `last` is the error of the last attempt, if one was made. For writes
    /// the outcome is unknown.
    #[error("deadline exceeded after {elapsed_ms} ms ({attempts} attempts){}", last_suffix(.last))]
    DeadlineExceeded {
        elapsed_ms: u64,
        attempts: u32,
        last: Option<Box<Error>>,
    },

    /// A storage or internal failure on the server, or a response that breaks the protocol.
    #[error("internal error: {message}")]
    Internal { message: String },

    /// A write's outcome is unknown: an attempt may have reached the shard's Raft log, and the
    /// client could not settle it by retrying (with the same write id, which the shard
    /// deduplicates) before the call's deadline or the retry horizon. The write may be visible
    /// to other readers, or may never be. Read the key to find out. Never returned for reads.
    #[error("outcome unknown: {message}")]
    Ambiguous { message: String },

    /// No Meridian answer from `address`: connection refused or reset, HTTP/2 failure, or no
    /// reply within the attempt's timeout. Retryable (the node may be down).
    #[error("transport error talking to {address}: {message}")]
    Transport { address: String, message: String },

    /// The configuration lists no seed address.
    #[error("no seed addresses configured")]
    NoSeeds,

    /// A transaction's commit found that something it read had changed (`key`: the changed
    /// key, or the start of the changed scanned range); nothing was written. `Client::txn`
    /// runs the transaction again; a caller of `Txn::commit` should too.
    #[error("transaction conflict: {} changed after it was read", crate::client::display_key(.key))]
    TxnConflict { key: bytes::Bytes },
    /// A transaction's snapshot read met a version it cannot order against the transaction
    /// (written within the clocks' uncertainty of its read timestamp; see the `txn` module
    /// docs). Nothing was written. `Client::txn` runs the transaction again at that version's
    /// timestamp; a caller of `Txn` by hand should start a new one.
    #[error("transaction restart: a version at {version_ts} is within the clock uncertainty of its snapshot")]
    TxnUncertain {
        version_ts: meridian_types::Timestamp,
    },

    /// The request met another transaction's prepared lock and did nothing. The client waits
    /// such locks out (and resolves them through the transaction's anchor when they outlive
    /// their coordinator), so a caller sees this only when the call's deadline ran out
    /// meanwhile (inside [`Error::DeadlineExceeded`]); a transaction whose prepare meets a
    /// lock fails with [`Error::TxnConflict`] instead and runs again.
    #[error("key {} is locked by transaction {}:{}", crate::client::display_key(&.lock.key), .lock.txn.client_id, .lock.txn.seq)]
    Locked { lock: LockInfo },

    /// A read at a timestamp below the shard's GC threshold: the history it needs may have
    /// been garbage-collected (the cluster keeps `cluster.gc_ttl_ms` of it, 15 minutes by
    /// default). A transaction that ran that long must start again; nothing was read.
    #[error("read below the GC threshold: {message}")]
    BelowGcThreshold { message: String },
}

/// A prepared lock of a multi-shard transaction (see `meridian-raft`'s `locks`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LockInfo {
    /// The locked key.
    pub key: bytes::Bytes,
    /// The transaction holding it.
    pub txn: meridian_proto::kv::WriteId,
    /// The key whose shard holds the transaction's record.
    pub anchor: bytes::Bytes,
    /// The transaction's prepare timestamp on the key's shard.
    pub prepare_ts: u64,
    /// A write intent (else a read lock).
    pub write: bool,
    /// The transaction's start timestamp (its resolves carry it).
    pub txn_ts: u64,
    /// The holder's rank in lock conflicts (see `meridian_types::txn_rank`).
    pub rank: meridian_types::TxnRank,
}

impl LockInfo {
    /// Reads the `meridian-lock-bin` header of a `LOCKED` status; `None` if missing or
    /// malformed.
    fn from_status(status: &tonic::Status) -> Option<LockInfo> {
        let raw = status.metadata().get_bin(LOCK_HEADER)?.to_bytes().ok()?;
        let info: meridian_proto::kv::LockInfo = prost::Message::decode(raw).ok()?;
        let txn = info.txn.filter(|t| t.client_id != 0)?;
        if info.key.is_empty() || info.anchor.is_empty() {
            return None;
        }
        Some(LockInfo {
            key: info.key,
            txn,
            anchor: info.anchor,
            prepare_ts: info.prepare_ts,
            write: info.write,
            txn_ts: info.txn_ts,
            rank: meridian_types::TxnRank {
                priority: info.priority,
                age_ts: info.age_ts,
            },
        })
    }
}

fn leader_suffix(leader: &Option<LeaderHint>) -> String {
    match leader {
        Some(hint) => format!(" (leader: {hint})"),
        None => String::new(),
    }
}

fn last_suffix(last: &Option<Box<Error>>) -> String {
    match last {
        Some(error) => format!("; last error: {error}"),
        None => String::new(),
    }
}

impl Error {
    /// Whether retrying the same request may succeed. The client already retries these until
    /// the call deadline; a caller seeing one has run out of time or attempts.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            Error::NotLeader { .. }
                | Error::WrongShard { .. }
                | Error::Unavailable { .. }
                | Error::Transport { .. }
        )
    }

    /// The stable code for this error, if it has one (transport errors and `NoSeeds` do not).
    pub fn code(&self) -> Option<ErrorCode> {
        Some(match self {
            Error::InvalidArgument { .. } => ErrorCode::InvalidArgument,
            Error::NotLeader { .. } => ErrorCode::NotLeader,
            Error::WrongShard { .. } => ErrorCode::WrongShard,
            Error::Unavailable { .. } => ErrorCode::Unavailable,
            Error::ClockOffset { .. } => ErrorCode::ClockOffset,
            Error::DeadlineExceeded { .. } => ErrorCode::DeadlineExceeded,
            Error::Internal { .. } => ErrorCode::Internal,
            Error::Ambiguous { .. } => ErrorCode::Ambiguous,
            Error::Locked { .. } => ErrorCode::Locked,
            Error::BelowGcThreshold { .. } => ErrorCode::BelowGcThreshold,
            Error::Transport { .. }
            | Error::NoSeeds
            | Error::TxnConflict { .. }
            | Error::TxnUncertain { .. } => return None,
        })
    }

    pub(crate) fn invalid(message: impl Into<String>) -> Error {
        Error::InvalidArgument {
            message: message.into(),
        }
    }

    pub(crate) fn internal(message: impl Into<String>) -> Error {
        Error::Internal {
            message: message.into(),
        }
    }

    /// Classifies a gRPC status returned by the node at `address`.
    ///
    /// A server-side `DEADLINE_EXCEEDED` (the attempt's gRPC timeout ran out on the server)
    /// becomes [`Error::Unavailable`]: the shard could not answer within one attempt, and the
    /// call may still have time for another. [`Error::DeadlineExceeded`] is reserved for the
    /// whole call running out of time.
    pub fn from_status(status: &tonic::Status, address: &str) -> Error {
        let message = status.message().to_string();
        let code = status
            .metadata()
            .get(ERROR_CODE_HEADER)
            .and_then(|value| value.to_str().ok())
            .and_then(|text| ErrorCode::parse(text.trim()));
        match code {
            Some(ErrorCode::InvalidArgument) => Error::InvalidArgument { message },
            Some(ErrorCode::NotLeader) => {
                let leader = status
                    .metadata()
                    .get(LEADER_HINT_HEADER)
                    .and_then(|value| value.to_str().ok())
                    .and_then(LeaderHint::parse);
                Error::NotLeader { message, leader }
            }
            Some(ErrorCode::WrongShard) => Error::WrongShard { message },
            Some(ErrorCode::Unavailable) => Error::Unavailable { message },
            Some(ErrorCode::ClockOffset) => Error::ClockOffset { message },
            Some(ErrorCode::DeadlineExceeded) => Error::Unavailable {
                message: format!("server deadline exceeded: {message}"),
            },
            Some(ErrorCode::Internal) => Error::Internal { message },
            Some(ErrorCode::Ambiguous) => Error::Ambiguous { message },
            Some(ErrorCode::Locked) => match LockInfo::from_status(status) {
                Some(lock) => Error::Locked { lock },
                None => Error::Internal {
                    message: format!("{address}: LOCKED without a readable lock: {message}"),
                },
            },
            Some(ErrorCode::BelowGcThreshold) => Error::BelowGcThreshold { message },
            None => Self::from_headerless_status(status, address),
        }
    }

    fn from_headerless_status(status: &tonic::Status, address: &str) -> Error {
        use tonic::Code;
        let message = status.message().to_string();
        match status.code() {
            // Produced locally by tonic (e.g. a message over MAX_MESSAGE_BYTES) or by a server
            // that validated without our header: the request itself is wrong.
            Code::InvalidArgument | Code::OutOfRange | Code::ResourceExhausted => {
                Error::InvalidArgument { message }
            }
            Code::Unimplemented | Code::Unauthenticated | Code::PermissionDenied => {
                Error::Internal {
                    message: format!("{address}: {:?}: {message}", status.code()),
                }
            }
            // Unavailable (connect failed), Cancelled (tonic's client-side timeout), Unknown and
            // Internal (h2 errors, resets), DeadlineExceeded, Aborted: the node did not answer.
            code => Error::Transport {
                address: address.to_string(),
                message: format!("{code:?}: {message}"),
            },
        }
    }
}

/// The client's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::metadata::MetadataMap;
    use tonic::{Code, Status};

    fn status_with(code: Code, headers: &[(&'static str, &str)]) -> Status {
        let mut metadata = MetadataMap::new();
        for (name, value) in headers {
            metadata.insert(*name, value.parse().expect("test header is ASCII"));
        }
        Status::with_metadata(code, "boom", metadata)
    }

    /// NOT_LEADER with a well-formed hint yields the hint.
    #[test]
    fn not_leader_with_hint_is_parsed() {
        let status = status_with(
            Code::FailedPrecondition,
            &[
                (ERROR_CODE_HEADER, "NOT_LEADER"),
                (LEADER_HINT_HEADER, "3@127.0.0.1:7003"),
            ],
        );
        let error = Error::from_status(&status, "127.0.0.1:7001");
        assert_eq!(
            error,
            Error::NotLeader {
                message: "boom".into(),
                leader: Some(LeaderHint {
                    node_id: 3,
                    address: "127.0.0.1:7003".into()
                }),
            }
        );
        assert!(error.is_retryable());
        assert!(error.to_string().contains("node 3 at 127.0.0.1:7003"));
    }

    /// A malformed hint is dropped, not an error.
    #[test]
    fn malformed_hints_are_ignored() {
        for bad in ["", "x@1.2.3.4:5", "0@1.2.3.4:5", "7@", "7", "7@a b"] {
            let status = status_with(
                Code::FailedPrecondition,
                &[(ERROR_CODE_HEADER, "NOT_LEADER"), (LEADER_HINT_HEADER, bad)],
            );
            assert!(
                matches!(
                    Error::from_status(&status, "a:1"),
                    Error::NotLeader { leader: None, .. }
                ),
                "{bad:?}"
            );
        }
        let long = format!("1@{}", "a".repeat(MAX_ADDRESS_BYTES));
        assert!(LeaderHint::parse(&long).is_none());
    }

    /// Every server code maps to its variant and retryability matches ErrorCode's.
    #[test]
    fn codes_map_to_variants() {
        let cases = [
            ("INVALID_ARGUMENT", false),
            ("NOT_LEADER", true),
            ("WRONG_SHARD", true),
            ("UNAVAILABLE", true),
            ("CLOCK_OFFSET", false),
            ("INTERNAL", false),
        ];
        for (code, retryable) in cases {
            let status = status_with(Code::Internal, &[(ERROR_CODE_HEADER, code)]);
            let error = Error::from_status(&status, "a:1");
            assert_eq!(error.is_retryable(), retryable, "{code}");
            assert_eq!(error.code().map(|c| c.as_str()), Some(code));
        }
        let status = status_with(
            Code::DeadlineExceeded,
            &[(ERROR_CODE_HEADER, "DEADLINE_EXCEEDED")],
        );
        assert!(matches!(
            Error::from_status(&status, "a:1"),
            Error::Unavailable { .. }
        ));
    }

    /// Statuses without our header are transport failures (retryable), except local request
    /// errors.
    #[test]
    fn headerless_statuses_are_transport_errors() {
        for code in [
            Code::Unavailable,
            Code::Cancelled,
            Code::Unknown,
            Code::Internal,
        ] {
            let error = Error::from_status(&Status::new(code, "connection refused"), "n:1");
            assert!(matches!(error, Error::Transport { .. }), "{code:?}");
            assert!(error.is_retryable());
        }
        let error = Error::from_status(&Status::new(Code::ResourceExhausted, "too big"), "n:1");
        assert!(matches!(error, Error::InvalidArgument { .. }));
        let status = status_with(Code::Unavailable, &[(ERROR_CODE_HEADER, "NONSENSE")]);
        assert!(matches!(
            Error::from_status(&status, "n:1"),
            Error::Transport { .. }
        ));
    }

    /// DeadlineExceeded names the last error.
    #[test]
    fn deadline_exceeded_carries_last_error() {
        let error = Error::DeadlineExceeded {
            elapsed_ms: 10_000,
            attempts: 7,
            last: Some(Box::new(Error::Unavailable {
                message: "no quorum".into(),
            })),
        };
        assert!(!error.is_retryable());
        assert!(error
            .to_string()
            .contains("last error: unavailable: no quorum"));
    }
}
