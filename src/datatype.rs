//! The `redislock` data type: how a lock is saved in RDB files (and DUMP payloads),
//! rewritten into an AOF, digested, measured and freed. Values read from an RDB file or a
//! RESTORE payload are untrusted: they are validated and a bad one fails the load
//! cleanly.
//!
//! Encoding version 2 (this release) stores the token's digest, never the token:
//! ```text
//! mode (0 exclusive, 1 shared, 2 counted) [limit] holders
//! per holder: digest(16) fence expires-at acquired-at client-id client-addr has-owner [owner]
//! ```
//! Version 1 (release 0.1: one exclusive holder, its token in clear) still loads; the
//! token is turned into its digest on the way in.

use std::collections::HashSet;
use std::ffi::{c_int, c_void, CString};

use redis_module::raw;

use crate::args::{MAX_ADDR_LEN, MAX_FENCE, MAX_LIMIT, MAX_OWNER_LEN, MAX_TOKEN_LEN};
use crate::engine::fence::{clock_term, LEGACY_SHIFT, LOADED_FENCE_MAX_LEAD_MS};
use crate::engine::value::{digest, Addr, Holder, LockValue, ManyHolders, Mode};
use crate::ffi::guard::catch;
use crate::ffi::{self, api, Ctx, Str};
use crate::waiting::{observe_fence, with_engine};

/// Exactly nine characters, as the server requires. `TYPE key` shows it.
pub const TYPE_NAME: &str = "redislock";
pub const ENCODING_VERSION: c_int = 2;
/// Holders of one shared lock at most (a counted lock has at most its limit).
pub const MAX_HOLDERS: usize = MAX_LIMIT as usize;

pub fn create(ctx: Ctx<'_>) -> bool {
    let mut methods = raw::RedisModuleTypeMethods {
        // Version 4 is what Redis 7.0 knows (unlink2 and friends).
        version: 4,
        rdb_load: Some(rdb_load),
        rdb_save: Some(rdb_save),
        aof_rewrite: Some(aof_rewrite),
        mem_usage: Some(mem_usage),
        digest: Some(digest_cb),
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
    // SAFETY: a load-time context; the methods struct is copied by the server and the
    // callbacks below match its signatures.
    let t = unsafe {
        api!(RedisModule_CreateDataType)(ctx.raw(), name.as_ptr(), ENCODING_VERSION, &mut methods)
    };
    ffi::set_lock_type(t);
    !t.is_null()
}

/// The value behind a pointer the server hands to a type callback.
///
/// # Safety
/// `v` must be a live value of this type (made by `ffi::lock_into_raw` or `rdb_load`).
unsafe fn value<'a>(v: *const c_void) -> &'a LockValue {
    // SAFETY: caller's contract.
    unsafe { &*v.cast::<LockValue>() }
}

/// The highest fence a loaded value may carry (keeps a hostile value from exhausting the
/// counter; the 0.1 release's fences use the larger shift).
pub fn loaded_fence_ceiling() -> u64 {
    clock_term(
        ffi::now_ms().saturating_add(LOADED_FENCE_MAX_LEAD_MS),
        LEGACY_SHIFT,
    )
}

fn valid_holder(h: &Holder, ceiling: u64) -> bool {
    (1..=MAX_FENCE.min(ceiling)).contains(&h.fence)
        && h.owner()
            .is_none_or(|o| (1..=MAX_OWNER_LEN).contains(&o.len()))
        && h.addr().text_len() <= MAX_ADDR_LEN
        && h.client_id <= i64::MAX as u64
}

/// Checks a decoded value: the same rules as the command parser, consistent holders.
pub fn valid(v: &LockValue) -> bool {
    let ceiling = loaded_fence_ceiling();
    let hs = v.holders();
    if hs.is_empty() || !hs.iter().all(|h| valid_holder(h, ceiling)) {
        return false;
    }
    let fences: HashSet<u64> = hs.iter().map(|h| h.fence).collect();
    let digests: HashSet<_> = hs.iter().map(|h| h.digest).collect();
    if fences.len() != hs.len() || digests.len() != hs.len() {
        return false;
    }
    match v.mode() {
        Mode::Exclusive => hs.len() == 1,
        Mode::Shared => hs.len() <= MAX_HOLDERS,
        Mode::Counted(n) => (1..=MAX_LIMIT).contains(&n) && hs.len() <= n as usize,
    }
}

fn buf(rdb: *mut raw::RedisModuleIO, max: usize) -> Option<Vec<u8>> {
    let b = raw::load_string_buffer(rdb).ok()?;
    let b = b.as_ref();
    (b.len() <= max).then(|| b.to_vec())
}

fn load_owner(rdb: *mut raw::RedisModuleIO) -> Option<Option<Box<[u8]>>> {
    match raw::load_unsigned(rdb).ok()? {
        0 => Some(None),
        1 => Some(Some(buf(rdb, MAX_OWNER_LEN)?.into_boxed_slice())),
        _ => None,
    }
}

/// Fence, lease deadline and grant time: the same three fields in both encodings.
fn load_times(rdb: *mut raw::RedisModuleIO) -> Option<(u64, i64, i64)> {
    Some((
        raw::load_unsigned(rdb).ok()?,
        raw::load_signed(rdb).ok()?,
        raw::load_signed(rdb).ok()?,
    ))
}

/// Release 0.1: `token fence expires-at acquired-at has-owner [owner] client-id addr`.
fn load_v1(rdb: *mut raw::RedisModuleIO) -> Option<LockValue> {
    let token = buf(rdb, MAX_TOKEN_LEN)?;
    if token.is_empty() {
        return None;
    }
    let (fence, expires_at, acquired_at) = load_times(rdb)?;
    let owner = load_owner(rdb)?;
    let client_id = raw::load_unsigned(rdb).ok()?;
    let addr = Addr::parse(&buf(rdb, MAX_ADDR_LEN)?);
    let h = Holder::new(
        digest(&token),
        fence,
        expires_at,
        acquired_at,
        client_id,
        addr,
        owner,
    );
    Some(LockValue::Exclusive(h))
}

/// Version 2: `digest fence expires-at acquired-at client-id addr has-owner [owner]`.
fn load_holder(rdb: *mut raw::RedisModuleIO) -> Option<Holder> {
    let d = buf(rdb, 16)?;
    let digest: [u8; 16] = d.as_slice().try_into().ok()?;
    let (fence, expires_at, acquired_at) = load_times(rdb)?;
    let client_id = raw::load_unsigned(rdb).ok()?;
    let addr = Addr::parse(&buf(rdb, MAX_ADDR_LEN)?);
    let owner = load_owner(rdb)?;
    Some(Holder::new(
        digest,
        fence,
        expires_at,
        acquired_at,
        client_id,
        addr,
        owner,
    ))
}

fn load_v2(rdb: *mut raw::RedisModuleIO) -> Option<LockValue> {
    let mode = match raw::load_unsigned(rdb).ok()? {
        0 => Mode::Exclusive,
        1 => Mode::Shared,
        2 => {
            let n = u32::try_from(raw::load_unsigned(rdb).ok()?).ok()?;
            Mode::Counted(n)
        }
        _ => return None,
    };
    let n = usize::try_from(raw::load_unsigned(rdb).ok()?).ok()?;
    if n == 0 || n > MAX_HOLDERS {
        return None;
    }
    let first = load_holder(rdb)?;
    if mode == Mode::Exclusive {
        return (n == 1).then_some(LockValue::Exclusive(first));
    }
    let mut holders = Vec::with_capacity(n.min(1024));
    holders.push(first);
    for _ in 1..n {
        holders.push(load_holder(rdb)?);
    }
    Some(LockValue::Many(Box::new(ManyHolders { mode, holders })))
}

extern "C" fn rdb_load(rdb: *mut raw::RedisModuleIO, encver: c_int) -> *mut c_void {
    catch(|| {
        let v = match encver {
            1 => load_v1(rdb),
            2 => load_v2(rdb),
            _ => None,
        };
        match v {
            Some(v) if !raw::is_io_error(rdb) && valid(&v) => {
                let top = v.holders().iter().map(|h| h.fence).max().unwrap_or(0);
                observe_fence(top);
                ffi::lock_into_raw(v)
            }
            _ => std::ptr::null_mut(),
        }
    })
    .unwrap_or(std::ptr::null_mut())
}

fn save_holder(rdb: *mut raw::RedisModuleIO, h: &Holder) {
    raw::save_slice(rdb, &h.digest);
    raw::save_unsigned(rdb, h.fence);
    raw::save_signed(rdb, h.expires_at);
    raw::save_signed(rdb, h.acquired_at);
    raw::save_unsigned(rdb, h.client_id);
    raw::save_slice(rdb, h.addr().to_string().as_bytes());
    match h.owner() {
        Some(o) => {
            raw::save_unsigned(rdb, 1);
            raw::save_slice(rdb, o);
        }
        None => raw::save_unsigned(rdb, 0),
    }
}

extern "C" fn rdb_save(rdb: *mut raw::RedisModuleIO, v: *mut c_void) {
    catch(|| {
        // SAFETY: the server passes a live value of this type.
        let v = unsafe { value(v) };
        match v.mode() {
            Mode::Exclusive => raw::save_unsigned(rdb, 0),
            Mode::Shared => raw::save_unsigned(rdb, 1),
            Mode::Counted(n) => {
                raw::save_unsigned(rdb, 2);
                raw::save_unsigned(rdb, u64::from(n));
            }
        }
        raw::save_unsigned(rdb, v.holders().len() as u64);
        for h in v.holders() {
            save_holder(rdb, h);
        }
    });
}

/// Rewrites a lock as the LOCK.REPL commands the primary replicates.
extern "C" fn aof_rewrite(
    aof: *mut raw::RedisModuleIO,
    key: *mut raw::RedisModuleString,
    v: *mut c_void,
) {
    catch(|| {
        let counter = with_engine(|e| e.fence.last()).unwrap_or(0);
        // SAFETY: the server passes the key's name and its live value of this type.
        let (key, v) = unsafe { (Str::from_raw(key), value(v)) };
        crate::replication::rewrite(aof, key, v, counter);
    });
}

/// The fence counter goes into every RDB file (and AOF base and full-sync payload) as
/// the module's aux data, so that a restart from a snapshot taken after every lock was
/// released still continues above the last fence.
extern "C" fn aux_save(rdb: *mut raw::RedisModuleIO, when: c_int) {
    catch(|| {
        if when == raw::REDISMODULE_AUX_AFTER_RDB as c_int {
            let last = with_engine(|e| e.fence.last()).unwrap_or(0);
            raw::save_unsigned(rdb, last);
        }
    });
}

extern "C" fn aux_load(rdb: *mut raw::RedisModuleIO, encver: c_int, when: c_int) -> c_int {
    let ok = catch(|| {
        if !(1..=ENCODING_VERSION).contains(&encver)
            || when != raw::REDISMODULE_AUX_AFTER_RDB as c_int
        {
            return false;
        }
        let Ok(last) = raw::load_unsigned(rdb) else {
            return false;
        };
        if raw::is_io_error(rdb) || last > loaded_fence_ceiling().min(MAX_FENCE) {
            return false;
        }
        observe_fence(last);
        true
    });
    if ok == Some(true) {
        ffi::OK
    } else {
        raw::REDISMODULE_ERR as c_int
    }
}

extern "C" fn mem_usage(v: *const c_void) -> usize {
    catch(|| {
        // SAFETY: the server passes a live value of this type.
        let v = unsafe { value(v) };
        let many = match v {
            LockValue::Exclusive(_) => 0,
            LockValue::Many(m) => {
                std::mem::size_of::<ManyHolders>()
                    + m.holders.capacity() * std::mem::size_of::<Holder>()
            }
        };
        std::mem::size_of::<LockValue>()
            + many
            + v.holders().iter().map(Holder::extra_bytes).sum::<usize>()
    })
    .unwrap_or(0)
}

extern "C" fn digest_cb(md: *mut raw::RedisModuleDigest, v: *mut c_void) {
    catch(|| {
        // SAFETY: the server passes a live value of this type.
        let v = unsafe { value(v) };
        let add = api!(RedisModule_DigestAddStringBuffer);
        let add_ll = api!(RedisModule_DigestAddLongLong);
        let mode = crate::args::mode_text(v.mode());
        // SAFETY: a live digest context; the buffers outlive each call.
        unsafe {
            add(md, mode.as_ptr().cast(), mode.len());
            for h in v.holders() {
                add(md, h.digest.as_ptr().cast(), h.digest.len());
                add_ll(md, h.fence as i64);
                add_ll(md, h.expires_at);
                add_ll(md, h.acquired_at);
                if let Some(o) = h.owner() {
                    add(md, o.as_ptr().cast(), o.len());
                }
            }
            api!(RedisModule_DigestEndSequence)(md);
        }
    });
}

extern "C" fn free(v: *mut c_void) {
    catch(|| {
        if !v.is_null() {
            // SAFETY: the server gives up a value of this type, exactly once.
            drop(unsafe { ffi::lock_from_raw(v) });
        }
    });
}

/// Called when a lock key leaves the keyspace for any reason. Remembers which one, so
/// that the `expired`/`evicted` notification that follows can be counted as a lock's.
extern "C" fn unlink2(ctx: *mut raw::RedisModuleKeyOptCtx, _v: *const c_void) {
    catch(|| {
        // SAFETY: a live key-operation context; the name lives as long as it does.
        let (name, db) = unsafe {
            (
                Str::from_raw(api!(RedisModule_GetKeyNameFromOptCtx)(ctx).cast_mut()),
                api!(RedisModule_GetDbIdFromOptCtx)(ctx),
            )
        };
        crate::unlinked::note(db, name.bytes());
    });
}
