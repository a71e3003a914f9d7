//! Access to a lock key: type checks (WRONGTYPE), the classic string-lock interop,
//! writing a grant with its absolute expiry, and deletes.

use std::ffi::c_int;

use redis_module::raw;

use crate::core::{Current, LockState};
use crate::datatype;
use crate::error::LockError;
use crate::events;
use crate::ffi::{Ctx, Key, RStr};
use crate::state::lock_type;

pub struct LockKey {
    key: Key,
}

impl LockKey {
    pub fn open(ctx: Ctx, name: RStr) -> LockKey {
        LockKey {
            key: Key::open_write(ctx, name),
        }
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
        } else if t == raw::REDISMODULE_KEYTYPE_MODULE as c_int
            && self.key.module_type() == lock_type()
        {
            let v = self.key.module_value();
            if v.is_null() {
                return Ok(Current::Free);
            }
            let s = unsafe { datatype::as_state(v) };
            Ok(if s.expires_at <= now {
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
        if self.key.key_type() != raw::REDISMODULE_KEYTYPE_MODULE as c_int
            || self.key.module_type() != lock_type()
        {
            return None;
        }
        let v = self.key.module_value();
        (!v.is_null()).then(|| unsafe { datatype::as_state(v) })
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
