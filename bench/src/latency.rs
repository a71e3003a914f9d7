//! Latency of unpipelined commands from one client: ACQUIRE then RELEASE against SET NX
//! PX then EVALSHA release (without the module), the sides alternated in rounds.

use std::io;
use std::time::Instant;

use redis_lock_report::perf::{Latency, Pcts};
use redis_lock_testkit::{RawConn, Resp};

use crate::load::Shape;
use crate::ops::{self, key};
use crate::stats::{ab, median, quantiles};
use crate::{Rig, Server};

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

/// A side's acquire and release samples, µs.
type Samples = io::Result<[Vec<f64>; 2]>;

/// The samples of `n` acquire/release pairs of the module or the recipe.
fn side(c: &mut RawConn, s: &Server, module: bool, round: usize, n: u64) -> Samples {
    let pairs = [
        [&ops::SET_NX, &ops::EVAL_RELEASE],
        [&ops::ACQUIRE, &ops::RELEASE],
    ];
    let mut samples = [0; 2].map(|_| Vec::with_capacity(n as usize));
    let mut buf = Vec::with_capacity(256);
    for i in 0..n {
        let k = key(b"lat", round, i);
        for (op, out) in pairs[usize::from(module)]
            .into_iter()
            .zip(samples.iter_mut())
        {
            buf.clear();
            let want = op.put(0, &k, &s.scripts, b"", &mut buf);
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
                let shown = op.shown();
                bail!("latency: {shown} replied {reply:?}");
            }
        }
    }
    Ok(samples)
}

pub fn run(rig: &Rig) -> io::Result<Latency> {
    let mut conns = [rig.plain.conn()?, rig.lock.conn()?];
    // Samples of ACQUIRE, RELEASE, SET NX PX, EVALSHA release; per-round p50 ratios.
    let (mut all, mut ratios): ([Vec<f64>; 4], [Vec<f64>; 2]) = Default::default();
    let mut side = |module: bool, round, n| {
        let s = if module { &rig.lock } else { &rig.plain };
        side(&mut conns[usize::from(module)], s, module, round, n)
    };
    // Warm-up (connection, allocator, script cache), not counted.
    side(true, 999, 200)?;
    side(false, 998, 200)?;
    for round in 0..rig.lock.cfg.rounds {
        let ([a, r], [b, e]) = ab(round, |module| side(module, round, rig.lock.cfg.lat_ops))?;
        ratios[0].push(median(&a) / median(&b));
        ratios[1].push(median(&r) / median(&e));
        for (all, v) in all.iter_mut().zip([a, r, b, e]) {
            all.extend(v);
        }
    }
    let [acquire, release, set_nx, eval_release] = all.map(pcts);
    let [acquire_p50_ratio, release_p50_ratio] = ratios.map(|r| median(&r));
    Ok(Latency {
        acquire,
        set_nx,
        release,
        eval_release,
        acquire_p50_ratio,
        release_p50_ratio,
    })
}
