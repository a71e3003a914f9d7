//! All-or-nothing acquires of several keys (`LOCK.ACQUIREALL`): every key is granted in
//! the same step, or none is.
//!
//! With BLOCK the request waits in every key's FIFO queue at once, holding one place in
//! each (a part: a queue entry without a client of its own; the client and the request
//! are here, by the waiter's id). It is granted when it is first in line on every key and
//! every key admits it, all keys in one step. Nobody barges: a later request for any of
//! the keys waits behind it. And nobody deadlocks: a request is queued on all its keys in
//! one step, so any two requests stand in the same order on every key they share; a
//! request waits only for requests that arrived before it and for holders, whose leases
//! end. Two clients asking for {a, b} and {b, a} are both served, in arrival order.

use super::commands::Step;
use super::queue::Wait;
use super::timeline::Task;
use super::{Answer, Engine, Event, Gate, Keyspace, NewHolder, QueueKey, Sched, Store, WaiterId};
use crate::error::LockError;
use crate::lock::fence::FENCE_LEAD_MS;
use crate::lock::value::{self, Addr, Digest, Mode};
use crate::reply::{Bytes, Reply};

/// The most keys one LOCK.ACQUIREALL takes.
pub const MAX_KEYS: usize = 100;

/// A LOCK.ACQUIREALL as the engine needs it (`keys` distinct, each with its mode).
#[derive(Debug, Clone)]
pub struct AcquireAllReq<'a> {
    pub keys: Vec<(&'a [u8], Mode)>,
    pub db: i32,
    pub ttl: u64,
    pub token: Option<&'a [u8]>,
    pub owner: Option<&'a [u8]>,
    /// BLOCK: `Some(0)` waits without limit.
    pub block: Option<u64>,
    pub min_fence: u64,
    pub lock_delay: u32,
    pub client_id: u64,
    pub addr: Addr,
    pub session: Option<Digest>,
}

/// A waiter for several keys, and its client.
#[derive(Debug)]
pub(super) struct MultiWait<W> {
    keys: Vec<(QueueKey, Mode)>,
    token: Vec<u8>,
    digest: Digest,
    ttl: u64,
    min_fence: u64,
    owner: Option<Box<[u8]>>,
    lock_delay: u32,
    client_id: u64,
    addr: Addr,
    session: Option<Digest>,
    /// The BLOCK deadline (None: no limit).
    deadline: Option<i64>,
    handle: W,
}

impl<W> Engine<W> {
    /// LOCK.ACQUIREALL: grants every key or none. `Ok(None)`: the caller was blocked.
    pub fn acquire_all<'a, St: Store, S: Sched<Waiter = W>>(
        &mut self,
        store: &mut St,
        sched: &mut S,
        req: AcquireAllReq<'a>,
    ) -> Result<Option<Reply<'a>>, LockError> {
        let clock = store.clock();
        self.now = self.now.max(clock.mono);
        if req.keys.is_empty() || req.keys.len() > MAX_KEYS {
            return Err(LockError::Syntax(format!(
                "LOCK.ACQUIREALL takes 1 to {MAX_KEYS} keys"
            )));
        }
        for (i, (k, _)) in req.keys.iter().enumerate() {
            if req.keys[..i].iter().any(|(x, _)| x == k) {
                return Err(LockError::Syntax("a key is named twice".into()));
            }
        }
        if req.min_fence > self.fence.ceiling(clock.wall, FENCE_LEAD_MS) {
            return Err(LockError::FenceTooFarAhead);
        }
        self.session_lease(req.session.as_ref())?;
        let db = req.db;
        let token: Vec<u8> = match req.token {
            Some(t) => t.to_vec(),
            None => match store.open(db, req.keys[0].0) {
                Some(mut ks) => ks.new_token().to_vec(),
                None => return Err(LockError::Internal("lock.acquireall")),
            },
        };
        let digest = match req.token {
            Some(t) => self.tokens.digest(t),
            None => value::digest(&token),
        };
        // Every key's step first: nothing changes unless every key can be had now.
        let mut steps = Vec::with_capacity(req.keys.len());
        for (name, mode) in &req.keys {
            let mut ks = store
                .open(db, name)
                .ok_or(LockError::Internal("lock.acquireall"))?;
            steps.push(self.step(&mut ks, sched, *mode, Some(digest))?);
        }
        let busy = steps.iter().any(|s| matches!(s, Step::Busy(_)));
        if !busy {
            let keys: Vec<(QueueKey, Mode)> = req
                .keys
                .iter()
                .map(|(k, m)| ((db, Box::from(*k)), *m))
                .collect();
            let how = NewHolder {
                mode: Mode::Exclusive,
                digest,
                ttl: req.ttl,
                min_fence: req.min_fence,
                owner: req.owner,
                lock_delay: req.lock_delay,
                client_id: req.client_id,
                addr: &req.addr,
                session: req.session,
            };
            let fences = self.grant_each(store, &keys, &how, Event::Acquire)?;
            return Ok(Some(grant_reply(token, &fences)));
        }
        self.stats.contended += 1;
        let Some(block) = req.block else {
            return Ok(Some(Reply::Nil));
        };
        let deadline = crate::args::block_deadline(clock.mono, block)?;
        for (name, _) in &req.keys {
            if self.queued(db, name) as u64 >= self.settings.max_waiters {
                return Err(LockError::TooManyWaiters(self.settings.max_waiters));
            }
        }
        let Some((id, handle)) = sched.block() else {
            return Ok(Some(Reply::Nil));
        };
        for ((name, mode), step) in req.keys.iter().zip(&steps) {
            let serve_at = match step {
                Step::Busy(at) => *at,
                _ => Some(clock.mono),
            };
            if let Some(mut ks) = store.open(db, name) {
                if matches!(ks.read(), Ok(super::Slot::Classic(_))) {
                    ks.waits_on_classic();
                }
            }
            let part = Wait {
                id,
                mode: *mode,
                token: Vec::new(),
                digest,
                ttl: 0,
                min_fence: 0,
                owner: None,
                lock_delay: 0,
                client_id: req.client_id,
                addr: Addr::None,
                session: None,
                since: clock.mono,
                deadline: None,
                moved: false,
                handle: None,
            };
            self.enqueue(db, name, part, serve_at);
        }
        if let Some(at) = deadline {
            self.agenda.insert((at, Task::Timeout(id)));
        }
        self.multi.insert(
            id,
            MultiWait {
                keys: req
                    .keys
                    .iter()
                    .map(|(k, m)| ((db, Box::from(*k)), *m))
                    .collect(),
                token,
                digest,
                ttl: req.ttl,
                min_fence: req.min_fence,
                owner: req.owner.map(Into::into),
                lock_delay: req.lock_delay,
                client_id: req.client_id,
                addr: req.addr,
                session: req.session,
                deadline,
                handle,
            },
        );
        Ok(None)
    }

    /// The grants (or same-token renewals) of `keys`, in order, or none of them; `how`
    /// says who for (its mode is each key's own).
    fn grant_each<St: Store>(
        &mut self,
        store: &mut St,
        keys: &[(QueueKey, Mode)],
        how: &NewHolder<'_>,
        event: Event,
    ) -> Result<Vec<u64>, LockError> {
        let mut fences = Vec::with_capacity(keys.len());
        let mut done: Vec<(QueueKey, bool)> = Vec::new();
        for ((db, name), mode) in keys {
            let Some(mut ks) = store.open(*db, name) else {
                self.give_back(store, &done, &how.digest);
                return Err(LockError::Internal("lock.acquireall"));
            };
            let held =
                matches!(ks.read(), Ok(super::Slot::Lock(v)) if v.find(&how.digest).is_some());
            let r = if held {
                self.renew(
                    &mut ks,
                    &how.digest,
                    *mode,
                    how.ttl,
                    how.min_fence,
                    how.session.as_ref(),
                )
                .and_then(|f| f.ok_or(LockError::Internal("lock.acquireall")))
            } else {
                self.grant(
                    &mut ks,
                    NewHolder {
                        mode: *mode,
                        ..*how
                    },
                )
            };
            match r {
                Ok(f) => {
                    ks.changed(event);
                    // Whoever watches the key looks at it after this step.
                    self.note(*db, name, self.now);
                    fences.push(f);
                    done.push(((*db, name.clone()), !held));
                }
                Err(e) => {
                    drop(ks);
                    self.give_back(store, &done, &how.digest);
                    return Err(e);
                }
            }
        }
        Ok(fences)
    }

    /// Undoes the grants of a step that failed part way (renewals stay).
    fn give_back<St: Store>(&mut self, store: &mut St, done: &[(QueueKey, bool)], d: &Digest) {
        for ((db, name), granted) in done {
            if !granted {
                continue;
            }
            if let Some(mut ks) = store.open(*db, name) {
                let _ = self.remove_holders(&mut ks, super::Which::Digest(d));
            }
            self.serve_by(*db, name, self.now);
        }
    }

    /// A waiter for several keys may be grantable: first in line on every key, every key
    /// admitting it. Then every key is granted in one step and the client answered.
    pub(super) fn serve_multi<St: Store, S: Sched<Waiter = W>>(
        &mut self,
        store: &mut St,
        sched: &mut S,
        id: WaiterId,
        now: i64,
    ) {
        let Some(mw) = self.multi.get(&id) else {
            return;
        };
        if mw.deadline.is_some_and(|d| d <= now) {
            // Its BLOCK time ran out while the server was busy.
            self.stats.wait_timeouts += 1;
            return self.fail_multi_nil(sched, id);
        }
        let (keys, digest) = (mw.keys.clone(), mw.digest);
        for ((db, name), mode) in &keys {
            let first = self
                .queue(*db, name)
                .and_then(|q| q.waiters.front())
                .is_some_and(|w| w.id == id);
            if !first {
                // Not its turn on this key: whoever is ahead is served first, and the
                // key's service comes back to it.
                return;
            }
            let Some(mut ks) = store.open(*db, name) else {
                return self.fail_multi(sched, id, &LockError::Internal("lock.acquireall"));
            };
            match ks.gate() {
                Gate::Now => {}
                Gate::Later => {
                    self.agenda
                        .insert((now.saturating_add(super::RETRY_US), Task::ServeMulti(id)));
                    return;
                }
                Gate::NotHere => return self.fail_multi(sched, id, &LockError::TryAgain),
                Gate::Replica => return self.fail_multi(sched, id, &LockError::Unblocked),
            }
            if let Err(e) = self.reap(&mut ks) {
                return self.fail_multi(sched, id, &e);
            }
            match self.verdict(&mut ks, (*mode, &digest)) {
                super::queue::Verdict::Grant | super::queue::Verdict::Renew => {}
                super::queue::Verdict::Wait => return,
                super::queue::Verdict::Fail(e) | super::queue::Verdict::FailAll(e) => {
                    return self.fail_multi(sched, id, &e)
                }
            }
        }
        let Some(mw) = self.multi.remove(&id) else {
            return;
        };
        for ((db, name), _) in &mw.keys {
            if let Some(q) = self.queue_mut(*db, name) {
                q.waiters.retain(|w| w.id != id);
            }
        }
        self.by_id.remove(&id);
        if let Some(at) = mw.deadline {
            self.agenda.remove(&(at, Task::Timeout(id)));
        }
        let how = NewHolder {
            mode: Mode::Exclusive,
            digest: mw.digest,
            ttl: mw.ttl,
            min_fence: mw.min_fence,
            owner: mw.owner.as_deref(),
            lock_delay: mw.lock_delay,
            client_id: mw.client_id,
            addr: &mw.addr,
            session: mw.session,
        };
        let answer = match self.grant_each(store, &mw.keys, &how, Event::Handoff) {
            Ok(fences) => {
                self.stats.handed_off += mw.keys.len() as u64;
                Answer::GrantedAll {
                    token: mw.token.clone(),
                    fences,
                    keys: mw.keys.iter().map(|(k, _)| k.clone()).collect(),
                    digest: mw.digest,
                }
            }
            Err(e) => Answer::Failed(e),
        };
        for ((db, name), _) in &mw.keys {
            // Whoever stood behind it may fit now (readers beside its reads, say).
            self.serve_by(*db, name, now);
            self.note(*db, name, now);
            self.gc(*db, name);
        }
        sched.answer(mw.handle, answer);
    }

    /// Takes a waiter for several keys out of every queue; its client.
    pub(super) fn abandon_multi(&mut self, id: WaiterId, now: i64) -> Option<W> {
        let mw = self.multi.remove(&id)?;
        for ((db, name), _) in &mw.keys {
            let Some(q) = self.queue_mut(*db, name) else {
                continue;
            };
            let Some(at) = q.waiters.iter().position(|w| w.id == id) else {
                continue;
            };
            q.waiters.remove(at);
            if at == 0 && !q.waiters.is_empty() {
                self.serve_by(*db, name, now);
            }
            self.gc(*db, name);
        }
        self.by_id.remove(&id);
        if let Some(at) = mw.deadline {
            self.agenda.remove(&(at, Task::Timeout(id)));
        }
        Some(mw.handle)
    }

    /// A waiter for several keys leaves with an error.
    pub(super) fn fail_multi<S: Sched<Waiter = W>>(
        &mut self,
        sched: &mut S,
        id: WaiterId,
        err: &LockError,
    ) {
        if let Some(h) = self.abandon_multi(id, self.now) {
            sched.answer(h, Answer::Failed(err.clone()));
        }
    }

    /// The waiters for several keys whose grant is to belong to session `d`.
    pub(super) fn multi_in_session(&self, d: &Digest) -> Vec<WaiterId> {
        self.multi
            .iter()
            .filter(|(_, m)| m.session.as_ref() == Some(d))
            .map(|(id, _)| *id)
            .collect()
    }

    /// A waiter for several keys leaves with nil (its BLOCK time is up).
    pub(super) fn fail_multi_nil<S: Sched<Waiter = W>>(&mut self, sched: &mut S, id: WaiterId) {
        if let Some(h) = self.abandon_multi(id, self.now) {
            sched.answer(h, Answer::Nil);
        }
    }
}

/// `[token, [fence, ...]]`: a grant of several keys.
pub fn grant_reply<'a>(token: Vec<u8>, fences: &[u64]) -> Reply<'a> {
    Reply::Array(vec![
        Reply::Bulk(Bytes::Own(token)),
        Reply::Array(
            fences
                .iter()
                .map(|f| Reply::Int(i64::try_from(*f).unwrap_or(i64::MAX)))
                .collect(),
        ),
    ])
}
