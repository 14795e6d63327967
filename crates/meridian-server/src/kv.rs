//! The public `Kv` service: validation, routing to the shard's Raft, reads at a timestamp.
//!
//! # Writes
//! Validated against the limits first (nothing is proposed for a bad request), then proposed to
//! the shard's Raft with a timestamp issued by the shard's tracker (`meridian_raft::issued`:
//! this node's HLC, fenced to the leader's term) and the request's `WriteId` (see
//! `kv_propose`); the reply carries the commit timestamp the state machine applied (for a
//! retry of an applied write, the first application's). Writes in the first `max_offset` after
//! a leader's election wait for it to end for their timestamp. A node that is not the leader
//! answers `NOT_LEADER` with a hint; a key outside every local shard answers `WRONG_SHARD`.
//! Both mean "not proposed".
//!
//! Once a proposal may have reached the log, a failure is `AMBIGUOUS`, never `NOT_LEADER`:
//! openraft's `LogEntryDiscarded` (the entry was dropped on a leader change, but may commit
//! through the new leader) and fatal Raft errors say nothing about the entry's fate. The client
//! settles such a write by retrying it with the same `WriteId`.
//!
//! # Reads
//! Linearizable by default: the leader confirms its lease (or, if the lease is not valid, runs
//! a ReadIndex round), waits until its state machine has applied up to the read index, then
//! reads RocksDB at `read_ts = max(clock.now(), shard's applied floor)`. The floor is the
//! highest version timestamp applied; taking the max matters when this node's clock is behind
//! the shard's history (a clock stepped back across a restart): `now()` alone could then be
//! below an acknowledged write. `LINEARIZABLE_READ_INDEX` always runs the quorum round. The
//! lease is used only while 90% of it remains (a margin for clock-rate drift between nodes);
//! past that a read runs the quorum round. A restarted node refuses votes for a full lease
//! (`meridian-raft`'s `MultiRaft::refuses_votes`), so it cannot help elect a second leader
//! while a lease it acknowledged before the restart is still being read from.
//!
//! Transactions read with *snapshot reads* instead (`BatchGet` and `Scan` carrying a
//! `TxnSnapshot`): every shard at one timestamp, see `kv_snapshot`.
//!
//! # Causality tokens
//! A request's `meridian-hlc` metadata is the largest timestamp its client has seen. It never
//! moves this node's clock (a client could otherwise push a leader's clock ahead until its
//! followers reject it). When it is ahead of the clock, the request waits until the physical
//! clock passes it (at most `max_offset`), so reads and writes are ordered after what the
//! client saw; a token further ahead is refused with `CLOCK_OFFSET`.
//!
//! # Back pressure
//! At most `MAX_INFLIGHT_PROPOSALS_PER_SHARD × shards` requests, and at most
//! `MAX_INFLIGHT_REQUEST_BYTES_PER_NODE` bytes of request messages
//! (`MAX_INFLIGHT_REQUEST_BYTES_PER_CONNECTION` per connection), are in flight per node;
//! beyond either, requests fail fast with `UNAVAILABLE` rather than queueing without bound
//! (see `admission`).

use crate::admission::{Admission, Admitted};
use crate::error::{invalid, Result, ServerError};
use crate::kv_check::{cas_command, check_key, check_route, check_scan, check_value};
use crate::kv_follower::stale_mode;
use crate::kv_txn::TxnCommit;
use crate::node::Node;
use crate::shard_map::ShardDescriptor;
use bytes::Bytes;
use meridian_proto::kv::kv_server::Kv;
use meridian_proto::kv::*;
use meridian_raft::issued::ReadSpan;
use meridian_raft::locks::LockTable;
use meridian_raft::{Command, RequestId};
use meridian_storage::mvcc;
use meridian_types::limits::*;
use meridian_types::{ShardId, Timestamp};
use std::sync::Arc;
use tonic::{Request, Response, Status};

/// The request id of a write, if the client sent one (client_id 0 = none).
pub(crate) fn request_id(write_id: Option<WriteId>) -> Option<RequestId> {
    write_id.filter(|w| w.client_id != 0).map(|w| RequestId {
        client_id: w.client_id,
        seq: w.seq,
    })
}

pub struct KvService {
    pub(crate) node: Arc<Node>,
    admission: Admission,
}

impl KvService {
    pub fn new(node: Arc<Node>) -> KvService {
        let permits = MAX_INFLIGHT_PROPOSALS_PER_SHARD * node.map().data.len().max(1);
        crate::kv_early_lock::EarlyLocks::spawn_sweeper(Arc::downgrade(&node));
        KvService {
            node,
            admission: Admission::new(
                permits,
                MAX_INFLIGHT_REQUEST_BYTES_PER_NODE,
                MAX_INFLIGHT_REQUEST_BYTES_PER_CONNECTION,
            ),
        }
    }

    /// The node's request budgets (shared: a clone sees the same permits), for its metrics.
    pub fn admission(&self) -> Admission {
        self.admission.clone()
    }

    pub fn into_server(self) -> meridian_proto::kv::kv_server::KvServer<KvService> {
        meridian_proto::kv::kv_server::KvServer::new(self)
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES)
    }

    /// Admits a request: permits of the node's in-flight budgets, by count and by the
    /// message's encoded bytes (see `admission`), then the wait for its causality token (see
    /// the module docs). Every handler starts here.
    async fn admit<T: prost::Message>(&self, request: &Request<T>) -> Result<Admitted> {
        let permit = self
            .admission
            .try_admit(request.get_ref().encoded_len(), request.remote_addr())?;
        self.wait_for_token(request).await?;
        Ok(permit)
    }
}

/// The reply for one key read at `read_ts` (found or not).
pub(crate) fn get_response(
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
            served_by: 0,
        },
        None => GetResponse {
            read_ts: read_ts.0,
            shard_id: shard.0,
            ..Default::default()
        },
    }
}

/// All keys must belong to one shard, the one `route` names if set; returns it.
fn one_shard<'a>(
    node: &'a Node,
    keys: impl Iterator<Item = &'a [u8]>,
    route: Option<&Route>,
) -> Result<ShardId> {
    let map = node.map();
    let mut shard: Option<&ShardDescriptor> = None;
    for key in keys {
        let s = map.lookup(key);
        match shard {
            None => shard = Some(s),
            Some(prev) if prev.id != s.id => {
                return Err(ServerError::WrongShard(format!(
                    "batch spans shards {} and {}; batches must target one shard",
                    prev.id, s.id
                )))
            }
            _ => {}
        }
    }
    let desc = shard.ok_or_else(|| invalid("batch is empty"))?;
    check_route(desc, route)?;
    Ok(desc.id)
}

#[tonic::async_trait]
impl Kv for KvService {
    async fn get(
        &self,
        request: Request<GetRequest>,
    ) -> std::result::Result<Response<GetResponse>, Status> {
        let _permit = self.admit(&request).await?;
        let req = request.into_inner();
        check_key(&req.key, "key")?;
        if let Some(mode) = stale_mode(req.consistency, req.staleness.as_ref())? {
            return Ok(Response::new(self.stale_get(req, mode).await?));
        }
        let (desc, replica, parked) = self.route_read(&req.key, req.consistency)?;
        check_route(&desc, req.route.as_ref())?;
        let shard = desc.id;
        let t0 = std::time::Instant::now();
        let read_ts = self
            .plain_read_ts(shard, &replica, parked, req.consistency)
            .await?;
        let t1 = t0.elapsed();
        let (key, probe) = (req.key.clone(), req.key.clone());
        let found = self
            .read_unlocked(
                &replica,
                read_ts,
                move |locks| locks.write_intent(&probe, None, u64::MAX),
                move |e, _| mvcc::get(e, shard, &key, read_ts),
            )
            .await?;
        tracing::debug!(
            linearize_us = t1.as_micros() as u64,
            total_us = t0.elapsed().as_micros() as u64,
            "get timing"
        );
        let mut reply = get_response(found, read_ts, shard);
        reply.served_by = self.node.config.node_id;
        Ok(Response::new(reply))
    }

    async fn put(
        &self,
        request: Request<PutRequest>,
    ) -> std::result::Result<Response<PutResponse>, Status> {
        let permit = self.admit(&request).await?;
        let req = request.into_inner();
        check_key(&req.key, "key")?;
        check_value(&req.value)?;
        let (desc, replica) = self.node.route(&req.key)?;
        check_route(&desc, req.route.as_ref())?;
        let shard = desc.id;
        let cmd = Command::Write {
            ts: 0,
            puts: vec![(req.key, req.value)],
            deletes: Vec::new(),
            request: request_id(req.write_id),
        };
        let commit_ts = self.propose(shard, &replica, cmd, permit).await?;
        Ok(Response::new(PutResponse {
            commit_ts,
            shard_id: shard.0,
        }))
    }

    async fn delete(
        &self,
        request: Request<DeleteRequest>,
    ) -> std::result::Result<Response<DeleteResponse>, Status> {
        let permit = self.admit(&request).await?;
        let req = request.into_inner();
        check_key(&req.key, "key")?;
        let (desc, replica) = self.node.route(&req.key)?;
        check_route(&desc, req.route.as_ref())?;
        let shard = desc.id;
        let cmd = Command::Write {
            ts: 0,
            puts: Vec::new(),
            deletes: vec![req.key],
            request: request_id(req.write_id),
        };
        let commit_ts = self.propose(shard, &replica, cmd, permit).await?;
        Ok(Response::new(DeleteResponse {
            commit_ts,
            shard_id: shard.0,
        }))
    }

    async fn scan(
        &self,
        request: Request<ScanRequest>,
    ) -> std::result::Result<Response<ScanResponse>, Status> {
        let _permit = self.admit(&request).await?;
        let req = request.into_inner();
        check_scan(&req)?;
        let map = self.node.map();
        let desc = if req.reverse {
            map.lookup_before(&req.end)
        } else {
            map.lookup(&req.start)
        };
        check_route(desc, req.route.as_ref())?;
        let shard = desc.id;
        let stale = stale_mode(req.consistency, req.staleness.as_ref())?;
        if stale.is_some() && req.snapshot.is_some() {
            return Err(invalid("a stale read takes no transaction snapshot").into());
        }
        // A stale read must not wake a quiesced follower (see `kv_follower`); a plain page may
        // be served on a lease without waking its shard, as a point read (`route_shard_read`).
        let (replica, parked) = match stale {
            Some(_) => (self.stale_replica(shard)?, false),
            None if req.snapshot.is_none() => self.route_shard_read(shard, req.consistency)?,
            None => (self.node.replica(shard)?, false),
        };
        // A plain page at its own linearizable timestamp: an earlier page's timestamp is not a
        // stable snapshot (a write below it may be applied after it was chosen), so reusing it
        // could miss acknowledged writes or show half of a batch. One page is one RocksDB
        // iterator, so it is consistent within itself. A page with a snapshot (a transaction's,
        // or a multi-page scan's) is read at it instead, which settles the writes below it
        // first (see `kv_snapshot`).
        let snapshot = match &req.snapshot {
            Some(spec) => {
                let span = ReadSpan::Range {
                    start: &req.start,
                    end: &req.end,
                };
                Some(
                    self.snapshot(shard, &replica, spec, req.consistency, span)
                        .await?,
                )
            }
            None => None,
        };
        let stale_read = match stale {
            Some(mode) => {
                let span = ReadSpan::Range {
                    start: &req.start,
                    end: &req.end,
                };
                Some(self.stale_read(shard, &replica, mode, span).await?)
            }
            None => None,
        };
        let read_ts = match (snapshot, stale_read) {
            (Some(snap), _) => snap.read_ts,
            (None, Some(read)) => read.read_ts,
            (None, None) => {
                self.plain_read_ts(shard, &replica, parked, req.consistency)
                    .await?
            }
        };
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
        // A plain read waits for every intent in its range (it may have committed above
        // read_ts); a snapshot read only for those it may have to see (see `kv_snapshot`).
        // A stale read, for those that may commit at or below its timestamp.
        let lock_bound = match (snapshot, stale_read) {
            (Some(snap), _) => snap.lock_bound(),
            (None, Some(read)) => read.lock_bound,
            (None, None) => u64::MAX,
        };
        let (probe_start, probe_end) = (start.clone(), end.clone());
        let locked = move |locks: &LockTable| {
            locks.write_intent_in(&probe_start, probe_end.as_deref(), None, lock_bound)
        };
        let read = move |e: &dyn meridian_storage::Engine, table: &LockTable| match snapshot {
            Some(snap) => mvcc::scan_in_window(
                e,
                shard,
                (&start, end.as_deref()),
                (read_ts, snap.window_end_with(table)),
                limit,
                reverse,
            ),
            None => mvcc::scan(e, shard, &start, end.as_deref(), read_ts, limit, reverse)
                .map(|page| (page, None)),
        };
        let (page, uncertain) = match stale_read {
            Some(stale) => self.read_stale(&replica, stale, locked, read).await?,
            None => self.read_unlocked(&replica, read_ts, locked, read).await?,
        };
        let snapshot = snapshot.map(|s| s.reply(self.node.config.node_id, uncertain));
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
            snapshot,
            served_by: self.node.config.node_id,
        }))
    }

    async fn batch_get(
        &self,
        request: Request<BatchGetRequest>,
    ) -> std::result::Result<Response<BatchGetResponse>, Status> {
        let _permit = self.admit(&request).await?;
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
        let shard = one_shard(
            &self.node,
            req.keys.iter().map(|k| &k[..]),
            req.route.as_ref(),
        )?;
        if req.lock.is_some() && req.snapshot.is_none() {
            return Err(invalid("a locking read (lock) needs a transaction snapshot").into());
        }
        if let Some(mode) = stale_mode(req.consistency, req.staleness.as_ref())? {
            if req.snapshot.is_some() {
                return Err(invalid("a stale read takes no transaction snapshot").into());
            }
            return Ok(Response::new(
                self.stale_batch_get(shard, req.keys, mode).await?,
            ));
        }
        if let Some(spec) = &req.snapshot {
            let replica = self.node.replica(shard)?;
            return Ok(Response::new(
                self.snapshot_batch_get(shard, &replica, req.keys, spec, req.consistency, req.lock)
                    .await?,
            ));
        }
        // As a point read: on a lease, without waking the shard (`route_shard_read`).
        let (replica, parked) = self.route_shard_read(shard, req.consistency)?;
        let read_ts = self
            .plain_read_ts(shard, &replica, parked, req.consistency)
            .await?;
        let keys = Arc::new(req.keys);
        let probe = keys.clone();
        let found = self
            .read_unlocked(
                &replica,
                read_ts,
                move |locks| {
                    probe
                        .iter()
                        .find_map(|k| locks.write_intent(k, None, u64::MAX))
                },
                move |e, _| {
                    let refs: Vec<&[u8]> = keys.iter().map(|k| &k[..]).collect();
                    mvcc::multi_get(e, shard, &refs, read_ts)
                },
            )
            .await?;
        let node_id = self.node.config.node_id;
        let results = found
            .into_iter()
            .map(|f| GetResponse {
                served_by: node_id,
                ..get_response(f, read_ts, shard)
            })
            .collect();
        Ok(Response::new(BatchGetResponse {
            results,
            read_ts: read_ts.0,
            snapshot: None,
            served_by: node_id,
            lock: None,
        }))
    }

    async fn batch_put(
        &self,
        request: Request<BatchPutRequest>,
    ) -> std::result::Result<Response<BatchPutResponse>, Status> {
        let permit = self.admit(&request).await?;
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
            req.route.as_ref(),
        )?;
        let replica = self.node.replica(shard)?;
        let cmd = Command::Write {
            ts: 0,
            puts: req
                .entries
                .into_iter()
                .map(|kv| (kv.key, kv.value))
                .collect(),
            deletes: req.deletes,
            request: request_id(req.write_id),
        };
        let commit_ts = self.propose(shard, &replica, cmd, permit).await?;
        Ok(Response::new(BatchPutResponse {
            commit_ts,
            shard_id: shard.0,
        }))
    }

    async fn cas(
        &self,
        request: Request<CasRequest>,
    ) -> std::result::Result<Response<CasResponse>, Status> {
        let permit = self.admit(&request).await?;
        let req = request.into_inner();
        let (key, route) = (req.key.clone(), req.route);
        let cmd = cas_command(req, 0)?;
        let (desc, replica) = self.node.route(&key)?;
        check_route(&desc, route.as_ref())?;
        let shard = desc.id;
        let result = self
            .propose_for_result(shard, &replica, cmd, permit)
            .await?;
        let mut response = CasResponse {
            succeeded: result.mismatch.is_none(),
            commit_ts: result.commit_ts,
            shard_id: shard.0,
            ..Default::default()
        };
        if let Some(Some((version_ts, value))) = result.mismatch {
            response.found = true;
            response.current_value = value;
            response.current_version_ts = version_ts;
        }
        Ok(Response::new(response))
    }

    async fn commit(
        &self,
        request: Request<CommitRequest>,
    ) -> std::result::Result<Response<CommitResponse>, Status> {
        let permit = self.admit(&request).await?;
        let txn = TxnCommit::parse(request.into_inner(), &self.node.map())?;
        Ok(Response::new(self.commit_txn(txn, permit).await?))
    }

    async fn resolve(
        &self,
        request: Request<ResolveRequest>,
    ) -> std::result::Result<Response<ResolveResponse>, Status> {
        let permit = self.admit(&request).await?;
        Ok(Response::new(
            self.resolve_txn(request.into_inner(), permit).await?,
        ))
    }

    async fn commit_wait(
        &self,
        request: Request<CommitWaitRequest>,
    ) -> std::result::Result<Response<CommitWaitResponse>, Status> {
        // Admitted like any request: the wait holds the permit, at most 2 x max_offset.
        let _permit = self.admit(&request).await?;
        let ts = request.into_inner().ts;
        if ts == 0 || ts > meridian_raft::types::MAX_COMMAND_TS {
            return Err(invalid("ts must be set and at most MAX_COMMAND_TS").into());
        }
        self.commit_wait_on(Timestamp(ts)).await?;
        Ok(Response::new(CommitWaitResponse {}))
    }

    async fn release_locks(
        &self,
        request: Request<ReleaseLocksRequest>,
    ) -> std::result::Result<Response<ReleaseLocksResponse>, Status> {
        let _permit = self.admit(&request).await?;
        let req = request.into_inner();
        let owner =
            request_id(req.owner).ok_or_else(|| invalid("owner needs a non-zero client_id"))?;
        check_key(&req.key, "key")?;
        let (desc, replica) = self.node.route(&req.key)?;
        check_route(&desc, req.route.as_ref())?;
        let early = &self.node.early_locks;
        // Whatever this node keeps (a deposed leader's table too) goes; only the leader's
        // answer tells the client it is done, so a stale route is sent on to the leader.
        let released = early.release(desc.id, owner);
        let (leader, _) = crate::kv_snapshot::leadership(&replica);
        if leader != Some(self.node.config.node_id) {
            return Err(self.node.not_leader(desc.id, leader).await.into());
        }
        early
            .stats
            .request_releases
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(Response::new(ReleaseLocksResponse { released }))
    }
}
