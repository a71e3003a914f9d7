//! Learning that a lock went away: keyspace notifications (del, expired, evicted,
//! rename, ...) and flushes. Nothing here writes to the keyspace; it only schedules
//! the hand-off timer of keys that have waiters, and keeps the expiry counters.

use std::cell::{Cell, RefCell};
use std::ffi::{c_int, c_void, CStr};

use redis_module::raw;

use crate::ffi::{self, Ctx, RStr};
use crate::guard::catch;
use crate::info::{bump, STATS};
use crate::state::MainThread;
use crate::waiters;

/// The last lock key the server unlinked, to tell a lock's expiry from any key's.
type DbKey = (i32, Vec<u8>);
static LAST_UNLINKED: MainThread<RefCell<Option<DbKey>>> = MainThread(RefCell::new(None));
static SUPPRESS: MainThread<Cell<bool>> = MainThread(Cell::new(false));

pub fn note_unlinked(db: i32, key: &[u8]) {
    if !SUPPRESS.get() {
        if let Ok(mut g) = LAST_UNLINKED.try_borrow_mut() {
            *g = Some((db, key.to_vec()));
        }
    }
}

pub fn suppress_unlink_note<R>(f: impl FnOnce() -> R) -> R {
    let prev = SUPPRESS.replace(true);
    let r = f();
    SUPPRESS.set(prev);
    r
}

fn was_lock(db: i32, key: &[u8]) -> bool {
    match LAST_UNLINKED.try_borrow_mut() {
        Ok(mut g) => match g.as_ref() {
            Some((d, k)) if *d == db && k == key => {
                *g = None;
                true
            }
            _ => false,
        },
        Err(_) => false,
    }
}

pub const SUBSCRIBED: c_int = (raw::REDISMODULE_NOTIFY_GENERIC
    | raw::REDISMODULE_NOTIFY_EXPIRED
    | raw::REDISMODULE_NOTIFY_EVICTED) as c_int;

pub extern "C" fn on_keyspace_event(
    ctx: Ctx,
    _class: c_int,
    event: *const std::ffi::c_char,
    key: RStr,
) -> c_int {
    catch(|| {
        let event = unsafe { CStr::from_ptr(event) }.to_bytes();
        if event.starts_with(b"lock.") {
            return; // our own notifications
        }
        let db = ffi::selected_db(ctx);
        let name = ffi::bytes(key);
        match event {
            b"expired" if was_lock(db, name) => bump(&STATS.expired),
            b"evicted" if was_lock(db, name) => bump(&STATS.evicted),
            _ => {}
        }
        if waiters::has_queue(db, name) {
            waiters::arm(ctx, db, name, ffi::now_ms());
        }
    });
    raw::REDISMODULE_OK as c_int
}

/// FLUSHALL / FLUSHDB fire no per-key events: serve every queue of the flushed db(s).
pub extern "C" fn on_flush(
    ctx: Ctx,
    _eid: raw::RedisModuleEvent,
    subevent: u64,
    data: *mut c_void,
) {
    catch(|| {
        if subevent != raw::REDISMODULE_SUBEVENT_FLUSHDB_END || data.is_null() {
            return;
        }
        let info = unsafe { &*data.cast::<raw::RedisModuleFlushInfo>() };
        let now = ffi::now_ms();
        for (db, key) in waiters::keys_with_waiters(info.dbnum) {
            waiters::arm(ctx, db, &key, now);
        }
    });
}
