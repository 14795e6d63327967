//! The node's error type and its one mapping to gRPC statuses.
//!
//! Each variant maps to exactly one [`ErrorCode`] and gRPC code; the code travels in the
//! `meridian-code` metadata so clients classify errors without parsing messages, and
//! `NotLeader` carries a `meridian-leader` hint (`<node_id>@<client_addr>`), `Locked` the lock
//! it met (`meridian-lock-bin`, a prost-encoded `LockInfo`).

use meridian_types::error::{ERROR_CODE_HEADER, LEADER_HINT_HEADER, LOCK_HEADER};
use meridian_types::{ErrorCode, NodeId, ShardId};
use tonic::Status;

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("{0}")]
    InvalidArgument(String),
    #[error("node is not the leader of shard {shard}")]
    NotLeader {
        shard: ShardId,
        leader: Option<(NodeId, String)>,
    },
    #[error("{0}")]
    WrongShard(String),
    #[error("{0}")]
    Unavailable(String),
    #[error("{0}")]
    ClockOffset(String),
    #[error("{0}")]
    Internal(String),
    /// A write reached Raft and its outcome cannot be known here (see `ErrorCode::Ambiguous`).
    #[error("outcome unknown: {0}")]
    Ambiguous(String),
    /// Another transaction's prepared lock is in the way (see `meridian_raft::locks`).
    #[error("key {:?} is locked by transaction {}:{}", .0.key, .0.txn.client_id, .0.txn.seq)]
    Locked(meridian_raft::locks::LockInfo),
    /// A read below the shard's GC threshold (see `gc`).
    #[error("{0}")]
    BelowGcThreshold(String),
}

pub type Result<T> = std::result::Result<T, ServerError>;

impl ServerError {
    pub fn code(&self) -> ErrorCode {
        match self {
            ServerError::InvalidArgument(_) => ErrorCode::InvalidArgument,
            ServerError::NotLeader { .. } => ErrorCode::NotLeader,
            ServerError::WrongShard(_) => ErrorCode::WrongShard,
            ServerError::Unavailable(_) => ErrorCode::Unavailable,
            ServerError::ClockOffset(_) => ErrorCode::ClockOffset,
            ServerError::Internal(_) => ErrorCode::Internal,
            ServerError::Ambiguous(_) => ErrorCode::Ambiguous,
            ServerError::Locked(_) => ErrorCode::Locked,
            ServerError::BelowGcThreshold(_) => ErrorCode::BelowGcThreshold,
        }
    }
}

pub fn invalid(msg: impl Into<String>) -> ServerError {
    ServerError::InvalidArgument(msg.into())
}

impl From<ServerError> for Status {
    fn from(e: ServerError) -> Status {
        let code = e.code();
        let grpc = match code {
            ErrorCode::InvalidArgument => tonic::Code::InvalidArgument,
            ErrorCode::NotLeader => tonic::Code::FailedPrecondition,
            ErrorCode::WrongShard => tonic::Code::NotFound,
            ErrorCode::Unavailable => tonic::Code::Unavailable,
            ErrorCode::ClockOffset => tonic::Code::FailedPrecondition,
            ErrorCode::DeadlineExceeded => tonic::Code::DeadlineExceeded,
            ErrorCode::Internal => tonic::Code::Internal,
            ErrorCode::Ambiguous => tonic::Code::Unknown,
            ErrorCode::Locked => tonic::Code::Aborted,
            ErrorCode::BelowGcThreshold => tonic::Code::OutOfRange,
        };
        let mut status = Status::new(grpc, e.to_string());
        if let Ok(v) = code.as_str().parse() {
            status.metadata_mut().insert(ERROR_CODE_HEADER, v);
        }
        if let ServerError::NotLeader {
            leader: Some((id, addr)),
            ..
        } = &e
        {
            if let Ok(v) = format!("{id}@{addr}").parse() {
                status.metadata_mut().insert(LEADER_HINT_HEADER, v);
            }
        }
        if let ServerError::Locked(lock) = &e {
            let info = meridian_proto::kv::LockInfo {
                key: lock.key.clone(),
                txn: Some(meridian_proto::kv::WriteId {
                    client_id: lock.txn.client_id,
                    seq: lock.txn.seq,
                }),
                anchor: lock.anchor.clone(),
                prepare_ts: lock.prepare_ts,
                write: lock.write,
                txn_ts: lock.txn_ts,
                priority: lock.rank.priority,
                age_ts: lock.rank.age_ts,
            };
            let bytes = prost::Message::encode_to_vec(&info);
            status.metadata_mut().insert_bin(
                LOCK_HEADER,
                tonic::metadata::MetadataValue::from_bytes(&bytes),
            );
        }
        status
    }
}
