//! Counters of the peer messages a node receives, by kind, for the node's metrics endpoint.
//!
//! Every handler of the `RaftTransport` service counts the message it was given before it
//! looks at it (refused ones included: a storm of refused messages is worth seeing). A streamed
//! append session counts each append it carries. Relaxed atomics: the counts are figures for
//! an operator, not synchronisation.

use std::sync::atomic::{AtomicU64, Ordering};

/// A kind of peer message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PeerMessage {
    Append,
    StreamedAppend,
    /// One coalesced call (see `heartbeat_batch`); each heartbeat in it counts as `Heartbeat`.
    HeartbeatBatch,
    Heartbeat,
    Vote,
    PreVote,
    TransferLeader,
    Propose,
    Quiesce,
    Wake,
    Ping,
    SnapshotChunk,
    CloseTimestamps,
    ShardMap,
}

impl PeerMessage {
    pub const ALL: [PeerMessage; 14] = [
        PeerMessage::Append,
        PeerMessage::StreamedAppend,
        PeerMessage::HeartbeatBatch,
        PeerMessage::Heartbeat,
        PeerMessage::Vote,
        PeerMessage::PreVote,
        PeerMessage::TransferLeader,
        PeerMessage::Propose,
        PeerMessage::Quiesce,
        PeerMessage::Wake,
        PeerMessage::Ping,
        PeerMessage::SnapshotChunk,
        PeerMessage::CloseTimestamps,
        PeerMessage::ShardMap,
    ];

    /// The label value in the metrics (`type="…"`).
    pub fn name(self) -> &'static str {
        match self {
            PeerMessage::Append => "append",
            PeerMessage::StreamedAppend => "streamed_append",
            PeerMessage::HeartbeatBatch => "heartbeat_batch",
            PeerMessage::Heartbeat => "heartbeat",
            PeerMessage::Vote => "vote",
            PeerMessage::PreVote => "pre_vote",
            PeerMessage::TransferLeader => "transfer_leader",
            PeerMessage::Propose => "propose",
            PeerMessage::Quiesce => "quiesce",
            PeerMessage::Wake => "wake",
            PeerMessage::Ping => "ping",
            PeerMessage::SnapshotChunk => "snapshot_chunk",
            PeerMessage::CloseTimestamps => "close_timestamps",
            PeerMessage::ShardMap => "shard_map",
        }
    }

    fn index(self) -> usize {
        PeerMessage::ALL
            .iter()
            .position(|m| *m == self)
            .expect("every kind is in ALL")
    }
}

/// Messages received, per kind, since the node started.
#[derive(Debug, Default)]
pub struct TransportStats {
    received: [AtomicU64; PeerMessage::ALL.len()],
}

impl TransportStats {
    pub fn received(&self, message: PeerMessage) {
        self.received[message.index()].fetch_add(1, Ordering::Relaxed);
    }

    /// Every kind with its count, in [`PeerMessage::ALL`]'s order.
    pub fn counts(&self) -> Vec<(PeerMessage, u64)> {
        PeerMessage::ALL
            .iter()
            .map(|m| (*m, self.received[m.index()].load(Ordering::Relaxed)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_by_kind_with_distinct_names() {
        let stats = TransportStats::default();
        stats.received(PeerMessage::Vote);
        stats.received(PeerMessage::Vote);
        stats.received(PeerMessage::SnapshotChunk);
        let counts = stats.counts();
        assert_eq!(counts.len(), PeerMessage::ALL.len());
        for (message, count) in counts {
            let expected = match message {
                PeerMessage::Vote => 2,
                PeerMessage::SnapshotChunk => 1,
                _ => 0,
            };
            assert_eq!(count, expected, "{message:?}");
        }
        let mut names: Vec<_> = PeerMessage::ALL.iter().map(|m| m.name()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), PeerMessage::ALL.len());
    }
}
