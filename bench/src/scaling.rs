//! Scaling: with 10^3, 10^5 and 10^6 locks held (and then 10^4 blocked waiters on top),
//! the cost of a command and the time to hand a lock to a waiter, after a RELEASE and
//! at the lease deadline. Flat means O(1): the numbers must not move with the level.

use std::io;
use std::time::{Duration, Instant};

use redis_lock_report::perf::{Level, Scaling};
use redis_lock_testkit::{encode, RawConn, Resp};

use crate::config::Config;
use crate::load::{self, Expect, FnLoad, Workload};
use crate::memory::{block_all, connect_many, hold_locks, wait_for};
use crate::ops::{flushall, key, Op, OpLoad, Scripts, TOKEN};
use crate::stats::{median, quantile_sorted};
use crate::Server;

pub const FILL_CONNS: usize = 4;
/// Lease of the probe lock in the expiry measurement.
pub const EXPIRY_TTL_MS: u64 = 25;

/// Adds held locks `held:ccc:iiiiiiiii` so that `to` are held (from `from`).
pub fn top_up(port: u16, from: u64, to: u64) -> io::Result<()> {
    if to <= from {
        return Ok(());
    }
    let base = from / FILL_CONNS as u64;
    let per_conn = (to - from) / FILL_CONNS as u64;
    let w = FnLoad {
        enc: |conn: usize, i: u64, out: &mut Vec<u8>| {
            let k = key(b"held", conn, base + i);
            encode(
                out,
                &[b"LOCK.ACQUIRE", &k, b"TOKEN", TOKEN, b"PX", b"3600000"],
            );
        },
        exp: |_, _| Expect::Grant,
    };
    load::run(port, FILL_CONNS, 256, per_conn, &w)?.checked("scaling fill")?;
    Ok(())
}

/// `LOCK.EXTEND` (or `PEXPIRE`, the server's own per-key command, as the reference)
/// on held locks picked pseudo-randomly all over the held set.
pub struct SpreadExtend {
    pub held: u64,
    pub pexpire: bool,
}

impl Workload for SpreadExtend {
    fn encode(&self, conn: usize, i: u64, out: &mut Vec<u8>) {
        let per_fill_conn = (self.held / FILL_CONNS as u64).max(1);
        let x = (conn as u64)
            .wrapping_add(1)
            .wrapping_mul(0x9E37_79B9_7F4A_7C15)
            .wrapping_add(i.wrapping_mul(0xD1B5_4A32_D192_ED03));
        let k = key(
            b"held",
            (x % FILL_CONNS as u64) as usize,
            (x >> 8) % per_fill_conn,
        );
        if self.pexpire {
            encode(out, &[b"PEXPIRE", &k, b"3600000"]);
        } else {
            encode(out, &[b"LOCK.EXTEND", &k, TOKEN, b"PX", b"3600000"]);
        }
    }
    fn expect(&self, _: usize, _: u64) -> Expect {
        Expect::Int(1)
    }
}

fn per_conn(cfg: &Config) -> u64 {
    (cfg.ops_p16 / 2 / cfg.clients as u64).max(2) / 2 * 2
}

fn spread(server: &Server, cfg: &Config, held: u64, pexpire: bool) -> io::Result<f64> {
    let w = SpreadExtend { held, pexpire };
    Ok(load::run(server.port, cfg.clients, 16, per_conn(cfg), &w)?
        .checked("extend spread")?
        .rate())
}

fn rate(server: &Server, cfg: &Config, scripts: &Scripts, op: Op) -> io::Result<f64> {
    let w = OpLoad {
        op,
        prefix: b"scale",
        scripts,
        wrap: 0,
    };
    let out = load::run(server.port, cfg.clients, 16, per_conn(cfg), &w)?.checked(op.shown())?;
    Ok(out.rate() / op.commands_per_op() as f64)
}

fn waiters_of(c: &mut RawConn, k: &[u8]) -> io::Result<i64> {
    let r = c.ok(&[b"LOCK.INFO", k])?;
    r.get("waiters")
        .and_then(|w| w.as_int())
        .ok_or_else(|| io::Error::other(format!("LOCK.INFO replied {r:?}")))
}

/// Blocks `b` on `k` (held by `a`) and waits until the server has queued it.
fn block_on(a: &mut RawConn, b: &mut RawConn, k: &[u8]) -> io::Result<()> {
    b.try_send(&[
        b"LOCK.ACQUIRE",
        k,
        b"TOKEN",
        b"waiter",
        b"PX",
        b"60000",
        b"BLOCK",
        b"10000",
    ])?;
    let start = Instant::now();
    while waiters_of(a, k)? != 1 {
        if start.elapsed() > Duration::from_secs(5) {
            return Err(io::Error::other("the waiter never queued"));
        }
    }
    Ok(())
}

fn expect_grant(r: Resp, what: &str) -> io::Result<()> {
    match r.grant() {
        Some(_) => Ok(()),
        None => Err(io::Error::other(format!("{what}: {r:?}"))),
    }
}

/// RELEASE -> grant to the waiter, ms samples.
fn handoffs(server: &Server, n: usize) -> io::Result<Vec<f64>> {
    let (mut a, mut b) = (server.conn()?, server.conn()?);
    let mut v = Vec::with_capacity(n);
    for j in 0..n {
        let k = format!("probe:h:{j}");
        let k = k.as_bytes();
        expect_grant(
            a.ok(&[b"LOCK.ACQUIRE", k, b"TOKEN", b"holder", b"PX", b"60000"])?,
            "probe acquire",
        )?;
        block_on(&mut a, &mut b, k)?;
        let t0 = Instant::now();
        a.try_send(&[b"LOCK.RELEASE", k, b"holder"])?;
        expect_grant(b.read()?, "hand-off")?;
        v.push(t0.elapsed().as_secs_f64() * 1e3);
        if a.read()? != Resp::Int(1) {
            return Err(io::Error::other("probe release failed"));
        }
        b.ok(&[b"LOCK.RELEASE", k, b"waiter"])?;
    }
    Ok(v)
}

/// Lease deadline -> grant to the waiter, ms samples.
fn expiries(server: &Server, n: usize) -> io::Result<Vec<f64>> {
    let (mut a, mut b) = (server.conn()?, server.conn()?);
    let ttl = EXPIRY_TTL_MS.to_string();
    let mut v = Vec::with_capacity(n);
    for j in 0..n {
        let k = format!("probe:e:{j}");
        let k = k.as_bytes();
        let t0 = Instant::now();
        expect_grant(
            a.ok(&[
                b"LOCK.ACQUIRE",
                k,
                b"TOKEN",
                b"holder",
                b"PX",
                ttl.as_bytes(),
            ])?,
            "probe acquire",
        )?;
        block_on(&mut a, &mut b, k)?;
        expect_grant(b.read()?, "expiry hand-off")?;
        let since_deadline = t0.elapsed().as_secs_f64() * 1e3 - EXPIRY_TTL_MS as f64;
        v.push(since_deadline);
        b.ok(&[b"LOCK.RELEASE", k, b"waiter"])?;
    }
    Ok(v)
}

fn pcts(mut v: Vec<f64>) -> (f64, f64) {
    v.sort_by(f64::total_cmp);
    (quantile_sorted(&v, 0.5), quantile_sorted(&v, 0.99))
}

fn measure_level(
    server: &Server,
    cfg: &Config,
    scripts: &Scripts,
    held: u64,
    waiters: u64,
) -> io::Result<Level> {
    let reps = cfg.rounds.max(1);
    let (mut cyc, mut cyc_r, mut ext, mut ext_r) = (vec![], vec![], vec![], vec![]);
    let mut c = server.conn()?;
    for rep in 0..reps {
        let (cy, recipe) = if rep % 2 == 0 {
            let a = rate(server, cfg, scripts, Op::CycleModule)?;
            (a, rate(server, cfg, scripts, Op::CycleRecipe)?)
        } else {
            let b = rate(server, cfg, scripts, Op::CycleRecipe)?;
            (rate(server, cfg, scripts, Op::CycleModule)?, b)
        };
        let (ex, pe) = if rep % 2 == 0 {
            let a = spread(server, cfg, held, false)?;
            (a, spread(server, cfg, held, true)?)
        } else {
            let b = spread(server, cfg, held, true)?;
            (spread(server, cfg, held, false)?, b)
        };
        cyc.push(cy);
        cyc_r.push(cy / recipe);
        ext.push(ex);
        ext_r.push(ex / pe);
    }
    let (handoff_p50, handoff_p99) = pcts(handoffs(server, cfg.handoffs)?);
    let (expiry_p50, expiry_p99) = pcts(expiries(server, cfg.expiries)?);
    // The probes and cycles leave nothing behind; check the level is intact.
    let live = c.info_u64("lock", "lock_held")?;
    if live != held + cfg.wait_locks * u64::from(waiters > 0) {
        return Err(io::Error::other(format!(
            "expected {held} held locks, INFO says {live}"
        )));
    }
    let l = Level {
        held,
        waiters,
        cycle_rate: median(&cyc),
        cycle_vs_recipe: median(&cyc_r),
        extend_rate: median(&ext),
        extend_vs_pexpire: median(&ext_r),
        handoff_p50,
        handoff_p99,
        expiry_p50,
        expiry_p99,
    };
    eprintln!(
        "  [{}] scaling held={held} waiters={waiters}: cycle {:.0}/s ({:.3} of recipe), extend {:.0}/s ({:.3} of PEXPIRE), hand-off p50 {:.3} ms, expiry p50 {:.3} ms",
        server.label, l.cycle_rate, l.cycle_vs_recipe, l.extend_rate, l.extend_vs_pexpire, l.handoff_p50, l.expiry_p50
    );
    Ok(l)
}

pub fn run(server: &Server, cfg: &Config, scripts: &Scripts) -> io::Result<Scaling> {
    let mut c = server.conn()?;
    flushall(&mut c)?;
    let mut levels = vec![];
    let mut held = 0;
    for n in cfg.levels() {
        top_up(server.port, held, n)?;
        held = n;
        levels.push(measure_level(server, cfg, scripts, held, 0)?);
    }
    if cfg.waiters > 0 {
        hold_locks(&mut c, "wl", cfg.wait_locks)?;
        let mut conns = connect_many(server.port, cfg.waiters)?;
        block_all(&mut c, &mut conns, "wl", cfg.wait_locks)?;
        levels.push(measure_level(server, cfg, scripts, held, cfg.waiters)?);
        drop(conns);
        wait_for(&mut c, "lock_waiters", |v| v == 0, Duration::from_secs(60))?;
    }
    flushall(&mut c)?;
    Ok(Scaling { levels })
}
