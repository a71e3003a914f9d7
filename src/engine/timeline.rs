//! Time: what falls due on the monotonic clock, and what the server tells the engine.
//!
//! The engine keeps its own agenda (services of a queue, BLOCK deadlines, grants to give
//! back) and its lease index (every lock key by its earliest lease end). The shell only
//! wakes it ([`Sched::wake_at`]) and calls [`Engine::tick`]; neither a timer nor a wall
//! clock decides when a lease ends.

use super::{Answer, Gate};
use super::{Engine, Keyspace, QueueKey, Sched, Slot, Store, WaiterId, RETRY_US};
use crate::lock::codec::repl::Change;
use crate::lock::value::{Digest, LockValue};

/// Work on the agenda.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Task {
    /// Put back a held lock the server evicted (first of the tasks due at one instant:
    /// the key's queue and watchers see it back).
    Restore(QueueKey),
    /// Look at a key's queue.
    Serve(QueueKey),
    /// A waiter's BLOCK deadline.
    Timeout(WaiterId),
    /// Give back a grant whose client left before it heard of it.
    Revoke(QueueKey, Digest),
    /// Look at a key's watchers.
    Look(QueueKey),
    /// A session's lease (or its bound connection's grace period) ends.
    SessionEnd(crate::lock::value::Digest),
    /// A waiter for several keys is first in line on one of them: maybe on all.
    ServeMulti(WaiterId),
    /// Nothing: only a wake-up (more leases are due than one tick handles, or a write
    /// waits for the gate).
    Wake,
}

/// How many due leases one tick handles at most (the rest go to the next tick, so that a
/// burst of ending leases never stalls the server).
const LEASES_PER_TICK: usize = 1000;

/// A key's entry with one task on the agenda: its queue (the service) or its watch list
/// (a look at the watchers).
pub(super) trait OnAgenda {
    /// The entry's task for a key.
    const TASK: fn(QueueKey) -> Task;
    /// When the task stands on the agenda (`None`: it does not), and whether nobody is
    /// left on the entry.
    fn on_agenda(&mut self) -> (&mut Option<i64>, bool);
}

/// Moves an entry's task on the agenda to `at` unless it already stands no later.
pub(super) fn bring_forward<V: OnAgenda>(
    agenda: &mut std::collections::BTreeSet<(i64, Task)>,
    entry: &mut V,
    at: i64,
    (db, name): (i32, &[u8]),
) {
    let task = V::TASK;
    let (slot, _) = entry.on_agenda();
    if slot.is_some_and(|t| t <= at) {
        return;
    }
    let key: QueueKey = (db, name.into());
    if let Some(t) = slot.replace(at) {
        agenda.remove(&(t, task(key.clone())));
    }
    agenda.insert((at, task(key)));
}

/// Drops a key's entry once nobody is left on it, with its task on the agenda, and the
/// db's map once that is empty.
pub(super) fn drop_idle<V: OnAgenda>(
    dbs: &mut std::collections::HashMap<i32, std::collections::HashMap<Box<[u8]>, V>>,
    agenda: &mut std::collections::BTreeSet<(i64, Task)>,
    (db, name): (i32, &[u8]),
) {
    let Some(m) = dbs.get_mut(&db) else {
        return;
    };
    if m.get_mut(name).is_some_and(|v| v.on_agenda().1) {
        if let Some(t) = m.remove(name).and_then(|mut v| *v.on_agenda().0) {
            agenda.remove(&(t, V::TASK((db, name.into()))));
        }
        if m.is_empty() {
            dbs.remove(&db);
        }
    }
}

impl<W> Engine<W> {
    /// The earliest instant the engine has work for.
    pub fn next_due(&self) -> Option<i64> {
        let agenda = self.agenda.first().map(|(t, _)| *t);
        let leases = if self.leases_paused {
            None
        } else {
            self.leases.first_at()
        };
        [agenda, leases].into_iter().flatten().min()
    }

    pub(super) fn request_wake<S: Sched<Waiter = W>>(&self, sched: &mut S) {
        if let Some(at) = self.next_due() {
            sched.wake_at(at);
        }
    }

    /// Does everything due by now: agenda tasks first, then ending leases.
    pub fn tick<St: Store, S: Sched<Waiter = W>>(&mut self, store: &mut St, sched: &mut S) {
        let now = store.clock().mono;
        self.now = self.now.max(now);
        self.send_session_marks(store);
        while let Some((at, _)) = self.agenda.first() {
            if *at > now {
                break;
            }
            let Some((_, task)) = self.agenda.pop_first() else {
                break;
            };
            self.run(task, store, sched, now);
        }
        self.sweep(store, sched, now);
        self.leases.settle_hint();
        self.request_wake(sched);
    }

    fn run<St: Store, S: Sched<Waiter = W>>(
        &mut self,
        task: Task,
        store: &mut St,
        sched: &mut S,
        now: i64,
    ) {
        match task {
            Task::Restore((db, name)) => {
                if let Some(mut ks) = store.open(db, &name) {
                    self.restore_pending(&mut ks);
                }
                if self.restoring.contains_key(&(db, name.clone())) {
                    self.agenda
                        .insert((now.saturating_add(RETRY_US), Task::Restore((db, name))));
                }
            }
            Task::Serve((db, name)) => {
                if let Some(q) = self.queue_mut(db, &name) {
                    q.serve_at = None;
                }
                if let Some(mut ks) = store.open(db, &name) {
                    self.serve(&mut ks, sched);
                }
                self.note(db, &name, now);
            }
            Task::Look((db, name)) => match store.open(db, &name) {
                Some(mut ks) => self.look(&mut ks, sched),
                None => {
                    for w in self.take_watchers(db, &name) {
                        sched.answer(w, Answer::Nil);
                    }
                }
            },
            Task::Timeout(id) => {
                if let Some(w) = self.timed_out(id, now) {
                    sched.answer(w, Answer::Nil);
                } else if let Some((db, name)) = self.watch_key(id) {
                    match store.open(db, &name) {
                        Some(mut ks) => self.watch_timed_out(&mut ks, id, sched),
                        None => {
                            if let Some((w, _)) = self.unwatch(id) {
                                sched.answer(w, Answer::Nil);
                            }
                        }
                    }
                }
            }
            Task::Wake => {}
            Task::SessionEnd(d) => self.session_due(store, sched, &d, now),
            Task::ServeMulti(id) => self.serve_multi(store, sched, id, now),
            Task::Revoke((db, name), d) => {
                let Some(mut ks) = store.open(db, &name) else {
                    return;
                };
                match ks.gate() {
                    Gate::Now => {
                        let _ =
                            self.release_and_serve(&mut ks, sched, super::Which::Digest(&d), false);
                        self.note(db, &name, now);
                    }
                    Gate::Later => {
                        self.agenda
                            .insert((now.saturating_add(RETRY_US), Task::Revoke((db, name), d)));
                    }
                    // A replica or a node that lost the slot: the new owner decides.
                    Gate::Replica | Gate::NotHere => {}
                }
            }
        }
    }

    /// Ends the leases that are over: reaps their keys and serves their queues.
    fn sweep<St: Store, S: Sched<Waiter = W>>(&mut self, store: &mut St, sched: &mut S, now: i64) {
        for _ in 0..LEASES_PER_TICK {
            if self.leases_paused {
                return;
            }
            let Some(entry) = self.leases.pop_due(now) else {
                return;
            };
            let (db, name) = (&entry.db, &entry.name);
            let Some(mut ks) = store.open(*db, name) else {
                continue;
            };
            match ks.gate() {
                Gate::Now => {}
                Gate::Later => {
                    self.leases.put_back(entry);
                    self.agenda
                        .insert((now.saturating_add(RETRY_US), Task::Wake));
                    return;
                }
                Gate::Replica => {
                    self.leases.put_back(entry);
                    self.leases_paused = true;
                    return;
                }
                Gate::NotHere => {
                    self.serve(&mut ks, sched);
                    continue;
                }
            }
            if self.has_waiters(*db, name) {
                self.serve(&mut ks, sched);
            } else {
                let _ = self.reap(&mut ks);
            }
            self.note(*db, name, now);
            // The entry may have been stale (the value changed where the engine could not
            // see it, say RENAMEd here): track what the key holds now.
            if let Ok(Slot::Lock(v)) = ks.read() {
                if let Some(at) = v.next_lease_end() {
                    self.leases.insert(at, *db, name, now);
                }
            }
        }
        // More are due than one tick handles: the next tick comes at once.
        if self.leases.first_at().is_some_and(|at| at <= now) {
            self.agenda.insert((now, Task::Wake));
        }
    }

    // ---- what the server tells the engine -------------------------------------------------

    /// A key changed behind the engine's back: its queue is served soon.
    pub fn touched(&mut self, db: i32, name: &[u8], now: i64) {
        self.serve_by(db, name, now);
        self.note(db, name, now);
    }

    /// A lock value left the keyspace by the server's hand (DEL, UNLINK, eviction, an
    /// overwrite, RENAME or MOVE away, MIGRATE when `moved`). `value` is what it held:
    /// when it moved, the sessions of its holders lost a lock here.
    pub fn unlinked(&mut self, db: i32, name: &[u8], value: &LockValue, moved: bool, now: i64) {
        self.now = self.now.max(now);
        if let Some(at) = value.next_lease_end() {
            self.leases.remove(at, db, name);
        }
        self.stats.removed += 1;
        if moved {
            self.mark_moved(db, name);
            self.mark_watch_moved(db, name);
            for h in value.iter() {
                if let Some(d) = h.session() {
                    self.session_lost_lock(d);
                }
            }
        }
        self.serve_by(db, name, now);
        self.note(db, name, now);
        // RENAME and MOVE unlink the value here after adding it under its new name.
        self.note_held(now);
    }

    /// The server evicted the held lock `value` of `name` while grants are refused for
    /// the eviction policy: it is put back at once, with its holders, fences and leases,
    /// so that nobody else is granted it while its holder works (the eviction reached the
    /// replicas and the AOF as a DEL; the restore reaches them as the holders' ADDs).
    pub fn restore_later(&mut self, db: i32, name: &[u8], value: LockValue) {
        let key: QueueKey = (db, name.into());
        self.restoring.insert(key.clone(), value);
        self.agenda.insert((0, Task::Restore(key)));
    }

    /// Puts back the evicted lock of this key, if one waits for it and the engine may
    /// write the key now (not from a command that only reads it: that may run while
    /// writes are paused, on a replica, in a read-only script). Nothing is put back over
    /// a key something else has taken meanwhile.
    pub(super) fn restore_pending(&mut self, ks: &mut impl Keyspace) {
        if self.restoring.is_empty() {
            return;
        }
        let key: QueueKey = (ks.db(), ks.name().into());
        if !self.restoring.contains_key(&key) {
            return;
        }
        match ks.gate() {
            Gate::Now => {}
            // Writes paused, loading: the next tick tries again.
            Gate::Later => return,
            // A replica (its primary decides) or a node that no longer serves the key:
            // nothing to put back here.
            Gate::Replica | Gate::NotHere => {
                self.restoring.remove(&key);
                return;
            }
        }
        let Some(v) = self.restoring.remove(&key) else {
            return;
        };
        if !matches!(ks.read(), Ok(Slot::Free)) {
            return;
        }
        let (mode, holders) = (v.mode(), v.iter().cloned().collect::<Vec<_>>());
        let (due, delay) = (v.next_lease_end(), v.delay_until());
        if ks.put(v).is_err() {
            return;
        }
        for holder in &holders {
            ks.replicate(Change::Add {
                mode,
                holder,
                floor: 0,
            });
        }
        // A shared or counted lock can hold a lock-delay beside its holders.
        if let Some(until) = delay {
            ks.replicate(Change::Delay { until });
        }
        self.reindex(key.0, &key.1, None, due.or(delay));
        self.stats.restored += 1;
    }

    /// `ks` as what reads it should see: the evicted lock that waits to be put back, if
    /// the key is still empty (its holders still hold it).
    pub(super) fn kept<'k, K: Keyspace>(&self, ks: &'k mut K) -> Kept<'k, K> {
        let value = if self.restoring.is_empty() {
            None
        } else {
            self.restoring.get(&(ks.db(), ks.name().into())).cloned()
        };
        Kept { ks, value }
    }

    /// FLUSHDB / FLUSHALL (`None`): every lock of those dbs is gone.
    pub fn flushed(&mut self, db: Option<i32>, now: i64) {
        self.restoring
            .retain(|(d, _), _| db.is_some_and(|x| x != *d));
        self.leases.forget_db(db);
        for (d, name) in self.keys_with_waiters(db) {
            self.serve_by(d, &name, now);
        }
        for (d, name) in self.watched_keys(db) {
            self.note(d, &name, now);
        }
    }

    /// SWAPDB a b: the leases change dbs with their keys; both dbs' queues are served.
    pub fn swapped(&mut self, a: i32, b: i32, now: i64) {
        // An evicted lock waiting to be put back moves with its db's keys.
        for ((d, name), v) in std::mem::take(&mut self.restoring) {
            let d = if d == a {
                b
            } else if d == b {
                a
            } else {
                d
            };
            self.restore_later(d, &name, v);
        }
        self.leases.swap_dbs(a, b);
        self.sessions_swapped(a, b);
        for db in [a, b] {
            for (d, name) in self.keys_with_waiters(Some(db)) {
                self.serve_by(d, &name, now);
            }
            for (d, name) in self.watched_keys(Some(db)) {
                self.note(d, &name, now);
            }
        }
    }

    /// This server became a primary: its first fence jumps ahead of the clock (above
    /// anything the old primary may have issued that never arrived), and it ends leases
    /// from now on.
    pub fn promoted(&mut self, wall_ms: i64) {
        self.fence.start(wall_ms);
        self.leases_paused = false;
        self.sessions_promoted();
    }

    /// This server became a replica: its primary ends leases and sessions from now on
    /// (the sweep would find it out at the first lease due, but a session's end has no
    /// key to tell it: a replica that ended a session itself would drop the primary's
    /// next keepalive of it).
    pub fn demoted(&mut self) {
        self.leases_paused = true;
    }

    /// A grant whose waiter left before it heard of it: given back on the next tick.
    pub fn revoke_later(&mut self, key: QueueKey, digest: Digest, now: i64) {
        self.agenda.insert((now, Task::Revoke(key, digest)));
    }
}

/// A key whose evicted lock waits to be put back ([`Engine::kept`]): while the key is
/// empty, reads see that lock. Everything else is the key's own.
pub(super) struct Kept<'k, K> {
    ks: &'k mut K,
    value: Option<LockValue>,
}

impl<K: Keyspace> Keyspace for Kept<'_, K> {
    fn db(&self) -> i32 {
        self.ks.db()
    }
    fn name(&self) -> &[u8] {
        self.ks.name()
    }
    fn clock(&self) -> crate::lock::codec::Clock {
        self.ks.clock()
    }
    fn read(&mut self) -> Result<Slot<'_>, crate::error::LockError> {
        if let Some(v) = self.value.as_mut() {
            if matches!(self.ks.read(), Ok(Slot::Free)) {
                return Ok(Slot::Lock(v));
            }
        }
        self.ks.read()
    }
    fn put(&mut self, v: LockValue) -> Result<(), crate::error::LockError> {
        self.value = None;
        self.ks.put(v)
    }
    fn remove(&mut self) {
        self.value = None;
        self.ks.remove()
    }
    fn classic_matches(&mut self, token: &[u8]) -> bool {
        self.ks.classic_matches(token)
    }
    fn set_classic_expiry(&mut self, at: i64) {
        self.ks.set_classic_expiry(at)
    }
    fn replicate(&mut self, c: Change<'_>) {
        self.ks.replicate(c)
    }
    fn changed(&mut self, ev: super::Event) {
        self.ks.changed(ev)
    }
    fn gate(&mut self) -> Gate {
        self.ks.gate()
    }
    fn new_token(&mut self) -> [u8; 36] {
        self.ks.new_token()
    }
    fn waits_on_classic(&mut self) {
        self.ks.waits_on_classic()
    }
    fn exported(&self) -> bool {
        self.ks.exported()
    }
}
