//! LOCK.IFHELD and LOCK.IFFENCE: a command of the server run only if a token (or a
//! fence) holds a lock now, in the same atomic step, and answered as it answers.
//!
//! The wrapped command runs through `RedisModule_Call` as the caller would run it: its
//! ACL user (commands and keys), its protocol, refused over `maxmemory` if it is a
//! deny-oom command, refused if a script could not run it; it is replicated and written
//! to the AOF as it ran (the guard itself never is, so no token travels). The checks
//! before it runs:
//!
//! - it exists, does not block (BLPOP, XREAD, ...) and is not one scripts may not run
//!   (MULTI/EXEC, EVAL, FCALL, WATCH, ...);
//! - it names at least one key (a guard protects writes to data) and never the lock key
//!   itself (the lock changes through its own commands);
//! - in a cluster, its keys share the lock key's slot (the server checks this too, from
//!   the keys the guard reports for routing);
//! - the token (fence) holds the lock now; else NOTHELD and nothing runs.

use std::ffi::c_int;

use redis_module::raw;

use crate::commands;
use crate::engine::Command;
use crate::error::LockError;
use crate::ffi::call::{self, Flags, Keys, Refused};
use crate::ffi::{self, Args, Ctx, Handler, Str};
use crate::reply::Reply;
use crate::state;
use crate::syntax::{positive, show};

/// Where the wrapped command starts among the arguments.
const INNER: usize = 3;
/// The most guards one command line may nest (a guard wrapping a guard on another lock,
/// and so on, the first included): each level is a call into the server and, for keys
/// requests, a recursion through its key extraction, so a chain thousands deep would
/// overflow the server's stack.
const MAX_NESTED: usize = 8;
/// Cached command names up to this length, this many at most.
const CACHE_NAME: usize = 64;
const CACHE_SIZE: usize = 1024;

const fn name_of(by_fence: bool) -> &'static str {
    if by_fence {
        "lock.iffence"
    } else {
        "lock.ifheld"
    }
}

/// LOCK.IFHELD key token command [arg ...]
pub type IfHeld = Guarded<false>;
/// LOCK.IFFENCE key fence command [arg ...]
pub type IfFence = Guarded<true>;

/// The two guarded commands: `BY_FENCE` says whether the lock is proven by a fence
/// (LOCK.IFFENCE) or by a token (LOCK.IFHELD).
pub struct Guarded<const BY_FENCE: bool>;
impl<const BY_FENCE: bool> Handler for Guarded<BY_FENCE> {
    const NAME: &'static str = name_of(BY_FENCE);
    const GETKEYS: bool = true;
    fn run<'a>(ctx: Ctx<'a>, args: Args<'a>) -> Result<Option<Reply<'a>>, LockError> {
        run(ctx, args, BY_FENCE)
    }
    fn keys(ctx: Ctx<'_>, args: Args<'_>) {
        keys(ctx, args);
    }
}

/// Redacts secrets from what the server shows of the running command (SLOWLOG, MONITOR)
/// when dropped: after the guard read its arguments for the last time (on Valkey 8.1 a
/// redacted argument reads `(redacted)` from then on), and on every way out of it, a
/// caught panic included.
struct Redact<'a> {
    ctx: Ctx<'a>,
    at: Vec<usize>,
}

impl Drop for Redact<'_> {
    fn drop(&mut self) {
        for &pos in &self.at {
            self.ctx.redact(pos);
        }
    }
}

/// The positions of the secrets in the command line the guard wraps (from `at` on): the
/// tokens of the lock commands, of nested guards included, and the passwords of AUTH,
/// HELLO and MIGRATE. The wrapped command hides them from its own entry when it runs; the
/// guard's entry shows its whole line, refused or not, so it hides them as well. (An
/// argument that only looks like an option name costs the next one its display.)
fn secrets(args: Args<'_>, mut at: usize, out: &mut Vec<usize>) {
    let after = |word: &[u8], n: usize, from: usize, out: &mut Vec<usize>| {
        for i in from + 1..args.len() {
            if args
                .get(i)
                .is_some_and(|s| s.bytes().eq_ignore_ascii_case(word))
            {
                out.extend(i + 1..(i + 1 + n).min(args.len()));
            }
        }
    };
    while let Some(name) = args.get(at) {
        let name = name.bytes().to_ascii_lowercase();
        match name.as_slice() {
            b"lock.ifheld" => {
                out.push(at + 2);
                at += INNER;
                continue;
            }
            b"lock.iffence" => {
                at += INNER;
                continue;
            }
            b"lock.release" | b"lock.extend" | b"lock.sync" => out.push(at + 2),
            b"lock.acquire" => after(b"token", 1, at, out),
            b"auth" => out.extend(at + 1..args.len()),
            b"hello" => after(b"auth", 2, at, out),
            b"migrate" => {
                after(b"auth", 1, at, out);
                after(b"auth2", 2, at, out);
            }
            _ => {}
        }
        return;
    }
}

/// Runs the guard; `by_fence`: LOCK.IFFENCE.
fn run<'a>(ctx: Ctx<'a>, args: Args<'a>, by_fence: bool) -> Result<Option<Reply<'a>>, LockError> {
    let mut redact = Redact {
        ctx,
        at: Vec::new(),
    };
    if !by_fence {
        redact.at.push(2);
    }
    secrets(args, INNER, &mut redact.at);
    let cmd = name_of(by_fence);
    let (Some(key), Some(cred), Some(_)) = (args.get(1), args.get(2), args.get(INNER)) else {
        return Err(LockError::WrongArity(cmd));
    };
    // The token's own copy: the check must not read the argument the server redacts.
    let token = cred.bytes().to_vec();
    let check = if by_fence {
        Command::HoldsFence(positive(
            &token,
            crate::lock::fence::MAX_FENCE,
            LockError::InvalidFenceArg,
        )?)
    } else {
        Command::Holds(&token)
    };
    wrapped_ok(ctx, args, key, &cmd.to_ascii_uppercase())?;
    match commands::run(ctx, key, check, false)? {
        Some(Reply::Int(1)) => {}
        Some(Reply::Error(e)) => return Err(e),
        _ => return Err(LockError::NotHeld { fence: by_fence }),
    }
    match call::run(ctx, args, INNER) {
        Ok(reply) => {
            reply.send(ctx);
            Ok(None)
        }
        Err(Refused::Acl) => Err(LockError::NoPerm),
        Err(Refused::Failed) => Err(LockError::Internal(cmd)),
    }
}

/// The keys a guard touches, for COMMAND GETKEYS, cluster routing and ACL key checks:
/// the lock key (read), then the wrapped command's keys with its own flags.
fn keys(ctx: Ctx<'_>, args: Args<'_>) {
    const LOCK_KEY: c_int =
        (raw::REDISMODULE_CMD_KEY_RO | raw::REDISMODULE_CMD_KEY_ACCESS) as c_int;
    if args.len() < 2 {
        return;
    }
    call::key_at(ctx, 1, LOCK_KEY);
    // A chain of guards too deep to run is not followed either (each level would recurse
    // through the server's key extraction).
    if args.len() <= INNER || too_deep(args) {
        return;
    }
    if let Keys::At(list) = call::command_keys(ctx, args, INNER) {
        for (pos, flags) in list {
            call::key_at(ctx, INNER + pos, flags);
        }
    }
}

/// What the server knows of the command named `name` (cached by name).
fn flags_of(ctx: Ctx<'_>, name: &[u8]) -> Option<Flags> {
    let lower = name.to_ascii_lowercase();
    if let Some(Some(f)) = state::with(|st| st.command_flags.get(&lower).copied()) {
        return Some(f);
    }
    let f = call::command_flags(ctx, name)?;
    if lower.len() <= CACHE_NAME {
        state::with(|st| {
            if st.command_flags.len() >= CACHE_SIZE {
                st.command_flags.clear();
            }
            st.command_flags.insert(lower, f);
        });
    }
    Some(f)
}

fn refuse(msg: String) -> LockError {
    LockError::NotGuardable(msg)
}

fn is_guard(name: &[u8]) -> bool {
    name.eq_ignore_ascii_case(b"lock.ifheld") || name.eq_ignore_ascii_case(b"lock.iffence")
}

/// Whether the guards of this command line (it and the guards it wraps) nest deeper than
/// [`MAX_NESTED`]. Counts without recursion and stops at the first level too many.
fn too_deep(args: Args<'_>) -> bool {
    let mut depth = 1;
    let mut at = INNER;
    while args.get(at).is_some_and(|s| is_guard(s.bytes())) {
        depth += 1;
        if depth > MAX_NESTED {
            return true;
        }
        at += INNER;
    }
    false
}

/// Whether the wrapped command may run inside the guard of `key`.
fn wrapped_ok(ctx: Ctx<'_>, args: Args<'_>, key: Str<'_>, cmd: &str) -> Result<(), LockError> {
    if too_deep(args) {
        return Err(refuse(format!(
            "{cmd} nests at most {MAX_NESTED} guards (LOCK.IFHELD, LOCK.IFFENCE) in one command"
        )));
    }
    let inner = args.get(INNER).map(|s| s.bytes()).unwrap_or_default();
    let shown = show(inner);
    let unknown = || {
        refuse(format!(
            "unknown command '{shown}' (the command {cmd} would run)"
        ))
    };
    let flags = flags_of(ctx, inner).ok_or_else(unknown)?;
    if flags.blocking {
        return Err(refuse(format!(
            "{cmd} cannot run '{shown}': it may block (use the non-blocking form)"
        )));
    }
    if flags.noscript {
        return Err(refuse(format!(
            "{cmd} cannot run '{shown}': transactions, scripts, functions and other \
             commands a script may not run are refused"
        )));
    }
    let list = match call::command_keys(ctx, args, INNER) {
        Keys::Unknown => return Err(unknown()),
        Keys::Arity => {
            return Err(refuse(format!(
                "wrong number of arguments for '{shown}' command (the command {cmd} would run)"
            )))
        }
        Keys::At(list) => list,
    };
    if list.is_empty() {
        return Err(refuse(format!(
            "{cmd} guards data: '{shown}' must name at least one key"
        )));
    }
    let lock = key.bytes();
    let cluster = ctx.flags() & ffi::FLAG_CLUSTER != 0;
    let slot = crate::cluster::key_slot(lock);
    for (pos, _) in list {
        let k = args.get(INNER + pos).map(|s| s.bytes()).unwrap_or_default();
        if k == lock {
            return Err(refuse(format!(
                "{cmd} cannot run a command on the lock key itself (use the LOCK.* commands)"
            )));
        }
        if cluster && crate::cluster::key_slot(k) != slot {
            return Err(LockError::CrossSlot);
        }
    }
    Ok(())
}
