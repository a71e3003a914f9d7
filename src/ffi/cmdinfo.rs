//! Command registration with arity, key specs and documentation for COMMAND INFO /
//! COMMAND DOCS, set with the raw `RedisModule_SetCommandInfo` (a Redis 7.0 API), so
//! that Redis Cluster routes by key and ACL key patterns (`~lock:*`, `%R~`, `%W~`) apply.

use std::ffi::{c_char, c_int, CString};
use std::mem::{size_of, zeroed};

use redis_module::raw;

use std::cell::RefCell;

use super::{api, api_opt, leak_cstr, Ctx, MainThread, OK};

type ArgType = raw::RedisModuleCommandArgType;

#[derive(Clone, Copy)]
pub enum Arg {
    Key(&'static str),
    Str(&'static str),
    Int(&'static str),
    /// Any number of further arguments (optional, repeated).
    Rest(&'static str),
    /// An optional `TOKEN value` pair.
    Opt(&'static str, &'static str, ArgType),
    /// An optional choice of `PX ms` or `EX s`.
    Expiry,
    /// An optional bare keyword (`SHARED`).
    Flag(&'static str, &'static str),
}

/// Where a command's keys are.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Keys {
    /// None.
    None,
    /// The first argument.
    First,
    /// `numkeys` first, then that many keys, each followed by `step - 1` other arguments.
    Counted { step: c_int },
}

impl Keys {
    /// The first argument for a command with key flags, none without.
    pub fn of(key_flags: u64) -> Keys {
        if key_flags == 0 {
            Keys::None
        } else {
            Keys::First
        }
    }
}

pub struct Cmd {
    pub name: &'static str,
    pub flags: &'static str,
    /// ACL categories, where the server lets a module set them (Redis 7.2+, Valkey).
    pub acl: &'static str,
    pub keys: Keys,
    pub key_flags: u64,
    pub arity: c_int,
    pub summary: &'static str,
    pub complexity: &'static str,
    pub args: &'static [Arg],
}

/// Every command-info struct handed to the server. Everything else built here hangs off
/// these, so leak checkers see it as reachable.
static INFOS: MainThread<RefCell<Vec<usize>>> = MainThread(RefCell::new(Vec::new()));

fn leak_c(s: &str) -> *const c_char {
    leak_cstr(s)
}

fn leak<T>(v: Vec<T>) -> *mut T {
    Box::leak(v.into_boxed_slice()).as_mut_ptr()
}

fn arg(name: &str, t: ArgType, token: Option<&str>, flags: u32) -> raw::RedisModuleCommandArg {
    // SAFETY: an all-zero RedisModuleCommandArg is valid (NULL pointers, zero flags).
    let mut a: raw::RedisModuleCommandArg = unsafe { zeroed() };
    a.name = leak_c(name);
    a.type_ = t;
    a.key_spec_index = if t == raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_KEY {
        0
    } else {
        -1
    };
    a.token = token.map_or(std::ptr::null(), leak_c);
    a.flags = flags as c_int;
    a
}

fn build_args(args: &[Arg]) -> *mut raw::RedisModuleCommandArg {
    use raw::{
        RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_INTEGER as INTEGER,
        RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_KEY as KEY,
        RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_ONEOF as ONEOF,
        RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_PURE_TOKEN as PURE_TOKEN,
        RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_STRING as STRING,
    };
    const OPTIONAL: u32 = raw::REDISMODULE_CMD_ARG_OPTIONAL;
    let mut out: Vec<raw::RedisModuleCommandArg> = args
        .iter()
        .map(|a| match *a {
            Arg::Key(n) => arg(n, KEY, None, 0),
            Arg::Str(n) => arg(n, STRING, None, 0),
            Arg::Int(n) => arg(n, INTEGER, None, 0),
            Arg::Rest(n) => arg(
                n,
                STRING,
                None,
                OPTIONAL | raw::REDISMODULE_CMD_ARG_MULTIPLE,
            ),
            Arg::Opt(tok, n, t) => arg(n, t, Some(tok), OPTIONAL),
            Arg::Flag(tok, n) => arg(n, PURE_TOKEN, Some(tok), OPTIONAL),
            Arg::Expiry => {
                let mut e = arg("expiration", ONEOF, None, OPTIONAL);
                e.subargs = leak(vec![
                    arg("milliseconds", INTEGER, Some("PX"), 0),
                    arg("seconds", INTEGER, Some("EX"), 0),
                    // SAFETY: the all-zero terminator entry.
                    unsafe { zeroed() },
                ]);
                e
            }
        })
        .collect();
    // SAFETY: the all-zero terminator entry.
    out.push(unsafe { zeroed() });
    leak(out)
}

fn key_spec(keys: Keys, flags: u64) -> *mut raw::RedisModuleCommandKeySpec {
    if keys == Keys::None {
        return std::ptr::null_mut();
    }
    // SAFETY: an all-zero key spec is valid (and is also the terminator).
    let mut ks: raw::RedisModuleCommandKeySpec = unsafe { zeroed() };
    ks.flags = flags;
    ks.begin_search_type = raw::RedisModuleKeySpecBeginSearchType_REDISMODULE_KSPEC_BS_INDEX;
    ks.bs.index.pos = 1;
    match keys {
        Keys::Counted { step } => {
            ks.find_keys_type = raw::RedisModuleKeySpecFindKeysType_REDISMODULE_KSPEC_FK_KEYNUM;
            ks.fk.keynum.keynumidx = 0;
            ks.fk.keynum.firstkey = 1;
            ks.fk.keynum.keystep = step;
        }
        _ => {
            ks.find_keys_type = raw::RedisModuleKeySpecFindKeysType_REDISMODULE_KSPEC_FK_RANGE;
            ks.fk.range.lastkey = 0;
            ks.fk.range.keystep = 1;
            ks.fk.range.limit = 0;
        }
    }
    // SAFETY: the all-zero terminator entry.
    leak(vec![ks, unsafe { zeroed() }])
}

/// Creates the command and attaches its info. Err with a reason on failure.
pub fn register(ctx: Ctx<'_>, c: &Cmd, handler: raw::RedisModuleCmdFunc) -> Result<(), String> {
    let name = CString::new(c.name).map_err(|e| e.to_string())?;
    let flags = CString::new(c.flags).map_err(|e| e.to_string())?;
    // The legacy key range: the first argument, or none (counted keys are found through
    // the key spec, which makes the command one with movable keys).
    let (first, last) = if c.keys == Keys::First {
        (1, 1)
    } else {
        (0, 0)
    };
    // SAFETY: a load-time context; the names are NUL-terminated and copied by the server.
    let ok = unsafe {
        api!(RedisModule_CreateCommand)(
            ctx.raw(),
            name.as_ptr(),
            handler,
            flags.as_ptr(),
            first,
            last,
            first,
        )
    };
    if ok != OK {
        return Err(format!("creating {} failed", c.name));
    }
    let Some(get) = api_opt!(RedisModule_GetCommand) else {
        return Ok(()); // a server without command info: the legacy key range still routes
    };
    // SAFETY: the command was just created under this name.
    let cmd = unsafe { get(ctx.raw(), name.as_ptr()) };
    if cmd.is_null() {
        return Err(format!("looking up {} failed", c.name));
    }
    if let Some(set_acl) = api_opt!(RedisModule_SetCommandACLCategories) {
        let own = MODULE_CATEGORY
            .get()
            .map_or(String::new(), |c| format!(" {c}"));
        let acl = CString::new(format!("{}{own}", c.acl)).map_err(|e| e.to_string())?;
        // SAFETY: our command, at load time; the server parses and copies the names.
        if unsafe { set_acl(cmd, acl.as_ptr()) } != OK {
            return Err(format!("setting the ACL categories of {} failed", c.name));
        }
    }
    let Some(set_info) = api_opt!(RedisModule_SetCommandInfo) else {
        return Ok(());
    };
    let version = Box::leak(Box::new(raw::RedisModuleCommandInfoVersion {
        version: 1,
        sizeof_historyentry: size_of::<raw::RedisModuleCommandHistoryEntry>(),
        sizeof_keyspec: size_of::<raw::RedisModuleCommandKeySpec>(),
        sizeof_arg: size_of::<raw::RedisModuleCommandArg>(),
    }));
    // SAFETY: an all-zero RedisModuleCommandInfo is valid (NULL pointers, zero arity).
    let mut info: raw::RedisModuleCommandInfo = unsafe { zeroed() };
    info.version = version;
    info.summary = leak_c(c.summary);
    info.complexity = leak_c(c.complexity);
    info.since = leak_c("0.1.0");
    info.arity = c.arity;
    info.key_specs = key_spec(c.keys, c.key_flags);
    info.args = build_args(c.args);
    let info = Box::leak(Box::new(info));
    // Kept reachable for the life of the process (the server may point into it).
    INFOS
        .borrow_mut()
        .push(info as *mut raw::RedisModuleCommandInfo as usize);
    // SAFETY: `cmd` is our command; `info` and everything it points to are leaked, so
    // they outlive the server's use of them.
    if unsafe { set_info(cmd, info) } != OK {
        return Err(format!("setting command info of {} failed", c.name));
    }
    Ok(())
}

/// Adds the module's own ACL category (`@name`), where the server allows it. True when
/// the category exists afterwards.
pub fn add_acl_category(ctx: Ctx<'_>, name: &str) -> bool {
    let (Some(f), Ok(n)) = (api_opt!(RedisModule_AddACLCategory), CString::new(name)) else {
        return false;
    };
    // SAFETY: a load-time context; the name is copied.
    let added = unsafe { f(ctx.raw(), n.as_ptr()) == OK };
    if added {
        let _ = MODULE_CATEGORY.set(name.to_string());
    }
    added
}

/// The module's own category, once added: every command registered after gets it.
static MODULE_CATEGORY: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// Whether this server lets a module put its commands in ACL categories.
pub fn has_acl_categories() -> bool {
    api_opt!(RedisModule_SetCommandACLCategories).is_some()
}
