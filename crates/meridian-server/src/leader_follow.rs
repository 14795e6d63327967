//! Leaders follow their shard's home region (see `home`): a node that leads a homed shard from
//! outside the home region hands leadership to a caught-up voter in the home region.
//!
//! # How
//! Every `election_timeout_max`, for each data shard with a home that this node leads from
//! another region (homes as the shard map this node holds now says, so a home changed at run
//! time is followed from the next round), the loop picks a voter of the home region whose
//! replicated log reaches this leader's last log index (openraft's replication metrics) and calls openraft's
//! cooperative `transfer_leader`: the leader stops serving lease reads and tells the target
//! to campaign at once, and the target wins because its log is up to date. The shard is
//! woken first (a quiesced group has no heartbeats; the transfer message wakes the target).
//!
//! # Hysteresis and rate
//! - A node hands a shard over only after leading it for `2 × election_timeout_max`, so a
//!   failover's winner first settles (and the home replica, just restarted, catches up).
//! - At most one attempt per shard per `10 × election_timeout_max`: a home replica that
//!   keeps losing (partitioned, slow, clock-fenced) is not hammered.
//! - A transfer is a hint: if the target does not win, this node (or another) is elected as
//!   usual, and the next attempt waits its turn. Safety is Raft's.
//!
//! The same loop biases elections (`election_bias`): a replica outside the home region leaves
//! elections to a live voter of the home region, so a home region with two voters keeps the
//! leadership through a leader's crash without a transfer. It also changes the voters of the
//! shards this node leads to what their survival goal wants (`survival`).
//!
//! # Not done yet
//! - No preference among several voters of the home region beyond the first caught up.

use crate::node::Node;
use meridian_types::{NodeId, ShardId};
use openraft::type_config::async_runtime::WatchReceiver;
use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

/// What the loop remembers per shard it led.
#[derive(Default)]
struct Led {
    since: Option<Instant>,
    last_attempt: Option<Instant>,
}

/// Starts the loop (always: `cluster placement` may give a shard a home at any time); it ends
/// when the node is dropped. A round over shards without a home costs a walk of the map.
pub(crate) fn spawn(node: &Arc<Node>) {
    let period = Duration::from_millis(node.config.raft.election_timeout_max_ms);
    let weak: Weak<Node> = Arc::downgrade(node);
    tokio::spawn(async move {
        let mut led: HashMap<ShardId, Led> = HashMap::new();
        let mut bias = HashMap::new();
        let mut role_changes = HashMap::new();
        loop {
            tokio::time::sleep(period).await;
            let Some(node) = weak.upgrade() else { return };
            crate::election_bias::step(&node, &mut bias, period);
            step(&node, &mut led, period).await;
            crate::survival::step(&node, &mut role_changes, period);
        }
    });
}

/// One round over the homed shards.
async fn step(node: &Node, led: &mut HashMap<ShardId, Led>, period: Duration) {
    let me = node.config.node_id;
    for desc in &node.map().data {
        let Some(home) = desc.home.as_deref() else {
            continue;
        };
        let Some(replica) = node.host.get(desc.id) else {
            continue;
        };
        if replica.raft.metrics().borrow_watched().current_leader != Some(me) {
            led.remove(&desc.id);
            continue;
        }
        if node.config.region == home {
            continue;
        }
        let now = Instant::now();
        let state = led.entry(desc.id).or_default();
        let since = *state.since.get_or_insert(now);
        if now.duration_since(since) < period * 2
            || state
                .last_attempt
                .is_some_and(|t| now.duration_since(t) < period * 10)
        {
            continue;
        }
        // Only for a shard due a hand-over: a copy of its metrics (membership, replication).
        let metrics = replica.raft.metrics().borrow_watched().clone();
        let last = metrics.last_log_index.unwrap_or(0);
        let voters: Vec<NodeId> = metrics.membership_config.membership().voter_ids().collect();
        let caught_up = |id: &NodeId| {
            metrics
                .replication
                .as_ref()
                .and_then(|r| r.get(id))
                .and_then(|m| m.as_ref())
                .is_some_and(|m| m.index >= last)
        };
        let target = voters
            .into_iter()
            .find(|id| *id != me && region_of(node, *id).as_deref() == Some(home) && caught_up(id));
        let Some(target) = target else {
            continue;
        };
        state.last_attempt = Some(now);
        // Wake the group (heartbeats on) before handing it over.
        if node.replica(desc.id).is_err() {
            continue;
        }
        tracing::info!(shard = %desc.id, to = target, %home, "handing leadership to the shard's home region");
        if let Err(e) = replica.raft.trigger().transfer_leader(target).await {
            tracing::warn!(shard = %desc.id, error = %e, "leader transfer failed");
        }
    }
}

fn region_of(node: &Node, id: NodeId) -> Option<String> {
    node.member(id).map(|m| m.region)
}
