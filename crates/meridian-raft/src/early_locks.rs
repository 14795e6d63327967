//! Early locks: best-effort, leader-only, unreplicated exclusive locks taken at read time.
//!
//! # What
//! A transaction that reads a key for update may ask the shard leader to lock the key as it
//! reads it (`docs/early-locking.md`). This module is the table a leader keeps for one shard.
//! It is pure: no I/O, no clock (time comes in as `now_ms`), no tasks. The server will keep it
//! under a mutex, wait on each [`TicketId`] it hands out, and deliver every [`Answer`] an
//! operation returns.
//!
//! # Why
//! Today a transfer that loses a race on a hot key learns it at apply, after a replicated
//! entry, and then sleeps in backoff while the key sits idle. A lock turns losing into waiting
//! in order. Correctness never depends on it: apply never reads this table, and every commit
//! is validated as before. A lost lock, a wound or an expiry costs a retry, never a result.
//!
//! # Rules
//! [`EarlyLockTable::acquire`] takes the keys in the order given (the client sorts them):
//! - free, or held by the same owner: held, and the owner's idle clock is reset;
//! - held by a junior ([`TxnRank`]) whose commit is not in flight: the requester *wounds* it
//!   and takes the lock; the junior is flagged ([`EarlyLockTable::take_wounded`]);
//! - held by a senior, or by a holder whose commit is in flight: a ticket in the key's queue,
//!   ordered by rank; a later operation answers it;
//! - otherwise not held ([`NotHeld`]): a full queue or table, another term, a requester whose
//!   own commit is in flight, a second wait of the same owner for the same key.
//!
//! An acquire may leave several tickets, one per key that must wait. The caller waits for all
//! of them within one deadline and [`EarlyLockTable::cancel`]s those still waiting when it
//! gives up; the table never times a wait, except that `expire` ends one as old as the idle
//! limit (a backstop for a lost waiter).
//!
//! A key leaves its holder by [`EarlyLockTable::release_owner`] (its commit applied, or
//! `Kv.ReleaseLocks`), by [`EarlyLockTable::expire`] (idle too long), by a wound, or by
//! [`EarlyLockTable::clear`] (a new term; a lower one is ignored) or
//! [`EarlyLockTable::close`] (no term). A key that leaves goes at once to its most senior waiter.
//! [`EarlyLockTable::begin_commit`] marks an owner's commit in flight: its locks can no longer
//! be wounded or expire, and its waits end. [`EarlyLockTable::end_commit`] (a commit that did
//! not apply) lets a senior waiter wound it again.
//!
//! # Invariants
//! - A key has at most one holder. The table serves one term; `clear` drops everything.
//! - A queue is sorted by rank, most senior first. Each waiter is junior to the key's holder,
//!   or the holder's commit is in flight.
//! - Only a held key has waiters: a key that becomes free goes to its most senior waiter.
//! - Every ticket is answered exactly once, granted or not held, unless it still waits.
//! - Wait edges go from junior to senior, or to an owner whose commit is in flight, and such
//!   an owner waits for nothing. So the wait-for graph has no cycle.
//! - An owner whose commit is in flight loses its locks only by `release_owner` or `clear`.
//! - Bounded: [`MAX_EARLY_LOCKS_PER_SHARD`] locks, [`MAX_EARLY_LOCK_WAITERS_PER_KEY`] waiters
//!   per key, [`MAX_EARLY_LOCK_WAITERS_PER_SHARD`] waiters in all, as many wound flags as
//!   locks. An owner has an entry only while it holds or waits.
//!
//! # Not done yet
//! - The server (`meridian-server`'s `kv_early_lock`) keeps one table per shard and waits
//!   on the tickets. What a caller must take care of (from a review of this table):
//!   - A committing owner never expires. A caller that skips `end_commit` or `release_owner`
//!     after `begin_commit` leaves the keys locked until the next `clear`: an error return,
//!     a dropped handler or a timeout. The server's commit guard ends it on drop; there is
//!     no time backstop.
//!   - `committing` is one flag per owner, not a count. A resent commit in flight beside the
//!     first is not tracked apart.
//!   - `begin_commit`, `end_commit` and `release_owner` take no term.
//!   - A full queue refuses a senior newcomer rather than dropping its most junior waiter.
//!     One owner may take every lock.
//!   - When `cancel` finds the ticket already granted, it answers nothing. The caller must
//!     then take the grant from its channel.
//! - Exclusive point locks only: no range locks, no shared locks, no `SKIP LOCKED`.
//! - The limits live here, not in `meridian-types`' limits; the idle limit is a parameter.
//! - No fairness across priorities: a stream of high-priority owners can starve the others.

use crate::types::RequestId;
use bytes::Bytes;
use meridian_types::TxnRank;
use std::collections::{BTreeSet, HashMap};

/// The most keys one shard's table holds locked.
pub const MAX_EARLY_LOCKS_PER_SHARD: usize = 10_000;
/// The most waiters in one key's queue.
pub const MAX_EARLY_LOCK_WAITERS_PER_KEY: usize = 64;
/// The most waiters in one shard's table, over all its keys.
pub const MAX_EARLY_LOCK_WAITERS_PER_SHARD: usize = 1_024;

/// One wait in a key's queue, unique over the table's life (never reused after a clear).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TicketId(pub u64);

/// What [`EarlyLockTable::acquire`] did for one key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyOutcome {
    /// The key was free: the owner holds it now.
    Free,
    /// The owner held it already.
    Own,
    /// Taken from this junior holder, now flagged as wounded.
    Wound(RequestId),
    /// Queued; an [`Answer`] for the ticket comes from a later operation.
    Waiting(TicketId),
    /// Not held, and not waiting.
    NotHeld(NotHeld),
}

impl KeyOutcome {
    /// True if the owner holds the key now.
    pub fn is_held(self) -> bool {
        matches!(self, Self::Free | Self::Own | Self::Wound(_))
    }
}

/// Why a key is not held (at once, or at the end of a wait).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NotHeld {
    /// The key's queue, or the shard's waiters, at their limit.
    QueueFull,
    /// The shard holds [`MAX_EARLY_LOCKS_PER_SHARD`] locks already.
    TableFull,
    /// The request's term is not the table's (or the table is closed).
    StaleTerm,
    /// The owner's commit is in flight: it does not wait any more.
    Committing,
    /// The owner already waits for this key (under another ticket).
    AlreadyWaiting,
    /// The waiter gave up ([`EarlyLockTable::cancel`]).
    Cancelled,
    /// The owner released everything while this ticket waited.
    Released,
    /// The owner, or this wait, was idle too long ([`EarlyLockTable::expire`]).
    Expired,
    /// The table was cleared (leader or term change, transfer).
    Cleared,
}

/// How a wait ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TicketOutcome {
    /// The owner holds the key now.
    Granted,
    /// The wait is over without the lock.
    NotHeld(NotHeld),
}

/// The end of one wait, to deliver to whoever waits on `ticket`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Answer {
    /// The ticket [`KeyOutcome::Waiting`] handed out.
    pub ticket: TicketId,
    /// Its owner.
    pub owner: RequestId,
    /// Its key.
    pub key: Bytes,
    /// Granted or not.
    pub outcome: TicketOutcome,
}

impl Answer {
    fn new(ticket: TicketId, owner: RequestId, key: Bytes, outcome: TicketOutcome) -> Answer {
        Answer {
            ticket,
            owner,
            key,
            outcome,
        }
    }
}

/// The table's bounds (the constants; smaller in tests).
#[derive(Clone, Copy, Debug)]
struct Limits {
    locks: usize,
    per_key: usize,
    per_shard: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            locks: MAX_EARLY_LOCKS_PER_SHARD,
            per_key: MAX_EARLY_LOCK_WAITERS_PER_KEY,
            per_shard: MAX_EARLY_LOCK_WAITERS_PER_SHARD,
        }
    }
}

#[derive(Clone, Debug)]
struct Waiter {
    ticket: TicketId,
    owner: RequestId,
    rank: TxnRank,
}

#[derive(Debug)]
struct KeyState {
    holder: RequestId,
    /// Most senior first.
    queue: Vec<Waiter>,
}

#[derive(Debug)]
struct Ticket {
    owner: RequestId,
    key: Bytes,
    since: u64,
}

#[derive(Debug, Default)]
struct Owner {
    /// Its rank at its first acquire; kept while it has an entry.
    rank: TxnRank,
    held: BTreeSet<Bytes>,
    tickets: BTreeSet<TicketId>,
    /// Its idle clock: the last time it was heard from (never goes back).
    last_ms: u64,
    committing: bool,
}

/// One shard's early locks (see the module docs).
#[derive(Debug, Default)]
pub struct EarlyLockTable {
    /// `None`: closed, every acquire is refused.
    term: Option<u64>,
    limits: Limits,
    keys: HashMap<Bytes, KeyState>,
    owners: HashMap<RequestId, Owner>,
    tickets: HashMap<TicketId, Ticket>,
    /// Owners whose commit is not in flight, by idle clock.
    idle: BTreeSet<(u64, RequestId)>,
    /// Tickets by the time their wait began.
    waits: BTreeSet<(u64, TicketId)>,
    /// Wound flags not yet reported, with the time of the wound (and the same by time).
    wounded: HashMap<RequestId, u64>,
    wounded_by_age: BTreeSet<(u64, RequestId)>,
    next_ticket: u64,
}

fn senior(rank: TxnRank, me: RequestId, theirs: TxnRank, other: RequestId) -> bool {
    rank.is_senior_to((me.client_id, me.seq), theirs, (other.client_id, other.seq))
}

impl EarlyLockTable {
    /// A closed table (no term): every acquire is refused until [`EarlyLockTable::clear`].
    pub fn new() -> Self {
        Self::default()
    }

    #[cfg(test)]
    fn with_limits(limits: Limits) -> Self {
        EarlyLockTable {
            limits,
            ..Default::default()
        }
    }

    /// The term the table serves, `None` if closed.
    pub fn term(&self) -> Option<u64> {
        self.term
    }

    /// How many keys are locked (a metrics gauge).
    pub fn locks_held(&self) -> usize {
        self.keys.len()
    }

    /// How many tickets wait (a metrics gauge).
    pub fn waiters(&self) -> usize {
        self.tickets.len()
    }

    /// The holder of `key`, if any.
    pub fn holder(&self, key: &[u8]) -> Option<RequestId> {
        self.keys.get(key).map(|k| k.holder)
    }

    /// The keys `owner` holds, in key order.
    pub fn held(&self, owner: RequestId) -> Vec<Bytes> {
        self.owners
            .get(&owner)
            .map(|o| o.held.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// True if a senior took a lock of `owner` since its flag was last taken.
    pub fn is_wounded(&self, owner: RequestId) -> bool {
        self.wounded.contains_key(&owner)
    }

    /// [`EarlyLockTable::is_wounded`], clearing the flag (for the owner's next reply).
    pub fn take_wounded(&mut self, owner: RequestId) -> bool {
        match self.wounded.remove(&owner) {
            Some(at) => self.wounded_by_age.remove(&(at, owner)),
            None => false,
        }
    }

    /// Locks `keys` for `owner` in the order given, one [`KeyOutcome`] per key (see the
    /// module docs). Every key is refused if `term` is not the table's. An owner keeps the rank
    /// of its first acquire while it holds or waits. Resets the owner's idle clock. Call
    /// [`EarlyLockTable::expire`] first, so that an idle holder does not make anyone wait.
    pub fn acquire(
        &mut self,
        owner: RequestId,
        rank: TxnRank,
        keys: &[Bytes],
        now_ms: u64,
        term: u64,
    ) -> Vec<KeyOutcome> {
        if self.term != Some(term) {
            return vec![KeyOutcome::NotHeld(NotHeld::StaleTerm); keys.len()];
        }
        let rank = self.owners.get(&owner).map_or(rank, |o| o.rank);
        let outcomes = keys
            .iter()
            .map(|key| self.acquire_one(owner, rank, key, now_ms))
            .collect();
        self.touch(owner, now_ms);
        outcomes
    }

    fn acquire_one(
        &mut self,
        owner: RequestId,
        rank: TxnRank,
        key: &Bytes,
        now: u64,
    ) -> KeyOutcome {
        let Some(state) = self.keys.get_mut(key) else {
            if self.keys.len() >= self.limits.locks {
                return KeyOutcome::NotHeld(NotHeld::TableFull);
            }
            let state = KeyState {
                holder: owner,
                queue: Vec::new(),
            };
            self.keys.insert(key.clone(), state);
            self.owner_mut(owner, rank, now).held.insert(key.clone());
            return KeyOutcome::Free;
        };
        let holder = state.holder;
        if holder == owner {
            return KeyOutcome::Own;
        }
        if state.queue.iter().any(|w| w.owner == owner) {
            return KeyOutcome::NotHeld(NotHeld::AlreadyWaiting);
        }
        let theirs = self.owners.get(&holder).expect("a holder has an entry");
        if !theirs.committing && senior(rank, owner, theirs.rank, holder) {
            // Every waiter is junior to the holder, so to the requester too.
            state.holder = owner;
            let theirs = self.owners.get_mut(&holder).expect("a holder's entry");
            theirs.held.remove(key);
            self.forget_if_empty(holder);
            self.mark_wounded(holder, now);
            self.owner_mut(owner, rank, now).held.insert(key.clone());
            return KeyOutcome::Wound(holder);
        }
        if self.owners.get(&owner).is_some_and(|o| o.committing) {
            return KeyOutcome::NotHeld(NotHeld::Committing);
        }
        if state.queue.len() >= self.limits.per_key || self.tickets.len() >= self.limits.per_shard {
            return KeyOutcome::NotHeld(NotHeld::QueueFull);
        }
        let ticket = TicketId(self.next_ticket);
        self.next_ticket += 1;
        let at = state
            .queue
            .iter()
            .position(|w| senior(rank, owner, w.rank, w.owner))
            .unwrap_or(state.queue.len());
        let waiter = Waiter {
            ticket,
            owner,
            rank,
        };
        state.queue.insert(at, waiter);
        let (key, since) = (key.clone(), now);
        self.tickets.insert(ticket, Ticket { owner, key, since });
        self.waits.insert((since, ticket));
        self.owner_mut(owner, rank, now).tickets.insert(ticket);
        KeyOutcome::Waiting(ticket)
    }

    /// Ends the wait of `ticket` (its waiter gave up): answers it `Cancelled`, or nothing if
    /// it was answered already.
    pub fn cancel(&mut self, ticket: TicketId) -> Vec<Answer> {
        let mut answers = Vec::new();
        self.drop_ticket(ticket, NotHeld::Cancelled, &mut answers);
        answers
    }

    /// `owner`'s commit is in flight: its locks can no longer be wounded or expire, and its
    /// waits end (answered `Committing`). Resets its idle clock.
    pub fn begin_commit(&mut self, owner: RequestId, now_ms: u64) -> Vec<Answer> {
        let mut answers = Vec::new();
        let Some(o) = self.owners.get_mut(&owner) else {
            return answers;
        };
        self.idle.remove(&(o.last_ms, owner));
        o.committing = true;
        o.last_ms = o.last_ms.max(now_ms);
        let tickets: Vec<TicketId> = o.tickets.iter().copied().collect();
        for ticket in tickets {
            self.drop_ticket(ticket, NotHeld::Committing, &mut answers);
        }
        self.forget_if_empty(owner);
        answers
    }

    /// `owner`'s commit did not apply; it keeps its locks for a retry, with its idle clock
    /// reset. A waiter senior to it that waited only for the commit wounds it now.
    pub fn end_commit(&mut self, owner: RequestId, now_ms: u64) -> Vec<Answer> {
        let mut answers = Vec::new();
        let Some(o) = self.owners.get_mut(&owner) else {
            return answers;
        };
        if !o.committing {
            return answers;
        }
        o.committing = false;
        o.last_ms = o.last_ms.max(now_ms);
        self.idle.insert((o.last_ms, owner));
        let (rank, held) = (o.rank, o.held.clone());
        for key in held {
            let state = self.keys.get(&key).expect("a held key has a state");
            let head = state.queue.first();
            if head.is_some_and(|w| senior(w.rank, w.owner, rank, owner)) {
                let o = self.owners.get_mut(&owner).expect("owner");
                o.held.remove(&key);
                self.pass_on(&key, now_ms, &mut answers);
                self.mark_wounded(owner, now_ms);
            }
        }
        self.forget_if_empty(owner);
        answers
    }

    /// Drops everything `owner` holds (each key to its most senior waiter) and ends its
    /// waits (`Released`): after its commit applied, or `Kv.ReleaseLocks`. Forgets its
    /// wound flag.
    pub fn release_owner(&mut self, owner: RequestId, now_ms: u64) -> Vec<Answer> {
        let mut answers = Vec::new();
        self.release(owner, NotHeld::Released, now_ms, &mut answers);
        self.take_wounded(owner);
        answers
    }

    /// Ends every wait that began at least `idle_ms` ago and releases every owner (whose
    /// commit is not in flight) not heard from for `idle_ms`, both answered `Expired`; forgets
    /// wound flags as old. Cheap when nothing is due: the server may call it before each
    /// acquire as well as from its sweep.
    pub fn expire(&mut self, now_ms: u64, idle_ms: u64) -> Vec<Answer> {
        let due = |at: u64| at.saturating_add(idle_ms) <= now_ms;
        let mut answers = Vec::new();
        // Each loop takes its index entry out first, so it ends even if an entry were stale.
        while self.waits.first().is_some_and(|&(since, _)| due(since)) {
            let (_, ticket) = self.waits.pop_first().expect("a first entry");
            self.drop_ticket(ticket, NotHeld::Expired, &mut answers);
        }
        while self.idle.first().is_some_and(|&(last, _)| due(last)) {
            let (_, owner) = self.idle.pop_first().expect("a first entry");
            self.release(owner, NotHeld::Expired, now_ms, &mut answers);
        }
        while self.wounded_by_age.first().is_some_and(|&(at, _)| due(at)) {
            let (at, owner) = self.wounded_by_age.pop_first().expect("a first entry");
            if self.wounded.get(&owner) == Some(&at) {
                self.wounded.remove(&owner);
            }
        }
        answers
    }

    /// Drops everything and serves `new_term` from now on; every waiter is answered
    /// `Cleared`. A term below the one served is ignored (a late event of an older term must
    /// not undo a newer one).
    pub fn clear(&mut self, new_term: u64) -> Vec<Answer> {
        if self.term.is_some_and(|t| new_term < t) {
            return Vec::new();
        }
        self.reset(Some(new_term))
    }

    /// As [`EarlyLockTable::clear`], but serves no term until the next `clear` (the node
    /// stopped leading, or is handing leadership over).
    pub fn close(&mut self) -> Vec<Answer> {
        self.reset(None)
    }

    fn reset(&mut self, term: Option<u64>) -> Vec<Answer> {
        let mut tickets: Vec<(TicketId, Ticket)> = self.tickets.drain().collect();
        tickets.sort_by_key(|(ticket, _)| *ticket);
        let cleared = TicketOutcome::NotHeld(NotHeld::Cleared);
        let answers = tickets
            .into_iter()
            .map(|(ticket, t)| Answer::new(ticket, t.owner, t.key, cleared))
            .collect();
        let (limits, next_ticket) = (self.limits, self.next_ticket);
        *self = EarlyLockTable {
            term,
            limits,
            next_ticket,
            ..Default::default()
        };
        answers
    }

    /// `owner`'s entry, made (with `rank` and `now` as its idle clock) if it has none.
    fn owner_mut(&mut self, owner: RequestId, rank: TxnRank, now: u64) -> &mut Owner {
        if !self.owners.contains_key(&owner) {
            self.idle.insert((now, owner));
        }
        self.owners.entry(owner).or_insert_with(|| Owner {
            rank,
            last_ms: now,
            ..Owner::default()
        })
    }

    fn touch(&mut self, owner: RequestId, now: u64) {
        let Some(o) = self.owners.get_mut(&owner) else {
            return;
        };
        let last = o.last_ms.max(now);
        if !o.committing {
            self.idle.remove(&(o.last_ms, owner));
            self.idle.insert((last, owner));
        }
        o.last_ms = last;
    }

    fn forget_if_empty(&mut self, owner: RequestId) {
        if let Some(o) = self.owners.get(&owner) {
            if o.held.is_empty() && o.tickets.is_empty() {
                self.idle.remove(&(o.last_ms, owner));
                self.owners.remove(&owner);
            }
        }
    }

    fn mark_wounded(&mut self, owner: RequestId, now: u64) {
        if self.wounded.contains_key(&owner) {
            return;
        }
        if self.wounded.len() >= self.limits.locks {
            // Full: the oldest flag goes (a flag is a hint; the commit still finds out).
            if let Some((_, old)) = self.wounded_by_age.pop_first() {
                self.wounded.remove(&old);
            }
        }
        self.wounded.insert(owner, now);
        self.wounded_by_age.insert((now, owner));
    }

    fn drop_ticket(&mut self, ticket: TicketId, why: NotHeld, answers: &mut Vec<Answer>) {
        let Some(t) = self.tickets.remove(&ticket) else {
            return;
        };
        self.waits.remove(&(t.since, ticket));
        if let Some(state) = self.keys.get_mut(&t.key) {
            state.queue.retain(|w| w.ticket != ticket);
        }
        if let Some(o) = self.owners.get_mut(&t.owner) {
            o.tickets.remove(&ticket);
        }
        self.forget_if_empty(t.owner);
        answers.push(Answer::new(
            ticket,
            t.owner,
            t.key,
            TicketOutcome::NotHeld(why),
        ));
    }

    /// `key`'s holder has let it go (and no longer lists it): its most senior waiter gets it,
    /// or it is free.
    fn pass_on(&mut self, key: &Bytes, now: u64, answers: &mut Vec<Answer>) {
        let state = self.keys.get_mut(key).expect("a key passed on is held");
        if state.queue.is_empty() {
            self.keys.remove(key);
            return;
        }
        let w = state.queue.remove(0);
        state.holder = w.owner;
        let t = self.tickets.remove(&w.ticket).expect("a ticket");
        self.waits.remove(&(t.since, w.ticket));
        let o = self.owners.get_mut(&w.owner).expect("a waiter's entry");
        o.tickets.remove(&w.ticket);
        o.held.insert(key.clone());
        self.touch(w.owner, now);
        let (ticket, owner, key) = (w.ticket, w.owner, key.clone());
        answers.push(Answer::new(ticket, owner, key, TicketOutcome::Granted));
    }

    fn release(&mut self, owner: RequestId, why: NotHeld, now: u64, answers: &mut Vec<Answer>) {
        let Some(o) = self.owners.remove(&owner) else {
            return;
        };
        self.idle.remove(&(o.last_ms, owner));
        for ticket in o.tickets {
            self.drop_ticket(ticket, why, answers);
        }
        for key in o.held {
            self.pass_on(&key, now, answers);
        }
    }
}

#[cfg(test)]
#[path = "early_locks_model_tests.rs"]
mod model_tests;

#[cfg(test)]
#[path = "early_locks_tests.rs"]
mod tests;
