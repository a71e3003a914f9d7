//! Scenario 3: failover. A primary and a replica run inside a network namespace of our
//! own, on 127.0.0.2 and 127.0.0.3 (the replica connects from 127.0.0.3 with
//! bind-source-addr). Clients acquire locks on the primary, half of them confirming each
//! grant with `WAIT 1 100`. At a random moment nft drops the replication link, then the
//! primary is SIGKILLed and the replica promoted (REPLICAOF NO ONE) while the link is
//! still cut. Every acknowledged grant is looked up on the promoted replica, and new
//! grants there must carry fences above every fence the old primary returned.

use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::*;
use redis_lock_testkit::args;
use redis_lock_testkit::net::{LinkCut, Netns};
use redis_lock_testkit::ReplicaPair;
use redis_lock_testkit::Rng;

const PRIMARY: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);
const REPLICA: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 3);
const PORT: u16 = 7400;
const CLIENTS: usize = 8;
const WAIT_MS: u64 = 100;

struct Acked {
    key: String,
    fence: u64,
    /// None: no WAIT asked; Some(true): WAIT counted the replica.
    wait: Option<bool>,
}

fn client(mut c: Conn, round: u64, cid: usize, use_wait: bool, stop: &AtomicBool) -> Vec<Acked> {
    let mut out = Vec::new();
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        n += 1;
        let key = format!("rel:fo:{round}:{cid}:{n}");
        let token = format!("t{round}-{cid}-{n}");
        c.queue(&args![
            "LOCK.ACQUIRE",
            &key,
            "PX",
            600_000u64,
            "TOKEN",
            &token
        ]);
        if use_wait {
            c.queue(&args!["WAIT", 1u64, WAIT_MS]);
        }
        if c.flush().is_err() {
            break;
        }
        let Ok(r) = c.read() else { break };
        let Some((_, fence)) = r.grant() else { break };
        let wait = if use_wait {
            let Ok(w) = c.read() else { break };
            Some(w.as_int().unwrap_or(0) >= 1)
        } else {
            None
        };
        out.push(Acked { key, fence, wait });
    }
    out
}

#[derive(Default)]
struct Stats {
    rounds: u64,
    cuts: u64,
    plain: u64,
    plain_lost: u64,
    /// Grants without WAIT in rounds where the link was not cut before the kill.
    plain_uncut: u64,
    plain_uncut_lost: u64,
    confirmed: u64,
    confirmed_lost: u64,
    unconfirmed: u64,
    unconfirmed_lost: u64,
    probes: u64,
    fence_regressions: u64,
}

fn round(
    env: &Env,
    ns: &Netns,
    cut: &mut LinkCut<'_>,
    r: u64,
    rng: &mut Rng,
    st: &mut Stats,
) -> Result<(), String> {
    let node = |name: &str, host: Ipv4Addr| {
        env.builder(name)
            .host(host)
            .port(PORT)
            .netns(&ns.name)
            .arg("repl-diskless-sync-delay", "0")
    };
    let replica = node(&format!("fo-r-{r}"), REPLICA).arg("bind-source-addr", &REPLICA.to_string());
    let pair = ReplicaPair::try_start_with(node(&format!("fo-p-{r}"), PRIMARY), replica)?;
    let (mut primary, replica) = (pair.primary, pair.replica);

    let stop = Arc::new(AtomicBool::new(false));
    let mut handles = Vec::new();
    for cid in 0..CLIENTS {
        let c = connect(&primary)?;
        let stop = Arc::clone(&stop);
        let use_wait = cid % 2 == 0;
        handles.push(std::thread::spawn(move || {
            client(c, r, cid, use_wait, &stop)
        }));
    }
    let run_ms = rng.range(300, 1500);
    let cut_at = if rng.chance(70) {
        Some(rng.below(run_ms))
    } else {
        None
    };
    let t0 = Instant::now();
    if let Some(at) = cut_at {
        std::thread::sleep(Duration::from_millis(at));
        cut.cut(REPLICA, PRIMARY, PORT)?;
        st.cuts += 1;
    }
    let left = Duration::from_millis(run_ms).saturating_sub(t0.elapsed());
    std::thread::sleep(left);
    primary.kill9();
    stop.store(true, Ordering::Relaxed);
    let mut acked = Vec::new();
    for h in handles {
        acked.extend(h.join().map_err(|_| "client thread panicked".to_string())?);
    }
    // Promote while the old primary is dead and the link still cut.
    let mut c = connect(&replica)?;
    let p = c
        .call(&args!["REPLICAOF", "NO", "ONE"])
        .map_err(|e| e.to_string())?;
    if p.is_error() {
        return Err(format!("REPLICAOF NO ONE: {p:?}"));
    }
    let max_acked = acked.iter().map(|a| a.fence).max().unwrap_or(0);
    let mut infos = Vec::with_capacity(acked.len());
    for chunk in acked.chunks(1000) {
        let cmds: Vec<_> = chunk.iter().map(|a| args!["LOCK.INFO", &a.key]).collect();
        infos.extend(c.pipeline(&cmds).map_err(|e| e.to_string())?);
    }
    for (a, info) in acked.iter().zip(&infos) {
        let kept = lock_info(info).is_some_and(|(f, _)| f == a.fence);
        match a.wait {
            None => {
                st.plain += 1;
                st.plain_lost += u64::from(!kept);
                if cut_at.is_none() {
                    st.plain_uncut += 1;
                    st.plain_uncut_lost += u64::from(!kept);
                }
            }
            Some(true) => {
                st.confirmed += 1;
                st.confirmed_lost += u64::from(!kept);
            }
            Some(false) => {
                st.unconfirmed += 1;
                st.unconfirmed_lost += u64::from(!kept);
            }
        }
    }
    for i in 0..20 {
        let r = c
            .call(&args![
                "LOCK.ACQUIRE",
                format!("rel:fo:probe:{r}:{i}"),
                "PX",
                1000u64
            ])
            .map_err(|e| e.to_string())?;
        let (_, fence) = r
            .grant()
            .ok_or_else(|| format!("probe acquire answered {r:?}"))?;
        st.probes += 1;
        if fence <= max_acked {
            st.fence_regressions += 1;
        }
    }
    if panics(&replica) != Some(0) {
        return Err(format!(
            "lock_panics on the promoted replica = {:?}",
            panics(&replica)
        ));
    }
    cut.heal()?;
    let _ = c
        .call(&args!["PING"])
        .map(|r| r == Reply::Simple("PONG".into()));
    st.rounds += 1;
    Ok(())
}

/// Why the scenario cannot run here, if it cannot.
fn unavailable() -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("needs root for ip netns and nft".into());
    }
    if redis_lock_testkit::run_cmd(&["ip", "-V"]).is_err() {
        return Some("`ip` (iproute2) not found".into());
    }
    if redis_lock_testkit::run_cmd(&["nft", "--version"]).is_err() {
        return Some("`nft` (nftables) not found: bash scripts/deps-reliability.sh".into());
    }
    None
}

pub const TITLE: &str = "Failover (link cut with nft, primary SIGKILLed, replica promoted)";
pub const TARGET: &str = "0 WAIT-confirmed locks lost, 0 fence regressions after promotion";

pub fn run(env: &Env, o: &mut Outcome) -> Result<(), String> {
    if let Some(why) = unavailable() {
        o.status = Status::NotRun(why);
        return Ok(());
    }
    let ns = match Netns::create(&format!("rlrel{}", std::process::id())) {
        Ok(ns) => ns,
        Err(e) => {
            o.status = Status::NotRun(format!("cannot create a network namespace: {e}"));
            return Ok(());
        }
    };
    let mut cut = match LinkCut::install(&ns) {
        Ok(c) => c,
        Err(e) => {
            o.status = Status::NotRun(format!("nft does not work in the namespace: {e}"));
            return Ok(());
        }
    };
    let rounds = env.n(20.0, 4.0);
    let mut rng = Rng::new(env.seed ^ 0x6661_696c);
    let mut st = Stats::default();
    for r in 0..rounds {
        if let Err(e) = round(env, &ns, &mut cut, r, &mut rng, &mut st) {
            o.fail(format!("round {r}: {e}"));
            break;
        }
    }
    drop(cut);
    drop(ns);
    o.figure = format!(
        "WAIT-confirmed lost: {} of {}; without WAIT lost: {} of {} ({}); fence regressions: {}",
        st.confirmed_lost,
        thousands(st.confirmed),
        thousands(st.plain_lost),
        thousands(st.plain),
        pct(st.plain_lost, st.plain),
        st.fence_regressions
    );
    o.trials = format!(
        "{} failovers ({} with the link cut first), {} acknowledged grants, {} probe grants",
        st.rounds,
        st.cuts,
        thousands(st.plain + st.confirmed + st.unconfirmed),
        st.probes
    );
    o.note(format!(
        "Grants whose `WAIT 1 {WAIT_MS}` returned 0 (the client must treat them as not acquired): {}, of which {} were lost ({}).",
        thousands(st.unconfirmed),
        thousands(st.unconfirmed_lost),
        pct(st.unconfirmed_lost, st.unconfirmed)
    ));
    o.note(format!(
        "Without WAIT, in failovers where the link was not cut first (SIGKILL only): {} of {} lost ({}).",
        thousands(st.plain_uncut_lost),
        thousands(st.plain_uncut),
        pct(st.plain_uncut_lost, st.plain_uncut)
    ));
    o.note("Without WAIT a grant acknowledged by the primary can be missing on the promoted replica, so a second client can be granted the same lock: this is the failure the redis.io page describes. With WAIT 1 the client knows; WAIT does not make the write durable on a quorum by itself (a replica that acked can still be the one that dies).");
    o.note("Fences after promotion stay above the old primary's: the replica's counter holds every fence it received, and a promotion makes the next fence jump an hour ahead of the clock (unix_ms << 10), which covers the grants it never received; across machines this needs clocks that are not behind by more than that hour plus the failover time.");
    if st.confirmed_lost > 0 {
        o.fail(format!("{} WAIT-confirmed grants lost", st.confirmed_lost));
    }
    if st.fence_regressions > 0 {
        o.fail(format!("{} fence regressions", st.fence_regressions));
    }
    if st.confirmed == 0 && o.status == Status::Pass {
        o.fail("no WAIT-confirmed grant was made (nothing checked)");
    }
    Ok(())
}
