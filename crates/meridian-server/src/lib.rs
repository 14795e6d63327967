//! Meridian node: configuration, gRPC services, shard hosting and lifecycle.
//!
//! # Layout
//! - [`config`]: TOML + flags, validated with errors naming the field.
//! - [`shard_map`]: the founding shard map and region/zone-aware replica placement;
//!   [`shard_map_store`]: the map as one versioned record in the metadata shard; a shard's
//!   placement: [`home`] (home region), [`survival`] (who votes), [`constraints`] (which
//!   members may hold replicas).
//! - [`node`]: startup (storage, Raft groups, bootstrap, registration) and shutdown;
//!   [`join`]: a node joining a running cluster (`--join`).
//! - [`kv`]: the public `Kv` service (its write path in `kv_propose`, read barrier and guarded
//!   reads in `kv_read`, transactions' snapshot
//!   reads in [`kv_snapshot`], stale (follower) reads in [`kv_follower`], commits in
//!   [`kv_txn`], admission in [`admission`]);
//!   [`cluster`]: the `Cluster` status service.
//! - [`error`]: the node's error type and its single mapping to gRPC statuses.
//! - [`hlc_ceiling`]: the persisted bound on issued HLC timestamps, waited out on restart and
//!   never handed out past.
//! - Background loops on the shards a node leads: [`gc`] (MVCC and transaction-record
//!   garbage) and [`sweeper`] (transactions whose coordinator went away).
//!
//! Two listeners: the client address serves `Kv` and `Cluster`; the peer address serves the
//! internal `RaftTransport` (meridian-raft). Keeping them apart lets operators firewall peers.
//! A third, optional one ([`metrics`], `--metrics-addr`) serves `GET /metrics` over HTTP.
//!
//! # Shutdown
//! On SIGTERM or Ctrl-C both servers stop accepting and drain in-flight requests (bounded by
//! [`SHUTDOWN_DRAIN`]), every Raft group shuts down, RocksDB is flushed and closed.

pub mod admission;
pub mod cluster;
pub mod config;
pub mod constraints;
mod election_bias;
pub mod election_hold;
pub mod error;
pub mod founding;
pub mod gc;
pub mod hlc_ceiling;
pub mod home;
pub mod join;
pub mod kv;
pub mod kv_check;
pub mod kv_early_lock;
pub mod kv_follower;
mod kv_propose;
mod kv_read;
pub mod kv_snapshot;
pub mod kv_txn;
mod leader_follow;
pub mod membership;
pub mod metrics;
pub mod node;
mod removal_checks;
pub mod shard_map;
pub mod shard_map_store;
pub mod survival;
pub mod sweeper;
mod transfer;

pub use config::{NodeConfig, StartArgs};

use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// Longest a graceful shutdown waits for in-flight requests.
pub const SHUTDOWN_DRAIN: Duration = Duration::from_secs(10);
/// Server-side deadline for any request that does not carry a shorter one.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// Most concurrent HTTP/2 streams per client connection (peer connections: `limits`).
pub const MAX_CONCURRENT_STREAMS: u32 = 1_024;

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("installing the SIGTERM handler");
        tokio::select! {
            _ = ctrl_c => {},
            _ = term.recv() => {},
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}

/// Accepted connections with TCP_NODELAY: `Server::tcp_nodelay` only applies to listeners tonic
/// binds itself. Without it, Nagle's algorithm holds a response's second small write until the
/// peer's delayed ACK (~40 ms) — every read paid that on loopback.
fn incoming(listener: tokio::net::TcpListener) -> tonic::transport::server::TcpIncoming {
    tonic::transport::server::TcpIncoming::from(listener)
        .with_nodelay(Some(true))
        .with_keepalive(Some(Duration::from_secs(30)))
}

/// Runs a node until SIGTERM or Ctrl-C, then shuts down gracefully.
pub async fn run_start(args: StartArgs) -> anyhow::Result<()> {
    let config = NodeConfig::load(&args)?;
    run_node(config, shutdown_signal()).await
}

/// Runs a node until `shutdown` completes.
pub async fn run_node(
    mut config: NodeConfig,
    shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    let client_listener = tokio::net::TcpListener::bind(config.client_addr)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on client_addr {}: {e}", config.client_addr))?;
    let peer_listener = tokio::net::TcpListener::bind(config.peer_addr)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on peer_addr {}: {e}", config.peer_addr))?;
    let metrics_listener = match config.metrics_addr {
        Some(addr) => Some(
            tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|e| anyhow::anyhow!("cannot listen on metrics_addr {addr}: {e}"))?,
        ),
        None => None,
    };
    // A joining node joins once its listeners are bound (see `join`).
    join::prepare(&mut config).await?;
    let node = node::Node::start(config).await?;
    tracing::info!(
        node = node.config.node_id,
        cluster = %node.cluster_id,
        client = %node.config.client_addr,
        peer = %node.config.peer_addr,
        region = %node.config.region,
        shards = node.host.replicas().len(),
        "node serving"
    );

    let (stop_tx, stop_rx) = watch::channel(false);
    let stopped = |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|v| *v).await;
    };
    let peer_server =
        meridian_raft::transport::peer_listener_settings(tonic::transport::Server::builder())
            .timeout(REQUEST_TIMEOUT)
            .tcp_nodelay(true)
            .add_service(meridian_raft::TransportService::new(node.host.clone()).into_server())
            .serve_with_incoming_shutdown(incoming(peer_listener), stopped(stop_rx.clone()));
    let kv_service = kv::KvService::new(node.clone());
    if let Some(listener) = metrics_listener {
        let admission = kv_service.admission();
        tokio::spawn(metrics::serve(
            listener,
            node.clone(),
            admission,
            stop_rx.clone(),
        ));
    }
    let client_server = tonic::transport::Server::builder()
        .timeout(REQUEST_TIMEOUT)
        .tcp_nodelay(true)
        .max_concurrent_streams(MAX_CONCURRENT_STREAMS)
        .add_service(kv_service.into_server())
        .add_service(cluster::ClusterService::new(node.clone()).into_server())
        .serve_with_incoming_shutdown(incoming(client_listener), stopped(stop_rx.clone()));
    let peer_task = tokio::spawn(peer_server);
    let client_task = tokio::spawn(client_server);

    shutdown.await;
    tracing::info!("shutting down: draining requests");
    let _ = stop_tx.send(true);
    // Client requests drain first (they may need Raft), then peers, then Raft and storage.
    if tokio::time::timeout(SHUTDOWN_DRAIN, client_task)
        .await
        .is_err()
    {
        tracing::warn!("client requests did not drain in time");
    }
    node.shutdown().await;
    let _ = tokio::time::timeout(Duration::from_secs(2), peer_task).await;
    let node_id = node.config.node_id;
    drop(Arc::try_unwrap(node).ok());
    tracing::info!(node = node_id, "stopped");
    Ok(())
}
