//! The public `Cluster` service: nodes, shards, leaders, terms, applied index and lag, as this
//! node sees them (clients use it as their shard map); an operator's leader transfer
//! (see `transfer`), replica moves (see `membership`), joins (see `join`) and placement (see
//! `home`); and, for the geo benchmark's oracle mode only, a timestamp from the metadata
//! shard's leader.

use crate::node::Node;
use bytes::Bytes;
use meridian_proto::kv::cluster_server::Cluster;
use meridian_proto::kv::*;
use meridian_types::ShardId;
use openraft::type_config::async_runtime::WatchReceiver;
use std::sync::Arc;
use std::time::Duration;
use tonic::{Request, Response, Status};

/// A peer counts as live if it acknowledged replication within this window.
pub(crate) const LIVENESS_WINDOW: Duration = Duration::from_secs(5);

pub struct ClusterService {
    node: Arc<Node>,
}

impl ClusterService {
    pub fn new(node: Arc<Node>) -> ClusterService {
        ClusterService { node }
    }

    pub fn into_server(self) -> meridian_proto::kv::cluster_server::ClusterServer<ClusterService> {
        meridian_proto::kv::cluster_server::ClusterServer::new(self)
    }
}

#[tonic::async_trait]
impl Cluster for ClusterService {
    async fn status(
        &self,
        _request: Request<StatusRequest>,
    ) -> Result<Response<StatusResponse>, Status> {
        let node = &self.node;
        let me = node.config.node_id;
        let mut shards = Vec::new();
        let map = node.map();
        for desc in map.all() {
            let mut info = ShardInfo {
                shard_id: desc.id.0,
                start: Bytes::from(desc.start.clone()),
                end: Bytes::from(desc.end.clone()),
                replicas: desc.replicas.clone(),
                home_region: desc.home.clone().unwrap_or_default(),
                survival: desc.survival.as_str().to_string(),
                constraints: desc.constraints.status_text(),
                generation: desc.generation,
                ..Default::default()
            };
            if let Some(replica) = node.host.get(desc.id) {
                let m = replica.raft.metrics().borrow_watched().clone();
                info.leader_id = m.current_leader.unwrap_or(0);
                info.term = m.current_term;
                info.applied_index = m.last_applied.as_ref().map(|l| l.index).unwrap_or(0);
                info.last_log_index = m.last_log_index.unwrap_or(0);
                info.quiesced = replica.is_quiesced();
                info.closed_ts = replica.sm.closed_ts();
                let membership = m.membership_config.membership();
                info.voters = membership.voter_ids().collect();
                info.learners = membership.learner_ids().collect();
                info.joint = membership.get_joint_config().len() > 1;
                if let Some(repl) = &m.replication {
                    info.replica_status = repl
                        .iter()
                        .map(|(id, matched)| ReplicaStatus {
                            node_id: *id,
                            matched_index: matched.as_ref().map(|l| l.index).unwrap_or(0),
                        })
                        .collect();
                }
            }
            shards.push(info);
        }
        let nodes = node
            .registry()
            .await
            .into_values()
            .map(|r| {
                let offset = (r.node_id != me)
                    .then(|| node.host.pool.offset_of(r.node_id))
                    .flatten();
                NodeInfo {
                    live: r.node_id == me || node.host.pool.seen_within(r.node_id, LIVENESS_WINDOW),
                    clock_offset_ms: offset.map_or(0, |o| o.offset_ms),
                    clock_offset_uncertainty_ms: offset.map_or(0, |o| o.uncertainty_ms),
                    node_id: r.node_id,
                    client_addr: r.client_addr,
                    peer_addr: r.peer_addr,
                    region: r.region,
                    zone: r.zone,
                }
            })
            .collect();
        let w = node.host.writer.stats();
        let load = |v: &std::sync::atomic::AtomicU64| v.load(std::sync::atomic::Ordering::Relaxed);
        Ok(Response::new(StatusResponse {
            cluster_id: node.cluster_id.clone(),
            answering_node: me,
            shard_map_version: map.version,
            replication_factor: node.config.cluster.replication_factor,
            nodes,
            shards,
            hlc_now: node.clock.now().0,
            log_writer: Some(LogWriterStats {
                writes: load(&w.writes),
                items: load(&w.items),
                syncs: load(&w.syncs),
                flushes: load(&w.flushes),
                write_micros: load(&w.write_micros),
                sync_micros: load(&w.sync_micros),
            }),
        }))
    }

    async fn transfer_leader(
        &self,
        request: Request<TransferLeaderRequest>,
    ) -> Result<Response<TransferLeaderResponse>, Status> {
        let req = request.into_inner();
        let (leader_id, term) =
            crate::transfer::transfer_leader(&self.node, ShardId(req.shard_id), req.to_node)
                .await?;
        Ok(Response::new(TransferLeaderResponse { leader_id, term }))
    }

    async fn add_replica(
        &self,
        request: Request<ChangeReplicaRequest>,
    ) -> Result<Response<ChangeReplicaResponse>, Status> {
        let req = request.into_inner();
        let done = crate::membership::add_replica(
            &self.node,
            ShardId(req.shard_id),
            req.node_id,
            req.retried,
        )
        .await?;
        Ok(Response::new(change_response(done)))
    }

    async fn remove_replica(
        &self,
        request: Request<ChangeReplicaRequest>,
    ) -> Result<Response<ChangeReplicaResponse>, Status> {
        let req = request.into_inner();
        let done = crate::membership::remove_replica(
            &self.node,
            ShardId(req.shard_id),
            req.node_id,
            req.retried,
        )
        .await?;
        Ok(Response::new(change_response(done)))
    }

    async fn timestamp(
        &self,
        _request: Request<TimestampRequest>,
    ) -> Result<Response<TimestampResponse>, Status> {
        let node = &self.node;
        let me = node.config.node_id;
        let leader = node
            .host
            .get(ShardId::META)
            .and_then(|replica| replica.raft.metrics().borrow_watched().current_leader);
        if leader != Some(me) {
            return Err(node.not_leader(ShardId::META, leader).await.into());
        }
        Ok(Response::new(TimestampResponse {
            ts: node.clock.now().0,
            node_id: me,
        }))
    }

    async fn join(&self, request: Request<JoinRequest>) -> Result<Response<JoinResponse>, Status> {
        let reply = crate::join::admit(&self.node, request.into_inner()).await?;
        Ok(Response::new(reply))
    }

    async fn forget(
        &self,
        request: Request<ForgetRequest>,
    ) -> Result<Response<ForgetResponse>, Status> {
        let map_version = crate::join::forget(&self.node, request.into_inner().node_id).await?;
        Ok(Response::new(ForgetResponse { map_version }))
    }

    async fn set_placement(
        &self,
        request: Request<SetPlacementRequest>,
    ) -> Result<Response<SetPlacementResponse>, Status> {
        let req = request.into_inner();
        let home = Some(req.home_region).filter(|r| !r.is_empty());
        let survival = match req.survival.as_str() {
            "" => None,
            raw => Some(crate::survival::Survival::parse(raw).map_err(Status::invalid_argument)?),
        };
        let constraints = match req.constraints.as_str() {
            "" => None,
            raw => Some(meridian_types::Constraints::parse(raw).map_err(Status::invalid_argument)?),
        };
        let map_version = crate::home::set_placement(
            &self.node,
            ShardId(req.shard_id),
            home,
            survival,
            constraints,
        )
        .await?;
        Ok(Response::new(SetPlacementResponse { map_version }))
    }
}

fn change_response(done: crate::membership::Outcome) -> ChangeReplicaResponse {
    ChangeReplicaResponse {
        map_version: done.map_version,
        voters: done.voters,
        learners: done.learners,
    }
}
