//! The `redislock` data type: a held module lock as stored in a key, with its RDB,
//! AOF-rewrite, digest and memory callbacks. Values read from an RDB file or a
//! RESTORE payload are untrusted and validated before use.

use std::ffi::{c_int, c_void, CString};
use std::sync::atomic::Ordering;

use redis_module::raw;

use crate::args::{MAX_FENCE, MAX_OWNER_LEN, MAX_TOKEN_LEN};
use crate::core::{fence_ceiling, LockState, LOADED_FENCE_MAX_LEAD_MS};
use crate::ffi::{api, Ctx};
use crate::guard::catch;
use crate::info::LIVE_LOCKS;
use crate::state::{observe_fence, LOCK_TYPE};

/// Exactly nine characters, as the server requires. `TYPE key` shows it.
pub const TYPE_NAME: &str = "redislock";
pub const ENCODING_VERSION: c_int = 1;
/// Longest client address kept (IPv6 text plus port, with room to spare).
const MAX_ADDR_LEN: usize = 128;

/// Moves a state into a heap value the server owns.
pub fn into_raw(state: LockState) -> *mut c_void {
    LIVE_LOCKS.fetch_add(1, Ordering::Relaxed);
    Box::into_raw(Box::new(state)).cast()
}

/// # Safety
/// `v` must be a pointer made by `into_raw` and still owned by the server.
pub unsafe fn as_state<'a>(v: *mut c_void) -> &'a mut LockState {
    &mut *v.cast::<LockState>()
}

pub fn create(ctx: Ctx) -> bool {
    let methods = raw::RedisModuleTypeMethods {
        // Version 4 is what Redis 7.0 knows (unlink2 and friends).
        version: 4,
        rdb_load: Some(rdb_load),
        rdb_save: Some(rdb_save),
        aof_rewrite: Some(aof_rewrite),
        mem_usage: Some(mem_usage),
        digest: Some(digest),
        free: Some(free),
        aux_load: Some(aux_load),
        aux_save: Some(aux_save),
        aux_save_triggers: raw::REDISMODULE_AUX_AFTER_RDB as c_int,
        free_effort: None,
        unlink: None,
        copy: None,
        defrag: None,
        mem_usage2: None,
        free_effort2: None,
        unlink2: Some(unlink2),
        copy2: None,
        aux_save2: None,
    };
    let Ok(name) = CString::new(TYPE_NAME) else {
        return false;
    };
    let mut m = methods;
    let t =
        unsafe { api!(RedisModule_CreateDataType)(ctx, name.as_ptr(), ENCODING_VERSION, &mut m) };
    LOCK_TYPE.store(t, Ordering::Relaxed);
    !t.is_null()
}

/// Checks a decoded value; the same rules as the command parser, and a fence no
/// further ahead of the clock than `LOADED_FENCE_MAX_LEAD_MS`.
pub fn valid(s: &LockState) -> bool {
    let ceiling = fence_ceiling(crate::ffi::now_ms(), LOADED_FENCE_MAX_LEAD_MS);
    (1..=MAX_TOKEN_LEN).contains(&s.token.len())
        && (1..=MAX_FENCE.min(ceiling)).contains(&s.fence)
        && s.owner
            .as_ref()
            .is_none_or(|o| (1..=MAX_OWNER_LEN).contains(&o.len()))
        && s.client_addr.len() <= MAX_ADDR_LEN
        && s.client_id <= i64::MAX as u64
}

fn load(rdb: *mut raw::RedisModuleIO) -> Option<LockState> {
    let buf = |rdb| {
        raw::load_string_buffer(rdb)
            .ok()
            .map(|b| b.as_ref().to_vec())
    };
    let token = buf(rdb)?;
    let fence = raw::load_unsigned(rdb).ok()?;
    let expires_at = raw::load_signed(rdb).ok()?;
    let acquired_at = raw::load_signed(rdb).ok()?;
    let has_owner = raw::load_unsigned(rdb).ok()?;
    let owner = match has_owner {
        0 => None,
        1 => Some(buf(rdb)?),
        _ => return None,
    };
    let client_id = raw::load_unsigned(rdb).ok()?;
    let client_addr = buf(rdb)?;
    let s = LockState {
        token,
        fence,
        expires_at,
        acquired_at,
        owner,
        client_id,
        client_addr,
    };
    valid(&s).then_some(s)
}

extern "C" fn rdb_load(rdb: *mut raw::RedisModuleIO, encver: c_int) -> *mut c_void {
    catch(|| {
        if encver != ENCODING_VERSION {
            return std::ptr::null_mut();
        }
        match load(rdb) {
            Some(s) if !raw::is_io_error(rdb) => {
                observe_fence(s.fence);
                into_raw(s)
            }
            _ => std::ptr::null_mut(),
        }
    })
    .unwrap_or(std::ptr::null_mut())
}

extern "C" fn rdb_save(rdb: *mut raw::RedisModuleIO, value: *mut c_void) {
    catch(|| {
        let s = unsafe { as_state(value) };
        raw::save_slice(rdb, &s.token);
        raw::save_unsigned(rdb, s.fence);
        raw::save_signed(rdb, s.expires_at);
        raw::save_signed(rdb, s.acquired_at);
        match &s.owner {
            Some(o) => {
                raw::save_unsigned(rdb, 1);
                raw::save_slice(rdb, o);
            }
            None => raw::save_unsigned(rdb, 0),
        }
        raw::save_unsigned(rdb, s.client_id);
        raw::save_slice(rdb, &s.client_addr);
    });
}

/// Rewrites a lock as the same `LOCK.SYNC` command the primary replicates.
extern "C" fn aof_rewrite(
    aof: *mut raw::RedisModuleIO,
    key: *mut raw::RedisModuleString,
    value: *mut c_void,
) {
    catch(|| crate::replicate::rewrite(aof, key, unsafe { as_state(value) }));
}

/// The fence counter goes into every RDB file (and AOF base and full-sync payload) as
/// the module's aux data, so that a restart from a snapshot taken after every lock was
/// released still continues above the last fence, even if the clock went back.
extern "C" fn aux_save(rdb: *mut raw::RedisModuleIO, when: c_int) {
    catch(|| {
        if when == raw::REDISMODULE_AUX_AFTER_RDB as c_int {
            raw::save_unsigned(rdb, crate::state::FENCE.get().last());
        }
    });
}

extern "C" fn aux_load(rdb: *mut raw::RedisModuleIO, encver: c_int, when: c_int) -> c_int {
    let ok = catch(|| {
        if encver != ENCODING_VERSION || when != raw::REDISMODULE_AUX_AFTER_RDB as c_int {
            return false;
        }
        let Ok(last) = raw::load_unsigned(rdb) else {
            return false;
        };
        let ceiling = fence_ceiling(crate::ffi::now_ms(), LOADED_FENCE_MAX_LEAD_MS);
        if raw::is_io_error(rdb) || last > ceiling.min(MAX_FENCE) {
            return false;
        }
        observe_fence(last);
        true
    });
    if ok == Some(true) {
        raw::REDISMODULE_OK as c_int
    } else {
        raw::REDISMODULE_ERR as c_int
    }
}

extern "C" fn mem_usage(value: *const c_void) -> usize {
    catch(|| {
        let s = unsafe { &*value.cast::<LockState>() };
        std::mem::size_of::<LockState>()
            + s.token.capacity()
            + s.owner.as_ref().map_or(0, |o| o.capacity())
            + s.client_addr.capacity()
    })
    .unwrap_or(0)
}

extern "C" fn digest(md: *mut raw::RedisModuleDigest, value: *mut c_void) {
    catch(|| {
        let s = unsafe { as_state(value) };
        let add = api!(RedisModule_DigestAddStringBuffer);
        let add_ll = api!(RedisModule_DigestAddLongLong);
        unsafe {
            add(md, s.token.as_ptr().cast(), s.token.len());
            add_ll(md, s.fence as i64);
            add_ll(md, s.expires_at);
            add_ll(md, s.acquired_at);
            if let Some(o) = &s.owner {
                add(md, o.as_ptr().cast(), o.len());
            }
            api!(RedisModule_DigestEndSequence)(md);
        }
    });
}

extern "C" fn free(value: *mut c_void) {
    catch(|| {
        if !value.is_null() {
            drop(unsafe { Box::from_raw(value.cast::<LockState>()) });
            LIVE_LOCKS.fetch_sub(1, Ordering::Relaxed);
        }
    });
}

/// Called when a lock key leaves the keyspace for any reason. Remembers which one, so
/// that the `expired`/`evicted` notification that follows can be counted as a lock's.
extern "C" fn unlink2(ctx: *mut raw::RedisModuleKeyOptCtx, _value: *const c_void) {
    catch(|| {
        let name = unsafe { api!(RedisModule_GetKeyNameFromOptCtx)(ctx) };
        let db = unsafe { api!(RedisModule_GetDbIdFromOptCtx)(ctx) };
        crate::events::note_unlinked(db, crate::ffi::bytes(name.cast_mut()));
    });
}

/// Frees a value the server did not take ownership of.
///
/// # Safety
/// `v` must come from `into_raw` and must not be owned by any key.
pub unsafe fn free_unowned(v: *mut c_void) {
    free(v);
}
