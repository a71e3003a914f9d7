//! Access to a lock key: type checks (WRONGTYPE), the classic string-lock interop,
//! writing a grant with its absolute expiry, and deletes.

use std::ffi::{c_int, c_void};

use redis_module::raw;

use crate::core::{Current, LockState};
use crate::datatype;
use crate::error::LockError;
use crate::events;
use crate::ffi::{self, Ctx, Key, RStr};
use crate::info::{bump, STATS};
use crate::replicate;
use crate::state::lock_type;

/// Redis expires a key once `now > deadline`; a lease ends at the same instant.
fn lease_over(s: &LockState, now: i64) -> bool {
    now > s.expires_at
}

pub struct LockKey {
    key: Key,
}

impl LockKey {
    pub fn open(ctx: Ctx, name: RStr) -> LockKey {
        LockKey {
            key: Key::open_write(ctx, name),
        }
    }

    /// Opens for a change. A module lock whose lease has ended but whose key lingers
    /// (its expiry was changed by PERSIST, EXPIRE or RESTORE) is removed first, exactly
    /// as an expiry would: counted, notified as `expired`, replicated as a DEL.
    pub fn open_reaped(ctx: Ctx, name: RStr, now: i64) -> LockKey {
        let key = Self::open(ctx, name);
        let stale = matches!(key.state(), Some(s) if lease_over(s, now));
        if stale {
            key.delete();
            replicate::delete(ctx, name);
            ffi::notify(
                ctx,
                raw::REDISMODULE_NOTIFY_EXPIRED as c_int,
                b"expired\0",
                name,
            );
            bump(&STATS.expired);
        }
        key
    }

    /// The value, if the key holds this module's lock type (None for anything else).
    fn lock_value(&self) -> Option<*mut c_void> {
        if self.key.key_type() != raw::REDISMODULE_KEYTYPE_MODULE as c_int
            || self.key.module_type() != lock_type()
        {
            return None;
        }
        let v = self.key.module_value();
        (!v.is_null()).then_some(v)
    }

    fn state(&self) -> Option<&LockState> {
        self.lock_value()
            .map(|v| &*unsafe { datatype::as_state(v) })
    }

    pub fn open_read(ctx: Ctx, name: RStr) -> LockKey {
        LockKey {
            key: Key::open_read(ctx, name),
        }
    }

    /// What the key holds at `now`: a free slot, a module lock, or a classic string lock.
    /// A module lock whose lease has ended is free even if its key is still there (its
    /// expiry was changed by PERSIST, EXPIRE or RESTORE): the lease is what counts.
    pub fn current(&self, now: i64) -> Result<Current<'_>, LockError> {
        let t = self.key.key_type();
        if t == raw::REDISMODULE_KEYTYPE_EMPTY as c_int {
            Ok(Current::Free)
        } else if t == raw::REDISMODULE_KEYTYPE_STRING as c_int {
            Ok(Current::Classic(self.key.string()))
        } else if let Some(v) = self.lock_value() {
            let s = unsafe { datatype::as_state(v) };
            Ok(if lease_over(s, now) {
                Current::Free
            } else {
                Current::Module(s)
            })
        } else {
            Err(LockError::WrongType)
        }
    }

    /// The module lock held in this key, for in-place changes (renew, extend).
    pub fn state_mut(&mut self) -> Option<&mut LockState> {
        self.lock_value().map(|v| unsafe { datatype::as_state(v) })
    }

    /// Stores a grant in an empty key (or replaces what is there), with the key's
    /// expiry set to the lease deadline.
    pub fn put(&mut self, state: LockState) -> &LockState {
        let at = state.expires_at;
        if self.key.key_type() != raw::REDISMODULE_KEYTYPE_EMPTY as c_int {
            self.delete();
        }
        let v = datatype::into_raw(state);
        if !self.key.set_module_value(lock_type(), v) {
            // The server refused: give the value back to Rust so it is freed.
            unsafe { datatype::free_unowned(v) };
        }
        self.key.set_abs_expire(at);
        match self.state_mut() {
            Some(s) => s,
            None => unreachable_state(),
        }
    }

    pub fn set_deadline(&self, at_ms: i64) {
        self.key.set_abs_expire(at_ms);
    }

    pub fn deadline(&self) -> Option<i64> {
        self.key.abs_expire()
    }

    /// Deletes the key. Our own deletes are not "expired" or "evicted", so the type's
    /// unlink hook is told to ignore this one.
    pub fn delete(&self) {
        events::suppress_unlink_note(|| self.key.delete());
    }
}

#[cold]
fn unreachable_state() -> ! {
    panic!("lock value missing right after it was stored")
}
