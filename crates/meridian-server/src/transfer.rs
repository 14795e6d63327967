//! An operator's leader transfer (`meridian cluster transfer-leader SHARD NODE`).
//!
//! The shard's leader checks the target is a voter, wakes the group (a quiesced group has no
//! heartbeats), waits (at most one election timeout) until the target's replicated log reaches
//! the leader's last index, and calls openraft's
//! cooperative `transfer_leader`: the leader stops serving lease reads and tells the target to
//! campaign at once; it wins because its log is up to date. The call then waits, at most
//! [`TRANSFER_WAIT_FACTOR`] election timeouts, until this node sees the target lead.
//!
//! A transfer is a request, not a guarantee: the target may lose (partitioned, clock-fenced),
//! and a shard with a home region is moved back home by `leader_follow` unless the target is in
//! that region. Safety is Raft's either way.

use crate::error::{Result, ServerError};
use crate::node::Node;
use meridian_types::{NodeId, ShardId};
use openraft::type_config::async_runtime::WatchReceiver;
use std::time::{Duration, Instant};

/// How many maximum election timeouts the call waits for the target to lead.
pub const TRANSFER_WAIT_FACTOR: u32 = 3;

/// Hands `shard`'s leadership to `to`; returns the (leader, term) seen at the end.
pub async fn transfer_leader(node: &Node, shard: ShardId, to: NodeId) -> Result<(NodeId, u64)> {
    let me = node.config.node_id;
    if node.map().get(shard).is_none() {
        return Err(ServerError::InvalidArgument(format!("no shard {shard}")));
    }
    let replica = node.host.get(shard).ok_or_else(|| {
        ServerError::WrongShard(format!("shard {shard} has no replica on node {me}"))
    })?;
    let metrics = replica.raft.metrics().borrow_watched().clone();
    if metrics.current_leader != Some(me) {
        return Err(node.not_leader(shard, metrics.current_leader).await);
    }
    if to == me {
        return Ok((me, metrics.current_term));
    }
    let voters: Vec<NodeId> = metrics.membership_config.membership().voter_ids().collect();
    if !voters.contains(&to) {
        return Err(ServerError::InvalidArgument(format!(
            "node {to} is not a voter of shard {shard} (voters: {voters:?})"
        )));
    }
    // Wake the group (heartbeats on): a quiesced group replicates nothing, and a target just
    // behind (say, the previous leader, which has yet to get the new term's first entry)
    // catches up within a heartbeat or two.
    node.replica(shard)?;
    let mut watch = replica.raft.metrics();
    let catch_up = Duration::from_millis(node.config.raft.election_timeout_max_ms);
    let give_up = Instant::now() + catch_up;
    loop {
        let now = watch.borrow_watched().clone();
        if now.current_leader != Some(me) {
            return Err(node.not_leader(shard, now.current_leader).await);
        }
        let last = now.last_log_index.unwrap_or(0);
        let matched = now
            .replication
            .as_ref()
            .and_then(|r| r.get(&to))
            .and_then(|m| m.as_ref())
            .map_or(0, |m| m.index);
        if matched >= last {
            break;
        }
        let remaining = give_up.saturating_duration_since(Instant::now());
        if remaining.is_zero() {
            return Err(ServerError::Unavailable(format!(
                "node {to} has replicated shard {shard}'s log to index {matched} of {last} \
                 after {} ms; try again when it has caught up",
                catch_up.as_millis()
            )));
        }
        let _ = tokio::time::timeout(remaining, watch.changed()).await;
    }
    tracing::info!(%shard, to, "transferring leadership on request");
    replica
        .raft
        .trigger()
        .transfer_leader(to)
        .await
        .map_err(|e| ServerError::Internal(format!("leader transfer: {e}")))?;
    let wait =
        Duration::from_millis(node.config.raft.election_timeout_max_ms) * TRANSFER_WAIT_FACTOR;
    let give_up = Instant::now() + wait;
    loop {
        let now = watch.borrow_watched().clone();
        if now.current_leader == Some(to) {
            return Ok((to, now.current_term));
        }
        let remaining = give_up.saturating_duration_since(Instant::now());
        if remaining.is_zero() {
            return Err(ServerError::Unavailable(format!(
                "node {to} did not take over shard {shard} within {} ms (leader now: {})",
                wait.as_millis(),
                now.current_leader
                    .map_or("none known".to_string(), |l| format!("node {l}"))
            )));
        }
        let _ = tokio::time::timeout(remaining, watch.changed()).await;
    }
}
