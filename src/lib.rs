//! redis-lock: native distributed-lock commands for Redis and Valkey.
//!
//! This file only registers things with the server: the data type, the settings, the
//! commands with their docs, the event subscriptions and the INFO section.

#![cfg_attr(test, allow(dead_code))]
#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::undocumented_unsafe_blocks)]
// Every `unsafe` block is under src/ffi/, which allows it; nothing else may.
#![deny(unsafe_code)]

pub mod args;
pub mod engine;
pub mod error;
pub mod lock;
pub mod reply;
pub mod syntax;

mod cluster;
mod commands;
mod config;
mod datatype;
mod events;
#[allow(unsafe_code)]
mod ffi;
mod guard;
mod keyspace;
mod multi;
mod sched;
mod sessions;
mod state;
mod stats;

use std::sync::atomic::Ordering;

use redis_module::{raw, RedisString, Status};

use ffi::cmdinfo::{self, Arg, Cmd, Keys};
use ffi::Ctx;

const KEY_RO: u64 = raw::REDISMODULE_CMD_KEY_RO as u64;
const KEY_RW: u64 = raw::REDISMODULE_CMD_KEY_RW as u64;
const KEY_OW: u64 = raw::REDISMODULE_CMD_KEY_OW as u64;
const ACCESS: u64 = raw::REDISMODULE_CMD_KEY_ACCESS as u64;
const UPDATE: u64 = raw::REDISMODULE_CMD_KEY_UPDATE as u64;
const INSERT: u64 = raw::REDISMODULE_CMD_KEY_INSERT as u64;
const DELETE: u64 = raw::REDISMODULE_CMD_KEY_DELETE as u64;
/// The wrapped command's keys have their own flags (reported by the getkeys callback).
const VARIABLE: u64 = raw::REDISMODULE_CMD_KEY_VARIABLE_FLAGS as u64;

const INTEGER: raw::RedisModuleCommandArgType =
    raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_INTEGER;
const STRING: raw::RedisModuleCommandArgType =
    raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_STRING;

/// One row a command, in registration order: name => handler, arity, key flags (and where
/// the keys are, when not the first argument); ACL categories / command flags,
/// complexity; summary; arguments.
macro_rules! commands {
    ($($name:literal => $handler:path, arity $arity:literal, $keys:expr $(, at $spec:expr)?;
        $acl:literal / $flags:literal, $complexity:literal,
        $summary:literal,
        [$($arg:expr),* $(,)?];)*) => {
        vec![$((
            Cmd {
                name: $name,
                acl: $acl,
                flags: $flags,
                keys: {
                    #[allow(unused_mut, unused_assignments)]
                    let mut k = Keys::of($keys);
                    $(k = $spec;)?
                    k
                },
                key_flags: $keys,
                arity: $arity,
                summary: $summary,
                complexity: $complexity,
                args: &[$($arg),*],
            },
            Some(ffi::entry::<$handler>),
        )),*]
    };
}

fn commands() -> Vec<(Cmd, raw::RedisModuleCmdFunc)> {
    use Arg::*;
    commands! {
        "lock.acquire" => commands::Acquire, arity -2, KEY_RW | ACCESS | INSERT;
            "write blocking slow" / "write deny-oom blocking", "O(1)",
            "Takes a lock (exclusive, SHARED, or one of LIMIT n permits) if it is free, optionally waiting in a FIFO queue; replies [token, fence] or nil.",
            [Key("key"), Flag("SHARED", "shared"), Opt("LIMIT", "permits", INTEGER), Expiry,
             Opt("TOKEN", "token", STRING), Opt("OWNER", "label", STRING),
             Opt("BLOCK", "timeout", INTEGER), Opt("MINFENCE", "fence", INTEGER),
             Opt("LOCKDELAY", "milliseconds", INTEGER), Opt("SESSION", "id", STRING)];
        "lock.acquireall" => multi::AcquireAll, arity -3, KEY_RW | ACCESS | INSERT, at Keys::Counted { step: 1 };
            "write blocking slow" / "write deny-oom blocking getkeys-api", "O(N) for N keys",
            "Takes several locks all or nothing (MODES gives each key's: EXCLUSIVE, SHARED or LIMIT=n), optionally waiting in every key's FIFO queue; replies [token, [fence, ...]] or nil.",
            [Int("numkeys"), Rest("key"), Opt("MODES", "mode", STRING), Expiry, Opt("SESSION", "id", STRING),
             Opt("TOKEN", "token", STRING), Opt("OWNER", "label", STRING),
             Opt("BLOCK", "timeout", INTEGER), Opt("MINFENCE", "fence", INTEGER),
             Opt("LOCKDELAY", "milliseconds", INTEGER)];
        "lock.releaseall" => multi::ReleaseAll, arity -4, KEY_RW | ACCESS | DELETE, at Keys::Counted { step: 1 };
            "write slow" / "write getkeys-api", "O(N) for N keys",
            "Releases every one of the keys the token holds (and hands each to its next waiters); replies how many it released.",
            [Int("numkeys"), Rest("key"), Str("token")];
        "lock.extendall" => multi::ExtendAll, arity -4, KEY_RW | ACCESS | UPDATE, at Keys::Counted { step: 1 };
            "write slow" / "write getkeys-api", "O(N) for N keys",
            "Resets the lease of every one of the keys the token holds; replies how many it extended.",
            [Int("numkeys"), Rest("key"), Str("token"), Expiry];
        "lock.release" => commands::Release, arity 3, KEY_RW | ACCESS | DELETE;
            "write fast" / "write fast", "O(1)",
            "Deletes the lock if the token holds it and hands it to the next waiter; replies 1 or 0.",
            [Key("key"), Str("token")];
        "lock.extend" => commands::Extend, arity -3, KEY_RW | ACCESS | UPDATE;
            "write fast" / "write fast", "O(1)",
            "Resets the remaining lease of a lock the token holds (and with OWNER its label, keeping its fence); replies 1 or 0.",
            [Key("key"), Str("token"), Expiry, Opt("OWNER", "label", STRING)];
        "lock.info" => commands::Info, arity -2, KEY_RO | ACCESS;
            "read fast" / "readonly fast", "O(log N + COUNT + WAITERS) where N is the number of holders",
            "Shows who holds a lock (never the token), its fence, lease and waiters (how many, the longest wait; with WAITERS the first ones: client, owner, mode, ms waited), a page of its holders; nil if free.",
            [Key("key"), Opt("COUNT", "count", INTEGER), Opt("AFTER", "fence", INTEGER),
             Opt("WAITERS", "count", INTEGER)];
        "lock.check" => commands::Check, arity 3, KEY_RO | ACCESS;
            "read fast" / "readonly fast", "O(log N) where N is the number of holders",
            "Whether a fence is that of a current holder of the lock: 1 or 0 (a sequencer check for whoever was handed a fence).",
            [Key("key"), Int("fence")];
        "lock.watch" => commands::Watch, arity -2, KEY_RO | ACCESS;
            "read blocking slow" / "readonly blocking", "O(1) to wait; O(W) for the W watchers of a key when it changes",
            "Waits until the lock is held (or, with FENCE, until that fence no longer holds it) and replies who holds it: mode, holders and their fences and labels (never a token); nil when free.",
            [Key("key"), Opt("FENCE", "fence", INTEGER), Opt("OWNER", "label", STRING),
             Opt("BLOCK", "timeout", INTEGER)];
        "lock.ifheld" => guard::IfHeld, arity -4, KEY_RO | ACCESS | VARIABLE;
            "write slow" / "write getkeys-api", "O(1) plus the wrapped command's",
            "Runs a command (on keys in the lock key's slot) only if the token holds the lock now, atomically, and replies what it replies; NOTHELD and nothing runs otherwise.",
            [Key("key"), Str("token"), Str("command"), Rest("arg")];
        "lock.iffence" => guard::IfFence, arity -4, KEY_RO | ACCESS | VARIABLE;
            "write slow" / "write getkeys-api", "O(log N) plus the wrapped command's",
            "Runs a command only if the fence is that of a current holder of the lock, atomically (for whoever was handed the fence, not the token); NOTHELD and nothing runs otherwise.",
            [Key("key"), Int("fence"), Str("command"), Rest("arg")];
        "lock.forcerelease" => commands::ForceRelease, arity -2, KEY_RW | DELETE;
            "write dangerous slow" / "write", "O(1)",
            "Administrative: removes every holder of a lock (or the one with FENCE f) and hands it to the next waiters.",
            [Key("key"), Opt("FENCE", "fence", INTEGER)];
        "lock.session" => sessions::Session, arity -3, 0;
            "write slow" / "may-replicate", "O(1) to open or look; O(L) to keep alive or close a session with L locks",
            "Sessions: OPEN id [PX ms | EX s] [BIND grace-ms] [OWNER label] | KEEPALIVE id [PX ms | EX s] | CLOSE id | INFO id [COUNT n]. One lease for every lock taken with LOCK.ACQUIRE ... SESSION id, released together when the session ends.",
            [Str("subcommand"), Str("id"), Rest("option")];
        "lock.srepl" => sessions::SessionRepl, arity -2, 0;
            "write dangerous slow" / "write", "O(L) for a session with L locks",
            "Internal: one change of a session (op;fields), as a primary sends it to replicas and the AOF.",
            [Str("change"), Rest("option")];
        "lock.repl" => commands::Repl, arity -3, KEY_RW | UPDATE;
            "write dangerous slow" / "write", "O(1)",
            "Internal: one change of a lock (op;fields), as a primary sends it to replicas and the AOF.",
            [Key("key"), Str("change"), Opt("OWNER", "label", STRING),
             Opt("FLOOR", "fence", INTEGER), Opt("LOCKDELAY", "milliseconds", INTEGER),
             Opt("SESSION", "session-digest", STRING)];
        "lock.sync" => commands::Sync, arity -8, KEY_OW | UPDATE;
            "write dangerous slow" / "write", "O(1)",
            "Internal: the 0.1 release's replication command, still read from older primaries and AOF files.",
            [Key("key"), Str("token"), Str("fence"), Str("expires-at"), Str("acquired-at"),
             Str("client-id"), Str("client-addr"), Opt("OWNER", "label", STRING),
             Opt("FLOOR", "fence", INTEGER)];
        "lock.debug" => commands::Debug, arity -2, 0;
            "admin dangerous slow" / "admin", "O(1)",
            "Testing aid, off unless loaded with 'debug-commands yes': PANIC | FENCE | INJECT key kind.",
            [Str("subcommand")];
    }
}

fn fail(ctx: Ctx<'_>, msg: &str) -> Status {
    ctx.log("warning", &format!("redis-lock: {msg}"));
    Status::Err
}

fn init(ctx: &redis_module::Context, args: &[RedisString]) -> Status {
    let ctx = Ctx::of_load(ctx);
    match setup(ctx, args) {
        Ok(()) => Status::Ok,
        Err(e) => fail(ctx, &e),
    }
}

fn setup(ctx: Ctx<'_>, args: &[RedisString]) -> Result<(), String> {
    ffi::guard::install_panic_hook();
    ffi::set_module_options(ctx);
    ffi::keep_module_ctx(ctx);
    if !ffi::datatype::create::<datatype::LockType>(ctx, &state::LOCK_TYPE) {
        return Err("creating the redislock data type failed".into());
    }
    let raw_args: Vec<&[u8]> = args.iter().map(|a| a.as_slice()).collect();
    let overrides = config::parse_module_args(&raw_args)?;
    config::register(ctx, &overrides)?;
    events::check_eviction(ctx);
    // `@lock`: every command of the module, where the server lets a module add one.
    if cmdinfo::has_acl_categories() && !cmdinfo::add_acl_category(ctx, "lock") {
        ctx.log(
            "warning",
            "redis-lock: could not add the ACL category 'lock'",
        );
    }
    // LOCK.DEBUG exists only with 'debug-commands yes'. Left out, the module adds 16
    // commands: Redis 7.0.15's own 240 and these fill its command table's 256 buckets
    // without making it double, which would reorder the chains and cost SET and other
    // commands a compare or two in every lookup (docs/BENCHMARKS.md, the SET tax).
    let debug = config::debug_commands();
    for (cmd, handler) in commands() {
        if cmd.name != <commands::Debug as ffi::Handler>::NAME || debug {
            cmdinfo::register(ctx, &cmd, handler)?;
        }
    }
    ffi::events::subscribe_server(ctx, events::on_server)?;
    ffi::events::register_info(ctx, stats::info)?;
    ffi::cluster::register(ctx, &[cluster::STATE, cluster::REQUEST], events::on_bus);
    let wall = ffi::wall_ms();
    state::with(|st| {
        // CLIENT UNBLOCK of a waiter races its hand-off on servers before Redis 7.4 (the
        // client can be left without any reply): there, waiters refuse CLIENT UNBLOCK.
        st.unblock_allowed = ffi::server_version() >= 0x0007_0400;
        st.wake.fire = sched::fired;
        st.replica = ctx.flags() & ffi::FLAG_SLAVE != 0;
        if st.replica {
            st.engine.demoted();
        }
        // Settled before the first command: nothing is built for replicas or the AOF
        // unless something can receive it (re-checked at every fork, replica change,
        // end of loading, and every second).
        st.listening = events::listening_now(ctx);
        st.engine
            .fence
            .set_min_shift(config::FENCE_SHIFT.load(Ordering::Relaxed));
        // A start: the first fence jumps ahead of the clock (see lock::fence).
        st.engine.fence.start(wall);
        if cluster::enabled(ctx) {
            st.cluster = ffi::cluster::my_id().map(|id| cluster::Cluster::new(id, wall));
        }
    })
    .ok_or("the module state is busy at load")?;
    Ok(())
}

/// The version `MODULE LIST` shows, numbered as the server numbers modules' versions
/// (major * 10000 + minor * 100 + patch: 0.1.0 is 100), from Cargo.toml's version.
pub const MODULE_VERSION: i32 = module_version(
    env!("CARGO_PKG_VERSION_MAJOR"),
    env!("CARGO_PKG_VERSION_MINOR"),
    env!("CARGO_PKG_VERSION_PATCH"),
);

/// `major * 10000 + minor * 100 + patch` from the decimal parts of a version; a part out
/// of its range (minor and patch 0..=99) stops the build.
const fn module_version(major: &str, minor: &str, patch: &str) -> i32 {
    const fn part(s: &str, max: i32) -> i32 {
        let b = s.as_bytes();
        assert!(!b.is_empty(), "an empty version part");
        let mut n = 0;
        let mut i = 0;
        while i < b.len() {
            assert!(b[i].is_ascii_digit(), "a version part that is not a number");
            n = n * 10 + (b[i] - b'0') as i32;
            assert!(n <= max, "a version part out of range");
            i += 1;
        }
        n
    }
    part(major, 200_000) * 10_000 + part(minor, 99) * 100 + part(patch, 99)
}

#[cfg(test)]
mod tests {
    #[test]
    fn module_versions_are_numbered_as_the_server_does() {
        assert_eq!(super::module_version("0", "1", "0"), 100);
        assert_eq!(super::module_version("1", "2", "3"), 10_203);
        assert_eq!(super::module_version("7", "4", "12"), 70_412);
    }
}

#[cfg(not(test))]
redis_module::redis_module! {
    name: "lock",
    version: MODULE_VERSION,
    allocator: (redis_module::alloc::RedisAlloc, redis_module::alloc::RedisAlloc),
    data_types: [],
    init: init,
}
