//! Clock fencing: a node whose physical clock is out of step with a majority of the cluster
//! stops itself.
//!
//! # Why
//! Everything time-based in Meridian assumes that no two nodes' clocks differ by more than
//! `max_offset`: a new leader issues no write timestamp until that long after its election
//! (`issued`), snapshot reads use it as their uncertainty, the GC threshold keeps a margin of it,
//! the causality-token wait is bounded by it. HLC admission (a peer message more than `max_offset`
//! ahead is refused) only keeps a node's clock from being dragged forward; it does nothing about a
//! node that is slow, nor one 490 ms ahead with `max_offset` 500 ms, whose messages are still
//! admitted while it drifts. Past the bound those waits are too short and reads can go stale
//! without any error. So, as CockroachDB's `RemoteClockMonitor` does, a node that finds its clock
//! far from a majority of the others concludes the fault is its own and stops, at 80% of
//! `max_offset`, before the bound is broken (the other 20% is margin for drift between
//! measurements).
//!
//! ```text
//!  every heartbeat interval (quiesce.rs): ping each peer; the reply carries its physical clock
//!      → ClockOffset { offset ± uncertainty } and when it was measured   (PeerOffsets)
//!  every CHECK_INTERVAL (1 s): the latest offset per peer, if younger than MAX_MEASUREMENT_AGE
//!      peer out of step  ⇔  |offset| − uncertainty > 80% × max_offset
//!      check fails       ⇔  out-of-step peers ≥ ⌊N/2⌋ + 1   (N = cluster size, this node too)
//!  CHECKS_TO_FENCE (3) failed checks in a row → fail-stop: an ERROR log line and
//!      "fatal: this node's clock is ... ms off from K of M peers ..." on stderr, exit status 5
//! ```
//!
//! # The majority rule
//! A node fences only when a majority of the *cluster* (not of the peers it happens to
//! measure) is out of step with it. Nodes whose clocks are pairwise in step and form a majority
//! therefore never fence: each is out of step with at most `N − ⌊N/2⌋ − 1` peers, fewer than
//! `⌊N/2⌋ + 1`. With 3 nodes and one skewed, only the skewed node fences (the healthy two are
//! out of step with one peer each); with 5 nodes and two skewed, the two fence and the three
//! do not. The price: a node that cannot measure a majority (peers down or cut off, a 2-node
//! cluster) never fences, since it cannot tell whose clock is wrong; HLC admission still
//! refuses its messages beyond `max_offset`.
//!
//! # Conservative measurements
//! An offset is known within ± half the ping's round trip ([`ClockOffset::estimate`]); a peer
//! counts as out of step only if even the nearest end of that interval is past the threshold,
//! so a slow or congested link can delay a fence, never cause one. A measurement older than
//! [`MAX_MEASUREMENT_AGE`] does not count (that peer is treated as in step). One failed check
//! does nothing: it takes [`CHECKS_TO_FENCE`] in a row, [`CHECK_INTERVAL`] apart, and pings run
//! every heartbeat interval (400 ms by default), so the checks read different samples. So a
//! node fences about 3 s after it can first measure its peers (on loopback, a node started
//! 450 ms ahead exited 3.1 s after it was spawned: `tests/cluster/clock_offset.rs` in meridian-cli).
//!
//! # Pings carry no HLC
//! The measurement must work exactly when clocks are bad. While pings carried the sender's HLC
//! through admission, a node more than `max_offset` ahead had its pings refused and its replies
//! rejected, and measured nobody. Now a ping sends no timestamp (HLC 0, "none"), the handler
//! neither checks nor merges anything and answers with its physical clock only, and the pinger
//! merges nothing back. Pings carry no data, so there is no causality to carry; every other peer
//! RPC keeps its HLC admission. Liveness keeps its old meaning: the pinger counts a peer as
//! seen only if the measured offset is not beyond `max_offset` ([`within_max_offset`]), since
//! that peer's Raft messages are refused and a quiesced follower must still wake and elect
//! around it. The ping handler no longer marks the pinger seen (it cannot judge the pinger's
//! clock from one message); every node pings every peer, so each learns liveness itself.
//!
//! # Fail-stop
//! The reaction is to exit, as CockroachDB's: a node with a bad clock that stayed up could still
//! lead, hold leases and issue timestamps; an exit is simple and visible (a supervisor sees
//! [`EXIT_CLOCK_FENCED`] and the stderr line). The process exits without closing RocksDB, as if
//! it had crashed: Raft log appends are synced before they are acknowledged, and on restart the
//! node waits for its persisted HLC ceiling. The exit is a hook ([`FailStop`]) so tests can
//! observe it.
//!
//! # Invariants
//! - A node fences only after [`CHECKS_TO_FENCE`] consecutive checks, each finding a majority of
//!   the cluster's nodes (`⌊N/2⌋ + 1`) out of step by fresh measurements.
//! - A majority of nodes whose clocks are pairwise in step never fences any of them.
//! - The fail-stop hook is called at most once per check loop.
//!
//! # Not done yet
//! - All or nothing: a node between 80% of `max_offset` and the fence does not first give up
//!   its leaderships; nothing acts on offsets below 80% (they are shown in `cluster status`).
//! - The 80%, the check interval and the number of checks are constants, not configuration.
//! - Each peer's offset is its latest sample, not a filtered estimate over several pings.
//! - Nodes do not exchange their measurements: a node that cannot measure a majority of the
//!   cluster does not fence, however far off it is.

use crate::host::MultiRaft;
use crate::log_writer::FailStop;
use crate::types::NodeId;
use meridian_types::Timestamp;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How often a node checks its peers' offsets.
pub const CHECK_INTERVAL: Duration = Duration::from_secs(1);
/// Failed checks in a row that stop the node.
pub const CHECKS_TO_FENCE: u32 = 3;
/// A measurement older than this is ignored.
pub const MAX_MEASUREMENT_AGE: Duration = Duration::from_secs(10);
/// Exit status of a node that stopped itself because its clock was out of step.
pub const EXIT_CLOCK_FENCED: i32 = 5;

/// The offset, in ms, past which a peer is out of step: 80% of `max_offset_ms` (rounded down,
/// which changes nothing for a strict comparison of whole milliseconds).
pub fn fence_threshold_ms(max_offset_ms: u64) -> u64 {
    max_offset_ms.saturating_mul(4) / 5
}

/// A peer's physical clock minus ours, estimated from one round trip (Cristian's method): the
/// peer read its clock somewhere between our send and our receipt, so the true offset lies
/// within `offset_ms ± uncertainty_ms` (half the round trip, at least 1 ms), assuming neither
/// clock jumped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClockOffset {
    pub offset_ms: i64,
    pub uncertainty_ms: u64,
}

impl ClockOffset {
    pub fn estimate(sent: Timestamp, remote: Timestamp, received: Timestamp) -> ClockOffset {
        let (s, r) = (sent.physical_ms() as i128, received.physical_ms() as i128);
        let mid = (s + r.max(s)) / 2;
        ClockOffset {
            offset_ms: (remote.physical_ms() as i128 - mid) as i64,
            // At least 1: the readings are whole milliseconds (and 0 means "not measured").
            uncertainty_ms: ((r - s).max(0) as u64).div_ceil(2).max(1),
        }
    }

    /// The smallest offset the measurement allows, in absolute value.
    pub fn least_abs_ms(&self) -> u64 {
        self.offset_ms
            .unsigned_abs()
            .saturating_sub(self.uncertainty_ms)
    }
}

/// Whether a peer may be within `max_offset_ms` of us (the benefit of the doubt): if not, HLC
/// admission refuses its messages or it refuses ours.
pub fn within_max_offset(offset: &ClockOffset, max_offset_ms: u64) -> bool {
    offset.least_abs_ms() <= max_offset_ms
}

/// One peer's latest measurement and how old it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerOffset {
    pub peer: NodeId,
    pub offset: ClockOffset,
    pub age: Duration,
}

/// Each peer's latest measured offset, with when it was measured (held by the `PeerPool`).
#[derive(Default)]
pub struct PeerOffsets(Mutex<HashMap<NodeId, (ClockOffset, Instant)>>);

impl PeerOffsets {
    pub fn record(&self, peer: NodeId, offset: ClockOffset) {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(peer, (offset, Instant::now()));
    }

    pub fn get(&self, peer: NodeId) -> Option<ClockOffset> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&peer)
            .map(|(offset, _)| *offset)
    }

    /// Every peer's latest measurement with its age now.
    pub fn all(&self) -> Vec<PeerOffset> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(peer, (offset, at))| PeerOffset {
                peer: *peer,
                offset: *offset,
                age: at.elapsed(),
            })
            .collect()
    }
}

/// What one check found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Assessment {
    /// Peers whose fresh measurement is past the threshold, with it.
    pub out_of_step: Vec<(NodeId, ClockOffset)>,
    /// Peers with a fresh measurement.
    pub fresh: usize,
    /// Peers in the cluster (its size less this node).
    pub peers: usize,
    /// Out-of-step peers that fail the check: a majority of the cluster.
    pub majority: usize,
    pub threshold_ms: u64,
}

impl Assessment {
    /// Whether this check finds the node out of step with a majority of the cluster.
    pub fn fails(&self) -> bool {
        self.out_of_step.len() >= self.majority
    }

    /// The reason a fence gives, e.g. "this node's clock is 449 ms off from 2 of 2 peers (more
    /// than 80% of max_offset = 400 ms)"; the offset is the smallest the measurements allow.
    pub fn describe(&self) -> String {
        let least_ms = self
            .out_of_step
            .iter()
            .map(|(_, o)| o.least_abs_ms())
            .min()
            .unwrap_or(0);
        format!(
            "this node's clock is {least_ms} ms off from {} of {} peers (more than 80% of max_offset = {} ms)",
            self.out_of_step.len(),
            self.peers,
            self.threshold_ms
        )
    }
}

/// The fence's parameters, all explicit so tests can choose them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FencePolicy {
    /// Nodes in the cluster, this one included.
    pub cluster_size: usize,
    pub max_offset_ms: u64,
    pub max_measurement_age: Duration,
    pub checks_to_fence: u32,
}

impl FencePolicy {
    /// The policy a node runs: the module's constants.
    pub fn new(cluster_size: usize, max_offset: Duration) -> FencePolicy {
        FencePolicy {
            cluster_size,
            max_offset_ms: max_offset.as_millis() as u64,
            max_measurement_age: MAX_MEASUREMENT_AGE,
            checks_to_fence: CHECKS_TO_FENCE,
        }
    }

    /// One check over each peer's latest measurement (one per peer, never this node's own).
    pub fn assess(&self, measurements: &[PeerOffset]) -> Assessment {
        assert!(self.cluster_size >= 1, "a cluster has at least this node");
        let threshold_ms = fence_threshold_ms(self.max_offset_ms);
        let fresh: Vec<&PeerOffset> = measurements
            .iter()
            .filter(|m| m.age <= self.max_measurement_age)
            .collect();
        let peers = self.cluster_size - 1;
        debug_assert!(
            fresh.len() <= peers,
            "more measured peers than the cluster has"
        );
        let out_of_step = fresh
            .iter()
            .filter(|m| m.offset.least_abs_ms() > threshold_ms)
            .map(|m| (m.peer, m.offset))
            .collect();
        Assessment {
            out_of_step,
            fresh: fresh.len(),
            peers,
            majority: self.cluster_size / 2 + 1,
            threshold_ms,
        }
    }
}

/// What a check concluded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Fewer than a majority out of step; any streak of failed checks ends.
    InStep,
    /// Failed `streak` checks in a row, fewer than it takes to fence.
    OutOfStep { streak: u32, assessment: Assessment },
    /// Failed enough checks in a row: stop the node.
    Fence { assessment: Assessment },
}

/// Counts failed checks in a row.
pub struct ClockFence {
    policy: FencePolicy,
    streak: u32,
}

impl ClockFence {
    pub fn new(policy: FencePolicy) -> ClockFence {
        assert!(
            policy.checks_to_fence >= 1,
            "a fence needs at least one check"
        );
        ClockFence { policy, streak: 0 }
    }

    /// The cluster now has `cluster_size` nodes (one joined); a streak of failed checks goes
    /// on, judged by the new majority from the next check.
    pub fn resize(&mut self, cluster_size: usize) {
        self.policy.cluster_size = cluster_size.max(1);
    }

    pub fn check(&mut self, measurements: &[PeerOffset]) -> Verdict {
        let assessment = self.policy.assess(measurements);
        if !assessment.fails() {
            self.streak = 0;
            return Verdict::InStep;
        }
        self.streak = self.streak.saturating_add(1);
        if self.streak >= self.policy.checks_to_fence {
            Verdict::Fence { assessment }
        } else {
            Verdict::OutOfStep {
                streak: self.streak,
                assessment,
            }
        }
    }
}

/// The node's reaction to a fence: the reason in the log and on stderr, then exit with
/// [`EXIT_CLOCK_FENCED`].
pub fn exit_process() -> FailStop {
    Arc::new(|reason: &str| {
        tracing::error!(%reason, exit_status = EXIT_CLOCK_FENCED, "stopping the node: its clock is out of step with a majority of the cluster");
        eprintln!("fatal: {reason}; stopping (fix the clock and restart)");
        std::process::exit(EXIT_CLOCK_FENCED);
    })
}

/// Starts the fence of `host`, whose cluster is its peers (`set_peers`) and itself; the
/// cluster's size is read at every check, so a node that joins counts from then on.
pub fn spawn_for(host: &Arc<MultiRaft>) {
    let weak = Arc::downgrade(host);
    let size: ClusterSize = Arc::new(move || weak.upgrade().map(|h| 1 + h.peers().len()));
    let policy = FencePolicy::new(1 + host.peers().len(), host.clock.max_offset());
    spawn(host.pool.offsets.clone(), policy, size, exit_process());
}

/// The cluster's size now, this node included; `None` once the node is gone.
pub type ClusterSize = Arc<dyn Fn() -> Option<usize> + Send + Sync>;

/// Starts the node's check loop over `offsets` (what its pings measure): every
/// [`CHECK_INTERVAL`], with the cluster's size as `size` says then, and `stop` once the
/// policy says so (then the loop ends).
pub fn spawn(offsets: Arc<PeerOffsets>, policy: FencePolicy, size: ClusterSize, stop: FailStop) {
    tokio::spawn(async move {
        let mut fence = ClockFence::new(policy);
        let mut interval = tokio::time::interval(CHECK_INTERVAL);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            interval.tick().await;
            let Some(now) = size() else { return };
            fence.resize(now);
            if check_once(&mut fence, &offsets, &stop) {
                return;
            }
        }
    });
}

/// One check of the loop; whether it called `stop`.
fn check_once(fence: &mut ClockFence, offsets: &PeerOffsets, stop: &FailStop) -> bool {
    match fence.check(&offsets.all()) {
        Verdict::InStep => false,
        Verdict::OutOfStep { streak, assessment } => {
            tracing::warn!(
                streak,
                checks_to_fence = fence.policy.checks_to_fence,
                out_of_step = ?assessment.out_of_step,
                "{}; stopping the node if this persists",
                assessment.describe()
            );
            false
        }
        Verdict::Fence { assessment } => {
            stop(&assessment.describe());
            true
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAX_OFFSET: Duration = Duration::from_millis(500);

    fn offset(offset_ms: i64, uncertainty_ms: u64) -> ClockOffset {
        ClockOffset {
            offset_ms,
            uncertainty_ms,
        }
    }

    /// Fresh measurements (1 ms uncertainty, 100 ms old) of the given peers.
    fn measured(peers: &[(NodeId, i64)]) -> Vec<PeerOffset> {
        peers
            .iter()
            .map(|(peer, ms)| PeerOffset {
                peer: *peer,
                offset: offset(*ms, 1),
                age: Duration::from_millis(100),
            })
            .collect()
    }

    /// Each node's measurements of every other, for clocks at `clock_ms` (index 0 = node 1).
    fn views(clock_ms: &[i64]) -> Vec<Vec<PeerOffset>> {
        (0..clock_ms.len())
            .map(|me| {
                let peers: Vec<(NodeId, i64)> = (0..clock_ms.len())
                    .filter(|p| *p != me)
                    .map(|p| (p as NodeId + 1, clock_ms[p] - clock_ms[me]))
                    .collect();
                measured(&peers)
            })
            .collect()
    }

    /// Which nodes' checks fail, for clocks at `clock_ms`.
    fn failing(clock_ms: &[i64]) -> Vec<NodeId> {
        let policy = FencePolicy::new(clock_ms.len(), MAX_OFFSET);
        views(clock_ms)
            .iter()
            .enumerate()
            .filter(|(_, view)| policy.assess(view).fails())
            .map(|(i, _)| i as NodeId + 1)
            .collect()
    }

    #[test]
    fn the_threshold_is_80_percent_of_max_offset() {
        assert_eq!(fence_threshold_ms(500), 400);
        assert_eq!(fence_threshold_ms(250), 200);
        assert_eq!(fence_threshold_ms(u64::MAX), u64::MAX / 5);
    }

    #[test]
    fn with_three_nodes_only_the_skewed_one_fails_its_check() {
        assert_eq!(failing(&[0, 0, 450]), vec![3]);
        assert_eq!(failing(&[0, 0, -450]), vec![3]);
        assert_eq!(failing(&[0, 0, 5_000]), vec![3]);
        assert_eq!(failing(&[0, 200, 0]), Vec::<NodeId>::new(), "inside 80%");
        assert_eq!(failing(&[0, 0, 0]), Vec::<NodeId>::new());
    }

    #[test]
    fn with_five_nodes_one_or_two_skewed_nodes_fail_and_the_majority_does_not() {
        assert_eq!(failing(&[0, 0, 0, 0, 450]), vec![5]);
        assert_eq!(failing(&[0, 0, 0, 2_000, 2_000]), vec![4, 5]);
        assert_eq!(failing(&[0, 0, 0, -2_000, 2_000]), vec![4, 5]);
        // Three in step with each other are a majority: none of them fails.
        assert_eq!(failing(&[0, 300, 150, 2_000, -2_000]), vec![4, 5]);
    }

    #[test]
    fn the_offset_must_exceed_the_threshold_by_more_than_its_uncertainty() {
        let policy = FencePolicy::new(3, MAX_OFFSET);
        let both = |o: ClockOffset| {
            [1, 2]
                .map(|peer| PeerOffset {
                    peer,
                    offset: o,
                    age: Duration::ZERO,
                })
                .to_vec()
        };
        assert!(policy.assess(&both(offset(401, 0))).fails());
        assert!(!policy.assess(&both(offset(400, 0))).fails(), "not past");
        assert!(
            !policy.assess(&both(offset(-450, 50))).fails(),
            "could be 400"
        );
        assert!(policy.assess(&both(offset(-450, 49))).fails());
    }

    #[test]
    fn stale_measurements_are_ignored() {
        let policy = FencePolicy::new(3, MAX_OFFSET);
        let mut view = measured(&[(1, -450), (2, -450)]);
        view[1].age = MAX_MEASUREMENT_AGE + Duration::from_millis(1);
        let found = policy.assess(&view);
        assert_eq!((found.fresh, found.out_of_step.len()), (1, 1));
        assert!(!found.fails(), "one fresh peer is not a majority of 3");
        view[1].age = MAX_MEASUREMENT_AGE;
        assert!(policy.assess(&view).fails());
    }

    #[test]
    fn without_measurements_of_a_majority_nothing_fails() {
        let policy = FencePolicy::new(3, MAX_OFFSET);
        assert!(!policy.assess(&[]).fails());
        assert!(!policy.assess(&measured(&[(2, 5_000)])).fails());
        let five = FencePolicy::new(5, MAX_OFFSET);
        assert!(!five.assess(&measured(&[(1, 900), (2, 900)])).fails());
        assert!(five
            .assess(&measured(&[(1, 900), (2, 900), (3, 900)]))
            .fails());
        // One or two nodes: no majority of peers can ever disagree.
        assert!(!FencePolicy::new(1, MAX_OFFSET).assess(&[]).fails());
        assert!(!FencePolicy::new(2, MAX_OFFSET)
            .assess(&measured(&[(2, 5_000)]))
            .fails());
    }

    #[test]
    fn it_takes_three_failed_checks_in_a_row_to_fence() {
        let mut fence = ClockFence::new(FencePolicy::new(3, MAX_OFFSET));
        let skewed = measured(&[(1, -450), (2, -450)]);
        let fine = measured(&[(1, 0), (2, -450)]);
        // One good check ends the streak: a single bad sample never fences.
        let streaks: Vec<Option<u32>> = [&skewed, &skewed, &fine, &skewed, &skewed]
            .map(|view| match fence.check(view) {
                Verdict::InStep => None,
                Verdict::OutOfStep { streak, .. } => Some(streak),
                Verdict::Fence { .. } => panic!("fenced before three failed checks in a row"),
            })
            .to_vec();
        assert_eq!(streaks, [Some(1), Some(2), None, Some(1), Some(2)]);
        let Verdict::Fence { assessment } = fence.check(&skewed) else {
            panic!("three failed checks in a row must fence");
        };
        assert_eq!(
            assessment.describe(),
            "this node's clock is 449 ms off from 2 of 2 peers (more than 80% of max_offset = 400 ms)"
        );
    }

    /// A node that joins grows the majority: two out-of-step peers are a majority of three
    /// nodes, not of five, so after the resize the same view no longer counts as failed.
    #[test]
    fn a_joined_node_grows_the_majority_the_fence_needs() {
        let mut fence = ClockFence::new(FencePolicy::new(3, MAX_OFFSET));
        let skewed = measured(&[(1, -450), (2, -450)]);
        assert!(matches!(
            fence.check(&skewed),
            Verdict::OutOfStep { streak: 1, .. }
        ));
        fence.resize(5);
        assert_eq!(fence.check(&skewed), Verdict::InStep);
        fence.resize(3);
        assert!(matches!(
            fence.check(&skewed),
            Verdict::OutOfStep { streak: 1, .. }
        ));
    }

    #[test]
    fn the_check_loop_calls_the_stop_hook_once_with_the_reason() {
        let reasons: Arc<Mutex<Vec<String>>> = Arc::default();
        let seen = reasons.clone();
        let stop: FailStop = Arc::new(move |reason: &str| {
            seen.lock().unwrap().push(reason.to_string());
        });
        let offsets = PeerOffsets::default();
        offsets.record(2, offset(-5_000, 1));
        offsets.record(3, offset(-5_010, 3));
        let mut fence = ClockFence::new(FencePolicy::new(3, MAX_OFFSET));
        let stopped: Vec<bool> = (0..3)
            .map(|_| check_once(&mut fence, &offsets, &stop))
            .collect();
        assert_eq!(stopped, vec![false, false, true]);
        assert_eq!(
            *reasons.lock().unwrap(),
            vec![
                "this node's clock is 4999 ms off from 2 of 2 peers (more than 80% of max_offset = 400 ms)"
                    .to_string()
            ]
        );
    }

    #[test]
    fn a_peer_is_live_only_within_max_offset() {
        assert!(within_max_offset(&offset(500, 1), 500));
        assert!(
            within_max_offset(&offset(-501, 1), 500),
            "benefit of the doubt"
        );
        assert!(!within_max_offset(&offset(-502, 1), 500));
        assert!(!within_max_offset(&offset(5_000, 3), 500));
    }

    #[test]
    fn a_clock_offset_is_the_remote_reading_against_the_round_trip_midpoint() {
        let ms = Timestamp::from_physical_ms;
        // Sent at 1000, answered at 1010 by a clock reading 1305: 300 ahead, ± 5.
        let o = ClockOffset::estimate(ms(1_000), ms(1_305), ms(1_010));
        assert_eq!((o.offset_ms, o.uncertainty_ms), (300, 5));
        // A peer behind us.
        let o = ClockOffset::estimate(ms(5_000), ms(4_800), ms(5_002));
        assert_eq!((o.offset_ms, o.uncertainty_ms), (-201, 1));
        // Our clock stepped back between send and receipt: no negative round trip.
        let o = ClockOffset::estimate(ms(2_000), ms(2_000), ms(1_990));
        assert_eq!((o.offset_ms, o.uncertainty_ms), (0, 1));
    }
}
