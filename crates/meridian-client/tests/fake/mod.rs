#![allow(dead_code)] // each test binary uses a different part
//! An in-process fake cluster for the client's tests: three tonic servers on loopback that share
//! one scripted world (shard map, leaders, a key-value store) and answer exactly like Meridian
//! nodes do — `NOT_LEADER` with a `meridian-leader` hint, `WRONG_SHARD`, `UNAVAILABLE` — so the
//! routing cache, redirects, failover, regrouping, scan paging and deadlines are tested
//! without a real cluster.

mod two_phase;

pub use two_phase::TwoPhase;

use bytes::Bytes;
use meridian_client::proto::cluster_server::{Cluster, ClusterServer};
use meridian_client::proto::kv_server::{Kv, KvServer};
use meridian_client::proto::*;
use meridian_client::{Client, ClientConfig};
use meridian_types::error::{ERROR_CODE_HEADER, LEADER_HINT_HEADER};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tonic::metadata::MetadataMap;
use tonic::transport::server::TcpIncoming;
use tonic::{Code, Request, Response, Status};

/// What every fake node sees.
#[derive(Default)]
pub struct World {
    pub shards: Mutex<Vec<ShardInfo>>,
    pub addresses: Mutex<BTreeMap<u64, String>>,
    pub store: Mutex<BTreeMap<Bytes, (Bytes, u64)>>,
    pub clock: AtomicU64,
    pub unavailable: AtomicBool,
    /// (node, method) of every request that reached a leader check.
    pub served: Mutex<Vec<(u64, &'static str)>>,
    pub scan_read_ts: Mutex<Vec<u64>>,
    /// (`consistency`, whether it carried a snapshot) of every `Scan` and `BatchGet`.
    pub read_consistency: Mutex<Vec<(i32, bool)>>,
    /// The `read_ts` of every snapshot read (0 = the node picks).
    pub snapshot_reads: Mutex<Vec<u64>>,
    /// Every prepare asked for, with its number of writes.
    pub prepares: Mutex<Vec<(TxnPrepare, usize)>>,
    /// The range generation `set_splits` gives every shard (bumped by each call).
    pub generation: AtomicU64,
    /// Requests refused because their route named another shard or generation.
    pub route_rejections: AtomicU64,
    /// Requests that carried no route.
    pub unrouted: AtomicU64,
    /// Followers serve stale reads (a real follower does when its closed timestamp covers
    /// them); otherwise they answer NOT_LEADER like any other request.
    pub followers_serve_stale: AtomicBool,
    /// The next replica move is made but its answer is lost: the client sees a transport
    /// error (a connection reset after the request was sent), as when the leader's reply
    /// never arrives.
    pub lose_move_reply: AtomicBool,
    /// Prepares, resolves and commit-waits are served by this (`two_phase`) when set, and
    /// refused otherwise.
    pub two_phase: Mutex<Option<TwoPhase>>,
    /// Every locking read's lock request (the fake grants every key).
    pub lock_requests: Mutex<Vec<LockRequest>>,
    /// The `lock_owner` of every commit and prepare.
    pub commit_lock_owners: Mutex<Vec<Option<WriteId>>>,
    /// The `first_send` flag of every commit and prepare.
    pub commit_first_sends: Mutex<Vec<bool>>,
    /// The next commit or prepare is dropped unapplied, and its caller sees a transport error
    /// (a connection reset after the request was sent): its outcome is unknown to the client,
    /// which sends it again with the same write id.
    pub drop_next_commit: AtomicBool,
    /// Every `Kv.ReleaseLocks` owner.
    pub releases: Mutex<Vec<WriteId>>,
}

pub fn error(code: &str, message: &str, hint: Option<String>) -> Status {
    let mut metadata = MetadataMap::new();
    metadata.insert(ERROR_CODE_HEADER, code.parse().unwrap());
    if let Some(hint) = hint {
        metadata.insert(LEADER_HINT_HEADER, hint.parse().unwrap());
    }
    let grpc = if code == "INVALID_ARGUMENT" {
        Code::InvalidArgument
    } else {
        Code::FailedPrecondition
    };
    Status::with_metadata(grpc, message, metadata)
}

pub fn contains(shard: &ShardInfo, key: &[u8]) -> bool {
    key >= shard.start.as_ref() && (shard.end.is_empty() || key < shard.end.as_ref())
}

pub struct FakeNode {
    id: u64,
    world: Arc<World>,
}

impl FakeNode {
    /// The shard owning `key` if this node leads it, else the error a node would return.
    fn lead(&self, method: &'static str, key: &[u8], below: bool) -> Result<ShardInfo, Status> {
        self.world.served.lock().unwrap().push((self.id, method));
        if self.world.unavailable.load(Ordering::SeqCst) {
            return Err(error("UNAVAILABLE", "no quorum", None));
        }
        let shards = self.world.shards.lock().unwrap();
        let shard = shards
            .iter()
            .filter(|s| s.shard_id != 0)
            .find(|s| {
                if below {
                    // Reverse scans: the shard owning the greatest key below `key` (empty = +inf).
                    (key.is_empty() && s.end.is_empty())
                        || (!key.is_empty()
                            && s.start.as_ref() < key
                            && (s.end.is_empty() || key <= s.end.as_ref()))
                } else {
                    contains(s, key)
                }
            })
            .cloned()
            .ok_or_else(|| error("WRONG_SHARD", "no such shard here", None))?;
        if shard.leader_id != self.id {
            let hint = self
                .world
                .addresses
                .lock()
                .unwrap()
                .get(&shard.leader_id)
                .map(|a| format!("{}@{a}", shard.leader_id));
            return Err(error("NOT_LEADER", "not the leader", hint));
        }
        Ok(shard)
    }

    /// `WRONG_SHARD` if the request's route names another shard or generation than `shard`
    /// (as a Meridian node answers a client routing by a stale map).
    fn check_route(&self, shard: &ShardInfo, route: Option<&Route>) -> Result<(), Status> {
        match route {
            None => {
                self.world.unrouted.fetch_add(1, Ordering::SeqCst);
                Ok(())
            }
            Some(r) if r.shard_id != shard.shard_id || r.generation != shard.generation => {
                self.world.route_rejections.fetch_add(1, Ordering::SeqCst);
                Err(error("WRONG_SHARD", "routed by a stale shard map", None))
            }
            Some(_) => Ok(()),
        }
    }

    fn tick(&self) -> u64 {
        self.world.clock.fetch_add(1, Ordering::SeqCst) + 1
    }

    /// The read timestamp and snapshot reply of a read that found `versions`. The fake keeps
    /// no history, so a snapshot read at a timestamp below a version it finds is answered
    /// "uncertain" at that version (the restart then reads it); a real shard reads the older
    /// version unless the newer one is inside the uncertainty window.
    fn snapshot_read(
        &self,
        snapshot: Option<&TxnSnapshot>,
        versions: impl Iterator<Item = u64>,
    ) -> (u64, Option<SnapshotReply>) {
        let now = self.tick();
        let Some(spec) = snapshot else {
            return (now, None);
        };
        self.world.snapshot_reads.lock().unwrap().push(spec.read_ts);
        let read_ts = if spec.read_ts == 0 { now } else { spec.read_ts };
        let uncertain = versions.filter(|&v| v > read_ts).max().unwrap_or(0);
        let reply = SnapshotReply {
            node_id: self.id,
            observed_ts: now,
            uncertain_ts: uncertain,
            uncertainty_limit: spec.uncertainty_limit.max(read_ts + 1_000),
        };
        (read_ts, Some(reply))
    }
}

#[tonic::async_trait]
impl Kv for FakeNode {
    async fn get(&self, request: Request<GetRequest>) -> Result<Response<GetResponse>, Status> {
        let request = request.into_inner();
        let shard = if request.staleness.is_some()
            && self.world.followers_serve_stale.load(Ordering::SeqCst)
        {
            self.world
                .served
                .lock()
                .unwrap()
                .push((self.id, "stale get"));
            let shards = self.world.shards.lock().unwrap();
            shards
                .iter()
                .find(|s| s.shard_id != 0 && contains(s, &request.key))
                .cloned()
                .ok_or_else(|| error("WRONG_SHARD", "no such shard here", None))?
        } else {
            self.lead("get", &request.key, false)?
        };
        self.check_route(&shard, request.route.as_ref())?;
        let found = self.world.store.lock().unwrap().get(&request.key).cloned();
        Ok(Response::new(GetResponse {
            found: found.is_some(),
            value: found.clone().map(|f| f.0).unwrap_or_default(),
            version_ts: found.map_or(0, |f| f.1),
            read_ts: self.tick(),
            shard_id: shard.shard_id,
            served_by: self.id,
        }))
    }

    async fn put(&self, request: Request<PutRequest>) -> Result<Response<PutResponse>, Status> {
        let request = request.into_inner();
        let shard = self.lead("put", &request.key, false)?;
        self.check_route(&shard, request.route.as_ref())?;
        let ts = self.tick();
        self.world
            .store
            .lock()
            .unwrap()
            .insert(request.key, (request.value, ts));
        Ok(Response::new(PutResponse {
            commit_ts: ts,
            shard_id: shard.shard_id,
        }))
    }

    async fn delete(
        &self,
        request: Request<DeleteRequest>,
    ) -> Result<Response<DeleteResponse>, Status> {
        let request = request.into_inner();
        let shard = self.lead("delete", &request.key, false)?;
        self.check_route(&shard, request.route.as_ref())?;
        self.world.store.lock().unwrap().remove(&request.key);
        Ok(Response::new(DeleteResponse {
            commit_ts: self.tick(),
            shard_id: shard.shard_id,
        }))
    }

    async fn resolve(
        &self,
        request: Request<ResolveRequest>,
    ) -> Result<Response<ResolveResponse>, Status> {
        let request = request.into_inner();
        let shard = self.lead("resolve", &request.key, false)?;
        match self.world.two_phase.lock().unwrap().as_mut() {
            Some(two_phase) => Ok(Response::new(two_phase.resolve(shard.shard_id, &request))),
            None => Err(error("INVALID_ARGUMENT", "the fake does not resolve", None)),
        }
    }

    async fn commit_wait(
        &self,
        request: Request<CommitWaitRequest>,
    ) -> Result<Response<CommitWaitResponse>, Status> {
        self.lead("commit_wait", b"", false)?;
        match self.world.two_phase.lock().unwrap().as_mut() {
            Some(two_phase) => two_phase
                .commit_wait(request.into_inner().ts)
                .map(Response::new),
            None => Err(error(
                "INVALID_ARGUMENT",
                "the fake does not commit-wait",
                None,
            )),
        }
    }

    async fn cas(&self, request: Request<CasRequest>) -> Result<Response<CasResponse>, Status> {
        use meridian_client::proto::cas_request::{Action, Expect};
        let request = request.into_inner();
        let shard = self.lead("cas", &request.key, false)?;
        self.check_route(&shard, request.route.as_ref())?;
        let mut store = self.world.store.lock().unwrap();
        let current = store.get(&request.key).cloned();
        let holds = match (request.expect, &current) {
            (Some(Expect::ExpectAbsent(true)), None) => true,
            (Some(Expect::ExpectVersionTs(ts)), Some((_, v))) => ts == *v,
            (Some(Expect::ExpectValue(want)), Some((v, _))) => want == *v,
            _ => false,
        };
        if !holds {
            return Ok(Response::new(CasResponse {
                found: current.is_some(),
                current_value: current.clone().map(|c| c.0).unwrap_or_default(),
                current_version_ts: current.map_or(0, |c| c.1),
                shard_id: shard.shard_id,
                ..Default::default()
            }));
        }
        let ts = self.tick();
        match request.action {
            Some(Action::PutValue(v)) => {
                store.insert(request.key, (v, ts));
            }
            _ => {
                store.remove(&request.key);
            }
        }
        Ok(Response::new(CasResponse {
            succeeded: true,
            commit_ts: ts,
            shard_id: shard.shard_id,
            ..Default::default()
        }))
    }

    /// Checks the reads against the store (as the shard's state machine does) and applies the
    /// writes at one tick if they hold; `WRONG_SHARD` if the keys span shards.
    async fn commit(
        &self,
        request: Request<CommitRequest>,
    ) -> Result<Response<CommitResponse>, Status> {
        let r = request.into_inner();
        self.world
            .commit_lock_owners
            .lock()
            .unwrap()
            .push(r.lock_owner);
        self.world
            .commit_first_sends
            .lock()
            .unwrap()
            .push(r.first_send);
        if self.world.drop_next_commit.swap(false, Ordering::SeqCst) {
            return Err(Status::unknown("h2 protocol error: connection reset"));
        }
        if let Some(prepare) = &r.prepare {
            // Two-phase commit is tested against real nodes (meridian-cli's tests/cluster/txn.rs); the
            // fake records what it was asked and refuses, unless `two_phase` is set.
            let key = r.writes.first().map(|w| w.key.clone()).unwrap_or_default();
            let shard = self.lead("prepare", &key, false)?;
            self.world
                .prepares
                .lock()
                .unwrap()
                .push((prepare.clone(), r.writes.len()));
            let ts = self.tick();
            return match self.world.two_phase.lock().unwrap().as_mut() {
                Some(two_phase) => two_phase
                    .prepare(shard.shard_id, ts, prepare)
                    .map(Response::new),
                None => Err(error("INVALID_ARGUMENT", "the fake does not prepare", None)),
            };
        }
        let keys: Vec<Bytes> = r
            .reads
            .iter()
            .map(|x| x.key.clone())
            .chain(r.ranges.iter().map(|x| x.start.clone()))
            .chain(r.writes.iter().map(|x| x.key.clone()))
            .collect();
        let shard = self.lead("commit", keys.first().map_or(&[][..], |k| &k[..]), false)?;
        self.check_route(&shard, r.route.as_ref())?;
        if !keys.iter().all(|k| contains(&shard, k)) {
            return Err(error("WRONG_SHARD", "the commit spans shards", None));
        }
        let mut store = self.world.store.lock().unwrap();
        let version = |store: &BTreeMap<Bytes, (Bytes, u64)>, k: &Bytes| store.get(k).map(|v| v.1);
        let mut conflict = r
            .reads
            .iter()
            .find(|read| version(&store, &read.key) != read.found.then_some(read.version_ts))
            .map(|read| read.key.clone());
        for range in &r.ranges {
            let now: Vec<(Bytes, u64)> = store
                .range(range.start.clone()..)
                .take_while(|(k, _)| range.end.is_empty() || *k < &range.end)
                .map(|(k, v)| (k.clone(), v.1))
                .collect();
            let read: Vec<(Bytes, u64)> = range
                .rows
                .iter()
                .map(|row| (row.key.clone(), row.version_ts))
                .collect();
            if conflict.is_none() && now != read {
                conflict = Some(range.start.clone());
            }
        }
        if let Some(key) = conflict {
            return Ok(Response::new(CommitResponse {
                conflict_key: key,
                shard_id: shard.shard_id,
                ..Default::default()
            }));
        }
        let ts = self.tick();
        for write in r.writes {
            match write.action {
                Some(txn_write::Action::PutValue(v)) => {
                    store.insert(write.key, (v, ts));
                }
                _ => {
                    store.remove(&write.key);
                }
            }
        }
        Ok(Response::new(CommitResponse {
            committed: true,
            commit_ts: ts,
            shard_id: shard.shard_id,
            ..Default::default()
        }))
    }

    async fn scan(&self, request: Request<ScanRequest>) -> Result<Response<ScanResponse>, Status> {
        let r = request.into_inner();
        let shard = if r.reverse {
            self.lead("scan", &r.end, true)?
        } else {
            self.lead("scan", &r.start, false)?
        };
        let store = self.world.store.lock().unwrap();
        let upper_bound = |k: &Bytes| {
            (r.end.is_empty() || k < &r.end) && (shard.end.is_empty() || k < &shard.end)
        };
        let (read_ts, snapshot) = self.snapshot_read(
            r.snapshot.as_ref(),
            store
                .range(r.start.clone()..)
                .take_while(|(k, _)| upper_bound(k))
                .map(|(_, v)| v.1),
        );
        self.world.scan_read_ts.lock().unwrap().push(read_ts);
        self.world
            .read_consistency
            .lock()
            .unwrap()
            .push((r.consistency, r.snapshot.is_some()));
        let limit = r.limit as usize;
        let row = |(k, (v, ts)): (&Bytes, &(Bytes, u64))| KeyValue {
            key: k.clone(),
            value: v.clone(),
            version_ts: *ts,
        };
        let (rows, more, resume_key): (Vec<KeyValue>, bool, Bytes) = if !r.reverse {
            let upper: Bytes = match (r.end.is_empty(), shard.end.is_empty()) {
                (true, _) => shard.end.clone(),
                (false, true) => r.end.clone(),
                (false, false) => r.end.clone().min(shard.end.clone()),
            };
            let rows: Vec<KeyValue> = store
                .range(r.start.clone()..)
                .take_while(|(k, _)| upper.is_empty() || *k < &upper)
                .take(limit)
                .map(row)
                .collect();
            if rows.len() == limit {
                let mut resume = rows.last().unwrap().key.to_vec();
                resume.push(0);
                (rows, true, Bytes::from(resume))
            } else if !shard.end.is_empty() && (r.end.is_empty() || shard.end < r.end) {
                (rows, true, shard.end.clone())
            } else {
                (rows, false, Bytes::new())
            }
        } else {
            let lower = r.start.clone().max(shard.start.clone());
            let rows: Vec<KeyValue> = store
                .range(lower..)
                .filter(|(k, _)| r.end.is_empty() || *k < &r.end)
                .rev()
                .take(limit)
                .map(row)
                .collect();
            if rows.len() == limit {
                let resume = rows.last().unwrap().key.clone();
                (rows, true, resume)
            } else if !shard.start.is_empty() && shard.start > r.start {
                (rows, true, shard.start.clone())
            } else {
                (rows, false, Bytes::new())
            }
        };
        Ok(Response::new(ScanResponse {
            rows,
            resume_key,
            more,
            read_ts,
            shard_id: shard.shard_id,
            snapshot,
            served_by: self.id,
        }))
    }

    async fn batch_get(
        &self,
        request: Request<BatchGetRequest>,
    ) -> Result<Response<BatchGetResponse>, Status> {
        let request = request.into_inner();
        let first = request.keys.first().cloned().unwrap_or_default();
        let shard = self.lead("batch_get", &first, false)?;
        self.check_route(&shard, request.route.as_ref())?;
        if !request.keys.iter().all(|k| contains(&shard, k)) {
            return Err(error("WRONG_SHARD", "keys span shards", None));
        }
        self.world
            .read_consistency
            .lock()
            .unwrap()
            .push((request.consistency, request.snapshot.is_some()));
        let store = self.world.store.lock().unwrap();
        let (read_ts, snapshot) = self.snapshot_read(
            request.snapshot.as_ref(),
            request
                .keys
                .iter()
                .filter_map(|k| store.get(k).map(|v| v.1)),
        );
        let results = request
            .keys
            .iter()
            .map(|k| {
                let found = store.get(k);
                GetResponse {
                    found: found.is_some(),
                    value: found.map(|f| f.0.clone()).unwrap_or_default(),
                    version_ts: found.map_or(0, |f| f.1),
                    read_ts,
                    shard_id: shard.shard_id,
                    served_by: self.id,
                }
            })
            .collect();
        let lock = request.lock.map(|lock| {
            self.world.lock_requests.lock().unwrap().push(lock);
            LockReply {
                held: vec![true; request.keys.len()],
                ..Default::default()
            }
        });
        Ok(Response::new(BatchGetResponse {
            results,
            read_ts,
            snapshot,
            served_by: self.id,
            lock,
        }))
    }

    async fn release_locks(
        &self,
        request: Request<ReleaseLocksRequest>,
    ) -> Result<Response<ReleaseLocksResponse>, Status> {
        let request = request.into_inner();
        let shard = self.lead("release_locks", &request.key, false)?;
        self.check_route(&shard, request.route.as_ref())?;
        let owner = request.owner.unwrap_or_default();
        self.world.releases.lock().unwrap().push(owner);
        Ok(Response::new(ReleaseLocksResponse { released: 0 }))
    }

    async fn batch_put(
        &self,
        request: Request<BatchPutRequest>,
    ) -> Result<Response<BatchPutResponse>, Status> {
        let request = request.into_inner();
        let first = request
            .entries
            .first()
            .map(|e| e.key.clone())
            .unwrap_or_default();
        let shard = self.lead("batch_put", &first, false)?;
        self.check_route(&shard, request.route.as_ref())?;
        if !request.entries.iter().all(|e| contains(&shard, &e.key)) {
            return Err(error("WRONG_SHARD", "keys span shards", None));
        }
        let ts = self.tick();
        let mut store = self.world.store.lock().unwrap();
        for entry in request.entries {
            store.insert(entry.key, (entry.value, ts));
        }
        Ok(Response::new(BatchPutResponse {
            commit_ts: ts,
            shard_id: shard.shard_id,
        }))
    }
}

impl FakeNode {
    fn change_replicas(
        &self,
        req: ChangeReplicaRequest,
        what: &'static str,
        add: bool,
    ) -> Result<Response<ChangeReplicaResponse>, Status> {
        self.world.served.lock().unwrap().push((self.id, what));
        let mut shards = self.world.shards.lock().unwrap();
        let shard = shards
            .iter_mut()
            .find(|s| s.shard_id == req.shard_id)
            .ok_or_else(|| error("INVALID_ARGUMENT", "no such shard", None))?;
        if shard.leader_id != self.id {
            return Err(error("NOT_LEADER", "not the leader", None));
        }
        // Refused as a node refuses them, unless the caller may have asked before.
        let holds = shard.replicas.contains(&req.node_id);
        if add && holds && !req.retried {
            let message = format!(
                "node {} is a voter of shard {} already",
                req.node_id, req.shard_id
            );
            return Err(error("INVALID_ARGUMENT", &message, None));
        }
        if !add && !holds && !req.retried {
            let message = format!(
                "node {} holds no replica of shard {}",
                req.node_id, req.shard_id
            );
            return Err(error("INVALID_ARGUMENT", &message, None));
        }
        shard.replicas.retain(|n| *n != req.node_id);
        if add {
            shard.replicas.push(req.node_id);
        }
        if self.world.lose_move_reply.swap(false, Ordering::SeqCst) {
            return Err(Status::unknown("h2 protocol error: connection reset"));
        }
        Ok(Response::new(ChangeReplicaResponse {
            map_version: 2,
            voters: shard.replicas.clone(),
            learners: Vec::new(),
        }))
    }
}

#[tonic::async_trait]
impl Cluster for FakeNode {
    /// Leads the shard: the target leads from now on. Else NOT_LEADER, as a node answers.
    async fn transfer_leader(
        &self,
        request: Request<TransferLeaderRequest>,
    ) -> Result<Response<TransferLeaderResponse>, Status> {
        let req = request.into_inner();
        self.world
            .served
            .lock()
            .unwrap()
            .push((self.id, "transfer_leader"));
        let mut shards = self.world.shards.lock().unwrap();
        let shard = shards
            .iter_mut()
            .find(|s| s.shard_id == req.shard_id)
            .ok_or_else(|| error("INVALID_ARGUMENT", "no such shard", None))?;
        if shard.leader_id != self.id {
            return Err(error("NOT_LEADER", "not the leader", None));
        }
        shard.leader_id = req.to_node;
        shard.term += 1;
        Ok(Response::new(TransferLeaderResponse {
            leader_id: req.to_node,
            term: shard.term,
        }))
    }

    /// Leads the shard: lists the node among its replicas. Else NOT_LEADER.
    async fn add_replica(
        &self,
        request: Request<ChangeReplicaRequest>,
    ) -> Result<Response<ChangeReplicaResponse>, Status> {
        self.change_replicas(request.into_inner(), "add_replica", true)
    }

    /// Leads the shard: drops the node from its replicas. Else NOT_LEADER.
    async fn remove_replica(
        &self,
        request: Request<ChangeReplicaRequest>,
    ) -> Result<Response<ChangeReplicaResponse>, Status> {
        self.change_replicas(request.into_inner(), "remove_replica", false)
    }

    /// Leads the metadata shard: a clock tick. Else NOT_LEADER with the leader's address.
    async fn timestamp(
        &self,
        _: Request<TimestampRequest>,
    ) -> Result<Response<TimestampResponse>, Status> {
        self.world
            .served
            .lock()
            .unwrap()
            .push((self.id, "timestamp"));
        let leader = self
            .world
            .shards
            .lock()
            .unwrap()
            .iter()
            .find(|s| s.shard_id == 0)
            .map_or(0, |s| s.leader_id);
        if leader != self.id {
            let address = self.world.addresses.lock().unwrap().get(&leader).cloned();
            let hint = address.map(|a| format!("{leader}@{a}"));
            return Err(error("NOT_LEADER", "not the metadata leader", hint));
        }
        Ok(Response::new(TimestampResponse {
            ts: self.tick(),
            node_id: self.id,
        }))
    }

    /// The client never asks a node to join; a node does (`meridian-server`'s `join`).
    async fn join(&self, _: Request<JoinRequest>) -> Result<Response<JoinResponse>, Status> {
        Err(Status::unimplemented("the fake cluster takes no joins"))
    }

    async fn forget(&self, _: Request<ForgetRequest>) -> Result<Response<ForgetResponse>, Status> {
        Err(Status::unimplemented("the fake cluster forgets no members"))
    }

    async fn set_placement(
        &self,
        _: Request<SetPlacementRequest>,
    ) -> Result<Response<SetPlacementResponse>, Status> {
        Err(Status::unimplemented("the fake cluster has no placement"))
    }

    async fn status(&self, _: Request<StatusRequest>) -> Result<Response<StatusResponse>, Status> {
        let addresses = self.world.addresses.lock().unwrap().clone();
        Ok(Response::new(StatusResponse {
            cluster_id: "fake".into(),
            answering_node: self.id,
            shard_map_version: self.world.generation.load(Ordering::SeqCst),
            replication_factor: 3,
            nodes: addresses
                .iter()
                .map(|(id, address)| NodeInfo {
                    node_id: *id,
                    client_addr: address.clone(),
                    peer_addr: String::new(),
                    // One region per node, as in a 3-region cluster.
                    region: format!("region-{id}"),
                    zone: "z".into(),
                    live: true,
                    ..Default::default()
                })
                .collect(),
            shards: self.world.shards.lock().unwrap().clone(),
            hlc_now: self.tick(),
            log_writer: None,
        }))
    }
}

type Server = (
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<()>,
);

pub struct Fake {
    pub world: Arc<World>,
    servers: BTreeMap<u64, Server>,
}

impl Fake {
    /// Three nodes; data shards split at `splits`; node 1 leads everything.
    pub async fn start(splits: &[&str]) -> Fake {
        let world = Arc::new(World::default());
        let mut servers = BTreeMap::new();
        for id in 1..=3u64 {
            let incoming = TcpIncoming::bind("127.0.0.1:0".parse().unwrap()).unwrap();
            let address = incoming.local_addr().unwrap().to_string();
            world.addresses.lock().unwrap().insert(id, address);
            let router = tonic::transport::Server::builder()
                .add_service(KvServer::new(FakeNode {
                    id,
                    world: world.clone(),
                }))
                .add_service(ClusterServer::new(FakeNode {
                    id,
                    world: world.clone(),
                }));
            let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
            let task = tokio::spawn(async move {
                let _ = router
                    .serve_with_incoming_shutdown(incoming, async {
                        let _ = stopped.await;
                    })
                    .await;
            });
            servers.insert(id, (stop, task));
        }
        let fake = Fake { world, servers };
        fake.set_splits(splits, 1);
        fake
    }

    pub fn set_splits(&self, splits: &[&str], leader: u64) {
        let mut bounds: Vec<Bytes> = vec![Bytes::new()];
        bounds.extend(splits.iter().map(|s| Bytes::from(s.to_string())));
        bounds.push(Bytes::new());
        let generation = self.world.generation.fetch_add(1, Ordering::SeqCst) + 1;
        let mut shards = vec![ShardInfo {
            shard_id: 0,
            replicas: vec![1, 2, 3],
            leader_id: leader,
            ..Default::default()
        }];
        for (i, pair) in bounds.windows(2).enumerate() {
            shards.push(ShardInfo {
                shard_id: i as u64 + 1,
                start: pair[0].clone(),
                end: pair[1].clone(),
                replicas: vec![1, 2, 3],
                leader_id: leader,
                generation,
                ..Default::default()
            });
        }
        *self.world.shards.lock().unwrap() = shards;
    }

    pub fn set_leader(&self, shard_id: u64, leader: u64) {
        for shard in self.world.shards.lock().unwrap().iter_mut() {
            if shard.shard_id == shard_id {
                shard.leader_id = leader;
            }
        }
    }

    pub fn address(&self, id: u64) -> String {
        self.world.addresses.lock().unwrap()[&id].clone()
    }

    /// Stops node `id`: its listener closes and open connections get GOAWAY, so the client
    /// sees transport errors, not answers.
    pub async fn kill(&mut self, id: u64) {
        if let Some((stop, task)) = self.servers.remove(&id) {
            let _ = stop.send(());
            let _ = tokio::time::timeout(Duration::from_secs(2), task).await;
        }
    }

    pub fn served(&self) -> Vec<(u64, &'static str)> {
        std::mem::take(&mut *self.world.served.lock().unwrap())
    }

    pub async fn client(&self, seeds: Vec<String>, call_timeout: Duration) -> Client {
        self.client_with(seeds, call_timeout, |_| {}).await
    }

    /// [`Fake::client`] with `adjust` applied to its configuration.
    pub async fn client_with(
        &self,
        seeds: Vec<String>,
        call_timeout: Duration,
        adjust: impl FnOnce(&mut ClientConfig),
    ) -> Client {
        let mut config = ClientConfig::new(seeds);
        config.call_timeout = call_timeout;
        config.rpc_timeout = Duration::from_millis(500);
        config.connect_timeout = Duration::from_millis(200);
        config.backoff_initial = Duration::from_millis(5);
        config.backoff_max = Duration::from_millis(50);
        config.jitter_seed = Some(7);
        adjust(&mut config);
        Client::connect(config).await.unwrap()
    }
}
