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
/// Largest chunk of a snapshot file sent in one message, in bytes.
pub const SNAPSHOT_CHUNK_BYTES: usize = 1024 * 1024;
/// Most shards a cluster may be created with (pre-split).
pub const MAX_INITIAL_SHARDS: u32 = 1_024;
/// Most proposals a shard leader keeps in flight before pushing back with `Unavailable`.
pub const MAX_INFLIGHT_PROPOSALS_PER_SHARD: usize = 4_096;
/// Most Raft log entries group-committed in one fsync'ed write batch.
pub const MAX_LOG_BATCH_ENTRIES: usize = 4_096;
