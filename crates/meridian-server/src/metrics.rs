//! The node's metrics: Prometheus text exposition on `GET /metrics` at `--metrics-addr`.
//!
//! # What
//! Per-node figures an operator (or `bench/`) scrapes to see where time and work go:
//! - Raft groups: replicas hosted, awake or quiesced, and how many this node leads (and of
//!   those quiesced, how many hold a parked lease);
//! - peer messages received, by kind (`meridian_raft_messages_received_total{type=…}`), so a
//!   rate shows what idle or loaded groups cost on the wire;
//! - the Raft log writer (the node-wide thread that merges every shard's appends into one
//!   RocksDB write and one WAL sync): writes, items, syncs, flushes, time writing and syncing,
//!   queue depth — items per sync is the batching the write path gets;
//! - proposals: writes proposed as a shard leader and the Raft entries they went out in
//!   (meridian-raft `proposals`: coalescing under load), and those refused for a full queue;
//! - admission: client requests and bytes in flight against the node's budgets;
//! - clocks: each peer's measured offset and its uncertainty (what `clock_fence` judges);
//! - the process: resident memory and CPU time (from `/proc/self`), and, when the binary
//!   installed an allocator that reports them ([`set_heap_stats`]), the allocator's own
//!   figures: bytes the program holds against bytes the allocator keeps resident, so heap
//!   fragmentation shows apart from growth.
//!
//! # Why a hand-written HTTP responder
//! One endpoint, one verb, a text body: a 100-line HTTP/1.1 responder is smaller than an HTTP
//! framework and cannot be driven into anything else. Every connection has a deadline
//! ([`REQUEST_DEADLINE`]), a request head is at most [`MAX_REQUEST_BYTES`], at most
//! [`MAX_CONNECTIONS`] are served at once (others are closed at once), and each response
//! closes its connection.
//!
//! # Not done yet
//! - Messages sent (only received ones are counted; across a cluster the totals agree), and
//!   per-shard series (thousands of shards would make thousands of series).
//! - Latency histograms of client requests.

use crate::admission::Admission;
use crate::node::Node;
use meridian_raft::transport_stats::PeerMessage;
use openraft::type_config::async_runtime::WatchReceiver;
use std::fmt::Write as _;
use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Semaphore};

/// Deadline for reading a request and writing its response.
pub const REQUEST_DEADLINE: Duration = Duration::from_secs(5);
/// Largest request head read.
pub const MAX_REQUEST_BYTES: usize = 8 * 1024;
/// Connections served at once.
pub const MAX_CONNECTIONS: usize = 16;

/// What the process's allocator reports, in bytes (jemalloc's `stats.*` in the `meridian`
/// binary; see `meridian_cli::heap`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HeapStats {
    /// Held by the program (allocated and not freed).
    pub allocated: u64,
    /// In pages the allocator has handed out: `allocated` plus fragmentation within them.
    pub active: u64,
    /// Resident in the allocator's mappings: `active`, free pages not yet returned, metadata.
    pub resident: u64,
    /// The allocator's own bookkeeping.
    pub metadata: u64,
}

static HEAP_STATS: OnceLock<fn() -> Option<HeapStats>> = OnceLock::new();

/// Installs the function `/metrics` calls for [`HeapStats`] (once per process; later calls are
/// ignored). Without one, no heap figures are exported.
pub fn set_heap_stats(stats: fn() -> Option<HeapStats>) {
    let _ = HEAP_STATS.set(stats);
}

/// Serves `GET /metrics` on `listener` until `stop` turns true.
pub async fn serve(
    listener: TcpListener,
    node: Arc<Node>,
    admission: Admission,
    mut stop: watch::Receiver<bool>,
) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = stop.wait_for(|stopped| *stopped) => return,
        };
        let Ok((stream, _)) = accepted else {
            // Out of descriptors or similar: back off instead of spinning.
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            continue; // dropped: closed at once
        };
        let (node, admission) = (node.clone(), admission.clone());
        tokio::spawn(async move {
            let _slot = slot;
            let _ =
                tokio::time::timeout(REQUEST_DEADLINE, respond(stream, &node, &admission)).await;
        });
    }
}

async fn respond(mut stream: TcpStream, node: &Node, admission: &Admission) -> std::io::Result<()> {
    let mut head = Vec::with_capacity(512);
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = stream.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&buf[..n]);
        if head.len() > MAX_REQUEST_BYTES {
            write_response(&mut stream, "431 Request Header Fields Too Large", "").await?;
            // Read what the client still sends (bounded by the deadline): closing with unread
            // input would reset the connection and could destroy the response in flight.
            while stream.read(&mut buf).await? > 0 {}
            return Ok(());
        }
    }
    let line = head.split(|b| *b == b'\n').next().unwrap_or_default();
    let line = String::from_utf8_lossy(line);
    let mut parts = line.split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    match (method, path) {
        ("GET", "/metrics") => {
            let body = render(node, admission);
            write_response(&mut stream, "200 OK", &body).await
        }
        ("GET", _) => write_response(&mut stream, "404 Not Found", "try /metrics\n").await,
        _ => write_response(&mut stream, "405 Method Not Allowed", "GET /metrics\n").await,
    }
}

async fn write_response(stream: &mut TcpStream, status: &str, body: &str) -> std::io::Result<()> {
    let response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(response.as_bytes()).await?;
    stream.shutdown().await
}

/// Prometheus text: `# HELP`, `# TYPE`, then the samples of each metric.
struct Exposition(String);

impl Exposition {
    fn metric(&mut self, name: &str, kind: &str, help: &str, samples: &[(String, f64)]) {
        let _ = writeln!(self.0, "# HELP {name} {help}");
        let _ = writeln!(self.0, "# TYPE {name} {kind}");
        for (labels, value) in samples {
            if labels.is_empty() {
                let _ = writeln!(self.0, "{name} {value}");
            } else {
                let _ = writeln!(self.0, "{name}{{{labels}}} {value}");
            }
        }
    }

    fn one(&mut self, name: &str, kind: &str, help: &str, value: f64) {
        self.metric(name, kind, help, &[(String::new(), value)]);
    }
}

/// A label value with `\`, `"` and newlines escaped.
fn label(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The node's metrics now.
pub fn render(node: &Node, admission: &Admission) -> String {
    let mut out = Exposition(String::new());
    let config = &node.config;
    out.metric(
        "meridian_node_info",
        "gauge",
        "This node's id, region and zone.",
        &[(
            format!(
                "node_id=\"{}\",region=\"{}\",zone=\"{}\"",
                config.node_id,
                label(&config.region),
                label(&config.zone)
            ),
            1.0,
        )],
    );

    let (mut awake, mut quiesced, mut led, mut resting) = (0u64, 0u64, 0u64, 0u64);
    let (mut parked_leases, mut promises) = (0u64, 0u64);
    for replica in node.host.replicas() {
        if replica.promise_in_force(&node.host.ping_ledger) {
            promises += 1;
        }
        if replica.is_quiesced() {
            quiesced += 1;
            if replica.parked_lease_holds(&node.host.ping_ledger) {
                parked_leases += 1;
            }
        } else {
            awake += 1;
        }
        if replica.rest.is_resting() {
            resting += 1;
        }
        // Read in place: a clone of each group's whole metrics (membership, replication map)
        // per scrape would cost thousands of allocations on a node with thousands of groups.
        let leader = replica.raft.metrics().borrow_watched().current_leader;
        if leader == Some(config.node_id) {
            led += 1;
        }
    }
    out.metric(
        "meridian_raft_groups",
        "gauge",
        "Raft groups (shard replicas) on this node, awake or quiesced.",
        &[
            ("state=\"awake\"".into(), awake as f64),
            ("state=\"quiesced\"".into(), quiesced as f64),
        ],
    );
    out.one(
        "meridian_raft_groups_led",
        "gauge",
        "Raft groups this node leads.",
        led as f64,
    );
    out.one(
        "meridian_raft_parked_leases",
        "gauge",
        "Quiesced groups this node leads whose parked lease holds (docs/parked-reads.md): \
         their linearizable reads are served without waking them.",
        parked_leases as f64,
    );
    out.one(
        "meridian_raft_parked_promises",
        "gauge",
        "Groups whose replica here holds a promise to a parked leader (refusing other \
         candidates until that leader releases it or its node falls silent).",
        promises as f64,
    );
    out.one(
        "meridian_raft_parked_reads_total",
        "counter",
        "Linearizable reads served on a parked lease, without waking the group.",
        node.host
            .parked_reads
            .load(std::sync::atomic::Ordering::Relaxed) as f64,
    );
    let barriers = &node.read_barriers;
    out.metric(
        "meridian_read_barriers_total",
        "counter",
        "Read barriers this node's leaders passed for linearizable and snapshot client reads, \
         by kind: the leader's lease, or a ReadIndex quorum round (reads on a parked lease are \
         meridian_raft_parked_reads_total).",
        &[
            (
                "kind=\"lease\"".to_string(),
                barriers.lease.load(Ordering::Relaxed) as f64,
            ),
            (
                "kind=\"read_index\"".to_string(),
                barriers.read_index.load(Ordering::Relaxed) as f64,
            ),
        ],
    );
    out.one(
        "meridian_raft_ping_lapses_total",
        "counter",
        "Peers heard again after a silence of election_timeout_max or more (each ended this \
         node's parked-lease promises to the peer).",
        node.host.ping_ledger.lapses_total() as f64,
    );
    out.one(
        "meridian_raft_followers_resting",
        "gauge",
        "Awake follower replicas whose election ticker is off while they hear their leader.",
        resting as f64,
    );
    let received: Vec<(String, f64)> = node
        .host
        .transport_stats
        .counts()
        .into_iter()
        .map(|(m, n): (PeerMessage, u64)| (format!("type=\"{}\"", m.name()), n as f64))
        .collect();
    out.metric(
        "meridian_raft_messages_received_total",
        "counter",
        "Peer messages received, by kind (a streamed append counts each append).",
        &received,
    );

    let writer = node.host.writer.stats();
    let load = |v: &std::sync::atomic::AtomicU64| v.load(Ordering::Relaxed) as f64;
    let proposals = &node.host.propose_stats;
    for (name, help, value) in [
        (
            "proposals",
            "Writes this node proposed as a shard leader (alone or coalesced).",
            load(&proposals.proposals),
        ),
        (
            "entries",
            "Raft entries those writes went out in (proposals / entries = coalescing).",
            load(&proposals.entries),
        ),
        (
            "refused",
            "Writes refused because their shard's proposal queue was full (not proposed).",
            load(&proposals.refused),
        ),
    ] {
        out.one(
            &format!("meridian_proposal_{name}_total"),
            "counter",
            help,
            value,
        );
    }
    for (name, help, value) in [
        (
            "writes",
            "Merged RocksDB writes the log writer issued.",
            load(&writer.writes),
        ),
        (
            "items",
            "Queue items the log writer took (appends, marks, flushes).",
            load(&writer.items),
        ),
        (
            "syncs",
            "WAL syncs the log writer issued.",
            load(&writer.syncs),
        ),
        (
            "flushes",
            "Append callbacks fired durable.",
            load(&writer.flushes),
        ),
    ] {
        out.one(
            &format!("meridian_log_writer_{name}_total"),
            "counter",
            help,
            value,
        );
    }
    out.metric(
        "meridian_raft_log_reads_total",
        "counter",
        "Raft log reads (replication, apply, and openraft's other reads of entries), by where they were answered: the shard's in-memory tail (no hand-off) or RocksDB (on the blocking pool).",
        &[
            ("from=\"memory\"".to_string(), load(&writer.log_reads_memory)),
            ("from=\"rocksdb\"".to_string(), load(&writer.log_reads_stored)),
        ],
    );
    out.one(
        "meridian_log_writer_write_seconds_total",
        "counter",
        "Time the log writer spent writing batches.",
        load(&writer.write_micros) / 1e6,
    );
    out.one(
        "meridian_log_writer_sync_seconds_total",
        "counter",
        "Time the log writer spent in WAL syncs.",
        load(&writer.sync_micros) / 1e6,
    );
    out.one(
        "meridian_log_writer_queue_depth",
        "gauge",
        "Items queued for the log writer.",
        node.host.writer.queue_depth() as f64,
    );

    let (requests, bytes) = admission.in_flight();
    let (max_requests, max_bytes) = admission.limits();
    out.one(
        "meridian_requests_in_flight",
        "gauge",
        "Client requests admitted and not finished.",
        requests as f64,
    );
    out.one(
        "meridian_requests_in_flight_limit",
        "gauge",
        "Most client requests in flight (more are refused as overloaded).",
        max_requests as f64,
    );
    out.one(
        "meridian_request_bytes_in_flight",
        "gauge",
        "Encoded bytes of the client requests in flight.",
        bytes as f64,
    );
    out.one(
        "meridian_request_bytes_in_flight_limit",
        "gauge",
        "Most encoded bytes of client requests in flight.",
        max_bytes as f64,
    );

    let mut offsets = Vec::new();
    let mut uncertainties = Vec::new();
    let mut streams = Vec::new();
    let mut stream_connections = Vec::new();
    for member in &node.members_now() {
        if member.node_id == config.node_id {
            continue;
        }
        let peer = format!("peer=\"{}\"", member.node_id);
        let lanes = node.host.pool.stream_lanes(&member.peer_addr.to_string());
        streams.push((peer.clone(), lanes.iter().sum::<usize>() as f64));
        stream_connections.push((peer.clone(), lanes.len() as f64));
        if let Some(offset) = node.host.pool.offset_of(member.node_id) {
            offsets.push((peer.clone(), offset.offset_ms as f64 / 1e3));
            uncertainties.push((peer, offset.uncertainty_ms as f64 / 1e3));
        }
    }
    out.metric(
        "meridian_peer_replication_streams",
        "gauge",
        "Replication streams (one per shard this node leads and follower there) and snapshot transfers this node has open to a peer.",
        &streams,
    );
    out.metric(
        "meridian_peer_replication_connections",
        "gauge",
        &format!(
            "Connections carrying those streams and snapshots (each carries at most {}; other peer calls have their own).",
            meridian_raft::peer_streams::STREAMS_PER_CONNECTION
        ),
        &stream_connections,
    );
    out.metric(
        "meridian_peer_clock_offset_seconds",
        "gauge",
        "A peer's physical clock minus this node's, as the last ping measured it.",
        &offsets,
    );
    out.metric(
        "meridian_peer_clock_offset_uncertainty_seconds",
        "gauge",
        "The uncertainty of that measurement (half the ping's round trip).",
        &uncertainties,
    );

    let memory = node.engine.memory();
    out.metric(
        "meridian_storage_memory_bytes",
        "gauge",
        "Memory RocksDB holds, by kind: block cache (pinned: held by readers), memtables, table readers (index and filter blocks, not in the block cache).",
        &[
            ("kind=\"block_cache\"".to_string(), memory.block_cache as f64),
            ("kind=\"block_cache_pinned\"".to_string(), memory.block_cache_pinned as f64),
            ("kind=\"memtables\"".to_string(), memory.memtables as f64),
            ("kind=\"table_readers\"".to_string(), memory.table_readers as f64),
        ],
    );
    if let Some(heap) = HEAP_STATS.get().and_then(|stats| stats()) {
        out.metric(
            "meridian_heap_bytes",
            "gauge",
            "The allocator's figures: held by the program (allocated), in pages handed out (active), resident in its mappings (resident), its bookkeeping (metadata).",
            &[
                ("kind=\"allocated\"".to_string(), heap.allocated as f64),
                ("kind=\"active\"".to_string(), heap.active as f64),
                ("kind=\"resident\"".to_string(), heap.resident as f64),
                ("kind=\"metadata\"".to_string(), heap.metadata as f64),
            ],
        );
    }
    if let Some(rss) = resident_bytes() {
        out.one(
            "meridian_process_resident_memory_bytes",
            "gauge",
            "Resident memory of this process.",
            rss as f64,
        );
    }
    if let Some(cpu) = cpu_seconds() {
        out.one(
            "meridian_process_cpu_seconds_total",
            "counter",
            "User and system CPU time of this process.",
            cpu,
        );
    }
    early_locks(&mut out, &node.early_locks);
    out.0
}

/// Early locks (see `kv_early_lock`): keys by how a locking read got them, waits, releases.
fn early_locks(out: &mut Exposition, early: &crate::kv_early_lock::EarlyLocks) {
    let s = &early.stats;
    let n = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed) as f64;
    let results = [
        ("free", &s.free),
        ("own", &s.own),
        ("wound", &s.wound),
        ("waited", &s.waited),
        ("not_held", &s.not_held),
    ];
    out.metric(
        "meridian_early_lock_keys_total",
        "counter",
        "Keys locking reads asked for, by outcome: free, own (held already), wound (taken \
         from a junior), waited (granted after a wait), not_held (read unlocked).",
        &results.map(|(r, c)| (format!("result=\"{r}\""), n(c))),
    );
    out.one(
        "meridian_early_lock_waits_total",
        "counter",
        "Locking reads that waited for a lock.",
        n(&s.waits),
    );
    out.one(
        "meridian_early_lock_wait_seconds_total",
        "counter",
        "Time locking reads spent waiting for locks.",
        n(&s.wait_us) / 1e6,
    );
    out.metric(
        "meridian_early_lock_releases_total",
        "counter",
        "Owners' locks released by an applied commit or prepare, or Kv.ReleaseLocks calls.",
        &[
            ("by=\"commit\"".to_string(), n(&s.commit_releases)),
            ("by=\"request\"".to_string(), n(&s.request_releases)),
        ],
    );
    out.one(
        "meridian_early_lock_wounded_commits_total",
        "counter",
        "Commits refused because a senior took a lock of their owner on the shard (a wound).",
        n(&s.wounded_commits),
    );
    out.one(
        "meridian_early_lock_refreshes_total",
        "counter",
        "Locking reads answered uncertain: a key changed after their read timestamp.",
        n(&s.refreshes),
    );
    out.one(
        "meridian_early_lock_table_clears_total",
        "counter",
        "Early lock tables cleared for a newer leader term.",
        n(&s.clears),
    );
    let (held, waiting) = early.gauges();
    out.one(
        "meridian_early_locks_held",
        "gauge",
        "Keys held by early locks now.",
        held as f64,
    );
    out.one(
        "meridian_early_lock_waiters",
        "gauge",
        "Locking reads waiting for a key now.",
        waiting as f64,
    );
}

/// `VmRSS` of `/proc/self/status`, in bytes.
fn resident_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    parse_vm_rss(&status)
}

fn parse_vm_rss(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// utime + stime of `/proc/self/stat`, in seconds.
fn cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    parse_cpu_seconds(&stat)
}

/// Linux reports `/proc` times in USER_HZ ticks, which the ABI fixes at 100 per second.
const USER_HZ: f64 = 100.0;

fn parse_cpu_seconds(stat: &str) -> Option<f64> {
    // The command name (field 2) may hold spaces and parentheses: count from the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After the name: state is field 3, utime field 14, stime field 15 (1-based).
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) / USER_HZ)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_proc_figures() {
        let stat = "4242 (meridian (x) y) S 1 4242 4242 0 -1 4194560 2935 0 0 0 250 75 0 0 20 0 \
                    30 0 123 456 789";
        assert_eq!(parse_cpu_seconds(stat), Some(3.25));
        assert_eq!(parse_cpu_seconds("garbage"), None);
        let status = "Name:\tmeridian\nVmPeak:\t  10 kB\nVmRSS:\t    2096 kB\n";
        assert_eq!(parse_vm_rss(status), Some(2096 * 1024));
        assert_eq!(parse_vm_rss("Name: x\n"), None);
        assert!(resident_bytes().is_some_and(|b| b > 0));
        assert!(cpu_seconds().is_some());
    }

    #[test]
    fn exposition_format() {
        let mut out = Exposition(String::new());
        out.metric(
            "m_total",
            "counter",
            "Help.",
            &[("type=\"a\"".into(), 3.0), ("type=\"b\"".into(), 0.5)],
        );
        out.one("g", "gauge", "A gauge.", 7.0);
        assert_eq!(
            out.0,
            "# HELP m_total Help.\n# TYPE m_total counter\nm_total{type=\"a\"} 3\n\
             m_total{type=\"b\"} 0.5\n# HELP g A gauge.\n# TYPE g gauge\ng 7\n"
        );
        assert_eq!(label("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }
}
