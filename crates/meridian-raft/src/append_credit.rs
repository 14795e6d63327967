//! Keeps a late append reply from confirming a leader's lease with a later request's send time.
//!
//! # Why
//! A leader's lease and its ReadIndex reads rest on one rule: a follower's acknowledgement of
//! an AppendEntries request sent at time `t` proves the follower still followed this leader at
//! some time after `t` (and, by openraft's vote refusal, will not vote for another until an
//! election timeout after it received the request). openraft stamps each pipelined request
//! with its send time in a per-stream queue and, on each reply, removes every queued request
//! whose last log id the reply's `matching` log id covers, crediting the *latest* one's send
//! time. Requests that carry no new entries (a new commit index only) end at the same log id
//! as the request before them, so a reply to request `i` also removes, and credits, every such
//! request sent after `i` but before the reply was handled. Usually that is microseconds. But
//! a leader frozen by SIGSTOP (or a long stall) wakes with replies to its pre-freeze requests
//! still unread, sends commit-only requests as the first of those replies advance its commit
//! index, and then credits the others with post-wake send times: its lease looks fresh though
//! the followers have since elected another leader, and it serves a stale "linearizable" read
//! (Jepsen, `register × pause`, evidence `register-pause-20261202T075731Z`). A reply delayed in
//! the network the same way does the same.
//!
//! # What
//! The transport sees every request it sends and every reply, in order (one reply per request;
//! a stream ends at its first error). [`AppendCredit`] replays openraft's queue beside it and,
//! for each reply, compares the send time openraft is about to credit with the send time of
//! the request the reply actually answers. If the first exceeds the second by more than
//! `slack`, the transport ends the stream instead of delivering the reply: openraft starts a
//! new stream (with a new, empty queue) from what was acknowledged before, and no lease is
//! extended by more than `slack` past a follower's real acknowledgement. `slack` is a
//! twentieth of the election timeout (half the margin the lease reads leave unused, see
//! `meridian_server::kv_read`). Ordinary pipelining credits early by a fraction of a round
//! trip, so streams end only where replies arrive late (after a stall, a partition or a kill:
//! 1–7 restarts per 45 s Jepsen run with faults, none in the `register × pause` reruns).
//!
//! # Invariants
//! - A reply is checked and the credit openraft will give it is fixed while no new request
//!   can be recorded: the request side waits while a delivered reply is "in hand" (from the
//!   reply's delivery until openraft asks for the next reply, openraft's queue update happens
//!   in between), and recording a request happens under the same lock as the check.
//! - `Verdict::Deliver` is returned only if the credited send time is at most `slack` after
//!   the answered request's send time; replies to requests this guard never saw end the stream.
//! - The two sides end together: when the reply side ends on a verdict or openraft drops it,
//!   the gate closes and wakes the request side, which drops openraft's request stream and
//!   ends the request body at once. openraft's request stream holds its replication state's
//!   lock while it waits for entries, and its next stream needs that lock: a request side
//!   left waiting (as before 2026-12-05) stalled a shard whose leader had nothing new to
//!   send, until the connection died (`bench/results/2026-12-05/replication-stall`).
//!
//! # Not done
//! A reply whose request was lost by the transport (encoding failure) would shift the pairing:
//! the transport ends the request stream at such a failure rather than skip the request.

use futures::{Stream, StreamExt};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::task::{Poll, Waker};
use std::time::{Duration, Instant};

/// One request as openraft's queue holds it: `(prev, last]` and when it was sent.
#[derive(Clone, Debug)]
struct Sent<L> {
    prev: Option<L>,
    last: Option<L>,
    at: Instant,
}

/// What to do with a reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Hand it to openraft.
    Deliver,
    /// End the stream: delivered, the reply would confirm the leader `early` past its request.
    EndStream { early: Duration },
}

/// The replay of one stream's in-flight requests (see the module docs).
#[derive(Debug)]
pub struct AppendCredit<L> {
    /// Requests in send order, one popped per reply (the request it answers).
    unanswered: VecDeque<Instant>,
    /// openraft's queue, replayed.
    queue: VecDeque<Sent<L>>,
    slack: Duration,
}

impl<L: Ord + Clone> AppendCredit<L> {
    pub fn new(slack: Duration) -> Self {
        AppendCredit {
            unanswered: VecDeque::new(),
            queue: VecDeque::new(),
            slack,
        }
    }

    /// Records a request covering `(prev, last]` sent at `at`.
    pub fn sent(&mut self, prev: Option<L>, last: Option<L>, at: Instant) {
        self.unanswered.push_back(at);
        self.queue.push_back(Sent { prev, last, at });
    }

    /// A success reply acknowledging up to `matching`.
    pub fn acked(&mut self, matching: &Option<L>) -> Verdict {
        let answered = self.unanswered.pop_front();
        // openraft removes every request `matching` covers and credits the last one's send
        // time, or that of a request `matching` reaches into.
        let mut credited = None;
        while let Some(first) = self.queue.front() {
            if *matching >= first.last {
                credited = Some(first.at);
                self.queue.pop_front();
            } else {
                if *matching > first.prev {
                    credited = Some(first.at);
                }
                break;
            }
        }
        self.judge(answered, credited)
    }

    /// A conflict reply at `conflict`.
    pub fn conflicted(&mut self, conflict: &L) -> Verdict {
        let answered = self.unanswered.pop_front();
        // openraft drops requests wholly before the conflict, then credits the first request
        // that starts at or contains it.
        let mut credited = None;
        while let Some(first) = self.queue.front() {
            let starts_at = first.prev.as_ref() == Some(conflict);
            if !starts_at && first.last.as_ref() <= Some(conflict) {
                self.queue.pop_front();
                continue;
            }
            if starts_at || first.prev.as_ref() < Some(conflict) {
                credited = Some(first.at);
                self.queue.pop_front();
            }
            break;
        }
        self.judge(answered, credited)
    }

    /// A reply that credits no send time (a higher vote): always delivered.
    pub fn refused(&mut self) -> Verdict {
        self.unanswered.pop_front();
        Verdict::Deliver
    }

    fn judge(&self, answered: Option<Instant>, credited: Option<Instant>) -> Verdict {
        match (answered, credited) {
            (_, None) => Verdict::Deliver,
            (Some(answered), Some(credited)) => {
                let early = credited.saturating_duration_since(answered);
                if early > self.slack {
                    Verdict::EndStream { early }
                } else {
                    Verdict::Deliver
                }
            }
            // More replies than requests: the pairing is lost; trust nothing.
            (None, Some(_)) => Verdict::EndStream {
                early: Duration::MAX,
            },
        }
    }
}

/// A reply as the transport hands it to openraft, seen by the gate.
pub enum ReplyKind<'a, L> {
    /// A success acknowledging up to the log id.
    Acked(&'a Option<L>),
    /// A conflict at the log id.
    Conflict(&'a L),
    /// A reply that credits no send time (higher vote, transport error).
    Other,
}

struct GateState<L> {
    credit: AppendCredit<L>,
    /// A delivered reply openraft has not finished handling (see the module invariants).
    in_hand: bool,
    /// The stream ended on a verdict, or openraft dropped the reply side: the request side
    /// sends nothing more and drops openraft's request stream.
    closed: bool,
    /// The request side's last waker whenever it returned `Pending` (waiting for `in_hand`
    /// to clear, or for openraft's next request): closing wakes it, so it ends even while
    /// openraft has nothing to send.
    waiting: Option<Waker>,
}

impl<L> GateState<L> {
    /// Ends the request side: marks the gate closed and wakes the request side, which then
    /// drops openraft's request stream and ends the request body.
    fn close(&mut self) {
        self.closed = true;
        if let Some(waker) = self.waiting.take() {
            waker.wake();
        }
    }
}

/// Closes the gate when openraft drops the reply side (after a conflict, an error, a clean end
/// or a cancelled session): see [`Gate::replies`].
struct CloseOnDrop<L>(Arc<Mutex<GateState<L>>>);

impl<L> Drop for CloseOnDrop<L> {
    fn drop(&mut self) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).close();
    }
}

/// The two ends of one append stream, sharing one [`AppendCredit`] (see the module docs).
pub struct Gate<L> {
    state: Arc<Mutex<GateState<L>>>,
}

impl<L: Ord + Clone + Send + 'static> Gate<L> {
    pub fn new(slack: Duration) -> Self {
        Gate {
            state: Arc::new(Mutex::new(GateState {
                credit: AppendCredit::new(slack),
                in_hand: false,
                closed: false,
                waiting: None,
            })),
        }
    }

    /// Wraps the request stream: each request's `(prev, last]` (from `range`) is recorded
    /// under the gate's lock in the same poll that produces it, and none is produced while a
    /// reply is in hand. Once the gate closes, the next poll (closing wakes it) drops `input`
    /// and ends the stream.
    ///
    /// Dropping `input` at once matters: openraft's request stream holds its replication
    /// state's lock while it waits for new entries, and its replication loop needs that lock
    /// to start the next stream. An ended reply stream whose request side lingered (not woken,
    /// so never ending the HTTP/2 body) stalled a shard's replication until the connection
    /// died (`bench/results/2026-12-05/replication-stall`).
    pub fn requests<R, S>(
        &self,
        input: S,
        range: impl Fn(&R) -> (Option<L>, Option<L>) + Send + 'static,
    ) -> impl Stream<Item = R> + Send + 'static
    where
        S: Stream<Item = R> + Unpin + Send + 'static,
    {
        let state = self.state.clone();
        let mut input = Some(input);
        futures::stream::poll_fn(move |cx| {
            let mut st = state.lock().unwrap_or_else(|p| p.into_inner());
            let Some(stream) = input.as_mut().filter(|_| !st.closed) else {
                input = None;
                return Poll::Ready(None);
            };
            if !st.in_hand {
                let polled = stream.poll_next_unpin(cx);
                match &polled {
                    Poll::Ready(Some(request)) => {
                        let (prev, last) = range(request);
                        st.credit.sent(prev, last, Instant::now());
                        return polled;
                    }
                    Poll::Ready(None) => {
                        input = None;
                        return polled;
                    }
                    Poll::Pending => {}
                }
            }
            if !st.waiting.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                st.waiting = Some(cx.waker().clone());
            }
            Poll::Pending
        })
    }

    /// Wraps the reply stream: each reply is judged before it is delivered, and the stream
    /// ends (after logging `on_end(early)`) instead of delivering one that would credit too
    /// late a send time. Ending it, or openraft dropping it for any reason, closes the gate
    /// (the request side ends too; see [`Gate::requests`]).
    pub fn replies<T, S>(
        &self,
        mut replies: S,
        kind: impl for<'a> Fn(&'a T) -> ReplyKind<'a, L> + Send + 'static,
        on_end: impl Fn(Duration) + Send + 'static,
    ) -> impl Stream<Item = T> + Send + 'static
    where
        S: Stream<Item = T> + Unpin + Send + 'static,
    {
        // The closure owns the state through the closer, so dropping the stream closes it.
        let closer = CloseOnDrop(self.state.clone());
        futures::stream::poll_fn(move |cx| {
            let state = &closer.0;
            {
                let mut st = state.lock().unwrap_or_else(|p| p.into_inner());
                if st.closed {
                    return Poll::Ready(None);
                }
                // Asked for the next reply: openraft is done with the last one.
                if st.in_hand {
                    st.in_hand = false;
                    if let Some(waker) = st.waiting.take() {
                        waker.wake();
                    }
                }
            }
            let polled = replies.poll_next_unpin(cx);
            let Poll::Ready(Some(item)) = polled else {
                return polled;
            };
            let mut st = state.lock().unwrap_or_else(|p| p.into_inner());
            let verdict = match kind(&item) {
                ReplyKind::Acked(matching) => st.credit.acked(matching),
                ReplyKind::Conflict(at) => st.credit.conflicted(at),
                ReplyKind::Other => st.credit.refused(),
            };
            match verdict {
                Verdict::Deliver => {
                    st.in_hand = true;
                    Poll::Ready(Some(item))
                }
                Verdict::EndStream { early } => {
                    st.close();
                    drop(st);
                    on_end(early);
                    Poll::Ready(None)
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const SLACK: Duration = Duration::from_millis(50);

    fn at(base: Instant, ms: u64) -> Instant {
        base + Duration::from_millis(ms)
    }

    /// A replay with requests `(prev, last, sent at ms)` recorded, and its time origin.
    fn sent(requests: &[(u64, u64, u64)]) -> (AppendCredit<u64>, Instant) {
        let t = Instant::now();
        let mut c = AppendCredit::new(SLACK);
        for &(prev, last, ms) in requests {
            c.sent(Some(prev), Some(last), at(t, ms));
        }
        (c, t)
    }

    #[test]
    fn in_order_replies_to_growing_requests_are_delivered() {
        let (mut c, _) = sent(&[(0, 5, 0), (5, 9, 1)]);
        assert_eq!(c.acked(&Some(5)), Verdict::Deliver);
        assert_eq!(c.acked(&Some(9)), Verdict::Deliver);
    }

    /// The Jepsen case: a reply to a request sent before a freeze covers a commit-only request
    /// sent after it; openraft would credit the later send time.
    #[test]
    fn a_reply_from_before_a_freeze_cannot_credit_a_request_sent_after_it() {
        // Frozen 3 s; on waking the leader sends a commit-only request ending at 5.
        let (mut c, _) = sent(&[(0, 5, 0), (5, 5, 3_000)]);
        assert_eq!(
            c.acked(&Some(5)),
            Verdict::EndStream {
                early: Duration::from_millis(3_000)
            }
        );
    }

    #[test]
    fn pipelining_within_the_slack_is_delivered() {
        let (mut c, _) = sent(&[(0, 5, 0), (5, 5, 2)]);
        assert_eq!(c.acked(&Some(5)), Verdict::Deliver);
        // The commit-only request was drained with it; its own reply credits nothing.
        assert_eq!(c.acked(&Some(5)), Verdict::Deliver);
    }

    #[test]
    fn a_partial_acknowledgement_credits_the_request_it_reaches_into() {
        let (mut c, _) = sent(&[(0, 5, 0), (5, 9, 500)]);
        // The follower already held entries up to 7 from an earlier stream.
        assert!(matches!(c.acked(&Some(7)), Verdict::EndStream { .. }));
    }

    #[test]
    fn a_conflict_credits_the_request_at_the_conflict() {
        let (mut c, _) = sent(&[(3, 3, 0), (3, 5, 1)]);
        // A conflict at a request's own prev credits that request.
        assert_eq!(c.conflicted(&3), Verdict::Deliver);
        // A conflict openraft would pin on a request sent long after the answered one.
        let (mut c, _) = sent(&[(1, 3, 0), (3, 5, 1_000)]);
        assert_eq!(
            c.conflicted(&3),
            Verdict::EndStream {
                early: Duration::from_millis(1_000)
            }
        );
    }

    #[test]
    fn a_higher_vote_is_always_delivered_and_consumes_its_request() {
        let (mut c, _) = sent(&[(0, 5, 0), (5, 6, 10_000)]);
        assert_eq!(c.refused(), Verdict::Deliver);
        // The next reply answers the second request.
        assert_eq!(c.acked(&Some(6)), Verdict::Deliver);
    }

    #[test]
    fn more_replies_than_requests_end_the_stream() {
        let (mut c, t) = sent(&[(0, 5, 0), (5, 5, 1)]);
        assert_eq!(c.acked(&Some(5)), Verdict::Deliver);
        assert_eq!(c.acked(&Some(5)), Verdict::Deliver);
        c.queue.push_back(Sent {
            prev: Some(5),
            last: Some(5),
            at: at(t, 2),
        });
        assert!(matches!(c.acked(&Some(5)), Verdict::EndStream { .. }));
    }

    proptest! {
        /// Model check against a direct statement of the safety rule: whenever a reply is
        /// delivered, every request it makes openraft credit was sent at most `slack` after the
        /// request the reply answers.
        #[test]
        fn delivered_replies_never_credit_beyond_the_slack(
            steps in proptest::collection::vec((0u8..3, 0u64..4, 0u64..200), 1..60)
        ) {
            let t = Instant::now();
            let mut c = AppendCredit::new(SLACK);
            let (mut last, mut clock) = (0u64, 0u64);
            let mut sent: Vec<(u64, u64, u64)> = Vec::new(); // (prev, last, ms)
            let mut answered = 0usize;
            let mut queue: VecDeque<(u64, u64, u64)> = VecDeque::new();
            for (op, grow, dt) in steps {
                clock += dt;
                if op < 2 || answered >= sent.len() {
                    let prev = last;
                    last += grow;
                    sent.push((prev, last, clock));
                    queue.push_back((prev, last, clock));
                    c.sent(Some(prev), Some(last), at(t, clock));
                } else {
                    // A success reply to the next unanswered request.
                    let (_, matching, asked_at) = sent[answered];
                    answered += 1;
                    let mut credited = None;
                    while let Some(&(p, l, ms)) = queue.front() {
                        if matching >= l { credited = Some(ms); queue.pop_front(); }
                        else { if matching > p { credited = Some(ms); } break; }
                    }
                    let verdict = c.acked(&Some(matching));
                    if let Some(ms) = credited {
                        let early = ms.saturating_sub(asked_at);
                        prop_assert_eq!(
                            verdict == Verdict::Deliver,
                            Duration::from_millis(early) <= SLACK,
                            "early {} ms", early
                        );
                    } else {
                        prop_assert_eq!(verdict, Verdict::Deliver);
                    }
                }
            }
        }
    }

    /// openraft's request stream as the gate sees it: it takes `lock` (as openraft's holds its
    /// replication state) before its first request and keeps it while it waits for the next
    /// one, which comes from `tx`; the lock is free again only once the stream is dropped.
    fn openraft_like_requests(
        lock: Arc<tokio::sync::Mutex<()>>,
    ) -> (
        tokio::sync::mpsc::UnboundedSender<(u64, u64)>,
        impl Stream<Item = (u64, u64)> + Unpin + Send + 'static,
    ) {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let stream = futures::stream::unfold((rx, None), move |(mut rx, guard)| {
            let lock = lock.clone();
            async move {
                let guard = match guard {
                    Some(guard) => guard,
                    None => lock.lock_owned().await,
                };
                let request = rx.recv().await?;
                Some((request, (rx, Some(guard))))
            }
        });
        (tx, Box::pin(stream))
    }

    /// The request side wrapped by a gate and consumed by its own task, as the HTTP/2 body is.
    fn consumed_requests(
        gate: &Gate<u64>,
        lock: &Arc<tokio::sync::Mutex<()>>,
    ) -> (
        tokio::sync::mpsc::UnboundedSender<(u64, u64)>,
        tokio::task::JoinHandle<()>,
    ) {
        let (tx, input) = openraft_like_requests(lock.clone());
        let mut requests = gate.requests(input, |r: &(u64, u64)| (Some(r.0), Some(r.1)));
        let body = tokio::spawn(async move { while requests.next().await.is_some() {} });
        (tx, body)
    }

    /// Once the gate closes, the request side ends and drops openraft's stream (its lock is
    /// free) even though openraft has nothing more to send.
    async fn assert_request_side_ends(
        lock: &Arc<tokio::sync::Mutex<()>>,
        body: tokio::task::JoinHandle<()>,
    ) {
        tokio::time::timeout(Duration::from_secs(2), body)
            .await
            .expect("the request side ended")
            .unwrap();
        assert!(lock.try_lock().is_ok(), "openraft's stream was dropped");
    }

    /// A reply the gate refuses (a late credit) ends the reply side, and the request side ends
    /// with it though openraft has nothing more to send (the 2026-12-05 replication stall).
    #[tokio::test]
    async fn a_refused_reply_ends_the_request_side_too() {
        let gate = Gate::<u64>::new(SLACK);
        let lock = Arc::new(tokio::sync::Mutex::new(()));
        let (tx, body) = consumed_requests(&gate, &lock);
        tx.send((0, 5)).unwrap();
        tokio::time::sleep(SLACK * 3).await;
        // A commit-only request sent well after the first: a reply to the first would be
        // credited with its send time.
        tx.send((5, 5)).unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(
            lock.try_lock().is_err(),
            "openraft's stream waits, holding its lock"
        );
        let mut replies = gate.replies(
            futures::stream::iter([Some(5u64)]).chain(futures::stream::pending()),
            |r: &Option<u64>| ReplyKind::Acked(r),
            |_| {},
        );
        assert_eq!(
            replies.next().await,
            None,
            "the late credit ends the reply side"
        );
        assert_request_side_ends(&lock, body).await;
        drop(tx);
    }

    /// openraft dropping the reply side (after a conflict, an error or a cancelled session)
    /// ends the request side as well.
    #[tokio::test]
    async fn dropping_the_reply_side_ends_the_request_side() {
        let gate = Gate::<u64>::new(SLACK);
        let lock = Arc::new(tokio::sync::Mutex::new(()));
        let (tx, body) = consumed_requests(&gate, &lock);
        tx.send((0, 5)).unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
        let replies = gate.replies(
            futures::stream::pending::<Option<u64>>(),
            |r: &Option<u64>| ReplyKind::Acked(r),
            |_| {},
        );
        drop(replies);
        assert_request_side_ends(&lock, body).await;
        drop(tx);
    }
}
