//! The floor of a module-type acquire, for `make bench` (issue 21): one command,
//!
//! ```text
//! FLOOR.ACQUIRE key token ttl-ms     -> [token, fence], or nil when the key exists
//! ```
//!
//! that does only what a lock kept as a module value cannot avoid: open the key, store a
//! 64-byte module value, set the key's absolute expiry (none with `ttl-ms` 0, the floor
//! of a lease kept on the server's own clock) and reply `[token, fence]`. No digest, no
//! waiters, no replication. Built with the module's own crate (redis-module 2.0.8) and
//! its command table, so it loads on Redis 7.0 as well; bench-only, never shipped.

use std::cell::Cell;
use std::os::raw::c_void;

use redis_module::native_types::RedisType;
use redis_module::{raw, redis_module, Context, RedisError, RedisResult, RedisString, RedisValue};

/// What a grant stores: the token's first 16 bytes, then fence, deadline, grant time,
/// client id and four spare words: 64 bytes, the size of the module's own lock value.
#[allow(dead_code)] // stored as a lock would be; this module never reads it back
struct Floor {
    token: [u8; 16],
    words: [u64; 6],
}

static FLOOR_TYPE: RedisType = RedisType::new(
    "floorlock",
    0,
    raw::RedisModuleTypeMethods {
        version: raw::REDISMODULE_TYPE_METHOD_VERSION as u64,
        free: Some(free),
        // SAFETY: every other field is an optional callback (None when zeroed) or a
        // number (0: no aux_save triggers).
        ..unsafe { std::mem::zeroed() }
    },
);

unsafe extern "C" fn free(value: *mut c_void) {
    // SAFETY: every value of this type is a Box<Floor> made by `set_value`.
    drop(unsafe { Box::from_raw(value.cast::<Floor>()) });
}

thread_local! {
    static FENCE: Cell<u64> = const { Cell::new(0) };
}

fn acquire(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    let [_, key, token, ttl] = &args[..] else {
        return Err(RedisError::WrongArity);
    };
    let ttl = ttl.parse_integer()?;
    let (c, t) = (ctx.ctx, token.as_slice());
    let key = raw::open_key(c, key.inner, raw::KeyMode::WRITE);
    // SAFETY: module API calls on the main thread, on the key opened above (closed at the
    // end); the value is a Box<Floor>, the type's `free` frees it; the reply is written
    // here, whole, and the handler then answers NoReply.
    unsafe {
        if raw::RedisModule_KeyType.unwrap()(key) != raw::REDISMODULE_KEYTYPE_EMPTY as i32 {
            raw::close_key(key);
            return Ok(RedisValue::Null);
        }
        let fence = FENCE.with(|f| f.replace(f.get() + 1) + 1);
        let now = raw::RedisModule_Milliseconds.unwrap()();
        let client = raw::RedisModule_GetClientId.unwrap()(c);
        let mut value = Box::new(Floor {
            token: [0; 16],
            words: [fence, (now + ttl) as u64, now as u64, client, 0, 0],
        });
        let n = t.len().min(16);
        value.token[..n].copy_from_slice(&t[..n]);
        let ty = *FLOOR_TYPE.raw_type.borrow();
        raw::RedisModule_ModuleTypeSetValue.unwrap()(key, ty, Box::into_raw(value).cast());
        if ttl > 0 {
            raw::RedisModule_SetAbsExpire.unwrap()(key, now + ttl);
        }
        raw::close_key(key);
        raw::RedisModule_ReplyWithArray.unwrap()(c, 2);
        raw::RedisModule_ReplyWithStringBuffer.unwrap()(c, t.as_ptr().cast(), t.len());
        raw::RedisModule_ReplyWithLongLong.unwrap()(c, fence as i64);
    }
    Ok(RedisValue::NoReply)
}

redis_module! {
    name: "floor",
    version: 1,
    allocator: (redis_module::alloc::RedisAlloc, redis_module::alloc::RedisAlloc),
    data_types: [FLOOR_TYPE],
    commands: [
        ["floor.acquire", acquire, "write deny-oom", 1, 1, 1, ""],
    ],
}
