//! The node's memory allocator: jemalloc, for every allocation in the process.
//!
//! # Why not glibc's malloc
//! Measured (`bench/scripts/rss-steady.sh`, YCSB A at a fixed 1,500 ops/s on a 3-node
//! cluster, `bench/results/2026-12-06/rss-allocator.md`): with glibc's malloc each node's RSS
//! grew from ~400 MiB to ~1 GiB within ten minutes while everything RocksDB accounts for
//! (block cache, memtables, table readers) stayed flat; the growth was all anonymous memory.
//! The same binaries with jemalloc preloaded (every allocation) stayed within a few tens of
//! MiB. glibc gives each
//! thread that contends an arena of its own (up to eight per core) and returns freed memory
//! to the kernel only from the top of each heap; a node's many short-lived allocations
//! (Raft entries, gRPC buffers, RocksDB's C++ objects) spread over tokio's workers, the
//! blocking pool and RocksDB's threads, so freed memory stayed resident. jemalloc bounds
//! fragmentation per size class and returns unused pages on a timer (RocksDB's and TiKV's
//! documentation recommend it for the same reason).
//!
//! # How
//! The `meridian` binary sets [`tikv_jemallocator::Jemalloc`] as Rust's global allocator.
//! [`stats`] reads jemalloc's own figures for `/metrics` (`meridian_heap_bytes`, installed by
//! `meridian start` with `meridian_server::metrics::set_heap_stats`).
//!
//! jemalloc is linked *prefixed*: it does not replace `malloc`, so RocksDB's C++ allocations
//! and every C library's stay on glibc. Unprefixed (`malloc` itself replaced) deadlocks under
//! libfaketime, which the Jepsen harness preloads for clock faults: jemalloc's first arena
//! reads the clock while holding its init lock, libfaketime's first `clock_gettime` resolves
//! symbols with `dlsym`, and `dlsym` allocates.
//!
//! # Not done yet
//! No tuning (arenas, decay times) and no heap profiling endpoint; both need measurements first.

use meridian_server::metrics::HeapStats;
use tikv_jemalloc_ctl::{epoch, stats};

/// jemalloc's figures now (its statistics are cached; advancing the epoch refreshes them).
/// `None` if jemalloc cannot be asked (not the allocator in use, or built without stats).
pub fn stats() -> Option<HeapStats> {
    epoch::advance().ok()?;
    Some(HeapStats {
        allocated: stats::allocated::read().ok()? as u64,
        active: stats::active::read().ok()? as u64,
        resident: stats::resident::read().ok()? as u64,
        metadata: stats::metadata::read().ok()? as u64,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::alloc::{GlobalAlloc, Layout};
    use tikv_jemallocator::Jemalloc;

    /// jemalloc answers with figures that count what it holds and nest as they must. (This
    /// test binary's global allocator is the system one, so the blocks go to jemalloc
    /// directly.)
    #[test]
    fn jemalloc_reports_nested_figures() {
        let layout = Layout::from_size_align(64 * 1024, 16).unwrap();
        let before = stats().expect("jemalloc statistics");
        let held: Vec<*mut u8> = (0..64)
            .map(|_| {
                // SAFETY: the layout has a non-zero size; every block is freed below with it.
                let block = unsafe { Jemalloc.alloc(layout) };
                assert!(!block.is_null());
                block
            })
            .collect();
        let s = stats().expect("jemalloc statistics");
        assert!(
            s.allocated >= before.allocated + 4 * 1024 * 1024,
            "{before:?} then {s:?}"
        );
        assert!(s.active >= s.allocated, "{s:?}");
        assert!(s.resident >= s.active, "{s:?}");
        assert!(s.metadata > 0, "{s:?}");
        for block in held {
            // SAFETY: allocated above by Jemalloc with this layout, freed once.
            unsafe { Jemalloc.dealloc(block, layout) };
        }
    }
}
