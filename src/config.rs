//! The module's settings: `lock.default-ttl`, `lock.max-ttl`, `lock.max-waiters`,
//! `lock.min-token-length`, `lock.lock-delay`, `lock.allow-eviction`, and the
//! `debug-commands` load-time switch. Settable with CONFIG SET, in redis.conf, and as
//! `loadmodule` arguments (`default-ttl 5000` or `lock.default-ttl 5000`). Also what the
//! server's eviction settings mean for locks.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU32, AtomicU8, Ordering};

use crate::args::Limits;
use crate::ffi::config::{load_configs, register_bool, register_numeric};
use crate::ffi::Ctx;
use crate::lock::fence::{LEGACY_SHIFT, SHIFT};
use crate::lock::value::MAX_TOKEN_LEN;
use crate::syntax::parse_i64;

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
/// The shortest TOKEN LOCK.ACQUIRE takes: a short token is a guessable secret (a 4-byte
/// one falls to pipelined RELEASE guesses in well under a second).
pub static MIN_TOKEN_LEN: Setting = Setting::new("min-token-length", 16, 1, MAX_TOKEN_LEN as i64);
/// The lock-delay of a grant that does not give LOCKDELAY (ms; 0: none).
pub static LOCK_DELAY: Setting = Setting::new("lock-delay", 0, 0, TEN_YEARS_MS);
pub static DEBUG_COMMANDS: AtomicBool = AtomicBool::new(false);
/// `lock.allow-eviction`: grant locks even where the eviction policy can take a held
/// one (it then acts as a DEL, and the lock may be granted again while its holder works).
pub static ALLOW_EVICTION: AtomicBool = AtomicBool::new(false);
/// `fence-shift` (a `loadmodule` argument only): 10, or 20 to keep the 0.1 release's
/// fence scale on a server that restarts without its data.
pub static FENCE_SHIFT: AtomicU32 = AtomicU32::new(SHIFT);
const SETTINGS: [&Setting; 5] = [
    &DEFAULT_TTL,
    &MAX_TTL,
    &MAX_WAITERS,
    &MIN_TOKEN_LEN,
    &LOCK_DELAY,
];

/// The policies that can evict a key without a Redis expiry (a lock has none: its lease
/// runs on the monotonic clock), by index; 0: none can. A policy the module does not
/// know is taken as one that can.
const EVICTING: [&str; 5] = [
    "",
    "allkeys-lru",
    "allkeys-lfu",
    "allkeys-random",
    "(neither noeviction nor volatile-*)",
];
static EVICTING_POLICY: AtomicU8 = AtomicU8::new(0);
/// The server evicts keys at all (`maxmemory` set, a policy other than `noeviction`): a
/// lock given a Redis expiry by hand can go under `volatile-*` too.
static EVICTS: AtomicBool = AtomicBool::new(false);

/// Which of [`EVICTING`] `policy` is with `maxmemory` bytes (0: no limit, nothing is
/// evicted; `noeviction` and the `volatile-*` policies only take keys with an expiry).
fn evicting(maxmemory: i64, policy: &str) -> u8 {
    if maxmemory <= 0 || policy == "noeviction" || policy.starts_with("volatile-") {
        return 0;
    }
    EVICTING[1..4]
        .iter()
        .position(|p| *p == policy)
        .map_or(4, |i| i as u8 + 1)
}

/// Records the server's eviction settings; the policy that can evict a held lock, if
/// any, and whether that is new.
pub fn set_eviction(maxmemory: i64, policy: &str) -> (Option<&'static str>, bool) {
    EVICTS.store(maxmemory > 0 && policy != "noeviction", Ordering::Relaxed);
    let now = evicting(maxmemory, policy);
    let before = EVICTING_POLICY.swap(now, Ordering::Relaxed);
    let name = (now != 0).then(|| EVICTING[now as usize]);
    (name, now != before)
}

/// Whether the server evicts keys at all (a lock only if it has a Redis expiry, under a
/// `volatile-*` policy).
pub fn evicts() -> bool {
    EVICTS.load(Ordering::Relaxed)
}

/// The policy that can evict a held lock, if any (whether or not it is allowed).
pub fn eviction_risk() -> Option<&'static str> {
    let i = EVICTING_POLICY.load(Ordering::Relaxed) as usize;
    (i != 0).then(|| EVICTING.get(i).copied().unwrap_or(EVICTING[4]))
}

/// The policy that makes the module refuse new grants (not allowed by the operator).
pub fn eviction_refusal() -> Option<&'static str> {
    if ALLOW_EVICTION.load(Ordering::Relaxed) {
        return None;
    }
    eviction_risk()
}

pub fn limits() -> Limits {
    Limits {
        default_ttl: DEFAULT_TTL.get().max(0) as u64,
        max_ttl: MAX_TTL.get().max(0) as u64,
        min_token_len: MIN_TOKEN_LEN.get().max(1) as usize,
    }
}

pub fn lock_delay() -> u32 {
    u32::try_from(LOCK_DELAY.get().max(0)).unwrap_or(u32::MAX)
}

pub fn debug_commands() -> bool {
    DEBUG_COMMANDS.load(Ordering::Relaxed)
}

pub fn max_waiters() -> u64 {
    MAX_WAITERS.get().max(0) as u64
}

fn cross_check(default_ttl: i64, max_ttl: i64, lock_delay: i64) -> Result<(), String> {
    if default_ttl > max_ttl {
        return Err(format!(
            "lock.default-ttl ({default_ttl}) must not exceed lock.max-ttl ({max_ttl})"
        ));
    }
    if lock_delay > max_ttl {
        return Err(format!(
            "lock.lock-delay ({lock_delay}) must not exceed lock.max-ttl ({max_ttl})"
        ));
    }
    Ok(())
}

fn check_all() -> Result<(), String> {
    cross_check(DEFAULT_TTL.get(), MAX_TTL.get(), LOCK_DELAY.get())
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
        if name.eq_ignore_ascii_case("fence-shift") {
            let shift = match *value {
                b"10" => SHIFT,
                b"20" => LEGACY_SHIFT,
                _ => return Err("fence-shift must be 10 or 20".into()),
            };
            FENCE_SHIFT.store(shift, Ordering::Relaxed);
            continue;
        }
        let switch = if name.eq_ignore_ascii_case("debug-commands") {
            Some((&DEBUG_COMMANDS, "debug-commands"))
        } else if name.eq_ignore_ascii_case("allow-eviction")
            || name.eq_ignore_ascii_case("lock.allow-eviction")
        {
            Some((&ALLOW_EVICTION, "allow-eviction"))
        } else {
            None
        };
        if let Some((cell, what)) = switch {
            match value.to_ascii_lowercase().as_slice() {
                b"yes" => cell.store(true, Ordering::Relaxed),
                b"no" => cell.store(false, Ordering::Relaxed),
                _ => return Err(format!("{what} must be yes or no")),
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
pub fn register(ctx: Ctx<'_>, overrides: &[(&'static Setting, i64)]) -> Result<(), String> {
    for s in SETTINGS {
        let default = overrides
            .iter()
            .rev()
            .find(|(o, _)| std::ptr::eq(*o, s))
            .map_or(s.default, |(_, v)| *v);
        register_numeric(ctx, s.name, default, s.min, s.max, &s.value, check_all)?;
    }
    let allow = ALLOW_EVICTION.load(Ordering::Relaxed);
    register_bool(ctx, "allow-eviction", allow, &ALLOW_EVICTION)?;
    load_configs(ctx)?;
    check_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn module_args() {
        let ok = parse_module_args(&[b"default-ttl", b"5000", b"lock.max-waiters", b"3"]).unwrap();
        assert_eq!(ok.len(), 2);
        let m = parse_module_args(&[b"min-token-length", b"8"]).unwrap();
        assert_eq!((m[0].0.name, m[0].1), ("min-token-length", 8));
        assert!(parse_module_args(&[b"min-token-length", b"0"]).is_err());
        assert!(parse_module_args(&[b"min-token-length", b"257"]).is_err());
        assert_eq!(ok[0].0.name, "default-ttl");
        assert_eq!(ok[0].1, 5000);
        assert_eq!(ok[1].1, 3);
        assert!(parse_module_args(&[b"bogus", b"1"]).is_err());
        assert!(parse_module_args(&[b"max-ttl"]).is_err());
        assert!(parse_module_args(&[b"max-ttl", b"0"]).is_err());
        assert!(parse_module_args(&[b"max-ttl", b"x"]).is_err());
        assert!(parse_module_args(&[b"debug-commands", b"maybe"]).is_err());
        assert!(parse_module_args(&[]).unwrap().is_empty());
        assert!(parse_module_args(&[b"fence-shift", b"15"]).is_err());
    }

    #[test]
    fn which_policies_can_evict_a_lock() {
        for p in ["allkeys-lru", "allkeys-lfu", "allkeys-random"] {
            assert_eq!(EVICTING[evicting(1 << 20, p) as usize], p);
            assert_eq!(evicting(0, p), 0, "{p} without maxmemory evicts nothing");
        }
        for p in [
            "noeviction",
            "volatile-lru",
            "volatile-lfu",
            "volatile-random",
            "volatile-ttl",
        ] {
            assert_eq!(evicting(1 << 20, p), 0, "{p}");
        }
        assert_eq!(evicting(1 << 20, "allkeys-something-new"), 4);
        let m = parse_module_args(&[b"allow-eviction", b"yes"]).unwrap();
        assert!(m.is_empty() && ALLOW_EVICTION.load(Ordering::Relaxed));
        assert!(parse_module_args(&[b"allow-eviction", b"maybe"]).is_err());
        ALLOW_EVICTION.store(false, Ordering::Relaxed);
    }

    #[test]
    fn cross_check_rule() {
        assert!(cross_check(5, 5, 0).is_ok());
        assert!(cross_check(6, 5, 0).is_err());
        assert!(cross_check(5, 5, 5).is_ok());
        assert!(cross_check(5, 5, 6).is_err());
    }
}
