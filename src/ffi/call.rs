//! Running another command from inside one of ours (LOCK.IFHELD, LOCK.IFFENCE), and what
//! the server knows of a command: whether it exists, its flags, where its keys are.

use std::ffi::{c_int, c_void, CString};
use std::ptr;
use std::slice;

use redis_module::raw;

use super::{api, api_opt, Args, Ctx};

/// A reply of a command run with `RedisModule_Call`, freed on drop.
pub struct CallReply(*mut raw::RedisModuleCallReply);

impl Drop for CallReply {
    fn drop(&mut self) {
        if !self.0.is_null() {
            // SAFETY: a reply RedisModule_Call returned, owned by this handle alone.
            unsafe { api!(RedisModule_FreeCallReply)(self.0) };
        }
    }
}

const REPLY_STRING: c_int = raw::REDISMODULE_REPLY_STRING as c_int;
const REPLY_ARRAY: c_int = raw::REDISMODULE_REPLY_ARRAY as c_int;

impl CallReply {
    /// Sends the reply to the client of the running command, as it is (its protocol was
    /// the client's).
    pub fn send(self, ctx: Ctx<'_>) {
        // SAFETY: a command context and a live reply (copied into the client's output).
        unsafe { api!(RedisModule_ReplyWithCallReply)(ctx.raw(), self.0) };
    }
}

/// Element `i` of an array reply (borrowed from it: never freed on its own).
fn element(r: *mut raw::RedisModuleCallReply, i: usize) -> Option<*mut raw::RedisModuleCallReply> {
    // SAFETY: a live reply (or element of one).
    if r.is_null() || unsafe { api!(RedisModule_CallReplyType)(r) } != REPLY_ARRAY {
        return None;
    }
    // SAFETY: a live array reply.
    let n = unsafe { api!(RedisModule_CallReplyLength)(r) };
    // SAFETY: an index below the array's length.
    let e = (i < n).then(|| unsafe { api!(RedisModule_CallReplyArrayElement)(r, i) })?;
    (!e.is_null()).then_some(e)
}

/// The strings of an array reply (other elements left out).
fn strings(r: *mut raw::RedisModuleCallReply) -> Vec<Vec<u8>> {
    (0..)
        .map_while(|i| element(r, i))
        .filter_map(string_of)
        .collect()
}

fn string_of(e: *mut raw::RedisModuleCallReply) -> Option<Vec<u8>> {
    if e.is_null() {
        return None;
    }
    // SAFETY: a live reply element.
    if unsafe { api!(RedisModule_CallReplyType)(e) } != REPLY_STRING {
        return None;
    }
    let mut len = 0usize;
    // SAFETY: a string reply; the pointer is valid while the reply lives.
    let p = unsafe { api!(RedisModule_CallReplyStringPtr)(e, &mut len) };
    if p.is_null() {
        return None;
    }
    // SAFETY: `len` bytes at `p`, owned by the reply.
    Some(unsafe { slice::from_raw_parts(p.cast::<u8>(), len) }.to_vec())
}

fn set_errno(v: c_int) {
    // SAFETY: the calling thread's errno.
    unsafe { *libc::__errno_location() = v };
}

fn errno() -> c_int {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// Why a call did not run (errno of `RedisModule_Call`), where the module answers in
/// its own words; anything else is sent as the server's reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// EACCES: the user may not run the command or touch its keys.
    Acl,
    /// No reply at all (the server gave none).
    Failed,
}

/// Runs the command `args[from..]` as the running command's client would: its ACL user,
/// its protocol, refused over maxmemory if it is a deny-oom command, refused if scripts
/// may not run it, replicated and written to the AOF as it runs. The reply is the
/// command's (or the server's refusal).
pub fn run(ctx: Ctx<'_>, args: Args<'_>, from: usize) -> Result<CallReply, Refused> {
    let argv = args.raw_from(from);
    let Some((name, rest)) = argv.split_first() else {
        return Err(Refused::Failed);
    };
    // SAFETY: a live argument string.
    let name = unsafe { super::Str::from_raw(*name) }.bytes();
    let name = CString::new(name).unwrap_or_default();
    let call = |fmt: &std::ffi::CStr| {
        set_errno(0);
        // SAFETY: a command context; the format has one `v` (a vector of live argument
        // strings and its length) and modifiers only otherwise.
        let r = unsafe {
            api!(RedisModule_Call)(
                ctx.raw(),
                name.as_ptr(),
                fmt.as_ptr(),
                rest.as_ptr().cast_mut(),
                rest.len(),
            )
        };
        (CallReply(r), errno())
    };
    // `C`: as the client's ACL user. A caller with no user attached (another module's
    // call without one) runs commands unrestricted, and so does what it wraps.
    let (mut reply, mut err) = call(c"v!C0MSE");
    if err == libc::ENOTSUP {
        (reply, err) = call(c"v!0MSE");
    }
    if err == libc::EACCES {
        return Err(Refused::Acl);
    }
    if reply.0.is_null() {
        return Err(Refused::Failed);
    }
    Ok(reply)
}

/// What a command is, from `COMMAND INFO` (None: no such command).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Flags {
    pub blocking: bool,
    pub noscript: bool,
}

pub fn command_flags(ctx: Ctx<'_>, name: &[u8]) -> Option<Flags> {
    // SAFETY: a command context; "cb" takes a C string and a buffer with its length.
    let r = unsafe {
        api!(RedisModule_Call)(
            ctx.raw(),
            c"COMMAND".as_ptr(),
            c"cb".as_ptr(),
            c"INFO".as_ptr(),
            name.as_ptr(),
            name.len(),
        )
    };
    let reply = CallReply(r);
    // [[name, arity, [flags...], ...]] or [nil].
    let entry = element(reply.0, 0)?;
    let list = strings(element(entry, 2)?);
    let has = |f: &[u8]| list.iter().any(|x| x.eq_ignore_ascii_case(f));
    Some(Flags {
        blocking: has(b"blocking"),
        noscript: has(b"noscript"),
    })
}

/// Where the keys of the command `args[from..]` are, relative to `from`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Keys {
    At(Vec<(usize, c_int)>),
    /// No such command (errno ENOENT).
    Unknown,
    /// Wrong number of arguments for it (errno EINVAL).
    Arity,
}

pub fn command_keys(ctx: Ctx<'_>, args: Args<'_>, from: usize) -> Keys {
    let argv = args.raw_from(from);
    let Ok(argc) = c_int::try_from(argv.len()) else {
        return Keys::Arity;
    };
    let mut n: c_int = 0;
    let mut flags: *mut c_int = ptr::null_mut();
    set_errno(0);
    // SAFETY: a valid context and `argc` live argument strings; the server allocates the
    // two arrays it returns, freed below.
    let pos = unsafe {
        api!(RedisModule_GetCommandKeysWithFlags)(
            ctx.raw(),
            argv.as_ptr().cast_mut(),
            argc,
            &mut n,
            &mut flags,
        )
    };
    if pos.is_null() {
        return match errno() {
            libc::ENOENT => Keys::Unknown,
            libc::EINVAL => Keys::Arity,
            _ => Keys::At(Vec::new()),
        };
    }
    let count = usize::try_from(n).unwrap_or(0);
    // SAFETY: `count` positions (and as many flags, when given) the server allocated.
    let out = unsafe {
        let p = slice::from_raw_parts(pos, count);
        let f = (!flags.is_null()).then(|| slice::from_raw_parts(flags, count));
        p.iter()
            .enumerate()
            .map(|(i, &at)| (usize::try_from(at).unwrap_or(0), f.map_or(0, |f| f[i])))
            .collect()
    };
    // SAFETY: arrays the server allocated for the module to free.
    unsafe {
        api!(RedisModule_Free)(pos.cast::<c_void>());
        if !flags.is_null() {
            api!(RedisModule_Free)(flags.cast::<c_void>());
        }
    }
    Keys::At(out)
}

/// Whether the server asks the running command only where its keys are (COMMAND GETKEYS,
/// cluster routing, ACL key checks), for a command registered with `getkeys-api`.
pub fn is_keys_request(ctx: Ctx<'_>) -> bool {
    // SAFETY: a valid context.
    unsafe { api!(RedisModule_IsKeysPositionRequest)(ctx.raw()) != 0 }
}

/// Answers a keys request: argument `pos` is a key, with the key-spec flags given.
pub fn key_at(ctx: Ctx<'_>, pos: usize, flags: c_int) {
    let Ok(pos) = c_int::try_from(pos) else {
        return;
    };
    match api_opt!(RedisModule_KeyAtPosWithFlags) {
        // SAFETY: a keys-request context; the server checks the position.
        Some(f) => unsafe { f(ctx.raw(), pos, flags) },
        // SAFETY: as above.
        None => unsafe { api!(RedisModule_KeyAtPos)(ctx.raw(), pos) },
    }
}
