//! The FIFO wait queues and the hand-off: one queue per key, for every kind of lock; the
//! head is granted as soon as it fits, consecutive SHARED waiters together, permits of a
//! counted key in order, and nobody barges past the queue.

use std::collections::{HashMap, VecDeque};

use super::timeline::{bring_forward, drop_idle, OnAgenda, Task};
use super::{
    keys_in, mismatch, Engine, Event, Gate, Keyspace, NewHolder, QueueKey, Sched, Slot, WaiterId,
};
use crate::error::LockError;
use crate::lock::value::{check_family, Addr, Digest, Family, Mode};

/// A queued request.
#[derive(Debug)]
pub struct Wait<W> {
    pub id: WaiterId,
    pub mode: Mode,
    pub token: Vec<u8>,
    pub digest: Digest,
    pub ttl: u64,
    pub min_fence: u64,
    pub owner: Option<Box<[u8]>>,
    pub lock_delay: u32,
    pub client_id: u64,
    pub addr: Addr,
    /// The session the grant is to belong to.
    pub session: Option<Digest>,
    /// When it was queued, on the monotonic clock (µs).
    pub since: i64,
    /// The BLOCK deadline on the monotonic clock (None: waits without limit).
    pub deadline: Option<i64>,
    /// The lock moved to another server while this client waited (MIGRATE).
    pub moved: bool,
    /// The blocked client; None for a place held by a waiter for several keys at once
    /// (LOCK.ACQUIREALL: its client and its request are in `Engine::multi`, by `id`).
    pub handle: Option<W>,
}

/// The answer a blocked client gets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    Granted {
        token: Vec<u8>,
        fence: u64,
        /// Where and what, so that the shell can give the grant back if the client turns
        /// out to be gone before it hears of it.
        key: QueueKey,
        digest: Digest,
    },
    /// A waiter for several keys got all of them (LOCK.ACQUIREALL ... BLOCK).
    GrantedAll {
        token: Vec<u8>,
        /// In the order of `keys`.
        fences: Vec<u64>,
        keys: Vec<QueueKey>,
        digest: Digest,
    },
    /// The wait ended without the lock (BLOCK timeout, CLIENT UNBLOCK TIMEOUT).
    Nil,
    /// A watcher's answer: who holds the key now (nil: nobody).
    State(crate::reply::Reply<'static>),
    Failed(LockError),
}

pub(super) struct Queue<W> {
    pub waiters: VecDeque<Wait<W>>,
    /// When a service of this key is on the agenda.
    pub serve_at: Option<i64>,
}

impl<W> OnAgenda for Queue<W> {
    const TASK: fn(QueueKey) -> Task = Task::Serve;
    fn on_agenda(&mut self) -> (&mut Option<i64>, bool) {
        (&mut self.serve_at, self.waiters.is_empty())
    }
}

/// The queues of one db, by key name.
pub(super) type DbQueues<W> = HashMap<Box<[u8]>, Queue<W>>;

/// What the head of a queue can have now.
pub(super) enum Verdict {
    Grant,
    Renew,
    Wait,
    Fail(LockError),
    FailAll(LockError),
}

impl<W> Engine<W> {
    pub(super) fn queue(&self, db: i32, name: &[u8]) -> Option<&Queue<W>> {
        if self.by_id.is_empty() {
            return None;
        }
        self.queues.get(&db)?.get(name)
    }

    pub(super) fn queue_mut(&mut self, db: i32, name: &[u8]) -> Option<&mut Queue<W>> {
        self.queues.get_mut(&db)?.get_mut(name)
    }

    /// Clients queued on a key.
    pub fn queued(&self, db: i32, name: &[u8]) -> usize {
        self.queue(db, name).map_or(0, |q| q.waiters.len())
    }

    /// The first `n` waiters of a key, in queue order.
    pub(super) fn first_waiters(&self, db: i32, name: &[u8], n: usize) -> Vec<&Wait<W>> {
        self.queue(db, name)
            .map_or_else(Vec::new, |q| q.waiters.iter().take(n).collect())
    }

    /// µs the first waiter of a key has waited at `now` (0: nobody waits). The queue is
    /// in arrival order, so that is the key's longest wait.
    pub(super) fn longest_wait(&self, db: i32, name: &[u8], now: i64) -> i64 {
        self.queue(db, name)
            .and_then(|q| q.waiters.front())
            .map_or(0, |w| now.saturating_sub(w.since).max(0))
    }

    /// µs the longest-waiting client of any key has waited at `now` (0: nobody waits).
    pub fn longest_wait_anywhere(&self, now: i64) -> i64 {
        let first = self
            .queues
            .values()
            .flat_map(|db| db.values())
            .filter_map(|q| q.waiters.front())
            .map(|w| w.since)
            .min();
        first.map_or(0, |since| now.saturating_sub(since).max(0))
    }

    pub fn has_waiters(&self, db: i32, name: &[u8]) -> bool {
        self.queued(db, name) > 0
    }

    /// Every key of `db` (or of every db) that has waiters.
    pub fn keys_with_waiters(&self, db: Option<i32>) -> Vec<QueueKey> {
        keys_in(&self.queues, db)
    }

    /// The family the waiters of a key ask for (all of them share it).
    pub(super) fn queue_family(&self, db: i32, name: &[u8]) -> Option<Family> {
        self.queue(db, name)
            .and_then(|q| q.waiters.front())
            .map(|w| w.mode.family())
    }

    /// Puts the key's service on the agenda no later than `at`.
    pub(super) fn serve_by(&mut self, db: i32, name: &[u8], at: i64) {
        if let Some(q) = self.queues.get_mut(&db).and_then(|m| m.get_mut(name)) {
            bring_forward(&mut self.agenda, q, at, (db, name));
        }
    }

    /// Queues a blocked client; `serve_at`: when the key must be looked at again (a
    /// classic lock's expiry; a module lock's lease ends are in the lease index).
    pub(super) fn enqueue(&mut self, db: i32, name: &[u8], w: Wait<W>, serve_at: Option<i64>) {
        self.by_id.insert(w.id, (db, name.into()));
        if let Some(at) = w.deadline {
            self.agenda.insert((at, Task::Timeout(w.id)));
        }
        let q = self
            .queues
            .entry(db)
            .or_default()
            .entry(name.into())
            .or_insert_with(|| Queue {
                waiters: VecDeque::new(),
                serve_at: None,
            });
        q.waiters.push_back(w);
        if let Some(at) = serve_at {
            self.serve_by(db, name, at);
        }
    }

    /// Forgets a waiter that leaves its queue (answered, timed out, gone), and counts
    /// its wait (up to the engine's latest clock reading).
    fn forget(&mut self, w: &Wait<W>) {
        let waited = self.now.saturating_sub(w.since).max(0);
        self.stats.waited_us = self.stats.waited_us.saturating_add(waited as u64);
        self.by_id.remove(&w.id);
        if let Some(at) = w.deadline {
            self.agenda.remove(&(at, Task::Timeout(w.id)));
        }
    }

    /// Takes a waiter out of its queue (BLOCK timeout, disconnect, CLIENT UNBLOCK). If
    /// it was first in line, the next ones may be grantable now: the key is served soon.
    pub fn abandon(&mut self, id: WaiterId, now: i64) -> Option<W> {
        let Some((db, name)) = self.by_id.get(&id).cloned() else {
            return self.unwatch(id).map(|(w, _)| w);
        };
        self.now = self.now.max(now);
        let q = self.queue_mut(db, &name)?;
        let at = q.waiters.iter().position(|w| w.id == id)?;
        let w = q.waiters.remove(at)?;
        let more = !q.waiters.is_empty();
        self.forget(&w);
        if at == 0 && more {
            // The next in line may fit now (a writer gave up ahead of readers).
            self.serve_by(db, &name, now);
        }
        self.gc(db, &name);
        match w.handle {
            Some(h) => Some(h),
            None => self.abandon_multi(id, now),
        }
    }

    /// A BLOCK deadline passed (or CLIENT UNBLOCK TIMEOUT): the waiter leaves with nil.
    pub fn timed_out(&mut self, id: WaiterId, now: i64) -> Option<W> {
        if !self.by_id.contains_key(&id) {
            return None;
        }
        let w = self.abandon(id, now)?;
        self.stats.wait_timeouts += 1;
        Some(w)
    }

    /// MIGRATE moved the lock of this key to another server: its current waiters will be
    /// told so instead of being granted here.
    pub(super) fn mark_moved(&mut self, db: i32, name: &[u8]) {
        if let Some(q) = self.queue_mut(db, name) {
            q.waiters.iter_mut().for_each(|w| w.moved = true);
        }
    }

    /// The keys for which `moved` holds left this server with their slot (Valkey's atomic
    /// slot migration gave them to another node): their waiters are told so (LOCKMOVED)
    /// now, never granted here, and their watchers at a look that comes now; the sessions
    /// that held a lock there lost it (no longer kept alive here).
    pub fn moved_away<S: Sched<Waiter = W>>(
        &mut self,
        sched: &mut S,
        moved: impl Fn(&[u8]) -> bool,
        now: i64,
    ) {
        self.now = self.now.max(now);
        self.sessions_moved_away(&moved);
        for (db, name) in self.keys_with_waiters(None) {
            if moved(&name) {
                self.fail_waiters(sched, db, &name, &LockError::Moved, false);
            }
        }
        for (db, name) in self.watched_keys(None) {
            if moved(&name) {
                self.mark_watch_moved(db, &name);
                self.note(db, &name, now);
            }
        }
    }

    pub(super) fn pop_front(&mut self, db: i32, name: &[u8]) -> Option<Wait<W>> {
        let w = self.queue_mut(db, name)?.waiters.pop_front()?;
        self.forget(&w);
        Some(w)
    }

    /// Drops an empty queue and its pending service.
    pub(super) fn gc(&mut self, db: i32, name: &[u8]) {
        drop_idle(&mut self.queues, &mut self.agenda, (db, name));
    }

    /// Fails every waiter of a key with `err` (or those marked moved, with `moved_only`).
    fn fail_waiters<S: Sched<Waiter = W>>(
        &mut self,
        sched: &mut S,
        db: i32,
        name: &[u8],
        err: &LockError,
        moved_only: bool,
    ) {
        let Some(q) = self.queue_mut(db, name) else {
            return;
        };
        let (out, keep): (VecDeque<_>, VecDeque<_>) =
            q.waiters.drain(..).partition(|w| !moved_only || w.moved);
        q.waiters = keep;
        for w in out {
            self.forget(&w);
            match w.handle {
                Some(h) => sched.answer(h, Answer::Failed(err.clone())),
                None => self.fail_multi(sched, w.id, err),
            }
        }
        self.gc(db, name);
    }

    pub(super) fn verdict(&self, ks: &mut impl Keyspace, head: (Mode, &Digest)) -> Verdict {
        let now = ks.clock().mono;
        let (want, digest) = head;
        match ks.read() {
            Err(e @ LockError::WrongType) => Verdict::FailAll(e),
            Err(e) => Verdict::Fail(e),
            Ok(Slot::Classic(_)) if matches!(want, Mode::Counted(_)) => {
                Verdict::Fail(LockError::WrongMode)
            }
            Ok(Slot::Classic(_)) => Verdict::Wait,
            Ok(Slot::Free) => Verdict::Grant,
            Ok(Slot::Lock(v)) => {
                if v.find(digest).is_some() {
                    return Verdict::Renew;
                }
                if v.is_empty() {
                    // A lock-delay runs (the waiters share one family already).
                    return if v.admits(want, now) {
                        Verdict::Grant
                    } else {
                        Verdict::Wait
                    };
                }
                match check_family(v.mode().family(), want) {
                    Err(m) => Verdict::Fail(mismatch(m)),
                    Ok(()) if v.admits(want, now) => Verdict::Grant,
                    Ok(()) => Verdict::Wait,
                }
            }
        }
    }

    /// The one place that hands a lock over: grants it to the head of the queue, and to
    /// as many after it as fit (readers after readers, permits while free), in order. A
    /// waiter whose token already holds the key is answered with that holder's grant,
    /// renewed. Only writes when the gate is open; otherwise the key is served later.
    pub fn serve<S: Sched<Waiter = W>>(&mut self, ks: &mut impl Keyspace, sched: &mut S) {
        let (db, name) = (ks.db(), super::Name::of(ks.name()));
        if !self.has_waiters(db, &name) {
            return;
        }
        let now = ks.clock().mono;
        self.now = self.now.max(now);
        match ks.gate() {
            Gate::Now => self.restore_pending(ks),
            Gate::Later => return self.serve_by(db, &name, now.saturating_add(super::RETRY_US)),
            Gate::NotHere => {
                return self.fail_waiters(sched, db, &name, &LockError::TryAgain, false)
            }
            Gate::Replica => {
                return self.fail_waiters(sched, db, &name, &LockError::Unblocked, false)
            }
        }
        self.fail_waiters(sched, db, &name, &LockError::Moved, true);
        if let Err(e) = self.reap(ks) {
            return self.fail_waiters(sched, db, &name, &e, false);
        }
        while let Some(head) = self.queue(db, &name).and_then(|q| q.waiters.front()) {
            if head.deadline.is_some_and(|d| d <= now) {
                // Its BLOCK time ran out while the server was busy, before the timer
                // could answer it: it leaves with nil, as the timer would have answered.
                if let Some(w) = self.pop_front(db, &name) {
                    self.stats.wait_timeouts += 1;
                    match w.handle {
                        Some(h) => sched.answer(h, Answer::Nil),
                        None => self.fail_multi_nil(sched, w.id),
                    }
                }
                continue;
            }
            if head.handle.is_none() {
                // A waiter for several keys: it is served where they can all be opened,
                // once it is first in line on each of them.
                let id = head.id;
                self.agenda.insert((now, Task::ServeMulti(id)));
                break;
            }
            let verdict = self.verdict(ks, (head.mode, &head.digest));
            let w = match verdict {
                Verdict::Wait => break,
                Verdict::FailAll(e) => return self.fail_waiters(sched, db, &name, &e, false),
                _ => match self.pop_front(db, &name) {
                    Some(w) => w,
                    None => break,
                },
            };
            let granted = match verdict {
                Verdict::Fail(e) => Err(e),
                Verdict::Renew => self
                    .renew(
                        ks,
                        &w.digest,
                        w.mode,
                        w.ttl,
                        w.min_fence,
                        w.session.as_ref(),
                    )
                    .and_then(|f| f.ok_or(LockError::Internal("lock.acquire")))
                    .inspect(|_| self.stats.renewed += 1),
                _ => self.grant(
                    ks,
                    NewHolder {
                        mode: w.mode,
                        digest: w.digest,
                        ttl: w.ttl,
                        min_fence: w.min_fence,
                        owner: w.owner.as_deref(),
                        lock_delay: w.lock_delay,
                        client_id: w.client_id,
                        addr: &w.addr,
                        session: w.session,
                    },
                ),
            };
            match granted {
                Ok(fence) => {
                    self.stats.handed_off += 1;
                    ks.changed(Event::Handoff);
                    let answer = Answer::Granted {
                        token: w.token,
                        fence,
                        key: (db, Box::from(&*name)),
                        digest: w.digest,
                    };
                    if let Some(h) = w.handle {
                        sched.answer(h, answer);
                    }
                }
                Err(e) => {
                    if let Some(h) = w.handle {
                        sched.answer(h, Answer::Failed(e));
                    }
                }
            }
        }
        // A classic string lock is looked at again when its own expiry passes (the
        // leases of module locks are in the lease index).
        if let Ok(Slot::Classic(Some(at))) = ks.read() {
            let at = ks.clock().from_wall(at).saturating_add(1000);
            self.serve_by(db, &name, at);
        }
        self.gc(db, &name);
    }
}
