//! Counters and the `INFO lock` section.

use std::cell::Cell;
use std::ffi::{c_int, CString};
use std::sync::atomic::{AtomicI64, Ordering};

use redis_module::raw;

use crate::ffi::api;
use crate::state::{MainThread, FENCE};

/// Module lock values in memory (created minus freed); kept atomic because a value's
/// `free` may in principle run on a lazy-free thread.
pub static LIVE_LOCKS: AtomicI64 = AtomicI64::new(0);

pub struct Stats {
    pub acquired: Cell<u64>,
    pub renewed: Cell<u64>,
    pub contended: Cell<u64>,
    pub released: Cell<u64>,
    pub extended: Cell<u64>,
    pub expired: Cell<u64>,
    pub evicted: Cell<u64>,
    pub handed_off: Cell<u64>,
    pub wait_timeouts: Cell<u64>,
    pub force_released: Cell<u64>,
    pub waiters: Cell<u64>,
    pub panics: Cell<u64>,
}

pub static STATS: MainThread<Stats> = MainThread(Stats {
    acquired: Cell::new(0),
    renewed: Cell::new(0),
    contended: Cell::new(0),
    released: Cell::new(0),
    extended: Cell::new(0),
    expired: Cell::new(0),
    evicted: Cell::new(0),
    handed_off: Cell::new(0),
    wait_timeouts: Cell::new(0),
    force_released: Cell::new(0),
    waiters: Cell::new(0),
    panics: Cell::new(0),
});

pub fn bump(c: &Cell<u64>) {
    c.set(c.get().wrapping_add(1));
}

fn field(ctx: *mut raw::RedisModuleInfoCtx, name: &str, v: u64) {
    if let Ok(n) = CString::new(name) {
        unsafe { api!(RedisModule_InfoAddFieldULongLong)(ctx, n.as_ptr(), v) };
    }
}

/// Registered with `RedisModule_RegisterInfoFunc`. Field names get the `lock_` prefix
/// from the server.
pub extern "C" fn info_func(ctx: *mut raw::RedisModuleInfoCtx, _for_crash_report: c_int) {
    let _ = std::panic::catch_unwind(|| {
        unsafe { api!(RedisModule_InfoAddSection)(ctx, std::ptr::null()) };
        let s = &*STATS;
        field(
            ctx,
            "held",
            LIVE_LOCKS.load(Ordering::Relaxed).max(0) as u64,
        );
        field(ctx, "waiters", s.waiters.get());
        field(ctx, "acquired", s.acquired.get());
        field(ctx, "renewed", s.renewed.get());
        field(ctx, "contended", s.contended.get());
        field(ctx, "released", s.released.get());
        field(ctx, "extended", s.extended.get());
        field(ctx, "expired", s.expired.get());
        field(ctx, "evicted", s.evicted.get());
        field(ctx, "handed_off", s.handed_off.get());
        field(ctx, "wait_timeouts", s.wait_timeouts.get());
        field(ctx, "force_released", s.force_released.get());
        field(ctx, "panics", s.panics.get());
        field(ctx, "last_fence", FENCE.get().last());
    });
}
