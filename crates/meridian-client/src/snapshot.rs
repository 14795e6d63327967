//! A transaction's snapshot: the one timestamp it reads every shard at, and the clock
//! readings it took from nodes (see `meridian-server`'s `kv_snapshot` for the server side).
//!
//! The first read of an attempt lets the node pick the timestamp (its clock after the read
//! barrier) and every later read, on any shard, sends it. Each reply carries the answering
//! node's clock reading (*observed timestamp*); the first one per node is kept for the whole
//! transaction, across attempts, and sent along so that node narrows the uncertainty window
//! to it. A reply that names an uncertain version makes the attempt restart at that version.

use crate::error::{Error, Result};
use meridian_proto::kv as proto;
use meridian_types::limits::MAX_OBSERVED_NODES;
use meridian_types::Timestamp;
use std::collections::BTreeMap;

/// The snapshot of one transaction attempt and the readings of the whole transaction.
#[derive(Clone, Debug, Default)]
pub(crate) struct SnapshotState {
    /// `None` until the first read of the attempt.
    pub read_ts: Option<Timestamp>,
    /// node id → that node's first clock reading in this transaction.
    pub observed: BTreeMap<u64, u64>,
    /// The transaction's uncertainty limit, from its first read; kept across attempts.
    pub limit: Option<Timestamp>,
}

/// A snapshot read's outcome.
pub(crate) enum SnapRead<T> {
    Done(T),
    /// A version at this timestamp was within the uncertainty window.
    Uncertain(Timestamp),
}

impl SnapshotState {
    /// A new attempt's snapshot: at `read_ts` (after an uncertain read) or picked by its first
    /// read; the readings are kept.
    pub fn next_attempt(self, read_ts: Option<Timestamp>) -> SnapshotState {
        SnapshotState { read_ts, ..self }
    }

    /// The request part.
    pub fn spec(&self) -> proto::TxnSnapshot {
        proto::TxnSnapshot {
            read_ts: self.read_ts.map_or(0, |t| t.0),
            observed: self
                .observed
                .iter()
                .map(|(&node_id, &ts)| proto::ObservedTs { node_id, ts })
                .collect(),
            uncertainty_limit: self.limit.map_or(0, |t| t.0),
        }
    }

    /// Takes in a reply read at `read_ts`: the picked timestamp, the node's reading. Returns
    /// the uncertain version's timestamp, if the reply named one.
    pub fn absorb(
        &mut self,
        read_ts: u64,
        reply: Option<proto::SnapshotReply>,
    ) -> Result<Option<Timestamp>> {
        let reply = reply.ok_or_else(|| {
            Error::internal("a snapshot read was answered without its snapshot reply")
        })?;
        // A reading is valid whatever the read found.
        if reply.node_id != 0
            && reply.observed_ts != 0
            && (self.observed.len() < MAX_OBSERVED_NODES
                || self.observed.contains_key(&reply.node_id))
        {
            self.observed
                .entry(reply.node_id)
                .or_insert(reply.observed_ts);
        }
        if self.limit.is_none() && reply.uncertainty_limit != 0 {
            self.limit = Some(Timestamp(reply.uncertainty_limit));
        }
        if reply.uncertain_ts != 0 {
            return Ok(Some(Timestamp(reply.uncertain_ts)));
        }
        if read_ts == 0 {
            return Err(Error::internal(
                "a snapshot read was answered without its read_ts",
            ));
        }
        match self.read_ts {
            None => self.read_ts = Some(Timestamp(read_ts)),
            Some(ts) if ts.0 == read_ts => {}
            // Two shards each picked a timestamp (the key grouping changed under a stale map
            // while none was set): the reads are not one snapshot; restart at the later one.
            Some(ts) => return Ok(Some(ts.max(Timestamp(read_ts)))),
        }
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(node_id: u64, observed_ts: u64, uncertain_ts: u64) -> Option<proto::SnapshotReply> {
        Some(proto::SnapshotReply {
            node_id,
            observed_ts,
            uncertain_ts,
            uncertainty_limit: 600,
        })
    }

    #[test]
    fn the_first_reply_picks_the_timestamp_and_each_node_is_observed_once() {
        let mut snap = SnapshotState::default();
        assert_eq!(snap.spec().read_ts, 0);
        assert_eq!(snap.absorb(100, reply(1, 100, 0)).unwrap(), None);
        assert_eq!(snap.read_ts, Some(Timestamp(100)));
        assert_eq!(snap.absorb(100, reply(2, 140, 0)).unwrap(), None);
        assert_eq!(snap.absorb(100, reply(1, 180, 0)).unwrap(), None);
        assert_eq!(
            snap.observed,
            BTreeMap::from([(1, 100), (2, 140)]),
            "the first reading per node is kept"
        );
        let spec = snap.spec();
        assert_eq!((spec.read_ts, spec.observed.len()), (100, 2));
        assert_eq!(
            snap.limit,
            Some(Timestamp(600)),
            "the first reply's limit is kept"
        );
        assert_eq!(snap.spec().uncertainty_limit, 600);
        // An answer at another timestamp (two shards picked one each): restart at the later.
        assert_eq!(
            snap.absorb(101, reply(3, 101, 0)).unwrap(),
            Some(Timestamp(101))
        );
        assert!(snap.absorb(100, None).is_err());
        assert!(snap.absorb(0, reply(3, 101, 0)).is_err());
    }

    #[test]
    fn an_uncertain_reply_is_reported_and_the_next_attempt_keeps_the_readings() {
        let mut snap = SnapshotState::default();
        snap.absorb(100, reply(1, 100, 0)).unwrap();
        assert_eq!(
            snap.absorb(100, reply(2, 150, 120)).unwrap(),
            Some(Timestamp(120))
        );
        let next = snap.next_attempt(Some(Timestamp(120)));
        assert_eq!(next.read_ts, Some(Timestamp(120)));
        assert_eq!(
            next.limit,
            Some(Timestamp(600)),
            "a restart does not widen the window"
        );
        assert_eq!(next.observed, BTreeMap::from([(1, 100), (2, 150)]));
    }
}
