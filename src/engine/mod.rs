//! The lock engine: holders, leases, the FIFO wait queues, the grant rule for all three
//! kinds of lock, and the fence counter. Pure Rust: it reaches the server only through
//! two small traits, [`Keyspace`] (one open lock key, plus replication and events) and
//! [`Sched`] (answering blocked clients, timers). The module shell implements them over
//! the Redis module API; the model tests implement them in memory.
//!
//! One place makes a grant ([`Engine::grant`]); one place hands a lock over to waiters
//! ([`Engine::serve`]), and it only writes when the keyspace says it may ([`Gate`]).
//! Commands call the engine; timers and events only ask it to serve a key.

pub mod fence;
pub mod value;

#[cfg(test)]
mod model;

use std::collections::{HashMap, HashSet, VecDeque};

use crate::error::LockError;
use fence::{FenceClock, FENCE_LEAD_MS};
use value::{check_family, Addr, Digest, Family, Holder, LockValue, Mismatch, Mode};

/// A queue's identity: the db and the key name.
pub type QueueKey = (i32, Box<[u8]>);
/// Identifies a waiter while it is queued (the shell uses its blocked-client handle).
pub type WaiterId = usize;

/// What a lock key holds, as the engine sees it.
#[derive(Debug)]
pub enum Slot<'a> {
    Free,
    Lock(&'a mut LockValue),
    /// A classic `SET key token NX PX` lock and its key's expiry (None: no expiry).
    Classic(Option<i64>),
}

/// Whether the engine may write this key on its own now (hand-off, reaping, revoking).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gate {
    Now,
    /// Writes are paused, the server is loading: try again soon.
    Later,
    /// A cluster node that does not serve this key (any more): the waiters must retry
    /// where the cluster sends them.
    NotHere,
    /// A replica never grants.
    Replica,
}

/// What the primary sends to replicas and the AOF. Deterministic: absolute deadlines,
/// the fence as issued, the token's digest.
#[derive(Debug, Clone, Copy)]
pub enum Repl<'a> {
    /// A new holder (for an exclusive lock: the whole value).
    Grant {
        mode: Mode,
        holder: &'a Holder,
        /// The counter, when it is above this fence (0: not sent).
        floor: u64,
    },
    /// A holder's new lease (renew, extend).
    Lease {
        fence: u64,
        expires_at: i64,
        floor: u64,
    },
    /// One holder of a shared or counted lock is gone (the others stay).
    Drop { fence: u64 },
    /// The key is gone.
    Delete,
    /// A classic string lock's new absolute deadline.
    ExpireAt(i64),
}

/// Keyspace notifications the engine emits (class `g`, or `x` for expiry).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    Acquire,
    Release,
    Extend,
    Handoff,
    ForceRelease,
    /// A lease ended and the engine removed the key (the lease outlived the key's own
    /// expiry, e.g. after PERSIST).
    Expired,
}

/// One open lock key, and what goes with writing it.
pub trait Keyspace {
    fn db(&self) -> i32;
    fn name(&self) -> &[u8];
    fn now(&self) -> i64;
    /// What the key holds; `Err(WrongType)` for another type.
    fn read(&mut self) -> Result<Slot<'_>, LockError>;
    /// Stores a new value (replacing whatever is there); the key's expiry becomes the
    /// value's deadline.
    fn put(&mut self, v: LockValue);
    /// Deletes the key.
    fn remove(&mut self);
    /// Sets the key's own expiry (absolute, unix ms).
    fn set_expiry(&mut self, at: i64);
    /// The key's own expiry, if it has one.
    fn expiry(&mut self) -> Option<i64>;
    /// Whether a classic string lock's value equals `token`.
    fn classic_matches(&mut self, token: &[u8]) -> bool;
    fn replicate(&mut self, op: Repl<'_>);
    fn notify(&mut self, ev: Event);
    fn gate(&mut self) -> Gate;
    /// A fresh random token (UUID v4 text).
    fn new_token(&mut self) -> Vec<u8>;
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
    /// The wait ended without the lock (BLOCK timeout, CLIENT UNBLOCK TIMEOUT).
    Nil,
    Failed(LockError),
}

/// Blocked clients and timers, as the shell provides them.
pub trait Sched {
    /// The shell's record of a blocked client (owns its handle and BLOCK timer).
    type Waiter;
    type Timer;
    fn answer(&mut self, w: Self::Waiter, a: Answer);
    /// Calls back `Engine::timer_fired` for `key`, then serve, at `at` (unix ms).
    fn arm(&mut self, key: &QueueKey, at: i64) -> Self::Timer;
    fn cancel(&mut self, t: Self::Timer);
    /// The gate was closed: call `Engine::take_deferred` and serve those keys soon.
    fn retry_later(&mut self);
}

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
    pub client_id: u64,
    pub addr: Addr,
    /// The lock moved to another server while this client waited (MIGRATE).
    pub moved: bool,
    pub handle: W,
}

struct Queue<W, T> {
    waiters: VecDeque<Wait<W>>,
    /// The pending service timer and when it fires.
    timer: Option<(T, i64)>,
}

/// Counters for `INFO lock`.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Stats {
    pub acquired: u64,
    pub renewed: u64,
    pub contended: u64,
    pub released: u64,
    pub extended: u64,
    pub expired: u64,
    pub handed_off: u64,
    pub wait_timeouts: u64,
    pub force_released: u64,
    pub waiters: u64,
}

/// A LOCK.ACQUIRE as the engine needs it.
#[derive(Debug, Clone)]
pub struct AcquireReq<'a> {
    pub mode: Mode,
    pub ttl: u64,
    pub token: Option<&'a [u8]>,
    pub owner: Option<&'a [u8]>,
    pub min_fence: u64,
    pub client_id: u64,
    pub addr: Addr,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Acquired {
    /// A new grant (or the caller's own lock renewed): reply `[token, fence]`.
    Granted { token: Vec<u8>, fence: u64 },
    /// Not now. `serve_at`: when the queue should be looked at again if the caller
    /// waits (None: only an event can free it, e.g. a string lock without TTL).
    Busy { serve_at: Option<i64> },
}

/// What LOCK.INFO shows (never a token or digest).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InfoView {
    Free,
    Lock {
        mode: Mode,
        holders: Vec<Holder>,
        waiters: usize,
    },
    Classic {
        expiry: Option<i64>,
        waiters: usize,
    },
}

/// The queues of one db, by key name.
type DbQueues<W, T> = HashMap<Box<[u8]>, Queue<W, T>>;

/// `W`: the shell's record of a blocked client; `T`: its timer handle.
pub struct Engine<W, T> {
    pub fence: FenceClock,
    queues: HashMap<i32, DbQueues<W, T>>,
    by_id: HashMap<WaiterId, QueueKey>,
    deferred: HashSet<QueueKey>,
    pub stats: Stats,
}

impl<W, T> Default for Engine<W, T> {
    fn default() -> Self {
        Engine::new()
    }
}

/// The fence of a new holder, and its deadline: the two things that can fail.
fn lease(now: i64, ttl: u64) -> Result<i64, LockError> {
    i64::try_from(ttl)
        .ok()
        .and_then(|t| now.checked_add(t))
        .ok_or(LockError::InvalidExpire("lock.acquire"))
}

fn mismatch(m: Mismatch) -> LockError {
    match m {
        Mismatch::Mode => LockError::WrongMode,
        Mismatch::Limit(n) => LockError::LimitMismatch(n),
    }
}

impl<W, T> Engine<W, T> {
    pub fn new() -> Self {
        Engine {
            fence: FenceClock::new(),
            queues: HashMap::new(),
            by_id: HashMap::new(),
            deferred: HashSet::new(),
            stats: Stats::default(),
        }
    }

    // ---- queues ------------------------------------------------------------------

    fn queue(&self, db: i32, name: &[u8]) -> Option<&Queue<W, T>> {
        if self.stats.waiters == 0 {
            return None;
        }
        self.queues.get(&db)?.get(name)
    }

    fn queue_mut(&mut self, db: i32, name: &[u8]) -> Option<&mut Queue<W, T>> {
        self.queues.get_mut(&db)?.get_mut(name)
    }

    /// Clients queued on a key.
    pub fn queued(&self, db: i32, name: &[u8]) -> usize {
        self.queue(db, name).map_or(0, |q| q.waiters.len())
    }

    pub fn has_waiters(&self, db: i32, name: &[u8]) -> bool {
        self.queued(db, name) > 0
    }

    /// Every key of `db` (or of every db) that has waiters.
    pub fn keys_with_waiters(&self, db: Option<i32>) -> Vec<QueueKey> {
        self.queues
            .iter()
            .filter(|(d, _)| db.is_none_or(|x| x == **d))
            .flat_map(|(d, m)| m.keys().map(move |k| (*d, k.clone())))
            .collect()
    }

    /// The family the waiters of a key ask for (all of them share it).
    fn queue_family(&self, db: i32, name: &[u8]) -> Option<Family> {
        self.queue(db, name)
            .and_then(|q| q.waiters.front())
            .map(|w| w.mode.family())
    }

    /// Drops an empty queue and its timer.
    fn gc<S: Sched<Waiter = W, Timer = T>>(&mut self, sched: &mut S, db: i32, name: &[u8]) {
        let Some(m) = self.queues.get_mut(&db) else {
            return;
        };
        if m.get(name).is_some_and(|q| q.waiters.is_empty()) {
            if let Some(q) = m.remove(name) {
                if let Some((t, _)) = q.timer {
                    sched.cancel(t);
                }
            }
            if m.is_empty() {
                self.queues.remove(&db);
            }
        }
    }

    /// Makes sure the key's queue is served no later than `at`.
    pub fn arm<S: Sched<Waiter = W, Timer = T>>(
        &mut self,
        sched: &mut S,
        db: i32,
        name: &[u8],
        at: i64,
    ) {
        let Some(q) = self.queue_mut(db, name) else {
            return;
        };
        if let Some((_, when)) = &q.timer {
            if *when <= at {
                return;
            }
        }
        if let Some((t, _)) = q.timer.take() {
            sched.cancel(t);
        }
        let t = sched.arm(&(db, name.into()), at);
        if let Some(q) = self.queue_mut(db, name) {
            q.timer = Some((t, at));
        }
    }

    /// The service timer of `key` fired (its handle is spent).
    pub fn timer_fired(&mut self, key: &QueueKey) {
        if let Some(q) = self.queue_mut(key.0, &key.1) {
            q.timer = None;
        }
    }

    /// Keys whose service waited for the gate to open.
    pub fn take_deferred(&mut self) -> Vec<QueueKey> {
        self.deferred.drain().collect()
    }

    /// Queues a blocked client. `serve_at` comes from [`Acquired::Busy`].
    pub fn enqueue<S: Sched<Waiter = W, Timer = T>>(
        &mut self,
        sched: &mut S,
        key: QueueKey,
        w: Wait<W>,
        serve_at: Option<i64>,
    ) {
        self.by_id.insert(w.id, key.clone());
        let (db, name) = key;
        let q = self
            .queues
            .entry(db)
            .or_default()
            .entry(name.clone())
            .or_insert_with(|| Queue {
                waiters: VecDeque::new(),
                timer: None,
            });
        q.waiters.push_back(w);
        self.stats.waiters += 1;
        if let Some(at) = serve_at {
            self.arm(sched, db, &name, at);
        }
    }

    /// Takes a waiter out of its queue (BLOCK timeout, disconnect, CLIENT UNBLOCK). If
    /// it was first in line, the next ones may be grantable now: the key is served soon.
    pub fn abandon<S: Sched<Waiter = W, Timer = T>>(
        &mut self,
        sched: &mut S,
        id: WaiterId,
        now: i64,
    ) -> Option<W> {
        let (db, name) = self.by_id.remove(&id)?;
        let q = self.queue_mut(db, &name)?;
        let at = q.waiters.iter().position(|w| w.id == id)?;
        let w = q.waiters.remove(at)?;
        let more = !q.waiters.is_empty();
        self.stats.waiters = self.stats.waiters.saturating_sub(1);
        if at == 0 && more {
            // The next in line may fit now (a writer gave up ahead of readers).
            self.arm(sched, db, &name, now);
        }
        self.gc(sched, db, &name);
        Some(w.handle)
    }

    /// MIGRATE moved the lock of this key to another server: its current waiters will be
    /// told so instead of being granted here.
    pub fn mark_moved<S: Sched<Waiter = W, Timer = T>>(
        &mut self,
        sched: &mut S,
        db: i32,
        name: &[u8],
        now: i64,
    ) {
        if let Some(q) = self.queue_mut(db, name) {
            q.waiters.iter_mut().for_each(|w| w.moved = true);
            self.arm(sched, db, name, now);
        }
    }

    fn pop_front(&mut self, db: i32, name: &[u8]) -> Option<Wait<W>> {
        let w = self.queue_mut(db, name)?.waiters.pop_front()?;
        self.by_id.remove(&w.id);
        self.stats.waiters = self.stats.waiters.saturating_sub(1);
        Some(w)
    }

    /// Fails every waiter of a key with `err` (or those marked moved, with `moved_only`).
    fn fail_waiters<S: Sched<Waiter = W, Timer = T>>(
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
            self.by_id.remove(&w.id);
            self.stats.waiters = self.stats.waiters.saturating_sub(1);
            sched.answer(w.handle, Answer::Failed(err.clone()));
        }
        self.gc(sched, db, name);
    }

    // ---- the grant and the hand-off ---------------------------------------------------

    /// The one place that makes a grant: a fresh fence, the holder written (a new value
    /// or one more holder of a shared/counted lock) and replicated.
    #[allow(clippy::too_many_arguments)]
    fn grant(
        &mut self,
        ks: &mut impl Keyspace,
        mode: Mode,
        digest: Digest,
        ttl: u64,
        min_fence: u64,
        owner: Option<Box<[u8]>>,
        client_id: u64,
        addr: Addr,
    ) -> Result<u64, LockError> {
        let now = ks.now();
        let expires_at = lease(now, ttl)?;
        // Everything that can fail comes before the fence is taken and the grant sent.
        let joins =
            matches!(ks.read()?, Slot::Lock(v) if v.mode() == mode && mode != Mode::Exclusive);
        let fence = self.fence.next(now, min_fence)?;
        let holder = Holder::new(digest, fence, expires_at, now, client_id, addr, owner);
        ks.replicate(Repl::Grant {
            mode,
            holder: &holder,
            floor: 0,
        });
        let joined = match ks.read() {
            Ok(Slot::Lock(v)) if joins => {
                v.push(holder);
                Some(v.deadline())
            }
            _ => {
                ks.put(LockValue::new(mode, holder));
                None
            }
        };
        if let Some(deadline) = joined {
            ks.set_expiry(deadline);
        }
        self.stats.acquired += 1;
        Ok(fence)
    }

    /// Removes holders whose lease is over (the key's own expiry may outlive the lease,
    /// e.g. after PERSIST), as an expiry would: replicated, counted, notified.
    fn reap(&mut self, ks: &mut impl Keyspace) -> Result<(), LockError> {
        let now = ks.now();
        let (gone, left) = match ks.read()? {
            Slot::Lock(v) => {
                let (gone, emptied) = v.reap(now);
                if gone.is_empty() {
                    return Ok(());
                }
                (gone, (!emptied).then(|| v.deadline()))
            }
            _ => return Ok(()),
        };
        self.stats.expired += gone.len() as u64;
        match left {
            None => {
                ks.remove();
                ks.replicate(Repl::Delete);
                ks.notify(Event::Expired);
            }
            Some(deadline) => {
                ks.set_expiry(deadline);
                for fence in gone {
                    ks.replicate(Repl::Drop { fence });
                }
            }
        }
        Ok(())
    }

    /// The one place that hands a lock over: grants it to the head of the queue, and to
    /// as many after it as fit (readers after readers, permits while free), in order.
    /// Only writes when the gate is open; otherwise the key is served again later.
    pub fn serve<S: Sched<Waiter = W, Timer = T>>(
        &mut self,
        ks: &mut impl Keyspace,
        sched: &mut S,
    ) {
        let db = ks.db();
        let name: Box<[u8]> = ks.name().into();
        if !self.has_waiters(db, &name) {
            return;
        }
        match ks.gate() {
            Gate::Now => {}
            Gate::Later => {
                self.deferred.insert((db, name));
                sched.retry_later();
                return;
            }
            Gate::NotHere => {
                self.fail_waiters(sched, db, &name, &LockError::TryAgain, false);
                return;
            }
            Gate::Replica => {
                self.fail_waiters(sched, db, &name, &LockError::Unblocked, false);
                return;
            }
        }
        self.fail_waiters(sched, db, &name, &LockError::Moved, true);
        if let Err(e) = self.reap(ks) {
            self.fail_waiters(sched, db, &name, &e, false);
            return;
        }
        let now = ks.now();
        while let Some(head) = self.queue(db, &name).and_then(|q| q.waiters.front()) {
            let want = head.mode;
            let verdict = match ks.read() {
                Err(e) => Err(e),
                Ok(Slot::Classic(_)) if matches!(want, Mode::Counted(_)) => {
                    Err(LockError::WrongMode)
                }
                Ok(Slot::Classic(_)) => Ok(false),
                Ok(Slot::Free) => Ok(true),
                Ok(Slot::Lock(v)) => match check_family(v.mode().family(), want) {
                    Err(m) => Err(mismatch(m)),
                    Ok(()) => Ok(v.admits(want, now)),
                },
            };
            match verdict {
                Ok(false) => break,
                Err(LockError::WrongType) => {
                    self.fail_waiters(sched, db, &name, &LockError::WrongType, false);
                    return;
                }
                Err(e) => {
                    if let Some(w) = self.pop_front(db, &name) {
                        sched.answer(w.handle, Answer::Failed(e));
                    }
                }
                Ok(true) => {
                    let Some(w) = self.pop_front(db, &name) else {
                        break;
                    };
                    let granted = self.grant(
                        ks,
                        w.mode,
                        w.digest,
                        w.ttl,
                        w.min_fence,
                        w.owner,
                        w.client_id,
                        w.addr,
                    );
                    match granted {
                        Ok(fence) => {
                            self.stats.handed_off += 1;
                            ks.notify(Event::Handoff);
                            let key = (db, name.clone());
                            sched.answer(
                                w.handle,
                                Answer::Granted {
                                    token: w.token,
                                    fence,
                                    key,
                                    digest: w.digest,
                                },
                            );
                        }
                        Err(e) => sched.answer(w.handle, Answer::Failed(e)),
                    }
                }
            }
        }
        if let Some(at) = self.next_service(ks) {
            self.arm(sched, db, &name, at);
        }
        self.gc(sched, db, &name);
    }

    /// When a held key should be looked at again for its waiters: the first millisecond
    /// after the earliest lease or the key's own expiry ends.
    fn next_service(&mut self, ks: &mut impl Keyspace) -> Option<i64> {
        let expiry = ks.expiry();
        let lease_end = match ks.read() {
            Ok(Slot::Lock(v)) => Some(v.next_lease_end()),
            Ok(Slot::Free) => Some(ks.now()),
            _ => None,
        };
        [lease_end, expiry]
            .into_iter()
            .flatten()
            .min()
            .map(|t| t.saturating_add(1))
    }

    /// After a lease changed: the key's waiters are served when the new one ends.
    fn rearm<S: Sched<Waiter = W, Timer = T>>(&mut self, ks: &mut impl Keyspace, sched: &mut S) {
        if self.has_waiters(ks.db(), ks.name()) {
            if let Some(at) = self.next_service(ks) {
                let (db, name) = (ks.db(), ks.name().to_vec());
                self.arm(sched, db, &name, at);
            }
        }
    }

    // ---- commands ----------------------------------------------------------------------

    /// LOCK.ACQUIRE without its waiting part: grant, renew, or Busy (the shell then
    /// answers nil or blocks the client and calls [`Engine::enqueue`]).
    pub fn acquire<S: Sched<Waiter = W, Timer = T>>(
        &mut self,
        ks: &mut impl Keyspace,
        sched: &mut S,
        req: &AcquireReq<'_>,
    ) -> Result<Acquired, LockError> {
        let now = ks.now();
        if req.min_fence > self.fence.ceiling(now, FENCE_LEAD_MS) {
            return Err(LockError::FenceTooFarAhead);
        }
        let deadline = lease(now, req.ttl)?;
        let digest = req.token.map(value::digest);
        let (db, waiting) = (ks.db(), self.has_waiters(ks.db(), ks.name()));
        if waiting {
            // A free key may still have waiters whose hand-off was deferred: they go first.
            self.serve(ks, sched);
        }
        self.reap(ks)?;
        let queue_family = self.queue_family(db, ks.name());
        let queued = queue_family.is_some();
        match ks.read()? {
            Slot::Classic(expiry) => {
                if matches!(req.mode, Mode::Counted(_)) {
                    return Err(LockError::WrongMode);
                }
                self.stats.contended += 1;
                Ok(Acquired::Busy {
                    serve_at: expiry.map(|t| t.saturating_add(1)),
                })
            }
            Slot::Lock(v) => {
                if let Some(i) = digest.and_then(|d| v.find(&d)) {
                    if v.mode() != req.mode {
                        return Err(match (v.mode(), req.mode) {
                            (Mode::Counted(n), Mode::Counted(_)) => LockError::LimitMismatch(n),
                            _ => LockError::WrongMode,
                        });
                    }
                    // The caller's own lock: a retry after a lost reply. Same fence, new
                    // lease; MINFENCE only lifts the counter (for quorum clients).
                    let h = &mut v.holders_mut()[i];
                    h.expires_at = deadline;
                    let fence = h.fence;
                    let key_deadline = v.deadline();
                    ks.set_expiry(key_deadline);
                    let floor = if req.min_fence > 0 {
                        self.fence.observe(req.min_fence);
                        self.fence.last()
                    } else {
                        0
                    };
                    ks.replicate(Repl::Lease {
                        fence,
                        expires_at: deadline,
                        floor: if floor > fence { floor } else { 0 },
                    });
                    ks.notify(Event::Acquire);
                    self.stats.renewed += 1;
                    // A shorter lease brings the hand-off forward.
                    self.rearm(ks, sched);
                    let token = req.token.map(<[u8]>::to_vec).unwrap_or_default();
                    return Ok(Acquired::Granted { token, fence });
                }
                check_family(v.mode().family(), req.mode).map_err(mismatch)?;
                if !queued && v.admits(req.mode, now) {
                    return self.grant_to_caller(ks, req, digest);
                }
                let at = v.next_lease_end().saturating_add(1);
                self.stats.contended += 1;
                Ok(Acquired::Busy { serve_at: Some(at) })
            }
            Slot::Free => {
                if let Some(f) = queue_family {
                    check_family(f, req.mode).map_err(mismatch)?;
                    self.stats.contended += 1;
                    return Ok(Acquired::Busy {
                        serve_at: Some(now),
                    });
                }
                self.grant_to_caller(ks, req, digest)
            }
        }
    }

    fn grant_to_caller(
        &mut self,
        ks: &mut impl Keyspace,
        req: &AcquireReq<'_>,
        digest: Option<Digest>,
    ) -> Result<Acquired, LockError> {
        let token = match req.token {
            Some(t) => t.to_vec(),
            None => ks.new_token(),
        };
        let digest = digest.unwrap_or_else(|| value::digest(&token));
        let fence = self.grant(
            ks,
            req.mode,
            digest,
            req.ttl,
            req.min_fence,
            req.owner.map(Into::into),
            req.client_id,
            req.addr.clone(),
        )?;
        ks.notify(Event::Acquire);
        Ok(Acquired::Granted { token, fence })
    }

    /// Removes one holder (by digest or fence) or every holder; true if one was removed.
    fn remove_holders(
        &mut self,
        ks: &mut impl Keyspace,
        which: Which<'_>,
    ) -> Result<bool, LockError> {
        self.reap(ks)?;
        let outcome = match ks.read()? {
            Slot::Free => return Ok(false),
            Slot::Classic(_) => match which {
                Which::Token(t) => {
                    if !ks.classic_matches(t) {
                        return Ok(false);
                    }
                    None
                }
                Which::Fence(_) => return Ok(false),
                Which::All => None,
            },
            Slot::Lock(v) => {
                let i = match which {
                    Which::Token(t) => v.find(&value::digest(t)),
                    Which::Fence(f) => v.find_fence(f),
                    Which::All => None,
                };
                match (which, i) {
                    (Which::All, _) => None,
                    (_, None) => return Ok(false),
                    (_, Some(i)) => {
                        let fence = v.holders()[i].fence;
                        if v.remove(i) {
                            Some((fence, v.deadline()))
                        } else {
                            None
                        }
                    }
                }
            }
        };
        match outcome {
            None => {
                ks.remove();
                ks.replicate(Repl::Delete);
            }
            Some((fence, deadline)) => {
                ks.set_expiry(deadline);
                ks.replicate(Repl::Drop { fence });
            }
        }
        Ok(true)
    }

    /// Removes holders, then (when one was removed) notifies, counts and hands over: the
    /// one place a release, a revocation and a forced release end.
    fn release_and_serve<S: Sched<Waiter = W, Timer = T>>(
        &mut self,
        ks: &mut impl Keyspace,
        sched: &mut S,
        which: Which<'_>,
        forced: bool,
    ) -> Result<bool, LockError> {
        let removed = self.remove_holders(ks, which)?;
        if removed {
            if forced {
                ks.notify(Event::ForceRelease);
                self.stats.force_released += 1;
            } else {
                ks.notify(Event::Release);
                self.stats.released += 1;
            }
            self.serve(ks, sched);
        }
        Ok(removed)
    }

    /// LOCK.RELEASE: removes the holder `token` names, then hands the lock over.
    pub fn release<S: Sched<Waiter = W, Timer = T>>(
        &mut self,
        ks: &mut impl Keyspace,
        sched: &mut S,
        token: &[u8],
    ) -> Result<bool, LockError> {
        self.release_and_serve(ks, sched, Which::Token(token), false)
    }

    /// Gives back a grant whose waiter left before it heard of it.
    pub fn revoke<S: Sched<Waiter = W, Timer = T>>(
        &mut self,
        ks: &mut impl Keyspace,
        sched: &mut S,
        d: &Digest,
    ) -> bool {
        let found = match ks.read() {
            Ok(Slot::Lock(v)) => v.find(d).map(|i| v.holders()[i].fence),
            _ => None,
        };
        found.is_some_and(|fence| {
            self.release_and_serve(ks, sched, Which::Fence(fence), false)
                .unwrap_or(false)
        })
    }

    /// LOCK.FORCERELEASE [FENCE f].
    pub fn force_release<S: Sched<Waiter = W, Timer = T>>(
        &mut self,
        ks: &mut impl Keyspace,
        sched: &mut S,
        fence: Option<u64>,
    ) -> Result<bool, LockError> {
        self.release_and_serve(ks, sched, fence.map_or(Which::All, Which::Fence), true)
    }

    /// LOCK.EXTEND: a new lease for the holder `token` names.
    pub fn extend<S: Sched<Waiter = W, Timer = T>>(
        &mut self,
        ks: &mut impl Keyspace,
        sched: &mut S,
        token: &[u8],
        ttl: u64,
    ) -> Result<bool, LockError> {
        let now = ks.now();
        let deadline = i64::try_from(ttl)
            .ok()
            .and_then(|t| now.checked_add(t))
            .ok_or(LockError::InvalidExpire("lock.extend"))?;
        self.reap(ks)?;
        let changed = match ks.read()? {
            Slot::Free => return Ok(false),
            Slot::Classic(_) => {
                if !ks.classic_matches(token) {
                    return Ok(false);
                }
                ks.set_expiry(deadline);
                ks.replicate(Repl::ExpireAt(deadline));
                None
            }
            Slot::Lock(v) => {
                let Some(i) = v.find(&value::digest(token)) else {
                    return Ok(false);
                };
                let h = &mut v.holders_mut()[i];
                h.expires_at = deadline;
                Some((h.fence, v.deadline()))
            }
        };
        if let Some((fence, key_deadline)) = changed {
            ks.set_expiry(key_deadline);
            ks.replicate(Repl::Lease {
                fence,
                expires_at: deadline,
                floor: 0,
            });
        }
        ks.notify(Event::Extend);
        self.stats.extended += 1;
        // A shorter lease brings the hand-off forward.
        self.rearm(ks, sched);
        Ok(true)
    }

    /// LOCK.INFO: read-only (a lease that is over shows as free; nothing is removed).
    pub fn info(&self, ks: &mut impl Keyspace) -> Result<InfoView, LockError> {
        let now = ks.now();
        let waiters = self.queued(ks.db(), ks.name());
        Ok(match ks.read()? {
            Slot::Free => InfoView::Free,
            Slot::Classic(expiry) => InfoView::Classic { expiry, waiters },
            Slot::Lock(v) => {
                let holders: Vec<Holder> = v
                    .holders()
                    .iter()
                    .filter(|h| h.live(now))
                    .cloned()
                    .collect();
                if holders.is_empty() {
                    InfoView::Free
                } else {
                    InfoView::Lock {
                        mode: v.mode(),
                        holders,
                        waiters,
                    }
                }
            }
        })
    }

    // ---- what arrives from the primary or the AOF -------------------------------------

    /// Applies a replicated change. The fence counter learns every fence and floor.
    pub fn apply(&mut self, ks: &mut impl Keyspace, op: Repl<'_>) -> Result<(), LockError> {
        match op {
            Repl::Grant {
                mode,
                holder,
                floor,
            } => {
                self.fence.observe(holder.fence.max(floor));
                let deadline = match ks.read() {
                    Ok(Slot::Lock(v)) if v.mode() == mode && mode != Mode::Exclusive => {
                        match v.find(&holder.digest) {
                            Some(i) => v.holders_mut()[i] = holder.clone(),
                            None => v.push(holder.clone()),
                        }
                        Some(v.deadline())
                    }
                    _ => None,
                };
                match deadline {
                    Some(d) => ks.set_expiry(d),
                    None => ks.put(LockValue::new(mode, holder.clone())),
                }
            }
            Repl::Lease {
                fence,
                expires_at,
                floor,
            } => {
                self.fence.observe(floor);
                let deadline = match ks.read()? {
                    Slot::Lock(v) => v.find_fence(fence).map(|i| {
                        v.holders_mut()[i].expires_at = expires_at;
                        v.deadline()
                    }),
                    _ => None,
                };
                if let Some(d) = deadline {
                    ks.set_expiry(d);
                }
            }
            Repl::Drop { fence } => {
                let left = match ks.read()? {
                    Slot::Lock(v) => v
                        .find_fence(fence)
                        .map(|i| v.remove(i).then(|| v.deadline())),
                    _ => None,
                };
                match left {
                    Some(Some(d)) => ks.set_expiry(d),
                    Some(None) => ks.remove(),
                    None => {}
                }
            }
            Repl::Delete => ks.remove(),
            Repl::ExpireAt(at) => ks.set_expiry(at),
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Copy)]
enum Which<'a> {
    Token(&'a [u8]),
    Fence(u64),
    All,
}
