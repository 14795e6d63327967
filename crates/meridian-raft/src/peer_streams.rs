//! The connections that carry a node's replication streams to each peer, apart from its other
//! calls, and never more streams on one than the peer accepts.
//!
//! # Why
//! Every shard a node leads keeps one long-lived `AppendStream` open to each follower (see
//! `network`), and a peer accepts at most [`MAX_PEER_STREAMS_PER_CONNECTION`] concurrent
//! streams on one HTTP/2 connection. When all the streams to a peer shared one connection with
//! every other call, a node leading that many shards with a replica on the peer (1,024 data
//! shards led from the home region, say) filled every slot: the next shard's stream, and every
//! ping, vote and heartbeat batch to that peer, waited for a slot that never freed, so the
//! peer looked dead and the shard could not replicate.
//!
//! # What
//! [`StreamLanes`] keeps, per peer address, a list of connections used only by replication
//! streams, each with a count of the streams it carries. A new stream takes the first
//! connection with fewer than [`STREAMS_PER_CONNECTION`] (half the peer's limit), or dials
//! another. The slot is a [`StreamSlot`] the stream holds and gives back when dropped. The
//! pool's other calls keep their own connection (`PeerPool::client`), so no number of streams
//! delays them.
//!
//! # Invariants
//! - A lane's count is the number of live [`StreamSlot`]s taken on it: taken under the lanes'
//!   lock, given back on drop.
//! - A replication stream's slot is given back once both its sides are dropped: openraft's
//!   reply side, and the request body hyper drops when the stream ends (the `append_credit`
//!   gate ends it when the reply side goes). The HTTP/2 stream is then closed or being reset,
//!   so a lane's count is at least the streams the peer counts on that connection, less those
//!   whose reset is in flight; half the peer's limit leaves room for those.
//! - Snapshots (`install_snapshot`, a client stream of the whole SST file) take a slot too, so
//!   their chunks never share a connection with pings and votes.
//!
//! # Not done yet
//! - Lanes are never closed: a peer's lane count stays at its peak (each idle connection costs
//!   only its keep-alive pings). Forgetting the peer (`PeerPool::forget_addrs`) drops them.

use meridian_types::limits::MAX_PEER_STREAMS_PER_CONNECTION;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use tonic::transport::Channel;

/// Most replication streams one connection to a peer carries: half what the peer accepts.
pub const STREAMS_PER_CONNECTION: usize = MAX_PEER_STREAMS_PER_CONNECTION as usize / 2;

/// One connection for replication streams, and how many it carries.
struct Lane {
    channel: Channel,
    open: Arc<AtomicUsize>,
}

/// A stream's place on a lane; dropping it frees the place.
#[derive(Debug)]
pub struct StreamSlot {
    open: Arc<AtomicUsize>,
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        self.open.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Every peer's replication lanes (see the module docs).
#[derive(Default)]
pub struct StreamLanes {
    lanes: Mutex<HashMap<String, Vec<Lane>>>,
}

impl StreamLanes {
    /// A channel to `addr` with room for one more stream, and the slot that holds the room;
    /// `dial` makes a new connection when every lane is full.
    pub fn take<E>(
        &self,
        addr: &str,
        dial: impl FnOnce() -> Result<Channel, E>,
    ) -> Result<(Channel, StreamSlot), E> {
        let mut lanes = self.lanes.lock().unwrap_or_else(|p| p.into_inner());
        let has_room = |l: &Lane| l.open.load(Ordering::Acquire) < STREAMS_PER_CONNECTION;
        if lanes
            .get(addr)
            .is_none_or(|peer| !peer.iter().any(has_room))
        {
            let channel = dial()?;
            let peer = lanes.entry(addr.to_string()).or_default();
            if !peer.is_empty() {
                tracing::info!(
                    peer = addr,
                    lanes = peer.len() + 1,
                    "every connection to the peer carries {STREAMS_PER_CONNECTION} replication streams: opening another"
                );
            }
            peer.push(Lane {
                channel,
                open: Arc::default(),
            });
        }
        let lane = lanes[addr]
            .iter()
            .find(|l| has_room(l))
            .expect("a lane with room: found or just added");
        lane.open.fetch_add(1, Ordering::AcqRel);
        Ok((
            lane.channel.clone(),
            StreamSlot {
                open: lane.open.clone(),
            },
        ))
    }

    /// Drops the lanes of each of `addrs` (streams on them keep their channel until they end).
    pub fn forget(&self, addrs: &[String]) {
        let mut lanes = self.lanes.lock().unwrap_or_else(|p| p.into_inner());
        for addr in addrs {
            lanes.remove(addr);
        }
    }

    /// How many lanes lead to `addr`, and the streams each carries.
    pub fn lanes_of(&self, addr: &str) -> Vec<usize> {
        let lanes = self.lanes.lock().unwrap_or_else(|p| p.into_inner());
        lanes.get(addr).map_or_else(Vec::new, |peer| {
            peer.iter()
                .map(|l| l.open.load(Ordering::Acquire))
                .collect()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn channel() -> Result<Channel, String> {
        Ok(Channel::from_static("http://127.0.0.1:9").connect_lazy())
    }

    #[tokio::test]
    async fn a_full_lane_makes_another_and_a_freed_slot_is_reused() {
        let lanes = StreamLanes::default();
        let mut slots: Vec<StreamSlot> = (0..STREAMS_PER_CONNECTION)
            .map(|_| lanes.take("p", channel).expect("a lane").1)
            .collect();
        assert_eq!(lanes.lanes_of("p"), vec![STREAMS_PER_CONNECTION]);
        slots.push(lanes.take("p", channel).expect("a lane").1);
        assert_eq!(lanes.lanes_of("p"), vec![STREAMS_PER_CONNECTION, 1]);
        drop(slots.swap_remove(0));
        let _again = lanes.take("p", channel).expect("a lane");
        assert_eq!(
            lanes.lanes_of("p"),
            vec![STREAMS_PER_CONNECTION, 1],
            "the freed place on the first lane is taken before the second"
        );
        assert!(lanes.lanes_of("q").is_empty());
    }

    #[tokio::test]
    async fn a_failed_dial_takes_no_slot_and_forget_drops_the_lanes() {
        let lanes = StreamLanes::default();
        let failed = lanes.take("p", || Err::<Channel, _>("bad address"));
        assert_eq!(failed.err(), Some("bad address"));
        assert!(lanes.lanes.lock().unwrap().is_empty(), "nothing kept for p");
        let _slot = lanes.take("p", channel).expect("a lane");
        lanes.forget(&["p".to_string()]);
        assert!(lanes.lanes_of("p").is_empty());
    }
}
