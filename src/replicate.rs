//! The one place that decides what the primary sends to replicas and the AOF. Only
//! deterministic commands go out: the full lock state with its absolute expiry and the
//! fence as issued, never a relative TTL or a server-generated random value.

use std::ffi::c_int;

use redis_module::raw;

use crate::core::LockState;
use crate::ffi::{api, Ctx, RStr};
use crate::state::FENCE;

/// The variadic `RedisModule_Replicate` and `RedisModule_EmitAOF` share their format
/// language; `emit` is either, bound to its first argument.
macro_rules! sync_command {
    ($emit:expr, $target:expr, $key:expr, $s:expr) => {{
        let s: &LockState = $s;
        let floor = FENCE.get().last();
        let cmd = c"LOCK.SYNC".as_ptr();
        let (tok, tlen) = (s.token.as_ptr(), s.token.len());
        let (addr, alen) = (s.client_addr.as_ptr(), s.client_addr.len());
        let (fence, exp, acq, cid) = (
            s.fence as i64,
            s.expires_at,
            s.acquired_at,
            s.client_id as i64,
        );
        // The counter travels along when it is above this lock's fence (a renew with
        // MINFENCE raised it), so replicas and AOF replays learn it too.
        match (&s.owner, floor > s.fence) {
            (None, false) => $emit(
                $target,
                cmd,
                c"sbllllb".as_ptr(),
                $key,
                tok,
                tlen,
                fence,
                exp,
                acq,
                cid,
                addr,
                alen,
            ),
            (Some(o), false) => $emit(
                $target,
                cmd,
                c"sbllllbcb".as_ptr(),
                $key,
                tok,
                tlen,
                fence,
                exp,
                acq,
                cid,
                addr,
                alen,
                c"OWNER".as_ptr(),
                o.as_ptr(),
                o.len(),
            ),
            (None, true) => $emit(
                $target,
                cmd,
                c"sbllllbcl".as_ptr(),
                $key,
                tok,
                tlen,
                fence,
                exp,
                acq,
                cid,
                addr,
                alen,
                c"FLOOR".as_ptr(),
                floor as i64,
            ),
            (Some(o), true) => $emit(
                $target,
                cmd,
                c"sbllllbcbcl".as_ptr(),
                $key,
                tok,
                tlen,
                fence,
                exp,
                acq,
                cid,
                addr,
                alen,
                c"OWNER".as_ptr(),
                o.as_ptr(),
                o.len(),
                c"FLOOR".as_ptr(),
                floor as i64,
            ),
        }
    }};
}

/// `LOCK.SYNC key token fence expires-at acquired-at client-id client-addr [OWNER o] [FLOOR n]`
pub fn state(ctx: Ctx, key: RStr, s: &LockState) {
    let rep = api!(RedisModule_Replicate);
    let _: c_int = unsafe { sync_command!(rep, ctx, key, s) };
}

/// The same command, written by an AOF rewrite for each held lock.
pub fn rewrite(aof: *mut raw::RedisModuleIO, key: RStr, s: &LockState) {
    let emit = api!(RedisModule_EmitAOF);
    unsafe { sync_command!(emit, aof, key, s) };
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
