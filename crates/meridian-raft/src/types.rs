//! openraft type configuration and the binary codec of everything Raft stores or sends.
//!
//! The commands a shard's Raft log carries live in `command` (what they are, what applying
//! one produced) and `command_check` (the checks apply runs on each); this module re-exports
//! them, so `crate::types::Command` and `meridian_raft::types::Command` stay the paths the
//! rest of the code uses. [`TypeConfig`] plugs them into openraft, and the aliases below name
//! openraft's generic types for it.

pub use crate::command::{
    Command, CommandResult, Expect, GcRecordsResult, GcResult, RangeCheck, ReadCheck, RequestId,
    StuckRecord, MAX_COMMAND_TS, MAX_PROPOSAL_BATCH,
};
pub use crate::command_check::{check_txn_reads, check_txn_writes};
use serde::Serialize;
use std::io::Cursor;

openraft::declare_raft_types!(
    /// Meridian's Raft types: node ids are u64, nodes are known by their peer address.
    pub TypeConfig:
        D = Command,
        R = CommandResult,
        NodeId = u64,
        Node = openraft::impls::BasicNode,
);

pub type NodeId = u64;
pub type Raft = openraft::Raft<TypeConfig, crate::state_machine::ShardStateMachine>;
pub type LogId = openraft::alias::LogIdOf<TypeConfig>;
pub type Vote = <TypeConfig as openraft::RaftTypeConfig>::Vote;
pub type Entry = <TypeConfig as openraft::RaftTypeConfig>::Entry;
pub type Node = openraft::impls::BasicNode;
pub type StoredMembership = openraft::alias::StoredMembershipOf<TypeConfig>;
pub type SnapshotMeta = openraft::alias::SnapshotMetaOf<TypeConfig>;
pub type Snapshot = openraft::alias::SnapshotOf<TypeConfig, crate::state_machine::SnapshotFile>;
pub type IOFlushed = openraft::storage::IOFlushed<TypeConfig>;
pub type LogState = openraft::storage::LogState<TypeConfig>;
pub type RaftMetrics = openraft::RaftMetrics<TypeConfig>;
pub type VoteRequest = openraft::raft::VoteRequest<TypeConfig>;
pub type VoteResponse = openraft::raft::VoteResponse<TypeConfig>;
pub type AppendEntriesRequest = openraft::raft::AppendEntriesRequest<TypeConfig>;
pub type AppendEntriesResponse = openraft::raft::AppendEntriesResponse<TypeConfig>;
pub type StreamAppendResult = openraft::raft::StreamAppendResult<TypeConfig>;
pub type StreamAppendError = openraft::raft::StreamAppendError<TypeConfig>;
pub type SnapshotResponse = openraft::raft::SnapshotResponse<TypeConfig>;
pub type TransferLeaderRequest = openraft::raft::TransferLeaderRequest<TypeConfig>;
pub type TransferLeaderResponse = openraft::raft::TransferLeaderResponse<TypeConfig>;
pub type RPCError = openraft::errors::RPCError<TypeConfig>;
pub type StreamingError = openraft::errors::StreamingError<TypeConfig>;
pub type Fatal = openraft::errors::Fatal<TypeConfig>;
pub type ClientWriteError = openraft::errors::ClientWriteError<TypeConfig>;
pub type RaftError<E = openraft::errors::Infallible> = openraft::errors::RaftError<TypeConfig, E>;

/// A failed `client_write` in words an operator can act on: openraft's own text for a write
/// sent to a replica that is not the leader names the leader as `None, None` when there is none.
pub fn write_error_text(error: &RaftError<ClientWriteError>) -> String {
    match error {
        RaftError::APIError(ClientWriteError::ForwardToLeader(f)) => match f.leader_id {
            Some(leader) => format!("this replica is not the leader (node {leader} is)"),
            None => "the group has no leader right now (an election may be under way)".into(),
        },
        other => other.to_string(),
    }
}

/// Binary encoding of everything Raft stores or sends (log entries, votes, messages).
pub mod codec {
    use super::*;

    use bincode::Options;

    fn options() -> impl bincode::Options {
        bincode::DefaultOptions::new()
            .with_fixint_encoding()
            .with_limit(meridian_types::limits::MAX_MESSAGE_BYTES as u64)
    }

    pub fn encode<T: Serialize>(value: &T) -> std::io::Result<Vec<u8>> {
        options()
            .serialize(value)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
    }

    /// The bytes [`encode`] would produce, without encoding; `usize::MAX` for a value over
    /// the message limit (which [`encode`] refuses).
    pub fn encoded_len<T: Serialize>(value: &T) -> usize {
        options()
            .serialized_size(value)
            .map_or(usize::MAX, |n| usize::try_from(n).unwrap_or(usize::MAX))
    }

    /// Decodes `bytes`, rejecting trailing garbage and oversized length prefixes.
    pub fn decode<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> std::io::Result<T> {
        let mut cursor = Cursor::new(bytes);
        let value = options()
            .deserialize_from(&mut cursor)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
        if cursor.position() as usize != bytes.len() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!(
                    "{} trailing bytes after message",
                    bytes.len() - cursor.position() as usize
                ),
            ));
        }
        Ok(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use bytes::Bytes;

    #[test]
    fn a_write_to_a_group_without_a_leader_says_so() {
        let no_leader = RaftError::APIError(ClientWriteError::ForwardToLeader(
            openraft::errors::ForwardToLeader::empty(),
        ));
        let text = write_error_text(&no_leader);
        assert!(!text.contains("None"), "{text}");
        assert!(text.contains("no leader"), "{text}");
    }

    #[test]
    fn codec_round_trips_and_rejects_truncation() {
        let cmd = Command::Write {
            ts: 7,
            puts: vec![(Bytes::from_static(b"k"), Bytes::from_static(b"v"))],
            deletes: vec![Bytes::from_static(b"d")],
            request: Some(RequestId {
                client_id: 9,
                seq: 3,
            }),
        };
        let bytes = codec::encode(&cmd).unwrap();
        assert_eq!(codec::decode::<Command>(&bytes).unwrap(), cmd);
        assert!(codec::decode::<Command>(&bytes[..bytes.len() - 1]).is_err());
        let mut extra = bytes.clone();
        extra.push(0);
        assert!(codec::decode::<Command>(&extra).is_err());
    }
}
