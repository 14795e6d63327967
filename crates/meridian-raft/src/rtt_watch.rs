//! Warns when a peer's round trip leaves heartbeats no time to be answered.
//!
//! openraft waits for each heartbeat's answer one heartbeat interval (its `HeartbeatWorker`
//! times the call out after `heartbeat_interval`). A follower whose round trip is longer never
//! acknowledges a heartbeat, so its leader cannot renew its lease from it; when no nearer
//! follower can complete the quorum, the leader refuses every write. The nine-node container
//! cluster showed it: with a 150 ms interval, a shard left with one replica in us-east and one
//! in ap-south (200 ms apart) after its eu-west node died failed every write for as long as
//! the node was down. Nothing in the logs said why (the heartbeat warnings look like a slow
//! network), so this module says it.
//!
//! The node-level pings (`quiesce`) measure every peer's round trip once per heartbeat
//! interval. When one reaches 80% of the interval (the rest is the margin a busy node needs to
//! process the heartbeat), the node logs a warning naming the peer, the round trip and the
//! setting to raise, at most once a minute.
//!
//! Not done: the warning is a log line only (no status column or metric), and it judges the
//! ping's round trip, which crosses the same links as Raft's traffic but is another RPC.

use crate::clock_fence::ClockOffset;
use crate::network::RateLimitedLog;
use crate::types::NodeId;
use std::time::Duration;

/// Whether heartbeats to a peer `rtt_ms` away are at risk of timing out under a heartbeat
/// interval of `heartbeat_interval_ms`: the round trip is 80% of the interval or more.
fn at_risk(rtt_ms: u64, heartbeat_interval_ms: u64) -> bool {
    rtt_ms.saturating_mul(5) >= heartbeat_interval_ms.saturating_mul(4)
}

/// The warning for a peer `rtt_ms` away under a heartbeat interval of `heartbeat_interval_ms`,
/// if heartbeats to it are at risk of timing out (see [`at_risk`]).
pub fn heartbeat_rtt_warning(
    peer: NodeId,
    rtt_ms: u64,
    heartbeat_interval_ms: u64,
) -> Option<String> {
    at_risk(rtt_ms, heartbeat_interval_ms).then(|| {
        format!(
            "the round trip to node {peer} took {rtt_ms} ms, at least 80% of \
             raft.heartbeat_interval_ms ({heartbeat_interval_ms} ms), which is also how long a \
             leader waits for a heartbeat's answer: heartbeats to node {peer} time out (or \
             nearly do, with no room for a busy node), and a shard whose quorum needs it cannot \
             renew its leader's lease and refuses writes; raise raft.heartbeat_interval_ms \
             above the longest round trip between replicas"
        )
    })
}

/// Judges the pings' round trips against the heartbeat interval (see the module docs).
pub struct RttWatch {
    heartbeat_interval_ms: u64,
    log: RateLimitedLog,
}

impl RttWatch {
    pub fn new(heartbeat_interval_ms: u64) -> Self {
        RttWatch {
            heartbeat_interval_ms,
            log: RateLimitedLog::new(Duration::from_secs(60)),
        }
    }

    /// A ping to `peer` came back with `offset`, whose uncertainty is half its round trip.
    pub fn note(&self, peer: NodeId, offset: &ClockOffset) {
        let rtt_ms = offset.uncertainty_ms.saturating_mul(2);
        // Judged on every ping; the text is made only for the warning the limit lets through.
        if at_risk(rtt_ms, self.heartbeat_interval_ms) && self.log.should_log() {
            if let Some(warning) = heartbeat_rtt_warning(peer, rtt_ms, self.heartbeat_interval_ms) {
                tracing::warn!(peer, rtt_ms, "{warning}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warns_from_80_percent_of_the_heartbeat_interval() {
        // The case that failed: ap-south seen from us-east, 200 ms, with 150 ms heartbeats.
        let said = heartbeat_rtt_warning(9, 200, 150).expect("200 ms against 150 ms");
        assert!(said.contains("node 9") && said.contains("200 ms"), "{said}");
        assert!(
            said.contains("raft.heartbeat_interval_ms (150 ms)"),
            "{said}"
        );
        // The default interval leaves room for it.
        assert_eq!(heartbeat_rtt_warning(9, 200, 400), None);
        // The threshold is 80%: 120 of 150 warns, 119 does not.
        assert!(heartbeat_rtt_warning(2, 120, 150).is_some());
        assert_eq!(heartbeat_rtt_warning(2, 119, 150), None);
        // Loopback: nothing.
        assert_eq!(heartbeat_rtt_warning(2, 1, 100), None);
    }
}
