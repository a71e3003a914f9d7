//! Throughput of each module command against the recipe command it replaces, 50
//! clients, pipeline 1 and 16, A and B alternated in every round (ABBA order), with PING
//! as the ceiling.

use std::io;

use crate::config::Config;
use crate::load;
use crate::ops::{self, flushall, prefill, Op, OpLoad, Scripts};
use crate::server::Server;
use crate::stats::median;

/// One comparison: the module's way (A) against the recipe (B).
#[derive(Debug, Clone, Copy)]
pub struct Pair {
    pub name: &'static str,
    pub a: Op,
    pub b: Op,
    /// The goal for A/B, if it sets one.
    pub goal: Option<f64>,
}

pub const PAIRS: [Pair; 4] = [
    Pair {
        name: "ACQUIRE vs SET NX PX",
        a: Op::Acquire,
        b: Op::SetNx,
        goal: Some(0.95),
    },
    Pair {
        name: "RELEASE vs EVALSHA release",
        a: Op::Release,
        b: Op::EvalRelease,
        goal: Some(1.3),
    },
    Pair {
        name: "EXTEND vs EVALSHA extend",
        a: Op::Extend,
        b: Op::EvalExtend,
        goal: None,
    },
    Pair {
        name: "cycle: ACQUIRE+RELEASE vs SET NX PX+EVALSHA",
        a: Op::CycleModule,
        b: Op::CycleRecipe,
        goal: Some(1.2),
    },
];

pub const PIPELINES: [usize; 2] = [1, 16];

#[derive(Debug, Clone)]
pub struct PairResult {
    pub pair: Pair,
    pub pipeline: usize,
    /// Operations per second per round (cycles for the cycle pair).
    pub a: Vec<f64>,
    pub b: Vec<f64>,
    /// A/B of each round.
    pub ratios: Vec<f64>,
}

impl PairResult {
    pub fn ratio(&self) -> f64 {
        median(&self.ratios)
    }
}

#[derive(Debug, Clone, Default)]
pub struct Throughput {
    pub pairs: Vec<PairResult>,
    /// (pipeline, PING commands/s per round)
    pub ping: Vec<(usize, Vec<f64>)>,
}

impl Throughput {
    pub fn ping_median(&self, pipeline: usize) -> f64 {
        self.ping
            .iter()
            .find(|(p, _)| *p == pipeline)
            .map_or(f64::NAN, |(_, v)| median(v))
    }
    pub fn get(&self, name: &str, pipeline: usize) -> Option<&PairResult> {
        self.pairs
            .iter()
            .find(|r| r.pair.name == name && r.pipeline == pipeline)
    }
}

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
    for &p in &PIPELINES {
        let ops = ops_for(cfg, p);
        let mut results: Vec<PairResult> = PAIRS
            .iter()
            .map(|&pair| PairResult {
                pair,
                pipeline: p,
                a: vec![],
                b: vec![],
                ratios: vec![],
            })
            .collect();
        let mut pings = vec![];
        for round in 0..cfg.rounds {
            pings.push(measure(server, cfg, scripts, Op::Ping, p, ops)?);
            for r in results.iter_mut() {
                let (a, b) = if round % 2 == 0 {
                    let a = measure(server, cfg, scripts, r.pair.a, p, ops)?;
                    (a, measure(server, cfg, scripts, r.pair.b, p, ops)?)
                } else {
                    let b = measure(server, cfg, scripts, r.pair.b, p, ops)?;
                    (measure(server, cfg, scripts, r.pair.a, p, ops)?, b)
                };
                r.a.push(a);
                r.b.push(b);
                r.ratios.push(a / b);
            }
            eprintln!(
                "  [{}] throughput P{p} round {}/{}: {}",
                server.label,
                round + 1,
                cfg.rounds,
                results
                    .iter()
                    .map(|r| format!("{:.2}", r.ratios.last().copied().unwrap_or(f64::NAN)))
                    .collect::<Vec<_>>()
                    .join(" ")
            );
        }
        t.ping.push((p, pings));
        t.pairs.extend(results);
    }
    let mut c = server.conn()?;
    ops::flushall(&mut c)?;
    Ok(t)
}
