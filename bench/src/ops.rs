//! The commands compared: the module's and the recipe it replaces, as load-generator
//! workloads with the reply each must give when the keys are in the intended state; and
//! the server states the suites share (empty, blocked waiters).

use std::io::{self, Read, Write as _};
use std::net::TcpStream;
use std::thread::sleep;
use std::time::{Duration, Instant};

use redis_lock_testkit::{args, encode, lock, RawConn, Resp};

use crate::load::Shape;

/// A 36-byte token, the length of the UUID a client would generate.
pub const TOKEN: &[u8] = b"6f1c1b9e-3a5d-4c2e-9b7a-0d8e2f4a1c3b";
/// Lease used everywhere: long enough that nothing expires during a run.
pub const TTL: &[u8] = b"600000";

/// The usual owner-checked release of the `SET NX PX` recipe.
pub const RELEASE_LUA: &str =
    "if redis.call('get',KEYS[1]) == ARGV[1] then return redis.call('del',KEYS[1]) else return 0 end";
/// The usual owner-checked extend.
pub const EXTEND_LUA: &str = "if redis.call('get',KEYS[1]) == ARGV[1] then return redis.call('pexpire',KEYS[1],ARGV[2]) else return 0 end";

/// SHA1s of the two scripts as loaded on one server.
#[derive(Debug, Clone)]
pub struct Scripts {
    pub release: Vec<u8>,
    pub extend: Vec<u8>,
}

impl Scripts {
    pub fn load(c: &mut RawConn) -> io::Result<Scripts> {
        let mut sha = |body: &str| match c.ok(&[b"SCRIPT", b"LOAD", body.as_bytes()])? {
            Resp::Bulk(b) => Ok(b),
            other => Err(io::Error::other(format!("SCRIPT LOAD replied {other:?}"))),
        };
        Ok(Scripts {
            release: sha(RELEASE_LUA)?,
            extend: sha(EXTEND_LUA)?,
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Ping,
    /// `SET k tok NX PX 600000` on a free key.
    SetNx,
    /// `LOCK.ACQUIRE k TOKEN tok PX 600000` on a free key.
    Acquire,
    /// `LOCK.ACQUIRE k PX 600000`: the server generates the token.
    AcquireGen,
    /// `LOCK.RELEASE k tok` on a held key.
    Release,
    /// `EVALSHA <release> 1 k tok` on a held string lock.
    EvalRelease,
    /// `LOCK.EXTEND k tok PX 600000` on a held key.
    Extend,
    /// `EVALSHA <extend> 1 k tok 600000` on a held string lock.
    EvalExtend,
    /// ACQUIRE then RELEASE of the same free key (two commands per cycle).
    CycleModule,
    /// `SET NX PX` then `EVALSHA` release of the same free key.
    CycleRecipe,
}

/// The commands listed in the report, in its order.
pub const SHOWN: [Op; 8] = [
    Op::Acquire,
    Op::SetNx,
    Op::Release,
    Op::EvalRelease,
    Op::Extend,
    Op::EvalExtend,
    Op::CycleModule,
    Op::CycleRecipe,
];

impl Op {
    /// The command as a user would type it (sha shortened), for the report.
    pub fn shown(self) -> &'static str {
        match self {
            Op::Ping => "PING",
            Op::SetNx => "SET k <36-byte token> NX PX 600000",
            Op::Acquire => "LOCK.ACQUIRE k TOKEN <36-byte token> PX 600000",
            Op::AcquireGen => "LOCK.ACQUIRE k PX 600000",
            Op::Release => "LOCK.RELEASE k <token>",
            Op::EvalRelease => "EVALSHA <release.lua> 1 k <token>",
            Op::Extend => "LOCK.EXTEND k <token> PX 600000",
            Op::EvalExtend => "EVALSHA <extend.lua> 1 k <token> 600000",
            Op::CycleModule => "LOCK.ACQUIRE k TOKEN t PX 600000 + LOCK.RELEASE k t",
            Op::CycleRecipe => "SET k t NX PX 600000 + EVALSHA <release.lua> 1 k t",
        }
    }

    /// The two commands of a cycle, in order.
    fn cycle(self) -> Option<[Op; 2]> {
        match self {
            Op::CycleModule => Some([Op::Acquire, Op::Release]),
            Op::CycleRecipe => Some([Op::SetNx, Op::EvalRelease]),
            _ => None,
        }
    }

    /// Commands sent per counted operation.
    pub fn commands_per_op(self) -> u64 {
        self.cycle().map_or(1, |c| c.len() as u64)
    }

    /// What must hold the keys before this op runs, if anything.
    pub fn needs_held(self) -> Option<Op> {
        match self {
            Op::Release | Op::Extend => Some(Op::Acquire),
            Op::EvalRelease | Op::EvalExtend => Some(Op::SetNx),
            _ => None,
        }
    }

    /// Appends the single command `self` on `k`; returns the reply it must get.
    pub fn put(self, k: &[u8], s: &Scripts, out: &mut Vec<u8>) -> Option<Shape> {
        match self {
            Op::Ping => encode(out, &[b"PING"]),
            Op::SetNx => encode(out, &[b"SET", k, TOKEN, b"NX", b"PX", TTL]),
            Op::Acquire => encode(out, &[b"LOCK.ACQUIRE", k, b"TOKEN", TOKEN, b"PX", TTL]),
            Op::AcquireGen => encode(out, &[b"LOCK.ACQUIRE", k, b"PX", TTL]),
            Op::Release => encode(out, &[b"LOCK.RELEASE", k, TOKEN]),
            Op::EvalRelease => encode(out, &[b"EVALSHA", &s.release, b"1", k, TOKEN]),
            Op::Extend => encode(out, &[b"LOCK.EXTEND", k, TOKEN, b"PX", TTL]),
            Op::EvalExtend => encode(out, &[b"EVALSHA", &s.extend, b"1", k, TOKEN, TTL]),
            Op::CycleModule | Op::CycleRecipe => unreachable!("a cycle is two commands"),
        }
        match self {
            Op::Ping => None,
            Op::SetNx => Some(Shape::Status(true)),
            Op::Acquire | Op::AcquireGen => Some(Shape::Array(2)),
            _ => Some(Shape::Int(1)),
        }
    }

    /// The op as a workload on keys `prefix:ccc:iiiiiiiii`, each connection on its own
    /// keys; a cycle runs both its commands on one key. `wrap` > 0 makes op `i` use key
    /// `i % wrap` (for commands that leave the key held, like EXTEND).
    pub fn load<'a>(
        self,
        prefix: &'a [u8],
        s: &'a Scripts,
        wrap: u64,
    ) -> impl Fn(usize, u64, &mut Vec<u8>) -> Option<Shape> + 'a {
        move |conn, i, out| match self.cycle() {
            Some(steps) => steps[(i % 2) as usize].put(&key(prefix, conn, i / 2), s, out),
            None if wrap > 0 => self.put(&key(prefix, conn, i % wrap), s, out),
            None => self.put(&key(prefix, conn, i), s, out),
        }
    }
}

/// Key `prefix:ccc:iiiiiiiii`: each connection works on its own keys.
pub fn key(prefix: &[u8], conn: usize, i: u64) -> Vec<u8> {
    let mut k = Vec::with_capacity(prefix.len() + 15);
    k.extend_from_slice(prefix);
    // Writing into a Vec cannot fail.
    let _ = write!(k, ":{conn:03}:{i:09}");
    k
}

/// Empties the server synchronously (Valkey 8 flushes in the background by default,
/// which would make the next `used_memory` reading meaningless) and waits until no
/// lazy-free work is pending.
pub fn flushall(c: &mut RawConn) -> io::Result<()> {
    c.ok(&[b"FLUSHALL", b"SYNC"])?;
    let limit = Duration::from_secs(60);
    wait_for(c, "memory", "lazyfree_pending_objects", 0, limit)
}

/// Polls `INFO <section>` until `field` (0 when the server has no such field) is `want`.
fn wait_for(
    c: &mut RawConn,
    section: &str,
    field: &str,
    want: u64,
    limit: Duration,
) -> io::Result<()> {
    let start = Instant::now();
    loop {
        let info = c.info(section)?;
        let v = info.iter().find(|(k, _)| k == field);
        let v = v.map_or(0, |(_, v)| v.parse().unwrap_or(0));
        if v == want {
            return Ok(());
        }
        if start.elapsed() > limit {
            return Err(io::Error::other(format!(
                "{field} stuck at {v} after {limit:?}"
            )));
        }
        sleep(Duration::from_millis(20));
    }
}

/// Plain connections blocked in `LOCK.ACQUIRE ... BLOCK 0`, on locks `wl:k` held from
/// another connection.
pub struct Waiters(Vec<TcpStream>);

impl Waiters {
    /// Holds `locks` locks for a long time from `c`, opens `count` connections (each of
    /// which has answered a PING), then blocks each on one of the locks (round robin)
    /// and waits until the server counts them all as waiters. `step` runs after each of
    /// the three stages.
    pub fn block(
        c: &mut RawConn,
        port: u16,
        count: u64,
        locks: u64,
        mut step: impl FnMut(&mut RawConn) -> io::Result<()>,
    ) -> io::Result<Waiters> {
        for k in 0..locks {
            let key = format!("wl:{k}");
            if lock::acquire(c, &key, &["TOKEN", "holder", "PX", "3600000"])?.is_none() {
                return Err(io::Error::other(format!("could not hold {key}")));
            }
        }
        step(c)?;
        let mut conns = Vec::with_capacity(count as usize);
        for _ in 0..count {
            let mut s = TcpStream::connect(("127.0.0.1", port))?;
            s.set_nodelay(true)?;
            s.set_read_timeout(Some(Duration::from_secs(60)))?;
            let mut pong = [0u8; 7];
            s.write_all(b"*1\r\n$4\r\nPING\r\n")?;
            s.read_exact(&mut pong)?;
            if &pong != b"+PONG\r\n" {
                return Err(io::Error::other("PING did not answer +PONG"));
            }
            conns.push(s);
        }
        step(c)?;
        let before = c.info_u64("lock", "lock_waiters")?;
        for (i, s) in conns.iter_mut().enumerate() {
            let key = format!("wl:{}", i as u64 % locks);
            let token = format!("waiter-{i:029}");
            let cmd = args!["LOCK.ACQUIRE", key, "TOKEN", token, "PX", TTL, "BLOCK", "0"];
            let mut buf = Vec::new();
            encode(&mut buf, &cmd.iter().map(Vec::as_slice).collect::<Vec<_>>());
            s.write_all(&buf)?;
        }
        let limit = Duration::from_secs(120);
        wait_for(c, "lock", "lock_waiters", before + count, limit)?;
        step(c)?;
        Ok(Waiters(conns))
    }

    /// Disconnects the waiters and waits until the server has none left.
    pub fn release(self, c: &mut RawConn) -> io::Result<()> {
        drop(self.0);
        wait_for(c, "lock", "lock_waiters", 0, Duration::from_secs(60))
    }
}
