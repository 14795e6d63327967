//! openraft type configuration and the commands a shard's Raft log carries.

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use std::io::Cursor;

/// One replicated command. The version timestamp is proposed by the leader's HLC; apply raises
/// it to the shard's version floor + 1 if needed so versions stay ordered across leader changes
/// (see `state_machine`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    /// An atomic write of puts and deletes within one shard, all at one timestamp.
    Write {
        ts: u64,
        puts: Vec<(Bytes, Bytes)>,
        deletes: Vec<Bytes>,
    },
}

impl std::fmt::Display for Command {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Command::Write { ts, puts, deletes } => {
                write!(
                    f,
                    "Write(ts={ts}, puts={}, deletes={})",
                    puts.len(),
                    deletes.len()
                )
            }
        }
    }
}

/// What applying a command produced.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommandResult {
    /// The version timestamp the write was applied at.
    pub commit_ts: u64,
}

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
pub type SnapshotResponse = openraft::raft::SnapshotResponse<TypeConfig>;
pub type TransferLeaderRequest = openraft::raft::TransferLeaderRequest<TypeConfig>;
pub type TransferLeaderResponse = openraft::raft::TransferLeaderResponse<TypeConfig>;
pub type RPCError = openraft::errors::RPCError<TypeConfig>;
pub type StreamingError = openraft::errors::StreamingError<TypeConfig>;
pub type Fatal = openraft::errors::Fatal<TypeConfig>;
pub type ClientWriteError = openraft::errors::ClientWriteError<TypeConfig>;
pub type RaftError<E = openraft::errors::Infallible> = openraft::errors::RaftError<TypeConfig, E>;

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

    #[test]
    fn codec_round_trips_and_rejects_truncation() {
        let cmd = Command::Write {
            ts: 7,
            puts: vec![(Bytes::from_static(b"k"), Bytes::from_static(b"v"))],
            deletes: vec![Bytes::from_static(b"d")],
        };
        let bytes = codec::encode(&cmd).unwrap();
        assert_eq!(codec::decode::<Command>(&bytes).unwrap(), cmd);
        assert!(codec::decode::<Command>(&bytes[..bytes.len() - 1]).is_err());
        let mut extra = bytes.clone();
        extra.push(0);
        assert!(codec::decode::<Command>(&extra).is_err());
    }
}
