//! Leases across restarts (AOF, AOF after a rewrite, RDB): after SIGKILL and restart each
//! lock's `ttl` and a waiter's grant must not come before its holder's own deadline (sent
//! at + lease, on the client's monotonic clock). Details: docs/RELIABILITY.md.

use std::time::Duration;

use crate::common::*;

pub const TITLE: &str = "Leases across restarts (SIGKILL, restart from AOF and from RDB)";
pub const TARGET: &str =
    "0 leases ended before their holder's deadline after a restart (ttl and a waiter's grant), per persistence mode";

/// How much earlier than its holder's deadline a restored lease may end: whole ms.
const EARLY_MS: u64 = 2;
const MS: u64 = 1_000_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Aof,
    AofRewritten,
    Rdb,
}

/// Each mode, its name in the row and its server options.
const AOF: &str = "appendonly yes; appendfsync always";
const MODES: [(Mode, &str, &str); 3] = [
    (Mode::Aof, "AOF (appendfsync always)", AOF),
    (Mode::AofRewritten, "AOF after BGREWRITEAOF", AOF),
    (Mode::Rdb, "RDB (SAVE, then SIGKILL)", "appendonly no"),
];

#[derive(Debug, Default, Clone, serde::Serialize)]
struct Stats {
    mode: &'static str,
    restarts: u64,
    locks: u64,
    extended: u64,
    /// Locks missing after the restart.
    missing: u64,
    /// `ttl` after the restart ending before the holder's deadline (minus EARLY_MS).
    ttl_early: u64,
    /// Waiters granted before it; restored leases longer than asked for.
    granted_early: u64,
    too_long: u64,
    /// The least and most lateness (ms) of the waiters' grants and of the restored `ttl`'s
    /// end against the holders' deadlines.
    grant_late_ms: Option<(f64, f64)>,
    ttl_late_ms: Option<(f64, f64)>,
    examples: Vec<String>,
}

struct Lock {
    key: String,
    px: u64,
    /// The holder's own deadline (ns, client monotonic clock).
    deadline: u64,
}

/// The leases taken (ms).
fn px_range(short: bool) -> (u64, u64) {
    if short {
        (600, 1500)
    } else {
        (1000, 4000)
    }
}

fn ms(ns: i128) -> f64 {
    (ns as f64 / MS as f64 * 10.0).round() / 10.0
}

/// Widens `range` (ms) to the lateness `late` (ns) of a lease's end against its holder's
/// deadline; true (and an example) when it ended more than EARLY_MS early.
fn judge(range: &mut Option<(f64, f64)>, ex: &mut Vec<String>, late: i128, what: String) -> bool {
    let v = ms(late);
    *range = Some(range.map_or((v, v), |(lo, hi)| (lo.min(v), hi.max(v))));
    let early = late < -((EARLY_MS * MS) as i128);
    let e = || format!("{what} {:.1} ms before its holder's deadline", -v);
    if early {
        example(ex, 4, e);
    }
    early
}

fn restart_round(
    server: &mut Server,
    mode: Mode,
    r: u64,
    short: bool,
    rng: &mut Rng,
    st: &mut Stats,
) -> Result<(), String> {
    let n = if short { 12 } else { 24 };
    let mut c = connect(server)?;
    let mut locks = Vec::with_capacity(n);
    for i in 0..n {
        let key = format!("rel:lease:{mode:?}:{r}:{i}");
        let (lo, hi) = px_range(short);
        let px = rng.range(lo, hi);
        let t = format!("lease-{r:04}-{i:04}-holder");
        let sent = now_ns();
        grant(&mut c, &args!["LOCK.ACQUIRE", &key, "PX", px, "TOKEN", &t])?;
        let deadline = sent + px * MS;
        let mut lock = Lock { key, px, deadline };
        if rng.chance(30) {
            std::thread::sleep(Duration::from_millis(rng.range(1, 50)));
            let ext = rng.range(px / 2, px);
            let sent = now_ns();
            let rep = cmd(&mut c, &args!["LOCK.EXTEND", &lock.key, &t, "PX", ext])?;
            if rep != Reply::Int(1) {
                return Err(format!("extend of {} answered {rep:?}", lock.key));
            }
            (lock.px, lock.deadline) = (ext, sent + ext * MS);
            st.extended += 1;
        }
        locks.push(lock);
    }
    match mode {
        Mode::Rdb => drop(must(&mut c, &args!["SAVE"])?),
        Mode::AofRewritten => rewrite_aof(server, &mut c)?,
        Mode::Aof => {}
    }
    std::thread::sleep(Duration::from_millis(rng.range(0, 300)));
    drop(c);
    server.kill9();
    server.try_restart()?;
    st.restarts += 1;
    let mut c = connect(server)?;
    // Held, with a ttl that does not end before the holder's deadline.
    let mut live = Vec::new();
    for l in &locks {
        let info = cmd(&mut c, &args!["LOCK.INFO", &l.key])?;
        let done = now_ns();
        st.locks += 1;
        let Some(ttl) = info.get("ttl").and_then(|r| r.as_int()) else {
            if done < l.deadline {
                st.missing += 1;
                example(&mut st.examples, 4, || {
                    format!("{} missing after the restart", l.key)
                });
            }
            continue;
        };
        let ttl = ttl.max(0) as u64;
        if ttl > l.px {
            st.too_long += 1;
        }
        // The restored lease ends by `done` + ttl at the latest.
        let late = (done + ttl * MS) as i128 - l.deadline as i128;
        let what = format!("{}: ttl {ttl} ms after the restart ends", l.key);
        st.ttl_early += u64::from(judge(&mut st.ttl_late_ms, &mut st.examples, late, what));
        live.push(l);
    }
    // A waiter per lock: granted at the end of the lease, never before the deadline.
    let grants: Vec<Result<u64, String>> = std::thread::scope(|s| {
        let hs: Vec<_> = live
            .iter()
            .map(|l| {
                let server = &*server;
                s.spawn(move || -> Result<u64, String> {
                    let a = args!["LOCK.ACQUIRE", &l.key, "PX", 1000u64, "BLOCK", 10_000u64];
                    grant(&mut connect_for(server, 15)?, &a)?;
                    Ok(now_ns())
                })
            })
            .collect();
        joined(hs.into_iter().map(|h| h.join()))
    })?;
    for (l, g) in live.iter().zip(grants) {
        // Granted at or before `g`.
        let late = g? as i128 - l.deadline as i128;
        let what = format!("{}: a waiter was granted it", l.key);
        st.granted_early += u64::from(judge(&mut st.grant_late_ms, &mut st.examples, late, what));
    }
    Ok(())
}

fn run_mode(
    env: &Env,
    (mode, name, conf): (Mode, &'static str, &str),
    rng: &mut Rng,
) -> Result<Stats, String> {
    let dir = format!("leases-{}-{mode:?}", env.server_name()).to_lowercase();
    let mut server = env.start_with(&dir, conf)?;
    let mut st = Stats {
        mode: name,
        ..Stats::default()
    };
    let rounds = env.n(4.0, 1.0);
    for r in 0..rounds {
        restart_round(&mut server, mode, r, env.short, rng, &mut st)
            .map_err(|e| format!("{name} round {r}: {e}"))?;
    }
    health(&server, "the server")?;
    Ok(st)
}

pub fn run(env: &Env, o: &mut Outcome) -> Result<(), String> {
    let mut rng = Rng::new(env.seed ^ 0x6c65_6173);
    let mut modes = Vec::new();
    for mode in MODES {
        let st = run_mode(env, mode, &mut rng)?;
        let (name, missing, ttl, granted) = (st.mode, st.missing, st.ttl_early, st.granted_early);
        o.fail_if(
            missing + ttl + granted > 0,
            format!("{name}: {missing} missing, {ttl} ttl early, {granted} granted early"),
        );
        let long = st.too_long;
        o.fail_if(
            long > 0,
            format!("{name}: {long} restored leases longer than asked for"),
        );
        modes.push(st);
    }
    o.put("early_ms", EARLY_MS);
    o.put("px_ms", px_range(env.short));
    o.put("modes", modes);
    Ok(())
}
