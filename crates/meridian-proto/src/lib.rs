//! Generated gRPC bindings for Meridian (from `proto/`), and nothing else.
//!
//! - [`kv`]: the public API (`Kv`, `Cluster` services) clients use.
//! - [`raft`]: the internal node-to-node Raft transport.
//!
//! - [`codec`]: the protobuf codec every service uses (undecodable bodies are
//!   `INVALID_ARGUMENT`).
//!
//! Byte fields are generated as `bytes::Bytes` so payloads are not copied on the way through.

pub mod codec;

#[allow(clippy::all)]
pub mod kv {
    tonic::include_proto!("meridian.v1");
}

#[allow(clippy::all)]
pub mod raft {
    tonic::include_proto!("meridian.raft.v1");
}
