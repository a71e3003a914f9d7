//! Learning that a lock key changed behind the module's back: keyspace notifications
//! (del, expired, evicted, rename, move, restore, expire, persist, ...), flushes, SWAPDB,
//! a change of replication role, and MIGRATE (seen by a command filter). Nothing here
//! writes to the keyspace: it only asks for the key's queue to be served (by a timer,
//! through the engine's gate), and keeps the expiry counters.

use std::cell::RefCell;
use std::ffi::c_int;
use std::sync::atomic::{AtomicU64, Ordering};

use redis_module::raw;

use crate::ffi::events::{FilterArgs, ServerEvent};
use crate::ffi::{self, Ctx, MainThread, Str};
use crate::unlinked;
use crate::waiting::{self, with_engine, RedisSched};

/// Lock keys Redis expired or evicted by itself (the engine counts the leases it ends).
pub static EXPIRED: AtomicU64 = AtomicU64::new(0);
pub static EVICTED: AtomicU64 = AtomicU64::new(0);

pub const SUBSCRIBED: c_int = (raw::REDISMODULE_NOTIFY_GENERIC
    | raw::REDISMODULE_NOTIFY_EXPIRED
    | raw::REDISMODULE_NOTIFY_EVICTED) as c_int;

/// The keys of the MIGRATE command running now (empty when none runs).
static MIGRATING: MainThread<RefCell<Vec<Vec<u8>>>> = MainThread(RefCell::new(Vec::new()));

/// Runs before every command: remembers the keys a MIGRATE is about to move away, so
/// that their `del` is not taken for a release. Cheap for every other command.
pub fn on_command(args: &FilterArgs) {
    let Ok(mut keys) = MIGRATING.try_borrow_mut() else {
        return;
    };
    let is_migrate = args
        .get(0)
        .is_some_and(|c| c.len() == 7 && c.eq_ignore_ascii_case(b"migrate"));
    if !is_migrate {
        if !keys.is_empty() {
            keys.clear();
        }
        return;
    }
    keys.clear();
    // MIGRATE host port key|"" destination-db timeout [COPY] [REPLACE] [AUTH pw]
    //         [AUTH2 user pw] [KEYS key ...]
    let n = args.len();
    let mut i = 6;
    let mut copy = false;
    while i < n {
        match args.get(i).map(<[u8]>::to_ascii_uppercase).as_deref() {
            Some(b"COPY") => copy = true,
            Some(b"AUTH") => i += 1,
            Some(b"AUTH2") => i += 2,
            Some(b"KEYS") => {
                keys.extend((i + 1..n).filter_map(|j| args.get(j).map(<[u8]>::to_vec)));
                break;
            }
            _ => {}
        }
        i += 1;
    }
    if let Some(k) = args.get(3).filter(|k| !k.is_empty()) {
        keys.push(k.to_vec());
    }
    if copy {
        keys.clear();
    }
}

fn migrating(key: &[u8]) -> bool {
    MIGRATING
        .try_borrow()
        .is_ok_and(|keys| keys.iter().any(|k| k == key))
}

pub fn on_keyspace(ctx: Ctx<'_>, event: &[u8], key: Str<'_>) {
    if event.starts_with(b"lock.") {
        return; // our own notifications
    }
    let db = ctx.db();
    let name = key.bytes();
    match event {
        b"expired" if unlinked::was_lock(db, name) => {
            EXPIRED.fetch_add(1, Ordering::Relaxed);
        }
        b"evicted" if unlinked::was_lock(db, name) => {
            EVICTED.fetch_add(1, Ordering::Relaxed);
        }
        _ => {}
    }
    let moved = event == b"del" && migrating(name);
    let mut sched = RedisSched::new(ctx);
    // Busy means the engine itself is changing this key; it serves the queue then.
    with_engine(|e| {
        if !e.has_waiters(db, name) {
            return;
        }
        if moved {
            e.mark_moved(&mut sched, db, name, ffi::now_ms());
        } else {
            e.arm(&mut sched, db, name, ffi::now_ms());
        }
    });
}

pub fn on_server(ctx: Ctx<'_>, ev: ServerEvent) {
    let keys = match ev {
        ServerEvent::Flushed(db) => {
            with_engine(|e| e.keys_with_waiters((db >= 0).then_some(db))).unwrap_or_default()
        }
        ServerEvent::Swapped(a, b) => with_engine(|e| {
            let mut k = e.keys_with_waiters(Some(a));
            k.extend(e.keys_with_waiters(Some(b)));
            k
        })
        .unwrap_or_default(),
        ServerEvent::BecamePrimary => {
            // A promoted replica starts granting: its first fence jumps ahead of the
            // clock, above anything the old primary may have issued that never arrived.
            with_engine(|e| e.fence.start(ffi::now_ms()));
            Vec::new()
        }
        ServerEvent::BecameReplica => Vec::new(),
        ServerEvent::Forked | ServerEvent::ReplicaChanged => {
            crate::replication::stream_may_listen();
            Vec::new()
        }
    };
    for (db, key) in keys {
        waiting::wake(ctx, db, &key);
    }
}
