//! The same comparisons with the stock `redis-benchmark`, re-runnable by hand. It cannot
//! check replies: ACQUIRE and SET draw from 10^9 random keys of an empty server (repeats,
//! about 1 in 10^4, are checked through INFO); EXTEND runs on keys held with its token.

use std::io;

use redis_lock_report::perf::{self, CrossCheck, RbPair};
use redis_lock_testkit::run_cmd;

use crate::load;
use crate::ops::{self, flushall, TOKEN};
use crate::stats::{ab, median, pair_medians};
use crate::{Rig, Server};

const EXTEND_KEYS: u64 = 100_000;

/// Runs `redis-benchmark` with `opts` and `cmd`, returns requests per second.
fn bench(port: u16, opts: &str, cmd: &str) -> io::Result<f64> {
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

/// Holds `ek:000000000000`.. (the names `__rand_int__` makes) as module or string locks.
fn hold_extend_keys(s: &Server, module: bool) -> io::Result<()> {
    let conns = 4usize;
    let per = EXTEND_KEYS / conns as u64;
    let op = if module { &ops::ACQUIRE } else { &ops::SET_NX };
    let w = |conn: usize, i: u64, out: &mut Vec<u8>| {
        let k = format!("ek:{:012}", conn as u64 * per + i);
        op.put(0, k.as_bytes(), &s.scripts, b"", out)
    };
    load::run(s.port, conns, 256, per, "holding the EXTEND keys", &w)?;
    Ok(())
}

pub fn run(rig: &Rig) -> io::Result<CrossCheck> {
    let (s, cfg) = (&rig.lock, &rig.lock.cfg);
    let tok = String::from_utf8_lossy(TOKEN).into_owned();
    let ext_sha = String::from_utf8_lossy(&rig.plain.scripts.extend).into_owned();
    let mut cc = CrossCheck::default();
    let (mut c, mut plain) = (s.conn()?, rig.plain.conn()?);
    for p in perf::PIPELINES {
        let n = cfg.ops(p);
        let base = format!("-c {} -P {p} -n {n}", cfg.clients);
        cc.options.push((p, base.clone()));
        let random = format!("{base} -r 1000000000");
        let held = format!("{base} -r {EXTEND_KEYS}");
        let acq = format!("LOCK.ACQUIRE lk:__rand_int__ TOKEN {tok} PX 600000");
        let set = format!("SET sk:__rand_int__ {tok} NX PX 600000");
        let ext = format!("LOCK.EXTEND ek:__rand_int__ {tok} PX 600000");
        let eval = format!("EVALSHA {ext_sha} 1 ek:__rand_int__ {tok} 600000");
        let mut pings = vec![];
        // (A, B) per round: ACQUIRE vs SET, EXTEND vs EVALSHA.
        let (mut pa, mut pe) = (vec![], vec![]);
        for round in 0..cfg.rb_rounds {
            flushall(&mut c)?;
            pings.push(bench(s.port, &base, "PING")?);
            let ((a1, e1), (a2, e2)) = ab(round, |module| {
                let on = if module { &rig.lock } else { &rig.plain };
                flushall(&mut c)?;
                flushall(&mut plain)?;
                let before = c.info_u64("lock", "lock_renewed")?;
                let a = bench(on.port, &random, if module { &acq } else { &set })?;
                let renewed = c.info_u64("lock", "lock_renewed")? - before;
                if renewed * 100 > n {
                    bail!("{renewed} of {n} random ACQUIREs hit a held key");
                }
                flushall(&mut c)?;
                flushall(&mut plain)?;
                hold_extend_keys(on, module)?;
                let e = bench(on.port, &held, if module { &ext } else { &eval })?;
                Ok((a, e))
            })?;
            pa.push((a1, a2));
            pe.push((e1, e2));
            eprintln!(
                "  [{}] redis-benchmark P{p} round {}/{}: acquire/set {:.2}, extend/evalsha {:.2}",
                s.label,
                round + 1,
                cfg.rb_rounds,
                a1 / a2,
                e1 / e2
            );
        }
        cc.ping.push((p, median(&pings)));
        for (name, a_cmd, b_cmd, got) in
            [(perf::ACQUIRE, acq, set, pa), (perf::EXTEND, ext, eval, pe)]
        {
            let [a, b, ratio] = pair_medians(&got);
            cc.pairs.push(RbPair {
                name: name.to_string(),
                pipeline: p,
                a_cmd,
                b_cmd,
                a,
                b,
                ratio,
            });
        }
    }
    Ok(cc)
}
