//! Learning that the server changed something behind the module's back, at no cost to
//! commands that do not touch a lock:
//!
//! - a lock value leaving the keyspace (DEL, UNLINK, eviction, an overwrite, RENAME or
//!   MOVE away, MIGRATE) arrives through the data type's own unlink callback, which the
//!   server calls for values of this type only;
//! - MIGRATE is told from a DEL by what comes before the unlink: the value was serialized
//!   in the main process within the same command (MIGRATE serializes, sends, then
//!   deletes). The module installs a command filter only while such a mark is pending,
//!   and the filter drops the marks at the next command. This holds for every way
//!   MIGRATE can run (a client, MULTI/EXEC, EVAL, FCALL, another module's RM_Call);
//! - classic string locks have no callback of ours: the module subscribes to keyspace
//!   events once a client first waits for one (every such event of the server then calls
//!   the module, so not before);
//! - flushes, SWAPDB, role changes, forks, loading, synchronous saves and the server's
//!   cron arrive as server events.
//!
//! Nothing here writes to the keyspace: it tells the engine, which serves the keys on its
//! next tick, through its gate.

use std::ffi::c_int;

use redis_module::raw;

use crate::ffi::events::{self as fev, ServerEvent};
use crate::ffi::{self, Ctx, Str};
use crate::lock::value::LockValue;
use crate::sched::{self, with_engine};
use crate::state::{self, Pending, State};

/// Keyspace events a waiter on a classic string lock needs.
const KEY_EVENTS: c_int = (raw::REDISMODULE_NOTIFY_GENERIC
    | raw::REDISMODULE_NOTIFY_EXPIRED
    | raw::REDISMODULE_NOTIFY_STRING) as c_int;
/// Evictions, to count evicted locks: listened to from the first time the server itself
/// removes a lock key (an eviction's `evicted` notification comes after the unlink).
const EVICTIONS: c_int = raw::REDISMODULE_NOTIFY_EVICTED as c_int;

/// How often the module asks whether anything receives the replication stream.
const LISTEN_CHECK_US: i64 = 1_000_000;
/// A change of the wall clock against the monotonic one larger than this is a step.
const STEP_US: i64 = 5_000;

/// A lock value left the keyspace by the server's hand.
pub fn unlinked(db: i32, key: &[u8], v: &LockValue) {
    let ptr = v as *const LockValue as usize;
    let done = state::with(|st| {
        let moved = st.serialized.remove(&ptr);
        if !moved {
            // RENAME and MOVE put this same value under another name: unless it is freed
            // now (DEL, an overwrite), the cron looks for where it went.
            state::orphan(ptr);
        }
        st.engine.unlinked(db, key, v, moved, ffi::mono_us());
        // Kept until the `evicted` notification that may follow: a lock evicted while
        // grants are refused for the eviction policy is put back. Nothing evicts while
        // the server does not evict.
        st.last_unlinked = None;
        if let (true, Some(ctx)) = (crate::config::evicts(), ffi::module_ctx()) {
            let kept = crate::config::eviction_refusal()
                .is_some()
                .then(|| v.clone());
            st.last_unlinked = Some(state::Unlinked {
                db,
                name: key.to_vec(),
                kept,
                commands: commands_run(ctx),
            });
        }
        arm(st);
        if !std::mem::replace(&mut st.eviction_events, true) {
            if let Some(ctx) = ffi::module_ctx() {
                if let Err(e) = fev::subscribe_keyspace(ctx, EVICTIONS, on_keyspace) {
                    ctx.log("warning", &format!("redis-lock: {e}"));
                }
            }
        }
    });
    if done.is_none() {
        state::defer(Pending::Unlinked {
            db,
            name: key.to_vec(),
            value: v.clone(),
            moved: false,
        });
    }
}

/// A lock value was serialized in the main process (DUMP, MIGRATE, SAVE): if it is
/// unlinked within the same command, a MIGRATE moved it.
pub fn serialized(v: &LockValue) {
    let ptr = v as *const LockValue as usize;
    let marked = state::with(|st| !st.saving && st.serialized.insert(ptr));
    if marked == Some(true) {
        if let Some(ctx) = ffi::module_ctx() {
            fev::install_filter(ctx, next_command);
        }
    }
}

/// The command after the one that serialized values runs: their marks are stale.
fn next_command() {
    state::with(|st| st.serialized.clear());
    if let Some(ctx) = ffi::module_ctx() {
        fev::remove_filter(ctx);
    }
}

/// Arms the wake-up timer for the engine's next work (from callbacks without a context).
fn arm(st: &mut State) {
    if let (Some(at), Some(ctx)) = (st.engine.next_due(), ffi::module_ctx()) {
        st.wake.arm(ctx, at);
    }
}

/// A client waits for a classic string lock: the module starts listening to keyspace
/// events (once; they then cost every command that emits one a call into the module).
pub fn need_key_events(ctx: Ctx<'_>) {
    let subscribe = state::with(|st| !std::mem::replace(&mut st.key_events, true));
    if subscribe == Some(true) {
        if let Err(e) = fev::subscribe_keyspace(ctx, KEY_EVENTS, on_keyspace) {
            ctx.log("warning", &format!("redis-lock: {e}"));
        }
    }
}

pub fn on_keyspace(ctx: Ctx<'_>, event: &[u8], key: Str<'_>) {
    if event.starts_with(b"lock.") {
        return; // our own notifications
    }
    if event == b"evicted" {
        let (db, name) = (ctx.db(), key.bytes());
        state::with(|st| {
            let Some(u) = st.last_unlinked.take() else {
                return;
            };
            // The eviction of the lock unlinked just now, not of a string of the same
            // name after the lock was deleted by hand.
            if u.db != db || u.name != name || commands_run(ctx) != u.commands {
                return;
            }
            st.engine.stats.evicted += 1;
            st.engine.stats.removed = st.engine.stats.removed.saturating_sub(1);
            if let Some(v) = u.kept {
                st.engine.restore_later(db, name, v);
                arm(st);
            }
        });
    }
    let (db, name) = (ctx.db(), key.bytes());
    with_engine(ctx, |e| {
        if e.has_waiters(db, name) || e.is_watched(db, name) {
            e.touched(db, name, ffi::mono_us());
        }
    });
}

/// How many commands the server has run.
fn commands_run(ctx: Ctx<'_>) -> i64 {
    ctx.info_fields(c"stats", &[c"total_commands_processed"])[0]
}

/// Whether anything can receive the replication stream now.
pub fn listening_now(ctx: Ctx<'_>) -> bool {
    if ctx.flags() & ffi::FLAG_AOF != 0 {
        return true;
    }
    let v = ctx.info_fields(
        c"replication",
        &[c"connected_slaves", c"repl_backlog_active"],
    );
    v.iter().any(|&n| n != 0)
}

pub fn on_server(ctx: Ctx<'_>, ev: ServerEvent) {
    let now = ffi::mono_us();
    state::with(|st| {
        match ev {
            ServerEvent::Flushed(db) => st.engine.flushed((db >= 0).then_some(db), now),
            ServerEvent::Swapped(a, b) => st.engine.swapped(a, b, now),
            ServerEvent::BecamePrimary => {
                st.replica = false;
                st.engine.promoted(ffi::wall_ms());
                st.wake.arm(ctx, now);
            }
            ServerEvent::BecameReplica => {
                st.replica = true;
                st.engine.demoted();
            }
            ServerEvent::Forked | ServerEvent::ReplicaChanged => st.listening = true,
            ServerEvent::Loaded => {
                st.listening = listening_now(ctx);
                st.replica = ctx.flags() & ffi::FLAG_SLAVE != 0;
                if st.replica {
                    st.engine.demoted();
                }
                st.wake.arm(ctx, now);
                clear_legacy_expiry(ctx, st);
            }
            ServerEvent::SyncSaveStarted => st.saving = true,
            ServerEvent::SaveEnded => {
                st.saving = false;
                st.serialized.clear();
            }
            ServerEvent::Cron => return cron(ctx, st, now),
            ServerEvent::SlotMigration {
                phase,
                export,
                ranges,
            } => slot_migration(ctx, st, phase, export, &ranges, now),
            ServerEvent::ModulesChanged => st.command_flags.clear(),
            ServerEvent::ConfigChanged => return check_eviction(ctx),
            ServerEvent::Client {
                id,
                connected,
                ip,
                port,
            } => {
                let addr = connected.then(|| {
                    let len = ip.iter().position(|&c| c == 0).unwrap_or(ip.len());
                    let text = std::str::from_utf8(&ip[..len]).unwrap_or("");
                    crate::lock::value::Addr::from_ip_port(text, port)
                });
                if !connected {
                    // Sessions bound to the connection end after their grace period.
                    st.engine.client_gone(id, now);
                }
                st.client(id, addr);
            }
        }
        arm(st);
    });
}

/// Reads the server's `maxmemory` and `maxmemory-policy` (at load, and after every CONFIG
/// SET): under a policy that can evict a key without an expiry, a held lock can be evicted
/// and granted again, so new grants are refused unless `lock.allow-eviction` says
/// otherwise. Logged when such a policy starts to apply, and at load.
pub fn check_eviction(ctx: Ctx<'_>) {
    let maxmemory = ctx.info_fields(c"memory", &[c"maxmemory"])[0];
    let policy = ctx
        .info_text(c"memory", c"maxmemory_policy")
        .unwrap_or_default();
    let (risk, changed) = crate::config::set_eviction(maxmemory, &policy);
    let (Some(policy), true) = (risk, changed) else {
        return;
    };
    let what = if crate::config::eviction_refusal().is_some() {
        "new grants are refused (use noeviction or a volatile-* policy, or accept the risk \
         with lock.allow-eviction yes)"
    } else {
        "lock.allow-eviction yes: a held lock can be evicted and granted to a second holder"
    };
    ctx.log(
        "warning",
        &format!(
            "redis-lock: maxmemory-policy {policy} with maxmemory {maxmemory} can evict \
             lock keys (they have no expiry): {what}"
        ),
    );
}

/// Locks loaded from files of the 0.1 and 0.2 releases also carry the lease as their
/// key's Redis expiry, which would remove them at the old deadline whatever EXTEND says
/// (and early after a forward step of the wall clock): taken off once loading ends. A
/// replica leaves its keys as its primary sends them.
fn clear_legacy_expiry(ctx: Ctx<'_>, st: &mut State) {
    let keys = std::mem::take(&mut st.legacy_expiry);
    if st.replica || keys.is_empty() {
        return;
    }
    let db0 = ctx.db();
    let mut cleared = 0usize;
    for (db, name) in keys {
        if !ctx.select_db(db) {
            continue;
        }
        let key = crate::ffi::OwnedStr::new(&name);
        let mut k = ctx.open_key(key.as_str(), true, &state::LOCK_TYPE);
        if k.kind() == crate::ffi::KeyKind::Ours && k.abs_expire().is_some() {
            k.set_abs_expire(-1);
            cleared += 1;
        }
    }
    ctx.select_db(db0);
    if cleared > 0 {
        ctx.log(
            "notice",
            &format!("redis-lock: {cleared} lock(s) loaded from an older release's file no longer carry their lease as a key expiry"),
        );
    }
}

/// The server's cron, on the monotonic clock: does what a wall-clock-delayed timer has
/// not done yet, notices a step of the wall clock (and arms the timer anew), and every
/// second asks whether anything receives the replication stream.
fn cron(ctx: Ctx<'_>, st: &mut State, now: i64) {
    let offset = ffi::wall_ms().saturating_mul(1000).saturating_sub(now);
    let stepped = st
        .clock_offset
        .is_some_and(|prev| (offset - prev).abs() > STEP_US);
    st.clock_offset = Some(offset);
    if st.engine.next_due().is_some_and(|at| at <= now) {
        sched::tick(ctx, st);
    }
    if stepped {
        if let Some(at) = st.engine.next_due() {
            st.wake.rearm(ctx, at);
        }
    }
    if let Some(c) = &mut st.cluster {
        c.cron(ctx, &st.engine.fence, now);
        if c.take_lost() {
            // Watchers of keys whose slot moved away are told so (TRYAGAIN) at their
            // next look, whether or not a key moved with the slot.
            for (db, name) in st.engine.watched_keys(None) {
                if !c.serves(crate::cluster::key_slot(&name)) {
                    st.engine.touched(db, &name, now);
                }
            }
            if let Some(at) = st.engine.next_due() {
                st.wake.arm(ctx, at);
            }
        }
    }
    adopt(ctx, st, now);
    if now.saturating_sub(st.listen_checked) >= LISTEN_CHECK_US {
        st.listen_checked = now;
        let exporting = st.cluster.as_ref().is_some_and(|c| c.exports());
        st.listening = exporting || listening_now(ctx);
    }
}

/// Valkey 9's atomic slot migration (`CLUSTER MIGRATESLOTS`). The source streams the
/// slots' locks to the target as this module's own replication commands (the data type's
/// AOF rewrite for the snapshot, then every change), so while it exports, every change
/// is built for the stream. At the cut-over the source's waiters and watchers of keys
/// there are told LOCKMOVED (the server then deletes the keys here, and hands nothing
/// over: the routing check finds the slot elsewhere); an aborted export changes nothing
/// here. The target takes the slots as any node that begins to serve them (confirmed
/// with the other nodes before a grant) and tracks the leases of what arrived.
fn slot_migration(
    ctx: Ctx<'_>,
    st: &mut State,
    phase: fev::Phase,
    export: bool,
    ranges: &[(u16, u16)],
    now: i64,
) {
    let State {
        engine,
        wake,
        cluster,
        listening,
        ..
    } = st;
    let Some(c) = cluster else {
        return;
    };
    let inside = |name: &[u8]| crate::cluster::in_ranges(ranges, crate::cluster::key_slot(name));
    match (export, phase) {
        (true, fev::Phase::Started) => {
            c.exporting(ranges, true);
            *listening = true;
        }
        (true, fev::Phase::Aborted) => c.exporting(ranges, false),
        (true, fev::Phase::Completed) => {
            c.exporting(ranges, false);
            c.refresh(ctx, engine.fence.last(), now);
            let mut sched = sched::RedisSched {
                ctx,
                wake,
                may_block: false,
                unblock_allowed: false,
            };
            engine.moved_away(&mut sched, inside, now);
        }
        (false, fev::Phase::Completed) => {
            c.refresh(ctx, engine.fence.last(), now);
            // Leases that came due while the slots were not served here were let go by
            // the engine's routing check: every lock that arrived is tracked again.
            let mine = ctx.db();
            for db in 0.. {
                if !ctx.select_db(db) {
                    break;
                }
                for &(a, b) in ranges {
                    for slot in usize::from(a)..=usize::from(b) {
                        for name in crate::ffi::cluster::keys_in_slot(ctx, slot) {
                            let key = crate::ffi::OwnedStr::new(&name);
                            let mut k = ctx.open_key(key.as_str(), false, &state::LOCK_TYPE);
                            if let Some(v) = k.value() {
                                engine.loaded(db, &name, v, now);
                            }
                        }
                    }
                }
            }
            ctx.select_db(mine);
        }
        (false, _) => {}
    }
}

/// Keys the walk looks at per cron (a million keys take about five seconds at `hz 10`).
const ADOPT_KEYS_PER_CRON: usize = 50_000;

/// Finds the new names of lock values the server moved without telling the module
/// (RENAME, MOVE): the engine tracks their leases there from then on, so they end, are
/// reclaimed and hand over like any lock (waiters queued on the new name were safe
/// already: a waiter files its key's lease itself).
fn adopt(ctx: Ctx<'_>, st: &mut State, now: i64) {
    let fresh = state::take_orphans();
    if st.adopting.is_none() && fresh.is_empty() {
        return;
    }
    let a = st.adopting.get_or_insert_with(|| state::Adopting {
        wanted: Vec::new(),
        db: 0,
        scan: crate::ffi::scan::Scan::new(),
    });
    if !fresh.is_empty() && !a.wanted.is_empty() {
        // Newcomers may be behind the walk: it starts over for all of them.
        a.db = 0;
        a.scan = crate::ffi::scan::Scan::new();
    }
    a.wanted.extend(fresh);
    let mine = ctx.db();
    let mut found: Vec<(i32, Vec<u8>)> = Vec::new();
    let mut budget = ADOPT_KEYS_PER_CRON;
    while !a.wanted.is_empty() && budget > 0 {
        if !ctx.select_db(a.db) {
            a.wanted.clear(); // every db walked: the rest were freed after all
            break;
        }
        let db = a.db;
        let wanted = &mut a.wanted;
        let (more, seen) = a
            .scan
            .step(ctx, &state::LOCK_TYPE, budget, &mut |name, ptr| {
                if let Some(i) = wanted.iter().position(|p| *p == ptr) {
                    wanted.swap_remove(i);
                    found.push((db, name.to_vec()));
                }
            });
        budget = budget.saturating_sub(seen.max(1));
        if !more {
            a.db += 1;
            a.scan = crate::ffi::scan::Scan::new();
        }
    }
    if a.wanted.is_empty() {
        st.adopting = None;
    }
    for (db, name) in found {
        if !ctx.select_db(db) {
            continue;
        }
        let key = crate::ffi::OwnedStr::new(&name);
        let mut k = ctx.open_key(key.as_str(), false, &state::LOCK_TYPE);
        if let Some(v) = k.value() {
            st.engine.loaded(db, &name, v, now);
        }
        drop(k);
        st.engine.touched(db, &name, now);
    }
    ctx.select_db(mine);
    if let Some(at) = st.engine.next_due() {
        st.wake.arm(ctx, at);
    }
}

/// A message from the module on another node of the cluster.
pub fn on_bus(ctx: Ctx<'_>, from: &crate::ffi::cluster::NodeId, kind: u8, data: &[u8]) {
    let now = ffi::mono_us();
    state::with(|st| {
        let counter = st.engine.fence.last();
        if let Some(c) = &mut st.cluster {
            if let Some(heard) = c.received(ctx, from, kind, data, counter, now) {
                st.engine.fence.observe(heard);
            }
        }
    });
}
