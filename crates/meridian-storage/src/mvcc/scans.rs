//! Paged scans at a read timestamp: [`scan`], [`scan_with_budget`] and [`scan_in_window`],
//! forward and reverse, each page bounded by a row limit and a budget of examined entries.

use super::{VersionValue, Versioned};
use crate::engine::{Cf, Engine, KvIter};
use crate::error::Result;
use crate::keys::{self, Keyspace};
use meridian_types::limits::MAX_SCAN_ENTRIES_PER_PAGE;
use meridian_types::Timestamp;

/// One page of a [`scan`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ScanPage {
    /// `(user_key, version_ts, value)` in scan order.
    pub rows: Vec<(Vec<u8>, Timestamp, Vec<u8>)>,
    /// Where the next page starts, or `None` if the range holds no further visible key.
    /// Forward: the next page's inclusive `start` (the first key not yet decided).
    /// Reverse: the next page's exclusive `end` (the last key decided).
    /// Set also when the page stopped at its budget of examined entries
    /// ([`MAX_SCAN_ENTRIES_PER_PAGE`]), possibly with fewer than `limit` rows, or none.
    pub resume_key: Option<Vec<u8>>,
}

/// Visible user keys in `[start, end)` (`end = None`: to the end of the keyspace; a shard's
/// caller bounds it by the shard's span) at `read_ts`,
/// each at its newest version `<= read_ts`, tombstoned and invisible keys skipped, at most
/// `limit` rows (a `limit` of 0 is treated as 1), ascending or (`reverse`) descending. A page
/// examines at most [`MAX_SCAN_ENTRIES_PER_PAGE`] stored entries (finishing the key it is on)
/// and then returns early with a `resume_key`.
pub fn scan(
    engine: &dyn Engine,
    space: impl Into<Keyspace>,
    start: &[u8],
    end: Option<&[u8]>,
    read_ts: Timestamp,
    limit: usize,
    reverse: bool,
) -> Result<ScanPage> {
    scan_with_budget(
        engine,
        space,
        (start, end),
        read_ts,
        limit,
        reverse,
        MAX_SCAN_ENTRIES_PER_PAGE,
    )
}

/// [`scan`] with an explicit budget of examined entries (tests use small ones).
pub fn scan_with_budget(
    engine: &dyn Engine,
    space: impl Into<Keyspace>,
    (start, end): (&[u8], Option<&[u8]>),
    read_ts: Timestamp,
    limit: usize,
    reverse: bool,
    budget: usize,
) -> Result<ScanPage> {
    let limit = limit.max(1);
    let (lower, upper) = keys::data_scan_bounds(space, start, end);
    let iter = engine.scan(Cf::Data, &lower, Some(&upper), reverse);
    let budget = budget.max(1);
    if reverse {
        scan_reverse(iter, (read_ts, read_ts), limit, budget).map(|(page, _)| page)
    } else {
        scan_forward(iter, (read_ts, read_ts), limit, budget).map(|(page, _)| page)
    }
}

/// A [`scan`] at `read_ts` (forward, or descending with `reverse`) that also reports the newest version timestamp of the
/// examined keys in the window `(read_ts, window_end]` (tombstones included), if any: a
/// snapshot read's uncertainty check (see `uncertainty`).
pub fn scan_in_window(
    engine: &dyn Engine,
    space: impl Into<Keyspace>,
    (start, end): (&[u8], Option<&[u8]>),
    (read_ts, window_end): (Timestamp, Timestamp),
    limit: usize,
    reverse: bool,
) -> Result<(ScanPage, Option<Timestamp>)> {
    let (lower, upper) = keys::data_scan_bounds(space, start, end);
    let iter = engine.scan(Cf::Data, &lower, Some(&upper), reverse);
    let window = (read_ts, window_end);
    let (limit, budget) = (limit.max(1), MAX_SCAN_ENTRIES_PER_PAGE);
    if reverse {
        scan_reverse(iter, window, limit, budget)
    } else {
        scan_forward(iter, window, limit, budget)
    }
}

type RawIter<'a> = KvIter<'a>;

pub(crate) fn decode_user_key(prefix: &[u8]) -> Result<Vec<u8>> {
    keys::decode_version_prefix(prefix)
}

fn scan_forward(
    iter: RawIter<'_>,
    (read_ts, window_end): (Timestamp, Timestamp),
    limit: usize,
    budget: usize,
) -> Result<(ScanPage, Option<Timestamp>)> {
    let mut page = ScanPage::default();
    let mut uncertain: Option<Timestamp> = None;
    // The version prefix of the key whose visible version was already decided.
    let mut done_prefix: Option<Vec<u8>> = None;
    // The key group the iterator is in, and how many entries were examined.
    let mut current: Option<Vec<u8>> = None;
    let mut examined = 0usize;
    for item in iter {
        let (k, v) = item?;
        let (prefix, ts) = keys::split_data_key(&k)?;
        examined += 1;
        if current.as_deref() != Some(prefix) {
            // At a key boundary: stop here if over budget, once at least one key is behind us
            // (so the next page starts strictly later and every page makes progress).
            if examined > budget && current.is_some() {
                page.resume_key = Some(decode_user_key(prefix)?);
                break;
            }
            current = Some(prefix.to_vec());
        }
        // The slot sorts first in its key's group; `ts > read_ts` alone would not skip it at
        // `read_ts = Timestamp::MAX`.
        if keys::is_slot_ts(ts) || done_prefix.as_deref() == Some(prefix) {
            continue;
        }
        if ts > read_ts {
            if ts <= window_end {
                uncertain = uncertain.max(Some(ts));
            }
            continue;
        }
        // First version of this key at or below read_ts: the visible one.
        done_prefix = Some(prefix.to_vec());
        if let VersionValue::Put(value) = VersionValue::decode(&v)? {
            let user_key = decode_user_key(prefix)?;
            if page.rows.len() == limit {
                page.resume_key = Some(user_key);
                break;
            }
            page.rows.push((user_key, ts, value));
        }
    }
    Ok((page, uncertain))
}

/// A reverse page at `read_ts`, and the newest version in `(read_ts, window_end]` among the
/// keys it examined (as `scan_forward`: every version of each key, so a key read at `read_ts`
/// is never certain while a newer version of it is in the window).
fn scan_reverse(
    iter: RawIter<'_>,
    (read_ts, window_end): (Timestamp, Timestamp),
    limit: usize,
    budget: usize,
) -> Result<(ScanPage, Option<Timestamp>)> {
    let mut page = ScanPage::default();
    let mut uncertain: Option<Timestamp> = None;
    // Versions of one key arrive oldest first; keep the newest one at or below read_ts.
    let mut group: Option<Vec<u8>> = None;
    let mut candidate: Option<Versioned> = None;
    let mut examined = 0usize;

    for item in iter {
        let (k, v) = item?;
        let (prefix, ts) = keys::split_data_key(&k)?;
        examined += 1;
        if examined > budget && group.as_deref().is_some_and(|g| g != prefix) {
            // Over budget at a key boundary: finish the group behind us and resume below it.
            let prev = group.take().expect("checked");
            if finish_group(&prev, candidate.take(), &mut page, limit)? {
                page.resume_key = Some(decode_user_key(&prev)?);
            }
            return Ok((page, uncertain));
        }
        if keys::is_slot_ts(ts) {
            // Arrives last in its key's group (it sorts first); never a row.
            continue;
        }
        if group.as_deref() != Some(prefix) {
            if let Some(prev) = group.take() {
                if !finish_group(&prev, candidate.take(), &mut page, limit)? {
                    return Ok((page, uncertain));
                }
            }
            group = Some(prefix.to_vec());
            candidate = None;
        }
        if ts <= read_ts {
            candidate = Some((ts, v));
        } else if ts <= window_end {
            uncertain = uncertain.max(Some(ts));
        }
    }
    if let Some(prev) = group {
        finish_group(&prev, candidate, &mut page, limit)?;
    }
    Ok((page, uncertain))
}

/// Emits a finished reverse-scan group's visible version (if a Put); returns false (and sets
/// the resume key) when the page is already full.
fn finish_group(
    prefix: &[u8],
    candidate: Option<Versioned>,
    page: &mut ScanPage,
    limit: usize,
) -> Result<bool> {
    let Some((ts, raw)) = candidate else {
        return Ok(true);
    };
    if let VersionValue::Put(value) = VersionValue::decode(&raw)? {
        if page.rows.len() == limit {
            page.resume_key = page.rows.last().map(|(k, _, _)| k.clone());
            return Ok(false);
        }
        page.rows.push((decode_user_key(prefix)?, ts, value));
    }
    Ok(true)
}
