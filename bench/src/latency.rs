//! Latency of single, unpipelined commands from one client with a monotonic clock:
//! ACQUIRE then RELEASE of a free key against SET NX PX then EVALSHA release, the two
//! sides alternated in rounds.

use std::io;
use std::time::Instant;

use redis_lock_report::perf::{Latency, Pcts};
use redis_lock_testkit::{RawConn, Resp};

use crate::load::Shape;
use crate::ops::{key, Op, Scripts};
use crate::stats::{ab, median, quantiles};
use crate::Server;

/// Latency percentiles of samples in microseconds.
fn pcts(mut v: Vec<f64>) -> Pcts {
    let [p50, p99, p999] = quantiles(&mut v, [0.5, 0.99, 0.999]);
    Pcts {
        p50,
        p99,
        p999,
        n: v.len(),
    }
}

/// Times `n` acquire/release pairs of the module (or of the recipe); returns the
/// acquire and the release samples, µs.
fn side(
    c: &mut RawConn,
    scripts: &Scripts,
    module: bool,
    round: usize,
    n: u64,
) -> io::Result<[Vec<f64>; 2]> {
    let ops = if module {
        [Op::Acquire, Op::Release]
    } else {
        [Op::SetNx, Op::EvalRelease]
    };
    let mut samples = [
        Vec::with_capacity(n as usize),
        Vec::with_capacity(n as usize),
    ];
    let mut buf = Vec::with_capacity(256);
    for i in 0..n {
        let k = key(b"lat", round, i);
        for (op, out) in ops.into_iter().zip(samples.iter_mut()) {
            buf.clear();
            let want = op.put(&k, scripts, &mut buf);
            let t0 = Instant::now();
            c.send_raw(&buf)?;
            let reply = c.read()?;
            out.push(t0.elapsed().as_secs_f64() * 1e6);
            let ok = match (want, &reply) {
                (Some(Shape::Array(2)), Resp::Array(v)) => v.len() == 2,
                (Some(Shape::Status(true)), Resp::Simple(s)) => s == "OK",
                (Some(Shape::Int(want)), Resp::Int(got)) => want == *got,
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
    Ok(samples)
}

pub fn run(s: &Server) -> io::Result<Latency> {
    let (mut c, scripts) = (s.conn()?, &s.scripts);
    let (mut ma, mut mr, mut sa, mut sr) = (vec![], vec![], vec![], vec![]);
    let (mut acq_ratios, mut rel_ratios) = (vec![], vec![]);
    // Warm-up (connection, allocator, script cache), not counted.
    side(&mut c, scripts, true, 999, 200)?;
    side(&mut c, scripts, false, 998, 200)?;
    for round in 0..s.cfg.rounds {
        let ([a, r], [b, e]) = ab(round, |module| {
            side(&mut c, scripts, module, round, s.cfg.lat_ops)
        })?;
        acq_ratios.push(median(&a) / median(&b));
        rel_ratios.push(median(&r) / median(&e));
        ma.extend(a);
        mr.extend(r);
        sa.extend(b);
        sr.extend(e);
    }
    Ok(Latency {
        acquire: pcts(ma),
        set_nx: pcts(sa),
        release: pcts(mr),
        eval_release: pcts(sr),
        acquire_p50_ratio: median(&acq_ratios),
        release_p50_ratio: median(&rel_ratios),
    })
}
