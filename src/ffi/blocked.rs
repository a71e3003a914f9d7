//! Typed handles for a blocked client and a timer. Each owns its server handle and the
//! heap data that travels with it, and the callbacks the server makes are turned back
//! into these types here.

use std::ffi::{c_int, c_void};
use std::marker::PhantomData;
use std::ptr;

use redis_module::raw;

use super::guard::catch;
use super::{api, Ctx, OK};

/// What a module does with its blocked clients; the server's callbacks call these.
pub trait BlockHandler: 'static {
    /// Travels from `unblock` to `reply` and `free`.
    type Reply: 'static;
    /// Writes the reply of a client unblocked with `reply` (None: unblocked with none).
    fn reply(ctx: Ctx<'_>, reply: Option<&Self::Reply>);
    /// `CLIENT UNBLOCK id TIMEOUT`: reply (on `ctx`) and unblock the client.
    fn timeout(ctx: Ctx<'_>, id: usize);
    /// The client went away or the server unblocked it (disconnect, CLIENT KILL,
    /// REPLICAOF, CLIENT UNBLOCK ERROR): unblock it.
    fn disconnected(ctx: Ctx<'_>, id: usize);
    /// The reply data is freed; `client_gone`: the client left before it was sent.
    fn free(ctx: Ctx<'_>, reply: Box<Self::Reply>, client_gone: bool);
}

/// A client blocked by this module. It must be unblocked exactly once: `unblock` does
/// it, and dropping an unblocked-never handle unblocks it with no reply data.
pub struct BlockedClient<H: BlockHandler> {
    raw: *mut raw::RedisModuleBlockedClient,
    _h: PhantomData<H>,
}

impl<H: BlockHandler> BlockedClient<H> {
    /// Blocks the calling client without a server-side timeout (the module times waits
    /// out itself). `with_timeout_cb`: whether `CLIENT UNBLOCK` may unblock it.
    pub fn block(ctx: Ctx<'_>, with_timeout_cb: bool) -> Self {
        let timeout: raw::RedisModuleCmdFunc = if with_timeout_cb {
            Some(timeout_cb::<H>)
        } else {
            None
        };
        // SAFETY: a command context; the callbacks are the monomorphised trampolines
        // below, which match the server's signatures.
        let bc = unsafe {
            api!(RedisModule_BlockClient)(
                ctx.raw(),
                Some(reply_cb::<H>),
                timeout,
                Some(free_cb::<H>),
                0,
            )
        };
        // SAFETY: a handle just returned by BlockClient.
        unsafe { api!(RedisModule_SetDisconnectCallback)(bc, Some(disconnect_cb::<H>)) };
        BlockedClient {
            raw: bc,
            _h: PhantomData,
        }
    }

    /// A stable identity while the client is blocked.
    pub fn id(&self) -> usize {
        self.raw as usize
    }

    /// Unblocks the client; `reply` reaches `H::reply` and then `H::free`.
    pub fn unblock(mut self, reply: Option<Box<H::Reply>>) {
        let data = reply.map_or(ptr::null_mut(), |b| Box::into_raw(b).cast::<c_void>());
        let bc = std::mem::replace(&mut self.raw, ptr::null_mut());
        // SAFETY: `bc` is a live handle not yet unblocked (taken out of `self`, so the
        // drop below does not unblock it again); the server owns `data` from now on and
        // hands it back to `free_cb`.
        unsafe { api!(RedisModule_UnblockClient)(bc, data) };
    }
}

impl<H: BlockHandler> Drop for BlockedClient<H> {
    fn drop(&mut self) {
        if !self.raw.is_null() {
            // SAFETY: a live handle that was never unblocked.
            unsafe { api!(RedisModule_UnblockClient)(self.raw, ptr::null_mut()) };
        }
    }
}

/// The reply and the timeout callbacks: `run` under `catch`, and `fallback` if it
/// panicked, so the client gets an answer either way.
fn answer(
    ctx: *mut raw::RedisModuleCtx,
    run: impl FnOnce(Ctx<'_>),
    fallback: impl FnOnce(Ctx<'_>),
) -> c_int {
    // SAFETY: the server passes a live context to both callbacks.
    let ctx = unsafe { Ctx::from_raw(ctx) };
    if catch(|| run(ctx)).is_none() {
        fallback(ctx);
    }
    OK
}

extern "C" fn reply_cb<H: BlockHandler>(
    ctx: *mut raw::RedisModuleCtx,
    _argv: *mut *mut raw::RedisModuleString,
    _argc: c_int,
) -> c_int {
    let reply = |ctx: Ctx<'_>| {
        // SAFETY: the private data is NULL or the `Box<H::Reply>` given to `unblock`,
        // which the server keeps until `free_cb`; only borrowed here.
        let reply = unsafe {
            let data = api!(RedisModule_GetBlockedClientPrivateData)(ctx.raw());
            data.cast::<H::Reply>().as_ref()
        };
        H::reply(ctx, reply)
    };
    answer(ctx, reply, |ctx| {
        ctx.reply_error(&crate::error::LockError::Internal("lock.acquire").to_string());
    })
}

extern "C" fn timeout_cb<H: BlockHandler>(
    ctx: *mut raw::RedisModuleCtx,
    _argv: *mut *mut raw::RedisModuleString,
    _argc: c_int,
) -> c_int {
    let timeout = |ctx: Ctx<'_>| {
        // SAFETY: the context of the timed-out client.
        let bc = unsafe { api!(RedisModule_GetBlockedClientHandle)(ctx.raw()) };
        H::timeout(ctx, bc as usize)
    };
    answer(ctx, timeout, |ctx| {
        ctx.reply_null();
    })
}

extern "C" fn disconnect_cb<H: BlockHandler>(
    ctx: *mut raw::RedisModuleCtx,
    bc: *mut raw::RedisModuleBlockedClient,
) {
    // SAFETY: the server passes a live context.
    let ctx = unsafe { Ctx::from_raw(ctx) };
    catch(|| H::disconnected(ctx, bc as usize));
}

extern "C" fn free_cb<H: BlockHandler>(ctx: *mut raw::RedisModuleCtx, data: *mut c_void) {
    if data.is_null() {
        return;
    }
    // SAFETY: the server passes a live context.
    let ctx = unsafe { Ctx::from_raw(ctx) };
    // SAFETY: same context.
    let gone = unsafe { api!(RedisModule_BlockedClientDisconnected)(ctx.raw()) } != 0;
    // SAFETY: non-null private data is always the `Box<H::Reply>` given to `unblock`,
    // handed back exactly once.
    let reply = unsafe { Box::from_raw(data.cast::<H::Reply>()) };
    catch(move || H::free(ctx, reply, gone));
}

// ---- timers -------------------------------------------------------------------------

struct Payload<T> {
    f: fn(Ctx<'_>, T),
    data: T,
}

/// A one-shot timer carrying `T` to its callback. Dropping the handle does not stop it;
/// `stop` does and gives the data back.
pub struct Timer<T: 'static> {
    id: raw::RedisModuleTimerID,
    _t: PhantomData<fn(T)>,
}

/// Longer delays are clamped: the server adds the delay in microseconds to its clock.
const MAX_DELAY_MS: i64 = 1 << 50;

impl<T: 'static> Timer<T> {
    pub fn start(ctx: Ctx<'_>, delay_ms: i64, f: fn(Ctx<'_>, T), data: T) -> Timer<T> {
        let p = Box::into_raw(Box::new(Payload { f, data }));
        // SAFETY: a valid context; the server owns `p` until the timer fires (`fire`
        // takes it back) or is stopped (`stop` takes it back).
        let id = unsafe {
            api!(RedisModule_CreateTimer)(
                ctx.raw(),
                delay_ms.clamp(0, MAX_DELAY_MS),
                Some(fire::<T>),
                p.cast(),
            )
        };
        Timer {
            id,
            _t: PhantomData,
        }
    }

    /// Stops the timer if it has not fired; returns its data then.
    pub fn stop(self, ctx: Ctx<'_>) -> Option<T> {
        let mut data: *mut c_void = ptr::null_mut();
        // SAFETY: a valid context and a timer id of ours.
        let ok = unsafe { api!(RedisModule_StopTimer)(ctx.raw(), self.id, &mut data) } == OK;
        if !ok || data.is_null() {
            return None;
        }
        // SAFETY: a stopped timer's data is the `Payload<T>` made in `start`, now ours.
        Some(unsafe { Box::from_raw(data.cast::<Payload<T>>()) }.data)
    }
}

extern "C" fn fire<T: 'static>(ctx: *mut raw::RedisModuleCtx, data: *mut c_void) {
    // SAFETY: the server passes a live context and the data given to CreateTimer, once.
    let (ctx, p) = unsafe { (Ctx::from_raw(ctx), Box::from_raw(data.cast::<Payload<T>>())) };
    let Payload { f, data } = *p;
    catch(move || f(ctx, data));
}
