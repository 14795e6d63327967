//! The Wing–Gong / Lowe linearizability search (WGL), generic over a sequential model.
//!
//! # What
//! Given operations with a call time, a return time (`u64::MAX` for "never returned") and a
//! deterministic sequential [`Model`], decide whether some total order of the operations that
//! respects real time (A before B whenever A returned before B was called) is a legal sequential
//! execution of the model. This is the algorithm of Wing & Gong, with Lowe's memoization
//! ("Testing for linearizability", 2017), as also used by Porcupine and Knossos's `wgl` checker:
//!
//! - calls and returns form one doubly linked list sorted by time;
//! - walking the list from the head, a call whose operation the model accepts in the current
//!   state is *linearized*: its call and return are lifted out of the list, the previous state is
//!   pushed on a stack, and the walk restarts from the head;
//! - reaching a return means that operation should already have been linearized: pop the last
//!   choice, unlift it, and try the next call after it;
//! - a cache of (set of linearized operations, model state) pairs already explored prunes
//!   re-exploration: two paths that linearized the same operations and reached the same state
//!   have the same future. The set is a bitset stored canonically as "the first `full` words are
//!   all ones" plus the remaining words up to the last non-zero one; since linearized operations
//!   are nearly a prefix of the call order, the stored part stays a few words long;
//! - partial-order reduction for read-only operations ([`Model::is_read_only`]): such an
//!   operation, once legal, is linearized without trying alternatives, because any
//!   linearization can be rearranged to take it first. If the configuration after it fails (or
//!   was already explored), the configuration before it fails too, and the search backtracks
//!   past it.
//!
//! The list is empty exactly when every operation is linearized (success); a return reached with
//! an empty stack means no order exists (failure).
//!
//! # Invariants
//! - Lifts and unlifts happen in stack (LIFO) order, which is what makes the dancing-links
//!   relinking in [`Search::unlift`] correct.
//! - Every loop iteration counts as one step; past `max_steps` the answer is `Unknown`.
//! - The witness (longest linearized prefix and the operations stuck after it) is captured
//!   lazily, the first time the search backtracks from a new maximum depth, so successful
//!   searches pay nothing for it.
//!
//! # Not done yet
//! No per-operation "longest prefix" like Porcupine's visualisation data, and no parallelism
//! inside one search (independent keys can be checked in parallel by the caller).

use std::collections::HashSet;
use std::hash::Hash;

use super::Validity;

/// A deterministic sequential specification.
pub(crate) trait Model {
    /// The model's state; hashed into the memoization cache.
    type State: Clone + Eq + Hash;
    /// One operation, including its observed result.
    type Op;
    /// The state before any operation.
    fn init(&self) -> Self::State;
    /// The state after `op`, or `None` if `op` (with its observed result) is impossible in `state`.
    fn step(&self, state: &Self::State, op: &Self::Op) -> Option<Self::State>;
    /// Whether `op` leaves every state in which it is legal unchanged (a read). Such an op, once
    /// legal and callable, is linearized greedily without exploring alternatives: moving it
    /// earlier in any linearization keeps the linearization valid.
    fn is_read_only(&self, _op: &Self::Op) -> bool {
        false
    }
}

/// An operation to linearize.
#[derive(Debug, Clone)]
pub(crate) struct Entry<O> {
    pub op: O,
    /// When it was called (any monotonic unit; here: history index).
    pub call: u64,
    /// When it returned; `u64::MAX` for an operation that may take effect at any later time.
    pub ret: u64,
}

/// The search's answer.
#[derive(Debug, Clone)]
pub(crate) struct SearchResult<S> {
    pub verdict: Validity,
    pub steps: u64,
    /// Unless `True`: entry ids of the longest linearized prefix found, in linearization order.
    pub longest: Vec<usize>,
    /// The model state after `longest`.
    pub state_after: S,
    /// Unless `True`: entry ids that were candidates right after `longest` (called before the
    /// first pending return) and none of which led to a full linearization.
    pub stuck: Vec<usize>,
}

const NIL: usize = usize::MAX;
const HEAD: usize = 0;

#[derive(Debug, Clone, Copy)]
struct Node {
    entry: usize,
    is_call: bool,
    /// For a call node: its return node.
    matched: usize,
    prev: usize,
    next: usize,
}

#[derive(PartialEq, Eq, Hash)]
struct CacheKey<S> {
    full: u32,
    tail: Box<[u64]>,
    state: S,
}

fn cache_key<S>(bits: &[u64], state: S) -> CacheKey<S> {
    let full = bits.iter().take_while(|w| **w == u64::MAX).count();
    let end = bits
        .iter()
        .rposition(|w| *w != 0)
        .map_or(full, |last| (last + 1).max(full));
    CacheKey {
        full: full as u32,
        tail: bits[full..end].into(),
        state,
    }
}

struct Search {
    nodes: Vec<Node>,
}

impl Search {
    fn new<O>(entries: &[Entry<O>]) -> Search {
        // (time, is_return, entry): calls sort before returns at equal times (overlap).
        let mut events: Vec<(u64, bool, usize)> = Vec::with_capacity(2 * entries.len());
        for (id, e) in entries.iter().enumerate() {
            events.push((e.call, false, id));
            events.push((e.ret, true, id));
        }
        events.sort_unstable();
        let mut nodes = Vec::with_capacity(events.len() + 1);
        nodes.push(Node {
            entry: NIL,
            is_call: false,
            matched: NIL,
            prev: NIL,
            next: NIL,
        });
        let mut ret_node = vec![NIL; entries.len()];
        for (i, &(_, is_ret, id)) in events.iter().enumerate() {
            let me = i + 1;
            nodes[me - 1].next = me;
            nodes.push(Node {
                entry: id,
                is_call: !is_ret,
                matched: NIL,
                prev: me - 1,
                next: NIL,
            });
            if is_ret {
                ret_node[id] = me;
            }
        }
        for n in nodes.iter_mut().skip(1) {
            if n.is_call {
                n.matched = ret_node[n.entry];
            }
        }
        Search { nodes }
    }

    fn unlink(&mut self, x: usize) {
        let Node { prev, next, .. } = self.nodes[x];
        self.nodes[prev].next = next;
        if next != NIL {
            self.nodes[next].prev = prev;
        }
    }

    fn relink(&mut self, x: usize) {
        let Node { prev, next, .. } = self.nodes[x];
        self.nodes[prev].next = x;
        if next != NIL {
            self.nodes[next].prev = x;
        }
    }

    fn lift(&mut self, call: usize) {
        self.unlink(call);
        self.unlink(self.nodes[call].matched);
    }

    fn unlift(&mut self, call: usize) {
        self.relink(self.nodes[call].matched);
        self.relink(call);
    }

    /// Entry ids of the calls before the first return in the list: the candidates to be
    /// linearized next.
    fn frontier(&self) -> Vec<usize> {
        let mut out = Vec::new();
        let mut n = self.nodes[HEAD].next;
        while n != NIL && self.nodes[n].is_call {
            out.push(self.nodes[n].entry);
            n = self.nodes[n].next;
        }
        out.sort_unstable();
        out
    }
}

/// A linearization choice on the stack.
struct Frame<S> {
    /// The call node linearized.
    call: usize,
    /// The state before it.
    state: S,
    /// A read-only op taken greedily: if it fails, its configuration fails too.
    forced: bool,
}

/// Runs the WGL search over `entries` (any order) with at most `max_steps` loop iterations.
pub(crate) fn check<M: Model>(
    model: &M,
    entries: &[Entry<M::Op>],
    max_steps: u64,
) -> SearchResult<M::State> {
    let mut s = Search::new(entries);
    let mut bits = vec![0u64; entries.len().div_ceil(64)];
    let mut cache: HashSet<CacheKey<M::State>> = HashSet::new();
    let mut stack: Vec<Frame<M::State>> = Vec::new();
    let mut state = model.init();
    let mut steps: u64 = 0;
    // Witness bookkeeping: `dirty` means the stack reached a new maximum not yet snapshotted.
    let mut best_len = 0usize;
    let mut dirty = true;
    let mut longest: Vec<usize> = Vec::new();
    let mut state_after = state.clone();
    let mut stuck: Vec<usize> = Vec::new();

    // Snapshot of the witness, taken when about to leave a new maximum depth (or give up there).
    let snapshot = |stack: &[Frame<M::State>], s: &Search| {
        let longest = stack.iter().map(|f| s.nodes[f.call].entry).collect();
        (longest, s.frontier())
    };
    let mut cur = s.nodes[HEAD].next;
    while s.nodes[HEAD].next != NIL {
        if steps >= max_steps {
            if dirty {
                (longest, stuck) = snapshot(&stack, &s);
                state_after = state.clone();
            }
            let verdict = Validity::Unknown;
            return SearchResult {
                verdict,
                steps,
                longest,
                state_after,
                stuck,
            };
        }
        steps += 1;
        let mut backtrack = false;
        let node = s.nodes[cur];
        if node.is_call {
            let id = node.entry;
            let op = &entries[id].op;
            if let Some(next_state) = model.step(&state, op) {
                let forced = model.is_read_only(op);
                bits[id / 64] |= 1 << (id % 64);
                if cache.insert(cache_key(&bits, next_state.clone())) {
                    let state = std::mem::replace(&mut state, next_state);
                    stack.push(Frame {
                        call: cur,
                        state,
                        forced,
                    });
                    s.lift(cur);
                    if stack.len() > best_len {
                        best_len = stack.len();
                        dirty = true;
                    }
                    cur = s.nodes[HEAD].next;
                    continue;
                }
                bits[id / 64] &= !(1 << (id % 64));
                // A read-only op that is enabled here but whose result was already explored:
                // this configuration is already known to fail.
                backtrack = forced;
            }
            if !backtrack {
                cur = node.next;
                continue;
            }
        }
        // A return reached (that op should have been linearized already), or a dead forced read:
        // undo the last choice; undo forced choices entirely, since their parent failed with them.
        if dirty {
            (longest, stuck) = snapshot(&stack, &s);
            state_after = state.clone();
            dirty = false;
        }
        loop {
            let Some(frame) = stack.pop() else {
                let verdict = Validity::False;
                return SearchResult {
                    verdict,
                    steps,
                    longest,
                    state_after,
                    stuck,
                };
            };
            state = frame.state;
            let id = s.nodes[frame.call].entry;
            bits[id / 64] &= !(1 << (id % 64));
            s.unlift(frame.call);
            if !frame.forced {
                cur = s.nodes[frame.call].next;
                break;
            }
        }
    }
    SearchResult {
        verdict: Validity::True,
        steps,
        longest: Vec::new(),
        state_after: state,
        stuck: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A counter that only accepts "expect n, then n+1" steps: forces one specific order.
    struct Counter;
    impl Model for Counter {
        type State = u32;
        type Op = u32;
        fn init(&self) -> u32 {
            0
        }
        fn step(&self, s: &u32, op: &u32) -> Option<u32> {
            (*s == *op).then_some(s + 1)
        }
    }

    fn e(op: u32, call: u64, ret: u64) -> Entry<u32> {
        Entry { op, call, ret }
    }

    /// Overlapping operations may be linearized in the order the model needs.
    #[test]
    fn finds_order_among_overlapping_ops() {
        let entries = [e(1, 0, 10), e(0, 1, 9), e(2, 2, 8)];
        let r = check(&Counter, &entries, 1000);
        assert_eq!(r.verdict, Validity::True);
    }

    /// Real-time order is respected: an op that returned earlier cannot be ordered later.
    #[test]
    fn respects_real_time_and_reports_witness() {
        let entries = [e(1, 0, 1), e(0, 2, 3)];
        let r = check(&Counter, &entries, 1000);
        assert_eq!(r.verdict, Validity::False);
        assert!(r.longest.is_empty());
        assert_eq!(r.stuck, vec![0]);
    }

    /// Never-returning ops may be placed anywhere after their call, including after everything.
    #[test]
    fn infinite_returns_float_to_the_end() {
        let entries = [e(2, 0, u64::MAX), e(0, 1, 2), e(1, 3, 4)];
        assert_eq!(check(&Counter, &entries, 1000).verdict, Validity::True);
    }

    /// Exceeding the step budget yields Unknown rather than a guess.
    #[test]
    fn step_budget_gives_unknown() {
        let entries: Vec<_> = (0..20).map(|i| e(19 - i, 0, 100)).collect();
        let r = check(&Counter, &entries, 5);
        assert_eq!(r.verdict, Validity::Unknown);
        assert_eq!(r.steps, 5);
    }

    /// The canonical cache key ignores all-ones prefixes and trailing zero words.
    #[test]
    fn cache_key_is_canonical() {
        let a = cache_key(&[u64::MAX, 0b101, 0, 0], 7u32);
        assert_eq!((a.full, &*a.tail), (1, &[0b101u64][..]));
        let b = cache_key(&[u64::MAX, u64::MAX, 0], 7u32);
        assert_eq!((b.full, b.tail.len()), (2, 0));
        let c = cache_key(&[0, 0], 7u32);
        assert_eq!((c.full, c.tail.len()), (0, 0));
    }
}
