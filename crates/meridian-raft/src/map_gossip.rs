//! Shard map versions on pings: a node that missed a map change learns it from the next ping.
//!
//! A change to the shard map (a replica move, a join, a forget, a placement) is pushed once to
//! every member by the node that made it (the server's `membership`). A member that was down
//! learns it at its next start; one that was up but cut off (a partition) would keep routing by,
//! and hosting the replicas of, its older map until the next change reached it. So every ping
//! carries the pinger's map version (the request's payload), and a node whose own map is newer
//! hands the pinger's id to the server's listener, which pushes its record to it: one ping
//! interval after a partition heals, the cut-off node has the map.
//!
//! # Invariants
//! - Only versions travel on pings (8 bytes); the record travels by the usual push, which the
//!   receiver adopts only if newer (so a late or repeated push is harmless).
//! - At most one notice per peer per [`NOTICE_INTERVAL`]: a peer that cannot take the record
//!   (it refuses the map, or the push fails) is not sent it on every ping.
//! - A ping without a payload (a node from before this module) is answered as before.

use crate::types::NodeId;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// Shortest time between two notices about one peer.
pub const NOTICE_INTERVAL: Duration = Duration::from_secs(1);

/// Called with the id of a peer whose pinged map version is older than this node's.
pub type BehindListener = Arc<dyn Fn(NodeId) + Send + Sync>;

/// This node's map version and what to do about peers behind it.
#[derive(Default)]
pub struct MapGossip {
    version: AtomicU64,
    listener: OnceLock<BehindListener>,
    noticed: Mutex<HashMap<NodeId, Instant>>,
}

impl MapGossip {
    /// The version this node routes by (the server sets it whenever it adopts a map).
    pub fn set_version(&self, version: u64) {
        self.version.store(version, Ordering::SeqCst);
    }

    pub fn version(&self) -> u64 {
        self.version.load(Ordering::SeqCst)
    }

    /// Hands peers found behind to `listener` from now on (once; later calls are ignored).
    pub fn set_listener(&self, listener: BehindListener) {
        let _ = self.listener.set(listener);
    }

    /// A ping from `peer` said its map version is `theirs`: notifies the listener if this
    /// node's is newer and `peer` was not noticed within [`NOTICE_INTERVAL`]. Returns whether
    /// it did.
    pub fn peer_has(&self, peer: NodeId, theirs: u64) -> bool {
        if theirs >= self.version() {
            return false;
        }
        let Some(listener) = self.listener.get() else {
            return false;
        };
        {
            let mut noticed = self.noticed.lock().unwrap_or_else(|p| p.into_inner());
            let now = Instant::now();
            if noticed
                .get(&peer)
                .is_some_and(|at| now.duration_since(*at) < NOTICE_INTERVAL)
            {
                return false;
            }
            noticed.insert(peer, now);
        }
        listener(peer);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_peer_behind_is_noticed_and_at_most_once_per_interval() {
        let gossip = MapGossip::default();
        gossip.set_version(5);
        assert!(!gossip.peer_has(2, 4), "no listener yet: nothing to do");
        let seen = Arc::new(Mutex::new(Vec::new()));
        let record = seen.clone();
        gossip.set_listener(Arc::new(move |peer| record.lock().unwrap().push(peer)));
        assert!(!gossip.peer_has(2, 5), "same version");
        assert!(!gossip.peer_has(2, 6), "the peer is ahead");
        assert!(gossip.peer_has(2, 4));
        assert!(!gossip.peer_has(2, 4), "noticed within the interval");
        assert!(gossip.peer_has(3, 1), "another peer");
        assert_eq!(*seen.lock().unwrap(), vec![2, 3]);
    }
}
