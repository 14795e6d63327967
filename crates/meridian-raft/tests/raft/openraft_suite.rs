//! openraft's own storage conformance suite (`openraft::testing::log::Suite`) against Meridian's
//! log store and state machine, on both storage engines.

use meridian_raft::log_store::LogStore;
use meridian_raft::log_writer::LogWriter;
use meridian_raft::state_machine::ShardStateMachine;
use meridian_raft::TypeConfig;
use meridian_storage::{Engine, EngineOptions, MemoryEngine, RocksEngine};
use meridian_types::{Clock, ShardId};
use openraft::testing::log::{StoreBuilder, Suite};
use openraft::StorageError;
use std::sync::Arc;
use std::time::Duration;

struct Builder {
    rocks: bool,
}

impl StoreBuilder<TypeConfig, LogStore, ShardStateMachine, tempfile::TempDir> for Builder {
    async fn build(
        &self,
    ) -> Result<(tempfile::TempDir, LogStore, ShardStateMachine), StorageError<TypeConfig>> {
        let dir = tempfile::tempdir().expect("tempdir");
        let engine: Arc<dyn Engine> = if self.rocks {
            Arc::new(
                RocksEngine::open(&dir.path().join("db"), &EngineOptions::default())
                    .expect("open rocksdb"),
            )
        } else {
            Arc::new(MemoryEngine::new())
        };
        let shard = ShardId(3);
        let writer = Arc::new(LogWriter::start(engine.clone()));
        let clock = Arc::new(Clock::new(Duration::from_millis(500)));
        let sm = ShardStateMachine::open(
            shard,
            meridian_storage::keys::Span::user(),
            engine.clone(),
            clock,
            dir.path().join("snapshots"),
        )
        .expect("open state machine");
        Ok((dir, LogStore::new(shard, engine, writer), sm))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openraft_suite_on_memory_engine() {
    Suite::test_all(Builder { rocks: false })
        .await
        .expect("suite passes");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openraft_suite_on_rocksdb() {
    Suite::test_all(Builder { rocks: true })
        .await
        .expect("suite passes");
}
