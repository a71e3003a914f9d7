//! Throughput of each module command against the recipe command it replaces, pipeline 1
//! and 16, A and B alternated (ABBA), with PING as the ceiling.

use std::io;

use redis_lock_report::perf::{self, PairResult, Throughput};

use crate::load;
use crate::ops::{self, flushall, Needs, Op};
use crate::stats::{ab, median, pair_medians, quantiles};
use crate::{On, Rig};

/// A side of a comparison: the op and the server it runs on.
type Side = (&'static Op, On);

/// The comparisons: the module's way (A, on the server `On`) against the recipe (B, on
/// the same binary without the module).
pub const PAIRS: [(&str, &Op, On, &Op); 5] = [
    (perf::ACQUIRE, &ops::ACQUIRE, On::Lock, &ops::SET_NX),
    (perf::FLOOR, &ops::FLOOR, On::Floor, &ops::SET_NX),
    (perf::RELEASE, &ops::RELEASE, On::Lock, &ops::EVAL_RELEASE),
    (perf::EXTEND, &ops::EXTEND, On::Lock, &ops::EVAL_EXTEND),
    (perf::CYCLE, &ops::CYCLE, On::Lock, &ops::CYCLE_RECIPE),
];
/// The goals for A/B of [`PAIRS`] at pipeline 1 and 16 (issues 11 and 21).
const GOALS: [[Option<f64>; 2]; 5] = [
    [Some(0.98), Some(0.9)],
    [None, None],
    [Some(1.1), Some(1.3)],
    [None, None],
    [None, Some(1.3)],
];

/// One run of `op` on `on`'s server on prepared keys: operations (cycles) per second.
fn measure(rig: &Rig, (op, on): Side, pipeline: usize) -> io::Result<f64> {
    let s = rig.on(on);
    let (port, conns) = (s.port, s.cfg.clients);
    let per_op = op.commands_per_op();
    let per_conn = (s.cfg.ops(pipeline) / conns as u64).max(per_op);
    // Whole cycles per connection.
    let per_conn = per_conn - per_conn % per_op;
    flushall(&mut s.conn()?)?;
    let prefix = b"bench:lock";
    // RELEASE deletes its key, so each gets a fresh one; EXTEND reuses a smaller set.
    let (fill, wrap) = match op.needs {
        Needs::Held(f) => (Some(f), 0),
        Needs::Kept(f) => (Some(f), per_conn.min(2000)),
        _ => (None, 0),
    };
    if let Some(fill) = fill {
        // The same connection numbering as the measured run.
        let n = if wrap > 0 { wrap } else { per_conn };
        let w = fill.load(prefix, &s.scripts, 0);
        load::run(port, conns, 64, n, "pre-filling held keys", &w)?;
    }
    let w = op.load(prefix, &s.scripts, wrap);
    Ok(load::run(port, conns, pipeline, per_conn, &op.shown(), &w)? / per_op as f64)
}

pub fn run(rig: &Rig) -> io::Result<Throughput> {
    let (cfg, mut t) = (&rig.lock.cfg, Throughput::default());
    for p in perf::PIPELINES {
        let mut rounds: Vec<Vec<(f64, f64)>> = vec![vec![]; PAIRS.len()];
        let mut pings = vec![];
        for round in 0..cfg.rounds {
            pings.push(measure(rig, (&ops::PING, On::Lock), p)?);
            for ((_, a, on, b), got) in PAIRS.iter().zip(rounds.iter_mut()) {
                let side = |side_a| if side_a { (*a, *on) } else { (*b, On::Plain) };
                got.push(ab(round, |side_a| measure(rig, side(side_a), p))?);
            }
            let last: Vec<String> = rounds
                .iter()
                .map(|r| format!("{:.2}", r[round].0 / r[round].1))
                .collect();
            eprintln!(
                "  [{}] throughput P{p} round {}/{}: {}",
                rig.lock.label,
                round + 1,
                cfg.rounds,
                last.join(" ")
            );
        }
        t.ping.push((p, median(&pings)));
        for (((name, a, _, b), goal), got) in PAIRS.iter().zip(GOALS).zip(rounds) {
            let [a_median, b_median, ratio] = pair_medians(&got);
            let mut ratios: Vec<f64> = got.iter().map(|r| r.0 / r.1).collect();
            let [ratio_min, ratio_max] = quantiles(&mut ratios, [0.0, 1.0]);
            t.pairs.push(PairResult {
                name: name.to_string(),
                pipeline: p,
                a: a_median,
                b: b_median,
                ratio,
                ratio_min,
                ratio_max,
                goal: goal[usize::from(p > 1)],
                a_per_op: a.commands_per_op() as f64,
                b_per_op: b.commands_per_op() as f64,
                rounds: got,
            });
        }
    }
    Ok(t)
}
