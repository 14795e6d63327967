//! Calls over many keys: scans that page across shards, and batches split by shard.
//!
//! # Batches
//! `batch_get`/`batch_put` group keys by shard (the server requires one shard per request),
//! run the groups concurrently (at most `max_parallel_shard_requests`), and scatter results
//! back into input order. A group answered `WRONG_SHARD` is regrouped under a refreshed map.
//!
//! # Scans are snapshots
//! A scan first reads one plain page on its first shard's leader, at that leader's
//! linearizable timestamp: one storage iterator, so consistent within itself, and served on a
//! parked lease without waking a quiesced shard. When that page answers the scan (the range
//! ends there, or `limit` rows came back), that is the result. Otherwise the page is dropped
//! and the scan is read again with a snapshot (`snapshot`, as a transaction reads): the first
//! page's leader picks the timestamp after its read barrier, and every page of every shard is
//! read at it, each shard first settling the writes it issued at or below it. A version in
//! the uncertainty window (stamped by a clock up to `max_offset` ahead, possibly before the
//! scan began) restarts the scan at that version, at most `MAX_SNAPSHOT_SCAN_ATTEMPTS` times.
//! So a scan sees every write acknowledged before it began, and every page reflects the same
//! moment: a single-shard `BatchPut` and a transaction are seen whole or not at all. A
//! multi-shard `batch_put` is not atomic (each shard's part has its own timestamp), so a scan
//! may see part of one, as any read may.
//!
//! What it costs: a multi-page scan reads its first page twice, wakes the quiesced shards it
//! reads (snapshot reads are not served on a parked lease), and waits for the shards' writes
//! in flight below its timestamp. Its pages' read barrier is a transaction's: ReadIndex for a
//! client configured with `LinearizableReadIndex`, else the lease (see
//! `ReadConsistency::snapshot_barrier`). Its timestamp is fixed, so a scan that
//! outlasts `gc_ttl_ms` fails with `BELOW_GC_THRESHOLD`. An uncertain version of a key past
//! the last row returned (examined before the page stopped) restarts it too: wasted work,
//! never a wrong row. A transaction's scans and batches (`scan_pages` and
//! `batch_get_at` with a snapshot) read at the transaction's snapshot; a stale scan reads its
//! later pages at the first page's `read_ts` (see `stale`).

use crate::client::{display_key, kv_client, request, Deadline, Route, MAX_SCAN_PAGES};
use crate::early_lock::Locking;
use crate::error::{Error, Result};
use crate::routing::Routed;
use crate::snapshot::{SnapRead, SnapshotState};
use crate::{validate, Client, KeyValue, ReadConsistency, Versioned};
use bytes::Bytes;
use futures::stream::{self, StreamExt};
use meridian_proto::kv as proto;
use meridian_types::Timestamp;
use std::future::Future;

/// Most reads of a multi-page scan at one snapshot: each uncertain version (written by a
/// clock up to `max_offset` ahead before the scan began) restarts it at that version, and
/// the window never widens (see `snapshot`).
const MAX_SNAPSHOT_SCAN_ATTEMPTS: u32 = meridian_types::limits::DEFAULT_TXN_MAX_ATTEMPTS;

fn too_many_pages() -> Error {
    Error::internal(format!("scan exceeded MAX_SCAN_PAGES ({MAX_SCAN_PAGES})"))
}

/// How a run of scan pages ended.
enum Paged {
    Read(SnapRead<Vec<KeyValue>>),
    /// The page budget was spent with rows still wanted and the range not exhausted.
    Cut,
}

impl Client {
    /// Up to `limit` rows of `[start, end)` (`end` `None` = to the end of the keyspace; an
    /// empty `start` = from the beginning), ascending, or descending with `reverse`.
    ///
    /// The result is **one snapshot** (see the module docs): a scan one page answers is that
    /// page (linearizable); a longer one is read again, every page of every shard at one
    /// timestamp. With a stale `read_consistency`, every page reads at the first one's.
    /// Each read of the scan (the first page, then each attempt at the snapshot, at most
    /// `MAX_SNAPSHOT_SCAN_ATTEMPTS`) has the client's call deadline.
    pub async fn scan(
        &self,
        start: impl Into<Bytes>,
        end: Option<Bytes>,
        limit: u32,
        reverse: bool,
    ) -> Result<Vec<KeyValue>> {
        let range = (start.into(), end);
        let plain = match self.config().read_consistency.is_stale() {
            true => MAX_SCAN_PAGES,
            false => 1,
        };
        match self
            .scan_loop(range.clone(), limit, reverse, None, None, plain)
            .await?
        {
            Paged::Read(SnapRead::Done(rows)) => return Ok(rows),
            Paged::Read(SnapRead::Uncertain(_)) => {
                return Err(Error::internal("uncertain reply to a plain scan"))
            }
            Paged::Cut if plain > 1 => return Err(too_many_pages()),
            Paged::Cut => {}
        }
        // More than one page: all of them again, at one snapshot.
        let mut snapshot = SnapshotState::default();
        for _attempt in 0..MAX_SNAPSHOT_SCAN_ATTEMPTS {
            let (start, end) = range.clone();
            match self
                .scan_pages(start, end, limit, reverse, Some(&mut snapshot), None)
                .await?
            {
                SnapRead::Done(rows) => return Ok(rows),
                SnapRead::Uncertain(version_ts) => {
                    snapshot = snapshot.next_attempt(Some(version_ts));
                }
            }
        }
        Err(Error::Unavailable {
            message: format!(
                "a snapshot scan met a version in its uncertainty window {MAX_SNAPSHOT_SCAN_ATTEMPTS} \
                 times in a row; try again"
            ),
        })
    }

    /// The pages of a scan, every one at `snapshot`'s timestamp when one is given (a
    /// transaction's scan, or a multi-page [`Client::scan`]), or at `stale`'s consistency when
    /// that is given (a stale snapshot's scan): a stale first page turns it into `AsOf` that
    /// page's `read_ts`, at which every later page reads. Neither: each page at its own
    /// linearizable timestamp.
    pub(crate) async fn scan_pages(
        &self,
        start: Bytes,
        end: Option<Bytes>,
        limit: u32,
        reverse: bool,
        snapshot: Option<&mut SnapshotState>,
        stale: Option<&mut ReadConsistency>,
    ) -> Result<SnapRead<Vec<KeyValue>>> {
        let range = (start, end);
        match self
            .scan_loop(range, limit, reverse, snapshot, stale, MAX_SCAN_PAGES)
            .await?
        {
            Paged::Read(read) => Ok(read),
            Paged::Cut => Err(too_many_pages()),
        }
    }

    /// The pages of [`Client::scan_pages`], at most `max_pages` of them.
    async fn scan_loop(
        &self,
        (start, end): (Bytes, Option<Bytes>),
        limit: u32,
        reverse: bool,
        mut snapshot: Option<&mut SnapshotState>,
        stale: Option<&mut ReadConsistency>,
        max_pages: usize,
    ) -> Result<Paged> {
        let end: Bytes = end.unwrap_or_default();
        validate::scan(&start, Some(&end), limit)?;
        let mut rows: Vec<KeyValue> = Vec::new();
        if !end.is_empty() && start == end {
            return Ok(Paged::Read(SnapRead::Done(rows)));
        }
        let deadline = self.deadline();
        // A transaction's scan reads at its snapshot (never stale); a stale scan reads its
        // later pages at the first page's timestamp, so the whole scan is one snapshot.
        let mut own = match snapshot {
            Some(_) => self.config().read_consistency.snapshot_barrier(),
            None => self.config().read_consistency,
        };
        let consistency: &mut ReadConsistency = match stale {
            Some(given) => given,
            None => &mut own,
        };
        // Forward scans advance `cursor_start`; reverse scans lower `cursor_end`.
        let mut cursor_start = start.clone();
        let mut cursor_end = end.clone();
        for _page in 0..max_pages {
            let wanted = limit - rows.len() as u32;
            let message = proto::ScanRequest {
                start: cursor_start.clone(),
                end: cursor_end.clone(),
                limit: wanted,
                reverse,
                consistency: consistency.to_proto(),
                snapshot: snapshot.as_ref().map(|s| s.spec()),
                route: None,
                staleness: consistency.staleness(),
            };
            let route = if reverse {
                Route::Below(&cursor_end)
            } else {
                Route::Key(&cursor_start)
            };
            let page = self
                .read_call(route, &deadline, *consistency, |channel, timeout, route| {
                    let message = message.routed(route);
                    async move {
                        kv_client(channel)
                            .scan(request(message, timeout))
                            .await
                            .map(|r| r.into_inner())
                    }
                })
                .await?;
            if consistency.is_stale() {
                *consistency = ReadConsistency::AsOf(Timestamp(page.read_ts));
            }
            if let Some(snap) = snapshot.as_mut() {
                if let Some(uncertain) = snap.absorb(page.read_ts, page.snapshot)? {
                    return Ok(Paged::Read(SnapRead::Uncertain(uncertain)));
                }
            }
            rows.extend(
                page.rows
                    .into_iter()
                    .take(wanted as usize)
                    .map(|row| KeyValue {
                        key: row.key,
                        value: row.value,
                        version_ts: Timestamp(row.version_ts),
                    }),
            );
            if !page.more || rows.len() >= limit as usize {
                return Ok(Paged::Read(SnapRead::Done(rows)));
            }
            let resume = page.resume_key;
            if resume.is_empty() {
                return Err(Error::internal(
                    "scan page has more = true but an empty resume_key",
                ));
            }
            if reverse {
                let progressed = cursor_end.is_empty() || resume < cursor_end;
                if !progressed {
                    return Err(Error::internal(format!(
                        "reverse scan did not progress: resume_key {} is not below {}",
                        display_key(&resume),
                        display_key(&cursor_end)
                    )));
                }
                if resume <= start && !start.is_empty() {
                    return Ok(Paged::Read(SnapRead::Done(rows)));
                }
                cursor_end = resume;
            } else {
                if resume <= cursor_start {
                    return Err(Error::internal(format!(
                        "scan did not progress: resume_key {} is not after {}",
                        display_key(&resume),
                        display_key(&cursor_start)
                    )));
                }
                if !end.is_empty() && resume >= end {
                    return Ok(Paged::Read(SnapRead::Done(rows)));
                }
                cursor_start = resume;
            }
        }
        Ok(Paged::Cut)
    }

    /// Reads many keys; the result is in input order (`None` = absent). Keys are grouped per
    /// shard and the groups are read concurrently; each group is one consistent snapshot, but
    /// different shards may be read at different timestamps.
    pub async fn batch_get<K: Into<Bytes>>(
        &self,
        keys: impl IntoIterator<Item = K>,
    ) -> Result<Vec<Option<Bytes>>> {
        let found = self.batch_get_versioned(keys).await?;
        Ok(found.into_iter().map(|v| v.map(|v| v.value)).collect())
    }

    /// Like [`Client::batch_get`], with each value's version timestamp.
    pub async fn batch_get_versioned<K: Into<Bytes>>(
        &self,
        keys: impl IntoIterator<Item = K>,
    ) -> Result<Vec<Option<Versioned>>> {
        let keys: Vec<Bytes> = keys.into_iter().map(Into::into).collect();
        match self.batch_get_at(&keys, None).await? {
            SnapRead::Done(found) => Ok(found),
            SnapRead::Uncertain(_) => Err(Error::internal("uncertain reply to a plain batch_get")),
        }
    }

    /// [`Client::batch_get_versioned`], at `snapshot`'s timestamp when one is given (a
    /// transaction's read). A snapshot without a timestamp yet gets one from the first shard's
    /// keys before the other shards are asked.
    pub(crate) async fn batch_get_at(
        &self,
        keys: &[Bytes],
        snapshot: Option<&mut SnapshotState>,
    ) -> Result<SnapRead<Vec<Option<Versioned>>>> {
        self.batch_get_locking(keys, snapshot, None).await
    }

    /// [`Client::batch_get_at`], taking early locks on every key when `lock` is given (a
    /// transaction's snapshot read for update, see `early_lock`).
    pub(crate) async fn batch_get_locking(
        &self,
        keys: &[Bytes],
        snapshot: Option<&mut SnapshotState>,
        lock: Option<Locking<'_>>,
    ) -> Result<SnapRead<Vec<Option<Versioned>>>> {
        validate::batch_len(keys.len())?;
        for key in keys {
            validate::key(key)?;
        }
        if keys.is_empty() {
            return Ok(SnapRead::Done(Vec::new()));
        }
        let snap = match snapshot {
            Some(snap) if snap.read_ts.is_none() => snap,
            other => return self.batch_get_round(keys, other, lock).await,
        };
        // The first shard's keys pick the timestamp (the cached map's lock is held for this
        // statement only); the rest are read at it.
        let first: Vec<usize> = self
            .state()
            .map
            .group_by_shard(keys.iter().map(|k| k.as_ref()))
            .ok()
            .and_then(|groups| groups.into_iter().next())
            .map_or_else(|| vec![0], |(_, positions)| positions);
        let mut in_first = vec![false; keys.len()];
        first.iter().for_each(|&p| in_first[p] = true);
        let rest: Vec<usize> = (0..keys.len()).filter(|&p| !in_first[p]).collect();
        let mut out: Vec<Option<Versioned>> = vec![None; keys.len()];
        for positions in [first, rest] {
            if positions.is_empty() {
                continue;
            }
            let part: Vec<Bytes> = positions.iter().map(|&p| keys[p].clone()).collect();
            match self.batch_get_round(&part, Some(&mut *snap), lock).await? {
                SnapRead::Done(found) => {
                    for (position, value) in positions.into_iter().zip(found) {
                        out[position] = value;
                    }
                }
                uncertain => return Ok(uncertain),
            }
        }
        Ok(SnapRead::Done(out))
    }

    /// One round of a batch read: every shard's keys at once, at `snapshot` if given.
    async fn batch_get_round(
        &self,
        keys: &[Bytes],
        mut snapshot: Option<&mut SnapshotState>,
        lock: Option<Locking<'_>>,
    ) -> Result<SnapRead<Vec<Option<Versioned>>>> {
        let mut out: Vec<Option<Versioned>> = vec![None; keys.len()];
        let deadline = self.deadline();
        // A transaction's reads are snapshot reads, never stale.
        let consistency = match snapshot {
            Some(_) => self.config().read_consistency.snapshot_barrier(),
            None => self.config().read_consistency,
        };
        let spec = snapshot.as_ref().map(|s| s.spec());
        let groups = self
            .run_grouped(keys, &deadline, |shard_id, positions: Vec<usize>| {
                if let (Some(lock), Some(&first)) = (lock, positions.first()) {
                    // Before it is sent: a request that fails may have taken locks.
                    lock.sent_to(shard_id, &keys[first]);
                }
                let message = proto::BatchGetRequest {
                    keys: positions.iter().map(|&p| keys[p].clone()).collect(),
                    consistency: consistency.to_proto(),
                    snapshot: spec.clone(),
                    route: None,
                    staleness: consistency.staleness(),
                    lock: lock.map(|l| *l.request),
                };
                async move {
                    self.read_call(
                        Route::Shard(shard_id),
                        &deadline,
                        consistency,
                        |channel, timeout, route| {
                            let message = message.routed(route);
                            async move {
                                kv_client(channel)
                                    .batch_get(request(message, timeout))
                                    .await
                                    .map(|r| r.into_inner())
                            }
                        },
                    )
                    .await
                }
            })
            .await?;
        let mut uncertain: Option<meridian_types::Timestamp> = None;
        for (positions, response) in groups {
            if let Some(snap) = snapshot.as_mut() {
                if let Some(ts) = snap.absorb(response.read_ts, response.snapshot)? {
                    uncertain = uncertain.max(Some(ts));
                    continue;
                }
            }
            if response.results.len() != positions.len() {
                return Err(Error::internal(format!(
                    "batch_get asked {} keys, got {} results",
                    positions.len(),
                    response.results.len()
                )));
            }
            for (position, result) in positions.into_iter().zip(response.results) {
                out[position] = result.found.then(|| Versioned {
                    value: result.value,
                    version_ts: Timestamp(result.version_ts),
                });
            }
        }
        Ok(match uncertain {
            Some(ts) => SnapRead::Uncertain(ts),
            None => SnapRead::Done(out),
        })
    }

    /// Writes many key-value pairs.
    ///
    /// Atomic **per shard only**: the entries are split by shard and each shard's part commits
    /// as one Raft entry, concurrently with the others. If an error is returned, some shards'
    /// parts may have committed and others not. Transactions (`Client::txn`) are atomic across
    /// shards.
    pub async fn batch_put<K: Into<Bytes>, V: Into<Bytes>>(
        &self,
        entries: impl IntoIterator<Item = (K, V)>,
    ) -> Result<()> {
        let (keys, values): (Vec<Bytes>, Vec<Bytes>) = entries
            .into_iter()
            .map(|(k, v)| (k.into(), v.into()))
            .unzip();
        validate::batch_len(keys.len())?;
        let mut total_bytes = 0usize;
        for (key, value) in keys.iter().zip(&values) {
            validate::key(key)?;
            validate::value(value)?;
            total_bytes = total_bytes.saturating_add(key.len() + value.len());
        }
        validate::batch_bytes(total_bytes)?;
        if keys.is_empty() {
            return Ok(());
        }
        let deadline = self.deadline();
        let (keys_ref, values_ref) = (&keys, &values);
        self.run_grouped(&keys, &deadline, |shard_id, positions: Vec<usize>| {
            let message = proto::BatchPutRequest {
                entries: positions
                    .iter()
                    .map(|&p| proto::KeyValue {
                        key: keys_ref[p].clone(),
                        value: values_ref[p].clone(),
                        version_ts: 0,
                    })
                    .collect(),
                deletes: Vec::new(),
                write_id: Some(self.next_write_id()),
                route: None,
            };
            async move {
                self.write_call(
                    Route::Shard(shard_id),
                    &deadline,
                    |channel, timeout, route| {
                        let message = message.routed(route);
                        async move {
                            kv_client(channel)
                                .batch_put(request(message, timeout))
                                .await
                                .map(|r| r.into_inner())
                        }
                    },
                )
                .await
            }
        })
        .await?;
        Ok(())
    }

    /// Groups `keys` by shard, runs `per_group(shard_id, positions)` for every group with
    /// bounded concurrency, and regroups the keys of groups answered `WRONG_SHARD` under a
    /// refreshed map. Returns each group's positions (into `keys`) with its result.
    async fn run_grouped<R, F, Fut>(
        &self,
        keys: &[Bytes],
        deadline: &Deadline,
        per_group: F,
    ) -> Result<Vec<(Vec<usize>, R)>>
    where
        F: Fn(u64, Vec<usize>) -> Fut,
        Fut: Future<Output = Result<R>>,
    {
        let mut pending: Vec<usize> = (0..keys.len()).collect();
        let mut done: Vec<(Vec<usize>, R)> = Vec::new();
        let mut backoff = self.backoff();
        let mut last: Option<Error> = None;
        let mut rounds = 0u32;
        loop {
            rounds += 1;
            let (generation, grouped) = {
                let state = self.state();
                let grouped = state
                    .map
                    .group_by_shard(pending.iter().map(|&p| keys[p].as_ref()));
                (state.generation, grouped)
            };
            match grouped {
                Ok(groups) => {
                    let groups = groups.into_iter().map(|(shard_id, in_pending)| {
                        let positions: Vec<usize> =
                            in_pending.iter().map(|&i| pending[i]).collect();
                        (shard_id, positions)
                    });
                    let outcomes: Vec<(Vec<usize>, Result<R>)> = stream::iter(groups)
                        .map(|(shard_id, positions)| {
                            let work = per_group(shard_id, positions.clone());
                            async move { (positions, work.await) }
                        })
                        .buffer_unordered(self.config().max_parallel_shard_requests)
                        .collect()
                        .await;
                    let mut regroup = Vec::new();
                    for (positions, outcome) in outcomes {
                        match outcome {
                            Ok(result) => done.push((positions, result)),
                            Err(error @ Error::WrongShard { .. }) => {
                                regroup.extend(positions);
                                last = Some(error);
                            }
                            Err(error) => return Err(error),
                        }
                    }
                    if regroup.is_empty() {
                        return Ok(done);
                    }
                    regroup.sort_unstable();
                    pending = regroup;
                }
                Err(index) => {
                    last = Some(Error::WrongShard {
                        message: format!(
                            "no shard in the cached map owns key {}",
                            display_key(&keys[pending[index]])
                        ),
                    });
                }
            }
            self.refresh_after_failure(generation, deadline, &mut last)
                .await;
            self.back_off(&mut backoff, deadline, rounds, &mut last)
                .await?;
        }
    }
}
