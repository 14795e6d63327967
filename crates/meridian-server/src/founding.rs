//! Opening this node's replicas at start and forming the founding Raft groups.
//!
//! # What
//! [`open_and_bootstrap`] opens a replica of every shard the map places on this node, with
//! its elections held until a quorum of its group would grant votes (`election_hold`). On a
//! cluster's first start (map version 1) the founding replicas also form their groups once
//! released: the first replica in placement order initializes its group, and the others
//! initialize with the identical membership (safe in Raft) only if the group is still
//! pristine a few election timeouts later, so a founding member that is down or clock-skewed
//! at first start cannot keep its groups from forming. Placement rotates the first replica,
//! spreading leaders.
//!
//! # Invariants
//! - Only founding replicas of a never-changed map (version 1) initialize Raft groups; a
//!   replica added by a move is always empty until its leader feeds it.
//! - A founding replica initializes only after its hold is released: the first election an
//!   `initialize` starts has a quorum that would grant votes, unless the hold gave up waiting
//!   (`election_hold::QUORUM_WAIT_MAX`).
//!
//! # Not done yet
//! - Groups whose membership names a member this node has no address for count it as silent
//!   (one that needs it for its quorum waits `election_hold::QUORUM_WAIT_MAX`).

use crate::election_hold::{release_when_quorate, AfterRelease, Waiting};
use crate::node::Node;
use meridian_raft::ShardReplica;
use meridian_types::{NodeId, ShardId};
use openraft::impls::BasicNode;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

/// Opens a replica of every shard the map places on this node, holds its elections until its
/// quorum would grant votes, and on a first start forms the founding groups once released
/// (see the module docs).
pub(crate) async fn open_and_bootstrap(node: &Node) -> anyhow::Result<()> {
    let me = node.config.node_id;
    let all = node.members();
    let map = node.map();
    let raft = &node.config.raft;
    let window = Duration::from_millis(raft.election_timeout_max_ms);
    let spread = Duration::from_millis(
        raft.election_timeout_max_ms
            .saturating_sub(raft.election_timeout_min_ms),
    );
    let mut waiting = Vec::new();
    for desc in map.all() {
        if !desc.replicas.contains(&me) {
            continue;
        }
        let replica = node
            .host
            .open_shard(desc.id, desc.span())
            .await
            .map_err(|e| anyhow::anyhow!(e))?;
        let held = node.election_hold.hold(desc.id, &replica);
        // Only founding replicas may form a group. Once the map changed, every group has
        // formed; a replica added since (empty until its leader sends it the log or a
        // snapshot) must never initialize one of its own.
        let (fallback_voters, after) = if map.version == 1 {
            let members: BTreeMap<NodeId, BasicNode> = desc
                .replicas
                .iter()
                .filter_map(|id| all.get(id).map(|n| (*id, n.clone())))
                .collect();
            let position = desc.replicas.iter().position(|id| *id == me).unwrap_or(0) as u64;
            let delay = Duration::from_millis(raft.election_timeout_max_ms * 2 * position);
            let voters = members.keys().copied().collect();
            let init = initialize(replica, desc.id, members, position, delay);
            (voters, Some(init))
        } else {
            (Vec::new(), None)
        };
        waiting.push(Waiting {
            held,
            fallback_voters,
            after,
        });
    }
    tokio::spawn(release_when_quorate(
        Arc::clone(&node.host),
        window,
        spread,
        waiting,
    ));
    Ok(())
}

/// A founding replica's `initialize`, `delay` after its release, unless its group formed.
fn initialize(
    replica: Arc<ShardReplica>,
    shard: ShardId,
    members: BTreeMap<NodeId, BasicNode>,
    position: u64,
    delay: Duration,
) -> AfterRelease {
    Box::pin(async move {
        tokio::time::sleep(delay).await;
        match replica.raft.is_initialized().await {
            Ok(true) => {}
            Ok(false) => match replica.raft.initialize(members).await {
                Ok(()) => tracing::info!(%shard, position, "initialized raft group"),
                Err(e) => tracing::debug!(%shard, error = %e, "initialize not needed"),
            },
            Err(e) => tracing::warn!(%shard, error = %e, "cannot check raft initialization"),
        }
    })
}
