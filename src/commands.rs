//! The command handlers: a table of parse-and-dispatch entries. Each reads top to
//! bottom: split the arguments, parse them (`args`), redact the token from the server's
//! command logs, borrow the module state once, open the key, let the engine decide, and
//! hand its reply value back to be written (`ffi::guard::command`).

use crate::args::{
    parse_acquire, parse_check, parse_extend, parse_forcerelease, parse_info, parse_release,
    parse_watch,
};
use crate::config;
use crate::engine::{AcquireReq, Command, Outcome, Want, WatchReq};
use crate::error::LockError;
use crate::events;
use crate::ffi::{self, Args, Ctx, Handler, Str};
use crate::keyspace::RedisKey;
use crate::lock::codec::repl::{self, Change, ReplCmd};
use crate::lock::codec::Clock;
use crate::lock::value::{self, Addr, Holder, LockValue, Mode};
use crate::reply::Reply;
use crate::sched::{self, RedisSched};
use crate::state::{self, State};

/// Enough for the longest valid command (LOCK.ACQUIRE with every option).
const MAX_ARGS: usize = 24;

type Answer<'a> = Result<Option<Reply<'a>>, LockError>;

/// One command: its type (registered as `ffi::entry::<Type>`), name and handler.
macro_rules! handler {
    ($ty:ident, $name:literal, $f:path) => {
        pub struct $ty;
        impl Handler for $ty {
            const NAME: &'static str = $name;
            fn run<'a>(ctx: Ctx<'a>, args: Args<'a>) -> Answer<'a> {
                $f(ctx, args)
            }
        }
    };
}

handler!(Acquire, "lock.acquire", acquire_cmd);
handler!(Release, "lock.release", release_cmd);
handler!(Extend, "lock.extend", extend_cmd);
handler!(Info, "lock.info", info_cmd);
handler!(ForceRelease, "lock.forcerelease", forcerelease_cmd);
handler!(Repl, "lock.repl", repl_cmd);
handler!(Sync, "lock.sync", sync_cmd);
handler!(Debug, "lock.debug", debug_cmd);
handler!(Check, "lock.check", check_cmd);
handler!(Watch, "lock.watch", watch_cmd);

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

/// Where a command's token stands, to keep it out of the server's command logs when the
/// command is refused before its own redaction.
#[derive(Clone, Copy)]
pub(crate) enum Secret {
    None,
    At(usize),
    AfterTokenWord,
}

/// The key and the rest parsed by `parse`; a refused command's token is redacted.
fn parse<'a, T>(
    ctx: Ctx<'a>,
    args: Args<'a>,
    cmd: &'static str,
    secret: Secret,
    parse: impl FnOnce(&[&'a [u8]]) -> Result<T, LockError>,
) -> Result<(Str<'a>, T), LockError> {
    let mut buf = [&[][..]; MAX_ARGS];
    split(args, cmd, &mut buf)
        .and_then(|(name, rest)| Ok((name, parse(rest)?)))
        .inspect_err(|_| redact_refused(ctx, args, secret))
}

/// Runs `cmd` on the key `name` with the state borrowed once; `block`: whether the
/// command asked to wait (its client may then be blocked).
pub(crate) fn run<'a>(
    ctx: Ctx<'a>,
    name: Str<'a>,
    mut cmd: Command<'a>,
    block: bool,
) -> Answer<'a> {
    let (outcome, classic) = state::with(|st| {
        if let Command::Acquire(req) = &mut cmd {
            req.addr = st.addr(req.client_id);
        }
        if st.replica && !cmd.reads_only() && !matches!(cmd, Command::Apply { .. }) {
            return (Outcome::Reply(Reply::Error(LockError::ReadOnly)), false);
        }
        st.engine.settings.max_waiters = config::max_waiters();
        st.engine.settings.refuse_grants = config::eviction_refusal();
        let write = cmd.changes();
        let State {
            engine,
            wake,
            listening,
            unblock_allowed,
            cluster,
            ..
        } = st;
        // In a cluster, a slot this node only began to serve is confirmed with the other
        // nodes first: no grant (and no hand-off) on it until then.
        let slot_pending = match cluster {
            Some(c) if write && !matches!(cmd, Command::Apply { .. }) => {
                let slot = crate::cluster::key_slot(name.bytes());
                // The server routed the key here: a slot this node does not know it
                // serves arrived since its last look.
                if !c.serves(slot) {
                    c.refresh(ctx, engine.fence.last(), ffi::mono_us());
                }
                c.pending(slot)
            }
            _ => false,
        };
        if slot_pending && matches!(cmd, Command::Acquire(_)) {
            return (Outcome::Reply(Reply::Error(LockError::SlotArriving)), false);
        }
        let mut ks = RedisKey::command(ctx, name, write, *listening);
        ks.slot_pending = slot_pending;
        let mut sched = RedisSched {
            ctx,
            wake,
            may_block: block && sched::may_block(ctx),
            unblock_allowed: *unblock_allowed,
        };
        let out = engine.handle(cmd, &mut ks, &mut sched);
        let classic = ks.classic_waiter;
        drop(ks);
        // A MINFENCE lift reaches the other nodes at once.
        if let Some(c) = cluster {
            c.maybe_broadcast(ctx, &engine.fence, ffi::mono_us());
        }
        (out, classic)
    })
    .ok_or(LockError::Busy)?;
    if classic {
        events::need_key_events(ctx);
    }
    Ok(match outcome {
        Outcome::Reply(r) => Some(r),
        Outcome::Blocked => None,
    })
}

/// A refused command's token stays out of SLOWLOG and MONITOR too: the argument after
/// each `TOKEN` or `SESSION` word (an acquire that did not parse; an `OWNER TOKEN` label
/// costs the next argument its display), or the fixed position of the token.
pub(crate) fn redact_refused(ctx: Ctx<'_>, args: Args<'_>, secret: Secret) {
    match secret {
        Secret::None => {}
        Secret::At(pos) => {
            if pos < args.len() {
                ctx.redact(pos);
            }
        }
        Secret::AfterTokenWord => {
            for i in 2..args.len().saturating_sub(1) {
                if args.get(i).is_some_and(|a| {
                    a.bytes().eq_ignore_ascii_case(b"token")
                        || a.bytes().eq_ignore_ascii_case(b"session")
                }) {
                    ctx.redact(i + 1);
                }
            }
        }
    }
}

fn acquire_cmd<'a>(ctx: Ctx<'a>, args: Args<'a>) -> Answer<'a> {
    let (name, req) = parse(ctx, args, "lock.acquire", Secret::AfterTokenWord, |a| {
        parse_acquire(a, &config::limits())
    })?;
    for i in [req.token_at, req.session_at].into_iter().flatten() {
        ctx.redact(2 + i);
    }
    let block = req.block.is_some();
    let cmd = Command::Acquire(AcquireReq {
        mode: req.mode,
        ttl: req.ttl,
        token: req.token,
        owner: req.owner,
        block: req.block,
        min_fence: req.min_fence,
        lock_delay: req.lock_delay.unwrap_or_else(config::lock_delay),
        client_id: ctx.client_id(),
        addr: Addr::None,
        session: req.session.map(value::digest),
    });
    run(ctx, name, cmd, block)
}

fn release_cmd<'a>(ctx: Ctx<'a>, args: Args<'a>) -> Answer<'a> {
    let (name, token) = parse(ctx, args, "lock.release", Secret::At(2), parse_release)?;
    ctx.redact(2);
    run(ctx, name, Command::Release(token), false)
}

fn extend_cmd<'a>(ctx: Ctx<'a>, args: Args<'a>) -> Answer<'a> {
    let (name, req) = parse(ctx, args, "lock.extend", Secret::At(2), |a| {
        parse_extend(a, &config::limits())
    })?;
    ctx.redact(2);
    let cmd = Command::Extend {
        token: req.token,
        ttl: req.ttl,
        owner: req.owner,
    };
    run(ctx, name, cmd, false)
}

fn forcerelease_cmd<'a>(ctx: Ctx<'a>, args: Args<'a>) -> Answer<'a> {
    let (name, fence) = parse(
        ctx,
        args,
        "lock.forcerelease",
        Secret::None,
        parse_forcerelease,
    )?;
    run(ctx, name, Command::ForceRelease(fence), false)
}

fn check_cmd<'a>(ctx: Ctx<'a>, args: Args<'a>) -> Answer<'a> {
    let (name, fence) = parse(ctx, args, "lock.check", Secret::None, parse_check)?;
    run(ctx, name, Command::Check(fence), false)
}

fn watch_cmd<'a>(ctx: Ctx<'a>, args: Args<'a>) -> Answer<'a> {
    let (name, w) = parse(ctx, args, "lock.watch", Secret::None, parse_watch)?;
    let want = match w.fence {
        None => Want::Held,
        Some(fence) => Want::Gone {
            fence,
            owner: w.owner.map(Into::into),
        },
    };
    let cmd = Command::Watch(WatchReq {
        want,
        block: w.block,
    });
    run(ctx, name, cmd, true)
}

fn info_cmd<'a>(ctx: Ctx<'a>, args: Args<'a>) -> Answer<'a> {
    let (name, page) = parse(ctx, args, "lock.info", Secret::None, parse_info)?;
    run(ctx, name, Command::Info(page), false)
}

fn replicated_only(ctx: Ctx<'_>, cmd: &'static str) -> Result<(), LockError> {
    if ctx.flags() & (ffi::FLAG_REPLICATED | ffi::FLAG_LOADING) == 0 {
        return Err(LockError::InternalOnly(cmd));
    }
    Ok(())
}

/// The fence ceiling of what arrives from the primary or the AOF.
fn ceiling() -> u64 {
    let (wall, loading) = (ffi::wall_ms(), ffi::loading());
    state::with(|st| st.engine.fence.loaded_ceiling(wall, loading)).unwrap_or(0)
}

/// Applies a change from the primary or the AOF (decoded by `decode`, checked against the
/// loaded fence ceiling); its reply, and with `keep` the change as it was sent.
fn apply<'a>(
    ctx: Ctx<'a>,
    args: Args<'a>,
    cmd: &'static str,
    decode: fn(&[&[u8]], Clock) -> Result<ReplCmd, LockError>,
    keep: bool,
) -> Result<(Str<'a>, Option<Reply<'a>>, Option<ReplCmd>), LockError> {
    let (name, cmd) = parse(ctx, args, cmd, Secret::None, |a| decode(a, state::now()))?;
    let sent = keep.then(|| cmd.clone());
    let apply = Command::Apply {
        cmd,
        ceiling: ceiling(),
    };
    Ok((name, run(ctx, name, apply, false)?, sent))
}

/// A change sent by the primary (or replayed from the AOF), passed on as received.
fn repl_cmd<'a>(ctx: Ctx<'a>, args: Args<'a>) -> Answer<'a> {
    replicated_only(ctx, "lock.repl")?;
    let (_, reply, _) = apply(ctx, args, "lock.repl", repl::decode, false)?;
    if matches!(reply, Some(Reply::Ok)) {
        // A replica's own AOF and replicas record it as received.
        ctx.replicate_verbatim();
    }
    Ok(reply)
}

/// The 0.1 release's replication command (token in clear), still accepted from an older
/// primary and from AOF files it wrote. It is stored, and passed on, as a digest.
fn sync_cmd<'a>(ctx: Ctx<'a>, args: Args<'a>) -> Answer<'a> {
    // 0.1's command carries the token in clear: hidden from MONITOR and SLOWLOG whether a
    // client sent it (refused below) or a 0.1 primary did (a replica shows its master's
    // commands). Commands loaded from the AOF are logged nowhere.
    if !ffi::loading() {
        ctx.redact(2);
    }
    replicated_only(ctx, "lock.sync")?;
    let (name, reply, sent) = apply(ctx, args, "lock.sync", repl::decode_sync, true)?;
    if let (
        Some(Reply::Ok),
        Some(ReplCmd::Add {
            mode,
            holder,
            floor,
        }),
    ) = (&reply, &sent)
    {
        let listening = state::with(|st| st.listening).unwrap_or(true);
        let mut ks = RedisKey::command(ctx, name, true, listening);
        crate::engine::Keyspace::replicate(
            &mut ks,
            Change::Add {
                mode: *mode,
                holder,
                floor: *floor,
            },
        );
    }
    Ok(reply)
}

/// `LOCK.DEBUG PANIC | FENCE | INJECT key kind`: proves that a panic becomes an error
/// reply, reads the fence counter, and stores a value the validity rule would refuse
/// (for the tests of the loader's repair). Registered only when the module is loaded with
/// `debug-commands yes`.
fn debug_cmd<'a>(ctx: Ctx<'a>, args: Args<'a>) -> Answer<'a> {
    let sub = args.get(1).map(|s| s.bytes().to_ascii_uppercase());
    match (sub.as_deref(), args.len()) {
        (Some(b"PANIC"), 2) => panic!("LOCK.DEBUG PANIC was called"),
        (Some(b"FENCE"), 2) => {
            let last = state::with(|st| st.engine.fence.last()).ok_or(LockError::Busy)?;
            Ok(Some(Reply::Int(last as i64)))
        }
        (Some(b"INJECT"), 4) => {
            let (Some(key), Some(kind)) = (args.get(2), args.get(3)) else {
                return Err(LockError::WrongArity("lock.debug"));
            };
            let v = injected(kind.bytes()).ok_or_else(|| {
                LockError::Syntax("INJECT kind: dup-digest | dup-fence | exclusive-many | fence-zero | too-many | empty-owner".into())
            })?;
            let mut k = ctx.open_key(key, true, &state::LOCK_TYPE);
            state::ours(|| k.delete());
            if !k.put(Box::new(v)) {
                return Err(LockError::StoreFailed);
            }
            state::count_created();
            Ok(Some(Reply::Ok))
        }
        _ => Err(LockError::Syntax(
            "LOCK.DEBUG PANIC | FENCE | INJECT key kind".into(),
        )),
    }
}

/// A value of the given broken kind, made without the validity rule.
fn injected(kind: &[u8]) -> Option<LockValue> {
    let deadline = state::now().after_ms(60_000);
    let wall = ffi::wall_ms();
    let fence = (wall as u64) << 10;
    let h = |token: &[u8], f: u64, owner: Option<&[u8]>| {
        Holder::new(
            value::digest(token),
            f,
            deadline,
            wall,
            0,
            Addr::None,
            owner.map(Into::into),
        )
    };
    let (mode, holders) = match kind {
        b"dup-digest" => (
            Mode::Shared,
            vec![
                h(b"same-token", fence, None),
                h(b"same-token", fence + 1, None),
            ],
        ),
        b"dup-fence" => (
            Mode::Shared,
            vec![h(b"token-one", fence, None), h(b"token-two", fence, None)],
        ),
        b"exclusive-many" => (
            Mode::Exclusive,
            vec![
                h(b"token-one", fence, None),
                h(b"token-two", fence + 1, None),
            ],
        ),
        b"fence-zero" => (Mode::Shared, vec![h(b"token-one", 0, None)]),
        b"too-many" => (
            Mode::Counted(2),
            vec![
                h(b"token-one", fence, None),
                h(b"token-two", fence + 1, None),
                h(b"token-three", fence + 2, None),
            ],
        ),
        b"empty-owner" => (
            Mode::Shared,
            vec![
                h(b"token-one", fence, Some(b"")),
                h(b"token-two", fence + 1, None),
            ],
        ),
        _ => return None,
    };
    Some(LockValue::unchecked(mode, holders))
}
