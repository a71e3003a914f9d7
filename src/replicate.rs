//! The one place that decides what the primary sends to replicas and the AOF. Only
//! deterministic commands go out: the full lock state with its absolute expiry and the
//! fence as issued, never a relative TTL or a server-generated random value.

use std::ffi::c_int;

use redis_module::raw;

use crate::core::LockState;
use crate::ffi::{api, Ctx, RStr};
use crate::state::FENCE;

/// A decimal number formatted on the stack. Sent with the `b` format rather than `l`,
/// it spares the server a number-to-string conversion per argument; the bytes on the
/// wire are the same.
struct Num {
    buf: [u8; 20],
    start: usize,
}

impl Num {
    fn new(v: i64) -> Num {
        let mut buf = [0u8; 20];
        let mut start = buf.len();
        let mut n = v.unsigned_abs();
        loop {
            start -= 1;
            buf[start] = b'0' + (n % 10) as u8;
            n /= 10;
            if n == 0 {
                break;
            }
        }
        if v < 0 {
            start -= 1;
            buf[start] = b'-';
        }
        Num { buf, start }
    }
    fn ptr(&self) -> *const u8 {
        self.buf[self.start..].as_ptr()
    }
    fn len(&self) -> usize {
        self.buf.len() - self.start
    }
}

/// The variadic `RedisModule_Replicate` and `RedisModule_EmitAOF` share their format
/// language; `emit` is either, bound to its first argument.
macro_rules! sync_command {
    ($emit:expr, $target:expr, $key:expr, $s:expr) => {{
        let s: &LockState = $s;
        let floor = FENCE.get().last();
        let cmd = c"LOCK.SYNC".as_ptr();
        let (tok, tlen) = (s.token.as_ptr(), s.token.len());
        let (addr, alen) = (s.client_addr.as_ptr(), s.client_addr.len());
        let fence = Num::new(s.fence as i64);
        let exp = Num::new(s.expires_at);
        let acq = Num::new(s.acquired_at);
        let cid = Num::new(s.client_id as i64);
        let (f, e, a, c) = (&fence, &exp, &acq, &cid);
        // The counter travels along when it is above this lock's fence (a renew with
        // MINFENCE raised it), so replicas and AOF replays learn it too.
        match (&s.owner, floor > s.fence) {
            (None, false) => $emit(
                $target,
                cmd,
                c"sbbbbbb".as_ptr(),
                $key,
                tok,
                tlen,
                f.ptr(),
                f.len(),
                e.ptr(),
                e.len(),
                a.ptr(),
                a.len(),
                c.ptr(),
                c.len(),
                addr,
                alen,
            ),
            (Some(o), false) => $emit(
                $target,
                cmd,
                c"sbbbbbbcb".as_ptr(),
                $key,
                tok,
                tlen,
                f.ptr(),
                f.len(),
                e.ptr(),
                e.len(),
                a.ptr(),
                a.len(),
                c.ptr(),
                c.len(),
                addr,
                alen,
                c"OWNER".as_ptr(),
                o.as_ptr(),
                o.len(),
            ),
            (None, true) => {
                let fl = Num::new(floor as i64);
                $emit(
                    $target,
                    cmd,
                    c"sbbbbbbcb".as_ptr(),
                    $key,
                    tok,
                    tlen,
                    f.ptr(),
                    f.len(),
                    e.ptr(),
                    e.len(),
                    a.ptr(),
                    a.len(),
                    c.ptr(),
                    c.len(),
                    addr,
                    alen,
                    c"FLOOR".as_ptr(),
                    fl.ptr(),
                    fl.len(),
                )
            }
            (Some(o), true) => {
                let fl = Num::new(floor as i64);
                $emit(
                    $target,
                    cmd,
                    c"sbbbbbbcbcb".as_ptr(),
                    $key,
                    tok,
                    tlen,
                    f.ptr(),
                    f.len(),
                    e.ptr(),
                    e.len(),
                    a.ptr(),
                    a.len(),
                    c.ptr(),
                    c.len(),
                    addr,
                    alen,
                    c"OWNER".as_ptr(),
                    o.as_ptr(),
                    o.len(),
                    c"FLOOR".as_ptr(),
                    fl.ptr(),
                    fl.len(),
                )
            }
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

#[cfg(test)]
mod tests {
    use super::Num;

    fn text(v: i64) -> String {
        let n = Num::new(v);
        String::from_utf8(n.buf[n.start..].to_vec()).unwrap()
    }

    #[test]
    fn numbers_format_like_std() {
        for v in [
            0,
            7,
            -7,
            10,
            1_883_234_272_951_664_640,
            i64::MAX,
            i64::MIN,
            -1,
        ] {
            assert_eq!(text(v), v.to_string());
        }
    }
}
