//! The same comparisons with the stock `redis-benchmark` (from redis-tools), for anyone
//! who wants to re-run them by hand. It cannot check replies, so the key states are
//! arranged for it: ACQUIRE and SET draw from 10^9 random keys on an empty server (a
//! repeat, which would be a renew or a failed SET, is about 1 in 10^4 and is checked
//! through INFO), and EXTEND runs on keys all held beforehand with the right token.

use std::io;
use std::process::Command;

use redis_lock_report::perf::{CrossCheck, RbPair};
use redis_lock_testkit::encode;

use crate::config::Config;
use crate::load::{self, Expect, FnLoad};
use crate::ops::{flushall, padded, Scripts, TOKEN, TTL};
use crate::stats::median;
use crate::Server;

const EXTEND_KEYS: u64 = 100_000;

/// Runs `redis-benchmark` with `opts` and `cmd`, returns requests per second.
fn bench(port: u16, opts: &[String], cmd: &[String]) -> io::Result<f64> {
    let out = Command::new("redis-benchmark")
        .args(["-h", "127.0.0.1", "-p", &port.to_string(), "--csv"])
        .args(opts)
        .args(cmd)
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find(|l| !l.starts_with("\"test\"") && l.starts_with('"'))
        .ok_or_else(|| {
            io::Error::other(format!(
                "redis-benchmark printed no result: {text}{}",
                String::from_utf8_lossy(&out.stderr)
            ))
        })?;
    let fields: Vec<&str> = line.split("\",\"").collect();
    fields
        .get(1)
        .and_then(|f| f.trim_matches('"').parse().ok())
        .ok_or_else(|| io::Error::other(format!("cannot read rps from {line}")))
}

fn words(s: &str) -> Vec<String> {
    s.split_whitespace().map(String::from).collect()
}

/// Holds `ek:000000000000` .. `ek:<EXTEND_KEYS-1>` (the names `__rand_int__` produces)
/// with TOKEN, as module locks or as string locks.
fn hold_extend_keys(server: &Server, module: bool) -> io::Result<()> {
    let conns = 4usize;
    let per = EXTEND_KEYS / conns as u64;
    let w = FnLoad {
        enc: |conn: usize, i: u64, out: &mut Vec<u8>| {
            let mut k = b"ek:".to_vec();
            k.extend_from_slice(&padded(conn as u64 * per + i, 12));
            if module {
                encode(out, &[b"LOCK.ACQUIRE", &k, b"TOKEN", TOKEN, b"PX", TTL]);
            } else {
                encode(out, &[b"SET", &k, TOKEN, b"NX", b"PX", TTL]);
            }
        },
        exp: move |_, _| if module { Expect::Grant } else { Expect::Ok },
    };
    load::run(server.port, conns, 256, per, &w)?.checked("holding the EXTEND keys")?;
    Ok(())
}

pub fn run(server: &Server, cfg: &Config, scripts: &Scripts) -> io::Result<CrossCheck> {
    let tok = String::from_utf8_lossy(TOKEN).into_owned();
    let ext_sha = String::from_utf8_lossy(&scripts.extend).into_owned();
    let mut cc = CrossCheck::default();
    let mut c = server.conn()?;
    for p in [1usize, 16] {
        let n = if p > 1 { cfg.ops_p16 } else { cfg.ops_p1 };
        let base = format!("-c {} -P {p} -n {n}", cfg.clients);
        cc.options.push((p, base.clone()));
        let random = words(&format!("{base} -r 1000000000"));
        let held = words(&format!("{base} -r {EXTEND_KEYS}"));
        let acq = format!("LOCK.ACQUIRE lk:__rand_int__ TOKEN {tok} PX 600000");
        let set = format!("SET sk:__rand_int__ {tok} NX PX 600000");
        let ext = format!("LOCK.EXTEND ek:__rand_int__ {tok} PX 600000");
        let eval = format!("EVALSHA {ext_sha} 1 ek:__rand_int__ {tok} 600000");
        let mut pings = vec![];
        // (A, B) per round: ACQUIRE vs SET, EXTEND vs EVALSHA.
        let (mut pa, mut pe) = (vec![], vec![]);
        for round in 0..cfg.rb_rounds {
            flushall(&mut c)?;
            pings.push(bench(server.port, &words(&base), &words("PING"))?);
            let mut one = |module: bool| -> io::Result<(f64, f64)> {
                flushall(&mut c)?;
                let before = c.info_u64("lock", "lock_renewed")?;
                let a = if module {
                    bench(server.port, &random, &words(&acq))?
                } else {
                    bench(server.port, &random, &words(&set))?
                };
                let renewed = c.info_u64("lock", "lock_renewed")? - before;
                if renewed * 100 > n {
                    return Err(io::Error::other(format!(
                        "{renewed} of {n} random ACQUIREs hit a held key"
                    )));
                }
                flushall(&mut c)?;
                hold_extend_keys(server, module)?;
                let e = if module {
                    bench(server.port, &held, &words(&ext))?
                } else {
                    bench(server.port, &held, &words(&eval))?
                };
                Ok((a, e))
            };
            let ((a1, e1), (a2, e2)) = if round % 2 == 0 {
                let m = one(true)?;
                (m, one(false)?)
            } else {
                let s = one(false)?;
                (one(true)?, s)
            };
            pa.push((a1, a2));
            pe.push((e1, e2));
            eprintln!(
                "  [{}] redis-benchmark P{p} round {}/{}: acquire/set {:.2}, extend/evalsha {:.2}",
                server.label,
                round + 1,
                cfg.rb_rounds,
                a1 / a2,
                e1 / e2
            );
        }
        cc.ping.push((p, median(&pings)));
        for (name, a_cmd, b_cmd, got) in [
            (redis_lock_report::perf::ACQUIRE, acq, set, pa),
            (redis_lock_report::perf::EXTEND, ext, eval, pe),
        ] {
            let col = |f: fn(&(f64, f64)) -> f64| got.iter().map(f).collect::<Vec<_>>();
            cc.pairs.push(RbPair {
                name: name.to_string(),
                pipeline: p,
                a_cmd,
                b_cmd,
                a: median(&col(|r| r.0)),
                b: median(&col(|r| r.1)),
                ratio: median(&col(|r| r.0 / r.1)),
            });
        }
    }
    flushall(&mut c)?;
    Ok(cc)
}
