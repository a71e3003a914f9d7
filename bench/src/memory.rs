//! Memory: `used_memory` growth per module lock against a `SET NX PX` string lock (same
//! 36-byte token), and per blocked waiter.

use std::io;
use std::thread::sleep;
use std::time::Duration;

use redis_lock_report::perf::{Memory, WaiterMemory};
use redis_lock_testkit::RawConn;

use crate::load;
use crate::ops::{self, flushall, Op, Waiters, TOKEN, TTL};
use crate::stats::{ab, median};
use crate::Server;

fn used_memory(c: &mut RawConn) -> io::Result<f64> {
    Ok(c.info_u64("memory", "used_memory")? as f64)
}

/// The growth of used_memory per key over `mem_locks` keys filled with `op`.
fn fill_delta(s: &Server, op: &Op) -> io::Result<f64> {
    let mut c = s.conn()?;
    flushall(&mut c)?;
    let before = used_memory(&mut c)?;
    let (conns, per_conn) = (4, s.cfg.mem_locks / 4);
    let w = op.load(b"mem", &s.scripts, 0);
    load::run(s.port, conns, 256, per_conn, "memory fill", &w)?;
    let after = used_memory(&mut c)?;
    let d = (after - before) / (per_conn * conns as u64) as f64;
    eprintln!("  [{}] memory {}: {d:.1} B/key", s.label, op.shown());
    Ok(d)
}

fn usage(c: &mut RawConn, key: &[u8]) -> io::Result<i64> {
    let r = c.ok(&[b"MEMORY", b"USAGE", key])?;
    r.as_int()
        .ok_or_else(|| io::Error::other(format!("MEMORY USAGE replied {r:?}")))
}

pub fn run(s: &Server) -> io::Result<Memory> {
    let (mut module, mut string) = (vec![], vec![]);
    // A B B A: two of each, alternated.
    for round in 0..2 {
        let (a, b) = ab(round, |module| {
            let op = if module { &ops::ACQUIRE } else { &ops::SET_NX };
            fill_delta(s, op)
        })?;
        module.push(a);
        string.push(b);
    }
    let mut c = s.conn()?;
    flushall(&mut c)?;
    let (module_key, string_key) = (b"mem:000:000000000", b"mem:001:000000000");
    c.ok(&[b"LOCK.ACQUIRE", module_key, b"TOKEN", TOKEN, b"PX", TTL])?;
    c.ok(&[b"SET", string_key, TOKEN, b"NX", b"PX", TTL])?;
    let usage_module = usage(&mut c, module_key)?;
    let usage_string = usage(&mut c, string_key)?;
    flushall(&mut c)?;
    let waiters = (s.cfg.waiters > 0).then(|| waiter_memory(s)).transpose()?;
    Ok(Memory {
        locks: s.cfg.mem_locks,
        module_per_lock: median(&module),
        string_per_lock: median(&string),
        usage_module,
        usage_string,
        waiters,
    })
}

/// used_memory with the locks held, the waiters connected, and blocked, each read after
/// the client cron has had the time to shrink idle buffers.
fn waiter_memory(s: &Server) -> io::Result<WaiterMemory> {
    let (mut c, cfg) = (s.conn()?, &s.cfg);
    let mut m = vec![];
    let waiters = Waiters::block(&mut c, s.port, cfg.waiters, cfg.wait_locks, |c| {
        sleep(Duration::from_secs(4));
        m.push(used_memory(c)?);
        Ok(())
    })?;
    waiters.release(&mut c)?;
    let [m_none, m_idle, m_blocked] = m[..] else {
        unreachable!("three stages")
    };
    let w = cfg.waiters as f64;
    Ok(WaiterMemory {
        waiters: cfg.waiters,
        locks: cfg.wait_locks,
        per_waiter: (m_blocked - m_idle) / w,
        per_waiter_with_conn: (m_blocked - m_none) / w,
    })
}
