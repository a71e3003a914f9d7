//! Subscriptions: keyspace notifications, the server events the module needs (flush,
//! SWAPDB, a change of replication role, forks, loading, synchronous saves, the server's
//! cron, clients connecting and leaving, CONFIG SET), a command filter the module installs only while it needs one, and the
//! `INFO lock` section. The server's C callbacks are turned into plain Rust functions.

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::OnceLock;

use redis_module::raw;

use super::guard::catch;
use super::{api, Ctx, Str, OK};

pub type KeyspaceFn = fn(Ctx<'_>, &[u8], Str<'_>);
static KEYSPACE: OnceLock<KeyspaceFn> = OnceLock::new();

extern "C" fn keyspace_cb(
    ctx: *mut raw::RedisModuleCtx,
    _class: c_int,
    event: *const c_char,
    key: *mut raw::RedisModuleString,
) -> c_int {
    let Some(f) = KEYSPACE.get() else {
        return OK;
    };
    // SAFETY: the server passes a live context, a NUL-terminated event name and the key
    // name, all valid for the duration of the callback.
    let (ctx, event, key) = unsafe {
        (
            Ctx::from_raw(ctx),
            CStr::from_ptr(event).to_bytes(),
            Str::from_raw(key),
        )
    };
    catch(|| f(ctx, event, key));
    OK
}

/// Calls `f(ctx, event, key)` for every keyspace event of the classes in `mask`. Every
/// notification of those classes, for any key of the server, then costs a call into the
/// module: subscribe only when something needs it (there is no unsubscribing).
pub fn subscribe_keyspace(ctx: Ctx<'_>, mask: c_int, f: KeyspaceFn) -> Result<(), String> {
    let _ = KEYSPACE.set(f);
    // SAFETY: a load-time context and a callback matching the server's signature.
    let ok =
        unsafe { api!(RedisModule_SubscribeToKeyspaceEvents)(ctx.raw(), mask, Some(keyspace_cb)) };
    if ok != OK {
        return Err("subscribing to keyspace events failed".into());
    }
    Ok(())
}

/// The server events the module acts on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServerEvent {
    /// FLUSHDB / FLUSHALL (also DEBUG RELOAD, a full sync) finished; -1 for all dbs.
    Flushed(i32),
    /// SWAPDB a b.
    Swapped(i32, i32),
    BecamePrimary,
    BecameReplica,
    /// A child process was forked (for an RDB, an AOF rewrite, a replica's full sync).
    Forked,
    /// A replica came online or went offline.
    ReplicaChanged,
    /// Loading (RDB, AOF, a full sync, DEBUG RELOAD) finished or failed.
    Loaded,
    /// A synchronous save (SAVE, DEBUG RELOAD, SHUTDOWN) starts in this process.
    SyncSaveStarted,
    /// A save ended or failed.
    SaveEnded,
    /// The server's periodic cron (`hz` times a second, on the monotonic clock).
    Cron,
    /// A module was loaded or unloaded (the commands the server knows changed).
    ModulesChanged,
    /// CONFIG SET changed settings (of the server or of a module).
    ConfigChanged,
    /// A client connected (its id, IP text NUL-padded, port) or, with `connected` false,
    /// went away. Only connections are announced: the server's own fake clients (a
    /// script's, a module's `RM_Call`, the AOF loader's) never are.
    Client {
        id: u64,
        connected: bool,
        ip: [u8; 46],
        port: u16,
    },
    /// Valkey 9's atomic slot migration (`CLUSTER MIGRATESLOTS`) of these slot ranges
    /// (inclusive) started, completed or was aborted (failed or cancelled), on the side
    /// that exports them or on the side that imports them.
    SlotMigration {
        phase: Phase,
        export: bool,
        ranges: Vec<(u16, u16)>,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Started,
    Completed,
    Aborted,
}

/// `VALKEYMODULE_EVENT_ATOMIC_SLOT_MIGRATION` and its sub-events (valkeymodule.h, 9.0).
const EVENT_ATOMIC_SLOT_MIGRATION: u64 = 19;
const ASM_IMPORT_STARTED: u64 = 0;
const ASM_EXPORT_STARTED: u64 = 1;
const ASM_IMPORT_ABORTED: u64 = 2;
const ASM_EXPORT_ABORTED: u64 = 3;
const ASM_IMPORT_COMPLETED: u64 = 4;
const ASM_EXPORT_COMPLETED: u64 = 5;

/// `ValkeyModuleSlotRange`.
#[repr(C)]
struct SlotRange {
    start: c_int,
    end: c_int,
}

/// `ValkeyModuleAtomicSlotMigrationInfo`, version 1.
#[repr(C)]
struct MigrationInfo {
    version: u64,
    job_name: [c_char; 41],
    slot_ranges: *const SlotRange,
    num_slot_ranges: u32,
}

/// The event of a slot migration, read from the server's info.
fn slot_migration(sub: u64, data: *mut c_void) -> Option<ServerEvent> {
    let (phase, export) = match sub {
        ASM_IMPORT_STARTED => (Phase::Started, false),
        ASM_EXPORT_STARTED => (Phase::Started, true),
        ASM_IMPORT_ABORTED => (Phase::Aborted, false),
        ASM_EXPORT_ABORTED => (Phase::Aborted, true),
        ASM_IMPORT_COMPLETED => (Phase::Completed, false),
        ASM_EXPORT_COMPLETED => (Phase::Completed, true),
        _ => return None,
    };
    if data.is_null() {
        return None;
    }
    // SAFETY: for this event the data is the server's migration info (version 1, the
    // version subscribed to), valid for the callback.
    let info = unsafe { &*data.cast::<MigrationInfo>() };
    let n = info.num_slot_ranges as usize;
    let ranges = if n == 0 || info.slot_ranges.is_null() {
        &[][..]
    } else {
        // SAFETY: `num_slot_ranges` ranges at `slot_ranges`, owned by the server.
        unsafe { std::slice::from_raw_parts(info.slot_ranges, n) }
    };
    let slot = |s: c_int| u16::try_from(s).ok().filter(|&s| s < 16384);
    let ranges = (ranges.iter())
        .filter_map(|r| Some((slot(r.start)?, slot(r.end)?)))
        .collect();
    Some(ServerEvent::SlotMigration {
        phase,
        export,
        ranges,
    })
}

pub type ServerFn = fn(Ctx<'_>, ServerEvent);
static SERVER: OnceLock<ServerFn> = OnceLock::new();

extern "C" fn server_cb(
    ctx: *mut raw::RedisModuleCtx,
    eid: raw::RedisModuleEvent,
    sub: u64,
    data: *mut c_void,
) {
    let Some(f) = SERVER.get() else {
        return;
    };
    // SAFETY: the server passes a live context.
    let ctx = unsafe { Ctx::from_raw(ctx) };
    let ev = match eid.id {
        raw::REDISMODULE_EVENT_FLUSHDB if sub == raw::REDISMODULE_SUBEVENT_FLUSHDB_END => {
            if data.is_null() {
                return;
            }
            // SAFETY: for FLUSHDB the data is a RedisModuleFlushInfo.
            let info = unsafe { &*data.cast::<raw::RedisModuleFlushInfo>() };
            ServerEvent::Flushed(info.dbnum)
        }
        raw::REDISMODULE_EVENT_SWAPDB => {
            if data.is_null() {
                return;
            }
            // SAFETY: for SWAPDB the data is a RedisModuleSwapDbInfo.
            let info = unsafe { &*data.cast::<raw::RedisModuleSwapDbInfo>() };
            ServerEvent::Swapped(info.dbnum_first, info.dbnum_second)
        }
        raw::REDISMODULE_EVENT_FORK_CHILD if sub == raw::REDISMODULE_SUBEVENT_FORK_CHILD_BORN => {
            ServerEvent::Forked
        }
        raw::REDISMODULE_EVENT_REPLICA_CHANGE => ServerEvent::ReplicaChanged,
        raw::REDISMODULE_EVENT_CRON_LOOP => ServerEvent::Cron,
        raw::REDISMODULE_EVENT_MODULE_CHANGE => ServerEvent::ModulesChanged,
        raw::REDISMODULE_EVENT_CONFIG => ServerEvent::ConfigChanged,
        raw::REDISMODULE_EVENT_CLIENT_CHANGE => {
            if data.is_null() {
                return;
            }
            // SAFETY: for CLIENT_CHANGE the data is a RedisModuleClientInfo (version 1,
            // the version subscribed to), filled in by the server for a connection.
            let info = unsafe { &*data.cast::<raw::RedisModuleClientInfo>() };
            let mut ip = [0u8; 46];
            for (d, &c) in ip.iter_mut().zip(info.addr.iter()) {
                *d = c as u8;
            }
            ServerEvent::Client {
                id: info.id,
                connected: sub == raw::REDISMODULE_SUBEVENT_CLIENT_CHANGE_CONNECTED,
                ip,
                port: info.port,
            }
        }
        raw::REDISMODULE_EVENT_LOADING
            if sub == raw::REDISMODULE_SUBEVENT_LOADING_ENDED
                || sub == raw::REDISMODULE_SUBEVENT_LOADING_FAILED =>
        {
            ServerEvent::Loaded
        }
        raw::REDISMODULE_EVENT_PERSISTENCE
            if sub == raw::REDISMODULE_SUBEVENT_PERSISTENCE_SYNC_RDB_START
                || sub == raw::REDISMODULE_SUBEVENT_PERSISTENCE_SYNC_AOF_START =>
        {
            ServerEvent::SyncSaveStarted
        }
        raw::REDISMODULE_EVENT_PERSISTENCE
            if sub == raw::REDISMODULE_SUBEVENT_PERSISTENCE_ENDED
                || sub == raw::REDISMODULE_SUBEVENT_PERSISTENCE_FAILED =>
        {
            ServerEvent::SaveEnded
        }
        EVENT_ATOMIC_SLOT_MIGRATION => match slot_migration(sub, data) {
            Some(ev) => ev,
            None => return,
        },
        raw::REDISMODULE_EVENT_REPLICATION_ROLE_CHANGED => {
            if sub == raw::REDISMODULE_EVENT_REPLROLECHANGED_NOW_MASTER {
                ServerEvent::BecamePrimary
            } else {
                ServerEvent::BecameReplica
            }
        }
        _ => return,
    };
    catch(|| f(ctx, ev));
}

/// Calls `f` on flushes, SWAPDB, role changes, forks and replica changes.
pub fn subscribe_server(ctx: Ctx<'_>, f: ServerFn) -> Result<(), String> {
    let _ = SERVER.set(f);
    for id in [
        raw::REDISMODULE_EVENT_FLUSHDB,
        raw::REDISMODULE_EVENT_SWAPDB,
        raw::REDISMODULE_EVENT_REPLICATION_ROLE_CHANGED,
        raw::REDISMODULE_EVENT_FORK_CHILD,
        raw::REDISMODULE_EVENT_REPLICA_CHANGE,
        raw::REDISMODULE_EVENT_CRON_LOOP,
        raw::REDISMODULE_EVENT_LOADING,
        raw::REDISMODULE_EVENT_PERSISTENCE,
        raw::REDISMODULE_EVENT_MODULE_CHANGE,
        raw::REDISMODULE_EVENT_CLIENT_CHANGE,
        raw::REDISMODULE_EVENT_CONFIG,
    ] {
        let ev = raw::RedisModuleEvent { id, dataver: 1 };
        // SAFETY: a load-time context and a callback matching the server's signature.
        let ok =
            unsafe { api!(RedisModule_SubscribeToServerEvent)(ctx.raw(), ev, Some(server_cb)) };
        if ok != OK {
            return Err(format!("subscribing to server event {id} failed"));
        }
    }
    if super::atomic_slot_migration(ctx) {
        let ev = raw::RedisModuleEvent {
            id: EVENT_ATOMIC_SLOT_MIGRATION,
            dataver: 1,
        };
        // SAFETY: as above; the event exists on Valkey 9.
        let ok =
            unsafe { api!(RedisModule_SubscribeToServerEvent)(ctx.raw(), ev, Some(server_cb)) };
        if ok != OK {
            return Err("subscribing to the atomic slot migration event failed".into());
        }
    }
    Ok(())
}

/// Where an INFO section's fields go.
pub struct InfoSink(*mut raw::RedisModuleInfoCtx);

impl InfoSink {
    pub fn add(&mut self, name: &str, v: u64) {
        if let Ok(n) = CString::new(name) {
            // SAFETY: a live info context (only handed out inside `info_cb`).
            unsafe { api!(RedisModule_InfoAddFieldULongLong)(self.0, n.as_ptr(), v) };
        }
    }
}

pub type InfoFn = fn(&mut InfoSink);
static INFO: OnceLock<InfoFn> = OnceLock::new();

extern "C" fn info_cb(ctx: *mut raw::RedisModuleInfoCtx, _for_crash_report: c_int) {
    let Some(f) = INFO.get() else {
        return;
    };
    catch(|| {
        // SAFETY: a live info context; NULL names the module's default section.
        unsafe { api!(RedisModule_InfoAddSection)(ctx, std::ptr::null()) };
        f(&mut InfoSink(ctx));
    });
}

/// The `INFO lock` section (fields get the `lock_` prefix from the server).
pub fn register_info(ctx: Ctx<'_>, f: InfoFn) -> Result<(), String> {
    let _ = INFO.set(f);
    // SAFETY: a load-time context and a callback matching the server's signature.
    if unsafe { api!(RedisModule_RegisterInfoFunc)(ctx.raw(), Some(info_cb)) } != OK {
        return Err("registering the INFO section failed".into());
    }
    Ok(())
}

/// What the filter does before the next command (it sees no arguments).
pub type FilterFn = fn();
static FILTER: OnceLock<FilterFn> = OnceLock::new();
/// The installed filter, while one is (main thread only).
static INSTALLED: AtomicPtr<raw::RedisModuleCommandFilter> = AtomicPtr::new(std::ptr::null_mut());

extern "C" fn filter_cb(_fctx: *mut raw::RedisModuleCommandFilterCtx) {
    if let Some(f) = FILTER.get() {
        catch(f);
    }
}

/// Calls `f` with the arguments of every command before it runs (the module's own
/// commands excepted) until [`remove_filter`]. Every command of the server pays for it
/// while it is installed.
pub fn install_filter(ctx: Ctx<'_>, f: FilterFn) -> bool {
    let _ = FILTER.set(f);
    if !INSTALLED.load(Ordering::Relaxed).is_null() {
        return true;
    }
    // SAFETY: a valid context and a callback matching the server's signature.
    let filter = unsafe {
        api!(RedisModule_RegisterCommandFilter)(
            ctx.raw(),
            Some(filter_cb),
            raw::REDISMODULE_CMDFILTER_NOSELF as c_int,
        )
    };
    INSTALLED.store(filter, Ordering::Relaxed);
    !filter.is_null()
}

pub fn remove_filter(ctx: Ctx<'_>) {
    let filter = INSTALLED.swap(std::ptr::null_mut(), Ordering::Relaxed);
    if !filter.is_null() {
        // SAFETY: a filter this module registered and has not unregistered.
        unsafe { api!(RedisModule_UnregisterCommandFilter)(ctx.raw(), filter) };
    }
}
