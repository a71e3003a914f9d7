//! redis-lock: native distributed-lock commands for Redis and Valkey.
//!
//! This file only registers things with the server: the data type, the settings, the
//! commands with their docs, the event subscriptions and the INFO section.

#![cfg_attr(test, allow(dead_code))]

pub mod args;
pub mod core;
pub mod error;

mod cmdinfo;
mod commands;
mod config;
mod datatype;
mod events;
mod ffi;
mod guard;
mod info;
mod replicate;
mod state;
mod store;
mod waiters;

use std::ffi::c_int;

use redis_module::{raw, Context, RedisString, Status};

use cmdinfo::{Arg, Cmd};

const KEY_RO: u64 = raw::REDISMODULE_CMD_KEY_RO as u64;
const KEY_RW: u64 = raw::REDISMODULE_CMD_KEY_RW as u64;
const KEY_OW: u64 = raw::REDISMODULE_CMD_KEY_OW as u64;
const ACCESS: u64 = raw::REDISMODULE_CMD_KEY_ACCESS as u64;
const UPDATE: u64 = raw::REDISMODULE_CMD_KEY_UPDATE as u64;
const INSERT: u64 = raw::REDISMODULE_CMD_KEY_INSERT as u64;
const DELETE: u64 = raw::REDISMODULE_CMD_KEY_DELETE as u64;

const INTEGER: raw::RedisModuleCommandArgType =
    raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_INTEGER;
const STRING: raw::RedisModuleCommandArgType =
    raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_STRING;

fn commands() -> Vec<(Cmd, raw::RedisModuleCmdFunc)> {
    vec![
        (
            Cmd {
                name: "lock.acquire",
                flags: "write deny-oom",
                key_flags: KEY_RW | ACCESS | INSERT,
                arity: -2,
                summary: "Takes a lock if it is free, optionally waiting in a FIFO queue; replies [token, fence] or nil.",
                complexity: "O(1)",
                args: &[
                    Arg::Key("key"),
                    Arg::Expiry,
                    Arg::Opt("TOKEN", "token", STRING),
                    Arg::Opt("OWNER", "label", STRING),
                    Arg::Opt("BLOCK", "timeout", INTEGER),
                    Arg::Opt("MINFENCE", "fence", INTEGER),
                ],
            },
            Some(commands::acquire),
        ),
        (
            Cmd {
                name: "lock.release",
                flags: "write fast",
                key_flags: KEY_RW | ACCESS | DELETE,
                arity: 3,
                summary: "Deletes the lock if the token holds it and hands it to the next waiter; replies 1 or 0.",
                complexity: "O(1)",
                args: &[Arg::Key("key"), Arg::Str("token")],
            },
            Some(commands::release),
        ),
        (
            Cmd {
                name: "lock.extend",
                flags: "write fast",
                key_flags: KEY_RW | ACCESS | UPDATE,
                arity: -3,
                summary: "Resets the remaining lease of a lock the token holds; replies 1 or 0.",
                complexity: "O(1)",
                args: &[Arg::Key("key"), Arg::Str("token"), Arg::Expiry],
            },
            Some(commands::extend),
        ),
        (
            Cmd {
                name: "lock.info",
                flags: "readonly fast",
                key_flags: KEY_RO | ACCESS,
                arity: 2,
                summary: "Shows who holds a lock (never the token), its fence, TTL and waiters; nil if free.",
                complexity: "O(1)",
                args: &[Arg::Key("key")],
            },
            Some(commands::info),
        ),
        (
            Cmd {
                name: "lock.forcerelease",
                flags: "write",
                key_flags: KEY_RW | DELETE,
                arity: 2,
                summary: "Administrative: deletes a lock whoever holds it and hands it to the next waiter.",
                complexity: "O(1)",
                args: &[Arg::Key("key")],
            },
            Some(commands::forcerelease),
        ),
        (
            Cmd {
                name: "lock.sync",
                flags: "write",
                key_flags: KEY_OW | UPDATE,
                arity: -8,
                summary: "Internal: the full lock state a primary sends to replicas and the AOF.",
                complexity: "O(1)",
                args: &[
                    Arg::Key("key"),
                    Arg::Str("token"),
                    Arg::Str("fence"),
                    Arg::Str("expires-at"),
                    Arg::Str("acquired-at"),
                    Arg::Str("client-id"),
                    Arg::Str("client-addr"),
                    Arg::Opt("OWNER", "label", STRING),
                    Arg::Opt("FLOOR", "fence", INTEGER),
                ],
            },
            Some(commands::sync),
        ),
    ]
}

fn fail(ctx: &Context, msg: &str) -> Status {
    ctx.log_warning(&format!("redis-lock: {msg}"));
    Status::Err
}

fn init(ctx: &Context, args: &[RedisString]) -> Status {
    guard::install_panic_hook();
    unsafe {
        if let Some(f) = raw::RedisModule_SetModuleOptions {
            f(ctx.ctx, raw::REDISMODULE_OPTIONS_HANDLE_IO_ERRORS as c_int);
        }
    }
    if !datatype::create(ctx.ctx) {
        return fail(ctx, "creating the redislock data type failed");
    }
    let raw_args: Vec<&[u8]> = args.iter().map(|a| a.as_slice()).collect();
    let overrides = match config::parse_module_args(&raw_args) {
        Ok(o) => o,
        Err(e) => return fail(ctx, &e),
    };
    if let Err(e) = config::register(ctx.ctx, &overrides) {
        return fail(ctx, &e);
    }
    for (cmd, handler) in commands() {
        if let Err(e) = cmdinfo::register(ctx.ctx, &cmd, handler) {
            return fail(ctx, &e);
        }
    }
    let debug = Cmd {
        name: "lock.debug",
        flags: "admin",
        key_flags: KEY_RO,
        arity: -2,
        summary: "Testing aid, off unless loaded with 'debug-commands yes': PANIC | FENCE.",
        complexity: "O(1)",
        args: &[Arg::Str("subcommand")],
    };
    // LOCK.DEBUG takes no key; register it without key specs.
    if let Err(e) = register_keyless(ctx, &debug) {
        return fail(ctx, &e);
    }
    unsafe {
        let sub = ffi::api!(RedisModule_SubscribeToKeyspaceEvents);
        if sub(ctx.ctx, events::SUBSCRIBED, Some(events::on_keyspace_event))
            != raw::REDISMODULE_OK as c_int
        {
            return fail(ctx, "subscribing to keyspace events failed");
        }
        let flush = raw::RedisModuleEvent {
            id: raw::REDISMODULE_EVENT_FLUSHDB,
            dataver: 1,
        };
        ffi::api!(RedisModule_SubscribeToServerEvent)(ctx.ctx, flush, Some(events::on_flush));
        ffi::api!(RedisModule_RegisterInfoFunc)(ctx.ctx, Some(info::info_func));
    }
    Status::Ok
}

fn register_keyless(ctx: &Context, c: &Cmd) -> Result<(), String> {
    let name = std::ffi::CString::new(c.name).map_err(|e| e.to_string())?;
    let flags = std::ffi::CString::new(c.flags).map_err(|e| e.to_string())?;
    let ok = unsafe {
        ffi::api!(RedisModule_CreateCommand)(
            ctx.ctx,
            name.as_ptr(),
            Some(commands::debug),
            flags.as_ptr(),
            0,
            0,
            0,
        )
    };
    if ok != raw::REDISMODULE_OK as c_int {
        return Err(format!("creating {} failed", c.name));
    }
    Ok(())
}

#[cfg(not(test))]
redis_module::redis_module! {
    name: "lock",
    version: 1,
    allocator: (redis_module::alloc::RedisAlloc, redis_module::alloc::RedisAlloc),
    data_types: [],
    init: init,
}
