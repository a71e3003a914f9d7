//! The one place that decides what the primary sends to replicas and the AOF. Only
//! deterministic commands go out: the full lock state with its absolute expiry and the
//! fence as issued, never a relative TTL or a server-generated random value.

use crate::core::LockState;
use crate::ffi::{api, Ctx, RStr};

/// `LOCK.SYNC key token fence expires-at acquired-at client-id client-addr [owner]`
pub fn state(ctx: Ctx, key: RStr, s: &LockState) {
    let rep = api!(RedisModule_Replicate);
    let cmd = c"LOCK.SYNC";
    unsafe {
        match &s.owner {
            Some(o) => rep(
                ctx,
                cmd.as_ptr(),
                c"sbllllbb".as_ptr(),
                key,
                s.token.as_ptr(),
                s.token.len(),
                s.fence as i64,
                s.expires_at,
                s.acquired_at,
                s.client_id as i64,
                s.client_addr.as_ptr(),
                s.client_addr.len(),
                o.as_ptr(),
                o.len(),
            ),
            None => rep(
                ctx,
                cmd.as_ptr(),
                c"sbllllb".as_ptr(),
                key,
                s.token.as_ptr(),
                s.token.len(),
                s.fence as i64,
                s.expires_at,
                s.acquired_at,
                s.client_id as i64,
                s.client_addr.as_ptr(),
                s.client_addr.len(),
            ),
        };
    }
}

/// A release or forced release: the key is gone.
pub fn delete(ctx: Ctx, key: RStr) {
    unsafe { api!(RedisModule_Replicate)(ctx, c"DEL".as_ptr(), c"s".as_ptr(), key) };
}

/// An extend of a classic string lock: its new absolute deadline.
pub fn expire_at(ctx: Ctx, key: RStr, at_ms: i64) {
    unsafe { api!(RedisModule_Replicate)(ctx, c"PEXPIREAT".as_ptr(), c"sl".as_ptr(), key, at_ms) };
}

/// LOCK.SYNC re-sends itself so a replica's own AOF records what its primary sent.
pub fn verbatim(ctx: Ctx) {
    unsafe { api!(RedisModule_ReplicateVerbatim)(ctx) };
}
