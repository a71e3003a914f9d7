//! Latency of single, unpipelined commands from one client with a monotonic clock:
//! ACQUIRE then RELEASE of a free key against SET NX PX then EVALSHA release, the two
//! sides alternated in rounds.

use std::io;
use std::time::Instant;

use redis_lock_report::perf::{Latency, Pcts};
use redis_lock_testkit::{RawConn, Resp};

use crate::config::Config;
use crate::ops::{encode_op, flushall, key, Op, Scripts};
use crate::stats::{median, quantile_sorted};
use crate::Server;

/// Latency percentiles of samples in microseconds.
fn pcts(mut v: Vec<f64>) -> Pcts {
    v.sort_by(f64::total_cmp);
    Pcts {
        p50: quantile_sorted(&v, 0.5),
        p99: quantile_sorted(&v, 0.99),
        p999: quantile_sorted(&v, 0.999),
        n: v.len(),
    }
}

/// Times `n` acquire/release pairs; returns (acquire µs, release µs) samples.
fn side(
    c: &mut RawConn,
    scripts: &Scripts,
    module: bool,
    round: usize,
    n: u64,
) -> io::Result<(Vec<f64>, Vec<f64>)> {
    let (acq, rel) = if module {
        (Op::Acquire, Op::Release)
    } else {
        (Op::SetNx, Op::EvalRelease)
    };
    let mut a = Vec::with_capacity(n as usize);
    let mut r = Vec::with_capacity(n as usize);
    let mut buf = Vec::with_capacity(256);
    for i in 0..n {
        let k = key(b"lat", round, i);
        for (op, out) in [(acq, &mut a), (rel, &mut r)] {
            buf.clear();
            encode_op(op, &k, scripts, &mut buf);
            let t0 = Instant::now();
            c.send_raw(&buf)?;
            let reply = c.read()?;
            out.push(t0.elapsed().as_secs_f64() * 1e6);
            let ok = match (op, &reply) {
                (Op::Acquire, Resp::Array(v)) => v.len() == 2,
                (Op::SetNx, Resp::Simple(s)) => s == "OK",
                (Op::Release | Op::EvalRelease, Resp::Int(1)) => true,
                _ => false,
            };
            if !ok {
                return Err(io::Error::other(format!(
                    "latency: {} replied {reply:?}",
                    op.shown()
                )));
            }
        }
    }
    Ok((a, r))
}

pub fn run(server: &Server, cfg: &Config, scripts: &Scripts) -> io::Result<Latency> {
    let mut c = server.conn()?;
    flushall(&mut c)?;
    let (mut ma, mut mr, mut sa, mut sr) = (vec![], vec![], vec![], vec![]);
    let (mut acq_ratios, mut rel_ratios) = (vec![], vec![]);
    // Warm-up (connection, allocator, script cache), not counted.
    side(&mut c, scripts, true, 999, 200)?;
    side(&mut c, scripts, false, 998, 200)?;
    for round in 0..cfg.rounds {
        let order = if round % 2 == 0 {
            [true, false]
        } else {
            [false, true]
        };
        let mut got = [(vec![], vec![]), (vec![], vec![])];
        for module in order {
            let s = side(&mut c, scripts, module, round, cfg.lat_ops)?;
            got[usize::from(!module)] = s;
        }
        let [(a, r), (b, e)] = got;
        acq_ratios.push(median(&a) / median(&b));
        rel_ratios.push(median(&r) / median(&e));
        ma.extend(a);
        mr.extend(r);
        sa.extend(b);
        sr.extend(e);
    }
    flushall(&mut c)?;
    Ok(Latency {
        acquire: pcts(ma),
        set_nx: pcts(sa),
        release: pcts(mr),
        eval_release: pcts(sr),
        acquire_p50_ratio: median(&acq_ratios),
        release_p50_ratio: median(&rel_ratios),
    })
}
