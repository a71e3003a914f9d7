//! FIFO wait queues, one per (db, key), and the blocked-client callbacks. A lock that
//! frees is handed to the head waiter inside the server: the grant is written and
//! replicated like any acquire, then the waiter is unblocked with `[token, fence]`.
//!
//! Every waiter record leaves its queue exactly once: by hand-off, timeout, disconnect
//! (including the force-unblock of REPLICAOF), or a flush of the queue.

use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::ffi::{c_int, c_void};
use std::ptr;

use redis_module::raw;

use crate::args::Acquire;
use crate::core::{lease_deadline, Current, LockState};
use crate::error::LockError;
use crate::ffi::{self, api, Ctx, OwnedStr, RStr, TimerId};
use crate::guard::catch;
use crate::info::{bump, STATS};
use crate::state::{next_fence, MainThread};
use crate::store::LockKey;
use crate::{config, replicate};

type Bc = *mut raw::RedisModuleBlockedClient;
pub type QueueKey = (i32, Vec<u8>);

struct Waiter {
    bc: Bc,
    token: Vec<u8>,
    owner: Option<Vec<u8>>,
    ttl: u64,
    min_fence: u64,
    client_id: u64,
    client_addr: Vec<u8>,
    /// Fires at the BLOCK deadline and answers nil. The client is blocked without a
    /// server-side timeout: the server checks those late (when its event loop next wakes,
    /// up to 1000/hz ms) and, on Redis 7.0, a hand-off racing that check loses its reply.
    /// With this timer as the only timeout, hand-off and timeout cannot both happen.
    timer: Option<TimerId>,
}

#[derive(Default)]
struct Queue {
    waiters: VecDeque<Waiter>,
    /// The pending service timer for this key and when it fires (unix ms).
    timer: Option<(TimerId, i64)>,
}

#[derive(Default)]
struct Registry {
    queues: HashMap<QueueKey, Queue>,
    /// Which queue each blocked client sits in.
    by_bc: HashMap<usize, QueueKey>,
}

static REGISTRY: MainThread<RefCell<Option<Registry>>> = MainThread(RefCell::new(None));

fn with<R>(f: impl FnOnce(&mut Registry) -> R) -> R {
    let mut g = REGISTRY.borrow_mut();
    f(g.get_or_insert_with(Registry::default))
}

/// The grant a waiter receives, carried to its reply callback.
struct Grant {
    token: Vec<u8>,
    fence: u64,
    db: i32,
    key: Vec<u8>,
}

/// Number of clients waiting on a key (0 fast when nobody waits anywhere).
pub fn queued(db: i32, key: &[u8]) -> usize {
    let g = REGISTRY.borrow();
    match g.as_ref() {
        Some(r) if !r.queues.is_empty() => r
            .queues
            .get(&(db, key.to_vec()))
            .map_or(0, |q| q.waiters.len()),
        _ => 0,
    }
}

pub fn has_queue(db: i32, key: &[u8]) -> bool {
    queued(db, key) > 0
}

/// All keys of a db (or every db for -1) that have waiters.
pub fn keys_with_waiters(db: i32) -> Vec<QueueKey> {
    with(|r| {
        r.queues
            .keys()
            .filter(|(d, _)| db < 0 || *d == db)
            .cloned()
            .collect()
    })
}

/// Blocks the calling client at the tail of the key's queue.
/// When the current holder's lease ends, as known at enqueue time.
#[derive(Debug, Clone, Copy)]
pub enum LeaseEnd {
    At(i64),
    /// Free already, with earlier waiters to serve first.
    Now,
    /// A classic string lock without a TTL: only a delete frees it.
    Never,
}

pub fn enqueue(
    ctx: Ctx,
    name: RStr,
    req: &Acquire<'_>,
    block_ms: u64,
    lease_end: LeaseEnd,
) -> Result<(), LockError> {
    let db = ffi::selected_db(ctx);
    let key = ffi::bytes(name).to_vec();
    let max = config::max_waiters();
    if queued(db, &key) as u64 >= max {
        return Err(LockError::TooManyWaiters(max));
    }
    let client_id = ffi::client_id(ctx);
    let waiter = Waiter {
        bc: ptr::null_mut(),
        token: req
            .token
            .map_or_else(crate::commands::new_token, <[u8]>::to_vec),
        owner: req.owner.map(<[u8]>::to_vec),
        ttl: req.ttl,
        min_fence: req.min_fence,
        client_id,
        client_addr: ffi::client_addr(client_id),
        timer: None,
    };
    let timeout = i64::try_from(block_ms).unwrap_or(i64::MAX);
    // No server-side timeout (0): the module's timer below is the only one.
    let bc = unsafe {
        api!(RedisModule_BlockClient)(
            ctx,
            Some(reply_cb),
            Some(timeout_cb),
            Some(free_privdata_cb),
            0,
        )
    };
    unsafe { api!(RedisModule_SetDisconnectCallback)(bc, Some(disconnect_cb)) };
    let timer = (timeout > 0).then(|| {
        let data = Box::into_raw(Box::new(TimerData::Expire { bc: bc as usize }));
        ffi::create_timer(ctx, timeout, timer_cb, data.cast())
    });
    with(|r| {
        r.by_bc.insert(bc as usize, (db, key.clone()));
        r.queues
            .entry((db, key.clone()))
            .or_default()
            .waiters
            .push_back(Waiter {
                bc,
                timer,
                ..waiter
            });
    });
    STATS.waiters.set(STATS.waiters.get() + 1);
    // Serve the queue when the current lease ends, even if Redis has not expired the
    // key by then; with no known end (a string lock without TTL) wait for a delete.
    match lease_end {
        LeaseEnd::At(at) => arm(ctx, db, &key, after(at)),
        LeaseEnd::Now => arm(ctx, db, &key, ffi::now_ms()),
        LeaseEnd::Never => {}
    }
    Ok(())
}

/// Removes a blocked client from whatever queue holds it, dropping the queue (and its
/// timer) if it empties. Returns the waiter if it was queued.
fn remove(ctx: Ctx, bc: Bc) -> Option<Waiter> {
    let (qk, w) = with(|r| {
        let qk = r.by_bc.remove(&(bc as usize))?;
        let q = r.queues.get_mut(&qk)?;
        let at = q.waiters.iter().position(|w| w.bc == bc)?;
        let w = q.waiters.remove(at)?;
        Some((qk, w))
    })?;
    STATS.waiters.set(STATS.waiters.get().saturating_sub(1));
    gc(ctx, &qk);
    Some(w)
}

/// Stops a timer that has not fired yet and frees its data.
fn cancel(ctx: Ctx, timer: Option<TimerId>) {
    if let Some(id) = timer {
        if let Some(data) = ffi::stop_timer(ctx, id) {
            drop(unsafe { Box::from_raw(data.cast::<TimerData>()) });
        }
    }
}

/// Drops empty queues, stopping their timers.
fn gc(ctx: Ctx, qk: &QueueKey) {
    let timer = with(|r| match r.queues.get(qk) {
        Some(q) if q.waiters.is_empty() => r.queues.remove(qk).and_then(|q| q.timer),
        _ => None,
    });
    cancel(ctx, timer.map(|(id, _)| id));
}

// ---- hand-off --------------------------------------------------------------------

/// If the key is free and has waiters, grants it to the head waiter. Works in any
/// context whose selected db is `db`. Returns whether a hand-off happened.
pub fn handoff(ctx: Ctx, name: RStr) -> bool {
    // The common case on the hot path: nobody waits anywhere.
    if REGISTRY
        .borrow()
        .as_ref()
        .is_none_or(|r| r.queues.is_empty())
    {
        return false;
    }
    let db = ffi::selected_db(ctx);
    let qk = (db, ffi::bytes(name).to_vec());
    if ffi::flag(ctx, ffi::FLAG_SLAVE) {
        // A replica never grants; REPLICAOF has already failed the blocked clients.
        drop_queue(ctx, &qk);
        return false;
    }
    let now = ffi::now_ms();
    let mut key = LockKey::open_reaped(ctx, name, now);
    let lease_end = match key.current(now) {
        Ok(Current::Free) => None,
        Ok(Current::Module(s)) => Some(Some(s.expires_at)),
        Ok(Current::Classic(_)) => Some(key.deadline()),
        // Someone wrote another type into the key: the waiters cannot get it.
        Err(_) => {
            drop_queue(ctx, &qk);
            return false;
        }
    };
    if let Some(end) = lease_end {
        if let Some(at) = end {
            arm(ctx, db, &qk.1, after(at));
        }
        return false;
    }
    let Some(w) = with(|r| {
        let w = r.queues.get_mut(&qk).and_then(|q| q.waiters.pop_front());
        if let Some(w) = &w {
            r.by_bc.remove(&(w.bc as usize));
        }
        w
    }) else {
        gc(ctx, &qk);
        return false;
    };
    STATS.waiters.set(STATS.waiters.get().saturating_sub(1));
    cancel(ctx, w.timer);
    let granted = lease_deadline(now, w.ttl, "lock.acquire")
        .and_then(|deadline| Ok((deadline, next_fence(now, w.min_fence)?)));
    let (expires_at, fence) = match granted {
        Ok(v) => v,
        Err(_) => {
            // Cannot grant (fence space exhausted): fail this waiter, try the next.
            unsafe { api!(RedisModule_UnblockClient)(w.bc, ptr::null_mut()) };
            return handoff(ctx, name);
        }
    };
    let state = LockState {
        token: w.token,
        fence,
        expires_at,
        acquired_at: now,
        owner: w.owner,
        client_id: w.client_id,
        client_addr: w.client_addr,
    };
    let s = key.put(state);
    replicate::state(ctx, name, s);
    let grant = Box::new(Grant {
        token: s.token.clone(),
        fence,
        db,
        key: qk.1.clone(),
    });
    drop(key);
    ffi::notify(
        ctx,
        raw::REDISMODULE_NOTIFY_GENERIC as c_int,
        b"lock.handoff\0",
        name,
    );
    bump(&STATS.handed_off);
    bump(&STATS.acquired);
    unsafe { api!(RedisModule_UnblockClient)(w.bc, Box::into_raw(grant).cast()) };
    if has_queue(db, &qk.1) {
        arm(ctx, db, &qk.1, after(expires_at));
    } else {
        gc(ctx, &qk);
    }
    true
}

/// Fails every waiter of a key (used when the key can no longer be a lock, or on a
/// replica) and forgets the queue.
fn drop_queue(ctx: Ctx, qk: &QueueKey) {
    let waiters: Vec<Waiter> = with(|r| {
        let ws: Vec<Waiter> = r
            .queues
            .get_mut(qk)
            .map(|q| q.waiters.drain(..).collect())
            .unwrap_or_default();
        for w in &ws {
            r.by_bc.remove(&(w.bc as usize));
        }
        ws
    });
    for w in waiters {
        STATS.waiters.set(STATS.waiters.get().saturating_sub(1));
        cancel(ctx, w.timer);
        unsafe { api!(RedisModule_UnblockClient)(w.bc, ptr::null_mut()) };
    }
    gc(ctx, qk);
}

// ---- service timers --------------------------------------------------------------

enum TimerData {
    /// Look at the key and hand it off if free (lease deadline, or after an event).
    Service { db: i32, key: Vec<u8> },
    /// A waiter was handed the lock but disconnected before its reply: give it back.
    Revoke {
        db: i32,
        key: Vec<u8>,
        token: Vec<u8>,
    },
    /// A waiter's BLOCK time is up.
    Expire { bc: usize },
}

/// The first millisecond at which a lease with this deadline is over (Redis expires a
/// key once its clock passes the deadline).
fn after(deadline: i64) -> i64 {
    deadline.saturating_add(1)
}

/// Makes sure the key's queue is looked at no later than `at_ms`.
pub fn arm(ctx: Ctx, db: i32, key: &[u8], at_ms: i64) {
    let qk = (db, key.to_vec());
    let existing = with(|r| r.queues.get(&qk).map(|q| q.timer));
    let Some(existing) = existing else {
        return; // no queue, nothing to serve
    };
    if let Some((id, when)) = existing {
        if when <= at_ms {
            return;
        }
        if let Some(data) = ffi::stop_timer(ctx, id) {
            drop(unsafe { Box::from_raw(data.cast::<TimerData>()) });
        }
    }
    let delay = at_ms.saturating_sub(ffi::now_ms()).max(0);
    let data = Box::into_raw(Box::new(TimerData::Service {
        db,
        key: key.to_vec(),
    }));
    let id = ffi::create_timer(ctx, delay, timer_cb, data.cast());
    with(|r| {
        if let Some(q) = r.queues.get_mut(&qk) {
            q.timer = Some((id, at_ms));
        }
    });
}

extern "C" fn timer_cb(ctx: Ctx, data: *mut c_void) {
    catch(|| {
        let data = unsafe { Box::from_raw(data.cast::<TimerData>()) };
        match *data {
            TimerData::Service { db, key } => {
                with(|r| {
                    if let Some(q) = r.queues.get_mut(&(db, key.clone())) {
                        q.timer = None;
                    }
                });
                if ffi::select_db(ctx, db) {
                    let name = OwnedStr::new(&key);
                    handoff(ctx, name.ptr());
                }
            }
            TimerData::Expire { bc } => {
                let bc = bc as Bc;
                if remove(ctx, bc).is_some() {
                    bump(&STATS.wait_timeouts);
                    // No private data: the reply callback answers nil.
                    unsafe { api!(RedisModule_UnblockClient)(bc, ptr::null_mut()) };
                }
            }
            TimerData::Revoke { db, key, token } => {
                if ffi::select_db(ctx, db) && !ffi::flag(ctx, ffi::FLAG_SLAVE) {
                    let name = OwnedStr::new(&key);
                    let _ = crate::commands::release_token(ctx, name.ptr(), &token);
                }
            }
        }
    });
}

// ---- blocked-client callbacks ----------------------------------------------------

extern "C" fn reply_cb(ctx: Ctx, _argv: *mut RStr, _argc: c_int) -> c_int {
    catch(|| {
        let p = unsafe { api!(RedisModule_GetBlockedClientPrivateData)(ctx) }.cast::<Grant>();
        if p.is_null() {
            ffi::reply_null(ctx);
        } else {
            let g = unsafe { &*p };
            ffi::reply_grant(ctx, &g.token, g.fence);
        }
    })
    .unwrap_or_else(|| ffi::reply_error(ctx, &LockError::Internal("lock.acquire").to_string()));
    raw::REDISMODULE_OK as c_int
}

/// Only `CLIENT UNBLOCK id TIMEOUT` gets here: waiters block without a server timeout.
extern "C" fn timeout_cb(ctx: Ctx, _argv: *mut RStr, _argc: c_int) -> c_int {
    catch(|| {
        let bc = unsafe { api!(RedisModule_GetBlockedClientHandle)(ctx) };
        if let Some(w) = remove(ctx, bc) {
            cancel(ctx, w.timer);
            bump(&STATS.wait_timeouts);
            // Release the handle; with no private data the reply callback is skipped.
            unsafe { api!(RedisModule_UnblockClient)(bc, ptr::null_mut()) };
        }
        ffi::reply_null(ctx);
    })
    .unwrap_or_else(|| ffi::reply_null(ctx));
    raw::REDISMODULE_OK as c_int
}

extern "C" fn disconnect_cb(ctx: Ctx, bc: Bc) {
    catch(|| {
        if let Some(w) = remove(ctx, bc) {
            cancel(ctx, w.timer);
            unsafe { api!(RedisModule_UnblockClient)(bc, ptr::null_mut()) };
        }
    });
}

extern "C" fn free_privdata_cb(ctx: Ctx, privdata: *mut c_void) {
    catch(|| {
        if privdata.is_null() {
            return;
        }
        let g = unsafe { Box::from_raw(privdata.cast::<Grant>()) };
        if unsafe { api!(RedisModule_BlockedClientDisconnected)(ctx) } != 0 {
            // The lock was handed to a client that left before hearing of it.
            let data = Box::into_raw(Box::new(TimerData::Revoke {
                db: g.db,
                key: g.key,
                token: g.token,
            }));
            ffi::create_timer(ctx, 0, timer_cb, data.cast());
        }
    });
}
