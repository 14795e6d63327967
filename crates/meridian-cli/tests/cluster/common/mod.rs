//! Helpers shared by the cluster tests: real `meridian start` processes on loopback.
//!
//! Every test uses its own port range (nodes at base+i and base+100+i) and temporary
//! directory, and every wait is bounded. nextest runs each test in its own process, one cluster
//! test at a time (`.config/nextest.toml`); under plain `cargo test` the tests, all in this one
//! binary, are serialized by [`run_scenario`], because a 3-node cluster already keeps this
//! 2-core machine busy.

#![allow(dead_code)] // kept for tests to come; the binary's modules use most of it

mod raw;
mod roles;
pub use raw::{at_leader, raw_get};
pub use roles::{shard_info_at, wait_shard_roles};

use meridian_cli::{LocalCluster, LocalClusterConfig};
use meridian_client::{Client, ClientConfig};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Bound on a cluster electing every shard's leader.
pub const READY_TIMEOUT: Duration = Duration::from_secs(90);
/// Bound on a whole test.
pub const TEST_TIMEOUT: Duration = Duration::from_secs(600);

static SERIAL: Mutex<()> = Mutex::new(());

/// Holds the per-binary test lock (a panicking test does not block the others).
fn serial() -> MutexGuard<'static, ()> {
    SERIAL
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Runs one cluster scenario: alone in its process, on a fresh multi-threaded runtime, within
/// TEST_TIMEOUT. Started nodes die with the scenario (LocalCluster's Drop) even on panic.
pub fn run_scenario(scenario: impl std::future::Future<Output = ()>) {
    let _serial = serial();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .expect("building the test runtime");
    runtime.block_on(async {
        tokio::time::timeout(TEST_TIMEOUT, scenario)
            .await
            .expect("scenario exceeded TEST_TIMEOUT")
    });
}

/// The wall clock in milliseconds since the Unix epoch (as HLC timestamps' physical part).
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970")
        .as_millis() as u64
}

pub fn binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_meridian"))
}

/// A 3-node cluster with `shards` data shards, loopback Raft timings and extra per-node args.
pub fn start_cluster(
    base_port: u16,
    dir: &Path,
    shards: u32,
    per_node: &[(u64, &[&str])],
) -> LocalCluster {
    let mut config = LocalClusterConfig::new(binary(), 3, base_port, dir)
        .common_args(["--initial-shards".to_string(), shards.to_string()]);
    for (node_id, args) in per_node {
        config = config.node_args(*node_id, args.iter().copied());
    }
    let cluster = LocalCluster::start(config).expect("spawning the cluster");
    eprintln!("cluster at ports {base_port}+, logs in {}", dir.display());
    cluster
}

/// [`start_cluster`] with owned per-node args: `per_node[i]` are node `i + 1`'s.
pub fn start_cluster_with_args(
    base_port: u16,
    dir: &Path,
    shards: u32,
    per_node: &[Vec<String>],
) -> LocalCluster {
    let borrowed: Vec<Vec<&str>> = per_node
        .iter()
        .map(|f| f.iter().map(String::as_str).collect())
        .collect();
    let by_node: Vec<(u64, &[&str])> = borrowed
        .iter()
        .enumerate()
        .map(|(i, f)| (i as u64 + 1, f.as_slice()))
        .collect();
    start_cluster(base_port, dir, shards, &by_node)
}

/// Per-node flags that serve each node's metrics on `port_of(node)` (nodes 1..=3), for
/// [`start_cluster_with_args`].
pub fn metrics_flags(port_of: impl Fn(u64) -> u16) -> Vec<Vec<String>> {
    (1..=3)
        .map(|n| {
            vec![
                "--metrics-addr".to_string(),
                format!("127.0.0.1:{}", port_of(n)),
            ]
        })
        .collect()
}

/// A client with room for a leader election inside one call.
pub async fn connect_client(endpoints: Vec<String>) -> Client {
    let mut config = ClientConfig::new(endpoints);
    config.call_timeout = Duration::from_secs(20);
    config.rpc_timeout = Duration::from_secs(2);
    Client::connect(config)
        .await
        .expect("connecting the client")
}

/// Runs a command to completion, killing it after `timeout`.
pub fn run_bounded(command: &mut Command, timeout: Duration) -> Output {
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawning meridian");
    let give_up = Instant::now() + timeout;
    loop {
        if child.try_wait().expect("polling child").is_some() {
            return child.wait_with_output().expect("collecting output");
        }
        if Instant::now() >= give_up {
            let _ = child.kill();
            let output = child.wait_with_output().expect("collecting output");
            panic!(
                "command did not finish within {timeout:?}; stderr:\n{}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Copies a directory tree (the source must not be written meanwhile).
pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("creating copy target");
    for entry in std::fs::read_dir(from).expect("reading source dir") {
        let entry = entry.expect("dir entry");
        let target = to.join(entry.file_name());
        if entry.file_type().expect("file type").is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).expect("copying file");
        }
    }
}

/// SIGKILLs the leader of `key`'s shard (as `client` last saw it) once `done` reaches `after`;
/// the task returns the killed node's id. Panics if `done` stalls for two minutes first.
#[allow(dead_code)] // not every test binary kills a leader
pub fn kill_leader_after(
    cluster: std::sync::Arc<LocalCluster>,
    client: Client,
    key: String,
    done: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    after: usize,
) -> tokio::task::JoinHandle<u64> {
    tokio::spawn(async move {
        let give_up = Instant::now() + Duration::from_secs(120);
        while done.load(std::sync::atomic::Ordering::SeqCst) < after {
            assert!(
                Instant::now() < give_up,
                "the workload stalled before the kill"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let leader = client
            .route(key.as_bytes())
            .and_then(|r| r.leader_id)
            .expect("the key's shard has a known leader");
        cluster
            .kill(leader, nix::sys::signal::Signal::SIGKILL)
            .expect("SIGKILL");
        eprintln!("killed node {leader}, the leader of {key}'s shard, after {after} operations");
        leader
    })
}

/// Waits (at most `timeout`) until the `name=N` fields of the "GC pass done" lines in every
/// node's log add up to `want`; returns the sum.
pub async fn wait_for_gc_total(
    cluster: &LocalCluster,
    name: &str,
    want: u64,
    timeout: Duration,
) -> u64 {
    let started = Instant::now();
    loop {
        let total: u64 = cluster
            .node_ids()
            .iter()
            .filter_map(|id| cluster.log_contents(*id).ok())
            .flat_map(|log| {
                log.lines()
                    .filter(|l| l.contains("GC pass done"))
                    .filter_map(|l| field(l, name))
                    .collect::<Vec<_>>()
            })
            .sum();
        if total >= want {
            eprintln!("GC passes: {name} = {total} after {:?}", started.elapsed());
            return total;
        }
        assert!(
            started.elapsed() < timeout,
            "GC passes: {name} only {total} of {want} in {timeout:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Waits (bounded by `within`) until `read()` satisfies `ok`, polling every 100 ms; the
/// value that did.
pub async fn wait_for<T: std::fmt::Debug>(
    what: &str,
    within: Duration,
    read: impl Fn() -> T,
    ok: impl Fn(&T) -> bool,
) -> T {
    let started = Instant::now();
    loop {
        let value = read();
        if ok(&value) {
            eprintln!("{what}: {value:?} after {:?}", started.elapsed());
            return value;
        }
        assert!(
            started.elapsed() < within,
            "{what}: still {value:?} after {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The value of `name=N` in a log line.
pub fn field(line: &str, name: &str) -> Option<u64> {
    let at = line.find(&format!("{name}="))? + name.len() + 1;
    let digits: String = line[at..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

/// Writes each of `keys` (value = key), one after another, until stopped; remembers the
/// acknowledged ones.
pub fn spawn_writer(
    client: &Client,
    keys: Vec<String>,
) -> (
    Arc<std::sync::Mutex<Vec<String>>>,
    Arc<AtomicBool>,
    tokio::task::JoinHandle<()>,
) {
    let acked = Arc::new(std::sync::Mutex::new(Vec::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let (c, a, s) = (client.clone(), acked.clone(), stop.clone());
    let handle = tokio::spawn(async move {
        for key in keys {
            if s.load(Ordering::Relaxed) {
                break;
            }
            if c.put(key.clone(), key.clone()).await.is_ok() {
                a.lock().unwrap().push(key);
            }
        }
    });
    (acked, stop, handle)
}

/// [`spawn_writer`] over keys `<prefix>-000000`, `<prefix>-000001`, ..., returned once 50 writes
/// are acknowledged (so what is read back at the end spans whatever the test does next).
pub async fn start_writer(
    client: &Client,
    prefix: &str,
) -> (
    Arc<std::sync::Mutex<Vec<String>>>,
    Arc<AtomicBool>,
    tokio::task::JoinHandle<()>,
) {
    let keys = (0..100_000).map(|i| format!("{prefix}-{i:06}")).collect();
    let (acked, stop, writer) = spawn_writer(client, keys);
    let give_up = Instant::now() + Duration::from_secs(30);
    while acked.lock().unwrap().len() < 50 {
        assert!(Instant::now() < give_up, "the writer is stuck");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    (acked, stop, writer)
}

/// `meridian ARGS --endpoints ENDPOINTS`; panics unless it succeeds; its stdout. Blocking
/// (bounded): call it from a test's runtime only where stalling one worker is fine.
pub fn cli(endpoints: &[String], args: &[&str]) -> String {
    let output = run_bounded(
        Command::new(binary())
            .args(args)
            .arg("--endpoints")
            .arg(endpoints.join(",")),
        Duration::from_secs(300),
    );
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    eprintln!("{stdout}{}", String::from_utf8_lossy(&output.stderr));
    assert!(output.status.success(), "meridian {args:?} failed");
    stdout
}

/// Runs `meridian ARGS` (off the runtime), which must fail; its stderr.
pub async fn cli_refused(args: Vec<String>) -> String {
    let shown = args.join(" ");
    let output = tokio::task::spawn_blocking(move || {
        run_bounded(Command::new(binary()).args(&args), Duration::from_secs(90))
    })
    .await
    .unwrap();
    let said = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(
        !output.status.success(),
        "meridian {shown} must fail: {said}"
    );
    said
}

/// Peer links through `meridian-wan` between every ordered pair of a local cluster's `nodes`
/// nodes (peer ports `base_port + 100 + id`, regions as `LocalCluster` assigns them), each
/// `one_way` between different regions (zero within one); and each node's `--peer-dial` args.
pub async fn peer_wan(
    nodes: u64,
    base_port: u16,
    link_base_port: u16,
    one_way: Duration,
) -> (meridian_wan::Wan, Vec<(u64, [String; 2])>) {
    use meridian_cli::local_cluster::REGIONS;
    let mut matrix = meridian_wan::LatencyMatrix::new(Duration::ZERO);
    for (a, b) in [(0, 1), (1, 2), (0, 2)] {
        matrix
            .set_rtt(REGIONS[a], REGIONS[b], 2 * one_way)
            .expect("valid regions");
    }
    let endpoints: Vec<meridian_wan::NodeEndpoint> = (1..=nodes)
        .map(|id| meridian_wan::NodeEndpoint {
            id,
            region: REGIONS[(id as usize - 1) % REGIONS.len()].to_string(),
            addr: format!("127.0.0.1:{}", base_port as u64 + 100 + id)
                .parse()
                .unwrap(),
        })
        .collect();
    let loopback = std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);
    let plan = meridian_wan::matrix::plan_peer_links(&matrix, &endpoints, loopback, link_base_port)
        .expect("plan");
    let wan = meridian_wan::Wan::start(plan.links.clone(), &meridian_wan::LinkOptions::default())
        .await
        .expect("starting the WAN links");
    let dial = plan
        .dial_maps
        .iter()
        .map(|(id, map)| {
            let map = meridian_wan::matrix::format_dial_map(map);
            (*id, ["--peer-dial".to_string(), map])
        })
        .collect();
    (wan, dial)
}

/// Cuts (or heals) the peer links (see [`peer_wan`]) that carry the connections of `node`'s
/// peers to it, and with `outgoing` also its own to them.
pub fn cut_peer_links(wan: &meridian_wan::Wan, nodes: u64, node: u64, outgoing: bool, cut: bool) {
    use meridian_wan::control::{execute, Command};
    for other in (1..=nodes).filter(|n| *n != node) {
        let mut names = vec![format!("peer-{other}-to-{node}")];
        if outgoing {
            names.push(format!("peer-{node}-to-{other}"));
        }
        for name in names {
            let command = match cut {
                true => Command::Drop(name),
                false => Command::Heal(name),
            };
            execute(wan, &command).expect("link command");
        }
    }
}

/// Reads every key of `written` (a writer's keys, each written with itself as its value) and
/// panics unless each has its value.
pub async fn read_back(client: &Client, written: &[String]) {
    for key in written {
        let got = client.get(key.clone()).await.expect("read");
        assert_eq!(
            got.as_deref(),
            Some(key.as_bytes()),
            "acknowledged key {key}"
        );
    }
}

/// One HTTP/1.1 request to a node's metrics endpoint on `port`; returns (status line, body).
pub fn metrics_http(port: u16, request: &str) -> (String, String) {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    stream.write_all(request.as_bytes()).unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let (head, body) = response
        .split_once("\r\n\r\n")
        .expect("a complete response");
    (
        head.lines().next().unwrap_or("").to_string(),
        body.to_string(),
    )
}

/// Every sample of `GET /metrics` on `port`: `name{labels}` → value.
pub fn scrape_metrics(port: u16) -> std::collections::BTreeMap<String, f64> {
    let (status, body) = metrics_http(port, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
    assert_eq!(status, "HTTP/1.1 200 OK");
    body.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let (name, value) = l.rsplit_once(' ').expect("name value");
            (name.to_string(), value.parse().expect("a number"))
        })
        .collect()
}

/// The value of sample `name` (with its labels) in `samples`.
pub fn sample(samples: &std::collections::BTreeMap<String, f64>, name: &str) -> f64 {
    *samples
        .get(name)
        .unwrap_or_else(|| panic!("{name} missing from {samples:?}"))
}

/// Each reachable node's own `Status` (a node that does not answer within 2 s is left out).
pub async fn node_statuses(
    cluster: &LocalCluster,
    nodes: &[u64],
) -> Vec<meridian_client::proto::StatusResponse> {
    let mut out = Vec::new();
    for id in nodes {
        let addr = cluster.client_addr(*id).expect("node address");
        if let Ok(s) = meridian_client::fetch_status(&addr, Duration::from_secs(2)).await {
            out.push(s);
        }
    }
    out
}

/// The node that leads the most shards, by `nodes[0]`'s status, and how many it leads.
pub async fn busiest_leader(cluster: &LocalCluster, nodes: &[u64]) -> (u64, usize) {
    let status = node_statuses(cluster, &nodes[..1])
        .await
        .pop()
        .expect("the first node answers its status");
    let led_by = |id: u64| status.shards.iter().filter(|s| s.leader_id == id).count();
    let node = *nodes.iter().max_by_key(|id| led_by(**id)).unwrap();
    (node, led_by(node))
}

/// Waits (at most `timeout`, panicking after) until every survivor reports a live leader,
/// not `dead`, for every shard; returns how long that took from `since`.
pub async fn wait_for_live_leaders(
    cluster: &LocalCluster,
    survivors: &[u64],
    dead: u64,
    since: Instant,
    timeout: Duration,
) -> Duration {
    loop {
        let s = node_statuses(cluster, survivors).await;
        let leaderless: Vec<u64> = s
            .iter()
            .flat_map(|st| st.shards.iter())
            .filter(|sh| sh.leader_id == 0 || sh.leader_id == dead)
            .map(|sh| sh.shard_id)
            .collect();
        if s.len() == survivors.len() && leaderless.is_empty() {
            return since.elapsed();
        }
        assert!(
            since.elapsed() < timeout,
            "shards {leaderless:?} still without a live leader {timeout:?} after node {dead} died"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Bound on every replica quiescing once the cluster is idle.
pub const QUIESCE_TIMEOUT: Duration = Duration::from_secs(60);

/// (quiesced, total) replicas over the given nodes' own reports.
pub fn quiesced(statuses: &[meridian_client::proto::StatusResponse]) -> (usize, usize) {
    let all: Vec<bool> = statuses
        .iter()
        .flat_map(|s| {
            s.shards
                .iter()
                .filter(move |sh| sh.replicas.contains(&s.answering_node))
                .map(|sh| sh.quiesced)
        })
        .collect();
    (all.iter().filter(|q| **q).count(), all.len())
}

/// Waits (at most [`QUIESCE_TIMEOUT`], panicking after) until every replica on `nodes` reports
/// itself quiesced; returns how long that took.
pub async fn wait_all_quiesced(cluster: &LocalCluster, nodes: &[u64]) -> Duration {
    let started = Instant::now();
    loop {
        let s = node_statuses(cluster, nodes).await;
        let (quiet, total) = quiesced(&s);
        if s.len() == nodes.len() && total > 0 && quiet == total {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < QUIESCE_TIMEOUT,
            "only {quiet} of {total} replicas quiesced after {QUIESCE_TIMEOUT:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Writes `value` to every key of `keys` through `client`, panicking with `when` on a failure.
pub async fn put_every_key(
    client: &Client,
    keys: &[bytes::Bytes],
    value: &'static [u8],
    when: &str,
) {
    for key in keys {
        client
            .put(key.clone(), bytes::Bytes::from_static(value))
            .await
            .unwrap_or_else(|e| panic!("write {when}: {e}"));
    }
}

/// Panics if the log of any of `nodes` shows a panic.
pub fn assert_no_panics(cluster: &LocalCluster, nodes: &[u64]) {
    for id in nodes {
        let log = cluster.log_contents(*id).unwrap();
        assert!(!log.contains("panicked"), "node {id} panicked:\n{log}");
    }
}

/// SIGKILLs the node that leads the most shards and waits (at most `timeout`) until the others
/// report a live leader for every shard: (the killed node, how many shards it led, the
/// survivors, how long the leaders took).
pub async fn kill_busiest_leader(
    cluster: &LocalCluster,
    timeout: Duration,
) -> (u64, usize, Vec<u64>, Duration) {
    let nodes = cluster.node_ids();
    let (victim, led) = busiest_leader(cluster, &nodes).await;
    assert!(led > 0, "some node leads shards");
    cluster
        .kill(victim, nix::sys::signal::Signal::SIGKILL)
        .expect("SIGKILL");
    let killed_at = Instant::now();
    let survivors: Vec<u64> = nodes.iter().copied().filter(|n| *n != victim).collect();
    let took = wait_for_live_leaders(cluster, &survivors, victim, killed_at, timeout).await;
    (victim, led, survivors, took)
}

/// A client that knows only `nodes`' client addresses.
pub async fn connect_to(cluster: &LocalCluster, nodes: &[u64]) -> Client {
    connect_client(
        nodes
            .iter()
            .map(|n| cluster.client_addr(*n).expect("address"))
            .collect(),
    )
    .await
}
