//! The commands, decided whole: each takes the open key and answers with a reply (or
//! blocks the caller through [`Sched::block`]).

use super::queue::Wait;
use super::watch::WatchReq;
use super::{mismatch, Engine, Event, Keyspace, Name, NewHolder, Sched, Slot, Which};
use crate::args::Info;
use crate::error::LockError;
use crate::lock::codec::repl::ReplCmd;
use crate::lock::fence::FENCE_LEAD_MS;
use crate::lock::value::{self, check_family, Addr, LockValue, Mode};
use crate::reply::{Bytes, Reply};

/// A LOCK.ACQUIRE as the engine needs it.
#[derive(Debug, Clone)]
pub struct AcquireReq<'a> {
    pub mode: Mode,
    pub ttl: u64,
    pub token: Option<&'a [u8]>,
    pub owner: Option<&'a [u8]>,
    /// BLOCK: `Some(0)` waits without limit.
    pub block: Option<u64>,
    pub min_fence: u64,
    /// The grant's lock-delay (ms; 0: none).
    pub lock_delay: u32,
    pub client_id: u64,
    pub addr: Addr,
    /// SESSION: the digest of the session id the grant belongs to.
    pub session: Option<value::Digest>,
}

/// One command on one key.
#[derive(Debug, Clone)]
pub enum Command<'a> {
    Acquire(AcquireReq<'a>),
    Release(&'a [u8]),
    Extend {
        token: &'a [u8],
        ttl: u64,
        /// A new label for the holder (its fence, the term, is kept).
        owner: Option<&'a [u8]>,
    },
    ForceRelease(Option<u64>),
    Info(Info),
    /// LOCK.CHECK: whether this fence is a current holder's.
    Check(u64),
    /// Whether this token holds the key now (LOCK.IFHELD asks before it runs anything).
    Holds(&'a [u8]),
    /// Whether this fence holds the key now (LOCK.IFFENCE).
    HoldsFence(u64),
    /// LOCK.WATCH.
    Watch(WatchReq),
    /// A change from the primary's stream or the AOF, with the fence ceiling that applies.
    Apply {
        cmd: ReplCmd,
        ceiling: u64,
    },
}

impl Command<'_> {
    /// Whether the command may change the key (its watchers look at it after).
    pub fn changes(&self) -> bool {
        !matches!(
            self,
            Command::Info(_)
                | Command::Check(_)
                | Command::Holds(_)
                | Command::HoldsFence(_)
                | Command::Watch(_)
        )
    }

    /// Whether the command only reads (a replica answers it; no write checks apply).
    pub fn reads_only(&self) -> bool {
        matches!(
            self,
            Command::Info(_) | Command::Check(_) | Command::Watch(_)
        )
    }
}

/// What an acquire can do now.
pub(super) enum Step {
    Grant,
    Renew(value::Digest),
    Busy(Option<i64>),
}

/// What a command comes to: a reply now, or none because the caller waits.
#[derive(Debug)]
pub enum Outcome<'a> {
    Reply(Reply<'a>),
    Blocked,
}

impl<W> Engine<W> {
    /// Decides one command on the open key `ks`.
    pub fn handle<'a, S: Sched<Waiter = W>>(
        &mut self,
        cmd: Command<'a>,
        ks: &mut impl Keyspace,
        sched: &mut S,
    ) -> Outcome<'a> {
        self.now = self.now.max(ks.clock().mono);
        self.restore_pending(ks);
        let ks = &mut self.kept(ks);
        let changes = cmd.changes();
        let reply = match cmd {
            Command::Acquire(req) => self.try_acquire(ks, sched, req),
            Command::Watch(req) => self.watch(ks, sched, req),
            Command::Release(token) => self
                .release_and_serve(ks, sched, Which::Token(token), false)
                .map(|b| Some(Reply::bool(b))),
            Command::Extend { token, ttl, owner } => self
                .extend(ks, token, ttl, owner)
                .map(|b| Some(Reply::bool(b))),
            Command::ForceRelease(fence) => self
                .release_and_serve(ks, sched, fence.map_or(Which::All, Which::Fence), true)
                .map(|b| Some(Reply::bool(b))),
            Command::Info(page) => self.info(ks, page).map(Some),
            Command::Check(fence) | Command::HoldsFence(fence) => self
                .holds(ks, Which::Fence(fence))
                .map(|b| Some(Reply::bool(b))),
            Command::Holds(token) => self
                .holds(ks, Which::Token(token))
                .map(|b| Some(Reply::bool(b))),
            Command::Apply { cmd, ceiling } => {
                self.apply(ks, cmd, ceiling).map(|()| Some(Reply::Ok))
            }
        };
        // Whoever watches the key looks at it after this command (on the agenda: the
        // command itself pays nothing more for its watchers).
        if changes && self.watched_any() {
            let name = Name::of(ks.name());
            self.note(ks.db(), &name, self.now);
        }
        self.request_wake(sched);
        match reply {
            Ok(Some(r)) => Outcome::Reply(r),
            Ok(None) => Outcome::Blocked,
            Err(e) => Outcome::Reply(Reply::Error(e)),
        }
    }

    /// Grant, renew, wait or nil. `Ok(None)`: the caller was blocked.
    fn try_acquire<'a, S: Sched<Waiter = W>>(
        &mut self,
        ks: &mut impl Keyspace,
        sched: &mut S,
        req: AcquireReq<'a>,
    ) -> Result<Option<Reply<'a>>, LockError> {
        let clock = ks.clock();
        if req.min_fence > self.fence.ceiling(clock.wall, FENCE_LEAD_MS) {
            return Err(LockError::FenceTooFarAhead);
        }
        self.session_lease(req.session.as_ref())?;
        let digest = req.token.map(|t| self.tokens.digest(t));
        let db = ks.db();
        let step = self.step(ks, sched, req.mode, digest)?;
        let serve_at = match step {
            Step::Grant => return self.grant_to_caller(ks, &req, digest).map(Some),
            Step::Renew(d) => {
                let fence = self.renew(
                    ks,
                    &d,
                    req.mode,
                    req.ttl,
                    req.min_fence,
                    req.session.as_ref(),
                )?;
                self.stats.renewed += 1;
                ks.changed(Event::Acquire);
                let token = req.token.unwrap_or_default();
                return Ok(fence.map(|f| Reply::Grant(Bytes::Ref(token), f)));
            }
            Step::Busy(at) => at,
        };
        self.stats.contended += 1;
        let Some(block) = req.block else {
            return Ok(Some(Reply::Nil));
        };
        let deadline = crate::args::block_deadline(clock.mono, block)?;
        let name = super::Name::of(ks.name());
        if self.queued(db, &name) as u64 >= self.settings.max_waiters {
            return Err(LockError::TooManyWaiters(self.settings.max_waiters));
        }
        let Some((id, handle)) = sched.block() else {
            return Ok(Some(Reply::Nil));
        };
        if matches!(ks.read(), Ok(Slot::Classic(_))) {
            ks.waits_on_classic();
        }
        let token = match req.token {
            Some(t) => t.to_vec(),
            None => ks.new_token().to_vec(),
        };
        let wait = Wait {
            id,
            mode: req.mode,
            digest: digest.unwrap_or_else(|| value::digest(&token)),
            token,
            ttl: req.ttl,
            min_fence: req.min_fence,
            owner: req.owner.map(Into::into),
            lock_delay: req.lock_delay,
            client_id: req.client_id,
            addr: req.addr,
            session: req.session,
            since: clock.mono,
            deadline,
            moved: false,
            handle: Some(handle),
        };
        // The key's lease end must be filed for the hand-off: it is, unless the value came
        // here behind the engine's back (RENAMEd or MOVEd onto this name).
        if let Ok(Slot::Lock(v)) = ks.read() {
            if let Some(at) = v.next_lease_end() {
                self.leases.insert(at, db, &name, self.now);
            }
        }
        self.enqueue(db, &name, wait, serve_at);
        Ok(None)
    }

    /// What an acquire of `mode` (by the token whose digest is `digest`) can do on this
    /// key now: deferred hand-offs first, then leases that are over, then the decision.
    /// An acquire that would grant or wait is refused where eviction could take the lock.
    pub(super) fn step<S: Sched<Waiter = W>>(
        &mut self,
        ks: &mut impl Keyspace,
        sched: &mut S,
        mode: Mode,
        digest: Option<value::Digest>,
    ) -> Result<Step, LockError> {
        let clock = ks.clock();
        let db = ks.db();
        if self.has_waiters(db, ks.name()) {
            // A key may still have waiters whose hand-off was deferred: they go first.
            self.serve(ks, sched);
        }
        self.reap(ks)?;
        let queued = self.queue_family(db, ks.name());
        let step = match ks.read()? {
            Slot::Classic(_) if matches!(mode, Mode::Counted(_)) => {
                return Err(LockError::WrongMode)
            }
            Slot::Classic(expiry) => {
                Step::Busy(expiry.map(|t| clock.from_wall(t).saturating_add(1000)))
            }
            Slot::Lock(v) => match digest.filter(|d| v.find(d).is_some()) {
                Some(d) => Step::Renew(d),
                None => {
                    // An emptied key whose lock-delay runs takes any kind of lock after.
                    let family = if v.is_empty() {
                        queued
                    } else {
                        Some(v.mode().family())
                    };
                    if let Some(f) = family {
                        check_family(f, mode).map_err(mismatch)?;
                    }
                    if queued.is_none() && v.admits(mode, clock.mono) {
                        Step::Grant
                    } else {
                        Step::Busy(None)
                    }
                }
            },
            Slot::Free => match queued {
                Some(f) => {
                    check_family(f, mode).map_err(mismatch)?;
                    Step::Busy(Some(clock.mono))
                }
                None => Step::Grant,
            },
        };
        if let (Some(policy), Step::Grant | Step::Busy(_)) = (self.settings.refuse_grants, &step) {
            self.stats.refused_eviction += 1;
            return Err(LockError::Evictable(policy));
        }
        Ok(step)
    }

    fn grant_to_caller<'a>(
        &mut self,
        ks: &mut impl Keyspace,
        req: &AcquireReq<'a>,
        digest: Option<value::Digest>,
    ) -> Result<Reply<'a>, LockError> {
        let (token, digest) = match (req.token, digest) {
            (Some(t), Some(d)) => (Bytes::Ref(t), d),
            _ => {
                let t = ks.new_token();
                (Bytes::Uuid(t), value::digest(&t))
            }
        };
        let fence = self.grant(
            ks,
            NewHolder {
                mode: req.mode,
                digest,
                ttl: req.ttl,
                min_fence: req.min_fence,
                owner: req.owner,
                lock_delay: req.lock_delay,
                client_id: req.client_id,
                addr: &req.addr,
                session: req.session,
            },
        )?;
        ks.changed(Event::Acquire);
        Ok(Reply::Grant(token, fence))
    }

    /// LOCK.EXTEND: a new lease for the holder `token` names.
    fn extend(
        &mut self,
        ks: &mut impl Keyspace,
        token: &[u8],
        ttl: u64,
        owner: Option<&[u8]>,
    ) -> Result<bool, LockError> {
        let clock = ks.clock();
        self.reap(ks)?;
        let (d, mode) = match ks.read()? {
            Slot::Free => return Ok(false),
            Slot::Classic(_) => {
                if !ks.classic_matches(token) {
                    return Ok(false);
                }
                if owner.is_some() {
                    return Err(LockError::NoLabel);
                }
                let at = clock
                    .wall
                    .saturating_add(i64::try_from(ttl).unwrap_or(i64::MAX));
                ks.set_classic_expiry(at);
                ks.replicate(crate::lock::codec::repl::Change::ClassicExpireAt(at));
                ks.changed(Event::Extend);
                self.stats.extended += 1;
                return Ok(true);
            }
            Slot::Lock(v) => {
                let d = self.tokens.digest(token);
                match v.find(&d) {
                    None => return Ok(false),
                    Some(h) if h.session().is_some() => return Err(LockError::InSession),
                    Some(_) => {}
                }
                (d, v.mode())
            }
        };
        self.renew(ks, &d, mode, ttl, 0, None)?;
        if let Some(label) = owner {
            self.relabel(ks, &d, label)?;
        }
        ks.changed(Event::Extend);
        self.stats.extended += 1;
        Ok(true)
    }

    /// The holder `digest` names takes a new owner label (its fence stays: the same term,
    /// published anew); replicated as the whole holder.
    fn relabel(
        &mut self,
        ks: &mut impl Keyspace,
        digest: &value::Digest,
        label: &[u8],
    ) -> Result<(), LockError> {
        let Slot::Lock(v) = ks.read()? else {
            return Ok(());
        };
        let mode = v.mode();
        let Some(h) = v.find(digest) else {
            return Ok(());
        };
        if h.owner() == Some(label) {
            return Ok(());
        }
        let fence = h.fence;
        let Some(holder) = v.set_owner(fence, Some(label.into())).cloned() else {
            return Ok(());
        };
        ks.replicate(crate::lock::codec::repl::Change::Add {
            mode,
            holder: &holder,
            floor: 0,
        });
        Ok(())
    }

    /// Whether the holder the token (or fence) names holds the key now. Read-only: a
    /// lease that is over does not hold, whether or not it was removed yet.
    fn holds(&mut self, ks: &mut impl Keyspace, which: Which<'_>) -> Result<bool, LockError> {
        let now = ks.clock().mono;
        let digest = match which {
            Which::Token(t) => Some(self.tokens.digest(t)),
            _ => None,
        };
        match ks.read()? {
            Slot::Free => Ok(false),
            Slot::Classic(_) => Ok(match which {
                Which::Token(t) => ks.classic_matches(t),
                _ => false,
            }),
            Slot::Lock(v) => {
                let h = match (which, digest) {
                    (Which::Fence(f), _) => v.find_fence(f),
                    (_, Some(d)) => v.find(&d),
                    _ => None,
                };
                Ok(h.is_some_and(|h| h.live(now)))
            }
        }
    }

    /// Applies a change from the primary's stream or the AOF. The fence counter learns
    /// every fence and floor; the value stays valid whatever arrives (a holder with a
    /// token already present replaces that holder).
    fn apply(
        &mut self,
        ks: &mut impl Keyspace,
        cmd: ReplCmd,
        ceiling: u64,
    ) -> Result<(), LockError> {
        let (db, name) = (ks.db(), super::Name::of(ks.name()));
        match cmd {
            ReplCmd::Add {
                mode,
                holder,
                floor,
            } => {
                holder
                    .check(ceiling)
                    .map_err(|_| LockError::FenceTooFarAhead)?;
                if floor > ceiling {
                    return Err(LockError::FenceTooFarAhead);
                }
                self.fence.observe(holder.fence.max(floor));
                if let Some(s) = holder.session() {
                    // The session is known here from its first lock on (a replica's stream
                    // opens it first; an AOF rewritten without its preamble may not).
                    let one = LockValue::new(Mode::Exclusive, holder.clone());
                    let s = *s;
                    self.sessions_seen(db, &name, &one);
                    self.session_holds(&s, db, &name);
                }
                let joined = match ks.read() {
                    Ok(Slot::Lock(v)) if v.mode() == mode && mode != Mode::Exclusive => {
                        let before = v.next_lease_end();
                        let old = [v.find(&holder.digest), v.find_fence(holder.fence)]
                            .into_iter()
                            .flatten()
                            .map(|h| h.fence)
                            .collect::<Vec<_>>();
                        for f in old {
                            v.remove_fence(f);
                        }
                        let ok = v.insert(holder.clone(), ceiling).is_ok();
                        let after = v.next_lease_end();
                        self.reindex(db, &name, before, after);
                        ok
                    }
                    _ => false,
                };
                if !joined {
                    self.drop_value(ks);
                    let at = holder.deadline;
                    ks.put(LockValue::new(mode, holder))?;
                    self.reindex(db, &name, None, Some(at));
                }
            }
            ReplCmd::Renew {
                fence,
                deadline,
                floor,
            } => {
                if floor > ceiling {
                    return Err(LockError::FenceTooFarAhead);
                }
                self.fence.observe(floor);
                if let Ok(Slot::Lock(v)) = ks.read() {
                    let before = v.next_lease_end();
                    v.set_deadline(fence, deadline);
                    let after = v.next_lease_end();
                    let session = v.find_fence(fence).and_then(|h| h.session()).copied();
                    self.reindex(db, &name, before, after);
                    if let Some(d) = session {
                        self.session_renewed(&d, deadline);
                    }
                }
            }
            ReplCmd::Delay { until } => {
                let (mode, kept) = match ks.read() {
                    Ok(Slot::Lock(v)) => {
                        let before = v.next_lease_end();
                        let kept = v.set_delay(until);
                        if kept {
                            let after = v.next_lease_end();
                            self.reindex(db, &name, before, after);
                        }
                        (v.mode(), kept)
                    }
                    _ => (Mode::Exclusive, false),
                };
                if !kept {
                    self.drop_value(ks);
                    ks.put(LockValue::delayed(mode, until))?;
                    self.reindex(db, &name, None, Some(until));
                }
            }
            ReplCmd::Drop { fence } => {
                let emptied = match ks.read() {
                    Ok(Slot::Lock(v)) if v.find_fence(fence).is_some() => {
                        let before = v.next_lease_end();
                        if v.mode() == Mode::Exclusive || v.len() == 1 {
                            true
                        } else {
                            v.remove_fence(fence);
                            let after = v.next_lease_end();
                            self.reindex(db, &name, before, after);
                            false
                        }
                    }
                    _ => false,
                };
                if emptied {
                    self.drop_value(ks);
                }
            }
        }
        ks.changed(Event::Applied);
        Ok(())
    }

    /// Removes whatever lock value the key holds (and its lease entry).
    fn drop_value(&mut self, ks: &mut impl Keyspace) {
        let (db, name) = (ks.db(), super::Name::of(ks.name()));
        let before = match ks.read() {
            Ok(Slot::Lock(v)) => Some(v.next_lease_end()),
            Ok(Slot::Free) => None,
            _ => Some(None),
        };
        if let Some(b) = before {
            self.reindex(db, &name, b, None);
            ks.remove();
        }
    }
}
