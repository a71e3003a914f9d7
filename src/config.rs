//! The module's settings: `lock.default-ttl`, `lock.max-ttl`, `lock.max-waiters`, and the
//! `debug-commands` load-time switch. Settable with CONFIG SET, in redis.conf, and as
//! `loadmodule` arguments (`default-ttl 5000` or `lock.default-ttl 5000`).

use std::ffi::{c_char, c_int, c_longlong, c_void, CString};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};

use redis_module::raw;

use crate::args::{parse_i64, Limits};
use crate::ffi::{api, Ctx};
use crate::guard::catch;

pub struct Setting {
    pub name: &'static str,
    value: AtomicI64,
    pub default: i64,
    pub min: i64,
    pub max: i64,
}

impl Setting {
    const fn new(name: &'static str, default: i64, min: i64, max: i64) -> Self {
        Setting {
            name,
            value: AtomicI64::new(default),
            default,
            min,
            max,
        }
    }
    pub fn get(&self) -> i64 {
        self.value.load(Ordering::Relaxed)
    }
}

/// Ten years in ms: the largest lease we accept at all.
const TEN_YEARS_MS: i64 = 10 * 365 * 24 * 3600 * 1000;

pub static DEFAULT_TTL: Setting = Setting::new("default-ttl", 30_000, 1, TEN_YEARS_MS);
pub static MAX_TTL: Setting = Setting::new("max-ttl", 86_400_000, 1, TEN_YEARS_MS);
pub static MAX_WAITERS: Setting = Setting::new("max-waiters", 10_000, 1, 10_000_000);
pub static DEBUG_COMMANDS: AtomicBool = AtomicBool::new(false);
const SETTINGS: [&Setting; 3] = [&DEFAULT_TTL, &MAX_TTL, &MAX_WAITERS];

pub fn limits() -> Limits {
    Limits {
        default_ttl: DEFAULT_TTL.get().max(0) as u64,
        max_ttl: MAX_TTL.get().max(0) as u64,
    }
}

pub fn max_waiters() -> u64 {
    MAX_WAITERS.get().max(0) as u64
}

fn cross_check(default_ttl: i64, max_ttl: i64) -> Result<(), String> {
    if default_ttl > max_ttl {
        return Err(format!(
            "lock.default-ttl ({default_ttl}) must not exceed lock.max-ttl ({max_ttl})"
        ));
    }
    Ok(())
}

fn setting(name: &[u8]) -> Option<&'static Setting> {
    let name = name.strip_prefix(b"lock.").unwrap_or(name);
    SETTINGS
        .into_iter()
        .find(|s| s.name.as_bytes().eq_ignore_ascii_case(name))
}

/// Parses `loadmodule` arguments: `name value` pairs. Returns the values to use as
/// defaults (redis.conf lines and CONFIG SET still override them).
pub fn parse_module_args(args: &[&[u8]]) -> Result<Vec<(&'static Setting, i64)>, String> {
    let mut out = Vec::new();
    for pair in args.chunks(2) {
        let name = String::from_utf8_lossy(pair[0]).into_owned();
        let Some(value) = pair.get(1) else {
            return Err(format!("module argument '{name}' needs a value"));
        };
        if name.eq_ignore_ascii_case("debug-commands") {
            match value.to_ascii_lowercase().as_slice() {
                b"yes" => DEBUG_COMMANDS.store(true, Ordering::Relaxed),
                b"no" => DEBUG_COMMANDS.store(false, Ordering::Relaxed),
                _ => return Err("debug-commands must be yes or no".into()),
            }
            continue;
        }
        let s = setting(pair[0]).ok_or_else(|| format!("unknown module argument '{name}'"))?;
        let v = parse_i64(value)
            .filter(|v| (s.min..=s.max).contains(v))
            .ok_or_else(|| {
                format!(
                    "module argument '{name}' must be an integer from {} to {}",
                    s.min, s.max
                )
            })?;
        out.push((s, v));
    }
    Ok(out)
}

// ---- server callbacks ------------------------------------------------------------
// CONFIG SET calls every setter of the command first, then each distinct apply
// callback, and rolls the whole command back if an apply fails. So the setters only
// store, and the cross-check lives in `apply`: `CONFIG SET lock.max-ttl 1000
// lock.default-ttl 500` succeeds whatever the argument order.

extern "C" fn get_cb(_name: *const c_char, privdata: *mut c_void) -> c_longlong {
    catch(|| unsafe { &*privdata.cast::<Setting>() }.get()).unwrap_or(0)
}

extern "C" fn set_cb(
    _name: *const c_char,
    val: c_longlong,
    privdata: *mut c_void,
    _err: *mut *mut raw::RedisModuleString,
) -> c_int {
    catch(|| {
        unsafe { &*privdata.cast::<Setting>() }
            .value
            .store(val, Ordering::Relaxed)
    });
    raw::REDISMODULE_OK as c_int
}

extern "C" fn apply_cb(
    _ctx: Ctx,
    _privdata: *mut c_void,
    err: *mut *mut raw::RedisModuleString,
) -> c_int {
    match catch(|| cross_check(DEFAULT_TTL.get(), MAX_TTL.get())) {
        Some(Ok(())) => raw::REDISMODULE_OK as c_int,
        Some(Err(msg)) => {
            if !err.is_null() {
                let s = unsafe {
                    api!(RedisModule_CreateString)(
                        std::ptr::null_mut(),
                        msg.as_ptr().cast(),
                        msg.len(),
                    )
                };
                unsafe { *err = s };
            }
            raw::REDISMODULE_ERR as c_int
        }
        None => raw::REDISMODULE_ERR as c_int,
    }
}

/// Registers the settings with the server and loads redis.conf values for them.
pub fn register(ctx: Ctx, overrides: &[(&'static Setting, i64)]) -> Result<(), String> {
    for s in SETTINGS {
        let default = overrides
            .iter()
            .rev()
            .find(|(o, _)| std::ptr::eq(*o, s))
            .map_or(s.default, |(_, v)| *v);
        let name = CString::new(s.name).map_err(|e| e.to_string())?;
        let ok = unsafe {
            api!(RedisModule_RegisterNumericConfig)(
                ctx,
                name.as_ptr(),
                default,
                raw::REDISMODULE_CONFIG_DEFAULT,
                s.min,
                s.max,
                Some(get_cb),
                Some(set_cb),
                Some(apply_cb),
                (s as *const Setting).cast_mut().cast(),
            )
        };
        if ok != raw::REDISMODULE_OK as c_int {
            return Err(format!("registering lock.{} failed", s.name));
        }
    }
    if unsafe { api!(RedisModule_LoadConfigs)(ctx) } != raw::REDISMODULE_OK as c_int {
        return Err("loading lock.* settings from the config failed".into());
    }
    cross_check(DEFAULT_TTL.get(), MAX_TTL.get())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn module_args() {
        let ok = parse_module_args(&[b"default-ttl", b"5000", b"lock.max-waiters", b"3"]).unwrap();
        assert_eq!(ok.len(), 2);
        assert_eq!(ok[0].0.name, "default-ttl");
        assert_eq!(ok[0].1, 5000);
        assert_eq!(ok[1].1, 3);
        assert!(parse_module_args(&[b"bogus", b"1"]).is_err());
        assert!(parse_module_args(&[b"max-ttl"]).is_err());
        assert!(parse_module_args(&[b"max-ttl", b"0"]).is_err());
        assert!(parse_module_args(&[b"max-ttl", b"x"]).is_err());
        assert!(parse_module_args(&[b"debug-commands", b"maybe"]).is_err());
        assert!(parse_module_args(&[]).unwrap().is_empty());
    }

    #[test]
    fn cross_check_rule() {
        assert!(cross_check(5, 5).is_ok());
        assert!(cross_check(6, 5).is_err());
    }
}
