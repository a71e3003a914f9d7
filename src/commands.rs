//! The command handlers. Each reads top to bottom: parse, open the key, decide (core),
//! apply, replicate, notify, reply.

use std::ffi::c_int;
use std::slice;

use redis_module::raw;

use crate::args;
use crate::config;
use crate::core::{self, AcquireDecision, Current, LockState};
use crate::error::LockError;
use crate::ffi::{self, Ctx, RStr};
use crate::guard;
use crate::info::{bump, STATS};
use crate::replicate;
use crate::state::{next_fence, observe_fence};
use crate::store::LockKey;
use crate::waiters::{self, LeaseEnd};

const GENERIC: c_int = raw::REDISMODULE_NOTIFY_GENERIC as c_int;
/// Enough for the longest valid command (LOCK.ACQUIRE with every option).
const MAX_ARGS: usize = 16;

/// A fresh random UUID v4 in its text form.
pub fn new_token() -> Vec<u8> {
    let mut buf = [0u8; uuid::fmt::Hyphenated::LENGTH];
    uuid::Uuid::new_v4()
        .hyphenated()
        .encode_lower(&mut buf)
        .as_bytes()
        .to_vec()
}

/// Splits argv into the key and the remaining arguments, as byte slices on the stack.
fn split<'a>(
    argv: *mut RStr,
    argc: c_int,
    cmd: &'static str,
    buf: &'a mut [&'static [u8]; MAX_ARGS],
) -> Result<(RStr, &'a [&'static [u8]]), LockError> {
    let argv = unsafe { slice::from_raw_parts(argv, usize::try_from(argc).unwrap_or(0)) };
    if argv.len() < 2 {
        return Err(LockError::WrongArity(cmd));
    }
    let rest = &argv[2..];
    if rest.len() > MAX_ARGS {
        return Err(LockError::Syntax("too many arguments".into()));
    }
    for (slot, a) in buf.iter_mut().zip(rest) {
        *slot = ffi::bytes(*a);
    }
    Ok((argv[1], &buf[..rest.len()]))
}

macro_rules! handler {
    ($fn_name:ident, $cmd:literal, $impl:ident) => {
        pub extern "C" fn $fn_name(ctx: Ctx, argv: *mut RStr, argc: c_int) -> c_int {
            guard::command(ctx, $cmd, || {
                let mut buf = [&[][..]; MAX_ARGS];
                let (key, rest) = split(argv, argc, $cmd, &mut buf)?;
                $impl(ctx, key, rest)
            })
        }
    };
}

handler!(acquire, "lock.acquire", acquire_impl);
handler!(release, "lock.release", release_impl);
handler!(extend, "lock.extend", extend_impl);
handler!(info, "lock.info", info_impl);
handler!(forcerelease, "lock.forcerelease", forcerelease_impl);
handler!(sync, "lock.sync", sync_impl);
handler!(debug, "lock.debug", debug_impl);

fn acquire_impl(ctx: Ctx, name: RStr, rest: &[&[u8]]) -> Result<(), LockError> {
    let req = args::parse_acquire(rest, &config::limits())?;
    let now = ffi::now_ms();
    if req.min_fence > core::fence_ceiling(now, core::MINFENCE_MAX_LEAD_MS) {
        return Err(LockError::FenceTooFarAhead);
    }
    let deadline = core::lease_deadline(now, req.ttl, "lock.acquire")?;
    let db = ffi::selected_db(ctx);
    let queued = waiters::queued(db, ffi::bytes(name));
    let mut key = LockKey::open_reaped(ctx, name, now);
    let current = key.current(now)?;
    match core::decide_acquire(current, req.token, queued) {
        AcquireDecision::Grant => {
            let fence = next_fence(now, req.min_fence)?;
            let client_id = ffi::client_id(ctx);
            let state = LockState {
                token: req.token.map_or_else(new_token, <[u8]>::to_vec),
                fence,
                expires_at: deadline,
                acquired_at: now,
                owner: req.owner.map(<[u8]>::to_vec),
                client_id,
                client_addr: ffi::client_addr(client_id),
            };
            let s = key.put(state);
            replicate::state(ctx, name, s);
            ffi::reply_grant(ctx, &s.token, s.fence);
            drop(key);
            ffi::notify(ctx, GENERIC, b"lock.acquire\0", name);
            bump(&STATS.acquired);
        }
        AcquireDecision::Renew => {
            // A renew keeps its fence; MINFENCE then only lifts this server's counter
            // (before replicating, so LOCK.SYNC carries it as FLOOR), which is how a
            // quorum client makes later grants on this node exceed it.
            if req.min_fence > 0 {
                observe_fence(req.min_fence);
            }
            let Some(s) = key.state_mut() else {
                return Err(LockError::Internal("lock.acquire"));
            };
            s.expires_at = deadline;
            replicate::state(ctx, name, s);
            ffi::reply_grant(ctx, &s.token, s.fence);
            key.set_deadline(deadline);
            drop(key);
            ffi::notify(ctx, GENERIC, b"lock.acquire\0", name);
            bump(&STATS.renewed);
        }
        AcquireDecision::Busy => {
            bump(&STATS.contended);
            let lease_end = match current {
                Current::Module(s) => LeaseEnd::At(s.expires_at),
                Current::Classic(_) => key.deadline().map_or(LeaseEnd::Never, LeaseEnd::At),
                Current::Free => LeaseEnd::Now,
            };
            drop(key);
            match req.block {
                Some(ms) if may_block(ctx) => waiters::enqueue(ctx, name, &req, ms, lease_end)?,
                _ => ffi::reply_null(ctx),
            }
        }
    }
    Ok(())
}

/// Inside MULTI/EXEC, scripts and replicated streams BLOCK acts as non-blocking.
fn may_block(ctx: Ctx) -> bool {
    let f = ffi::context_flags(ctx);
    f & (ffi::FLAG_DENY_BLOCKING
        | ffi::FLAG_MULTI
        | ffi::FLAG_LUA
        | ffi::FLAG_REPLICATED
        | ffi::FLAG_LOADING)
        == 0
}

fn release_impl(ctx: Ctx, name: RStr, rest: &[&[u8]]) -> Result<(), LockError> {
    let token = args::parse_release(rest)?;
    let released = release_token(ctx, name, token)?;
    ffi::reply_int(ctx, i64::from(released));
    Ok(())
}

/// Deletes the lock if `token` holds it, then hands it to the next waiter. Shared by
/// LOCK.RELEASE and the revocation of a grant whose waiter disconnected.
pub fn release_token(ctx: Ctx, name: RStr, token: &[u8]) -> Result<bool, LockError> {
    let now = ffi::now_ms();
    let key = LockKey::open_reaped(ctx, name, now);
    if !core::holds(key.current(now)?, token) {
        return Ok(false);
    }
    key.delete();
    drop(key);
    replicate::delete(ctx, name);
    ffi::notify(ctx, GENERIC, b"lock.release\0", name);
    bump(&STATS.released);
    waiters::handoff(ctx, name);
    Ok(true)
}

fn extend_impl(ctx: Ctx, name: RStr, rest: &[&[u8]]) -> Result<(), LockError> {
    let req = args::parse_extend(rest, &config::limits())?;
    let now = ffi::now_ms();
    let deadline = core::lease_deadline(now, req.ttl, "lock.extend")?;
    let mut key = LockKey::open_reaped(ctx, name, now);
    let current = key.current(now)?;
    if !core::holds(current, req.token) {
        ffi::reply_int(ctx, 0);
        return Ok(());
    }
    let classic = matches!(current, Current::Classic(_));
    key.set_deadline(deadline);
    if classic {
        replicate::expire_at(ctx, name, deadline);
    } else if let Some(s) = key.state_mut() {
        s.expires_at = deadline;
        replicate::state(ctx, name, s);
    }
    drop(key);
    ffi::reply_int(ctx, 1);
    ffi::notify(ctx, GENERIC, b"lock.extend\0", name);
    bump(&STATS.extended);
    Ok(())
}

fn info_impl(ctx: Ctx, name: RStr, rest: &[&[u8]]) -> Result<(), LockError> {
    if !rest.is_empty() {
        return Err(LockError::WrongArity("lock.info"));
    }
    let now = ffi::now_ms();
    let key = LockKey::open_read(ctx, name);
    let current = key.current(now)?;
    let waiting = waiters::queued(ffi::selected_db(ctx), ffi::bytes(name)) as i64;
    let ttl_left = |at: Option<i64>| at.map_or(-1, |at| at.saturating_sub(now).max(0));
    let field = |k: &[u8]| ffi::reply_bytes(ctx, k);
    match current {
        Current::Free => ffi::reply_null(ctx),
        Current::Module(s) => {
            ffi::reply_map(ctx, 10);
            field(b"state");
            field(b"held");
            field(b"kind");
            field(b"module");
            field(b"ttl");
            ffi::reply_int(ctx, ttl_left(Some(s.expires_at)));
            field(b"expires-at");
            ffi::reply_int(ctx, s.expires_at);
            field(b"fence");
            ffi::reply_int(ctx, s.fence as i64);
            field(b"owner");
            match &s.owner {
                Some(o) => ffi::reply_bytes(ctx, o),
                None => ffi::reply_null(ctx),
            }
            field(b"acquired-at");
            ffi::reply_int(ctx, s.acquired_at);
            field(b"client-id");
            ffi::reply_int(ctx, s.client_id as i64);
            field(b"client-addr");
            ffi::reply_bytes(ctx, &s.client_addr);
            field(b"waiters");
            ffi::reply_int(ctx, waiting);
        }
        Current::Classic(_) => {
            let at = key.deadline();
            ffi::reply_map(ctx, 10);
            field(b"state");
            field(b"held");
            field(b"kind");
            field(b"string");
            field(b"ttl");
            ffi::reply_int(ctx, ttl_left(at));
            field(b"expires-at");
            match at {
                Some(at) => ffi::reply_int(ctx, at),
                None => ffi::reply_null(ctx),
            }
            for f in [
                &b"fence"[..],
                b"owner",
                b"acquired-at",
                b"client-id",
                b"client-addr",
            ] {
                field(f);
                ffi::reply_null(ctx);
            }
            field(b"waiters");
            ffi::reply_int(ctx, waiting);
        }
    }
    Ok(())
}

fn forcerelease_impl(ctx: Ctx, name: RStr, rest: &[&[u8]]) -> Result<(), LockError> {
    if !rest.is_empty() {
        return Err(LockError::WrongArity("lock.forcerelease"));
    }
    let now = ffi::now_ms();
    let key = LockKey::open_reaped(ctx, name, now);
    if matches!(key.current(now)?, Current::Free) {
        drop(key);
        ffi::reply_int(ctx, 0);
        return Ok(());
    }
    key.delete();
    drop(key);
    replicate::delete(ctx, name);
    ffi::notify(ctx, GENERIC, b"lock.forcerelease\0", name);
    bump(&STATS.force_released);
    waiters::handoff(ctx, name);
    ffi::reply_int(ctx, 1);
    Ok(())
}

/// Applies the full state sent by a primary (or replayed from the AOF).
fn sync_impl(ctx: Ctx, name: RStr, rest: &[&[u8]]) -> Result<(), LockError> {
    if !ffi::flag(ctx, ffi::FLAG_REPLICATED | ffi::FLAG_LOADING) {
        return Err(LockError::InternalOnly("lock.sync"));
    }
    let s = args::parse_sync(rest)?;
    if s.fence > core::fence_ceiling(ffi::now_ms(), core::LOADED_FENCE_MAX_LEAD_MS) {
        return Err(LockError::FenceTooFarAhead);
    }
    if s.floor > core::fence_ceiling(ffi::now_ms(), core::LOADED_FENCE_MAX_LEAD_MS) {
        return Err(LockError::FenceTooFarAhead);
    }
    observe_fence(s.fence.max(s.floor));
    let mut key = LockKey::open(ctx, name);
    key.put(LockState {
        token: s.token.to_vec(),
        fence: s.fence,
        expires_at: s.expires_at,
        acquired_at: s.acquired_at,
        owner: s.owner.map(<[u8]>::to_vec),
        client_id: s.client_id,
        client_addr: s.client_addr.to_vec(),
    });
    drop(key);
    replicate::verbatim(ctx);
    ffi::reply_simple(ctx, b"OK\0");
    Ok(())
}

/// `LOCK.DEBUG PANIC`: exists to prove that a panic becomes an error reply. Off unless
/// the module is loaded with `debug-commands yes`.
fn debug_impl(ctx: Ctx, sub: RStr, rest: &[&[u8]]) -> Result<(), LockError> {
    if !config::DEBUG_COMMANDS.load(std::sync::atomic::Ordering::Relaxed) {
        return Err(LockError::Disabled(
            "LOCK.DEBUG (load the module with 'debug-commands yes')",
        ));
    }
    match (ffi::bytes(sub).to_ascii_uppercase().as_slice(), rest) {
        (b"PANIC", []) => panic!("LOCK.DEBUG PANIC was called"),
        (b"FENCE", []) => {
            ffi::reply_int(ctx, crate::state::FENCE.get().last() as i64);
            Ok(())
        }
        _ => Err(LockError::Syntax("LOCK.DEBUG PANIC | FENCE".into())),
    }
}
