//! Runs the engine conformance suite against both engines.

use meridian_storage::{conformance, EngineOptions, MemoryEngine, RocksEngine};
use std::cell::RefCell;

/// MemoryEngine passes every conformance check.
#[test]
fn memory_engine_conforms() {
    conformance::run_all(MemoryEngine::new);
}

/// RocksEngine (fresh temp dir per check) passes every conformance check.
#[test]
fn rocks_engine_conforms() {
    let dirs = RefCell::new(Vec::new());
    let opts = EngineOptions {
        block_cache_bytes: 8 << 20,
        write_buffer_bytes: 4 << 20,
        ..EngineOptions::default()
    };
    conformance::run_all(|| {
        let dir = tempfile::tempdir().expect("tempdir");
        let engine = RocksEngine::open(dir.path(), &opts).expect("open");
        dirs.borrow_mut().push(dir);
        engine
    });
}
