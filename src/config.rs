//! The module's settings: `lock.default-ttl`, `lock.max-ttl`, `lock.max-waiters`, and the
//! `debug-commands` load-time switch. Settable with CONFIG SET, in redis.conf, and as
//! `loadmodule` arguments (`default-ttl 5000` or `lock.default-ttl 5000`).

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};

use redis_module::configuration::{ConfigurationContext, ConfigurationFlags, ConfigurationValue};
use redis_module::{Context, RedisError};

use crate::args::{parse_i64, Limits};

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
/// Cross-checks between settings apply once loading is done: while the server loads,
/// they arrive one by one in no fixed order.
static READY: AtomicBool = AtomicBool::new(false);

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

impl ConfigurationValue<i64> for Setting {
    fn get(&self, _ctx: &ConfigurationContext) -> i64 {
        Setting::get(self)
    }
    fn set(&self, _ctx: &ConfigurationContext, val: i64) -> Result<(), RedisError> {
        if READY.load(Ordering::Relaxed) {
            let (d, m) = match self.name {
                "default-ttl" => (val, MAX_TTL.get()),
                "max-ttl" => (DEFAULT_TTL.get(), val),
                _ => (0, 0),
            };
            cross_check(d, m).map_err(RedisError::String)?;
        }
        self.value.store(val, Ordering::Relaxed);
        Ok(())
    }
}

fn setting(name: &[u8]) -> Option<&'static Setting> {
    let name = name.strip_prefix(b"lock.").unwrap_or(name);
    [&DEFAULT_TTL, &MAX_TTL, &MAX_WAITERS]
        .into_iter()
        .find(|s| s.name.as_bytes().eq_ignore_ascii_case(name))
}

/// Parses `loadmodule` arguments: `name value` pairs. Returns the values to use as
/// defaults (redis.conf lines and CONFIG SET still override them).
pub fn parse_module_args(args: &[&[u8]]) -> Result<Vec<(&'static Setting, i64)>, String> {
    let mut out = Vec::new();
    let mut it = args.chunks(2);
    for pair in &mut it {
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

/// Registers the settings with the server and loads redis.conf values for them.
pub fn register(ctx: &Context, overrides: &[(&'static Setting, i64)]) -> Result<(), String> {
    for s in [&DEFAULT_TTL, &MAX_TTL, &MAX_WAITERS] {
        let default = overrides
            .iter()
            .rev()
            .find(|(o, _)| std::ptr::eq(*o, s))
            .map_or(s.default, |(_, v)| *v);
        redis_module::configuration::register_i64_configuration(
            ctx,
            s.name,
            s,
            default,
            s.min,
            s.max,
            ConfigurationFlags::DEFAULT,
            None,
        );
    }
    if let Some(load) = unsafe { redis_module::raw::RedisModule_LoadConfigs } {
        if unsafe { load(ctx.ctx) } != redis_module::raw::REDISMODULE_OK as i32 {
            return Err("loading lock.* settings from the config failed".into());
        }
    }
    cross_check(DEFAULT_TTL.get(), MAX_TTL.get())?;
    READY.store(true, Ordering::Relaxed);
    Ok(())
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
