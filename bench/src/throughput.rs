//! Throughput with the stock `redis-benchmark` (C, one thread: it outruns the server, which
//! PING shows beside every comparison): each module command against the command it
//! replaces, both sent to the same server, pipeline 1 and 16, A and B alternated (ABBA).
//! `redis-benchmark` checks no reply, so every run is checked by what it left behind: the
//! keys a grant made, the held keys a release removed, the module's own counters.

use std::io;

use redis_lock_report::perf::{self, PairResult, Throughput};
use redis_lock_testkit::{run_cmd, RawConn};

use crate::load::Shape;
use crate::ops::{flushall, TOKEN, TTL};
use crate::stats::{ab, median, pair_medians, quantiles};
use crate::{On, Rig, Server};

/// Random key names for grants: `__rand_int__` is 12 digits below this.
const RANDOM_KEYS: u64 = 100_000_000;
/// Held keys an EXTEND picks from (all held, with the token it sends).
const EXTEND_KEYS: u64 = 100_000;

/// What must hold the keys `hk:000000000000`.. before a side runs.
#[derive(Clone, Copy, PartialEq)]
enum Hold {
    Nothing,
    /// Module locks with the token: `LOCK.ACQUIRE`.
    Lock,
    /// String locks with the token: `SET NX PX`.
    String,
}

/// What a side's run must leave behind, checked after it.
#[derive(Clone, Copy)]
enum Leaves {
    /// About one new key per command (a grant).
    Granted,
    /// Most held keys gone (a release on `2 × n` held keys: ~79% of picks find theirs).
    Released,
    /// The held keys still there.
    Kept,
}

/// One side of a comparison: the command line (`{t}` the token, `{release}`/`{extend}`
/// the scripts' SHA1s), its server, its keys.
#[derive(Clone, Copy)]
struct Side {
    cmd: &'static str,
    on: On,
    hold: Hold,
    leaves: Leaves,
}

const fn side(cmd: &'static str, on: On, hold: Hold, leaves: Leaves) -> Side {
    Side {
        cmd,
        on,
        hold,
        leaves,
    }
}

use Hold::{Lock, String as Str};
use Leaves::{Granted, Kept, Released};
const ACQUIRE: Side = side(
    "LOCK.ACQUIRE ak:__rand_int__ TOKEN {t} PX 600000",
    On::Lock,
    Hold::Nothing,
    Granted,
);
const SET_NX: Side = side(
    "SET sk:__rand_int__ {t} NX PX 600000",
    On::Lock,
    Hold::Nothing,
    Granted,
);
const FLOOR: Side = side(
    "FLOOR.ACQUIRE fk:__rand_int__ {t} 600000",
    On::Floor,
    Hold::Nothing,
    Granted,
);
const FLOOR_SET_NX: Side = Side {
    on: On::Floor,
    ..SET_NX
};
const RELEASE: Side = side("LOCK.RELEASE hk:__rand_int__ {t}", On::Lock, Lock, Released);
const EVAL_RELEASE: Side = side(
    "EVALSHA {release} 1 hk:__rand_int__ {t}",
    On::Lock,
    Str,
    Released,
);
const DELIFEQ: Side = side("DELIFEQ hk:__rand_int__ {t}", On::Lock, Str, Released);
const EXTEND: Side = side(
    "LOCK.EXTEND hk:__rand_int__ {t} PX 600000",
    On::Lock,
    Lock,
    Kept,
);
const EVAL_EXTEND: Side = side(
    "EVALSHA {extend} 1 hk:__rand_int__ {t} 600000",
    On::Lock,
    Str,
    Kept,
);
const SET_IFEQ: Side = side(
    "SET hk:__rand_int__ {t} IFEQ {t} PX 600000",
    On::Lock,
    Str,
    Kept,
);

/// A comparison: its name, the module's side (A), the side it replaces (B), the goals for
/// A/B at pipeline 1 and 16 (issues 11, 21 and 29), and a command B needs (Valkey 9).
struct Pair {
    name: &'static str,
    a: Side,
    b: Side,
    goal: [Option<f64>; 2],
    needs: Option<&'static str>,
}

const PAIRS: [Pair; 6] = [
    Pair {
        name: perf::ACQUIRE,
        a: ACQUIRE,
        b: SET_NX,
        goal: [Some(0.98), Some(0.85)],
        needs: None,
    },
    Pair {
        name: perf::FLOOR,
        a: FLOOR,
        b: FLOOR_SET_NX,
        goal: [None, None],
        needs: None,
    },
    Pair {
        name: perf::RELEASE,
        a: RELEASE,
        b: EVAL_RELEASE,
        goal: [Some(1.1), Some(1.3)],
        needs: None,
    },
    Pair {
        name: perf::EXTEND,
        a: EXTEND,
        b: EVAL_EXTEND,
        goal: [None, None],
        needs: None,
    },
    Pair {
        name: perf::RELEASE_DELIFEQ,
        a: RELEASE,
        b: DELIFEQ,
        goal: [None, Some(0.9)],
        needs: Some("delifeq"),
    },
    Pair {
        name: perf::EXTEND_IFEQ,
        a: EXTEND,
        b: SET_IFEQ,
        goal: [None, None],
        needs: Some("delifeq"),
    },
];

/// The command line of a side as sent (scripts' SHA1s of `s`, the token).
fn line(side: &Side, s: &Server) -> String {
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    side.cmd
        .replace("{t}", &text(TOKEN))
        .replace("{release}", &text(&s.scripts.release))
        .replace("{extend}", &text(&s.scripts.extend))
}

/// The command line as shown (the token and the scripts named, not spelled out).
fn shown(side: &Side) -> String {
    side.cmd
        .replace("{t}", "<36-byte token>")
        .replace("{release}", "<release.lua>")
        .replace("{extend}", "<extend.lua>")
}

/// `redis-benchmark` with `opts` and the command `cmd` against `port`: requests per second.
pub fn bench(port: u16, opts: &str, cmd: &str) -> io::Result<f64> {
    let port = port.to_string();
    let mut argv = vec!["redis-benchmark", "-h", "127.0.0.1", "-p", &port, "--csv"];
    argv.extend(opts.split_whitespace().chain(cmd.split_whitespace()));
    let text = run_cmd(&argv).map_err(io::Error::other)?;
    // "test","rps",...: the second field of the line after the header.
    let line = text
        .lines()
        .find(|l| !l.starts_with("\"test\"") && l.starts_with('"'));
    line.and_then(|l| l.split("\",\"").nth(1))
        .and_then(|f| f.trim_matches('"').parse().ok())
        .ok_or_else(|| io::Error::other(format!("redis-benchmark printed no result: {text}")))
}

/// Holds `hk:000000000000` .. `hk:<count-1>` (the names `__rand_int__` makes below
/// `count`) as module or string locks with the token.
fn hold(s: &Server, hold: Hold, count: u64) -> io::Result<()> {
    let conns = 4usize;
    let per = count.div_ceil(conns as u64);
    let w = |conn: usize, i: u64, out: &mut Vec<u8>| {
        let k = format!("hk:{:012}", conn as u64 * per + i);
        let k = k.as_bytes();
        let ttl: &[u8] = TTL;
        match hold {
            Lock => {
                redis_lock_testkit::encode(out, &[b"LOCK.ACQUIRE", k, b"TOKEN", TOKEN, b"PX", ttl]);
                Some(Shape::Array(2))
            }
            _ => {
                redis_lock_testkit::encode(out, &[b"SET", k, TOKEN, b"NX", b"PX", ttl]);
                Some(Shape::Status(true))
            }
        }
    };
    crate::load::run(s.port, conns, 256, per, "holding keys", &w)?;
    Ok(())
}

/// The key count, and (`module`) the module's grant, release and extend counters.
fn counts(c: &mut RawConn, module: bool) -> io::Result<[u64; 4]> {
    let keys = match c.call(&["DBSIZE"])? {
        redis_lock_testkit::Resp::Int(n) => n.max(0) as u64,
        other => bail!("DBSIZE replied {other:?}"),
    };
    if !module {
        return Ok([keys, 0, 0, 0]);
    }
    let mut f = |field| c.info_u64("lock", field);
    Ok([
        keys,
        f("lock_acquired")?,
        f("lock_released")?,
        f("lock_extended")?,
    ])
}

/// One run of `side` on an emptied server with its keys held: requests per second.
fn measure(rig: &Rig, side: &Side, pipeline: usize, n: u64) -> io::Result<f64> {
    let s = rig.on(side.on);
    let mut c = s.conn()?;
    flushall(&mut c)?;
    let held = match side.leaves {
        Granted => 0,
        Released => 2 * n,
        Kept => EXTEND_KEYS,
    };
    if side.hold != Hold::Nothing {
        hold(s, side.hold, held)?;
    }
    let module = side.cmd.starts_with("LOCK.");
    let before = counts(&mut c, module)?;
    let keyspace = if held > 0 { held } else { RANDOM_KEYS };
    let opts = format!("-c {} -P {pipeline} -n {n} -r {keyspace}", s.cfg.clients);
    let rate = bench(s.port, &opts, &line(side, s))?;
    let after = counts(&mut c, module)?;
    let delta = |i: usize| after[i].saturating_sub(before[i]);
    let ok = match side.leaves {
        // Random names among 10^8 repeat for about one command in 10^3 here.
        Granted => delta(0) * 100 >= n * 99 && (!module || delta(1) == delta(0)),
        Released => {
            let removed = before[0].saturating_sub(after[0]);
            removed * 100 >= n * 70 && (!module || delta(2) == removed)
        }
        Kept => after[0] == before[0] && (!module || delta(3) == n),
    };
    if !ok {
        bail!(
            "[{}] `{}`: the keys and counters after the run ({before:?} -> {after:?}) are not what {n} successful commands leave",
            s.label,
            shown(side)
        );
    }
    Ok(rate)
}

pub fn run(rig: &Rig) -> io::Result<Throughput> {
    let (cfg, mut t) = (&rig.lock.cfg, Throughput::default());
    let mut pairs = vec![];
    for p in &PAIRS {
        if p.needs.map_or(Ok(true), |c| {
            crate::callgrind::knows(&mut rig.lock.conn()?, c)
        })? {
            pairs.push(p);
        }
    }
    for p in perf::PIPELINES {
        let n = cfg.ops(p);
        let mut rounds: Vec<Vec<(f64, f64)>> = vec![vec![]; pairs.len()];
        let mut pings = vec![];
        for round in 0..cfg.rounds {
            let opts = format!("-c {} -P {p} -n {n}", cfg.clients);
            pings.push(bench(rig.lock.port, &opts, "PING")?);
            for (pair, got) in pairs.iter().zip(rounds.iter_mut()) {
                let side = |a| if a { &pair.a } else { &pair.b };
                got.push(ab(round, |a| measure(rig, side(a), p, n))?);
            }
            let last: Vec<String> = rounds
                .iter()
                .map(|r| format!("{:.2}", r[round].0 / r[round].1))
                .collect();
            eprintln!(
                "  [{}] throughput P{p} round {}/{}: {} (PING {:.0}/s)",
                rig.lock.label,
                round + 1,
                cfg.rounds,
                last.join(" "),
                pings[round]
            );
        }
        t.ping.push((p, median(&pings)));
        for (pair, got) in pairs.iter().zip(rounds) {
            let [a, b, ratio] = pair_medians(&got);
            let mut ratios: Vec<f64> = got.iter().map(|r| r.0 / r.1).collect();
            let [ratio_min, ratio_max] = quantiles(&mut ratios, [0.0, 1.0]);
            t.pairs.push(PairResult {
                name: pair.name.to_string(),
                pipeline: p,
                a,
                b,
                ratio,
                ratio_min,
                ratio_max,
                goal: pair.goal[usize::from(p > 1)],
                a_cmd: shown(&pair.a),
                b_cmd: shown(&pair.b),
                rounds: got,
            });
        }
    }
    Ok(t)
}
