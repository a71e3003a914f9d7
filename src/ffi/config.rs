//! Numeric and yes/no module settings (`CONFIG GET/SET lock.*`, redis.conf lines).
//!
//! CONFIG SET calls every setter of the command first, then each distinct apply callback,
//! and rolls the whole command back if an apply fails. So the setters only store, and the
//! cross-check lives in `apply`.

use std::ffi::{c_char, c_int, c_longlong, c_void, CString};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::OnceLock;

use redis_module::raw;

use super::guard::catch;
use super::{api, Ctx, OK};

type Apply = fn() -> Result<(), String>;
static APPLY: OnceLock<Apply> = OnceLock::new();

extern "C" fn get_cb(_name: *const c_char, privdata: *mut c_void) -> c_longlong {
    // SAFETY: `privdata` is the `&'static AtomicI64` given to `register_numeric`.
    let cell = unsafe { &*privdata.cast::<AtomicI64>() };
    cell.load(Ordering::Relaxed)
}

extern "C" fn set_cb(
    _name: *const c_char,
    val: c_longlong,
    privdata: *mut c_void,
    _err: *mut *mut raw::RedisModuleString,
) -> c_int {
    // SAFETY: as in `get_cb`.
    let cell = unsafe { &*privdata.cast::<AtomicI64>() };
    cell.store(val, Ordering::Relaxed);
    OK
}

extern "C" fn apply_cb(
    _ctx: *mut raw::RedisModuleCtx,
    _privdata: *mut c_void,
    err: *mut *mut raw::RedisModuleString,
) -> c_int {
    let check = APPLY.get().copied();
    match catch(|| check.map_or(Ok(()), |f| f())) {
        Some(Ok(())) => OK,
        Some(Err(msg)) => {
            if !err.is_null() {
                // SAFETY: the server takes ownership of the error string it asked for.
                unsafe {
                    *err = api!(RedisModule_CreateString)(
                        std::ptr::null_mut(),
                        msg.as_ptr().cast(),
                        msg.len(),
                    );
                }
            }
            raw::REDISMODULE_ERR as c_int
        }
        None => raw::REDISMODULE_ERR as c_int,
    }
}

/// Registers `lock.<name>` backed by `cell`; `apply` cross-checks the settings after a
/// CONFIG SET (one function for all of them).
pub fn register_numeric(
    ctx: Ctx<'_>,
    name: &str,
    default: i64,
    min: i64,
    max: i64,
    cell: &'static AtomicI64,
    apply: Apply,
) -> Result<(), String> {
    let _ = APPLY.set(apply);
    let cname = CString::new(name).map_err(|e| e.to_string())?;
    // SAFETY: a load-time context; the callbacks match the server's signatures and
    // `cell` lives for the whole process.
    let ok = unsafe {
        api!(RedisModule_RegisterNumericConfig)(
            ctx.raw(),
            cname.as_ptr(),
            default,
            raw::REDISMODULE_CONFIG_DEFAULT,
            min,
            max,
            Some(get_cb),
            Some(set_cb),
            Some(apply_cb),
            (cell as *const AtomicI64).cast_mut().cast(),
        )
    };
    if ok != OK {
        return Err(format!("registering lock.{name} failed"));
    }
    Ok(())
}

extern "C" fn get_bool_cb(_name: *const c_char, privdata: *mut c_void) -> c_int {
    // SAFETY: `privdata` is the `&'static AtomicBool` given to `register_bool`.
    let cell = unsafe { &*privdata.cast::<AtomicBool>() };
    c_int::from(cell.load(Ordering::Relaxed))
}

extern "C" fn set_bool_cb(
    _name: *const c_char,
    val: c_int,
    privdata: *mut c_void,
    _err: *mut *mut raw::RedisModuleString,
) -> c_int {
    // SAFETY: as in `get_bool_cb`.
    let cell = unsafe { &*privdata.cast::<AtomicBool>() };
    cell.store(val != 0, Ordering::Relaxed);
    OK
}

/// Registers the yes/no setting `lock.<name>` backed by `cell`.
pub fn register_bool(
    ctx: Ctx<'_>,
    name: &str,
    default: bool,
    cell: &'static AtomicBool,
) -> Result<(), String> {
    let cname = CString::new(name).map_err(|e| e.to_string())?;
    // SAFETY: a load-time context; the callbacks match the server's signatures and
    // `cell` lives for the whole process.
    let ok = unsafe {
        api!(RedisModule_RegisterBoolConfig)(
            ctx.raw(),
            cname.as_ptr(),
            c_int::from(default),
            raw::REDISMODULE_CONFIG_DEFAULT,
            Some(get_bool_cb),
            Some(set_bool_cb),
            None,
            (cell as *const AtomicBool).cast_mut().cast(),
        )
    };
    if ok != OK {
        return Err(format!("registering lock.{name} failed"));
    }
    Ok(())
}

/// Applies redis.conf lines for the registered settings.
pub fn load_configs(ctx: Ctx<'_>) -> Result<(), String> {
    // SAFETY: a load-time context.
    if unsafe { api!(RedisModule_LoadConfigs)(ctx.raw()) } != OK {
        return Err("loading lock.* settings from the config failed".into());
    }
    Ok(())
}
