//! Operator calls: things a person running the cluster asks for, not a workload.
//!
//! Each must reach the shard's leader. They share one loop: find the leader in the cluster's
//! status (asking the shard's replicas when the answering node hosts none), call it with the rest of the call's deadline, and on a retryable answer (a moved
//! leader, a target still catching up) ask the status again and retry. Asking again is safe
//! for all of them: the same request leads to the same end state. Only replica moves answer
//! differently once that end state holds (an add of a node that votes, a remove of one that
//! holds nothing, are refused as mistakes), so after an attempt that reached a node without
//! a final answer (a transport error, or a retryable error a leader may give after acting,
//! such as a lost leadership while the change commits) they are asked again as retries
//! (`ChangeReplicaRequest.retried`), which the leader answers with the group as it stands.

use crate::client::{cluster_client, request, Client, ATTEMPT_GRACE};
use crate::error::{Error, Result};
use meridian_proto::kv::cluster_client::ClusterClient;
use meridian_proto::kv::{
    ChangeReplicaRequest, ChangeReplicaResponse, ForgetRequest, SetPlacementRequest,
    TransferLeaderRequest,
};
use std::future::Future;
use std::time::Duration;
use tonic::transport::Channel;

/// A replica change as the shard's leader saw it when it finished.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplicaChange {
    /// The shard map version that records the change.
    pub map_version: u64,
    pub voters: Vec<u64>,
    pub learners: Vec<u64>,
}

impl From<ChangeReplicaResponse> for ReplicaChange {
    fn from(r: ChangeReplicaResponse) -> ReplicaChange {
        ReplicaChange {
            map_version: r.map_version,
            voters: r.voters,
            learners: r.learners,
        }
    }
}

/// Which failure a shard's voters are placed to survive (the server's `survival` module).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Survival {
    /// Every replica votes: the shard survives losing a region.
    Region,
    /// Only the home region's replicas vote, the others are learners: writes commit inside the
    /// home region, and the shard survives losing one of its home voters, not the region.
    Zone,
}

impl Survival {
    pub fn as_str(self) -> &'static str {
        match self {
            Survival::Region => "region",
            Survival::Zone => "zone",
        }
    }
}

impl std::str::FromStr for Survival {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Survival, String> {
        match s {
            "region" => Ok(Survival::Region),
            "zone" => Ok(Survival::Zone),
            other => Err(format!(
                "unknown survival goal {other:?} (expected region or zone)"
            )),
        }
    }
}

impl Client {
    /// Asks shard `shard`'s leader to hand leadership to node `to` (a voter whose log has caught
    /// up) and waits until `to` leads; returns `(leader, term)`. Follows the leader as the
    /// cluster reports it and retries retryable answers (a moved leader, a target still
    /// catching up or that did not take over in time) within the call's deadline.
    pub async fn transfer_leader(&self, shard: u64, to: u64) -> Result<(u64, u64)> {
        self.leader_call(shard, |mut cluster, timeout, _| async move {
            let reply = cluster
                .transfer_leader(request(
                    TransferLeaderRequest {
                        shard_id: shard,
                        to_node: to,
                    },
                    timeout,
                ))
                .await?
                .into_inner();
            Ok((reply.leader_id, reply.term))
        })
        .await
    }

    /// Adds a replica of `shard` on node `node`: the map lists it, it catches up as a learner,
    /// then it votes. An UNAVAILABLE answer (still catching up) is retried within the call's
    /// deadline; a move cut short finishes when asked again.
    pub async fn add_replica(&self, shard: u64, node: u64) -> Result<ReplicaChange> {
        self.change_replica(shard, node, true).await
    }

    /// Removes node `node`'s replica of `shard`: it leaves the group, then the map, then the
    /// node deletes its data.
    pub async fn remove_replica(&self, shard: u64, node: u64) -> Result<ReplicaChange> {
        self.change_replica(shard, node, false).await
    }

    /// Forgets member `node`, which must hold no replica any more (after
    /// [`Client::decommission`]): the members stop pinging and listing it and refuse its
    /// messages; its id stays taken. Asked of the metadata shard's leader (any member would
    /// do). Returns the shard map version that records it.
    pub async fn forget_member(&self, node: u64) -> Result<u64> {
        self.leader_call(0, |mut cluster, timeout, _| async move {
            let reply = cluster
                .forget(request(ForgetRequest { node_id: node }, timeout))
                .await?;
            Ok(reply.into_inner().map_version)
        })
        .await
    }

    /// Sets data shard `shard`'s home region (`None`: no home): the region its leader should
    /// be in; the shard's leader moves there within a few election timeouts if a caught-up
    /// replica is there. With `survival` (`None`: unchanged) it also sets the shard's survival
    /// goal, which decides which replicas vote: [`Survival::Zone`] keeps the votes in the home
    /// region (it needs 3 of the shard's replicas there) and makes the others learners. Stored
    /// in the shard map (the founding `home_regions` no longer apply to it). Asked of the
    /// metadata shard's leader. With `constraints` (`None`: unchanged) it also sets which
    /// members may hold the shard's replicas (see `constraint_plan`): stored even while some
    /// replica breaks them, which [`Client::place`] then moves. Returns the shard map version
    /// that holds it.
    pub async fn set_placement(
        &self,
        shard: u64,
        home_region: Option<&str>,
        survival: Option<Survival>,
        constraints: Option<&meridian_types::Constraints>,
    ) -> Result<u64> {
        let home_region = home_region.unwrap_or_default().to_string();
        let survival = survival.map(Survival::as_str).unwrap_or_default();
        // The canonical text; `none` clears (the empty text means unchanged).
        let constraints = constraints.map(ToString::to_string).unwrap_or_default();
        self.leader_call(0, |mut cluster, timeout, _| {
            let home_region = home_region.clone();
            let constraints = constraints.clone();
            async move {
                let ask = SetPlacementRequest {
                    shard_id: shard,
                    home_region,
                    survival: survival.to_string(),
                    constraints,
                };
                let reply = cluster.set_placement(request(ask, timeout)).await?;
                Ok(reply.into_inner().map_version)
            }
        })
        .await
    }

    async fn change_replica(&self, shard: u64, node: u64, add: bool) -> Result<ReplicaChange> {
        self.leader_call(shard, |mut cluster, timeout, retried| async move {
            let ask = request(
                ChangeReplicaRequest {
                    shard_id: shard,
                    node_id: node,
                    retried,
                },
                timeout,
            );
            let reply = if add {
                cluster.add_replica(ask).await?
            } else {
                cluster.remove_replica(ask).await?
            };
            Ok(reply.into_inner().into())
        })
        .await
    }

    /// Calls `call` on `shard`'s leader (as the cluster's status names it) with the rest of
    /// the call's deadline, retrying retryable answers with backoff. `call`'s third argument
    /// says whether an earlier attempt was sent, so that the request may have been carried
    /// out already.
    async fn leader_call<T, F, Fut>(&self, shard: u64, call: F) -> Result<T>
    where
        F: Fn(ClusterClient<Channel>, Duration, bool) -> Fut,
        Fut: Future<Output = std::result::Result<T, tonic::Status>>,
    {
        let deadline = self.deadline();
        let mut backoff = self.backoff();
        let mut attempts = 0u32;
        let mut asked_before = false;
        loop {
            attempts += 1;
            let status = self.status().await?;
            let Some(info) = status.shards.iter().find(|s| s.shard_id == shard) else {
                return Err(Error::InvalidArgument {
                    message: format!("no shard {shard} in the cluster's map"),
                });
            };
            let address_of = |id: u64| {
                status
                    .nodes
                    .iter()
                    .find(|n| n.node_id == id && id != 0)
                    .map(|n| n.client_addr.clone())
                    .filter(|a| !a.is_empty())
            };
            let mut leader = info.leader_id;
            // A node without a replica of the shard does not know its leader: ask the replicas.
            for replica in &info.replicas {
                if leader != 0 {
                    break;
                }
                let Some(address) = address_of(*replica) else {
                    continue;
                };
                if let Ok(view) = self.node_status(&address).await {
                    leader = view
                        .shards
                        .iter()
                        .find(|s| s.shard_id == shard)
                        .map_or(0, |s| s.leader_id);
                }
            }
            let address = address_of(leader);
            let mut last = None;
            if let Some(address) = address {
                // The server may wait (a catch-up, an election): give it the call's time.
                let timeout = deadline.remaining();
                let cluster = cluster_client(self.channel(&address)?);
                let attempt = call(cluster, timeout, asked_before);
                asked_before = true;
                match tokio::time::timeout(timeout + ATTEMPT_GRACE, attempt).await {
                    Ok(Ok(value)) => return Ok(value),
                    Ok(Err(status)) => {
                        let error = Error::from_status(&status, &address);
                        if !error.is_retryable() {
                            return Err(error);
                        }
                        last = Some(error);
                    }
                    Err(_) => {
                        return Err(Error::Transport {
                            address,
                            message: format!("no answer within {} ms", timeout.as_millis()),
                        })
                    }
                }
            }
            self.back_off(&mut backoff, &deadline, attempts, &mut last)
                .await?;
        }
    }
}
