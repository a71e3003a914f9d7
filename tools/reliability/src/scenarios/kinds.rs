//! SHARED and LIMIT n keys in the fenced checker: the fenced workload on a replica pair,
//! every grant confirmed with `WAIT 1 100`, while the primary is SIGKILLed and its replica
//! promoted, FAILOVERs swap the two, and holders are killed (docs/RELIABILITY.md).

use std::time::Instant;

use crate::common::*;
use crate::scenarios::chaos::{flavor_rng, pair_run, PROMOTE};
use crate::workload::{self, Plan};

pub const TITLE: &str = "SHARED and LIMIT keys (fenced checker, kills, failover)";
pub const TARGET: &str = "0 writers beside a reader or writer, never more than n holders of a LIMIT n key, 0 fence regressions, 0 stale writes accepted, in >= 100,000 acquisitions";

pub fn run(env: &Env, o: &mut Outcome) -> Result<(), String> {
    let (flavor, mut rng) = flavor_rng(env, 0x6b69_6e64)?;
    let target = env.n(100_000.0, 4_000.0);
    let (clients, keys) = (24, workload::keys("rel:kd", 2, 4, &[2, 2, 3, 5]));
    let plan = |topo| {
        let deadline = Instant::now() + env.secs(90.0, 10.0);
        let plan = Plan::new(topo, keys.clone(), clients, deadline);
        Plan {
            confirm: true,
            ..plan
        }
    };
    let table = [(PROMOTE, 35), ("FAILOVER", 25), ("CLIENT KILL holder", 40)];
    let name = format!("kinds-{}", flavor.version());
    let sub = pair_run(env, flavor, &mut rng, &name, plan, &table, (800, 2000))?;
    o.put("secs", sub.secs);
    o.put("clients", clients);
    o.put("keys", keys.iter().map(|k| k.1.name()).collect::<Vec<_>>());
    o.put("ops", &sub.ops.done);
    sub.ops.verdict(o);
    workload::verdict(o, env, &sub.tally, target);
    Ok(())
}
