//! Scenario 9: SHARED (read-write) and LIMIT n (counted) keys in the fenced checker, with
//! kills and failover. The fenced workload (workload.rs) runs on a primary and a replica,
//! most keys SHARED or LIMIT n, every grant and extend confirmed with `WAIT 1 100` (a
//! grant the replica did not confirm is given back unused, as a careful client does).
//! Meanwhile the primary is SIGKILLed and its replica promoted (the killed server comes
//! back as the new primary's replica), coordinated FAILOVERs swap the two, and holders
//! and waiters are killed with CLIENT KILL. The checker asserts that no writer was granted
//! beside a reader or another writer, that a LIMIT n key never had more than n holders,
//! that fences rose with every grant across both servers, and the fenced store refused
//! every stale write.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::*;
use crate::link::{Kills, Topo};
use crate::scenarios::chaos::health;
use crate::workload::{self, Plan};
use redis_lock_testkit::{args, flavor_of, ReplicaPair, Rng};

pub const TITLE: &str = "SHARED and LIMIT keys (fenced checker, kills, failover)";
pub const TARGET: &str = "0 writers beside a reader or writer, never more than n holders of a LIMIT n key, 0 fence regressions, 0 stale writes accepted, in >= 100,000 acquisitions";

pub fn run(env: &Env, o: &mut Outcome) -> Result<(), String> {
    let flavor = flavor_of(&env.server_bin)?;
    let mut rng = Rng::new(env.seed ^ 0x6b69_6e64 ^ u64::from(flavor.major * 100 + flavor.minor));
    let target = env.n(100_000.0, 4_000.0);
    let v = flavor.version();
    let node = |name: String| env.builder(&name).arg("repl-diskless-sync-delay", "0");
    let mut pair =
        ReplicaPair::try_start_with(node(format!("kinds-{v}-a")), node(format!("kinds-{v}-b")))?;
    let addrs = [pair.primary.socket_addr(), pair.replica.socket_addr()];
    let kills = Arc::new(Kills::default());
    let keys = workload::keys("rel:kd", 2, 4, &[2, 2, 3, 5]);
    let sh = workload::Shared::new(
        Plan {
            topo: Topo::Pair(addrs),
            keys: keys.clone(),
            clients: 24,
            deadline: Instant::now() + env.secs(90.0, 10.0),
            confirm: true,
            group_per_node: false,
        },
        &kills,
    );
    let started = Instant::now();
    let handles = workload::spawn(&sh, &mut rng);
    let (mut promotions, mut failovers, mut client_kills) = (0u64, 0u64, 0u64);
    let mut errors: Vec<String> = Vec::new();
    while !sh.stop.load(Ordering::Relaxed) && Instant::now() < sh.plan.deadline && errors.is_empty()
    {
        let until = Instant::now() + Duration::from_millis(rng.range(800, 2000));
        while Instant::now() < until && !sh.stop.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(10));
        }
        let p = addrs
            .iter()
            .position(|a| *a == pair.primary.socket_addr())
            .unwrap_or(0);
        let dice = rng.below(100);
        let r = (|| -> Result<(), String> {
            if dice < 35 {
                // Only promote a replica that has the data (else nothing was confirmed).
                pair.replica.wait_synced(Duration::from_secs(20))?;
                kills.record(p, None);
                pair.primary.kill9();
                let mut c = connect(&pair.replica)?;
                let r = c
                    .call(&args!["REPLICAOF", "NO", "ONE"])
                    .map_err(|e| e.to_string())?;
                if r.is_error() {
                    return Err(format!("REPLICAOF NO ONE: {r:?}"));
                }
                let (old, new) = (&mut pair.primary, &pair.replica);
                old.try_restart_as_replica_of(new)?;
                std::mem::swap(&mut pair.primary, &mut pair.replica);
                promotions += 1;
            } else if dice < 60 {
                pair.replica.wait_synced(Duration::from_secs(20))?;
                kills.pause(p, None);
                let r = pair.failover(Duration::from_secs(5));
                kills.pause_over(p);
                r?;
                failovers += 1;
            } else {
                let key = &rng.pick(&keys).0;
                let mut c = connect(&pair.primary)?;
                let info = c
                    .call(&args!["LOCK.INFO", key])
                    .map_err(|e| e.to_string())?;
                let ids = holder_ids(&info);
                if let Some(&id) = (!ids.is_empty()).then(|| rng.pick(&ids)) {
                    kills.record(p, Some(id));
                    let _ = c.call(&args!["CLIENT", "KILL", "ID", id]);
                    client_kills += 1;
                }
            }
            Ok(())
        })();
        if let Err(e) = r {
            errors.push(e);
        }
    }
    sh.stop.store(true, Ordering::Relaxed);
    let elapsed = started.elapsed().as_secs_f64();
    let t = workload::finish(&sh, handles, &[])?;
    for (s, what) in [
        (&pair.primary, "the primary"),
        (&pair.replica, "the replica"),
    ] {
        if let Err(e) = health(s, what) {
            errors.push(e);
        }
    }
    o.figure = format!(
        "{} violations in {} acquisitions ({} SHARED reads, {} writes, {} LIMIT permits)",
        t.violations(),
        thousands(t.grants),
        thousands(t.by_mode[1]),
        thousands(t.by_mode[0]),
        thousands(t.by_mode[2])
    );
    o.trials = format!(
        "{} acquisitions in {:.0} s, {} clients, {} keys; faults: primary SIGKILLed and replica promoted {}, FAILOVER {}, CLIENT KILL of a holder {}",
        thousands(t.grants),
        elapsed,
        sh.plan.clients,
        keys.len(),
        promotions,
        failovers,
        client_kills
    );
    let kinds: Vec<String> = keys.iter().map(|k| k.1.name()).collect();
    o.note(format!("Keys: {}.", kinds.join(", ")));
    o.note(format!("History: {}.", t.history()));
    o.note(format!(
        "Grants the replica did not confirm within `WAIT 1 100` (given back, not used): {}; acquires whose reply was lost (killed connection or server): {}; calls lost to a kill (excused): {}; clients followed {} READONLY/UNBLOCKED replies to the new primary. Waiters: {} blocking calls, the slowest answered {} ms after its BLOCK time ({} more than 1 s after it only because a FAILOVER's write pause held the command before it ran).",
        thousands(t.n.unconfirmed),
        thousands(t.n.lost_acquires),
        thousands(t.killed_calls),
        thousands(t.rerouted),
        thousands(t.waits),
        t.slowest_wait_over_block_ms.max(0),
        thousands(t.late_by_pause)
    ));
    if let Some(e) = errors.first() {
        o.fail(e.clone());
    }
    workload::verdict(o, env, &t, target);
    Ok(())
}
