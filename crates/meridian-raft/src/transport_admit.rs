//! Admission of peer messages (see `transport`): a former member is refused (and told so, which
//! stops it), the sender's HLC reading is merged into this node's clock, the sender is noted
//! alive, the shard must be hosted here, and a quiesced replica wakes. Moved out of
//! `transport.rs` unchanged when the parked promises made that file grow.

use crate::host::{MultiRaft, ShardReplica};
use crate::network::{clock_rejection, RateLimitedLog};
use crate::transport_stats::PeerMessage;
use crate::types::*;
use meridian_proto::raft::RaftRequest;
use meridian_types::{ShardId, Timestamp};
use std::sync::Arc;
use tonic::Status;

/// The metadata key of a refusal as forgotten; its value is the refused node's id.
pub const FORGOTTEN_HEADER: &str = "meridian-forgotten";

/// The exit status of a node that a peer refused as forgotten (see [`exit_forgotten`]).
pub const EXIT_FORGOTTEN: i32 = 79;

/// Stops this node: peer `peer` refused its ping because the cluster forgot it (`meridian
/// cluster forget`). Nothing is lost: a member is forgotten only once no shard lists it, and
/// the list of forgotten members only grows (ids are never reused), so one peer's word is the
/// cluster's. Running on would only have its peers refuse everything it sends.
pub(crate) fn exit_forgotten(node: NodeId, peer: NodeId, said: &str) -> ! {
    tracing::error!(peer, %said, exit_status = EXIT_FORGOTTEN, "stopping the node: the cluster forgot it");
    eprintln!(
        "fatal: node {node} was forgotten by the cluster (node {peer} says: {said}); stopping \
         (it holds no replica: wipe its data directory and --join it with a new id to use it again)"
    );
    std::process::exit(EXIT_FORGOTTEN)
}

/// PERMISSION_DENIED for a message from a forgotten member (see [`MultiRaft::set_forgotten`]),
/// marked with [`FORGOTTEN_HEADER`] naming it (what makes a pinging node stop: a bare
/// PERMISSION_DENIED, say from a proxy, does not).
pub(crate) fn refuse_forgotten(host: &MultiRaft, from: u64) -> Result<(), Status> {
    if host.is_forgotten(from) {
        let mut status = Status::permission_denied(format!(
            "node {from} was forgotten by the cluster (meridian cluster forget): it is no longer \
             a member; ids are never reused, so wipe its data directory and --join it with a \
             new id"
        ));
        status.metadata_mut().insert(FORGOTTEN_HEADER, from.into());
        return Err(status);
    }
    Ok(())
}

/// Admits one peer message for a shard: merges the sender's clock (rejecting it beyond
/// `max_offset`), notes the sender alive, finds the replica, and wakes it if quiesced.
/// Refuses a forgotten member first ([`refuse_forgotten`]), before its clock reading is merged.
pub(crate) fn admit(
    host: &Arc<MultiRaft>,
    clock_log: &RateLimitedLog,
    shard_id: u64,
    hlc: u64,
    from: u64,
) -> Result<Arc<ShardReplica>, Status> {
    refuse_forgotten(host, from)?;
    if let Err(e) = host.clock.update(Timestamp(hlc)) {
        if clock_log.should_log() {
            tracing::error!(from_node = from, error = %e, "rejecting peer message");
        }
        return Err(clock_rejection(&e));
    }
    host.pool.mark_seen(from);
    let replica = host.get(ShardId(shard_id)).ok_or_else(|| {
        Status::not_found(format!(
            "shard {shard_id} has no replica on node {}",
            host.node_id
        ))
    })?;
    if let Some(leader) = replica.on_peer_message(from) {
        host.send_wake(replica.shard, leader);
    }
    Ok(replica)
}

/// One request after the first on an append stream, or `None` to end the stream: a transport
/// error, a switch of shard, a clock beyond `max_offset` or a malformed payload. Ending (not
/// skipping) matters: a skipped request would leave a gap the next one's `prev_log_id`
/// cannot match, and the leader learns of a failure sooner from a closed stream.
pub(crate) fn admit_stream_request(
    host: &Arc<MultiRaft>,
    replica: &ShardReplica,
    shard_id: u64,
    r: Result<RaftRequest, Status>,
) -> Option<AppendEntriesRequest> {
    let req = r.ok()?;
    host.transport_stats.received(PeerMessage::StreamedAppend);
    if let Some(leader) = replica.on_peer_message(req.from_node) {
        host.send_wake(replica.shard, leader);
    }
    if req.shard_id != shard_id {
        tracing::warn!(
            shard_id,
            got = req.shard_id,
            "append stream switched shards; closing"
        );
        return None;
    }
    if let Err(e) = host.clock.update(Timestamp(req.hlc)) {
        tracing::error!(from_node = req.from_node, error = %e, "rejecting peer message; closing the append stream");
        return None;
    }
    match decode_payload::<AppendEntriesRequest>(&req) {
        Ok(rpc) => Some(rpc),
        Err(e) => {
            tracing::warn!(shard_id, error = %e, "malformed append on a stream; closing");
            None
        }
    }
}

pub(crate) fn decode_payload<T: serde::de::DeserializeOwned>(
    req: &RaftRequest,
) -> Result<T, Status> {
    codec::decode(&req.payload)
        .map_err(|e| Status::invalid_argument(format!("malformed raft payload: {e}")))
}
