//! The commands compared, as data (words, and the replies they must get when the keys
//! are in the intended state), and the server states the suites share (empty, waiters).

use std::io::{self, Write as _};
use std::thread::sleep;
use std::time::{Duration, Instant};

use redis_lock_testkit::{lock, RawConn, Resp};

use crate::load::{Peer, Shape};

/// A 36-byte token, the length of the UUID a client would generate.
pub const TOKEN: &[u8] = b"6f1c1b9e-3a5d-4c2e-9b7a-0d8e2f4a1c3b";
/// Lease used everywhere: long enough that nothing expires during a run.
pub const TTL: &[u8] = b"600000";
/// Holders of the crowded SHARED key (issue 18, row 9).
pub const CROWD: u64 = 20_000;

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

/// What must hold an op's keys before it runs.
#[derive(Debug, Clone, Copy)]
pub enum Needs {
    Nothing,
    /// This op, on the same keys, which the op then takes away (RELEASE, DEL).
    Held(&'static Op),
    /// The same, but the op leaves the keys as they were (EXTEND, GET): reusable.
    Kept(&'static Op),
    /// The op itself, this many times on other keys first (a crowded lock).
    Crowd(u64),
}

/// One command, or several on the same key (`a + b`). In `words`, `{k}` is the op's key,
/// `{d}` its data key (`{k}:data`), `{t}` the [`TOKEN`], `{f}` the fence of the lock on
/// `{k}`, `{release}`/`{extend}` the SHA1s of the recipe's scripts; `reply` per command.
#[derive(Debug)]
pub struct Op {
    pub words: &'static str,
    pub reply: &'static [Shape],
    pub needs: Needs,
    /// Commands per round trip a client sends one op in; empty: the run's pipeline depth.
    pub trips: &'static [u64],
}

const fn op(words: &'static str, reply: &'static [Shape], needs: Needs) -> Op {
    Op {
        words,
        reply,
        needs,
        trips: &[],
    }
}

/// An op sent as the round trips `trips`, on a lock held beforehand.
const fn txn(words: &'static str, reply: &'static [Shape], trips: &'static [u64]) -> Op {
    Op {
        words,
        reply,
        needs: Nothing,
        trips,
    }
}

use Needs::{Crowd, Held, Kept, Nothing};
use Shape::{Array, Bulk, Int, Status};
/// The replies of a grant (`[token, fence]`), of `+OK` and of `:1`.
const GRANT: &[Shape] = &[Array(2)];
const OK: &[Shape] = &[Status(true)];
const ONE: &[Shape] = &[Int(1)];
pub const PING: Op = op("PING", &[Status(false)], Nothing);
pub const SET_NX: Op = op("SET {k} {t} NX PX 600000", OK, Nothing);
pub const SET_PX: Op = op("SET {k} {t} PX 600000", OK, Nothing);
pub const SET: Op = op("SET {k} {t}", OK, Nothing);
pub const GET: Op = op("GET {k}", &[Bulk], Kept(&SET));
pub const EXPIRE: Op = op("EXPIRE {k} 600", ONE, Kept(&SET));
pub const DEL: Op = op("DEL {k}", ONE, Held(&SET));
pub const EVAL_RELEASE: Op = op("EVALSHA {release} 1 {k} {t}", ONE, Held(&SET_NX));
pub const EVAL_EXTEND: Op = op("EVALSHA {extend} 1 {k} {t} 600000", ONE, Kept(&SET_NX));
/// Valkey 9's native compare-and-delete and compare-and-set of a string lock.
pub const DELIFEQ: Op = op("DELIFEQ {k} {t}", ONE, Held(&SET_NX));
pub const SET_IFEQ: Op = op("SET {k} {t} IFEQ {t} PX 600000", OK, Kept(&SET_NX));
pub const ACQUIRE: Op = op("LOCK.ACQUIRE {k} TOKEN {t} PX 600000", GRANT, Nothing);
pub const ACQUIRE_GEN: Op = op("LOCK.ACQUIRE {k} PX 600000", GRANT, Nothing);
pub const RELEASE: Op = op("LOCK.RELEASE {k} {t}", ONE, Held(&ACQUIRE));
pub const EXTEND: Op = op("LOCK.EXTEND {k} {t} PX 600000", ONE, Kept(&ACQUIRE));
pub const SHARED: Op = op(
    "LOCK.ACQUIRE {k} SHARED TOKEN {t} PX 600000",
    GRANT,
    Nothing,
);
/// A reader more of one key, its own key as its token.
pub const SHARED_CROWD: Op = op(
    "LOCK.ACQUIRE crowded SHARED TOKEN {k} PX 600000",
    GRANT,
    Crowd(CROWD),
);
pub const CYCLE: Op = op(
    "LOCK.ACQUIRE {k} TOKEN {t} PX 600000 + LOCK.RELEASE {k} {t}",
    &[Array(2), Int(1)],
    Nothing,
);
pub const CYCLE_RECIPE: Op = op(
    "SET {k} {t} NX PX 600000 + EVALSHA {release} 1 {k} {t}",
    &[Status(true), Int(1)],
    Nothing,
);
/// The floor (bench/floor): a module value, its expiry, `[token, fence]`; no expiry.
pub const FLOOR: Op = op("FLOOR.ACQUIRE {k} {t} 600000", GRANT, Nothing);
pub const FLOOR_NOEXP: Op = op("FLOOR.ACQUIRE {k} {t} 0", GRANT, Nothing);

/// The data key `{d}` of a guarded write is the lock key and this.
pub const DATA_SUFFIX: &[u8] = b":data";

/// Guarded writes (issue 23): `{d}` written only while the lock on `{k}` is held; the
/// plain write is the floor. The classic form (`WATCH`, read and compare, `MULTI`..`EXEC`)
/// goes in three round trips as redis-py, node-redis and go-redis send it, or in two.
pub const GUARD_SET: Op = op("SET {d} value-0001", OK, Nothing);
pub const IFHELD: Op = op("LOCK.IFHELD {k} {t} SET {d} value-0001", OK, Nothing);
pub const IFFENCE: Op = op("LOCK.IFFENCE {k} {f} SET {d} value-0001", OK, Nothing);
pub const CHECK: Op = op("LOCK.CHECK {k} {f}", ONE, Nothing);
/// `+QUEUED` is a status not `OK`; `EXEC` one reply per command (nil, aborted: a failure).
const WATCHED: [Shape; 5] = [Status(true), Bulk, Status(true), Status(false), Array(1)];
const WATCHED_CHECK: [Shape; 5] = [Status(true), Int(1), Status(true), Status(false), Array(1)];
pub const WATCH_GET: Op = txn(
    "WATCH {k} + GET {k} + MULTI + SET {d} value-0001 + EXEC",
    &WATCHED,
    &[1, 1, 3],
);
pub const WATCH_GET_2RT: Op = Op {
    trips: &[2, 3],
    ..WATCH_GET
};
pub const WATCH_CHECK: Op = txn(
    "WATCH {k} + LOCK.CHECK {k} {f} + MULTI + SET {d} value-0001 + EXEC",
    &WATCHED_CHECK,
    &[1, 1, 3],
);

impl Op {
    /// The command as a user would type it, for the report.
    pub fn shown(&self) -> String {
        (self
            .words
            .replace("{k}", "k")
            .replace("{t}", "<36-byte token>")
            .replace("{d}", "k:data")
            .replace("{f}", "<fence>"))
        .replace("{release}", "<release.lua>")
        .replace("{extend}", "<extend.lua>")
    }

    /// Commands sent per counted operation (2 for a cycle).
    pub fn commands_per_op(&self) -> u64 {
        self.reply.len() as u64
    }

    /// Appends command `step` of the op on key `k` (`{f}`: `fence`); the reply it must get.
    pub fn put(
        &self,
        step: usize,
        k: &[u8],
        s: &Scripts,
        fence: &[u8],
        out: &mut Vec<u8>,
    ) -> Option<Shape> {
        let words = self.words.split(" + ").nth(step).unwrap_or(self.words);
        // Writing into a Vec cannot fail.
        let _ = write!(out, "*{}\r\n", words.split(' ').count());
        for w in words.split(' ') {
            let a: &[u8] = match w {
                "{k}" | "{d}" => k,
                "{t}" => TOKEN,
                "{f}" => fence,
                "{release}" => &s.release,
                "{extend}" => &s.extend,
                w => w.as_bytes(),
            };
            let data: &[u8] = if w == "{d}" { DATA_SUFFIX } else { b"" };
            let _ = write!(out, "${}\r\n", a.len() + data.len());
            out.extend_from_slice(a);
            out.extend_from_slice(data);
            out.extend_from_slice(b"\r\n");
        }
        self.reply.get(step).copied()
    }

    /// The op as a workload on keys `prefix:ccc:iiiiiiiii`, each connection on its own
    /// keys (a cycle's commands on one); `wrap` > 0: op `i` on key `i % wrap`.
    pub fn load<'a>(
        &'a self,
        prefix: &'a [u8],
        s: &'a Scripts,
        wrap: u64,
    ) -> impl Fn(usize, u64, &mut Vec<u8>) -> Option<Shape> + 'a {
        let n = self.commands_per_op();
        move |conn, i, out| {
            let j = if wrap > 0 { i / n % wrap } else { i / n };
            self.put((i % n) as usize, &key(prefix, conn, j), s, b"", out)
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

/// How long the waits on an INFO field pause between readings.
const PAUSE: Duration = Duration::from_millis(20);

/// Empties the server synchronously (Valkey 8 flushes in the background by default,
/// which would skew the next `used_memory`) and waits until no lazy free is pending.
pub fn flushall(c: &mut RawConn) -> io::Result<()> {
    c.ok(&[b"FLUSHALL", b"SYNC"])?;
    let want = [("lazyfree_pending_objects", 0)];
    wait_for(c, "memory", &want, PAUSE, Duration::from_secs(60))
}

/// Polls `INFO <section>`, `pause` apart, until every `(field, value)` of `want` holds
/// (a field the server does not have reads 0).
pub fn wait_for(
    c: &mut RawConn,
    section: &str,
    want: &[(&str, u64)],
    pause: Duration,
    limit: Duration,
) -> io::Result<()> {
    let start = Instant::now();
    loop {
        let info = c.info(section)?;
        let get = |f: &str| {
            info.iter()
                .find(|(k, _)| k == f)
                .and_then(|(_, v)| v.parse().ok())
        };
        let off = want.iter().map(|&(f, w)| (f, get(f).unwrap_or(0), w));
        let Some((field, v, _)) = off.into_iter().find(|(_, v, w)| v != w) else {
            return Ok(());
        };
        if start.elapsed() > limit {
            bail!("INFO {section}: {field} stuck at {v} after {limit:?}");
        }
        sleep(pause);
    }
}

/// Connections blocked in `LOCK.ACQUIRE ... BLOCK 0`, on locks `wl:k` held from another.
pub struct Waiters(Vec<Peer>);

impl Waiters {
    /// Holds `locks` locks, opens `count` connections (each answered PING), blocks each on
    /// a lock (round robin) until all are counted; `step` runs after each stage.
    pub fn block(
        c: &mut RawConn,
        port: u16,
        count: u64,
        locks: u64,
        mut step: impl FnMut(&mut RawConn) -> io::Result<()>,
    ) -> io::Result<Waiters> {
        for k in 0..locks {
            let key = format!("wl:{k}");
            let hold = ["TOKEN", "holder-token-0001", "PX", "3600000"];
            if lock::acquire(c, &key, &hold)?.is_none() {
                bail!("could not hold {key}");
            }
        }
        step(c)?;
        let mut conns = Vec::with_capacity(count as usize);
        for _ in 0..count {
            let mut p = Peer::connect(port)?;
            p.send(&["PING"])?;
            if p.reply()?.1 != b"+PONG\r\n" {
                bail!("PING did not answer +PONG");
            }
            conns.push(p);
        }
        step(c)?;
        let before = c.info_u64("lock", "lock_waiters")?;
        for (i, p) in conns.iter_mut().enumerate() {
            let (k, token) = (i as u64 % locks, format!("waiter-{i:029}"));
            let cmd = format!("LOCK.ACQUIRE wl:{k} TOKEN {token} PX 600000 BLOCK 0");
            p.send(&cmd.split(' ').collect::<Vec<_>>())?;
        }
        let want = [("lock_waiters", before + count)];
        wait_for(c, "lock", &want, PAUSE, Duration::from_secs(120))?;
        step(c)?;
        Ok(Waiters(conns))
    }

    /// Disconnects the waiters and waits until the server has none left.
    pub fn release(self, c: &mut RawConn) -> io::Result<()> {
        drop(self.0);
        let want = [("lock_waiters", 0)];
        wait_for(c, "lock", &want, PAUSE, Duration::from_secs(60))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ops_expand_their_words() {
        let s = Scripts {
            release: b"sha1".to_vec(),
            extend: b"sha2".to_vec(),
        };
        let mut out = Vec::new();
        assert_eq!(CYCLE_RECIPE.put(1, b"k", &s, b"", &mut out), Some(Int(1)));
        let want = format!(
            "*5\r\n$7\r\nEVALSHA\r\n$4\r\nsha1\r\n$1\r\n1\r\n$1\r\nk\r\n$36\r\n{}\r\n",
            String::from_utf8_lossy(TOKEN)
        );
        assert_eq!(String::from_utf8_lossy(&out), want);
        assert_eq!(EXTEND.shown(), "LOCK.EXTEND k <36-byte token> PX 600000");
        let (mut a, mut b) = (Vec::new(), Vec::new());
        let w = CYCLE.load(b"p", &s, 0);
        assert_eq!(
            (w(3, 2, &mut a), w(3, 3, &mut b)),
            (Some(Array(2)), Some(Int(1)))
        );
        let mut g = Vec::new();
        assert_eq!(IFFENCE.put(0, b"k", &s, b"42", &mut g), Some(Status(true)));
        assert_eq!(
            String::from_utf8_lossy(&g),
            "*6\r\n$12\r\nLOCK.IFFENCE\r\n$1\r\nk\r\n$2\r\n42\r\n$3\r\nSET\r\n$6\r\nk:data\r\n$10\r\nvalue-0001\r\n"
        );
        assert_eq!(
            WATCH_CHECK.shown(),
            "WATCH k + LOCK.CHECK k <fence> + MULTI + SET k:data value-0001 + EXEC"
        );
        assert_eq!(
            WATCH_GET.trips.iter().sum::<u64>(),
            WATCH_GET.commands_per_op()
        );
        assert!(a.ends_with(b"$15\r\np:003:000000001\r\n$5\r\nTOKEN\r\n$36\r\n6f1c1b9e-3a5d-4c2e-9b7a-0d8e2f4a1c3b\r\n$2\r\nPX\r\n$6\r\n600000\r\n"));
    }
}
