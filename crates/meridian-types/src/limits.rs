//! Every size limit of Meridian's public and internal APIs. A request over a limit is
//! rejected with `INVALID_ARGUMENT` naming the limit before anything is written.

/// Largest user key, in bytes. Keys are stored escaped and prefixed, so keep them small.
pub const MAX_KEY_BYTES: usize = 4 * 1024;
/// Largest value, in bytes.
pub const MAX_VALUE_BYTES: usize = 1024 * 1024;
/// Most keys in one BatchGet / BatchPut request.
pub const MAX_BATCH_KEYS: usize = 1_000;
/// Largest total payload (keys + values) of one BatchPut request, in bytes.
pub const MAX_BATCH_BYTES: usize = 8 * 1024 * 1024;
/// Largest `limit` of one Scan page. A zero limit is rejected.
pub const MAX_SCAN_LIMIT: u32 = 10_000;
/// Largest gRPC message either side accepts, in bytes (requests and responses).
pub const MAX_MESSAGE_BYTES: usize = 16 * 1024 * 1024;
/// Most concurrent HTTP/2 streams a node accepts on one connection from a peer node. Every
/// shard a node leads keeps a long-lived replication stream open to each of its followers, so
/// a node opens another connection to a peer before its streams (and snapshot transfers) on
/// one pass half this (see `meridian-raft`'s `peer_streams`), and its other calls (pings,
/// votes, heartbeats) travel on a connection of their own.
pub const MAX_PEER_STREAMS_PER_CONNECTION: u32 = 1_024;
/// Largest chunk of a snapshot file sent in one message, in bytes.
pub const SNAPSHOT_CHUNK_BYTES: usize = 1024 * 1024;
/// Most shards a cluster may be created with (pre-split).
pub const MAX_INITIAL_SHARDS: u32 = 1_024;
/// Most proposals a shard leader keeps in flight before pushing back with `Unavailable`.
pub const MAX_INFLIGHT_PROPOSALS_PER_SHARD: usize = 4_096;
/// Most bytes of client request messages a node holds in flight; more is `Unavailable`.
pub const MAX_INFLIGHT_REQUEST_BYTES_PER_NODE: usize = 256 * 1024 * 1024;
/// Most bytes of request messages one client connection may have in flight at a node (a
/// quarter of the node's budget); beyond it its requests fail fast with `UNAVAILABLE`.
pub const MAX_INFLIGHT_REQUEST_BYTES_PER_CONNECTION: usize = 64 * 1024 * 1024;
/// Most Raft log items (appends, truncations, purges) the node's log writer merges into one
/// RocksDB write and one fsync.
pub const MAX_LOG_BATCH_ENTRIES: usize = 4_096;
/// Bytes of log writes after which the log writer stops merging more items into one write.
pub const MAX_LOG_WRITE_BYTES: usize = 32 * 1024 * 1024;
/// Most write request ids a shard remembers for deduplicating retries (the oldest are evicted
/// first; see `meridian-raft`'s dedup table).
pub const MAX_DEDUP_ENTRIES_PER_SHARD: usize = 100_000;
/// How long, in milliseconds of the shard's HLC, a shard remembers a write's request id. A
/// client never sends an attempt of a write later than [`MAX_WRITE_RETRY_MS`] after its first
/// attempt, well inside this window.
pub const DEDUP_WINDOW_MS: u64 = 120_000;
/// The latest a client may send a retry of a write, in milliseconds after its first attempt
/// (the client's monotonic clock). Together with [`DEDUP_WINDOW_MS`] this keeps every retry
/// inside the window its first attempt is remembered for.
pub const MAX_WRITE_RETRY_MS: u64 = 30_000;
/// Most stored entries (versions, tombstones, slots) one Scan page examines. A range full of
/// deleted or not-yet-visible keys could otherwise make one page read without bound; past the
/// budget the page ends early (possibly with no rows) and says where to resume.
pub const MAX_SCAN_ENTRIES_PER_PAGE: usize = 100_000;
/// Most keys one transaction may have read when it commits, counting every row of its scanned
/// ranges: the commit carries them all and the shard re-checks each one.
pub const MAX_TXN_READ_KEYS: usize = 10_000;
/// Most scanned ranges (per shard) one transaction's commit may carry.
pub const MAX_TXN_RANGES: usize = 64;
/// Most shards one multi-shard transaction may touch (its anchor's record lists the others).
pub const MAX_TXN_PARTICIPANTS: usize = 1_024;
/// Most attempts `Client::txn` makes by default before returning the last conflict.
pub const DEFAULT_TXN_MAX_ATTEMPTS: u32 = 10;
/// Longest a locking read (`BatchGetRequest.lock`) waits for early locks other owners hold;
/// a longer `wait_ms` is capped to it. A key not granted by then is read unlocked.
pub const EARLY_LOCK_WAIT_MAX_MS: u64 = 250;
/// An owner heard from by no locking read or commit on a shard for this long loses its early
/// locks there (a client that died or forgot to release them).
pub const EARLY_LOCK_IDLE_MS: u64 = 1_000;
/// Most per-node clock readings (observed timestamps) one snapshot read may carry: one per
/// node the transaction has read from.
pub const MAX_OBSERVED_NODES: usize = 256;
/// Longest a snapshot read waits for the shard's in-flight writes at or below its timestamp
/// to be applied before it fails with `UNAVAILABLE`.
pub const SNAPSHOT_SETTLE_TIMEOUT_MS: u64 = 2_000;
