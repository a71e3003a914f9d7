//! Mutual exclusion and fencing under load: the fenced workload (workload.rs) at full
//! speed on one server, checked by the fenced-mutex model (checker.rs).

use std::sync::Arc;
use std::time::Instant;

use crate::common::*;
use crate::link::{Kills, Topo};
use crate::workload::{self, Mix, Plan};

pub const CLIENTS: usize = 64;
pub const KEYS: usize = 16;

pub const TITLE: &str = "Mutual exclusion and fencing (fenced-mutex checker)";
pub const TARGET: &str = "0 violations in >= 1,000,000 acquisitions";

pub fn run(env: &Env, o: &mut Outcome) -> Result<(), String> {
    let target = env.n(1_000_000.0, 30_000.0);
    let server = env.start("mutex")?;
    let (topo, keys) = (
        Topo::Single(server.socket_addr(), 0),
        workload::keys("rel:mx", KEYS, 0, &[]),
    );
    let deadline = Instant::now() + env.secs(480.0, 45.0);
    let plan = Plan {
        stop_after: target,
        mix: Mix::FAST,
        late_end_ms: 0,
        linear: true,
        ..Plan::new(topo, keys, CLIENTS, deadline)
    };
    let sh = workload::Shared::new(plan, &Arc::new(Kills::default()));
    let mut rng = Rng::new(env.seed ^ 0x006d_7574_6578);
    let start = Instant::now();
    let t = workload::check(&sh, workload::join(workload::spawn(&sh, &mut rng))?, &[])?;
    o.put("secs", start.elapsed().as_secs_f64());
    o.put("shape", (CLIENTS, KEYS));
    workload::verdict(o, env, &t, target);
    o.healthy(&server, "the server");
    Ok(())
}
