//! The engine's [`Keyspace`] over a real key: type checks (WRONGTYPE), classic string
//! locks, absolute expiries, replication, notifications, and the gate that decides
//! whether the module may write this key on its own right now.

use std::cell::RefCell;
use std::ffi::c_int;

use redis_module::raw;

use crate::engine::value::{Addr, LockValue};
use crate::engine::{Event, Gate, Keyspace, Repl, Slot};
use crate::error::LockError;
use crate::ffi::{self, Ctx, Key, KeyKind, MainThread, Route, Str};
use crate::replication;
use crate::unlinked;

/// One lock key for the duration of a command or callback.
pub struct RedisKey<'a> {
    ctx: Ctx<'a>,
    name: Str<'a>,
    write: bool,
    /// Opened on first use, and closed around anything that may delete the key behind
    /// the handle's back (the cluster routing check can expire it).
    key: Option<Key<'a>>,
    db: i32,
    now: i64,
}

impl<'a> RedisKey<'a> {
    pub fn new(ctx: Ctx<'a>, name: Str<'a>, now: i64, write: bool) -> Self {
        RedisKey {
            ctx,
            name,
            write,
            key: None,
            db: ctx.db(),
            now,
        }
    }

    fn key(&mut self) -> &mut Key<'a> {
        let (ctx, name, write) = (self.ctx, self.name, self.write);
        self.key.get_or_insert_with(|| ctx.open_key(name, write))
    }
}

impl Keyspace for RedisKey<'_> {
    fn db(&self) -> i32 {
        self.db
    }

    fn name(&self) -> &[u8] {
        self.name.bytes()
    }

    fn now(&self) -> i64 {
        self.now
    }

    fn read(&mut self) -> Result<Slot<'_>, LockError> {
        let key = self.key();
        match key.kind() {
            KeyKind::Empty => Ok(Slot::Free),
            KeyKind::String => Ok(Slot::Classic(key.abs_expire())),
            KeyKind::Lock => key.lock().map(Slot::Lock).ok_or(LockError::WrongType),
            KeyKind::Other => Err(LockError::WrongType),
        }
    }

    fn put(&mut self, v: LockValue) {
        let at = v.deadline();
        let key = self.key();
        // Replacing a value is not an expiry or an eviction of the old one.
        unlinked::ours(|| {
            if key.kind() != KeyKind::Empty {
                key.delete();
            }
            key.put_lock(v);
        });
        key.set_abs_expire(at);
    }

    fn remove(&mut self) {
        let key = self.key();
        unlinked::ours(|| key.delete());
    }

    fn set_expiry(&mut self, at: i64) {
        self.key().set_abs_expire(at);
    }

    fn expiry(&mut self) -> Option<i64> {
        self.key().abs_expire()
    }

    fn classic_matches(&mut self, token: &[u8]) -> bool {
        let key = self.key();
        key.kind() == KeyKind::String && key.string_eq(token)
    }

    fn replicate(&mut self, op: Repl<'_>) {
        replication::send(self.ctx, self.name, op);
    }

    fn notify(&mut self, ev: Event) {
        const GENERIC: c_int = raw::REDISMODULE_NOTIFY_GENERIC as c_int;
        const EXPIRED: c_int = raw::REDISMODULE_NOTIFY_EXPIRED as c_int;
        let (class, name) = match ev {
            Event::Acquire => (GENERIC, c"lock.acquire"),
            Event::Release => (GENERIC, c"lock.release"),
            Event::Extend => (GENERIC, c"lock.extend"),
            Event::Handoff => (GENERIC, c"lock.handoff"),
            Event::ForceRelease => (GENERIC, c"lock.forcerelease"),
            Event::Expired => (EXPIRED, c"expired"),
        };
        // Nobody can hear a class the server does not publish; a module that wants the
        // module's events enables the class like any subscriber would.
        if ffi::notify_classes() & class != 0 {
            self.ctx.notify(class, name, self.name);
        }
    }

    fn gate(&mut self) -> Gate {
        let flags = self.ctx.flags();
        if flags & ffi::FLAG_SLAVE != 0 {
            return Gate::Replica;
        }
        if flags & ffi::FLAG_LOADING != 0 || ffi::writes_paused() {
            return Gate::Later;
        }
        if flags & ffi::FLAG_CLUSTER == 0 {
            return Gate::Now;
        }
        // The routing check runs a command that may expire the key: no handle may be
        // open across it.
        self.key = None;
        match self.ctx.route(self.name) {
            Route::Here => Gate::Now,
            Route::Elsewhere => Gate::NotHere,
            Route::Down => Gate::Later,
        }
    }

    fn new_token(&mut self) -> Vec<u8> {
        new_token()
    }
}

/// A fresh random UUID v4 in its text form.
pub fn new_token() -> Vec<u8> {
    let mut buf = [0u8; uuid::fmt::Hyphenated::LENGTH];
    uuid::Uuid::new_v4()
        .hyphenated()
        .encode_lower(&mut buf)
        .as_bytes()
        .to_vec()
}

/// Addresses of recent clients by id. Client ids are never reused while the server runs
/// and a connection's peer address never changes, so an entry is never stale; the cache
/// spares a lookup and a getpeername() syscall per grant.
const ADDR_SLOTS: usize = 512;
static ADDRS: MainThread<RefCell<Vec<(u64, Addr)>>> = MainThread(RefCell::new(Vec::new()));

/// The calling client's id and address.
pub fn caller(ctx: Ctx<'_>) -> (u64, Addr) {
    let id = ctx.client_id();
    if id == 0 {
        return (0, Addr::None);
    }
    let slot = (id % ADDR_SLOTS as u64) as usize;
    if let Ok(cache) = ADDRS.try_borrow() {
        if let Some((cid, addr)) = cache.get(slot) {
            if *cid == id {
                return (id, addr.clone());
            }
        }
    }
    let addr = ffi::client_addr(id);
    if addr != Addr::None {
        if let Ok(mut cache) = ADDRS.try_borrow_mut() {
            if cache.is_empty() {
                cache.resize(ADDR_SLOTS, (0, Addr::None));
            }
            cache[slot] = (id, addr.clone());
        }
    }
    (id, addr)
}
