//! Sessions under kill -9: holder processes (this binary, `session-holder`) each open a
//! session, take their locks in it and keep it alive; other clients wait on every key
//! with `BLOCK`; then every holder is SIGKILLed. Each lock must reach a waiter when the
//! session ends, never before: its lease (the holder's last acknowledged keepalive + TTL)
//! or, bound to the connection (`BIND grace`), the grace after the kill.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use crate::common::*;

pub const TITLE: &str = "Sessions: kill -9 of the holders (session lease, BIND grace)";
pub const TARGET: &str = "every lock of a killed holder granted to a waiter, never before its session ended and at most TTL (or grace) + 500 ms after the kill; 0 double grants, 0 fence regressions";

/// How much later than the session's end a waiter may be granted (the server's timer,
/// then a reply read by one of 400 client threads on a shared 2-core machine: 261 ms was
/// seen once on Valkey 8.1.8 with the machine's load average at 9).
const LATE_MS: u64 = 500;
/// How late in the short run (`make test`), on a loaded 2-core machine where a reply can
/// be read 1-2 s late; the faults caught there on that side are locks never handed on or
/// held to the end of a session that was kept alive.
const LATE_MS_SHORT: u64 = 2_000;
/// How much earlier than the session's end a grant may come: the server counts whole ms.
const EARLY_MS: u64 = 2;
/// Waiters per key: the first is granted when the session ends, the second after the
/// first releases (a grant to both at once is a double grant).
const WAITERS: usize = 2;
const MS: u64 = 1_000_000;

/// CLOCK_MONOTONIC in ns: one clock for the holder processes and this one.
fn mono_ns() -> u64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec of ours it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut t) };
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// The holder process: `session-holder ADDR ID TTL GRACE PREFIX N` (GRACE 0: no BIND).
/// Prints `K t` after each acknowledged OPEN or KEEPALIVE sent at `t` (mono_ns), `G key
/// fence` per lock, `READY`; keeps the session alive every TTL/3 until killed, or until
/// its stdin closes (the parent is gone).
pub fn holder_main(a: &[String]) -> ExitCode {
    std::thread::spawn(|| {
        let _ = std::io::copy(&mut std::io::stdin(), &mut std::io::sink());
        std::process::exit(0);
    });
    match holder(a) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            println!("ERROR {e}");
            ExitCode::from(1)
        }
    }
}

fn holder(a: &[String]) -> Result<(), String> {
    let [addr, id, ttl, grace, prefix, n] = a else {
        return Err("usage: session-holder ADDR ID TTL GRACE PREFIX N".into());
    };
    let addr: SocketAddr = addr.parse().map_err(|_| "bad address")?;
    let (ttl, grace, n): (u64, u64, u64) = match (ttl.parse(), grace.parse(), n.parse()) {
        (Ok(t), Ok(g), Ok(n)) => (t, g, n),
        _ => return Err("bad number".into()),
    };
    let mut c = open(addr, Duration::from_secs(5), Duration::from_secs(5))?;
    let mut open_cmd = args!["LOCK.SESSION", "OPEN", id, "PX", ttl];
    if grace > 0 {
        open_cmd.extend(args!["BIND", grace]);
    }
    let t = mono_ns();
    let r = cmd(&mut c, &open_cmd)?;
    if r != Reply::Int(1) {
        return Err(format!("OPEN answered {r:?}"));
    }
    println!("K {t}");
    for i in 0..n {
        let key = format!("{prefix}:{i}");
        let (_, fence) = grant(&mut c, &args!["LOCK.ACQUIRE", &key, "SESSION", id])?;
        println!("G {key} {fence}");
    }
    println!("READY");
    loop {
        std::thread::sleep(Duration::from_millis(ttl / 3));
        let t = mono_ns();
        let r = cmd(&mut c, &args!["LOCK.SESSION", "KEEPALIVE", id])?;
        if r != Reply::Int(1) {
            return Err(format!("KEEPALIVE answered {r:?}"));
        }
        println!("K {t}");
    }
}

/// A variant: its name, the session's lease, the BIND grace (0: none).
type Variant = (&'static str, u64, u64);

fn variants(short: bool) -> [Variant; 2] {
    match short {
        false => [("lease", 2000, 0), ("BIND", 10_000, 1000)],
        true => [("lease", 1000, 0), ("BIND", 10_000, 500)],
    }
}

#[derive(Debug, Default, Clone, serde::Serialize)]
struct Stats {
    name: &'static str,
    ttl_ms: u64,
    grace_ms: u64,
    rounds: u64,
    locks: u64,
    /// Locks whose first waiter was granted them, and waiters granted in all.
    granted: u64,
    waiter_grants: u64,
    /// Waiters never granted (BLOCK timed out or an error).
    never: u64,
    early: u64,
    late: u64,
    double_grants: u64,
    fence_regressions: u64,
    /// Sessions still open (LOCK.SESSION INFO) once their locks were granted.
    sessions_left: u64,
    /// Kill to the first waiter's grant (ms): min, p50, max.
    kill_to_grant_ms: (f64, f64, f64),
    /// The first grant against the session's end as the client knows it (ms; below 0:
    /// early): lease: last acknowledged keepalive's send + TTL; BIND: kill + grace.
    vs_end_ms: Option<(f64, f64)>,
    examples: Vec<String>,
}

struct KillOnDrop(Child);
impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A holder after the kill: its kill time, its last acknowledged keepalive's send time,
/// its locks (key, fence).
struct Killed {
    id: String,
    kill: u64,
    last_k: u64,
    locks: Vec<(String, u64)>,
}

/// A waiter's grant: when read, its fence, when its release was sent.
type WaiterGrant = (u64, u64, u64);

fn waiter(server: &Server, key: &str, block_ms: u64) -> Result<WaiterGrant, String> {
    let mut c = connect_for(server, block_ms / 1000 + 10)?;
    let a = args!["LOCK.ACQUIRE", key, "PX", 10_000u64, "BLOCK", block_ms];
    let (token, fence) = grant(&mut c, &a)?;
    let got = mono_ns();
    std::thread::sleep(Duration::from_millis(3));
    let rel = mono_ns();
    let r = cmd(&mut c, &args!["LOCK.RELEASE", key, &token])?;
    if r != Reply::Int(1) {
        return Err(format!("{key}: the waiter's release answered {r:?}"));
    }
    Ok((got, fence, rel))
}

fn ms(ns: i128) -> f64 {
    (ns as f64 / MS as f64 * 10.0).round() / 10.0
}

fn round(
    env: &Env,
    server: &Server,
    (name, ttl, grace): Variant,
    r: u64,
    rng: &mut Rng,
    st: &mut Stats,
    kill_to_grant: &mut Vec<f64>,
) -> Result<(), String> {
    let (holders, per) = if env.short { (4, 3) } else { (20, 10) };
    let addr = server.socket_addr().to_string();
    let mut children = Vec::new();
    let (ready_tx, ready_rx) = mpsc::channel();
    let mut readers = Vec::new();
    for h in 0..holders {
        let id = format!("sess-{name}-{r:02}-{h:02}-{:016x}", rng.next_u64());
        let prefix = format!("rel:sess:{name}:{r}:{h}");
        let child = Command::new(&env.exe)
            .arg("session-holder")
            .args([&addr, &id, &ttl.to_string(), &grace.to_string(), &prefix])
            .arg(per.to_string())
            .stdout(Stdio::piped())
            .stdin(Stdio::piped())
            .spawn()
            .map_err(|e| format!("spawn holder: {e}"))?;
        let mut child = KillOnDrop(child);
        let out = child.0.stdout.take().ok_or("no stdout")?;
        let tx = ready_tx.clone();
        readers.push(std::thread::spawn(move || {
            let mut lines = Vec::new();
            for l in BufReader::new(out).lines().map_while(Result::ok) {
                if l == "READY" || l.starts_with("ERROR") {
                    let _ = tx.send(l.clone());
                }
                lines.push(l);
            }
            lines
        }));
        children.push((id, child));
    }
    for _ in 0..holders {
        match ready_rx.recv_timeout(Duration::from_secs(30)) {
            Ok(l) if l == "READY" => {}
            Ok(l) => return Err(format!("a holder: {l}")),
            Err(_) => return Err("a holder was not ready within 30 s".into()),
        }
    }
    let keys: Vec<String> = (0..holders)
        .flat_map(|h| (0..per).map(move |i| format!("rel:sess:{name}:{r}:{h}:{i}")))
        .collect();
    let block_ms = ttl.max(grace) + 20_000;
    let mut ctl = connect(server)?;
    let (results, killed) = std::thread::scope(|s| -> Result<_, String> {
        let hs: Vec<_> = (keys.iter())
            .flat_map(|k| (0..WAITERS).map(move |_| k))
            .map(|k| s.spawn(move || waiter(server, k, block_ms)))
            .collect();
        // Every waiter queued before the kill.
        let want = (keys.len() * WAITERS).to_string();
        let queued = || server.info_field("clients", "blocked_clients").as_deref() == Some(&want);
        if !wait_until(Duration::from_secs(30), queued) {
            return Err("the waiters did not all block within 30 s".into());
        }
        // At a random point of the keepalive period.
        std::thread::sleep(Duration::from_millis(rng.range(0, ttl / 3)));
        let mut killed = Vec::new();
        for (id, child) in &mut children {
            let kill = mono_ns();
            redis_lock_testkit::signal(child.0.id(), libc::SIGKILL);
            let _ = child.0.wait();
            killed.push((id.clone(), kill));
        }
        let results: Vec<_> = joined(hs.into_iter().map(|h| h.join()))?;
        Ok((results, killed))
    })?;
    let mut holders_seen = Vec::new();
    for ((id, kill), reader) in killed.into_iter().zip(readers) {
        let lines = reader.join().map_err(|_| "a reader thread panicked")?;
        let mut h = Killed {
            id,
            kill,
            last_k: 0,
            locks: vec![],
        };
        for l in &lines {
            let w = words(l);
            match w[..] {
                ["K", t] => h.last_k = t.parse().unwrap_or(h.last_k),
                ["G", key, fence] => h.locks.push((key.into(), fence.parse().unwrap_or(0))),
                _ => {}
            }
        }
        if h.locks.len() as u64 != per {
            return Err(format!("holder {} reported {} locks", h.id, h.locks.len()));
        }
        holders_seen.push(h);
    }
    st.rounds += 1;
    let mut by_key = std::collections::HashMap::new();
    for (k, res) in keys
        .iter()
        .flat_map(|k| (0..WAITERS).map(move |_| k))
        .zip(results)
    {
        by_key.entry(k.as_str()).or_insert_with(Vec::new).push(res);
    }
    for h in &holders_seen {
        for (key, holder_fence) in &h.locks {
            st.locks += 1;
            let mut grants: Vec<WaiterGrant> = Vec::new();
            for g in by_key.remove(key.as_str()).unwrap_or_default() {
                match g {
                    Ok(g) => grants.push(g),
                    Err(e) => {
                        st.never += 1;
                        example(&mut st.examples, 6, || e);
                    }
                }
            }
            st.waiter_grants += grants.len() as u64;
            grants.sort();
            let Some(&(first, _, _)) = grants.first() else {
                continue;
            };
            st.granted += 1;
            // The session's end as the client knows it: the holder's deadline.
            let end = match grace {
                0 => h.last_k + ttl * MS,
                g => h.kill + g * MS,
            };
            let vs_end = first as i128 - end as i128;
            let v = ms(vs_end);
            st.vs_end_ms = Some(
                st.vs_end_ms
                    .map_or((v, v), |(lo, hi)| (lo.min(v), hi.max(v))),
            );
            if vs_end < -((EARLY_MS * MS) as i128) {
                st.early += 1;
                example(&mut st.examples, 6, || {
                    format!("{key}: granted {:.1} ms before its session's end", -v)
                });
            }
            let k2g = ms(first as i128 - h.kill as i128);
            kill_to_grant.push(k2g);
            let budget = if grace > 0 { grace } else { ttl };
            let late_ms = if env.short { LATE_MS_SHORT } else { LATE_MS };
            if k2g > (budget + late_ms) as f64 {
                st.late += 1;
                example(&mut st.examples, 6, || {
                    format!("{key}: granted {k2g:.1} ms after its holder's kill")
                });
            }
            // In grant order: each after the one before released, with a higher fence.
            let mut prev: (u64, u64) = (0, *holder_fence);
            for (i, &(got, fence, rel)) in grants.iter().enumerate() {
                if i > 0 && got < prev.0 {
                    st.double_grants += 1;
                    example(&mut st.examples, 6, || {
                        format!("{key}: a second waiter granted before the first released")
                    });
                }
                if fence <= prev.1 {
                    st.fence_regressions += 1;
                    example(&mut st.examples, 6, || {
                        format!("{key}: fence {fence} not above {}", prev.1)
                    });
                }
                prev = (rel, fence);
            }
        }
    }
    for h in &holders_seen {
        let info = cmd(&mut ctl, &args!["LOCK.SESSION", "INFO", &h.id])?;
        if info != Reply::Nil {
            st.sessions_left += 1;
            example(&mut st.examples, 6, || {
                format!("session {} still open after its locks were granted", h.id)
            });
        }
    }
    Ok(())
}

pub fn run(env: &Env, o: &mut Outcome) -> Result<(), String> {
    let server = env.start("sessions")?;
    let mut rng = Rng::new(env.seed ^ 0x7365_7373);
    let rounds = env.n(3.0, 1.0);
    let mut all = Vec::new();
    for v in variants(env.short) {
        let mut st = Stats {
            name: v.0,
            ttl_ms: v.1,
            grace_ms: v.2,
            ..Stats::default()
        };
        let mut k2g = Vec::new();
        for r in 0..rounds {
            round(env, &server, v, r, &mut rng, &mut st, &mut k2g)
                .map_err(|e| format!("{} round {r}: {e}", v.0))?;
        }
        k2g.sort_by(f64::total_cmp);
        let at = |q: f64| k2g.get(((k2g.len() as f64 - 1.0) * q).round() as usize);
        let (lo, mid, hi) = (at(0.0), at(0.5), at(1.0));
        st.kill_to_grant_ms = (
            *lo.unwrap_or(&0.0),
            *mid.unwrap_or(&0.0),
            *hi.unwrap_or(&0.0),
        );
        let bad = st.locks - st.granted
            + st.never
            + st.early
            + st.late
            + st.double_grants
            + st.fence_regressions
            + st.sessions_left;
        o.fail_if(
            bad > 0 || st.locks == 0,
            format!(
                "{}: {} of {} locks granted, {} waiters never granted, {} early, {} late, {} double grants, {} fence regressions, {} sessions left open",
                st.name,
                st.granted,
                st.locks,
                st.never,
                st.early,
                st.late,
                st.double_grants,
                st.fence_regressions,
                st.sessions_left
            ),
        );
        all.push(st);
    }
    let (holders, per) = if env.short { (4, 3) } else { (20, 10) };
    o.put("shape", (holders, per, WAITERS));
    let late_ms = if env.short { LATE_MS_SHORT } else { LATE_MS };
    o.put("bounds_ms", (EARLY_MS, late_ms));
    o.put("variants", all);
    o.healthy(&server, "the server");
    Ok(())
}
