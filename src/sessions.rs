//! `LOCK.SESSION OPEN | KEEPALIVE | CLOSE | INFO` and its replication command
//! `LOCK.SREPL`. A session has no key of its own: its locks are in the keys they lock, and
//! the engine's session table says which (src/engine/sessions.rs). The command opens
//! those keys itself, as a timer would (through the gate: nothing is written while writes
//! are paused), and puts the client's selected db back after.

use crate::config;
use crate::engine::OpenReq;
use crate::error::LockError;
use crate::ffi::{self, Args, Ctx, Handler};
use crate::lock::codec::repl;
use crate::lock::value::digest;
use crate::reply::Reply;
use crate::sched;
use crate::state;
use crate::syntax::{options, parse_i64};

pub struct Session;
impl Handler for Session {
    const NAME: &'static str = "lock.session";
    fn run<'a>(ctx: Ctx<'a>, args: Args<'a>) -> Result<Option<Reply<'a>>, LockError> {
        let r = session_cmd(ctx, args).map(Some);
        // The session id is a secret: out of SLOWLOG and MONITOR, answered or refused.
        // (After the last read of it: on Valkey 8.1 a redacted argument reads
        // `(redacted)` from then on.)
        if args.len() > 2 {
            ctx.redact(2);
        }
        r
    }
}

pub struct SessionRepl;
impl Handler for SessionRepl {
    const NAME: &'static str = "lock.srepl";
    fn run<'a>(ctx: Ctx<'a>, args: Args<'a>) -> Result<Option<Reply<'a>>, LockError> {
        srepl_cmd(ctx, args).map(Some)
    }
}

/// Locks `LOCK.SESSION INFO` lists when COUNT is not given, and the most it lists.
const INFO_COUNT: usize = 100;
const INFO_MAX_COUNT: usize = 10_000;

enum Sub {
    Open { ttl: u64, bind: Option<u64> },
    Keepalive(Option<u64>),
    Close,
    Info(usize),
}

fn usage() -> LockError {
    LockError::Syntax("LOCK.SESSION OPEN | KEEPALIVE | CLOSE | INFO id [options]".into())
}

fn ttl_of(name: &str, v: &[u8], max_ttl: u64) -> Result<u64, LockError> {
    let unit = if name == "EX" { 1000 } else { 1 };
    let n = parse_i64(v).ok_or(LockError::NotInteger)?;
    n.checked_mul(unit)
        .and_then(|ms| u64::try_from(ms).ok())
        .filter(|ms| (1..=max_ttl).contains(ms))
        .ok_or(LockError::InvalidExpire("lock.session"))
}

/// `OPEN id [PX ms | EX s] [BIND grace-ms] [OWNER label]`, `KEEPALIVE id [PX ms | EX s]`,
/// `CLOSE id`, `INFO id [COUNT n]`: the subcommand, the id and the owner label.
/// A parsed `LOCK.SESSION`: the subcommand, the id and the owner label.
type Parsed<'a> = (Sub, &'a [u8], Option<&'a [u8]>);

fn parse<'a>(args: &[&'a [u8]]) -> Result<Parsed<'a>, LockError> {
    let [sub, id, rest @ ..] = args else {
        return Err(LockError::WrongArity("lock.session"));
    };
    let lim = config::limits();
    if id.len() < lim.min_token_len || id.len() > crate::lock::value::MAX_TOKEN_LEN {
        return Err(LockError::BadLength {
            what: "session id",
            min: lim.min_token_len,
            max: crate::lock::value::MAX_TOKEN_LEN,
        });
    }
    let sub = sub.to_ascii_uppercase();
    let (mut ttl, mut bind, mut count) = (None, None, INFO_COUNT);
    let mut owner: Option<&'a [u8]> = None;
    let allowed: &[&str] = match sub.as_slice() {
        b"OPEN" => &["PX", "EX", "BIND", "OWNER"],
        b"KEEPALIVE" => &["PX", "EX"],
        b"CLOSE" => &[],
        b"INFO" => &["COUNT"],
        _ => return Err(usage()),
    };
    options(rest, allowed, &[], |name, v| {
        match name {
            "PX" | "EX" => {
                if ttl.is_some() {
                    return Err(LockError::Syntax("PX and EX exclude each other".into()));
                }
                ttl = Some(ttl_of(name, v, lim.max_ttl)?);
            }
            "BIND" => {
                let n = parse_i64(v).ok_or(LockError::NotInteger)?;
                bind = Some(
                    u64::try_from(n)
                        .ok()
                        .filter(|g| *g <= lim.max_ttl)
                        .ok_or_else(|| {
                            LockError::Syntax(
                                "BIND takes a grace period from 0 to lock.max-ttl ms".into(),
                            )
                        })?,
                );
            }
            "OWNER" => {
                if v.is_empty() || v.len() > crate::lock::value::MAX_OWNER_LEN {
                    return Err(LockError::BadLength {
                        what: "OWNER",
                        min: 1,
                        max: crate::lock::value::MAX_OWNER_LEN,
                    });
                }
                owner = Some(v);
            }
            _ => {
                count = parse_i64(v)
                    .and_then(|n| usize::try_from(n).ok())
                    .filter(|n| (1..=INFO_MAX_COUNT).contains(n))
                    .ok_or(LockError::InvalidCount("COUNT", INFO_MAX_COUNT))?;
            }
        }
        Ok(())
    })?;
    let sub = match sub.as_slice() {
        b"OPEN" => Sub::Open {
            ttl: match ttl {
                Some(t) => t,
                None => lim.default_ttl,
            },
            bind,
        },
        b"KEEPALIVE" => Sub::Keepalive(ttl),
        b"CLOSE" => Sub::Close,
        _ => Sub::Info(count),
    };
    Ok((sub, id, owner))
}

fn session_cmd<'a>(ctx: Ctx<'a>, args: Args<'a>) -> Result<Reply<'a>, LockError> {
    let mut buf = [&[][..]; 12];
    let argv = args
        .bytes_from(1, &mut buf)
        .ok_or_else(|| LockError::Syntax("too many arguments".into()))?;
    let (sub, id, owner) = parse(argv)?;
    let d = digest(id);
    let client = ctx.client_id();
    let db = ctx.db();
    let reply = state::with(|st| {
        if st.replica && !matches!(sub, Sub::Info(_)) {
            return Err(LockError::ReadOnly);
        }
        // A script's or another module's call has a client that never disconnects.
        let caller = st.is_connection(client).then_some(client);
        if matches!(sub, Sub::Open { bind: Some(_), .. }) && caller.is_none() {
            // A script's or another module's call has a client that never disconnects:
            // the binding would never end the session.
            return Err(LockError::Syntax(
                "BIND binds the session to the calling connection: a script or a module's call has none".into(),
            ));
        }
        Ok(sched::on_keys(ctx, st, Some(true), |engine, store, sched| match sub {
            Sub::Open { ttl, bind } => {
                let req = OpenReq {
                    digest: d,
                    ttl,
                    bind: bind.map(|g| (client, g)),
                    owner,
                };
                Reply::bool(engine.session_open(store, sched, req))
            }
            Sub::Keepalive(ttl) => Reply::bool(engine.session_keepalive(store, &d, ttl, caller)),
            Sub::Close => match engine.session_close(store, sched, &d) {
                Some(n) => Reply::Int(i64::try_from(n).unwrap_or(i64::MAX)),
                None => Reply::Nil,
            },
            Sub::Info(count) => engine.session_info(store, &d, count),
        }))
    })
    .ok_or(LockError::Busy)?;
    ctx.select_db(db);
    reply
}

/// A session change sent by the primary (or replayed from the AOF), passed on as
/// received.
fn srepl_cmd<'a>(ctx: Ctx<'a>, args: Args<'a>) -> Result<Reply<'a>, LockError> {
    if ctx.flags() & (ffi::FLAG_REPLICATED | ffi::FLAG_LOADING) == 0 {
        return Err(LockError::InternalOnly("lock.srepl"));
    }
    let mut buf = [&[][..]; 8];
    let argv = args
        .bytes_from(1, &mut buf)
        .ok_or_else(|| LockError::Syntax("malformed LOCK.SREPL".into()))?;
    let change = repl::decode_session(argv, state::now())?;
    let db = ctx.db();
    // What a replica (or the AOF replay) applies is passed on as received, not rebuilt:
    // its own replicas and AOF get this command.
    state::with(|st| {
        sched::on_keys(ctx, st, None, |engine, store, sched| {
            engine.session_apply(store, sched, change)
        })
    })
    .ok_or(LockError::Busy)?;
    ctx.select_db(db);
    ctx.replicate_verbatim();
    Ok(Reply::Ok)
}
