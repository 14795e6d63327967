//! The public `Kv` service: validation, routing to the shard's Raft, reads at a timestamp.
//!
//! # Writes
//! Validated against the limits first (nothing is proposed for a bad request), then proposed to
//! the shard's Raft with a timestamp from this node's HLC; the reply carries the commit
//! timestamp the state machine applied. A node that is not the leader answers `NOT_LEADER`
//! with a hint; a key outside every local shard answers `WRONG_SHARD`.
//!
//! # Reads
//! Linearizable by default: the leader confirms its lease (or, if the lease is not valid, runs
//! a ReadIndex round), waits until its state machine has applied up to the read index, then
//! reads RocksDB at `read_ts = clock.now()` — after the apply, so the HLC is above every
//! acknowledged version. `LINEARIZABLE_READ_INDEX` always runs the quorum round.
//!
//! # Back pressure
//! At most `MAX_INFLIGHT_PROPOSALS_PER_SHARD × shards` requests are in flight per node; beyond
//! that requests fail fast with `UNAVAILABLE` rather than queueing without bound.

use crate::error::{invalid, Result, ServerError};
use crate::node::Node;
use bytes::Bytes;
use meridian_proto::kv::kv_server::Kv;
use meridian_proto::kv::*;
use meridian_raft::{Command, ShardReplica};
use meridian_storage::mvcc;
use meridian_types::limits::*;
use meridian_types::{ShardId, Timestamp};
use openraft::ReadPolicy;
use std::sync::Arc;
use tokio::sync::Semaphore;
use tonic::{Request, Response, Status};

pub struct KvService {
    node: Arc<Node>,
    inflight: Arc<Semaphore>,
}

impl KvService {
    pub fn new(node: Arc<Node>) -> KvService {
        let permits = MAX_INFLIGHT_PROPOSALS_PER_SHARD * node.shard_map.data.len().max(1);
        KvService {
            node,
            inflight: Arc::new(Semaphore::new(permits)),
        }
    }

    pub fn into_server(self) -> meridian_proto::kv::kv_server::KvServer<KvService> {
        meridian_proto::kv::kv_server::KvServer::new(self)
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES)
    }

    fn admit(&self) -> Result<tokio::sync::OwnedSemaphorePermit> {
        self.inflight.clone().try_acquire_owned().map_err(|_| {
            ServerError::Unavailable("node overloaded: too many requests in flight".into())
        })
    }

    async fn propose(&self, shard: ShardId, replica: &ShardReplica, cmd: Command) -> Result<u64> {
        match replica.raft.client_write(cmd).await {
            Ok(resp) => Ok(resp.data.commit_ts),
            Err(e) => {
                if let Some(f) = e.forward_to_leader() {
                    return Err(self.node.not_leader(shard, f.leader_id).await);
                }
                Err(ServerError::Unavailable(format!("shard {shard}: {e}")))
            }
        }
    }

    /// Makes a read on `replica` linearizable; returns the timestamp to read at.
    async fn linearize(
        &self,
        shard: ShardId,
        replica: &ShardReplica,
        consistency: i32,
    ) -> Result<Timestamp> {
        let policy = if consistency == ReadConsistency::LinearizableReadIndex as i32 {
            ReadPolicy::ReadIndex
        } else {
            ReadPolicy::LeaseRead
        };
        let mut result = replica.raft.ensure_linearizable(policy.clone()).await;
        if result.is_err() && policy == ReadPolicy::LeaseRead && replica.raft.is_leader() {
            // The lease is not valid (e.g. right after election): confirm with a quorum round.
            result = replica
                .raft
                .ensure_linearizable(ReadPolicy::ReadIndex)
                .await;
        }
        match result {
            Ok(_) => Ok(self.node.clock.now()),
            Err(e) => {
                if let Some(f) = e.forward_to_leader() {
                    return Err(self.node.not_leader(shard, f.leader_id).await);
                }
                Err(ServerError::Unavailable(format!(
                    "shard {shard}: cannot confirm leadership: {e}"
                )))
            }
        }
    }

    async fn read<T: Send + 'static>(
        &self,
        f: impl FnOnce(&dyn meridian_storage::Engine) -> meridian_storage::Result<T> + Send + 'static,
    ) -> Result<T> {
        let engine = self.node.engine.clone();
        tokio::task::spawn_blocking(move || f(&*engine))
            .await
            .map_err(|e| ServerError::Internal(e.to_string()))?
            .map_err(|e| ServerError::Internal(format!("storage: {e}")))
    }
}

/// The reply for one key read at `read_ts` (found or not).
fn get_response(
    found: Option<(Timestamp, Vec<u8>)>,
    read_ts: Timestamp,
    shard: ShardId,
) -> GetResponse {
    match found {
        Some((ts, value)) => GetResponse {
            found: true,
            value: Bytes::from(value),
            version_ts: ts.0,
            read_ts: read_ts.0,
            shard_id: shard.0,
        },
        None => GetResponse {
            read_ts: read_ts.0,
            shard_id: shard.0,
            ..Default::default()
        },
    }
}

pub fn check_key(key: &[u8], what: &str) -> Result<()> {
    if key.is_empty() {
        return Err(invalid(format!("{what} is empty")));
    }
    if key.len() > MAX_KEY_BYTES {
        return Err(invalid(format!(
            "{what} is {} bytes, over MAX_KEY_BYTES ({MAX_KEY_BYTES})",
            key.len()
        )));
    }
    Ok(())
}

pub fn check_value(value: &[u8]) -> Result<()> {
    if value.len() > MAX_VALUE_BYTES {
        return Err(invalid(format!(
            "value is {} bytes, over MAX_VALUE_BYTES ({MAX_VALUE_BYTES})",
            value.len()
        )));
    }
    Ok(())
}

fn check_scan(req: &ScanRequest) -> Result<()> {
    if req.limit == 0 || req.limit > MAX_SCAN_LIMIT {
        return Err(invalid(format!(
            "scan limit {} is outside 1..={MAX_SCAN_LIMIT}",
            req.limit
        )));
    }
    if req.start.len() > MAX_KEY_BYTES || req.end.len() > MAX_KEY_BYTES {
        return Err(invalid(format!(
            "scan bound over MAX_KEY_BYTES ({MAX_KEY_BYTES})"
        )));
    }
    if !req.end.is_empty() && req.start >= req.end {
        return Err(invalid(format!(
            "scan range is inverted or empty: start {:?} >= end {:?}",
            String::from_utf8_lossy(&req.start),
            String::from_utf8_lossy(&req.end)
        )));
    }
    Ok(())
}

/// All keys must belong to one shard; returns it.
fn one_shard<'a>(node: &'a Node, keys: impl Iterator<Item = &'a [u8]>) -> Result<ShardId> {
    let mut shard = None;
    for key in keys {
        let s = node.shard_map.lookup(key).id;
        match shard {
            None => shard = Some(s),
            Some(prev) if prev != s => {
                return Err(ServerError::WrongShard(format!(
                    "batch spans shards {prev} and {s}; batches must target one shard"
                )))
            }
            _ => {}
        }
    }
    shard.ok_or_else(|| invalid("batch is empty"))
}

#[tonic::async_trait]
impl Kv for KvService {
    async fn get(
        &self,
        request: Request<GetRequest>,
    ) -> std::result::Result<Response<GetResponse>, Status> {
        let _permit = self.admit()?;
        let req = request.into_inner();
        check_key(&req.key, "key")?;
        let (desc, replica) = self.node.route(&req.key)?;
        let shard = desc.id;
        let t0 = std::time::Instant::now();
        let read_ts = self.linearize(shard, &replica, req.consistency).await?;
        let t1 = t0.elapsed();
        let key = req.key.clone();
        let found = self
            .read(move |e| mvcc::get(e, shard, &key, read_ts))
            .await?;
        tracing::debug!(
            linearize_us = t1.as_micros() as u64,
            total_us = t0.elapsed().as_micros() as u64,
            "get timing"
        );
        Ok(Response::new(get_response(found, read_ts, shard)))
    }

    async fn put(
        &self,
        request: Request<PutRequest>,
    ) -> std::result::Result<Response<PutResponse>, Status> {
        let _permit = self.admit()?;
        let req = request.into_inner();
        check_key(&req.key, "key")?;
        check_value(&req.value)?;
        let (desc, replica) = self.node.route(&req.key)?;
        let shard = desc.id;
        let cmd = Command::Write {
            ts: self.node.clock.now().0,
            puts: vec![(req.key, req.value)],
            deletes: Vec::new(),
        };
        let commit_ts = self.propose(shard, &replica, cmd).await?;
        Ok(Response::new(PutResponse {
            commit_ts,
            shard_id: shard.0,
        }))
    }

    async fn delete(
        &self,
        request: Request<DeleteRequest>,
    ) -> std::result::Result<Response<DeleteResponse>, Status> {
        let _permit = self.admit()?;
        let req = request.into_inner();
        check_key(&req.key, "key")?;
        let (desc, replica) = self.node.route(&req.key)?;
        let shard = desc.id;
        let cmd = Command::Write {
            ts: self.node.clock.now().0,
            puts: Vec::new(),
            deletes: vec![req.key],
        };
        let commit_ts = self.propose(shard, &replica, cmd).await?;
        Ok(Response::new(DeleteResponse {
            commit_ts,
            shard_id: shard.0,
        }))
    }

    async fn scan(
        &self,
        request: Request<ScanRequest>,
    ) -> std::result::Result<Response<ScanResponse>, Status> {
        let _permit = self.admit()?;
        let req = request.into_inner();
        check_scan(&req)?;
        let desc = if req.reverse {
            self.node.shard_map.lookup_before(&req.end)
        } else {
            self.node.shard_map.lookup(&req.start)
        };
        let shard = desc.id;
        let replica = self.node.replica(shard)?;
        let mut read_ts = self.linearize(shard, &replica, req.consistency).await?;
        if req.read_ts != 0 {
            // A later page of a multi-page scan reads at the first page's timestamp. The
            // linearize step above still guarantees this replica has applied everything up to
            // the read index, which is past any write acknowledged before that first page.
            read_ts = Timestamp(req.read_ts).min(read_ts);
        }
        // Clamp [start, end) to the shard's range.
        let start = std::cmp::max(req.start.to_vec(), desc.start.clone());
        let end: Option<Vec<u8>> = match (req.end.is_empty(), desc.end.is_empty()) {
            (true, true) => None,
            (true, false) => Some(desc.end.clone()),
            (false, true) => Some(req.end.to_vec()),
            (false, false) => Some(std::cmp::min(req.end.to_vec(), desc.end.clone())),
        };
        let limit = req.limit as usize;
        let reverse = req.reverse;
        let page = self
            .read(move |e| mvcc::scan(e, shard, &start, end.as_deref(), read_ts, limit, reverse))
            .await?;
        let rows: Vec<KeyValue> = page
            .rows
            .into_iter()
            .map(|(k, ts, v)| KeyValue {
                key: Bytes::from(k),
                value: Bytes::from(v),
                version_ts: ts.0,
            })
            .collect();
        // Where to continue: inside this shard if the page filled, else in the next shard.
        let (resume_key, more) = match page.resume_key {
            Some(k) => (k, true),
            None if !reverse
                && !desc.end.is_empty()
                && (req.end.is_empty() || desc.end.as_slice() < &req.end[..]) =>
            {
                (desc.end.clone(), true)
            }
            None if reverse && !desc.start.is_empty() && desc.start.as_slice() > &req.start[..] => {
                (desc.start.clone(), true)
            }
            None => (Vec::new(), false),
        };
        Ok(Response::new(ScanResponse {
            rows,
            resume_key: Bytes::from(resume_key),
            more,
            read_ts: read_ts.0,
            shard_id: shard.0,
        }))
    }

    async fn batch_get(
        &self,
        request: Request<BatchGetRequest>,
    ) -> std::result::Result<Response<BatchGetResponse>, Status> {
        let _permit = self.admit()?;
        let req = request.into_inner();
        if req.keys.len() > MAX_BATCH_KEYS {
            return Err(invalid(format!(
                "{} keys, over MAX_BATCH_KEYS ({MAX_BATCH_KEYS})",
                req.keys.len()
            ))
            .into());
        }
        for (i, k) in req.keys.iter().enumerate() {
            check_key(k, &format!("keys[{i}]"))?;
        }
        let shard = one_shard(&self.node, req.keys.iter().map(|k| &k[..]))?;
        let replica = self.node.replica(shard)?;
        let read_ts = self.linearize(shard, &replica, req.consistency).await?;
        let keys = req.keys;
        let found = self
            .read(move |e| {
                let refs: Vec<&[u8]> = keys.iter().map(|k| &k[..]).collect();
                mvcc::multi_get(e, shard, &refs, read_ts)
            })
            .await?;
        let results = found
            .into_iter()
            .map(|f| get_response(f, read_ts, shard))
            .collect();
        Ok(Response::new(BatchGetResponse {
            results,
            read_ts: read_ts.0,
        }))
    }

    async fn batch_put(
        &self,
        request: Request<BatchPutRequest>,
    ) -> std::result::Result<Response<BatchPutResponse>, Status> {
        let _permit = self.admit()?;
        let req = request.into_inner();
        let count = req.entries.len() + req.deletes.len();
        if count > MAX_BATCH_KEYS {
            return Err(invalid(format!(
                "{count} keys, over MAX_BATCH_KEYS ({MAX_BATCH_KEYS})"
            ))
            .into());
        }
        let mut bytes = 0usize;
        for (i, kv) in req.entries.iter().enumerate() {
            check_key(&kv.key, &format!("entries[{i}].key"))?;
            check_value(&kv.value)?;
            bytes += kv.key.len() + kv.value.len();
        }
        for (i, k) in req.deletes.iter().enumerate() {
            check_key(k, &format!("deletes[{i}]"))?;
            bytes += k.len();
        }
        if bytes > MAX_BATCH_BYTES {
            return Err(invalid(format!(
                "batch is {bytes} bytes, over MAX_BATCH_BYTES ({MAX_BATCH_BYTES})"
            ))
            .into());
        }
        let shard = one_shard(
            &self.node,
            req.entries
                .iter()
                .map(|kv| &kv.key[..])
                .chain(req.deletes.iter().map(|k| &k[..])),
        )?;
        let replica = self.node.replica(shard)?;
        let cmd = Command::Write {
            ts: self.node.clock.now().0,
            puts: req
                .entries
                .into_iter()
                .map(|kv| (kv.key, kv.value))
                .collect(),
            deletes: req.deletes,
        };
        let commit_ts = self.propose(shard, &replica, cmd).await?;
        Ok(Response::new(BatchPutResponse {
            commit_ts,
            shard_id: shard.0,
        }))
    }
}
