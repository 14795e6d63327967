//! The proposal timestamps a shard's leader has issued and not yet seen settled, so a read at
//! a snapshot timestamp can know that no write at or below it is still to come.
//!
//! # Why
//! A transaction reads every shard at one timestamp `T` (the `Kv` service's snapshot reads).
//! That is a snapshot only if, on each shard, the state at `T` is final when it is read: every
//! write that will ever be applied with a version `<= T` has already been applied. Writes are
//! proposed with a timestamp from the leader's HLC and applied at `max(proposed, floor + 1)`
//! (see `apply`), so a version can land at or below `T` only if its *proposed* timestamp was.
//! Three sources of such writes, and what closes each:
//! 1. **Proposals of this leader still in flight** (issued, not yet applied): [`Issued`]
//!    tracks them; a snapshot read waits until none issued at or below `T` is left
//!    ([`Issued::settle`]).
//! 2. **Proposals this leader issues later**: a timestamp is issued under the same lock that
//!    `settle` checks the clock under, and `settle` first makes sure the clock is past `T`, so
//!    every later timestamp is above `T` (the HLC never repeats or goes back).
//! 3. **Proposals of a later leader**, whose clock may be behind `T`: a leader issues nothing
//!    in a new term until its physical clock has passed `max_offset` beyond where it was when
//!    it began the term, and issues plain HLC readings after that. It begins the term when its
//!    role watcher (`host`) first sees it lead the term ([`Issued::begin_term`]), or at the
//!    term's first issue if that comes first; either moment is after the election. A snapshot
//!    read is served only under a valid leader lease (the `Kv` service checks), so it
//!    happened before the next leader was elected; and `T` was below the old leader's HLC then
//!    (`settle` checks), which never exceeds the fastest node's physical clock, which is at
//!    most `max_offset` ahead of the next leader's (at that moment, and so at any later one).
//!    So the next leader's first timestamp is above `T`. The cost: writes in the first
//!    `max_offset` after an election wait for it to end; a shard first written later pays
//!    nothing. (Until 2026-12-04 the wait began at the term's first issue, so the first write
//!    after every election paid the whole `max_offset`, 500 ms by default, however long ago
//!    the election was. Issuing `now + max_offset` at once instead would put versions ahead of
//!    every clock, and their merge into the HLC would push the leader's clock toward the point
//!    where its followers reject it.)
//!
//!    The caller issues only while its metrics say it leads `term`, so the first issue of a
//!    term comes after that term's election (a candidate of the term must not issue: it could
//!    be elected while its proposal waits). The metrics can lag the Raft core by an instant,
//!    though: a proposal issued as "leader of term 7" could reach the log in term 9. So
//!    every data command is proposed as [`Command::Fenced`] with the term it was issued in,
//!    and apply rejects it if its entry's term differs (definitely not applied; retried).
//!
//! **Reads wait only for writes to what they read.** Each write is issued with its
//! [`Footprint`]: the user keys it may put versions or intents on (a `Write`'s puts and
//! deletes, a CAS's key, a one-shard commit's or a prepare's writes; anything else is
//! [`Footprint::All`]). [`Issued::settle`] takes the read's [`ReadSpan`] (its keys, or its
//! scan's range) and waits only for writes at or below `read_ts` that meet it: a write to
//! other keys cannot change what the read returns, whenever it applies. (CockroachDB's
//! latches are per key for the same reason.) Before this, a read at `T` waited for every
//! write of the shard issued at or below `T`, one replication round under any write load.
//!
//! **Resolutions do not hold reads up.** A [`IssueKind::Resolution`] (a transaction's
//! `Resolve`: its intents on this shard become versions at the commit timestamp, or go) is
//! tracked like any issue for closing timestamps, but [`Issued::settle`] does not wait for it:
//! until it applies, the intents it resolves are in the lock table, and a snapshot read that
//! meets one prepared at or below its window answers `LOCKED` and waits for the resolution
//! (checked under the table's read guard in the same read as the data, while apply resolves
//! under its write guard); the versions it writes sit at the commit timestamp, which is at or
//! above the intents' prepare timestamp. So a read at `T` never misses a version at or below
//! `T` that a resolution in flight will write. Its record and marker writes are not user data.
//! Without this, every read after a multi-shard commit waited for that commit's resolutions
//! (one more replication round), whatever keys it read.
//!
//! Entries of earlier terms are covered by the read barrier (`ensure_linearizable` waits for
//! the new term's first entry, which follows them, to be applied).
//!
//! The same three arguments let a leader *close* a timestamp for its followers
//! ([`Issued::close`], see `closed_ts`): below every proposal in flight and `lag` behind a
//! clock reading taken under the issuing lock.
//!
//! # Invariants
//! - An issued timestamp stays tracked until its proposal's `client_write` returned (applied,
//!   or failed as a whole): the `Kv` service hands the [`IssueGuard`] to the shard's proposer
//!   (see `proposals`), which drops it only once the entry carrying the proposal has an
//!   outcome, so a caller that gives up does not untrack a live proposal.
//! - Issued timestamps are HLC readings (strictly increasing); none is issued in a term before
//!   the physical clock passed that term's start mark. The mark is never set before this node
//!   leads the term; `begin_term` ignores a term older than the one begun, and an issue whose
//!   caller names another term than the one begun (stale metrics) sets a new mark, which only
//!   ever moves the wait later (such an issue is fenced at apply anyway).
//!
//! [`Command::Fenced`]: crate::types::Command::Fenced

use bytes::Bytes;
use meridian_types::Clock;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;
use tokio::sync::Notify;

#[derive(Debug, Default)]
struct State {
    /// The term of the last issue, and the physical time (ms) before which it issues nothing.
    term: u64,
    not_before_ms: u64,
    /// Issues not yet settled, by `(timestamp, issue number)` (the number tells apart issues
    /// that share a timestamp), with what each proposal does.
    inflight: BTreeMap<(u64, u64), IssueKind>,
    /// The last issue number handed out.
    issues: u64,
    /// `(term, HLC reading)` at the first read barrier this node passed in that term.
    led_since: (u64, u64),
}

impl State {
    /// Begins `term` at physical time `physical_ms`: nothing is issued in it before
    /// `max_offset_ms` has passed.
    fn begin(&mut self, term: u64, physical_ms: u64, max_offset_ms: u64) {
        self.term = term;
        // +1: `physical_ms` is truncated to whole milliseconds.
        self.not_before_ms = physical_ms + max_offset_ms + 1;
    }
}

/// One shard's issued, unsettled proposal timestamps (see the module docs).
#[derive(Debug, Default)]
pub struct Issued {
    state: Mutex<State>,
    settled: Notify,
}

/// The user keys a write may put versions or intents on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Footprint {
    /// Unknown or the whole shard: every snapshot read at or above it waits for it.
    All,
    /// These keys only (sorted, no duplicates): reads of other keys do not wait for it.
    Keys(Arc<[Bytes]>),
}

impl Footprint {
    /// The footprint of writes to `keys` (in any order, repeats allowed).
    pub fn keys(keys: impl IntoIterator<Item = Bytes>) -> Footprint {
        let mut keys: Vec<Bytes> = keys.into_iter().collect();
        keys.sort_unstable();
        keys.dedup();
        Footprint::Keys(keys.into())
    }

    /// Whether a write with this footprint may touch what `span` reads.
    pub fn meets(&self, span: &ReadSpan<'_>) -> bool {
        let Footprint::Keys(written) = self else {
            return true;
        };
        match span {
            ReadSpan::All => true,
            ReadSpan::Keys(read) => read.iter().any(|k| written.binary_search(k).is_ok()),
            ReadSpan::Range { start, end } => {
                let from = written.partition_point(|k| k.as_ref() < *start);
                written
                    .get(from)
                    .is_some_and(|k| end.is_empty() || k.as_ref() < *end)
            }
        }
    }
}

/// What a snapshot read reads (see [`Issued::settle`]).
#[derive(Clone, Copy, Debug)]
pub enum ReadSpan<'a> {
    /// The whole shard.
    All,
    /// These keys.
    Keys(&'a [Bytes]),
    /// The keys in `[start, end)`; an empty `end` is unbounded.
    Range { start: &'a [u8], end: &'a [u8] },
}

/// What a proposal does, as far as snapshot reads care (see the module docs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum IssueKind {
    /// May write versions or intents of the footprint's keys at or near its timestamp: reads
    /// of those keys at or above it wait for it.
    Write(Footprint),
    /// Resolves a transaction's intents: reads meet the intents instead of waiting for it.
    Resolution,
}

/// An issued timestamp; dropping it settles it.
#[derive(Debug)]
pub struct IssueGuard {
    issued: Arc<Issued>,
    pub ts: u64,
    pub term: u64,
    /// Its key in `State::inflight`.
    key: (u64, u64),
}

impl Drop for IssueGuard {
    fn drop(&mut self) {
        let mut state = self.issued.lock();
        state.inflight.remove(&self.key);
        drop(state);
        self.issued.settled.notify_waiters();
    }
}

/// Why [`Issued::settle`] did not finish.
#[derive(Debug, PartialEq, Eq)]
pub enum SettleError {
    /// The clock is not past the read timestamp; the caller must wait for it first.
    ClockBehind { now: u64, read_ts: u64 },
    /// Proposals at or below the read timestamp were still in flight at the deadline.
    Timeout { oldest: u64 },
}

impl Issued {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding this lock leaves only counters behind; keep serving.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Issues a timestamp for a write by the leader of `term` (the caller's metrics say it
    /// leads `term`), waiting first (at most about `max_offset`) if `term` has just begun (see
    /// the module docs).
    pub async fn issue(self: &Arc<Self>, clock: &Clock, term: u64) -> IssueGuard {
        self.issue_for(clock, term, IssueKind::Write(Footprint::All))
            .await
    }

    /// Starts `term`'s wait when this node is seen to lead it (its metrics say so), rather than
    /// at the term's first issue: the mark only has to come after the election (see the module
    /// docs), so a shard first written long after it was elected issues at once. Ignores a term
    /// older than the one already begun (a late role watcher must not restart a newer term's
    /// wait).
    pub fn begin_term(&self, clock: &Clock, term: u64) {
        self.begin_term_at(
            term,
            clock.physical_now().physical_ms(),
            clock.max_offset().as_millis() as u64,
        );
    }

    fn begin_term_at(&self, term: u64, physical_ms: u64, max_offset_ms: u64) {
        let mut state = self.lock();
        if term > state.term {
            state.begin(term, physical_ms, max_offset_ms);
        }
    }

    /// [`Issued::issue`] for a proposal of `kind`.
    pub async fn issue_for(
        self: &Arc<Self>,
        clock: &Clock,
        term: u64,
        kind: IssueKind,
    ) -> IssueGuard {
        loop {
            let wait_ms = {
                let mut state = self.lock();
                let physical_ms = clock.physical_now().physical_ms();
                if term != state.term {
                    // Not begun (no role watcher saw it yet, or a stale term): begin it now.
                    state.begin(term, physical_ms, clock.max_offset().as_millis() as u64);
                }
                if physical_ms >= state.not_before_ms {
                    let ts = clock.now().0;
                    state.issues += 1;
                    let key = (ts, state.issues);
                    state.inflight.insert(key, kind);
                    return IssueGuard {
                        issued: self.clone(),
                        ts,
                        term,
                        key,
                    };
                }
                state.not_before_ms - physical_ms
            };
            tokio::time::sleep(std::time::Duration::from_millis(wait_ms)).await;
        }
    }

    /// This node's HLC reading at the first read barrier it passed as leader of the current
    /// term: every version acknowledged by an earlier leader is at or below it (the barrier
    /// applied them, and apply merges versions into the clock). `term_before` and `term_after`
    /// are the metrics' terms around the barrier that took `reading`; if they differ the
    /// reading itself is returned (and kept), which is only ever later than the true mark.
    pub fn led_since(&self, term_before: u64, term_after: u64, reading: u64) -> u64 {
        let mut state = self.lock();
        if term_before != term_after || state.led_since.0 != term_after {
            state.led_since = (term_after, reading);
        }
        state.led_since.1
    }

    /// The highest timestamp this leader can close now (see `closed_ts`): `lag_ms` behind a
    /// fresh HLC reading and below every issued timestamp still in flight. Taken under the
    /// lock `issue` takes, so every timestamp issued after this returns is above it (the HLC
    /// is monotone), and every one issued at or below it has settled. `lag_ms == 0`: 0.
    pub fn close(&self, clock: &Clock, lag_ms: u64) -> u64 {
        let state = self.lock();
        let now = clock.now().0;
        let oldest = state.inflight.keys().next().map(|(ts, _)| *ts);
        crate::closed_ts::closable(now, lag_ms, oldest)
    }

    /// The oldest issued timestamp not yet settled.
    pub fn oldest(&self) -> Option<u64> {
        self.lock().inflight.keys().next().map(|(ts, _)| *ts)
    }

    /// Waits until no write issued at or below `read_ts` that may touch `span` is in flight
    /// (resolutions are not waited for, see the module docs). The clock must already be past
    /// `read_ts` (so nothing issued from now on is at or below it); checked under the lock
    /// that issuing takes.
    pub async fn settle(
        &self,
        clock: &Clock,
        read_ts: u64,
        span: &ReadSpan<'_>,
        deadline: Instant,
    ) -> Result<(), SettleError> {
        {
            let state = self.lock();
            let now = clock.now().0;
            if now <= read_ts {
                return Err(SettleError::ClockBehind { now, read_ts });
            }
            drop(state);
        }
        loop {
            let notified = self.settled.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let oldest_write = self
                .lock()
                .inflight
                .range(..=(read_ts, u64::MAX))
                .find(|(_, kind)| match kind {
                    IssueKind::Write(footprint) => footprint.meets(span),
                    IssueKind::Resolution => false,
                })
                .map(|((ts, _), _)| *ts);
            let oldest = match oldest_write {
                Some(oldest) => oldest,
                _ => return Ok(()),
            };
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || tokio::time::timeout(left, notified).await.is_err() {
                return Err(SettleError::Timeout { oldest });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use meridian_types::Timestamp;
    use std::time::Duration;

    fn clock() -> Arc<Clock> {
        Arc::new(Clock::new(Duration::from_millis(500)))
    }

    #[tokio::test]
    async fn a_new_term_issues_nothing_until_max_offset_has_passed() {
        let (clock, issued) = (clock(), Arc::new(Issued::default()));
        let start = clock.physical_now().physical_ms();
        let a = issued.issue(&clock, 1).await;
        let b = issued.issue(&clock, 1).await;
        assert!(
            Timestamp(a.ts).physical_ms() >= start + 500,
            "first issue of a term"
        );
        assert!(b.ts > a.ts);
        // Later in the same term: no wait.
        let t0 = std::time::Instant::now();
        let c = issued.issue(&clock, 1).await;
        assert!(t0.elapsed() < Duration::from_millis(400));
        // A new term waits again.
        let d = issued.issue(&clock, 2).await;
        assert!(Timestamp(d.ts).physical_ms() >= Timestamp(c.ts).physical_ms() + 500);
        assert_eq!(issued.oldest(), Some(a.ts));
    }

    /// A term begun when the node was elected waits `max_offset` from then, not from its first
    /// issue: a shard first written long after its election issues at once (before, the first
    /// write after every election paid the whole `max_offset`).
    #[tokio::test]
    async fn a_term_begun_at_election_waits_from_then() {
        let (clock, issued) = (clock(), Arc::new(Issued::default()));
        let now = clock.physical_now().physical_ms();
        // Elected a second ago.
        issued.begin_term_at(3, now - 1_000, 500);
        let a = issued.issue(&clock, 3).await;
        assert!(
            Timestamp(a.ts).physical_ms() < now + 500,
            "issued {} ms after the call; the term's wait was over",
            Timestamp(a.ts).physical_ms() - now
        );
        // Elected just now: the wait still holds (the safety argument).
        issued.begin_term(&clock, 4);
        let b = issued.issue(&clock, 4).await;
        assert!(Timestamp(b.ts).physical_ms() > now + 500);
        // A stale role watcher naming an older term changes nothing: term 4 keeps its mark, and
        // term 3 is not begun again.
        issued.begin_term_at(3, now + 10_000, 500);
        let c = issued.issue(&clock, 4).await;
        assert!(Timestamp(c.ts).physical_ms() < now + 10_000);
    }

    #[tokio::test]
    async fn settle_waits_for_proposals_at_or_below_the_read_and_no_others() {
        let (clock, issued) = (clock(), Arc::new(Issued::default()));
        let low = issued.issue(&clock, 1).await;
        let high = issued.issue(&clock, 1).await;
        let deadline = || Instant::now() + Duration::from_millis(50);
        // The clock must be past the read timestamp.
        let far = Timestamp::from_physical_ms(clock.physical_now().physical_ms() + 60_000).0;
        assert!(matches!(
            issued.settle(&clock, far, &ReadSpan::All, deadline()).await,
            Err(SettleError::ClockBehind { .. })
        ));
        // Below every issued timestamp: nothing to wait for.
        let (low_ts, high_ts) = (low.ts, high.ts);
        assert_eq!(
            issued
                .settle(&clock, low_ts - 1, &ReadSpan::All, deadline())
                .await,
            Ok(())
        );
        // At `low`: times out while it is in flight...
        assert_eq!(
            issued
                .settle(&clock, low_ts, &ReadSpan::All, deadline())
                .await,
            Err(SettleError::Timeout { oldest: low_ts })
        );
        // ...and finishes when it settles, though `high` is still in flight.
        let waiter = {
            let issued = Arc::clone(&issued);
            let clock = clock.clone();
            tokio::spawn(async move {
                issued
                    .settle(
                        &clock,
                        low_ts,
                        &ReadSpan::All,
                        Instant::now() + Duration::from_secs(5),
                    )
                    .await
            })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        drop(low);
        assert_eq!(waiter.await.unwrap(), Ok(()));
        assert_eq!(issued.oldest(), Some(high_ts));
        drop(high);
        assert_eq!(issued.oldest(), None);
    }

    /// A resolution in flight holds no snapshot read up (its intents answer for it), but it
    /// still holds closed timestamps below it, and a write issued after it is waited for.
    #[tokio::test]
    async fn settle_does_not_wait_for_resolutions_but_close_does() {
        let (clock, issued) = (clock(), Arc::new(Issued::default()));
        let resolution = issued.issue_for(&clock, 1, IssueKind::Resolution).await;
        let read_ts = clock.now().0;
        let deadline = || Instant::now() + Duration::from_millis(50);
        assert_eq!(
            issued
                .settle(&clock, read_ts, &ReadSpan::All, deadline())
                .await,
            Ok(())
        );
        assert_eq!(issued.oldest(), Some(resolution.ts));
        assert!(issued.close(&clock, 1) < resolution.ts);
        let write = issued.issue(&clock, 1).await;
        let later = clock.now().0;
        assert_eq!(
            issued
                .settle(&clock, later, &ReadSpan::All, deadline())
                .await,
            Err(SettleError::Timeout { oldest: write.ts })
        );
        drop(write);
        assert_eq!(
            issued
                .settle(&clock, later, &ReadSpan::All, deadline())
                .await,
            Ok(())
        );
        drop(resolution);
        assert_eq!(issued.oldest(), None);
    }

    /// A read waits for an in-flight write at or below it only if the write may touch what
    /// it reads: one of its keys, or a key in its scanned range; a write of unknown footprint
    /// holds every read up.
    #[tokio::test]
    async fn settle_waits_only_for_writes_to_what_it_reads() {
        let (clock, issued) = (clock(), Arc::new(Issued::default()));
        let b = |s: &str| Bytes::copy_from_slice(s.as_bytes());
        let write = issued
            .issue_for(
                &clock,
                1,
                IssueKind::Write(Footprint::keys([b("k5"), b("k2"), b("k5")])),
            )
            .await;
        let read_ts = clock.now().0;
        let deadline = || Instant::now() + Duration::from_millis(30);
        async fn blocks(issued: &Issued, clock: &Clock, read_ts: u64, span: ReadSpan<'_>) -> bool {
            let deadline = Instant::now() + Duration::from_millis(30);
            issued
                .settle(clock, read_ts, &span, deadline)
                .await
                .is_err()
        }
        assert!(
            !blocks(
                &issued,
                &clock,
                read_ts,
                ReadSpan::Keys(&[b("k1"), b("k3")])
            )
            .await,
            "other keys"
        );
        assert!(
            blocks(
                &issued,
                &clock,
                read_ts,
                ReadSpan::Keys(&[b("k1"), b("k5")])
            )
            .await,
            "a written key"
        );
        assert!(blocks(&issued, &clock, read_ts, ReadSpan::All).await);
        assert!(
            blocks(
                &issued,
                &clock,
                read_ts,
                ReadSpan::Range {
                    start: b"k2",
                    end: b"k3"
                }
            )
            .await,
            "start inclusive"
        );
        assert!(
            !blocks(
                &issued,
                &clock,
                read_ts,
                ReadSpan::Range {
                    start: b"k3",
                    end: b"k5"
                }
            )
            .await,
            "end exclusive"
        );
        assert!(
            blocks(
                &issued,
                &clock,
                read_ts,
                ReadSpan::Range {
                    start: b"k3",
                    end: b""
                }
            )
            .await,
            "unbounded end"
        );
        assert!(
            !blocks(
                &issued,
                &clock,
                read_ts,
                ReadSpan::Range {
                    start: b"k6",
                    end: b""
                }
            )
            .await
        );
        drop(write);
        let unknown = issued.issue(&clock, 1).await;
        let later = clock.now().0;
        assert_eq!(
            issued
                .settle(&clock, later, &ReadSpan::Keys(&[b("zz")]), deadline())
                .await,
            Err(SettleError::Timeout { oldest: unknown.ts }),
            "an unknown footprint meets every read"
        );
    }

    #[test]
    fn the_term_start_mark_is_kept_per_term_and_never_trusted_across_a_change() {
        let issued = Issued::default();
        assert_eq!(issued.led_since(4, 4, 100), 100, "first barrier of term 4");
        assert_eq!(issued.led_since(4, 4, 150), 100, "kept for the term");
        assert_eq!(
            issued.led_since(4, 5, 170),
            170,
            "a term change around the barrier"
        );
        assert_eq!(issued.led_since(5, 5, 180), 170);
        assert_eq!(issued.led_since(6, 6, 200), 200, "a new term");
    }

    /// A closed timestamp is below every in-flight issue and `lag` behind the clock, and
    /// every timestamp issued after it, including a new term's first (which waits), is above.
    #[tokio::test]
    async fn close_is_below_every_inflight_issue_and_every_later_one() {
        let (clock, issued) = (clock(), Arc::new(Issued::default()));
        assert_eq!(issued.close(&clock, 0), 0, "lag 0 closes nothing");
        let before = clock.now().0;
        let closed = issued.close(&clock, 1_000);
        assert!(closed < before, "lag behind the clock");
        assert!(Timestamp(before).physical_ms() - Timestamp(closed).physical_ms() >= 999);
        let held = issued.issue(&clock, 1).await;
        let closed = issued.close(&clock, 1);
        assert!(closed < held.ts, "{closed} < {}", held.ts);
        for _ in 0..100 {
            let closed = issued.close(&clock, 1);
            assert!(closed < held.ts);
            assert!(issued.issue(&clock, 1).await.ts > closed);
        }
        drop(held);
        let closed = issued.close(&clock, 1);
        let next_term = issued.issue(&clock, 2).await;
        assert!(
            next_term.ts > closed,
            "a new term's first issue waits and lands above"
        );
    }

    #[tokio::test]
    async fn a_timestamp_issued_after_settle_checked_the_clock_is_above_the_read() {
        let (clock, issued) = (clock(), Arc::new(Issued::default()));
        drop(issued.issue(&clock, 3).await);
        let read_ts = clock.now().0;
        for _ in 0..1_000 {
            assert!(issued.issue(&clock, 3).await.ts > read_ts);
        }
    }
}
