//! Scaling: a command's cost and a hand-off's time (after RELEASE, at the lease deadline)
//! at 10^3..10^6 held locks, then with 10^4 waiters; O(1) when they stay flat.

use std::io;
use std::time::{Duration, Instant};

use redis_lock_report::perf::{Level, Scaling};
use redis_lock_testkit::{encode, lock, RawConn, Resp};

use crate::config::Config;
use crate::load::{self, Shape};
use crate::ops::{self, key, Waiters, TOKEN};
use crate::stats::{ab, pair_medians, quantiles};
use crate::Server;

pub const FILL_CONNS: usize = 4;
const HOLDER: &str = "holder-token-0001";
/// Lease of the probe lock in the expiry measurement.
pub const EXPIRY_TTL_MS: u64 = 25;

/// Adds held locks `held:ccc:iiiiiiiii` so that `to` are held (from `from`).
pub fn top_up(port: u16, from: u64, to: u64) -> io::Result<()> {
    if to <= from {
        return Ok(());
    }
    let base = from / FILL_CONNS as u64;
    let per_conn = (to - from) / FILL_CONNS as u64;
    let w = |conn: usize, i: u64, out: &mut Vec<u8>| {
        let k = key(b"held", conn, base + i);
        let px = b"3600000";
        encode(out, &[b"LOCK.ACQUIRE", &k, b"TOKEN", TOKEN, b"PX", px]);
        Some(Shape::Array(2))
    };
    load::run(port, FILL_CONNS, 256, per_conn, "scaling fill", &w)?;
    Ok(())
}

/// `LOCK.EXTEND` (or the reference `PEXPIRE`) on held locks picked all over the held set.
pub fn spread_extend(
    held: u64,
    pexpire: bool,
) -> impl Fn(usize, u64, &mut Vec<u8>) -> Option<Shape> {
    let per_fill_conn = (held / FILL_CONNS as u64).max(1);
    move |conn, i, out| {
        let x = (conn as u64)
            .wrapping_add(1)
            .wrapping_mul(0x9E37_79B9_7F4A_7C15)
            .wrapping_add(i.wrapping_mul(0xD1B5_4A32_D192_ED03));
        let (conn, j) = ((x % FILL_CONNS as u64) as usize, (x >> 8) % per_fill_conn);
        let k = key(b"held", conn, j);
        if pexpire {
            encode(out, &[b"PEXPIRE", &k, b"3600000"]);
        } else {
            encode(out, &[b"LOCK.EXTEND", &k, TOKEN, b"PX", b"3600000"]);
        }
        Some(Shape::Int(1))
    }
}

/// Blocks `b` on `k` (held by `a`) and waits until the server has queued it.
fn block_on(a: &mut RawConn, b: &mut RawConn, k: &str) -> io::Result<()> {
    let acquire = "LOCK.ACQUIRE {k} TOKEN waiter-token-0001 PX 60000 BLOCK 10000";
    b.queue(&acquire.replace("{k}", k).split(' ').collect::<Vec<_>>());
    b.flush()?;
    let start = Instant::now();
    while lock::info(a, k)?.and_then(|i| i.waiters) != Some(1) {
        if start.elapsed() > Duration::from_secs(5) {
            bail!("the waiter never queued");
        }
    }
    Ok(())
}

fn expect_grant(r: Resp, what: &str) -> io::Result<()> {
    let err = || io::Error::other(format!("{what}: {r:?}"));
    r.grant().map(drop).ok_or_else(err)
}

/// Milliseconds a blocked waiter takes to get the lock from the holder's RELEASE, or
/// (`expiry`) from its lease deadline.
fn grants(s: &Server, n: usize, expiry: bool) -> io::Result<Vec<f64>> {
    let (mut a, mut b) = (s.conn()?, s.conn()?);
    let ttl = if expiry { EXPIRY_TTL_MS } else { 60_000 }.to_string();
    let mut v = Vec::with_capacity(n);
    for j in 0..n {
        let k = format!("probe:{}:{j}", if expiry { 'e' } else { 'h' });
        let t0 = Instant::now();
        let r = a.call(&["LOCK.ACQUIRE", &k, "TOKEN", HOLDER, "PX", &ttl])?;
        expect_grant(r, "probe acquire")?;
        block_on(&mut a, &mut b, &k)?;
        if expiry {
            expect_grant(b.read()?, "expiry hand-off")?;
            v.push(t0.elapsed().as_secs_f64() * 1e3 - EXPIRY_TTL_MS as f64);
        } else {
            let t0 = Instant::now();
            a.try_send(&[b"LOCK.RELEASE", k.as_bytes(), HOLDER.as_bytes()])?;
            expect_grant(b.read()?, "hand-off")?;
            v.push(t0.elapsed().as_secs_f64() * 1e3);
            if a.read()? != Resp::Int(1) {
                bail!("probe release failed");
            }
        }
        b.ok(&[b"LOCK.RELEASE", k.as_bytes(), b"waiter-token-0001"])?;
    }
    Ok(v)
}

fn measure_level(s: &Server, held: u64, waiters: u64) -> io::Result<Level> {
    let cfg = &s.cfg;
    let per_conn = (cfg.ops_p16 / 2 / cfg.clients as u64).max(2) / 2 * 2;
    let run =
        |what: &str, w: &load::Workload| load::run(s.port, cfg.clients, 16, per_conn, what, w);
    let cycle = |module: bool| {
        let op = if module {
            &ops::CYCLE
        } else {
            &ops::CYCLE_RECIPE
        };
        Ok(run(&op.shown(), &op.load(b"scale", &s.scripts, 0))? / op.commands_per_op() as f64)
    };
    let extend = |module: bool| run("extend spread", &spread_extend(held, !module));
    let (mut cycles, mut extends) = (vec![], vec![]);
    for rep in 0..cfg.rounds.max(1) {
        cycles.push(ab(rep, cycle)?);
        extends.push(ab(rep, extend)?);
    }
    let [handoff_p50, handoff_p99] = quantiles(&mut grants(s, cfg.handoffs, false)?, [0.5, 0.99]);
    let [expiry_p50, expiry_p99] = quantiles(&mut grants(s, cfg.expiries, true)?, [0.5, 0.99]);
    // The probes and cycles leave nothing behind; check the level is intact.
    let live = s.conn()?.info_u64("lock", "lock_held")?;
    if live != held + cfg.wait_locks * u64::from(waiters > 0) {
        bail!("expected {held} held locks, INFO says {live}");
    }
    let [cycle_rate, _, cycle_vs_recipe] = pair_medians(&cycles);
    let [extend_rate, _, extend_vs_pexpire] = pair_medians(&extends);
    let l = Level {
        held,
        waiters,
        cycle_rate,
        cycle_vs_recipe,
        extend_rate,
        extend_vs_pexpire,
        handoff_p50,
        handoff_p99,
        expiry_p50,
        expiry_p99,
    };
    eprintln!(
        "  [{}] scaling held={held} waiters={waiters}: cycle {:.0}/s ({:.3} of recipe), extend {:.0}/s ({:.3} of PEXPIRE), hand-off p50 {:.3} ms, expiry p50 {:.3} ms",
        s.label, l.cycle_rate, l.cycle_vs_recipe, l.extend_rate, l.extend_vs_pexpire, l.handoff_p50, l.expiry_p50
    );
    Ok(l)
}

/// `measure(held, waiters)` at each held-lock level (topped up from the last), then with
/// `waiters` blocked waiters on top of the last.
pub fn at_levels<T>(
    port: u16,
    cfg: &Config,
    levels: &[u64],
    waiters: u64,
    mut measure: impl FnMut(u64, u64) -> io::Result<T>,
) -> io::Result<Vec<T>> {
    let (mut held, mut out) = (0, vec![]);
    for &n in levels {
        top_up(port, held, n)?;
        held = n;
        out.push(measure(held, 0)?);
    }
    if waiters > 0 {
        let mut c = RawConn::open(([127, 0, 0, 1], port).into(), Duration::from_secs(120))?;
        let blocked = Waiters::block(&mut c, port, waiters, cfg.wait_locks, |_| Ok(()))?;
        out.push(measure(held, waiters)?);
        blocked.release(&mut c)?;
    }
    Ok(out)
}

pub fn run(s: &Server) -> io::Result<Scaling> {
    let cfg = &s.cfg;
    let levels = at_levels(s.port, cfg, &cfg.levels.0, cfg.waiters, |held, waiters| {
        measure_level(s, held, waiters)
    })?;
    Ok(Scaling { levels })
}
