//! Throughput of each module command against the recipe command it replaces, 50
//! clients, pipeline 1 and 16, A and B alternated in every round (ABBA order), with PING
//! as the ceiling.

use std::io;

use redis_lock_report::perf::{self, PairResult, Throughput};

use crate::config::Config;
use crate::load;
use crate::ops::{flushall, prefill, Op, OpLoad, Scripts};
use crate::stats::{median, min_max};
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

/// Commands per run at this pipeline depth.
fn ops_for(cfg: &Config, pipeline: usize) -> u64 {
    if pipeline > 1 {
        cfg.ops_p16
    } else {
        cfg.ops_p1
    }
}

/// One measured run of `op`: prepares the key space, then times the load. Returns
/// operations per second (cycles per second for a cycle).
pub fn measure(
    server: &Server,
    cfg: &Config,
    scripts: &Scripts,
    op: Op,
    pipeline: usize,
    commands: u64,
) -> io::Result<f64> {
    let port = server.port;
    let conns = cfg.clients;
    let per_conn = (commands / conns as u64).max(op.commands_per_op());
    // Whole cycles per connection.
    let per_conn = per_conn - per_conn % op.commands_per_op();
    let mut c = server.conn()?;
    flushall(&mut c)?;
    let prefix = b"bench:lock";
    let mut wrap = 0;
    if let Some(fill) = op.needs_held() {
        // RELEASE deletes its key: every op gets a freshly held key. EXTEND leaves it
        // held, so a smaller set is reused.
        let n = if matches!(op, Op::Extend | Op::EvalExtend) {
            wrap = per_conn.min(2000);
            wrap
        } else {
            per_conn
        };
        prefill(port, conns, n, fill, prefix, scripts)?;
    }
    let w = OpLoad {
        op,
        prefix,
        scripts,
        wrap,
    };
    let out = load::run(port, conns, pipeline, per_conn, &w)?.checked(op.shown())?;
    Ok(out.rate() / op.commands_per_op() as f64)
}

pub fn run(server: &Server, cfg: &Config, scripts: &Scripts) -> io::Result<Throughput> {
    let mut t = Throughput::default();
    for p in perf::PIPELINES {
        let ops = ops_for(cfg, p);
        let mut rounds: Vec<Vec<(f64, f64)>> = vec![vec![]; PAIRS.len()];
        let mut pings = vec![];
        for round in 0..cfg.rounds {
            pings.push(measure(server, cfg, scripts, Op::Ping, p, ops)?);
            for ((_, a, b, _), got) in PAIRS.iter().zip(rounds.iter_mut()) {
                // ABBA: the side measured first alternates.
                let (ra, rb) = if round % 2 == 0 {
                    let ra = measure(server, cfg, scripts, *a, p, ops)?;
                    (ra, measure(server, cfg, scripts, *b, p, ops)?)
                } else {
                    let rb = measure(server, cfg, scripts, *b, p, ops)?;
                    (measure(server, cfg, scripts, *a, p, ops)?, rb)
                };
                got.push((ra, rb));
            }
            let last: Vec<String> = rounds
                .iter()
                .filter_map(|r| r.last().map(|(a, b)| format!("{:.2}", a / b)))
                .collect();
            let n = round + 1;
            eprintln!(
                "  [{}] throughput P{p} round {n}/{}: {}",
                server.label,
                cfg.rounds,
                last.join(" ")
            );
        }
        t.ping.push((p, median(&pings)));
        for ((name, a, b, goal), got) in PAIRS.iter().zip(rounds) {
            let ratios: Vec<f64> = got.iter().map(|(a, b)| a / b).collect();
            let (lo, hi) = min_max(&ratios);
            t.pairs.push(PairResult {
                name: name.to_string(),
                pipeline: p,
                a: median(&got.iter().map(|r| r.0).collect::<Vec<_>>()),
                b: median(&got.iter().map(|r| r.1).collect::<Vec<_>>()),
                ratio: median(&ratios),
                ratio_min: lo,
                ratio_max: hi,
                goal: goal[usize::from(p > 1)],
                a_per_op: a.commands_per_op() as f64,
                b_per_op: b.commands_per_op() as f64,
                rounds: got,
            });
        }
    }
    flushall(&mut server.conn()?)?;
    Ok(t)
}
