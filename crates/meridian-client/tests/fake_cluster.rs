//! The client against an in-process fake cluster: three tonic servers on loopback that share
//! one scripted world (shard map, leaders, a key-value store) and answer exactly like Meridian
//! nodes do — `NOT_LEADER` with a `meridian-leader` hint, `WRONG_SHARD`, `UNAVAILABLE` — so the
//! routing cache, redirects, failover, regrouping, scan paging and deadlines are tested
//! without a real cluster.

use bytes::Bytes;
use meridian_client::proto::cluster_server::{Cluster, ClusterServer};
use meridian_client::proto::kv_server::{Kv, KvServer};
use meridian_client::proto::*;
use meridian_client::{Client, ClientConfig, Error};
use meridian_types::error::{ERROR_CODE_HEADER, LEADER_HINT_HEADER};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tonic::metadata::MetadataMap;
use tonic::transport::server::TcpIncoming;
use tonic::{Code, Request, Response, Status};

/// What every fake node sees.
#[derive(Default)]
struct World {
    shards: Mutex<Vec<ShardInfo>>,
    addresses: Mutex<BTreeMap<u64, String>>,
    store: Mutex<BTreeMap<Bytes, (Bytes, u64)>>,
    clock: AtomicU64,
    unavailable: AtomicBool,
    /// (node, method) of every request that reached a leader check.
    served: Mutex<Vec<(u64, &'static str)>>,
    scan_read_ts: Mutex<Vec<u64>>,
}

fn error(code: &str, message: &str, hint: Option<String>) -> Status {
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

fn contains(shard: &ShardInfo, key: &[u8]) -> bool {
    key >= shard.start.as_ref() && (shard.end.is_empty() || key < shard.end.as_ref())
}

struct FakeNode {
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

    fn tick(&self) -> u64 {
        self.world.clock.fetch_add(1, Ordering::SeqCst) + 1
    }
}

#[tonic::async_trait]
impl Kv for FakeNode {
    async fn get(&self, request: Request<GetRequest>) -> Result<Response<GetResponse>, Status> {
        let request = request.into_inner();
        let shard = self.lead("get", &request.key, false)?;
        let found = self.world.store.lock().unwrap().get(&request.key).cloned();
        Ok(Response::new(GetResponse {
            found: found.is_some(),
            value: found.clone().map(|f| f.0).unwrap_or_default(),
            version_ts: found.map_or(0, |f| f.1),
            read_ts: self.tick(),
            shard_id: shard.shard_id,
        }))
    }

    async fn put(&self, request: Request<PutRequest>) -> Result<Response<PutResponse>, Status> {
        let request = request.into_inner();
        let shard = self.lead("put", &request.key, false)?;
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
        self.world.store.lock().unwrap().remove(&request.key);
        Ok(Response::new(DeleteResponse {
            commit_ts: self.tick(),
            shard_id: shard.shard_id,
        }))
    }

    async fn cas(&self, request: Request<CasRequest>) -> Result<Response<CasResponse>, Status> {
        use meridian_client::proto::cas_request::{Action, Expect};
        let request = request.into_inner();
        let shard = self.lead("cas", &request.key, false)?;
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

    async fn scan(&self, request: Request<ScanRequest>) -> Result<Response<ScanResponse>, Status> {
        let r = request.into_inner();
        let shard = if r.reverse {
            self.lead("scan", &r.end, true)?
        } else {
            self.lead("scan", &r.start, false)?
        };
        let read_ts = self.tick();
        self.world.scan_read_ts.lock().unwrap().push(read_ts);
        let store = self.world.store.lock().unwrap();
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
        }))
    }

    async fn batch_get(
        &self,
        request: Request<BatchGetRequest>,
    ) -> Result<Response<BatchGetResponse>, Status> {
        let request = request.into_inner();
        let first = request.keys.first().cloned().unwrap_or_default();
        let shard = self.lead("batch_get", &first, false)?;
        if !request.keys.iter().all(|k| contains(&shard, k)) {
            return Err(error("WRONG_SHARD", "keys span shards", None));
        }
        let store = self.world.store.lock().unwrap();
        let read_ts = self.tick();
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
                }
            })
            .collect();
        Ok(Response::new(BatchGetResponse { results, read_ts }))
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

#[tonic::async_trait]
impl Cluster for FakeNode {
    async fn status(&self, _: Request<StatusRequest>) -> Result<Response<StatusResponse>, Status> {
        let addresses = self.world.addresses.lock().unwrap().clone();
        Ok(Response::new(StatusResponse {
            cluster_id: "fake".into(),
            answering_node: self.id,
            nodes: addresses
                .iter()
                .map(|(id, address)| NodeInfo {
                    node_id: *id,
                    client_addr: address.clone(),
                    peer_addr: String::new(),
                    region: "r".into(),
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

struct Fake {
    world: Arc<World>,
    servers: BTreeMap<u64, Server>,
}

impl Fake {
    /// Three nodes; data shards split at `splits`; node 1 leads everything.
    async fn start(splits: &[&str]) -> Fake {
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

    fn set_splits(&self, splits: &[&str], leader: u64) {
        let mut bounds: Vec<Bytes> = vec![Bytes::new()];
        bounds.extend(splits.iter().map(|s| Bytes::from(s.to_string())));
        bounds.push(Bytes::new());
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
                ..Default::default()
            });
        }
        *self.world.shards.lock().unwrap() = shards;
    }

    fn set_leader(&self, shard_id: u64, leader: u64) {
        for shard in self.world.shards.lock().unwrap().iter_mut() {
            if shard.shard_id == shard_id {
                shard.leader_id = leader;
            }
        }
    }

    fn address(&self, id: u64) -> String {
        self.world.addresses.lock().unwrap()[&id].clone()
    }

    /// Stops node `id`: its listener closes and open connections get GOAWAY, so the client
    /// sees transport errors, not answers.
    async fn kill(&mut self, id: u64) {
        if let Some((stop, task)) = self.servers.remove(&id) {
            let _ = stop.send(());
            let _ = tokio::time::timeout(Duration::from_secs(2), task).await;
        }
    }

    fn served(&self) -> Vec<(u64, &'static str)> {
        std::mem::take(&mut *self.world.served.lock().unwrap())
    }

    async fn client(&self, seeds: Vec<String>, call_timeout: Duration) -> Client {
        let mut config = ClientConfig::new(seeds);
        config.call_timeout = call_timeout;
        config.rpc_timeout = Duration::from_millis(500);
        config.connect_timeout = Duration::from_millis(200);
        config.backoff_initial = Duration::from_millis(5);
        config.backoff_max = Duration::from_millis(50);
        config.jitter_seed = Some(7);
        Client::connect(config).await.unwrap()
    }
}

/// Requests go straight to the cached leader; a moved leader is found through the hint.
#[tokio::test]
async fn routes_to_leader_and_follows_hints() {
    let fake = Fake::start(&["h", "p"]).await;
    let client = fake
        .client(vec![fake.address(3)], Duration::from_secs(5))
        .await;
    assert_eq!(client.shard_map().shards().len(), 3);
    fake.served();
    for key in ["a", "k", "z"] {
        client.put(key, "v").await.unwrap();
    }
    assert_eq!(
        fake.served(),
        vec![(1, "put"); 3],
        "one request each, to the leader"
    );

    fake.set_leader(2, 2);
    client.put("k", "v2").await.unwrap();
    assert_eq!(
        fake.served(),
        vec![(1, "put"), (2, "put")],
        "redirected once by the hint"
    );
    assert_eq!(client.route(b"k").unwrap().leader_id, Some(2));
    assert_eq!(client.get("k").await.unwrap().as_deref(), Some(&b"v2"[..]));
    assert_eq!(
        fake.served(),
        vec![(2, "get")],
        "the learnt leader is used directly"
    );
    let versioned = client.get_versioned("k").await.unwrap().unwrap();
    assert!(versioned.version_ts.as_u64() > 0);
    client.delete("k").await.unwrap();
    assert_eq!(client.get("k").await.unwrap(), None);
}

/// A compare-and-swap goes to the key's leader (following a hint like any write) and maps the
/// answer to an outcome.
#[tokio::test]
async fn compare_and_swap_routes_and_reports_outcomes() {
    use meridian_client::{CasOutcome, Expect};
    let fake = Fake::start(&["m"]).await;
    let client = fake
        .client(vec![fake.address(1)], Duration::from_secs(5))
        .await;
    let swap = |expect, new: &'static str| client.compare_and_swap("k", expect, Some(new.into()));
    let first = swap(Expect::Absent, "a").await.unwrap();
    let CasOutcome::Swapped { commit_ts } = first else {
        panic!("absent key: {first:?}")
    };
    let again = swap(Expect::Absent, "b").await.unwrap();
    let CasOutcome::Mismatch {
        current: Some(current),
    } = again
    else {
        panic!("present key: {again:?}")
    };
    assert_eq!(
        (&current.value[..], current.version_ts),
        (&b"a"[..], commit_ts)
    );
    fake.set_leader(1, 2);
    fake.served();
    assert!(swap(Expect::Version(commit_ts), "c")
        .await
        .unwrap()
        .swapped());
    assert_eq!(
        fake.served(),
        vec![(1, "cas"), (2, "cas")],
        "followed the hint"
    );
    assert!(swap(Expect::Value("c".into()), "d")
        .await
        .unwrap()
        .swapped());
    let delete = client.compare_and_swap("k", Expect::Value("d".into()), None);
    assert!(delete.await.unwrap().swapped());
    assert_eq!(client.get("k").await.unwrap(), None);
}

/// A dead leader costs one transport error; the client refreshes from a live node and moves on.
#[tokio::test]
async fn dead_leader_fails_over() {
    let mut fake = Fake::start(&["m"]).await;
    let client = fake
        .client(
            vec![fake.address(1), fake.address(2)],
            Duration::from_secs(5),
        )
        .await;
    client.put("a", "1").await.unwrap();
    fake.kill(1).await;
    fake.set_leader(1, 2);
    fake.set_leader(2, 3);
    fake.served();
    let started = Instant::now();
    client.put("a", "2").await.unwrap();
    client.put("x", "3").await.unwrap();
    let served = fake.served();
    assert!(
        served.iter().all(|(node, _)| *node != 1),
        "node 1 is down: {served:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(client.route(b"a").unwrap().leader_id, Some(2));
    assert_eq!(client.route(b"x").unwrap().leader_id, Some(3));
    assert_eq!(client.get("a").await.unwrap().as_deref(), Some(&b"2"[..]));
}

/// A split the client has not seen yet: WRONG_SHARD makes batches regroup; order is kept.
#[tokio::test]
async fn wrong_shard_regroups_batches() {
    let fake = Fake::start(&["m"]).await;
    let client = fake
        .client(vec![fake.address(1)], Duration::from_secs(5))
        .await;
    fake.set_splits(&["f", "m", "t"], 2);
    let keys: Vec<String> = ["z", "a", "n", "g", "u", "b", "m"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    client
        .batch_put(keys.iter().map(|k| (k.clone(), format!("v-{k}"))))
        .await
        .unwrap();
    assert_eq!(
        client.shard_map().shards().len(),
        4,
        "the map was refreshed"
    );
    let mut asked: Vec<String> = keys.clone();
    asked.insert(3, "missing".into());
    let values = client.batch_get(asked.clone()).await.unwrap();
    for (key, value) in asked.iter().zip(values) {
        let expected = (key != "missing").then(|| Bytes::from(format!("v-{key}")));
        assert_eq!(value, expected, "{key}");
    }
    assert!(client
        .batch_get(Vec::<Bytes>::new())
        .await
        .unwrap()
        .is_empty());
}

/// When no attempt can succeed, the call ends near call_timeout with the last error.
#[tokio::test]
async fn deadline_exceeded_carries_last_error() {
    let fake = Fake::start(&[]).await;
    let client = fake
        .client(vec![fake.address(1)], Duration::from_millis(600))
        .await;
    fake.world.unavailable.store(true, Ordering::SeqCst);
    let started = Instant::now();
    let error = client.put("k", "v").await.unwrap_err();
    let elapsed = started.elapsed();
    assert!(elapsed < Duration::from_millis(1_500), "{elapsed:?}");
    match &error {
        Error::DeadlineExceeded {
            last: Some(last),
            attempts,
            ..
        } => {
            assert!(matches!(**last, Error::Unavailable { .. }), "{last}");
            assert!(*attempts > 1);
        }
        other => panic!("unexpected {other}"),
    }
    assert!(!error.is_retryable());
}

/// Scans page across shards, forward and reverse, all pages at the first page's timestamp.
#[tokio::test]
async fn scan_pages_across_shards() {
    let fake = Fake::start(&["h", "p"]).await;
    let client = fake
        .client(vec![fake.address(1)], Duration::from_secs(5))
        .await;
    let keys: Vec<String> = (b'a'..=b'z')
        .map(|c| format!("{}{}", c as char, c as char))
        .collect();
    client
        .batch_put(keys.iter().map(|k| (k.clone(), k.clone())))
        .await
        .unwrap();
    fake.world.scan_read_ts.lock().unwrap().clear();

    let rows = client.scan("", None, 100, false).await.unwrap();
    let got: Vec<&[u8]> = rows.iter().map(|r| r.key.as_ref()).collect();
    let want: Vec<&[u8]> = keys.iter().map(|k| k.as_bytes()).collect();
    assert_eq!(got, want);
    let read_ts = fake.world.scan_read_ts.lock().unwrap().clone();
    assert_eq!(read_ts.len(), 3, "one page per shard");
    assert!(
        read_ts.windows(2).all(|w| w[0] < w[1]),
        "every page is read at its own (later) timestamp, not the first page's: {read_ts:?}"
    );

    let rows = client.scan("", None, 100, true).await.unwrap();
    let got: Vec<&[u8]> = rows.iter().map(|r| r.key.as_ref()).collect();
    let mut reversed = want.clone();
    reversed.reverse();
    assert_eq!(got, reversed);

    let rows = client
        .scan("ee", Some(Bytes::from("rr")), 100, false)
        .await
        .unwrap();
    assert_eq!(rows.first().unwrap().key, "ee");
    assert_eq!(rows.last().unwrap().key, "qq");
    let rows = client
        .scan("ee", Some(Bytes::from("rr")), 100, true)
        .await
        .unwrap();
    assert_eq!(rows.first().unwrap().key, "qq");
    assert_eq!(rows.last().unwrap().key, "ee");
    let rows = client.scan("cc", None, 7, false).await.unwrap();
    assert_eq!(rows.len(), 7);
    assert_eq!(rows.last().unwrap().key, "ii");
    assert!(client
        .scan("k", Some(Bytes::from("k")), 5, false)
        .await
        .unwrap()
        .is_empty());
}

/// Inputs over the limits fail before any request is sent.
#[tokio::test]
async fn invalid_arguments_fail_fast() {
    let fake = Fake::start(&[]).await;
    let client = fake
        .client(vec![fake.address(1)], Duration::from_secs(5))
        .await;
    fake.served();
    let huge_key = Bytes::from(vec![b'k'; meridian_types::limits::MAX_KEY_BYTES + 1]);
    let too_many: Vec<String> = (0..=meridian_types::limits::MAX_BATCH_KEYS)
        .map(|i| i.to_string())
        .collect();
    let results = [
        client.put("", "v").await.map(|_| ()),
        client.get(huge_key.clone()).await.map(|_| ()),
        client
            .scan("b", Some(Bytes::from("a")), 10, false)
            .await
            .map(|_| ()),
        client.scan("a", None, 0, false).await.map(|_| ()),
        client.batch_get(too_many.clone()).await.map(|_| ()),
        client
            .batch_put(too_many.iter().map(|k| (k.clone(), "v")))
            .await,
    ];
    for result in results {
        assert!(
            matches!(result, Err(Error::InvalidArgument { .. })),
            "{result:?}"
        );
    }
    assert!(fake.served().is_empty());
}

/// Connecting needs a seed, and gives up on dead seeds at call_timeout with the cause.
#[tokio::test]
async fn connect_errors() {
    assert!(matches!(
        Client::connect(ClientConfig::default()).await,
        Err(Error::NoSeeds)
    ));
    let dead = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().to_string()
    };
    let mut config = ClientConfig::new([dead]);
    config.call_timeout = Duration::from_millis(300);
    match Client::connect(config).await {
        Err(Error::DeadlineExceeded {
            last: Some(last), ..
        }) => {
            assert!(matches!(*last, Error::Transport { .. }), "{last}")
        }
        Err(other) => panic!("unexpected {other}"),
        Ok(_) => panic!("connected to nothing"),
    }
}
