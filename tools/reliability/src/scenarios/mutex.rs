//! Scenario 1: mutual exclusion and fencing under load. 64 clients, 16 keys, blocking and
//! non-blocking acquires, extends, releases and leases left to expire. Every call is
//! recorded with invoke/complete times on one monotonic clock and the history is checked
//! against the fenced-mutex model (checker.rs). Each critical section also does a
//! read-modify-write on an in-process store that notices overlapping critical sections,
//! writes with a lower fence than one already accepted, and lost updates.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::checker::{self, Call, Grant, Mode};
use crate::common::*;
use crate::workload::{Store, SLACK_NS};
use redis_lock_testkit::args;
use redis_lock_testkit::Rng;

pub const CLIENTS: usize = 64;
pub const KEYS: u32 = 16;
/// Lease of ordinary holders.
const LONG_TTL: u64 = 5000;
const READ_TIMEOUT: Duration = Duration::from_secs(5);
const MAX_HANGS_PER_CLIENT: usize = 30;

#[derive(Default)]
struct ClientLog {
    grants: Vec<Grant>,
    nil_blocking: u64,
    nil_nonblocking: u64,
    extends: u64,
    releases: u64,
    abandoned: u64,
    calls: u64,
    errors: Vec<String>,
    /// Calls that never got a reply (the client reconnected and went on).
    hangs: Vec<String>,
}

struct Shared {
    store: Store,
    stop: AtomicBool,
    granted: AtomicU64,
    target: u64,
    deadline: Instant,
    addr: std::net::SocketAddr,
}

fn connect_to(addr: std::net::SocketAddr) -> Result<Conn, String> {
    let c = Conn::open(addr, Duration::from_secs(5)).map_err(|e| format!("connect: {e}"))?;
    // A blocking acquire waits at most 300 ms; leave room for a slow machine.
    c.try_set_read_timeout(Some(READ_TIMEOUT))
        .map_err(|e| e.to_string())?;
    Ok(c)
}

fn key_name(k: u32) -> String {
    format!("rel:mx:{k}")
}

/// What the hangs seen on Redis 7.0 come from (tools/reliability/tests/blocking_timeout_race.rs).
pub const HANG_DIAGNOSIS: &str = "Diagnosis of the unanswered blocking acquires (reproduced by tools/reliability/tests/blocking_timeout_race.rs; Redis 7.0 only, Redis 8.2 and Valkey 8.1 answer): Redis 7.0 notices blocked-client timeouts only in beforeSleep, so a BLOCK that ends shortly before the holder's lease can be noticed after the module's lease-deadline timer has already handed the lock to that waiter (RM_UnblockClient with the grant). handleBlockedClientsTimeout then skips the module's timeout callback (bc->unblocked is set) but unblockClient() clears bc->client, so moduleHandleBlockedClients never calls the reply callback: the client gets no reply at all, and the lock stays granted to a token nobody has until its lease ends. Fix in the module (src/waiters.rs handoff): remember each waiter's BLOCK deadline and never hand the lock to a waiter whose deadline has passed; leave it queued for the timeout callback, which removes it and answers nil.";

/// A call that got no reply in time: the connection is dropped and a new one made.
const HANG: &str = "no reply within the read timeout";

fn call(c: &mut Conn, log: &mut ClientLog, args: &[Vec<u8>]) -> Result<(u64, u64, Reply), String> {
    let t0 = now_ns();
    let r = c.call(args).map_err(|e| {
        let shown: Vec<String> = args
            .iter()
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        let hang = matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        );
        if hang {
            log.hangs.push(format!("`{}`", shown.join(" ")));
            HANG.to_string()
        } else {
            format!("connection: {e} (during `{}`)", shown.join(" "))
        }
    })?;
    let t1 = now_ns();
    log.calls += 1;
    if let Reply::Error(e) = &r {
        return Err(format!("server error: {e}"));
    }
    Ok((t0, t1, r))
}

fn release(c: &mut Conn, log: &mut ClientLog, g: &mut Grant, token: &[u8]) -> Result<(), String> {
    let (t0, t1, r) = call(c, log, &args!["LOCK.RELEASE", key_name(g.key), token])?;
    g.release = Some(Call {
        invoke: t0,
        complete: t1,
        ok: Some(r.as_int() == Some(1)),
    });
    log.releases += 1;
    Ok(())
}

fn client(sh: &Shared, id: u32, mut rng: Rng) -> ClientLog {
    let mut log = ClientLog::default();
    // Leases left to expire: (grant index, token, when the lease has surely ended).
    let mut abandoned: VecDeque<(usize, Vec<u8>, u64)> = VecDeque::new();
    loop {
        let r = connect_to(sh.addr)
            .and_then(|c| session(sh, c, id, &mut rng, &mut log, &mut abandoned));
        match r {
            // A call that never got an answer: note it, reconnect, go on (up to a
            // point: past it this client stops, the others go on).
            Err(e) if e == HANG && log.hangs.len() < MAX_HANGS_PER_CLIENT => continue,
            Err(e) if e == HANG => return log,
            Err(e) => {
                log.errors.push(format!("client {id}: {e}"));
                sh.stop.store(true, Ordering::Relaxed);
                return log;
            }
            Ok(()) => return log,
        }
    }
}

fn session(
    sh: &Shared,
    mut c: Conn,
    id: u32,
    rng: &mut Rng,
    log: &mut ClientLog,
    abandoned: &mut VecDeque<(usize, Vec<u8>, u64)>,
) -> Result<(), String> {
    let log = &mut *log;
    {
        while !sh.stop.load(Ordering::Relaxed) && Instant::now() < sh.deadline {
            while let Some((idx, _, due)) = abandoned.front() {
                if now_ns() < *due {
                    break;
                }
                let idx = *idx;
                let Some((_, token, _)) = abandoned.pop_front() else {
                    break;
                };
                // The lease is over: this release must answer 0.
                let mut g = log.grants[idx].clone();
                release(&mut c, log, &mut g, &token)?;
                log.grants[idx] = g;
            }
            let key = rng.below(u64::from(KEYS)) as u32;
            let kind = rng.below(100);
            let short = kind >= 88;
            let ttl = if short { rng.range(20, 100) } else { LONG_TTL };
            let block = match kind {
                0..=44 => Some(rng.range(5, 300)),
                88..=99 if rng.chance(50) => Some(rng.range(5, 100)),
                _ => None,
            };
            let mut a = args!["LOCK.ACQUIRE", key_name(key), "PX", ttl];
            if let Some(b) = block {
                a.extend(args!["BLOCK", b]);
            }
            let (t0, t1, reply) = call(&mut c, log, &a)?;
            let Some((token, fence)) = reply.grant() else {
                if reply != Reply::Nil {
                    return Err(format!("unexpected acquire reply {reply:?}"));
                }
                if block.is_some() {
                    log.nil_blocking += 1;
                } else {
                    log.nil_nonblocking += 1;
                }
                continue;
            };
            if sh.granted.fetch_add(1, Ordering::Relaxed) + 1 >= sh.target {
                sh.stop.store(true, Ordering::Relaxed);
            }
            let mut g = Grant::new(id, key, Mode::Exclusive, (0, fence), ttl, (t0, t1));
            // Critical section: read-modify-write on the store.
            let cs0 = now_ns();
            let v = sh.store.enter(key, Mode::Exclusive, (0, fence));
            if rng.chance(10) {
                std::thread::yield_now();
            }
            let mut final_ttl = ttl;
            if rng.chance(15) {
                let ext = if short { rng.range(20, 100) } else { LONG_TTL };
                let (e0, e1, r) = call(
                    &mut c,
                    log,
                    &args!["LOCK.EXTEND", key_name(key), &token, "PX", ext],
                )?;
                let ok = r.as_int() == Some(1);
                g.extends.push((
                    Call {
                        invoke: e0,
                        complete: e1,
                        ok: Some(ok),
                    },
                    ext,
                ));
                log.extends += 1;
                if ok {
                    final_ttl = ext;
                }
            }
            sh.store.write(key, Mode::Exclusive, (0, fence), v + 1);
            sh.store.exit(key, (0, fence));
            g.cs = Some((cs0, now_ns()));
            log.grants.push(g);
            let idx = log.grants.len() - 1;
            if short && rng.chance(10) {
                let last = log.grants[idx]
                    .extends
                    .iter()
                    .rev()
                    .find(|(e, _)| e.ok == Some(true))
                    .map_or(t1, |(e, _)| e.complete);
                abandoned.push_back((idx, token, last + (final_ttl + 5) * 1_000_000));
                log.abandoned += 1;
            } else {
                let mut g = log.grants[idx].clone();
                release(&mut c, log, &mut g, &token)?;
                log.grants[idx] = g;
            }
        }
        // Settle what is left: wait out the leases, then check the release answers 0.
        while let Some((idx, token, due)) = abandoned.pop_front() {
            let wait = due.saturating_sub(now_ns());
            std::thread::sleep(Duration::from_nanos(wait));
            let mut g = log.grants[idx].clone();
            release(&mut c, log, &mut g, &token)?;
            log.grants[idx] = g;
        }
        Ok(())
    }
}

pub const TITLE: &str = "Mutual exclusion and fencing (fenced-mutex checker)";
pub const TARGET: &str = "0 violations in >= 1,000,000 acquisitions";

pub fn run(env: &Env, o: &mut Outcome) -> Result<(), String> {
    let target = env.n(1_000_000.0, 30_000.0);
    let budget = env.secs(480.0, 45.0);
    let server = env.start("mutex")?;
    let conns: Vec<Conn> = (0..CLIENTS)
        .map(|_| connect(&server))
        .collect::<Result<_, _>>()?;
    for c in &conns {
        // A blocking acquire waits at most 300 ms; leave room for a slow machine.
        c.try_set_read_timeout(Some(Duration::from_secs(10)))
            .map_err(|e| e.to_string())?;
    }
    let sh = Arc::new(Shared {
        store: Store::new(KEYS as usize),
        stop: AtomicBool::new(false),
        granted: AtomicU64::new(0),
        target,
        deadline: Instant::now() + budget,
        addr: server.socket_addr(),
    });
    let mut rng = Rng::new(env.seed ^ 0x006d_7574_6578);
    let start = Instant::now();
    let handles: Vec<_> = (0..CLIENTS)
        .map(|i| {
            let sh = Arc::clone(&sh);
            let r = rng.fork(i as u64);
            std::thread::spawn(move || client(&sh, i as u32, r))
        })
        .collect();
    let mut logs = Vec::new();
    for h in handles {
        logs.push(
            h.join()
                .map_err(|_| "a client thread panicked".to_string())?,
        );
    }
    let elapsed = start.elapsed().as_secs_f64();

    let mut grants: Vec<Grant> = Vec::new();
    let (mut nil_b, mut nil_nb, mut ext, mut rel, mut aband, mut calls) = (0, 0, 0, 0, 0, 0);
    let mut errors = Vec::new();
    let mut hangs = Vec::new();
    for l in logs {
        hangs.extend(l.hangs);
        grants.extend(l.grants);
        nil_b += l.nil_blocking;
        nil_nb += l.nil_nonblocking;
        ext += l.extends;
        rel += l.releases;
        aband += l.abandoned;
        calls += l.calls;
        errors.extend(l.errors);
    }
    let events = std::mem::take(&mut *sh.store.events.lock().map_err(|e| e.to_string())?);
    let report = checker::check(&mut grants, &[], &events, SLACK_NS);
    // Lost updates per key, unless a late holder (client pause) explains them.
    let keys_with_late: std::collections::BTreeSet<u32> = events.iter().map(|e| e.key).collect();
    let lost = sh.store.lost_updates();
    let lost_updates: u64 = lost.iter().map(|l| l.1).sum();
    let unexplained_lost: u64 = lost
        .iter()
        .filter(|(k, _)| !keys_with_late.contains(k))
        .map(|l| l.1)
        .sum();
    let violations = report.total() + unexplained_lost;
    let n = report.grants;
    let alive = connect(&server).is_ok_and(|mut c| c.call(&args!["PING"]).is_ok());
    let caught = panics(&server);

    o.figure = format!("{} violations in {} acquisitions", violations, thousands(n));
    o.trials = format!(
        "{} acquisitions ({} calls, {:.0} s, {:.0} grants/s), {CLIENTS} clients, {KEYS} keys",
        thousands(n),
        thousands(calls),
        elapsed,
        n as f64 / elapsed.max(0.001)
    );
    o.note(format!(
        "History: {} grants, {} releases (incl. late ones that must answer 0), {} extends, {} leases left to expire, {} blocking acquires timed out, {} non-blocking acquires found the lock busy.",
        thousands(n), thousands(rel), thousands(ext), thousands(aband), thousands(nil_b), thousands(nil_nb)
    ));
    o.note(format!(
        "Checked: per key, no grant while an earlier holder's lease was certainly live; across the server, fences unique and never lower than a fence already returned; releases/extends succeed exactly while the lease is live; the store saw {} overlapping or stale-fenced critical sections and {} lost updates.",
        events.len(), lost_updates
    ));
    note_checks(
        o,
        (report.late_cs, report.late_store_events),
        &report.violations,
        &report.examples,
    );
    if unexplained_lost > 0 {
        o.fail(format!("{unexplained_lost} lost updates in the store"));
    }
    if violations > 0 {
        o.fail(format!("{violations} violations"));
    }
    if !hangs.is_empty() {
        o.note(HANG_DIAGNOSIS);
        o.fail(format!(
            "{} calls never answered (waited {} s each), first: {}",
            hangs.len(),
            READ_TIMEOUT.as_secs(),
            hangs[0]
        ));
    }
    if !errors.is_empty() {
        o.fail(format!(
            "{} client errors, first: {}",
            errors.len(),
            errors[0]
        ));
    }
    if !alive {
        o.fail("server did not answer PING after the run");
    }
    if caught != Some(0) {
        o.fail(format!("lock_panics = {caught:?}"));
    }
    if n < target {
        let msg = format!(
            "{} acquisitions reached in {:.0} s (budget {:.0} s), below the {} asked for{}",
            thousands(n),
            elapsed,
            budget.as_secs_f64(),
            thousands(target),
            if hangs.is_empty() {
                ""
            } else {
                " (clients stop after 30 unanswered calls)"
            }
        );
        if env.short {
            o.note(msg);
        } else {
            o.fail(msg);
        }
    }
    drop(server);
    Ok(())
}
