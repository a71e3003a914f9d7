//! The command handlers. Each reads top to bottom: parse, open the key, ask the engine,
//! reply. Replication and notifications happen inside the engine's calls, through the
//! key ([`RedisKey`]); blocking through [`crate::waiting`].

use std::sync::atomic::Ordering;

use crate::args::{self, block_deadline};
use crate::config;
use crate::engine::value::{digest, Holder, Mode};
use crate::engine::{AcquireReq, Acquired, InfoView, Repl, Wait};
use crate::error::LockError;
use crate::ffi::blocked::BlockedClient;
use crate::ffi::{self, command_entry, Args, Ctx, Str};
use crate::keyspace::{caller, new_token, RedisKey};
use crate::waiting::{self, with_engine, LockEngine, RedisSched, WaiterRec, UNBLOCK_ALLOWED};

/// Enough for the longest valid command (LOCK.ACQUIRE with every option).
const MAX_ARGS: usize = 24;

command_entry!(acquire, "lock.acquire", acquire_impl);
command_entry!(release, "lock.release", release_impl);
command_entry!(extend, "lock.extend", extend_impl);
command_entry!(info, "lock.info", info_impl);
command_entry!(forcerelease, "lock.forcerelease", forcerelease_impl);
command_entry!(repl, "lock.repl", repl_impl);
command_entry!(sync, "lock.sync", sync_impl);
command_entry!(debug, "lock.debug", debug_impl);

/// The key (first argument) and the rest as byte slices.
fn split<'a, 'b>(
    args: Args<'a>,
    cmd: &'static str,
    buf: &'b mut [&'a [u8]; MAX_ARGS],
) -> Result<(Str<'a>, &'b [&'a [u8]]), LockError> {
    let key = args.get(1).ok_or(LockError::WrongArity(cmd))?;
    let rest = args
        .bytes_from(2, buf)
        .ok_or_else(|| LockError::Syntax("too many arguments".into()))?;
    Ok((key, rest))
}

fn engine_busy() -> LockError {
    LockError::Internal("lock engine re-entered")
}

/// Inside MULTI/EXEC, scripts and replicated streams BLOCK acts as non-blocking.
fn may_block(ctx: Ctx<'_>) -> bool {
    ctx.flags()
        & (ffi::FLAG_DENY_BLOCKING
            | ffi::FLAG_MULTI
            | ffi::FLAG_LUA
            | ffi::FLAG_REPLICATED
            | ffi::FLAG_LOADING)
        == 0
}

fn reply_grant(ctx: Ctx<'_>, token: &[u8], fence: u64) {
    ctx.reply_array(2);
    ctx.reply_bytes(token);
    ctx.reply_int(fence as i64);
}

fn acquire_impl(ctx: Ctx<'_>, args: Args<'_>) -> Result<(), LockError> {
    let mut buf = [&[][..]; MAX_ARGS];
    let (name, rest) = split(args, "lock.acquire", &mut buf)?;
    let req = args::parse_acquire(rest, &config::limits())?;
    let now = ffi::now_ms();
    // A BLOCK time that cannot be scheduled is refused before anything happens.
    let wait_until = req.block.map(|ms| block_deadline(now, ms)).transpose()?;
    let (client_id, addr) = caller(ctx);
    let mut ks = RedisKey::new(ctx, name, now, true);
    let mut sched = RedisSched::new(ctx);
    let ar = AcquireReq {
        mode: req.mode,
        ttl: req.ttl,
        token: req.token,
        owner: req.owner,
        min_fence: req.min_fence,
        client_id,
        addr,
    };
    let outcome =
        with_engine(|e| e.acquire(&mut ks, &mut sched, &ar)).ok_or_else(engine_busy)??;
    let serve_at = match outcome {
        Acquired::Granted { token, fence } => {
            reply_grant(ctx, &token, fence);
            return Ok(());
        }
        Acquired::Busy { serve_at } => serve_at,
    };
    let Some(wait_until) = wait_until.filter(|_| may_block(ctx)) else {
        ctx.reply_null();
        return Ok(());
    };
    let db = ctx.db();
    let key = name.bytes();
    let max = config::max_waiters();
    if with_engine(|e| e.queued(db, key)).unwrap_or(0) as u64 >= max {
        return Err(LockError::TooManyWaiters(max));
    }
    let token = req.token.map_or_else(new_token, <[u8]>::to_vec);
    let bc = BlockedClient::block(ctx, UNBLOCK_ALLOWED.load(Ordering::Relaxed));
    let id = bc.id();
    // The timer counts the BLOCK time from now, in the server's microseconds, so that a
    // wait never ends early by the rounding of a millisecond deadline.
    let deadline = wait_until
        .and(req.block)
        .map(|ms| waiting::deadline_timer(ctx, id, ms));
    let w = Wait {
        id,
        mode: req.mode,
        digest: digest(&token),
        token,
        ttl: req.ttl,
        min_fence: req.min_fence,
        owner: req.owner.map(Into::into),
        client_id: ar.client_id,
        addr: ar.addr,
        moved: false,
        handle: WaiterRec { bc, deadline },
    };
    with_engine(|e| e.enqueue(&mut sched, (db, key.into()), w, serve_at));
    Ok(())
}

/// RELEASE, EXTEND and FORCERELEASE: open the key, ask the engine, reply 1 or 0.
fn yes_or_no(
    ctx: Ctx<'_>,
    name: Str<'_>,
    f: impl FnOnce(&mut LockEngine, &mut RedisKey<'_>, &mut RedisSched<'_>) -> Result<bool, LockError>,
) -> Result<(), LockError> {
    let mut ks = RedisKey::new(ctx, name, ffi::now_ms(), true);
    let mut sched = RedisSched::new(ctx);
    let done = with_engine(|e| f(e, &mut ks, &mut sched)).ok_or_else(engine_busy)??;
    ctx.reply_int(i64::from(done));
    Ok(())
}

fn release_impl(ctx: Ctx<'_>, args: Args<'_>) -> Result<(), LockError> {
    let mut buf = [&[][..]; MAX_ARGS];
    let (name, rest) = split(args, "lock.release", &mut buf)?;
    let token = args::parse_release(rest)?;
    yes_or_no(ctx, name, |e, ks, s| e.release(ks, s, token))
}

fn extend_impl(ctx: Ctx<'_>, args: Args<'_>) -> Result<(), LockError> {
    let mut buf = [&[][..]; MAX_ARGS];
    let (name, rest) = split(args, "lock.extend", &mut buf)?;
    let req = args::parse_extend(rest, &config::limits())?;
    yes_or_no(ctx, name, |e, ks, s| e.extend(ks, s, req.token, req.ttl))
}

fn forcerelease_impl(ctx: Ctx<'_>, args: Args<'_>) -> Result<(), LockError> {
    let mut buf = [&[][..]; MAX_ARGS];
    let (name, rest) = split(args, "lock.forcerelease", &mut buf)?;
    let fence = args::parse_forcerelease(rest)?;
    yes_or_no(ctx, name, |e, ks, s| e.force_release(ks, s, fence))
}

/// One holder's fields (never its token).
fn reply_holder(ctx: Ctx<'_>, h: &Holder, now: i64) {
    ctx.reply_map(7);
    ctx.reply_bytes(b"fence");
    ctx.reply_int(h.fence as i64);
    ctx.reply_bytes(b"owner");
    match h.owner() {
        Some(o) => ctx.reply_bytes(o),
        None => ctx.reply_null(),
    }
    ctx.reply_bytes(b"ttl");
    ctx.reply_int(h.expires_at.saturating_sub(now).max(0));
    ctx.reply_bytes(b"expires-at");
    ctx.reply_int(h.expires_at);
    ctx.reply_bytes(b"acquired-at");
    ctx.reply_int(h.acquired_at);
    ctx.reply_bytes(b"client-id");
    ctx.reply_int(h.client_id as i64);
    ctx.reply_bytes(b"client-addr");
    ctx.reply_bytes(h.addr().to_string().as_bytes());
}

fn info_impl(ctx: Ctx<'_>, args: Args<'_>) -> Result<(), LockError> {
    let mut buf = [&[][..]; MAX_ARGS];
    let (name, rest) = split(args, "lock.info", &mut buf)?;
    if !rest.is_empty() {
        return Err(LockError::WrongArity("lock.info"));
    }
    let now = ffi::now_ms();
    // Read-only: the key is opened for reading and nothing is removed or converted.
    let mut ks = RedisKey::new(ctx, name, now, false);
    let view = with_engine(|e| e.info(&mut ks)).ok_or_else(engine_busy)??;
    let field = |k: &[u8]| ctx.reply_bytes(k);
    match view {
        InfoView::Free => ctx.reply_null(),
        InfoView::Lock {
            mode,
            holders,
            waiters,
        } => {
            let deadline = holders.iter().map(|h| h.expires_at).max().unwrap_or(now);
            let exclusive = mode == Mode::Exclusive;
            let limit = match mode {
                Mode::Counted(n) => Some(n),
                _ => None,
            };
            let pairs = 8 + if exclusive { 5 } else { 0 } + usize::from(limit.is_some());
            ctx.reply_map(pairs);
            field(b"state");
            field(b"held");
            field(b"kind");
            field(b"module");
            field(b"mode");
            field(mode.name().as_bytes());
            field(b"ttl");
            ctx.reply_int(deadline.saturating_sub(now).max(0));
            field(b"expires-at");
            ctx.reply_int(deadline);
            if let (true, Some(h)) = (exclusive, holders.first()) {
                field(b"fence");
                ctx.reply_int(h.fence as i64);
                field(b"owner");
                match h.owner() {
                    Some(o) => ctx.reply_bytes(o),
                    None => ctx.reply_null(),
                }
                field(b"acquired-at");
                ctx.reply_int(h.acquired_at);
                field(b"client-id");
                ctx.reply_int(h.client_id as i64);
                field(b"client-addr");
                ctx.reply_bytes(h.addr().to_string().as_bytes());
            }
            if let Some(n) = limit {
                field(b"limit");
                ctx.reply_int(i64::from(n));
            }
            field(b"holders");
            ctx.reply_int(holders.len() as i64);
            field(b"waiters");
            ctx.reply_int(waiters as i64);
            field(b"holder-list");
            ctx.reply_array(holders.len());
            for h in &holders {
                reply_holder(ctx, h, now);
            }
        }
        InfoView::Classic { expiry, waiters } => {
            ctx.reply_map(10);
            field(b"state");
            field(b"held");
            field(b"kind");
            field(b"string");
            field(b"ttl");
            ctx.reply_int(expiry.map_or(-1, |at| at.saturating_sub(now).max(0)));
            field(b"expires-at");
            match expiry {
                Some(at) => ctx.reply_int(at),
                None => ctx.reply_null(),
            }
            for f in [
                &b"fence"[..],
                b"owner",
                b"acquired-at",
                b"client-id",
                b"client-addr",
            ] {
                field(f);
                ctx.reply_null();
            }
            field(b"waiters");
            ctx.reply_int(waiters as i64);
        }
    }
    Ok(())
}

fn replicated_only(ctx: Ctx<'_>, cmd: &'static str) -> Result<(), LockError> {
    if ctx.flags() & (ffi::FLAG_REPLICATED | ffi::FLAG_LOADING) == 0 {
        return Err(LockError::InternalOnly(cmd));
    }
    Ok(())
}

fn apply(ctx: Ctx<'_>, name: Str<'_>, op: Repl<'_>) -> Result<(), LockError> {
    let mut ks = RedisKey::new(ctx, name, ffi::now_ms(), true);
    with_engine(|e| e.apply(&mut ks, op)).ok_or_else(engine_busy)?
}

/// A change sent by the primary (or replayed from the AOF).
fn repl_impl(ctx: Ctx<'_>, args: Args<'_>) -> Result<(), LockError> {
    replicated_only(ctx, "lock.repl")?;
    let mut buf = [&[][..]; MAX_ARGS];
    let (name, rest) = split(args, "lock.repl", &mut buf)?;
    let ceiling = crate::datatype::loaded_fence_ceiling();
    match args::parse_repl(rest)? {
        args::ReplCmd::Grant {
            mode,
            holder,
            floor,
        } => {
            if holder.fence > ceiling || floor > ceiling {
                return Err(LockError::FenceTooFarAhead);
            }
            apply(
                ctx,
                name,
                Repl::Grant {
                    mode,
                    holder: &holder,
                    floor,
                },
            )?;
        }
        args::ReplCmd::Lease {
            fence,
            expires_at,
            floor,
        } => {
            if floor > ceiling {
                return Err(LockError::FenceTooFarAhead);
            }
            apply(
                ctx,
                name,
                Repl::Lease {
                    fence,
                    expires_at,
                    floor,
                },
            )?;
        }
        args::ReplCmd::Drop { fence } => apply(ctx, name, Repl::Drop { fence })?,
    }
    // A replica's own AOF and replicas record it as received.
    ctx.replicate_verbatim();
    ctx.reply_simple(c"OK");
    Ok(())
}

/// The 0.1 release's replication command (token in clear), still accepted from an older
/// primary and from AOF files it wrote. It is stored, and passed on, as a digest.
fn sync_impl(ctx: Ctx<'_>, args: Args<'_>) -> Result<(), LockError> {
    replicated_only(ctx, "lock.sync")?;
    let mut buf = [&[][..]; MAX_ARGS];
    let (name, rest) = split(args, "lock.sync", &mut buf)?;
    let s = args::parse_sync(rest)?;
    let ceiling = crate::datatype::loaded_fence_ceiling();
    if s.fence > ceiling || s.floor > ceiling {
        return Err(LockError::FenceTooFarAhead);
    }
    let holder = s.holder();
    let op = Repl::Grant {
        mode: Mode::Exclusive,
        holder: &holder,
        floor: s.floor,
    };
    apply(ctx, name, op)?;
    crate::replication::send(ctx, name, op);
    ctx.reply_simple(c"OK");
    Ok(())
}

/// `LOCK.DEBUG PANIC | FENCE`: proves that a panic becomes an error reply, and reads the
/// fence counter. Off unless the module is loaded with `debug-commands yes`.
fn debug_impl(ctx: Ctx<'_>, args: Args<'_>) -> Result<(), LockError> {
    if !config::DEBUG_COMMANDS.load(Ordering::Relaxed) {
        return Err(LockError::Disabled(
            "LOCK.DEBUG (load the module with 'debug-commands yes')",
        ));
    }
    let sub = args.get(1).map(|s| s.bytes().to_ascii_uppercase());
    match (sub.as_deref(), args.len()) {
        (Some(b"PANIC"), 2) => panic!("LOCK.DEBUG PANIC was called"),
        (Some(b"FENCE"), 2) => {
            let last = with_engine(|e| e.fence.last()).ok_or_else(engine_busy)?;
            ctx.reply_int(last as i64);
            Ok(())
        }
        _ => Err(LockError::Syntax("LOCK.DEBUG PANIC | FENCE".into())),
    }
}
