//! Latency of unpipelined commands from one client: ACQUIRE then RELEASE against SET NX
//! PX then EVALSHA release (without the module), the sides alternated in rounds.

use std::io;
use std::time::Instant;

use redis_lock_report::perf::{Latency, Pcts};
use redis_lock_testkit::{RawConn, Resp};

use crate::load::Shape;
use crate::ops::{self, key, Scripts};
use crate::stats::{ab, median, quantiles};
use crate::Rig;

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

/// The acquire and the release samples (µs) of `n` pairs of the module or the recipe.
fn side(
    c: &mut RawConn,
    scripts: &Scripts,
    module: bool,
    round: usize,
    n: u64,
) -> io::Result<[Vec<f64>; 2]> {
    let ops = if module {
        [&ops::ACQUIRE, &ops::RELEASE]
    } else {
        [&ops::SET_NX, &ops::EVAL_RELEASE]
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
            let want = op.put(0, &k, scripts, b"", &mut buf);
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

pub fn run(rig: &Rig) -> io::Result<Latency> {
    let (mut lock, mut plain) = (rig.lock.conn()?, rig.plain.conn()?);
    let (mut ma, mut mr, mut sa, mut sr) = (vec![], vec![], vec![], vec![]);
    let (mut acq_ratios, mut rel_ratios) = (vec![], vec![]);
    let mut side = |module: bool, round, n| match module {
        true => side(&mut lock, &rig.lock.scripts, true, round, n),
        false => side(&mut plain, &rig.plain.scripts, false, round, n),
    };
    // Warm-up (connection, allocator, script cache), not counted.
    side(true, 999, 200)?;
    side(false, 998, 200)?;
    for round in 0..rig.lock.cfg.rounds {
        let ([a, r], [b, e]) = ab(round, |module| side(module, round, rig.lock.cfg.lat_ops))?;
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
