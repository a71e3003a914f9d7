//! Memory: `used_memory` delta per held lock (10^6 module locks against 10^6 `SET NX PX`
//! string locks with a 36-byte token), and per blocked waiter.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::thread::sleep;
use std::time::{Duration, Instant};

use redis_lock_report::perf::{Memory, WaiterMemory};
use redis_lock_testkit::{encode, RawConn, Resp};

use crate::config::Config;
use crate::load;
use crate::ops::{flushall, padded, Op, OpLoad, Scripts, TOKEN};
use crate::stats::median;
use crate::Server;

pub fn used_memory(c: &mut RawConn) -> io::Result<f64> {
    Ok(c.info_u64("memory", "used_memory")? as f64)
}

/// Fills `n` keys `mem:ccc:iiiiiiiii` with `op` (pipelined) and returns the growth of
/// used_memory per key.
fn fill_delta(server: &Server, scripts: &Scripts, op: Op, n: u64) -> io::Result<f64> {
    let mut c = server.conn()?;
    flushall(&mut c)?;
    let before = used_memory(&mut c)?;
    let conns = 4;
    let w = OpLoad {
        op,
        prefix: b"mem",
        scripts,
        wrap: 0,
    };
    load::run(server.port, conns, 256, n / conns as u64, &w)?.checked("memory fill")?;
    let after = used_memory(&mut c)?;
    Ok((after - before) / (n / conns as u64 * conns as u64) as f64)
}

fn usage(c: &mut RawConn, key: &[u8]) -> io::Result<i64> {
    match c.ok(&[b"MEMORY", b"USAGE", key])? {
        Resp::Int(n) => Ok(n),
        other => Err(io::Error::other(format!("MEMORY USAGE replied {other:?}"))),
    }
}

pub fn run(server: &Server, cfg: &Config, scripts: &Scripts) -> io::Result<Memory> {
    let n = cfg.mem_locks;
    let (mut m, mut s) = (vec![], vec![]);
    // A B B A: two of each, alternated.
    for op in [Op::Acquire, Op::SetNx, Op::SetNx, Op::Acquire] {
        let d = fill_delta(server, scripts, op, n)?;
        eprintln!("  [{}] memory {}: {d:.1} B/key", server.label, op.shown());
        if op == Op::Acquire {
            m.push(d);
        } else {
            s.push(d);
        }
    }
    let mut c = server.conn()?;
    flushall(&mut c)?;
    c.ok(&[
        b"LOCK.ACQUIRE",
        b"mem:000:000000000",
        b"TOKEN",
        TOKEN,
        b"PX",
        b"600000",
    ])?;
    c.ok(&[b"SET", b"mem:001:000000000", TOKEN, b"NX", b"PX", b"600000"])?;
    let usage_module = usage(&mut c, b"mem:000:000000000")?;
    let usage_string = usage(&mut c, b"mem:001:000000000")?;
    flushall(&mut c)?;
    let waiters = if cfg.waiters > 0 {
        Some(waiter_memory(server, cfg)?)
    } else {
        None
    };
    Ok(Memory {
        locks: n,
        module_per_lock: median(&m),
        string_per_lock: median(&s),
        usage_module,
        usage_string,
        waiters,
    })
}

/// `count` plain connections, each of which has answered a PING.
pub fn connect_many(port: u16, count: u64) -> io::Result<Vec<TcpStream>> {
    let mut v = Vec::with_capacity(count as usize);
    for _ in 0..count {
        let s = TcpStream::connect(("127.0.0.1", port))?;
        s.set_nodelay(true)?;
        s.set_read_timeout(Some(Duration::from_secs(60)))?;
        v.push(s);
    }
    let mut cmd = Vec::new();
    encode(&mut cmd, &[b"PING"]);
    for s in v.iter_mut() {
        s.write_all(&cmd)?;
    }
    // Each PING answers `+PONG\r\n`, 7 bytes.
    for s in v.iter_mut() {
        let mut pong = [0u8; 7];
        s.read_exact(&mut pong)?;
        if &pong != b"+PONG\r\n" {
            return Err(io::Error::other("PING did not answer +PONG"));
        }
    }
    Ok(v)
}

/// Holds `locks` locks `prefix:k` for a long time from `c`.
pub fn hold_locks(c: &mut RawConn, prefix: &str, locks: u64) -> io::Result<()> {
    for k in 0..locks {
        let key = format!("{prefix}:{k}");
        let r = c.ok(&[
            b"LOCK.ACQUIRE",
            key.as_bytes(),
            b"TOKEN",
            b"holder",
            b"PX",
            b"3600000",
        ])?;
        if !matches!(r, Resp::Array(_)) {
            return Err(io::Error::other(format!("could not hold {key}")));
        }
    }
    Ok(())
}

/// Blocks every connection in a LOCK.ACQUIRE ... BLOCK 0 on one of the held locks
/// (round robin) and waits until the server counts them all as waiters.
pub fn block_all(
    c: &mut RawConn,
    conns: &mut [TcpStream],
    prefix: &str,
    locks: u64,
) -> io::Result<()> {
    let before = c.info_u64("lock", "lock_waiters")?;
    let mut buf = Vec::new();
    for (i, s) in conns.iter_mut().enumerate() {
        let key = format!("{prefix}:{}", i as u64 % locks);
        let mut token = b"waiter-".to_vec();
        token.extend_from_slice(&padded(i as u64, 29));
        buf.clear();
        encode(
            &mut buf,
            &[
                b"LOCK.ACQUIRE",
                key.as_bytes(),
                b"TOKEN",
                &token,
                b"PX",
                b"600000",
                b"BLOCK",
                b"0",
            ],
        );
        s.write_all(&buf)?;
    }
    let want = before + conns.len() as u64;
    wait_for(c, "lock_waiters", |v| v == want, Duration::from_secs(120))
}

/// Polls `INFO lock` until `field` satisfies `ok`.
pub fn wait_for(
    c: &mut RawConn,
    field: &str,
    ok: impl Fn(u64) -> bool,
    limit: Duration,
) -> io::Result<()> {
    let start = Instant::now();
    loop {
        let v = c.info_u64("lock", field)?;
        if ok(v) {
            return Ok(());
        }
        if start.elapsed() > limit {
            return Err(io::Error::other(format!(
                "{field} stuck at {v} after {limit:?}"
            )));
        }
        sleep(Duration::from_millis(50));
    }
}

/// Waits long enough for the server's client cron to shrink idle query/reply buffers,
/// so the two states compared have settled buffers.
fn settle() {
    sleep(Duration::from_secs(4));
}

fn waiter_memory(server: &Server, cfg: &Config) -> io::Result<WaiterMemory> {
    let mut c = server.conn()?;
    flushall(&mut c)?;
    hold_locks(&mut c, "wl", cfg.wait_locks)?;
    settle();
    let m_none = used_memory(&mut c)?;
    let mut conns = connect_many(server.port, cfg.waiters)?;
    settle();
    let m_idle = used_memory(&mut c)?;
    block_all(&mut c, &mut conns, "wl", cfg.wait_locks)?;
    settle();
    let m_blocked = used_memory(&mut c)?;
    drop(conns);
    wait_for(&mut c, "lock_waiters", |v| v == 0, Duration::from_secs(60))?;
    flushall(&mut c)?;
    let w = cfg.waiters as f64;
    Ok(WaiterMemory {
        waiters: cfg.waiters,
        locks: cfg.wait_locks,
        per_waiter: (m_blocked - m_idle) / w,
        per_waiter_with_conn: (m_blocked - m_none) / w,
    })
}
