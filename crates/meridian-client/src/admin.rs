//! Operator calls: things a person running the cluster asks for, not a workload.

use crate::client::{cluster_client, request, Client, ATTEMPT_GRACE};
use crate::error::{Error, Result};
use meridian_proto::kv::TransferLeaderRequest;

impl Client {
    /// Asks shard `shard`'s leader to hand leadership to node `to` (a voter whose log has caught
    /// up) and waits until `to` leads; returns `(leader, term)`. Follows the leader as the
    /// cluster reports it and retries retryable answers (a moved leader, a target still
    /// catching up or that did not take over in time) within the call's deadline.
    pub async fn transfer_leader(&self, shard: u64, to: u64) -> Result<(u64, u64)> {
        let deadline = self.deadline();
        let mut backoff = self.backoff();
        let mut attempts = 0u32;
        loop {
            attempts += 1;
            let status = self.status().await?;
            let Some(info) = status.shards.iter().find(|s| s.shard_id == shard) else {
                return Err(Error::InvalidArgument {
                    message: format!("no shard {shard} in the cluster's map"),
                });
            };
            let address = status
                .nodes
                .iter()
                .find(|n| n.node_id == info.leader_id && info.leader_id != 0)
                .map(|n| n.client_addr.clone());
            let mut last = None;
            if let Some(address) = address {
                // The server waits up to a few election timeouts: give it the call's time.
                let timeout = deadline.remaining();
                let mut cluster = cluster_client(self.channel(&address)?);
                let call = cluster.transfer_leader(request(
                    TransferLeaderRequest {
                        shard_id: shard,
                        to_node: to,
                    },
                    timeout,
                ));
                match tokio::time::timeout(timeout + ATTEMPT_GRACE, call).await {
                    Ok(Ok(reply)) => {
                        let reply = reply.into_inner();
                        return Ok((reply.leader_id, reply.term));
                    }
                    Ok(Err(status)) => {
                        // Asking again is safe (the same request, the same end state): a
                        // moved leader or a target still catching up is retried.
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
