//! Process-wide state. Redis calls the module from its main thread only (commands,
//! timers, events, type callbacks during load/save in the main process), so plain
//! `Cell`s are enough; `MainThread` just lets them live in statics.

use std::cell::Cell;
use std::ops::Deref;
use std::sync::atomic::{AtomicPtr, Ordering};

use redis_module::raw;

use crate::core::FenceClock;

pub struct MainThread<T>(pub T);

// SAFETY: the server touches module state from its main thread only; the one callback
// that could run elsewhere (a value's `free`, under lazy-free) touches only atomics.
unsafe impl<T> Sync for MainThread<T> {}

impl<T> Deref for MainThread<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

/// The fencing counter of this server.
pub static FENCE: MainThread<Cell<FenceClock>> = MainThread(Cell::new(FenceClock::new_const()));

pub fn next_fence(now_ms: i64, floor: u64) -> Result<u64, crate::error::LockError> {
    let mut c = FENCE.get();
    let f = c.next(now_ms, floor)?;
    FENCE.set(c);
    Ok(f)
}

pub fn observe_fence(fence: u64) {
    let mut c = FENCE.get();
    c.observe(fence);
    FENCE.set(c);
}

/// The module's data type, set once at load.
pub static LOCK_TYPE: AtomicPtr<raw::RedisModuleType> = AtomicPtr::new(std::ptr::null_mut());

pub fn lock_type() -> *mut raw::RedisModuleType {
    LOCK_TYPE.load(Ordering::Relaxed)
}
