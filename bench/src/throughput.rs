//! Throughput of each module command against the recipe command it replaces, 50
//! clients, pipeline 1 and 16, A and B alternated in every round (ABBA order), with PING
//! as the ceiling.

use std::io;

use redis_lock_report::perf::{self, PairResult, Throughput};

use crate::load;
use crate::ops::{flushall, Op};
use crate::stats::{ab, median, min_max, pair_medians};
use crate::Server;

/// One comparison: the module's way (A) against the recipe (B), and the goal for A/B.
/// The comparisons, with their goals at pipeline 1 and 16 (issue 11): an ACQUIRE no
/// dearer than `SET NX PX`, a RELEASE 1.1× / 1.3× the EVALSHA compare-and-delete, a cycle
/// 1.3× the recipe's at pipeline 16.
pub const PAIRS: [(&str, Op, Op, [Option<f64>; 2]); 4] = [
    (
        perf::ACQUIRE,
        Op::Acquire,
        Op::SetNx,
        [Some(1.0), Some(1.0)],
    ),
    (
        perf::RELEASE,
        Op::Release,
        Op::EvalRelease,
        [Some(1.1), Some(1.3)],
    ),
    (perf::EXTEND, Op::Extend, Op::EvalExtend, [None, None]),
    (
        perf::CYCLE,
        Op::CycleModule,
        Op::CycleRecipe,
        [None, Some(1.3)],
    ),
];

/// One measured run of `op`: prepares the key space, then times the load. Returns
/// operations per second (cycles per second for a cycle).
fn measure(s: &Server, op: Op, pipeline: usize) -> io::Result<f64> {
    let (port, conns) = (s.port, s.cfg.clients);
    let per_op = op.commands_per_op();
    let per_conn = (s.cfg.ops(pipeline) / conns as u64).max(per_op);
    // Whole cycles per connection.
    let per_conn = per_conn - per_conn % per_op;
    flushall(&mut s.conn()?)?;
    let prefix = b"bench:lock";
    // RELEASE deletes its key: every op gets a freshly held key. EXTEND leaves it held,
    // so a smaller set is reused.
    let wrap = match op {
        Op::Extend | Op::EvalExtend => per_conn.min(2000),
        _ => 0,
    };
    if let Some(fill) = op.needs_held() {
        // The same connection numbering as the measured run.
        let n = if wrap > 0 { wrap } else { per_conn };
        let w = fill.load(prefix, &s.scripts, 0);
        load::run(port, conns, 64, n, "pre-filling held keys", &w)?;
    }
    let w = op.load(prefix, &s.scripts, wrap);
    Ok(load::run(port, conns, pipeline, per_conn, op.shown(), &w)? / per_op as f64)
}

pub fn run(s: &Server) -> io::Result<Throughput> {
    let (cfg, mut t) = (&s.cfg, Throughput::default());
    for p in perf::PIPELINES {
        let mut rounds: Vec<Vec<(f64, f64)>> = vec![vec![]; PAIRS.len()];
        let mut pings = vec![];
        for round in 0..cfg.rounds {
            pings.push(measure(s, Op::Ping, p)?);
            for ((_, a, b, _), got) in PAIRS.iter().zip(rounds.iter_mut()) {
                let op = |side_a| if side_a { *a } else { *b };
                got.push(ab(round, |side_a| measure(s, op(side_a), p))?);
            }
            let last: Vec<String> = rounds
                .iter()
                .map(|r| format!("{:.2}", r[round].0 / r[round].1))
                .collect();
            eprintln!(
                "  [{}] throughput P{p} round {}/{}: {}",
                s.label,
                round + 1,
                cfg.rounds,
                last.join(" ")
            );
        }
        t.ping.push((p, median(&pings)));
        for ((name, a, b, goal), got) in PAIRS.iter().zip(rounds) {
            let [a_median, b_median, ratio] = pair_medians(&got);
            let (ratio_min, ratio_max) =
                min_max(&got.iter().map(|r| r.0 / r.1).collect::<Vec<_>>());
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
