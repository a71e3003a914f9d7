//! Scenario 1: mutual exclusion and fencing under load. 64 clients, 16 keys, blocking and
//! non-blocking acquires, extends, releases and leases left to expire: the fenced
//! workload (workload.rs) at full speed on one server. Every call is recorded with
//! invoke/complete times on one monotonic clock and the history is checked against the
//! fenced-mutex model (checker.rs). Each critical section also does a read-modify-write
//! on an in-process store that notices overlapping critical sections, writes with a lower
//! fence than one already accepted, and lost updates.

use std::sync::Arc;
use std::time::Instant;

use crate::common::*;
use crate::link::{Kills, Topo};
use crate::workload::{self, Mix, Plan};

pub const CLIENTS: usize = 64;
pub const KEYS: usize = 16;

/// What the hangs seen on Redis 7.0 come from (tests/blocking.rs,
/// `a_wait_ending_just_before_the_lease_ends_gets_nil_on_time`).
pub const HANG_DIAGNOSIS: &str = "Diagnosis of the unanswered blocking acquires (reproduced by tests/blocking.rs, a_wait_ending_just_before_the_lease_ends_gets_nil_on_time; Redis 7.0 only, Redis 8.2 and Valkey 8.1 answer): Redis 7.0 notices blocked-client timeouts only in beforeSleep, so a BLOCK that ends shortly before the holder's lease can be noticed after the module's lease-deadline timer has already handed the lock to that waiter (RM_UnblockClient with the grant). handleBlockedClientsTimeout then skips the module's timeout callback (bc->unblocked is set) but unblockClient() clears bc->client, so moduleHandleBlockedClients never calls the reply callback: the client gets no reply at all, and the lock stays granted to a token nobody has until its lease ends. Fix in the module (src/waiting.rs): remember each waiter's BLOCK deadline and never hand the lock to a waiter whose deadline has passed; leave it queued for the timeout callback, which removes it and answers nil.";

pub const TITLE: &str = "Mutual exclusion and fencing (fenced-mutex checker)";
pub const TARGET: &str = "0 violations in >= 1,000,000 acquisitions";

pub fn run(env: &Env, o: &mut Outcome) -> Result<(), String> {
    let target = env.n(1_000_000.0, 30_000.0);
    let server = env.start("mutex")?;
    let plan = Plan {
        topo: Topo::Single(server.socket_addr(), 0),
        keys: workload::keys("rel:mx", KEYS, 0, &[]),
        clients: CLIENTS,
        deadline: Instant::now() + env.secs(480.0, 45.0),
        stop_after: target,
        mix: Mix::FAST,
        confirm: false,
        group_per_node: false,
    };
    let sh = workload::Shared::new(plan, &Arc::new(Kills::default()));
    let mut rng = Rng::new(env.seed ^ 0x006d_7574_6578);
    let start = Instant::now();
    let t = workload::check(&sh, workload::join(workload::spawn(&sh, &mut rng))?, &[])?;
    let elapsed = start.elapsed().as_secs_f64();
    let n = t.grants;
    o.figure = format!(
        "{} violations in {} acquisitions",
        t.violations(),
        thousands(n)
    );
    o.trials = format!(
        "{} acquisitions ({} calls, {:.0} s, {:.0} grants/s), {CLIENTS} clients, {KEYS} keys",
        thousands(n),
        thousands(t.n.calls),
        elapsed,
        n as f64 / elapsed.max(0.001)
    );
    o.note(format!(
        "History: {} grants, {} releases (incl. late ones that must answer 0), {} extends, {} leases left to expire, {} blocking acquires timed out, {} non-blocking acquires found the lock busy.",
        thousands(n), thousands(t.n.releases), thousands(t.n.extends), thousands(t.n.abandoned), thousands(t.n.nil_blocking), thousands(t.n.nil_nonblocking)
    ));
    o.note(format!(
        "Checked: per key, no grant while an earlier holder's lease was certainly live; across the server, fences unique and never lower than a fence already returned; releases/extends succeed exactly while the lease is live; the store saw {} overlapping or stale-fenced critical sections and {} lost updates.",
        t.store_events, t.lost_updates
    ));
    if t.violations.contains_key("call never answered") {
        o.note(HANG_DIAGNOSIS);
    }
    workload::verdict(o, env, &t, target);
    if let Err(e) = health(&server, "the server") {
        o.fail(e);
    }
    Ok(())
}
