//! The naive model the early lock table is checked against (`early_locks_model_tests`):
//! plain lists, each question answered by a scan.

use super::*;

#[derive(Clone, Debug)]
pub(super) struct MOwner {
    pub(super) id: RequestId,
    pub(super) rank: TxnRank,
    pub(super) last_ms: u64,
    pub(super) committing: bool,
}

#[derive(Clone, Debug)]
pub(super) struct MWait {
    pub(super) ticket: TicketId,
    pub(super) owner: RequestId,
    pub(super) key: Bytes,
    pub(super) since: u64,
}

/// The naive model: plain lists, each question answered by a scan.
#[derive(Debug, Default)]
pub(super) struct Model {
    pub(super) term: Option<u64>,
    pub(super) limits: Option<Limits>,
    pub(super) locks: Vec<(Bytes, RequestId)>,
    pub(super) waits: Vec<MWait>,
    pub(super) owners: Vec<MOwner>,
    pub(super) wounded: Vec<(u64, RequestId)>,
    pub(super) next_ticket: u64,
}

/// A key, its holder and its waiters (ticket, owner), most senior first.
type KeyView = (Bytes, RequestId, Vec<(TicketId, RequestId)>);

/// Everything the table's behaviour depends on, in one shape for both: per key its holder
/// and its waiters (most senior first); per owner its rank, idle clock and commit; the flags.
#[derive(Debug, PartialEq)]
pub(super) struct View {
    pub(super) term: Option<u64>,
    pub(super) keys: Vec<KeyView>,
    pub(super) owners: Vec<(RequestId, TxnRank, u64, bool)>,
    pub(super) wounded: Vec<(u64, RequestId)>,
}

pub(super) fn view_of(t: &EarlyLockTable) -> View {
    let queue = |k: &KeyState| k.queue.iter().map(|w| (w.ticket, w.owner)).collect();
    let mut keys: Vec<_> = t
        .keys
        .iter()
        .map(|(k, s)| (k.clone(), s.holder, queue(s)))
        .collect();
    keys.sort_by(|a, b| a.0.cmp(&b.0));
    let owner = |(id, o): (&RequestId, &Owner)| (*id, o.rank, o.last_ms, o.committing);
    let mut owners: Vec<_> = t.owners.iter().map(owner).collect();
    owners.sort_by_key(|o| o.0);
    let mut wounded: Vec<_> = t.wounded.iter().map(|(o, at)| (*at, *o)).collect();
    wounded.sort();
    View {
        term: t.term,
        keys,
        owners,
        wounded,
    }
}

impl Model {
    pub(super) fn view(&self) -> View {
        let mut keys = Vec::new();
        for (key, holder) in &self.locks {
            let mut queue: Vec<&MWait> = self.waits.iter().filter(|w| w.key == *key).collect();
            queue.sort_by(|a, b| self.by_rank(a.owner, b.owner));
            keys.push((
                key.clone(),
                *holder,
                queue.iter().map(|w| (w.ticket, w.owner)).collect(),
            ));
        }
        keys.sort_by(|a, b| a.0.cmp(&b.0));
        let mut owners: Vec<_> = self
            .owners
            .iter()
            .map(|o| (o.id, o.rank, o.last_ms, o.committing))
            .collect();
        owners.sort_by_key(|o| o.0);
        let mut wounded = self.wounded.clone();
        wounded.sort();
        View {
            term: self.term,
            keys,
            owners,
            wounded,
        }
    }
    pub(super) fn by_rank(&self, a: RequestId, b: RequestId) -> Ordering {
        if senior(self.rank(a), a, self.rank(b), b) {
            Ordering::Less
        } else if senior(self.rank(b), b, self.rank(a), a) {
            Ordering::Greater
        } else {
            Ordering::Equal
        }
    }
    pub(super) fn limits(&self) -> Limits {
        self.limits.expect("set")
    }
    pub(super) fn holder(&self, key: &[u8]) -> Option<RequestId> {
        self.locks.iter().find(|(k, _)| k == key).map(|(_, h)| *h)
    }
    pub(super) fn owner(&mut self, id: RequestId) -> Option<&mut MOwner> {
        self.owners.iter_mut().find(|o| o.id == id)
    }
    pub(super) fn rank(&self, id: RequestId) -> TxnRank {
        self.owners.iter().find(|o| o.id == id).expect("known").rank
    }
    pub(super) fn ensure_owner(&mut self, id: RequestId, rank: TxnRank, last_ms: u64) {
        if self.owner(id).is_none() {
            let committing = false;
            self.owners.push(MOwner {
                id,
                rank,
                last_ms,
                committing,
            });
        }
    }
    pub(super) fn held_by(&self, id: RequestId) -> Vec<Bytes> {
        self.locks
            .iter()
            .filter(|l| l.1 == id)
            .map(|l| l.0.clone())
            .collect()
    }
    pub(super) fn tickets_of(&self, id: RequestId) -> Vec<TicketId> {
        self.waits
            .iter()
            .filter(|w| w.owner == id)
            .map(|w| w.ticket)
            .collect()
    }
    pub(super) fn touch(&mut self, id: RequestId, now: u64) {
        if let Some(o) = self.owner(id) {
            o.last_ms = o.last_ms.max(now);
        }
    }
    /// Owners that neither hold nor wait are forgotten (at the end of every operation).
    pub(super) fn gc(&mut self) {
        let (locks, waits) = (&self.locks, &self.waits);
        let known = |id| locks.iter().any(|l| l.1 == id) || waits.iter().any(|w| w.owner == id);
        self.owners.retain(|o| known(o.id));
    }
    pub(super) fn wound(&mut self, id: RequestId, now: u64) {
        if self.wounded.iter().any(|(_, o)| *o == id) {
            return;
        }
        if self.wounded.len() >= self.limits().locks {
            let oldest = *self.wounded.iter().min().expect("full");
            self.wounded.retain(|w| *w != oldest);
        }
        self.wounded.push((now, id));
    }
    pub(super) fn take_wounded(&mut self, id: RequestId) -> bool {
        let before = self.wounded.len();
        self.wounded.retain(|(_, o)| *o != id);
        before != self.wounded.len()
    }
    pub(super) fn drop_wait(&mut self, ticket: TicketId, why: NotHeld, answers: &mut Vec<Answer>) {
        if let Some(i) = self.waits.iter().position(|w| w.ticket == ticket) {
            let w = self.waits.remove(i);
            answers.push(Answer::new(
                ticket,
                w.owner,
                w.key,
                TicketOutcome::NotHeld(why),
            ));
        }
    }
    /// The key's holder let it go: the most senior waiter (found by a scan) gets it, or it is
    /// free.
    pub(super) fn grant(&mut self, key: &Bytes, now: u64, answers: &mut Vec<Answer>) {
        let on_key = self.waits.iter().enumerate().filter(|(_, w)| w.key == *key);
        let best = on_key
            .min_by(|(_, a), (_, b)| self.by_rank(a.owner, b.owner))
            .map(|(i, _)| i);
        let Some(i) = best else {
            self.locks.retain(|(k, _)| k != key);
            return;
        };
        let w = self.waits.remove(i);
        for lock in self.locks.iter_mut().filter(|(k, _)| k == key) {
            lock.1 = w.owner;
        }
        self.touch(w.owner, now);
        answers.push(Answer::new(
            w.ticket,
            w.owner,
            w.key,
            TicketOutcome::Granted,
        ));
    }
    pub(super) fn release(
        &mut self,
        id: RequestId,
        why: NotHeld,
        now: u64,
        answers: &mut Vec<Answer>,
    ) {
        if self.owner(id).is_none() {
            return;
        }
        for ticket in self.tickets_of(id) {
            self.drop_wait(ticket, why, answers);
        }
        self.owners.retain(|o| o.id != id);
        for key in self.held_by(id) {
            self.grant(&key, now, answers);
        }
    }

    pub(super) fn acquire(
        &mut self,
        id: RequestId,
        rank: TxnRank,
        keys: &[Bytes],
        now: u64,
        term: u64,
    ) -> Vec<KeyOutcome> {
        if self.term != Some(term) {
            return vec![KeyOutcome::NotHeld(NotHeld::StaleTerm); keys.len()];
        }
        let rank = self.owner(id).map_or(rank, |o| o.rank);
        let out = keys
            .iter()
            .map(|key| self.acquire_one(id, rank, key, now))
            .collect();
        self.touch(id, now);
        self.gc();
        out
    }
    pub(super) fn acquire_one(
        &mut self,
        id: RequestId,
        rank: TxnRank,
        key: &Bytes,
        now: u64,
    ) -> KeyOutcome {
        let Some(holder) = self.holder(key) else {
            if self.locks.len() >= self.limits().locks {
                return KeyOutcome::NotHeld(NotHeld::TableFull);
            }
            self.locks.push((key.clone(), id));
            self.ensure_owner(id, rank, now);
            return KeyOutcome::Free;
        };
        if holder == id {
            return KeyOutcome::Own;
        }
        if self.waits.iter().any(|w| w.owner == id && w.key == *key) {
            return KeyOutcome::NotHeld(NotHeld::AlreadyWaiting);
        }
        let theirs = self.owner(holder).expect("holder").clone();
        if !theirs.committing && senior(rank, id, theirs.rank, holder) {
            for lock in self.locks.iter_mut().filter(|(k, _)| k == key) {
                lock.1 = id;
            }
            self.ensure_owner(id, rank, now);
            self.wound(holder, now);
            return KeyOutcome::Wound(holder);
        }
        if self.owner(id).is_some_and(|o| o.committing) {
            return KeyOutcome::NotHeld(NotHeld::Committing);
        }
        let on_key = self.waits.iter().filter(|w| w.key == *key).count();
        if on_key >= self.limits().per_key || self.waits.len() >= self.limits().per_shard {
            return KeyOutcome::NotHeld(NotHeld::QueueFull);
        }
        let ticket = TicketId(self.next_ticket);
        self.next_ticket += 1;
        self.ensure_owner(id, rank, now);
        let (owner, key, since) = (id, key.clone(), now);
        self.waits.push(MWait {
            ticket,
            owner,
            key,
            since,
        });
        KeyOutcome::Waiting(ticket)
    }

    pub(super) fn cancel(&mut self, ticket: TicketId) -> Vec<Answer> {
        let mut answers = Vec::new();
        self.drop_wait(ticket, NotHeld::Cancelled, &mut answers);
        self.gc();
        answers
    }

    pub(super) fn begin_commit(&mut self, id: RequestId, now: u64) -> Vec<Answer> {
        let mut answers = Vec::new();
        let Some(o) = self.owner(id) else {
            return answers;
        };
        o.committing = true;
        o.last_ms = o.last_ms.max(now);
        for ticket in self.tickets_of(id) {
            self.drop_wait(ticket, NotHeld::Committing, &mut answers);
        }
        self.gc();
        answers
    }

    pub(super) fn end_commit(&mut self, id: RequestId, now: u64) -> Vec<Answer> {
        let mut answers = Vec::new();
        let Some(o) = self.owner(id).filter(|o| o.committing) else {
            return answers;
        };
        o.committing = false;
        o.last_ms = o.last_ms.max(now);
        for key in self.held_by(id) {
            let mut on_key = self.waits.iter().filter(|w| w.key == key);
            if on_key.any(|w| self.by_rank(w.owner, id) == Ordering::Less) {
                self.grant(&key, now, &mut answers);
                self.wound(id, now);
            }
        }
        self.gc();
        answers
    }

    pub(super) fn release_owner(&mut self, id: RequestId, now: u64) -> Vec<Answer> {
        let mut answers = Vec::new();
        self.release(id, NotHeld::Released, now, &mut answers);
        self.take_wounded(id);
        self.gc();
        answers
    }

    pub(super) fn expire(&mut self, now: u64, idle: u64) -> Vec<Answer> {
        let due = |at: u64| at + idle <= now;
        let mut answers = Vec::new();
        let old: Vec<TicketId> = self
            .waits
            .iter()
            .filter(|w| due(w.since))
            .map(|w| w.ticket)
            .collect();
        for ticket in old {
            self.drop_wait(ticket, NotHeld::Expired, &mut answers);
        }
        self.gc();
        // One at a time, the longest idle first: a release may grant, and so wake, another.
        let next = |m: &Model| {
            let idle = m.owners.iter().filter(|o| !o.committing && due(o.last_ms));
            idle.min_by_key(|o| (o.last_ms, o.id)).map(|o| o.id)
        };
        while let Some(id) = next(self) {
            self.release(id, NotHeld::Expired, now, &mut answers);
        }
        self.wounded.retain(|(at, _)| !due(*at));
        self.gc();
        answers
    }

    pub(super) fn reset(&mut self, term: Option<u64>) -> Vec<Answer> {
        let cleared = TicketOutcome::NotHeld(NotHeld::Cleared);
        let waits = std::mem::take(&mut self.waits).into_iter();
        let answers = waits
            .map(|w| Answer::new(w.ticket, w.owner, w.key, cleared))
            .collect();
        let (limits, next_ticket) = (self.limits, self.next_ticket);
        *self = Model {
            term,
            limits,
            next_ticket,
            ..Model::default()
        };
        answers
    }
}
