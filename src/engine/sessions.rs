//! Sessions: one lease for many locks. A session has an id (a secret, kept as its digest,
//! like a token), a TTL and a deadline on the monotonic clock, and optionally the client
//! connection it is bound to. A lock taken in a session (`LOCK.ACQUIRE ... SESSION id`)
//! has the session's lease: every holder in the session carries the session's deadline,
//! one keepalive moves all of them, and the session's end releases every lock it holds.
//!
//! Each holder carries its own deadline (and the session's digest), so a value is
//! complete on its own: RDB, DUMP, the AOF and a replica's stream need nothing else, and
//! a node that receives a session's lock (RESTORE, MIGRATE, a slot migration) learns of
//! the session from it. The table here adds what spans keys: which keys a session holds
//! (to renew and end them together), the binding to a connection, and sessions that hold
//! nothing yet. Sessions are per server: in a cluster, a session lives on each node it has
//! locks on.
//!
//! How a session ends, and what its locks see:
//! - its TTL runs out: the holders' leases end with it (the ordinary lease end: lock-delay
//!   applies, waiters are served);
//! - its bound connection closes and the grace period passes: the holders' leases end
//!   then, in the same way;
//! - `LOCK.SESSION CLOSE`: every lock is released, as `LOCK.RELEASE` would.
//!
//! A session one of whose locks left this server with its slot (MIGRATE, a Valkey atomic
//! slot migration) is no longer kept alive here: its KEEPALIVE answers 0 and renews
//! nothing, so that its holder learns of the loss (the moved lock lasts on its new node
//! only as long as the keepalives that reach it there), and its other locks here end
//! with their current lease (see [`Session::moved`]).

use std::collections::{BTreeSet, HashMap};

use super::timeline::Task;
use super::{Engine, Event, Gate, Keyspace, QueueKey, Sched, Slot, Store};
use crate::error::LockError;
use crate::lock::codec::repl::{Change, SessionChange};
use crate::lock::value::Digest;
use crate::reply::{Bytes, Reply};

/// One session, as this server keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Session {
    /// The lease a keepalive gives when it names none (ms).
    pub ttl: u64,
    /// The end of the lease (monotonic µs).
    pub deadline: i64,
    pub owner: Option<Box<[u8]>>,
    /// The connection it is bound to, and the grace period after it closes (ms).
    pub bound: Option<(u64, u64)>,
    /// When the session ends because its bound connection closed (µs).
    pub ending: Option<i64>,
    /// The keys it may hold a lock on (a key it no longer holds is dropped when found).
    pub keys: BTreeSet<QueueKey>,
    /// A lock it held here left with its slot: it is no longer open here (KEEPALIVE
    /// answers 0 and renews nothing, INFO answers nil, an acquire in it NOSESSION); its
    /// locks here end with their current lease, or at `LOCK.SESSION CLOSE`. An OPEN of
    /// its id starts a new session, without them. Replicated (`LOCK.SREPL MOVED`) and
    /// kept in the RDB (a record whose lease is 0).
    pub moved: bool,
    /// When its end stands on the agenda.
    due: i64,
}

impl Session {
    fn new(ttl: u64, deadline: i64) -> Session {
        Session {
            ttl,
            deadline,
            owner: None,
            bound: None,
            ending: None,
            keys: BTreeSet::new(),
            moved: false,
            due: deadline,
        }
    }

    fn end_at(&self) -> i64 {
        self.ending.map_or(self.deadline, |e| e.min(self.deadline))
    }
}

/// A session as an AOF rewrite names it: its lease, its label, and whether it lost a
/// lock to a slot move.
pub type SessionNamed = (u64, Option<Box<[u8]>>, bool);

/// What `LOCK.SESSION OPEN` asks.
#[derive(Debug, Clone)]
pub struct OpenReq<'a> {
    pub digest: Digest,
    pub ttl: u64,
    /// Bound to this client, with this grace period (ms).
    pub bind: Option<(u64, u64)>,
    pub owner: Option<&'a [u8]>,
}

/// The sessions of one engine, and the bound connections.
#[derive(Debug, Default)]
pub(super) struct Sessions {
    pub(super) by_digest: HashMap<Digest, Session>,
    by_client: HashMap<u64, Vec<Digest>>,
    /// Sessions marked `moved` whose mark the replicas have not been sent yet (it is
    /// made where no change can be replicated: the server's unlink of a migrated key, a
    /// slot migration's event): sent at the next tick.
    unsent: Vec<Digest>,
}

impl Sessions {
    /// No session is known here: a holder's session digest then names none, and the
    /// release and expiry paths skip collecting them (a check instead of a walk).
    pub(super) fn is_empty(&self) -> bool {
        self.by_digest.is_empty()
    }
}

/// Which of a session's holders a renewal moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Renew {
    /// Those whose lease still runs on this server's clock (its own keepalive).
    Live,
    /// All of them (the primary's keepalive, applied on a replica or from the AOF).
    All,
}

/// What [`Engine::set_session_deadline`] does with the session's holders of a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SetDeadline {
    /// Renews those whose lease still runs.
    Renew,
    /// Renews every one (the primary said so).
    RenewAll,
    /// Shortens, never lengthens (the session ends).
    Lower,
}

/// How a session's locks end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ending {
    /// Their leases end now (a TTL run out, a bound connection gone): lock-delay applies.
    Lapsed,
    /// Released (`LOCK.SESSION CLOSE`).
    Closed,
}

impl<W> Engine<W> {
    /// Sessions open now (not those that lost a lock to a slot move: nothing keeps them
    /// alive here any more).
    pub fn sessions(&self) -> usize {
        self.sessions
            .by_digest
            .values()
            .filter(|s| !s.moved)
            .count()
    }

    /// Whether the session is open at `now`: known here, its end not yet due (one whose
    /// end is due but not yet done counts as ended, and is never renewed), and none of
    /// its locks here moved away with a slot.
    fn open_at(&self, d: &Digest, now: i64) -> Option<&Session> {
        self.sessions
            .by_digest
            .get(d)
            .filter(|s| !s.moved && s.end_at() > now)
    }

    /// Whether the session lost a lock to a slot move here and has not ended yet.
    fn moved_at(&self, d: &Digest, now: i64) -> bool {
        self.sessions
            .by_digest
            .get(d)
            .is_some_and(|s| s.moved && s.end_at() > now)
    }

    /// A lock held in session `d` left this server with its slot (MIGRATE; the cut-over
    /// of an atomic slot migration): see [`Session::moved`]. Nothing of the session
    /// changes here but that mark: no lock is renewed, shortened or released.
    pub(super) fn session_lost_lock(&mut self, d: &Digest) {
        let Some(s) = self.sessions.by_digest.get_mut(d) else {
            return;
        };
        if !s.moved {
            s.moved = true;
            self.sessions.unsent.push(*d);
            self.stats.sessions_moved += 1;
            self.agenda.insert((self.now, Task::Wake));
        }
    }

    /// The slots whose keys `moved` says left this server: every session that held a
    /// lock there lost it.
    pub(super) fn sessions_moved_away(&mut self, moved: &impl Fn(&[u8]) -> bool) {
        let lost: Vec<Digest> = self
            .sessions
            .by_digest
            .iter()
            .filter(|(_, s)| s.keys.iter().any(|(_, name)| moved(name)))
            .map(|(d, _)| *d)
            .collect();
        for d in lost {
            self.session_lost_lock(&d);
        }
    }

    /// Sends the marks of sessions that lost a lock to a slot move to the replicas and
    /// the AOF (a promoted replica or a restart from the AOF must not renew them either).
    pub(super) fn send_session_marks<St: Store>(&mut self, store: &mut St) {
        if self.sessions.unsent.is_empty() {
            return;
        }
        for d in std::mem::take(&mut self.sessions.unsent) {
            if self.sessions.by_digest.get(&d).is_some_and(|s| s.moved) {
                store.replicate_session(&SessionChange::Moved { digest: &d });
            }
        }
    }

    /// An OPEN (or the primary's) of a session that lost a lock to a slot move here: a
    /// new session under that id. The old one is forgotten without ending its locks:
    /// they are not the new session's (nothing renews them) and end with their current
    /// lease. An OPEN must not bring them back: a client that reopens its session on a
    /// new connection would take the answer for a renewal and never learn of the loss.
    fn replace_moved(&mut self, d: &Digest, now: i64) {
        if self.moved_at(d, now) {
            self.forget_session(d);
        }
    }

    /// The lease and the label of a session known here, and whether it lost a lock to a
    /// slot move.
    pub fn session_ttl_owner(&self, d: &Digest) -> Option<SessionNamed> {
        self.sessions
            .by_digest
            .get(d)
            .map(|s| (s.ttl, s.owner.clone(), s.moved))
    }

    /// The deadline of a session, if it is open here.
    pub fn session_deadline(&self, d: &Digest) -> Option<i64> {
        self.sessions.by_digest.get(d).map(|s| s.deadline)
    }

    /// Puts a session's end on the agenda at its due time (moving an earlier entry).
    fn schedule_end(&mut self, d: &Digest) {
        let Some(s) = self.sessions.by_digest.get_mut(d) else {
            return;
        };
        let at = s.end_at();
        if s.due != at {
            self.agenda.remove(&(s.due, Task::SessionEnd(*d)));
            s.due = at;
        }
        self.agenda.insert((at, Task::SessionEnd(*d)));
    }

    fn bind(&mut self, d: Digest, client: Option<(u64, u64)>) {
        let Some(s) = self.sessions.by_digest.get_mut(&d) else {
            return;
        };
        if let Some((old, _)) = s.bound {
            if let Some(list) = self.sessions.by_client.get_mut(&old) {
                list.retain(|x| *x != d);
                if list.is_empty() {
                    self.sessions.by_client.remove(&old);
                }
            }
        }
        s.bound = client;
        s.ending = None;
        if let Some((id, _)) = client {
            self.sessions.by_client.entry(id).or_default().push(d);
        }
    }

    /// `LOCK.SESSION OPEN`: a new session (true), or one already open renewed and bound
    /// as asked (false).
    pub fn session_open<St: Store, S: Sched<Waiter = W>>(
        &mut self,
        store: &mut St,
        sched: &mut S,
        req: OpenReq<'_>,
    ) -> bool {
        let clock = store.clock();
        self.now = self.now.max(clock.mono);
        self.send_session_marks(store);
        self.replace_moved(&req.digest, clock.mono);
        if self.sessions.by_digest.contains_key(&req.digest)
            && self.open_at(&req.digest, clock.mono).is_none()
        {
            // Its end is due (a stall kept the timer from it): it ends first, whole.
            self.end_session(store, sched, &req.digest, Ending::Lapsed);
        }
        let deadline = clock.after_ms(i64::try_from(req.ttl).unwrap_or(i64::MAX));
        let owner: Option<Box<[u8]>> = req.owner.map(Into::into);
        let new = !self.sessions.by_digest.contains_key(&req.digest);
        if new {
            let mut s = Session::new(req.ttl, deadline);
            s.owner = owner.clone();
            self.sessions.by_digest.insert(req.digest, s);
            self.stats.sessions_opened += 1;
            store.replicate_session(&SessionChange::Open {
                digest: &req.digest,
                ttl: req.ttl,
                deadline,
                owner: owner.as_deref(),
            });
        } else {
            if let Some(s) = self.sessions.by_digest.get_mut(&req.digest) {
                s.ttl = req.ttl;
                if owner.is_some() {
                    s.owner = owner.clone();
                }
            }
            self.renew_session(store, &req.digest, deadline, Renew::Live);
            store.replicate_session(&SessionChange::Open {
                digest: &req.digest,
                ttl: req.ttl,
                deadline,
                owner: owner.as_deref(),
            });
        }
        self.bind(req.digest, req.bind);
        self.schedule_end(&req.digest);
        new
    }

    /// `LOCK.SESSION KEEPALIVE`: the session's lease (and every lock it holds) runs `ttl`
    /// ms from now (its own TTL when None). A bound session whose connection closed is
    /// bound to `client` (the caller's connection) again; a caller without one (a script,
    /// another module's call: None) renews the lease only, and the grace period runs on
    /// until a keepalive from a connection binds it (bound to a client that never closes,
    /// the session would never end by its binding again). False: no such session here,
    /// or one that lost a lock to a slot move (renewed nothing).
    pub fn session_keepalive<St: Store>(
        &mut self,
        store: &mut St,
        d: &Digest,
        ttl: Option<u64>,
        client: Option<u64>,
    ) -> bool {
        let clock = store.clock();
        self.now = self.now.max(clock.mono);
        // A 0 answered for a mark the replicas and the AOF have not been sent yet would
        // not outlive a crash now.
        self.send_session_marks(store);
        if self.open_at(d, clock.mono).is_none() {
            return false;
        }
        let Some(s) = self.sessions.by_digest.get_mut(d) else {
            return false;
        };
        if let Some(t) = ttl {
            s.ttl = t;
        }
        let ttl = s.ttl;
        let rebind = match (s.bound, s.ending, client) {
            (Some((_, grace)), Some(_), Some(client)) => Some((client, grace)),
            _ => None,
        };
        let deadline = clock.after_ms(i64::try_from(ttl).unwrap_or(i64::MAX));
        self.renew_session(store, d, deadline, Renew::Live);
        store.replicate_session(&SessionChange::Renew {
            digest: d,
            ttl,
            deadline,
        });
        if rebind.is_some() {
            self.bind(*d, rebind);
        }
        self.schedule_end(d);
        self.stats.session_keepalives += 1;
        true
    }

    /// Moves the session's deadline, and every lock's it holds, to `deadline`. `Renew::Live`
    /// (this server's own keepalive) moves only the leases still running here;
    /// `Renew::All` (a keepalive from the primary's stream or the AOF) every holder of
    /// the session: the primary renewed them, whatever this server's clock says of their
    /// old lease (a replica that lags by more than the lease; the primary sends the end of
    /// any it did not renew).
    fn renew_session<St: Store>(
        &mut self,
        store: &mut St,
        d: &Digest,
        deadline: i64,
        which: Renew,
    ) {
        let Some(s) = self.sessions.by_digest.get_mut(d) else {
            return;
        };
        s.deadline = deadline;
        let keys: Vec<QueueKey> = s.keys.iter().cloned().collect();
        let mut gone = Vec::new();
        for (db, name) in keys {
            let held = match store.open(db, &name) {
                Some(mut ks) => {
                    let how = match which {
                        Renew::Live => SetDeadline::Renew,
                        Renew::All => SetDeadline::RenewAll,
                    };
                    self.set_session_deadline(&mut ks, d, deadline, how)
                }
                None => false,
            };
            if !held {
                gone.push((db, name));
            }
        }
        if let Some(s) = self.sessions.by_digest.get_mut(d) {
            for k in gone {
                s.keys.remove(&k);
            }
        }
    }

    /// Sets the lease of the session's holders of this key (those whose lease still runs:
    /// one that ended is never brought back, unless the primary says so: `RenewAll`);
    /// with `Lower`, only where that shortens it. False when the session holds nothing
    /// here.
    fn set_session_deadline(
        &mut self,
        ks: &mut impl Keyspace,
        d: &Digest,
        deadline: i64,
        how: SetDeadline,
    ) -> bool {
        let lower = how == SetDeadline::Lower;
        let (db, name) = (ks.db(), super::Name::of(ks.name()));
        let now = ks.clock().mono;
        let Ok(Slot::Lock(v)) = ks.read() else {
            return false;
        };
        let fences: Vec<(u64, i64)> = v
            .iter()
            .filter(|h| h.session() == Some(d) && (how == SetDeadline::RenewAll || h.live(now)))
            .map(|h| (h.fence, h.deadline))
            .collect();
        if fences.is_empty() {
            return false;
        }
        let before = v.next_lease_end();
        for (f, old) in &fences {
            v.set_deadline(*f, if lower { deadline.min(*old) } else { deadline });
        }
        let after = v.next_lease_end();
        self.reindex(db, &name, before, after);
        if !lower {
            if ks.exported() {
                // An atomic slot migration streams this key to its next node, which gets
                // no keyless LOCK.SREPL: the renewal goes there per holder.
                for (fence, _) in &fences {
                    ks.replicate(Change::Renew {
                        fence: *fence,
                        deadline,
                        floor: 0,
                    });
                }
            }
            ks.changed(Event::Extend);
        }
        self.note(db, &name, self.now);
        true
    }

    /// A lock of this key was granted in session `d`.
    pub(super) fn session_holds(&mut self, d: &Digest, db: i32, name: &[u8]) {
        if let Some(s) = self.sessions.by_digest.get_mut(d) {
            s.keys.insert((db, name.into()));
        }
    }

    /// Holders of these sessions left the key: a session with no holder left there no
    /// longer lists it (else a long session that takes and releases many keys between
    /// keepalives keeps every name it ever locked).
    #[inline]
    pub(super) fn sessions_left(&mut self, ks: &mut impl Keyspace, gone: &[Digest]) {
        if !gone.is_empty() {
            self.sessions_left_now(ks, gone);
        }
    }

    fn sessions_left_now(&mut self, ks: &mut impl Keyspace, gone: &[Digest]) {
        let key: QueueKey = (ks.db(), ks.name().into());
        let still: Vec<bool> = match ks.read() {
            Ok(Slot::Lock(v)) => gone
                .iter()
                .map(|d| v.iter().any(|h| h.session() == Some(d)))
                .collect(),
            _ => vec![false; gone.len()],
        };
        for (d, still) in gone.iter().zip(still) {
            if !still {
                if let Some(s) = self.sessions.by_digest.get_mut(d) {
                    s.keys.remove(&key);
                }
            }
        }
    }

    /// A value arrived with holders in sessions (loaded, restored, replicated, moved
    /// here): each session is known here from then on, at least until those leases end.
    pub(super) fn sessions_seen(
        &mut self,
        db: i32,
        name: &[u8],
        v: &crate::lock::value::LockValue,
    ) {
        for h in v.iter() {
            let Some(d) = h.session() else {
                continue;
            };
            let d = *d;
            let s = self
                .sessions
                .by_digest
                .entry(d)
                .or_insert_with(|| Session::new(0, h.deadline));
            s.deadline = s.deadline.max(h.deadline);
            if s.ttl == 0 {
                s.ttl = u64::try_from((h.deadline - self.now).max(1000) / 1000).unwrap_or(1);
            }
            s.keys.insert((db, name.into()));
            self.schedule_end(&d);
        }
    }

    /// A holder of session `d` was renewed to `deadline` by a keyed change (the stream of
    /// an atomic slot migration carries a keepalive so): the session lasts at least as
    /// long here.
    pub(super) fn session_renewed(&mut self, d: &Digest, deadline: i64) {
        if let Some(s) = self.sessions.by_digest.get_mut(d) {
            if deadline > s.deadline {
                s.deadline = deadline;
                self.schedule_end(d);
            }
        }
    }

    /// `LOCK.SESSION CLOSE`: releases every lock of the session (as LOCK.RELEASE does,
    /// serving their waiters) and forgets it (one that lost a lock to a slot move too:
    /// its holder gives up the rest). None: no such session here.
    pub fn session_close<St: Store, S: Sched<Waiter = W>>(
        &mut self,
        store: &mut St,
        sched: &mut S,
        d: &Digest,
    ) -> Option<u64> {
        let now = store.clock().mono;
        self.now = self.now.max(now);
        self.sessions.by_digest.get(d)?;
        if self.open_at(d, now).is_none() && !self.moved_at(d, now) {
            // Its end is due: it ends as it would have (a lapse), and was not open.
            self.end_session(store, sched, d, Ending::Lapsed);
            return None;
        }
        let released = self.end_session(store, sched, d, Ending::Closed);
        Some(released)
    }

    /// Ends a session: its locks end as `how` says, then it is forgotten (unless a key
    /// could not be written now: the end is tried again soon). The count of locks ended.
    fn end_session<St: Store, S: Sched<Waiter = W>>(
        &mut self,
        store: &mut St,
        sched: &mut S,
        d: &Digest,
        how: Ending,
    ) -> u64 {
        let now = store.clock().mono;
        let Some(s) = self.sessions.by_digest.get_mut(d) else {
            return 0;
        };
        // Closed from now on: a waiter in this session served by a release below (one of
        // its own locks freed) gets NOSESSION, not a lock of a session that is ending.
        s.ending = Some(s.ending.map_or(now, |e| e.min(now)));
        let keys: Vec<QueueKey> = s.keys.iter().cloned().collect();
        let mut ended = 0;
        let mut later = false;
        for (db, name) in keys {
            let Some(mut ks) = store.open(db, &name) else {
                continue;
            };
            match ks.gate() {
                Gate::Now => {}
                Gate::Later => {
                    later = true;
                    continue;
                }
                // A replica or a node that lost the slot: the new owner decides.
                Gate::Replica | Gate::NotHere => continue,
            }
            let n = match how {
                Ending::Closed => self.release_session_holders(&mut ks, sched, d),
                Ending::Lapsed => {
                    let held = self.set_session_deadline(&mut ks, d, now, SetDeadline::Lower);
                    if held {
                        let _ = self.reap(&mut ks);
                        self.serve(&mut ks, sched);
                        self.note(db, &name, now);
                    }
                    u64::from(held)
                }
            };
            ended += n;
            if let Some(s) = self.sessions.by_digest.get_mut(d) {
                s.keys.remove(&(db, name));
            }
        }
        if later {
            self.agenda
                .insert((now.saturating_add(super::RETRY_US), Task::SessionEnd(*d)));
            if let Some(s) = self.sessions.by_digest.get_mut(d) {
                s.due = now.saturating_add(super::RETRY_US);
                s.ending = Some(now);
            }
            return ended;
        }
        self.forget_session(d);
        self.fail_session_waiters(sched, d);
        store.replicate_session(&SessionChange::End { digest: d });
        match how {
            Ending::Closed => self.stats.sessions_closed += 1,
            Ending::Lapsed => self.stats.sessions_expired += 1,
        }
        ended
    }

    /// Removes every holder of session `d` from this key (one lock released), serving its
    /// waiters; the number removed.
    fn release_session_holders<S: Sched<Waiter = W>>(
        &mut self,
        ks: &mut impl Keyspace,
        sched: &mut S,
        d: &Digest,
    ) -> u64 {
        let fences: Vec<u64> = match ks.read() {
            Ok(Slot::Lock(v)) => v
                .iter()
                .filter(|h| h.session() == Some(d))
                .map(|h| h.fence)
                .collect(),
            _ => return 0,
        };
        let mut n = 0;
        for f in fences {
            if let Ok(true) = self.release_and_serve(ks, sched, super::Which::Fence(f), false) {
                n += 1;
            }
        }
        let (db, name) = (ks.db(), super::Name::of(ks.name()));
        self.note(db, &name, self.now);
        n
    }

    /// The session ended: its waiters (one key or several) are answered NOSESSION now,
    /// instead of at their turn (a waiter for several keys would hold the head of a free
    /// key's queue until its other keys freed up, for a grant it can never have).
    fn fail_session_waiters<S: Sched<Waiter = W>>(&mut self, sched: &mut S, d: &Digest) {
        for id in self.multi_in_session(d) {
            self.fail_multi(sched, id, &LockError::NoSession);
        }
        let mut single = Vec::new();
        for q in self.queues.values().flat_map(|db| db.values()) {
            single.extend(
                q.waiters
                    .iter()
                    .filter(|w| w.handle.is_some() && w.session.as_ref() == Some(d))
                    .map(|w| w.id),
            );
        }
        for id in single {
            if let Some(h) = self.abandon(id, self.now) {
                sched.answer(h, super::Answer::Failed(LockError::NoSession));
            }
        }
    }

    fn forget_session(&mut self, d: &Digest) {
        self.bind(*d, None);
        if let Some(s) = self.sessions.by_digest.remove(d) {
            self.agenda.remove(&(s.due, Task::SessionEnd(*d)));
        }
    }

    /// The session's end fell due (its TTL, or its bound connection's grace period).
    pub(super) fn session_due<St: Store, S: Sched<Waiter = W>>(
        &mut self,
        store: &mut St,
        sched: &mut S,
        d: &Digest,
        now: i64,
    ) {
        let Some(s) = self.sessions.by_digest.get(d) else {
            return;
        };
        if s.end_at() > now {
            // Renewed since: its end stands later on the agenda.
            return;
        }
        if self.leases_paused {
            // A replica: its primary ends sessions (promotion puts them back on the
            // agenda).
            return;
        }
        self.end_session(store, sched, d, Ending::Lapsed);
    }

    /// SWAPDB a b: the sessions' locks changed dbs with their keys.
    pub(super) fn sessions_swapped(&mut self, a: i32, b: i32) {
        let swap = |db: i32| match db {
            x if x == a => b,
            x if x == b => a,
            x => x,
        };
        for s in self.sessions.by_digest.values_mut() {
            s.keys = std::mem::take(&mut s.keys)
                .into_iter()
                .map(|(db, name)| (swap(db), name))
                .collect();
        }
    }

    /// This server became a primary: the sessions end on its clock from now on.
    pub(super) fn sessions_promoted(&mut self) {
        let all: Vec<Digest> = self.sessions.by_digest.keys().copied().collect();
        for d in all {
            if let Some(s) = self.sessions.by_digest.get_mut(&d) {
                s.due = i64::MIN;
            }
            self.schedule_end(&d);
        }
    }

    /// A client connection closed: the sessions bound to it end after their grace period.
    pub fn client_gone(&mut self, client: u64, now: i64) {
        let Some(list) = self.sessions.by_client.remove(&client) else {
            return;
        };
        for d in list {
            if let Some(s) = self.sessions.by_digest.get_mut(&d) {
                let grace = s.bound.map_or(0, |(_, g)| g);
                let at = now.saturating_add(
                    i64::try_from(grace)
                        .unwrap_or(i64::MAX)
                        .saturating_mul(1000),
                );
                s.ending = Some(at);
            }
            self.schedule_end(&d);
        }
    }

    /// A session change from the primary's stream or the AOF.
    pub fn session_apply<St: Store, S: Sched<Waiter = W>>(
        &mut self,
        store: &mut St,
        sched: &mut S,
        c: SessionApply,
    ) {
        self.now = self.now.max(store.clock().mono);
        match c {
            SessionApply::Open {
                digest,
                ttl,
                deadline,
                owner,
            } => {
                // As the primary did: a session that lost a lock to a move is new.
                self.replace_moved(&digest, self.now);
                let s = self
                    .sessions
                    .by_digest
                    .entry(digest)
                    .or_insert_with(|| Session::new(ttl, deadline));
                s.ttl = ttl;
                if owner.is_some() {
                    s.owner = owner;
                }
                self.renew_session(store, &digest, deadline, Renew::All);
                self.schedule_end(&digest);
            }
            SessionApply::Renew {
                digest,
                ttl,
                deadline,
            } => {
                if let Some(s) = self.sessions.by_digest.get_mut(&digest) {
                    s.ttl = ttl;
                }
                self.renew_session(store, &digest, deadline, Renew::All);
                self.schedule_end(&digest);
            }
            SessionApply::Seen {
                digest,
                ttl,
                deadline,
                owner,
            } => {
                let s = self
                    .sessions
                    .by_digest
                    .entry(digest)
                    .or_insert_with(|| Session::new(ttl, deadline));
                if ttl > 0 {
                    s.ttl = ttl;
                } else if s.ttl == 0 {
                    // The rewrite did not know the session's lease: the time left.
                    s.ttl = u64::try_from((deadline - self.now).max(1000) / 1000).unwrap_or(1);
                }
                s.deadline = s.deadline.max(deadline);
                if owner.is_some() {
                    s.owner = owner;
                }
                self.schedule_end(&digest);
            }
            SessionApply::Moved { digest } => {
                if let Some(s) = self.sessions.by_digest.get_mut(&digest) {
                    s.moved = true;
                }
            }
            SessionApply::End { digest } => {
                // The primary sent the end of each lock before this: what is left here
                // (nothing, normally) ends as a lapse would.
                if self.sessions.by_digest.contains_key(&digest) {
                    let paused = std::mem::replace(&mut self.leases_paused, false);
                    self.end_session(store, sched, &digest, Ending::Lapsed);
                    self.leases_paused = paused;
                }
                self.forget_session(&digest);
            }
        }
    }

    /// The open sessions, as the auxiliary RDB data keeps them.
    pub fn session_records(&self) -> Vec<crate::lock::codec::SessionRecord> {
        self.sessions
            .by_digest
            .iter()
            .map(|(d, s)| crate::lock::codec::SessionRecord {
                digest: *d,
                ttl: s.ttl,
                deadline: s.deadline,
                owner: s.owner.clone(),
                moved: s.moved,
            })
            .collect()
    }

    /// Sessions read back from the auxiliary RDB data (after the keys: a session some
    /// lock already named keeps the keys it learned of). The list is every session open
    /// where the file was written: one known here that it lacks is forgotten (a replica's
    /// full sync from another primary, or a session that ended on the primary while the
    /// replica was away; kept, a promoted replica would renew it and its locks' holder
    /// would believe them held). Its bound connection, where it stays, is kept.
    pub fn sessions_loaded(&mut self, list: Vec<crate::lock::codec::SessionRecord>) {
        let listed: std::collections::HashSet<Digest> = list.iter().map(|r| r.digest).collect();
        let stale: Vec<Digest> = self
            .sessions
            .by_digest
            .keys()
            .filter(|d| !listed.contains(*d))
            .copied()
            .collect();
        for d in stale {
            self.forget_session(&d);
        }
        for r in list {
            let s = self
                .sessions
                .by_digest
                .entry(r.digest)
                .or_insert_with(|| Session::new(r.ttl, r.deadline));
            s.ttl = r.ttl;
            s.deadline = s.deadline.max(r.deadline);
            s.owner = r.owner;
            s.moved = r.moved;
            self.schedule_end(&r.digest);
        }
    }

    /// `LOCK.SESSION INFO`: the session's lease, binding, label, and up to `count` of the
    /// locks it holds here (key and fence); nil when it is not open here (one that lost
    /// a lock to a slot move is not: nothing keeps it alive here).
    pub fn session_info<St: Store>(
        &mut self,
        store: &mut St,
        d: &Digest,
        count: usize,
    ) -> Reply<'static> {
        let clock = store.clock();
        let Some(s) = self.open_at(d, clock.mono) else {
            return Reply::Nil;
        };
        let (ttl, deadline, owner, bound, ending) =
            (s.ttl, s.deadline, s.owner.clone(), s.bound, s.ending);
        let keys: Vec<QueueKey> = s.keys.iter().cloned().collect();
        let mut list = Vec::new();
        let mut held = 0u64;
        for (db, name) in keys {
            let Some(mut ks) = store.open(db, &name) else {
                continue;
            };
            let Ok(Slot::Lock(v)) = ks.read() else {
                continue;
            };
            for h in v.iter().filter(|h| h.session() == Some(d)) {
                held += 1;
                if list.len() < count {
                    list.push(Reply::Array(vec![
                        Reply::Bulk(Bytes::Own(name.to_vec())),
                        Reply::Int(i64::try_from(h.fence).unwrap_or(i64::MAX)),
                        Reply::Int(i64::from(db)),
                    ]));
                }
            }
        }
        let left = clock.remaining_ms(deadline).max(0);
        let fields = vec![
            ("ttl", Reply::Int(left)),
            ("expires-at", Reply::Int(clock.to_wall(deadline))),
            ("lease", Reply::Int(i64::try_from(ttl).unwrap_or(i64::MAX))),
            (
                "owner",
                owner.map_or(Reply::Nil, |o| Reply::Bulk(Bytes::Own(o.into_vec()))),
            ),
            ("bound", Reply::bool(bound.is_some())),
            (
                "grace",
                bound.map_or(Reply::Nil, |(_, g)| {
                    Reply::Int(i64::try_from(g).unwrap_or(i64::MAX))
                }),
            ),
            (
                "ending-in",
                ending.map_or(Reply::Nil, |e| Reply::Int(clock.remaining_ms(e).max(0))),
            ),
            ("locks", Reply::Int(i64::try_from(held).unwrap_or(i64::MAX))),
            ("lock-list", Reply::Array(list)),
        ];
        Reply::Map(fields)
    }

    /// For a grant in session `d`: its deadline (the session's), or NOSESSION.
    pub(super) fn session_lease(&self, d: Option<&Digest>) -> Result<Option<i64>, LockError> {
        match d {
            None => Ok(None),
            Some(d) => self
                .open_at(d, self.now)
                .map(|s| Some(s.deadline))
                .ok_or(LockError::NoSession),
        }
    }
}

/// A session change read back from the stream or an AOF, in this server's clock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SessionApply {
    Open {
        digest: Digest,
        ttl: u64,
        deadline: i64,
        owner: Option<Box<[u8]>>,
    },
    Renew {
        digest: Digest,
        ttl: u64,
        deadline: i64,
    },
    End {
        digest: Digest,
    },
    /// A lock of the session left the primary with its slot (see `Session::moved`).
    Moved {
        digest: Digest,
    },
    /// An AOF rewrite names a holder's session (see `SessionChange::Seen`).
    Seen {
        digest: Digest,
        ttl: u64,
        deadline: i64,
        owner: Option<Box<[u8]>>,
    },
}
