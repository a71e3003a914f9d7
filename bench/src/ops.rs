//! The commands compared: the module's and the recipe it replaces, as load-generator
//! workloads with the reply each must give when the keys are in the intended state.

use std::io::{self, Write as _};

use redis_lock_testkit::{encode, RawConn, Resp};

use crate::load::{self, Expect, Workload};

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

/// `n` as decimal text, zero-padded to `width` digits.
pub fn padded(n: u64, width: usize) -> Vec<u8> {
    format!("{n:0width$}").into_bytes()
}

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

    /// Commands sent per counted operation.
    pub fn commands_per_op(self) -> u64 {
        match self {
            Op::CycleModule | Op::CycleRecipe => 2,
            _ => 1,
        }
    }

    /// What must hold the keys before this op runs, if anything.
    pub fn needs_held(self) -> Option<Op> {
        match self {
            Op::Release | Op::Extend => Some(Op::Acquire),
            Op::EvalRelease | Op::EvalExtend => Some(Op::SetNx),
            _ => None,
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

/// One op applied to a key space. `wrap` > 0 makes op `i` use key `i % wrap`
/// (for commands that leave the key held, like EXTEND).
pub struct OpLoad<'a> {
    pub op: Op,
    pub prefix: &'a [u8],
    pub scripts: &'a Scripts,
    pub wrap: u64,
}

impl OpLoad<'_> {
    fn key_index(&self, i: u64) -> u64 {
        if self.wrap > 0 {
            i % self.wrap
        } else {
            i
        }
    }
}

/// Appends the single command `op` on `k`.
pub fn encode_op(op: Op, k: &[u8], s: &Scripts, out: &mut Vec<u8>) {
    match op {
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
}

pub fn expect_op(op: Op) -> Expect {
    match op {
        Op::Ping => Expect::Any,
        Op::SetNx => Expect::Ok,
        Op::Acquire | Op::AcquireGen => Expect::Grant,
        Op::Release | Op::EvalRelease | Op::Extend | Op::EvalExtend => Expect::Int(1),
        Op::CycleModule | Op::CycleRecipe => Expect::Any,
    }
}

impl Workload for OpLoad<'_> {
    fn encode(&self, conn: usize, i: u64, out: &mut Vec<u8>) {
        match self.op {
            Op::CycleModule | Op::CycleRecipe => {
                let k = key(self.prefix, conn, i / 2);
                let step = match (self.op, i % 2) {
                    (Op::CycleModule, 0) => Op::Acquire,
                    (Op::CycleModule, _) => Op::Release,
                    (_, 0) => Op::SetNx,
                    _ => Op::EvalRelease,
                };
                encode_op(step, &k, self.scripts, out);
            }
            op => {
                let k = key(self.prefix, conn, self.key_index(i));
                encode_op(op, &k, self.scripts, out);
            }
        }
    }

    fn expect(&self, _conn: usize, i: u64) -> Expect {
        match (self.op, i % 2) {
            (Op::CycleModule, 0) => Expect::Grant,
            (Op::CycleRecipe, 0) => Expect::Ok,
            (Op::CycleModule | Op::CycleRecipe, _) => Expect::Int(1),
            (op, _) => expect_op(op),
        }
    }
}

/// Makes keys `prefix:ccc:0..n` held with TOKEN, by `fill` (ACQUIRE or SET NX PX), using
/// the same connection numbering as the measured run.
pub fn prefill(
    port: u16,
    conns: usize,
    per_conn: u64,
    fill: Op,
    prefix: &[u8],
    scripts: &Scripts,
) -> io::Result<()> {
    let w = OpLoad {
        op: fill,
        prefix,
        scripts,
        wrap: 0,
    };
    load::run(port, conns, 64, per_conn, &w)?.checked("pre-filling held keys")?;
    Ok(())
}

/// Empties the server synchronously (Valkey 8 flushes in the background by default,
/// which would make the next `used_memory` reading meaningless) and waits until no
/// lazy-free work is pending.
pub fn flushall(c: &mut RawConn) -> io::Result<()> {
    c.ok(&[b"FLUSHALL", b"SYNC"])?;
    let start = std::time::Instant::now();
    while c
        .info_u64("memory", "lazyfree_pending_objects")
        .unwrap_or(0)
        > 0
    {
        if start.elapsed() > std::time::Duration::from_secs(60) {
            return Err(io::Error::other("lazy free still pending after 60 s"));
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    Ok(())
}
