//! Whether a GC pass would do anything: the shard's leader asks before it proposes one.
//!
//! # Why
//! A GC pass is Raft commands (`Command::Gc` pages over the data, then `Command::GcRecords`
//! pages over the transaction records), applied on every replica. The leader's loop
//! (`meridian-server`'s `gc`) starts one every interval while the shard's newest version is
//! above its threshold, which holds for the whole TTL after the shard's last write (15
//! minutes by default): a shard written once and never overwritten has no garbage, yet each
//! interval cost it two Raft entries, a scan on every replica, and, for a quiesced group, a
//! wake-up. The metadata shard showed it: its log grew by two entries a minute on an idle
//! cluster, which the geo benchmark counted against the transactions it was measuring.
//!
//! # How
//! [`would_collect`] runs the very page functions the commands apply (`meridian_storage`'s
//! `gc::gc_page`, `apply_2pc`'s `records_page`) over the leader's own engine with a batch it
//! drops, and stops at the first page that would delete a version or a record, or report a
//! stuck committed record for the sweeper. Nothing found: no pass is proposed, except the
//! closing one whose threshold reaches the shard's newest write (see `meridian-server`'s
//! `gc`). (Tested against the passes themselves in `apply_2pc_tests`.)
//!
//! # Invariants
//! - The survey only reads: it writes nothing and changes no threshold.
//! - Skipping a pass is always safe: it leaves the state of a pass that never ran, which GC
//!   off, a leader change or a failed pass leave too. Everything the threshold decides (reads
//!   below it refused, a prepare below it refused, a missing anchor record answered as
//!   forgotten, a marker below it not written) stands in for what a pass could have deleted;
//!   with the threshold lower, those records, markers and versions still exist.
//! - It sees the leader's applied state at the time of its scan. Garbage that appears after
//!   (an overwrite applied meanwhile) waits for the next interval, as garbage written just
//!   after a pass always did. Garbage the survey found that a later write or pass removed
//!   first only costs a pass that finds less.
//!
//! # Not done yet
//! - The survey is a scan, like the pass it replaces on a shard without garbage: a large shard
//!   written once is still read whole once per interval until the closing pass, now on the
//!   leader only and without Raft entries; a shard with garbage is read twice (survey, pass).
//!   MVCC statistics (CockroachDB's GC bytes age) would make it a lookup.

use crate::apply_2pc::records_page;
use meridian_storage::gc::{gc_page, GcCursor, GC_PAGE_ENTRIES};
use meridian_storage::keys::Span;
use meridian_storage::{Engine, WriteBatch};
use meridian_types::{ShardId, Timestamp};
use std::io;

/// Whether a GC pass at `threshold` over `shard` (user keys `span`; its threshold now
/// `current`) would delete a version or a transaction record, or report a committed record
/// still unfinished (see the module docs). Reads `engine` only.
pub fn would_collect(
    engine: &dyn Engine,
    shard: ShardId,
    span: &Span,
    current: u64,
    threshold: u64,
) -> io::Result<bool> {
    // A pass never lowers the threshold (`Command::Gc`).
    let threshold = threshold.max(current);
    let mut from: Option<GcCursor> = None;
    loop {
        let mut dropped = WriteBatch::new();
        let page = gc_page(
            engine,
            &mut dropped,
            span,
            Timestamp(threshold),
            from.as_ref(),
            GC_PAGE_ENTRIES,
        )
        .map_err(|e| io::Error::other(format!("shard {shard}: GC survey: {e}")))?;
        if page.versions_deleted > 0 {
            return Ok(true);
        }
        match page.resume {
            Some(cursor) => from = Some(cursor),
            None => break,
        }
    }
    let mut from = None;
    loop {
        let mut dropped = WriteBatch::new();
        let page = records_page(engine, shard, threshold, from, &mut dropped)?;
        if page.deleted > 0 || !page.stuck.is_empty() {
            return Ok(true);
        }
        match page.resume {
            Some(id) => from = Some(id),
            None => return Ok(false),
        }
    }
}
