//! `LOCK.ACQUIREALL`, `LOCK.RELEASEALL` and `LOCK.EXTENDALL`: several keys in one command
//! (all in one hash slot in a cluster: the server refuses others with CROSSSLOT, from the
//! key spec). The engine decides the acquire whole (src/engine/multi.rs); a release or an
//! extend of the set is one per key.

use crate::args::parse_acquire;
use crate::commands::{self, redact_refused, Secret};
use crate::config;
use crate::engine::{AcquireAllReq, Command, Store, MAX_KEYS};
use crate::error::LockError;
use crate::ffi::{self, Args, Ctx, Handler, Str};
use crate::keyspace::RedisKey;
use crate::lock::codec::Clock;
use crate::lock::value::{self, Mode, MAX_LIMIT};
use crate::reply::Reply;
use crate::sched::{self, RedisSched};
use crate::state::{self, State};
use crate::syntax::parse_i64;

use std::ffi::c_int;

use redis_module::raw;

type Answer<'a> = Result<Option<Reply<'a>>, LockError>;

/// The keys of the set (`numkeys` from argument 1), for COMMAND GETKEYS, cluster routing
/// and ACL key checks: Redis 7.0 routes a module command only by its legacy key range or
/// this callback, not by a key spec that counts its keys.
fn report_keys(ctx: Ctx<'_>, args: Args<'_>, flags: u32) {
    const RW: u32 = raw::REDISMODULE_CMD_KEY_RW | raw::REDISMODULE_CMD_KEY_ACCESS;
    let n = args
        .get(1)
        .and_then(|a| parse_i64(a.bytes()))
        .and_then(|n| usize::try_from(n).ok())
        .unwrap_or(0)
        .min(MAX_KEYS);
    for pos in (2..2 + n).take_while(|p| *p < args.len()) {
        ffi::call::key_at(ctx, pos, (RW | flags) as c_int);
    }
}

pub struct AcquireAll;
impl Handler for AcquireAll {
    const NAME: &'static str = "lock.acquireall";
    const GETKEYS: bool = true;
    fn run<'a>(ctx: Ctx<'a>, args: Args<'a>) -> Answer<'a> {
        let r = acquire_all(ctx, args);
        if r.is_err() {
            redact_refused(ctx, args, Secret::AfterTokenWord);
        }
        r
    }
    fn keys(ctx: Ctx<'_>, args: Args<'_>) {
        report_keys(ctx, args, raw::REDISMODULE_CMD_KEY_INSERT);
    }
}

pub struct ReleaseAll;
impl Handler for ReleaseAll {
    const NAME: &'static str = "lock.releaseall";
    const GETKEYS: bool = true;
    fn run<'a>(ctx: Ctx<'a>, args: Args<'a>) -> Answer<'a> {
        each(ctx, args, "lock.releaseall", |token, rest| {
            if !rest.is_empty() {
                return Err(LockError::WrongArity("lock.releaseall"));
            }
            Ok(Command::Release(token))
        })
    }
    fn keys(ctx: Ctx<'_>, args: Args<'_>) {
        report_keys(ctx, args, raw::REDISMODULE_CMD_KEY_DELETE);
    }
}

pub struct ExtendAll;
impl Handler for ExtendAll {
    const NAME: &'static str = "lock.extendall";
    const GETKEYS: bool = true;
    fn run<'a>(ctx: Ctx<'a>, args: Args<'a>) -> Answer<'a> {
        each(ctx, args, "lock.extendall", |token, rest| {
            let req = crate::args::parse_extend(&[&[token][..], rest].concat(), &config::limits())?;
            Ok(Command::Extend {
                token: req.token,
                ttl: req.ttl,
                owner: req.owner,
            })
        })
    }
    fn keys(ctx: Ctx<'_>, args: Args<'_>) {
        report_keys(ctx, args, raw::REDISMODULE_CMD_KEY_UPDATE);
    }
}

/// `numkeys` (argument 1): from 1 to [`MAX_KEYS`], and no more than the arguments hold.
fn numkeys(args: Args<'_>, cmd: &'static str, per_key: usize) -> Result<usize, LockError> {
    let n = args
        .get(1)
        .and_then(|a| parse_i64(a.bytes()))
        .and_then(|n| usize::try_from(n).ok())
        .filter(|n| (1..=MAX_KEYS).contains(n))
        .ok_or_else(|| LockError::Syntax(format!("numkeys must be from 1 to {MAX_KEYS}")))?;
    if args.len() < 2 + n * per_key {
        return Err(LockError::WrongArity(cmd));
    }
    Ok(n)
}

/// `EXCLUSIVE`, `SHARED` or `LIMIT=n`.
fn mode_of(v: &[u8]) -> Result<Mode, LockError> {
    let up = v.to_ascii_uppercase();
    match up.as_slice() {
        b"EXCLUSIVE" => Ok(Mode::Exclusive),
        b"SHARED" => Ok(Mode::Shared),
        _ => {
            let n = up.strip_prefix(b"LIMIT=").ok_or_else(|| {
                LockError::Syntax(format!(
                    "a key's mode is EXCLUSIVE, SHARED or LIMIT=n, not '{}'",
                    crate::syntax::show(v)
                ))
            })?;
            parse_i64(n)
                .and_then(|n| u32::try_from(n).ok())
                .filter(|n| (1..=MAX_LIMIT).contains(n))
                .map(Mode::Counted)
                .ok_or(LockError::InvalidLimit(MAX_LIMIT))
        }
    }
}

/// The command's own keys, opened as a command opens its key.
struct CommandKeys<'a> {
    ctx: Ctx<'a>,
    names: Vec<Str<'a>>,
    listening: bool,
}

impl Store for CommandKeys<'_> {
    type Key<'k>
        = RedisKey<'k>
    where
        Self: 'k;

    fn open(&mut self, _db: i32, name: &[u8]) -> Option<Self::Key<'_>> {
        let s = *self.names.iter().find(|s| s.bytes() == name)?;
        Some(RedisKey::command(self.ctx, s, true, self.listening))
    }

    fn clock(&self) -> Clock {
        state::now()
    }

    fn replicate_session(&mut self, _c: &crate::lock::codec::repl::SessionChange<'_>) {}
}

fn acquire_all<'a>(ctx: Ctx<'a>, args: Args<'a>) -> Answer<'a> {
    const CMD: &str = "lock.acquireall";
    let n = numkeys(args, CMD, 1)?;
    let names: Vec<Str<'a>> = (0..n).filter_map(|i| args.get(2 + i)).collect();
    let mut keys: Vec<(&'a [u8], Mode)> =
        names.iter().map(|k| (k.bytes(), Mode::Exclusive)).collect();
    // MODES m1 .. mn: each key's mode, in order (default: all EXCLUSIVE).
    let mut next = 2 + n;
    if args
        .get(next)
        .is_some_and(|a| a.bytes().eq_ignore_ascii_case(b"MODES"))
    {
        for (i, k) in keys.iter_mut().enumerate() {
            let m = args
                .get(next + 1 + i)
                .ok_or_else(|| LockError::Syntax(format!("MODES takes {n} modes, one per key")))?;
            k.1 = mode_of(m.bytes())?;
        }
        next += 1 + n;
    }
    let mut buf = [&[][..]; 24];
    let rest = args
        .bytes_from(next, &mut buf)
        .ok_or_else(|| LockError::Syntax("too many arguments".into()))?;
    let opts = parse_acquire(rest, &config::limits())?;
    if opts.mode != Mode::Exclusive {
        return Err(LockError::Syntax(
            "LOCK.ACQUIREALL takes each key's mode beside it (EXCLUSIVE, SHARED or LIMIT=n), not SHARED or LIMIT options".into(),
        ));
    }
    for i in [opts.token_at, opts.session_at].into_iter().flatten() {
        ctx.redact(next + i);
    }
    let block = opts.block.is_some();
    let client_id = ctx.client_id();
    let out = state::with(|st| {
        if st.replica {
            return Err(LockError::ReadOnly);
        }
        st.engine.settings.max_waiters = config::max_waiters();
        st.engine.settings.refuse_grants = config::eviction_refusal();
        let addr = st.addr(client_id);
        let State {
            engine,
            wake,
            listening,
            unblock_allowed,
            cluster,
            ..
        } = st;
        if let Some(c) = cluster {
            // One slot for every key (the server checked): confirmed, or TRYAGAIN.
            let slot = crate::cluster::key_slot(keys[0].0);
            if !c.serves(slot) {
                c.refresh(ctx, engine.fence.last(), ffi::mono_us());
            }
            if c.pending(slot) {
                return Err(LockError::SlotArriving);
            }
        }
        let mut store = CommandKeys {
            ctx,
            names,
            listening: *listening,
        };
        let mut sched = RedisSched {
            ctx,
            wake,
            may_block: block && sched::may_block(ctx),
            unblock_allowed: *unblock_allowed,
        };
        let req = AcquireAllReq {
            keys,
            db: ctx.db(),
            ttl: opts.ttl,
            token: opts.token,
            owner: opts.owner,
            block: opts.block,
            min_fence: opts.min_fence,
            lock_delay: opts.lock_delay.unwrap_or_else(config::lock_delay),
            client_id,
            addr,
            session: opts.session.map(value::digest),
        };
        let r = engine.acquire_all(&mut store, &mut sched, req);
        // A MINFENCE lift reaches the other nodes at once.
        if let Some(c) = cluster {
            c.maybe_broadcast(ctx, &engine.fence, ffi::mono_us());
        }
        if let Some(at) = engine.next_due() {
            sched.wake.arm(ctx, at);
        }
        r
    })
    .ok_or(LockError::Busy)??;
    Ok(out)
}

/// A release or an extend of every key of the set: the number that held.
fn each<'a>(
    ctx: Ctx<'a>,
    args: Args<'a>,
    cmd: &'static str,
    make: impl Fn(&'a [u8], &[&'a [u8]]) -> Result<Command<'a>, LockError>,
) -> Answer<'a> {
    let n = match numkeys(args, cmd, 1) {
        Ok(n) => n,
        Err(e) => {
            // The token's place is unknown: every argument after the first two may be it.
            for i in 2..args.len() {
                ctx.redact(i);
            }
            return Err(e);
        }
    };
    let at = 2 + n;
    let Some(token) = args.get(at) else {
        return Err(LockError::WrongArity(cmd));
    };
    // Read before it is redacted (the slice stays valid; the argument reads
    // `(redacted)` afterwards on Valkey 8.1), and redacted before anything can refuse
    // the command.
    let token = token.bytes();
    ctx.redact(at);
    let mut buf = [&[][..]; 8];
    let rest: Vec<&[u8]> = args
        .bytes_from(at + 1, &mut buf)
        .ok_or_else(|| LockError::Syntax("too many arguments".into()))?
        .to_vec();
    let mut held = 0;
    let mut first_err = None;
    for i in 0..n {
        let Some(key) = args.get(2 + i) else {
            continue;
        };
        let r = make(token, &rest).and_then(|c| commands::run(ctx, key, c, false));
        match r {
            Ok(Some(Reply::Int(1))) => held += 1,
            Ok(Some(Reply::Error(e))) | Err(e) => {
                first_err.get_or_insert(e);
            }
            _ => {}
        }
    }
    match first_err {
        Some(e) => Err(e),
        None => Ok(Some(Reply::Int(held))),
    }
}
