//! Connections and the cluster's status: gRPC client builders, the per-node channel cache,
//! [`fetch_status`], [`Client::status`] and the single-flight shard map refresh.

use super::{lock, Client, Deadline, ATTEMPT_GRACE, MAX_CACHED_CHANNELS};
use crate::config::endpoint_uri;
use crate::error::{Error, Result};
use crate::routing::ShardMap;
use meridian_proto::kv::{
    self as proto, cluster_client::ClusterClient, kv_client::KvClient, StatusResponse,
};
use meridian_types::limits::MAX_MESSAGE_BYTES;
use std::time::{Duration, Instant};
use tonic::transport::{Channel, Endpoint};

pub(crate) fn kv_client(channel: Channel) -> KvClient<Channel> {
    KvClient::new(channel)
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES)
}

pub(crate) fn cluster_client(channel: Channel) -> ClusterClient<Channel> {
    ClusterClient::new(channel)
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES)
}

pub(crate) fn request<T>(message: T, timeout: Duration) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.set_timeout(timeout);
    request
}

/// Asks one node for `Cluster.Status` over a fresh connection, within `timeout`.
///
/// For tools that watch individual nodes (readiness checks, `meridian cluster status`); a
/// [`Client`] reuses its connections instead ([`Client::node_status`]).
pub async fn fetch_status(address: &str, timeout: Duration) -> Result<StatusResponse> {
    let transport = |message: String| Error::Transport {
        address: address.to_string(),
        message,
    };
    let endpoint = Endpoint::from_shared(endpoint_uri(address))
        .map_err(|e| transport(format!("invalid address: {e}")))?
        .connect_timeout(timeout)
        .timeout(timeout)
        .tcp_nodelay(true);
    let call = async {
        let channel = endpoint
            .connect()
            .await
            .map_err(|e| transport(format!("connect: {e}")))?;
        cluster_client(channel)
            .status(request(proto::StatusRequest {}, timeout))
            .await
            .map(|response| response.into_inner())
            .map_err(|status| Error::from_status(&status, address))
    };
    tokio::time::timeout(timeout + ATTEMPT_GRACE, call)
        .await
        .unwrap_or_else(|_| {
            Err(transport(format!(
                "no answer within {} ms",
                timeout.as_millis()
            )))
        })
}

impl Client {
    /// The cluster's status from any node (trying known nodes, then seeds); also refreshes the
    /// cached shard map with it.
    pub async fn status(&self) -> Result<StatusResponse> {
        let deadline = self.deadline();
        let mut backoff = self.backoff();
        let mut rounds = 0u32;
        loop {
            rounds += 1;
            let mut last = match self.status_round(&deadline).await {
                Ok(status) => return Ok(status),
                Err(error) if error.is_retryable() || matches!(error, Error::NoSeeds) => {
                    Some(error)
                }
                Err(error) => return Err(error),
            };
            self.back_off(&mut backoff, &deadline, rounds, &mut last)
                .await?;
        }
    }

    /// Re-fetches the shard map now.
    pub async fn refresh_shard_map(&self) -> Result<()> {
        self.status().await.map(|_| ())
    }

    /// `Cluster.Status` from one particular node (one attempt, `rpc_timeout`); the cached map
    /// is not changed.
    pub async fn node_status(&self, address: &str) -> Result<StatusResponse> {
        self.status_from(address, self.inner.config.rpc_timeout)
            .await
    }

    pub(crate) fn channel(&self, address: &str) -> Result<Channel> {
        let mut channels = lock(&self.inner.channels);
        if let Some(channel) = channels.get(address) {
            return Ok(channel.clone());
        }
        if channels.len() >= MAX_CACHED_CHANNELS {
            channels.clear();
        }
        let config = &self.inner.config;
        let target = config.dial.get(address).map_or(address, String::as_str);
        let endpoint = Endpoint::from_shared(endpoint_uri(target))
            .map_err(|e| Error::Transport {
                address: address.to_string(),
                message: format!("invalid address: {e}"),
            })?
            .connect_timeout(config.connect_timeout)
            .timeout(config.rpc_timeout)
            .tcp_nodelay(true)
            .http2_keep_alive_interval(Duration::from_secs(10))
            .keep_alive_timeout(Duration::from_secs(5));
        let channel = endpoint.connect_lazy();
        channels.insert(address.to_string(), channel.clone());
        Ok(channel)
    }

    async fn status_from(&self, address: &str, timeout: Duration) -> Result<StatusResponse> {
        let channel = self.channel(address)?;
        let mut cluster = cluster_client(channel);
        let call = cluster.status(request(proto::StatusRequest {}, timeout));
        match tokio::time::timeout(timeout + ATTEMPT_GRACE, call).await {
            Ok(Ok(response)) => Ok(response.into_inner()),
            Ok(Err(status)) => Err(Error::from_status(&status, address)),
            Err(_) => Err(Error::Transport {
                address: address.to_string(),
                message: format!("no answer within {} ms", timeout.as_millis()),
            }),
        }
    }

    /// One pass over the refresh candidates; the first answer is installed and returned.
    async fn status_round(&self, deadline: &Deadline) -> Result<StatusResponse> {
        let candidates = self
            .state()
            .refresh_candidates(&self.inner.config.seeds, Instant::now());
        let mut last = None;
        for (node_id, address) in candidates {
            let remaining = deadline.remaining();
            if remaining.is_zero() {
                break;
            }
            let timeout = self.inner.config.rpc_timeout.min(remaining);
            match self.status_from(&address, timeout).await {
                Ok(status) => {
                    self.state_mut().install(ShardMap::from_status(&status));
                    return Ok(status);
                }
                Err(error) => {
                    tracing::debug!(%address, %error, "status request failed");
                    if let (Some(node_id), Error::Transport { .. }) = (node_id, &error) {
                        self.state_mut().note_node_failure(node_id, Instant::now());
                    }
                    last = Some(error);
                }
            }
        }
        Err(last.unwrap_or(Error::NoSeeds))
    }

    /// Refreshes the map unless someone installed a newer one since `seen_generation`.
    /// A failed refresh is recorded in `last` (the caller backs off and retries anyway).
    pub(crate) async fn refresh_after_failure(
        &self,
        seen_generation: u64,
        deadline: &Deadline,
        last: &mut Option<Error>,
    ) {
        let remaining = deadline.remaining();
        let Ok(_guard) = tokio::time::timeout(remaining, self.inner.refresh_lock.lock()).await
        else {
            return;
        };
        if self.state().generation != seen_generation {
            return;
        }
        if let Err(error) = self.status_round(deadline).await {
            tracing::debug!(%error, "shard map refresh failed");
            if last.is_none() {
                *last = Some(error);
            }
        }
    }
}
