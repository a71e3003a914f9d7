//! The cluster bus: messages between the module's instances on the nodes of a Redis
//! Cluster, this node's id, and the server's own view of the cluster (`CLUSTER NODES`).

use std::ffi::{c_char, c_uchar};
use std::sync::OnceLock;

use redis_module::raw;

use super::guard::catch;
use super::{api, api_opt, Ctx, OK};

/// A node id: 40 hex characters, not NUL-terminated.
pub type NodeId = [u8; 40];

pub type ReceiverFn = fn(Ctx<'_>, &NodeId, u8, &[u8]);
static RECEIVER: OnceLock<ReceiverFn> = OnceLock::new();

extern "C" fn receive_cb(
    ctx: *mut raw::RedisModuleCtx,
    sender: *const c_char,
    kind: u8,
    payload: *const c_uchar,
    len: u32,
) {
    let Some(f) = RECEIVER.get() else {
        return;
    };
    if sender.is_null() || (payload.is_null() && len > 0) {
        return;
    }
    // SAFETY: the server passes a live context, a sender id of exactly 40 bytes and
    // `len` payload bytes, all valid for the callback.
    let (ctx, id, data) = unsafe {
        let id: &NodeId = &*sender.cast::<NodeId>();
        let data = if len == 0 {
            &[][..]
        } else {
            std::slice::from_raw_parts(payload, len as usize)
        };
        (Ctx::from_raw(ctx), id, data)
    };
    catch(|| f(ctx, id, kind, data));
}

/// Receives messages of the given types on `f` (a no-op outside a cluster).
pub fn register(ctx: Ctx<'_>, kinds: &[u8], f: ReceiverFn) {
    let _ = RECEIVER.set(f);
    let Some(reg) = api_opt!(RedisModule_RegisterClusterMessageReceiver) else {
        return;
    };
    for &k in kinds {
        // SAFETY: a load-time context and a callback matching the server's signature.
        unsafe { reg(ctx.raw(), k, Some(receive_cb)) };
    }
}

/// Sends a message to one node, or to every node (`None`). False if it could not go.
pub fn send(ctx: Ctx<'_>, to: Option<&NodeId>, kind: u8, payload: &[u8]) -> bool {
    let (Some(f), Ok(len)) = (
        api_opt!(RedisModule_SendClusterMessage),
        u32::try_from(payload.len()),
    ) else {
        return false;
    };
    // The server finds the target by `strlen`: the id goes NUL-terminated (an id handed
    // to the receiver callback points into the message and is not, so an answer sent to
    // it never left on Redis).
    let mut id = [0u8; 41];
    let target = match to {
        Some(t) => {
            id[..40].copy_from_slice(t);
            id.as_ptr().cast::<c_char>()
        }
        None => std::ptr::null(),
    };
    // SAFETY: a valid context; the target is NULL or a NUL-terminated id; the payload is
    // copied before the call returns.
    unsafe { f(ctx.raw(), target, kind, payload.as_ptr().cast(), len) == OK }
}

/// This node's id (None outside a cluster).
pub fn my_id() -> Option<NodeId> {
    let f = api_opt!(RedisModule_GetMyClusterID)?;
    // SAFETY: no arguments; the server returns its own id (40 bytes) or NULL.
    let p = unsafe { f() };
    if p.is_null() {
        return None;
    }
    // SAFETY: a node name of at least 40 bytes owned by the server.
    let b = unsafe { std::slice::from_raw_parts(p.cast::<u8>(), 40) };
    b.try_into().ok()
}

/// The text of `CLUSTER NODES` as this node sees it.
pub fn nodes(ctx: Ctx<'_>) -> Option<String> {
    // SAFETY: a valid context; the format string takes one C string argument.
    let reply = unsafe {
        api!(RedisModule_Call)(
            ctx.raw(),
            c"CLUSTER".as_ptr(),
            c"c".as_ptr(),
            c"NODES".as_ptr(),
        )
    };
    if reply.is_null() {
        return None;
    }
    let mut len = 0usize;
    // SAFETY: a live reply; the pointer (if any) is valid until the reply is freed.
    let text = unsafe {
        let p = api!(RedisModule_CallReplyStringPtr)(reply, &mut len);
        (!p.is_null()).then(|| {
            String::from_utf8_lossy(std::slice::from_raw_parts(p.cast::<u8>(), len)).into_owned()
        })
    };
    // SAFETY: the reply returned above, freed once.
    unsafe { api!(RedisModule_FreeCallReply)(reply) };
    text
}

/// The keys of `slot` in the selected db (`CLUSTER GETKEYSINSLOT`).
pub fn keys_in_slot(ctx: Ctx<'_>, slot: usize) -> Vec<Vec<u8>> {
    let count = |sub: &std::ffi::CStr, n: i64| {
        // SAFETY: a valid context; the format takes a C string and two long longs.
        unsafe {
            api!(RedisModule_Call)(
                ctx.raw(),
                c"CLUSTER".as_ptr(),
                c"cll".as_ptr(),
                sub.as_ptr(),
                slot as std::ffi::c_longlong,
                n as std::ffi::c_longlong,
            )
        }
    };
    // SAFETY: a valid context; the format takes a C string and a long long.
    let n_reply = unsafe {
        api!(RedisModule_Call)(
            ctx.raw(),
            c"CLUSTER".as_ptr(),
            c"cl".as_ptr(),
            c"COUNTKEYSINSLOT".as_ptr(),
            slot as std::ffi::c_longlong,
        )
    };
    if n_reply.is_null() {
        return Vec::new();
    }
    // SAFETY: a live reply, freed once right after.
    let n = unsafe {
        let n = api!(RedisModule_CallReplyInteger)(n_reply);
        api!(RedisModule_FreeCallReply)(n_reply);
        n
    };
    if n <= 0 {
        return Vec::new();
    }
    let reply = count(c"GETKEYSINSLOT", n);
    if reply.is_null() {
        return Vec::new();
    }
    let mut keys = Vec::new();
    // SAFETY: a live array reply; each element and its string are valid until the reply
    // is freed, and are copied before that.
    unsafe {
        let len = api!(RedisModule_CallReplyLength)(reply);
        for i in 0..len {
            let e = api!(RedisModule_CallReplyArrayElement)(reply, i);
            if e.is_null() {
                continue;
            }
            let mut l = 0usize;
            let p = api!(RedisModule_CallReplyStringPtr)(e, &mut l);
            if !p.is_null() {
                keys.push(std::slice::from_raw_parts(p.cast::<u8>(), l).to_vec());
            }
        }
        api!(RedisModule_FreeCallReply)(reply);
    }
    keys
}
