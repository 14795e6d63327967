//! The node's memory allocators: jemalloc for Rust's allocations, glibc (tamed) for RocksDB's.
//!
//! # The problem
//! Measured with `bench/scripts/rss-steady.sh` (YCSB A at a fixed 1,500 ops/s on a 3-node
//! cluster; `bench/results/2026-12-06/rss-allocator.md`): with glibc's malloc for everything,
//! each node's RSS grew from ~400 MiB to ~1 GiB within ten minutes while everything RocksDB
//! accounts for (block cache, memtables, table readers) stayed flat; the growth was anonymous
//! memory. The same binary with Debian's jemalloc preloaded for every allocation stayed within
//! a few tens of MiB. So the growth was glibc's malloc holding freed memory
//! (glibc gives threads that contend arenas of their own, up to eight per core, and returns
//! freed memory to the kernel only from the top of each heap); which of RocksDB's allocations
//! leave it behind was not profiled.
//!
//! # What the node does
//! - Rust's allocations go to jemalloc: the `meridian` binary sets
//!   [`tikv_jemallocator::Jemalloc`] as the global allocator, and [`stats`] feeds its figures
//!   to `/metrics` (`meridian_heap_bytes`, through `meridian_server::metrics::set_heap_stats`).
//!   Under load the Rust heap holds ~60 MiB, ~70 MiB resident.
//! - jemalloc is linked *prefixed*: it does not replace `malloc`, so RocksDB's C++
//!   allocations stay on glibc. Unprefixed (`malloc` itself replaced) deadlocks at start under
//!   libfaketime, which the Jepsen harness preloads for clock faults: jemalloc's first arena
//!   reads the clock while holding its init lock, and libfaketime's first `clock_gettime`
//!   resolves symbols with `dlsym`, which allocates.
//! - For glibc, `meridian start` caps the arenas at [`GLIBC_ARENAS`] ([`limit_glibc_arenas`]),
//!   pins the mmap threshold at [`GLIBC_MMAP_THRESHOLD`] ([`pin_glibc_mmap_threshold`]), so a
//!   freed memtable's arena blocks go back to the kernel at once instead of waiting in the
//!   heap, and a thread calls `malloc_trim(0)` every [`TRIM_PERIOD`] ([`spawn_glibc_trimmer`]),
//!   which returns whole free pages from inside every arena. An operator's own setting of
//!   either tunable (its `MALLOC_*` variable or `GLIBC_TUNABLES`) wins. The trim cannot be
//!   turned off yet.
//!
//! # Not done yet
//! - Flat RSS: over 30 minutes of YCSB A at 1,500 ops/s, RSS still rose ~1.5-1.8 MiB a minute
//!   (RocksDB's table readers, the Rust heap and glibc's unaccounted part each grew) and swung
//!   with the memtables (`bench/results/2026-12-06/rss-allocator.md` §4).
//! - RocksDB's memory on jemalloc (a RocksDB built with it, or a jemalloc that coexists with
//!   libfaketime, e.g. by moving the Jepsen clock faults off libfaketime).
//! - jemalloc tuning (arenas, decay times) and a heap profiling endpoint.

use meridian_server::metrics::HeapStats;
use std::time::Duration;
use tikv_jemalloc_ctl::{epoch, stats};

/// glibc arenas the node allows (RocksDB's allocations; see the module docs).
pub const GLIBC_ARENAS: i32 = 2;

/// Caps glibc's malloc at [`GLIBC_ARENAS`] arenas, unless the operator set a cap
/// (`MALLOC_ARENA_MAX`, or `glibc.malloc.arena_max` in `GLIBC_TUNABLES`: glibc reads both
/// itself, and the operator's choice wins). Call before any thread starts: arenas are created
/// as threads first contend. Returns the cap set, if any.
pub fn limit_glibc_arenas() -> Option<i32> {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    return set_unless_operator_did(
        "MALLOC_ARENA_MAX",
        "glibc.malloc.arena_max",
        nix::libc::M_ARENA_MAX,
        GLIBC_ARENAS,
    );
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    None
}

/// glibc allocations of at least this many bytes get a mapping of their own, returned to the
/// kernel when freed ([`pin_glibc_mmap_threshold`]). glibc's default, made fixed.
pub const GLIBC_MMAP_THRESHOLD: i32 = 128 * 1024;

/// Pins glibc's mmap threshold at [`GLIBC_MMAP_THRESHOLD`], unless the operator set one
/// (`MALLOC_MMAP_THRESHOLD_`, or `glibc.malloc.mmap_threshold` in `GLIBC_TUNABLES`). glibc
/// otherwise raises the threshold to the size of each mapped block freed (up to 32 MiB), so
/// after RocksDB frees its first memtable, the next memtables' arena blocks (up to 1 MiB
/// each) come from the heap and stay there, free, until a trim. Setting it also fixes the
/// trim threshold (glibc stops adjusting both). Returns the threshold set, if any.
pub fn pin_glibc_mmap_threshold() -> Option<i32> {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    return set_unless_operator_did(
        "MALLOC_MMAP_THRESHOLD_",
        "glibc.malloc.mmap_threshold",
        nix::libc::M_MMAP_THRESHOLD,
        GLIBC_MMAP_THRESHOLD,
    );
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    None
}

/// `mallopt(param, value)` unless the environment already sets it, by its own variable or in
/// `GLIBC_TUNABLES` (which glibc applied at start). Returns `value` if it was set.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn set_unless_operator_did(variable: &str, tunable: &str, param: i32, value: i32) -> Option<i32> {
    let tunables = std::env::var("GLIBC_TUNABLES").unwrap_or_default();
    if std::env::var_os(variable).is_some() || tunables.contains(tunable) {
        return None;
    }
    // SAFETY: mallopt only sets a tunable of glibc's allocator; the ones used here take effect
    // for later allocations (and arenas) and never move memory already allocated.
    let ok = unsafe { nix::libc::mallopt(param, value) };
    (ok == 1).then_some(value)
}

/// How often the node hands glibc's free pages back to the kernel ([`spawn_glibc_trimmer`]).
pub const TRIM_PERIOD: Duration = Duration::from_secs(10);

/// Starts a thread that calls glibc's `malloc_trim(0)` every `period`: it returns to the
/// kernel the whole free pages inside every arena, which glibc otherwise returns only from
/// the top of each heap. Each call holds one arena's lock at a time while it walks that
/// arena's free chunks.
pub fn spawn_glibc_trimmer(period: Duration) -> std::io::Result<()> {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    std::thread::Builder::new()
        .name("malloc-trim".into())
        .spawn(move || loop {
            std::thread::sleep(period);
            let started = std::time::Instant::now();
            // SAFETY: malloc_trim only releases free memory; it is thread-safe (it takes
            // each arena's lock in turn).
            unsafe { nix::libc::malloc_trim(0) };
            tracing::debug!(
                took_us = started.elapsed().as_micros() as u64,
                "malloc_trim"
            );
        })?;
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    let _ = period;
    Ok(())
}

/// jemalloc's figures now (its statistics are cached; advancing the epoch refreshes them).
/// `None` if jemalloc cannot be asked (built without statistics).
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
