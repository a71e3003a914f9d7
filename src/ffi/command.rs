//! A command's entry point and its borrowed arguments: the one place where the raw
//! `(ctx, argv, argc)` the server passes becomes a [`Ctx`] and [`Args`].

use std::ffi::c_int;
use std::slice;

use redis_module::raw;

use super::{guard, Ctx, Str};
use crate::error::LockError;
use crate::reply::Reply;

/// A command of the module: its name and what it does with its arguments.
pub trait Handler {
    const NAME: &'static str;
    /// Registered with `getkeys-api`: the server may call it only to learn where its keys
    /// are ([`Handler::keys`]).
    const GETKEYS: bool = false;
    /// Answers with a reply value (None: answered already, or the client was blocked and
    /// is answered later).
    fn run<'a>(ctx: Ctx<'a>, args: Args<'a>) -> Result<Option<Reply<'a>>, LockError>;
    /// Reports the command's keys (`super::call::key_at`) for a keys request.
    fn keys(_ctx: Ctx<'_>, _args: Args<'_>) {}
}

/// The server's entry point of command `H`: errors and panics become error replies.
pub extern "C" fn entry<H: Handler>(
    ctx: *mut raw::RedisModuleCtx,
    argv: *mut *mut raw::RedisModuleString,
    argc: c_int,
) -> c_int {
    // SAFETY: the server calls a command handler with its context and `argc` live
    // argument strings, valid until the handler returns.
    let (ctx, args) = unsafe { command_args(ctx, argv, argc) };
    if H::GETKEYS && super::call::is_keys_request(ctx) {
        guard::catch(|| H::keys(ctx, args));
        return super::OK;
    }
    guard::command(ctx, H::NAME, || H::run(ctx, args))
}

/// The arguments of a command, borrowed from the server for the handler's duration.
#[derive(Clone, Copy)]
pub struct Args<'a> {
    raw: &'a [*mut raw::RedisModuleString],
}

impl<'a> Args<'a> {
    pub fn len(self) -> usize {
        self.raw.len()
    }

    /// The raw argument strings from `from` on (for calls that pass them to the server).
    pub(super) fn raw_from(self, from: usize) -> &'a [*mut raw::RedisModuleString] {
        self.raw.get(from..).unwrap_or(&[])
    }

    pub fn get(self, i: usize) -> Option<Str<'a>> {
        // SAFETY: every pointer is a live argument string for 'a (see `command_args`).
        self.raw.get(i).map(|&p| unsafe { Str::from_raw(p) })
    }

    /// The arguments from `from` on, as byte slices in `buf` (no allocation); None when
    /// there are more than `buf` holds.
    pub fn bytes_from<'b, const N: usize>(
        self,
        from: usize,
        buf: &'b mut [&'a [u8]; N],
    ) -> Option<&'b [&'a [u8]]> {
        let rest = self.raw.get(from..).unwrap_or(&[]);
        let out = buf.get_mut(..rest.len())?;
        for (slot, &p) in out.iter_mut().zip(rest) {
            // SAFETY: every pointer is a live argument string for 'a (see `command_args`).
            *slot = unsafe { Str::from_raw(p) }.bytes();
        }
        Some(out)
    }
}

/// # Safety
/// `ctx`, `argv` and `argc` as the server passes them to a command handler, all valid
/// until the handler returns (`'a`).
unsafe fn command_args<'a>(
    ctx: *mut raw::RedisModuleCtx,
    argv: *mut *mut raw::RedisModuleString,
    argc: c_int,
) -> (Ctx<'a>, Args<'a>) {
    let n = usize::try_from(argc).unwrap_or(0);
    let raw = if argv.is_null() || n == 0 {
        &[][..]
    } else {
        // SAFETY: `argc` live pointers (caller's contract).
        unsafe { slice::from_raw_parts(argv, n) }
    };
    // SAFETY: the context lives until the handler returns (caller's contract).
    (unsafe { Ctx::from_raw(ctx) }, Args { raw })
}
