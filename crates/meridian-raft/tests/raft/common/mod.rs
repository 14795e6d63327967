//! Helpers shared by the state-machine tests.

use meridian_raft::state_machine::ShardStateMachine;
use meridian_storage::Engine;
use meridian_types::{Clock, ShardId};
use std::sync::Arc;
use std::time::Duration;

/// Opens `shard`'s state machine over `engine`, owning every user key, with its snapshot files
/// under `dir`.
pub fn open_shard(
    shard: ShardId,
    engine: &Arc<dyn Engine>,
    dir: &std::path::Path,
) -> ShardStateMachine {
    let clock = Arc::new(Clock::new(Duration::from_millis(500)));
    ShardStateMachine::open(
        shard,
        meridian_storage::keys::Span::user(),
        engine.clone(),
        clock,
        dir.to_path_buf(),
    )
    .expect("open")
}
