//! Scenario 3: failover. A primary and a replica run inside a network namespace of our
//! own, on 127.0.0.2 and 127.0.0.3 (the replica connects from 127.0.0.3 with
//! bind-source-addr). Clients acquire locks on the primary, half of them confirming each
//! grant with `WAIT 1 100`. At a random moment nft drops the replication link, then the
//! primary is SIGKILLed and the replica promoted (REPLICAOF NO ONE) while the link is
//! still cut. Every acknowledged grant is looked up on the promoted replica, and new
//! grants there must carry fences above every fence the old primary returned.

use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::common::*;
use redis_lock_testkit::net::{LinkCut, Netns};
use redis_lock_testkit::ReplicaPair;

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
        let token = format!("token-{round:03}-{cid:02}-{n:06}");
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

/// Grants, and how many of them were lost.
#[derive(Default, serde::Serialize)]
struct Tally(u64, u64);

impl Tally {
    fn add(&mut self, lost: bool) {
        self.0 += 1;
        self.1 += u64::from(lost);
    }
}

#[derive(Default, serde::Serialize)]
struct Stats {
    rounds: u64,
    cuts: u64,
    /// Acknowledged grants and how many of them the promoted replica lost: without WAIT,
    /// without WAIT in rounds where the link was not cut before the kill, with a WAIT
    /// that counted the replica, with a WAIT that did not.
    plain: Tally,
    plain_uncut: Tally,
    confirmed: Tally,
    unconfirmed: Tally,
    probes: u64,
    fence_regressions: u64,
}

fn round(
    env: &Env,
    ns: &str,
    cut: &mut LinkCut<'_>,
    r: u64,
    rng: &mut Rng,
    st: &mut Stats,
) -> Result<(), String> {
    let node = |name: &str, host: Ipv4Addr| {
        env.builder(name)
            .host(host)
            .port(PORT)
            .netns(ns)
            .arg("repl-diskless-sync-delay", "0")
    };
    let replica = node(&format!("fo-r-{r}"), REPLICA).arg("bind-source-addr", &REPLICA.to_string());
    let pair = ReplicaPair::try_start_with(node(&format!("fo-p-{r}"), PRIMARY), replica)?;
    let (mut primary, replica) = (pair.primary, pair.replica);

    let inputs = (0..CLIENTS)
        .map(|_| connect(&primary))
        .collect::<Result<Vec<_>, String>>()?;
    let run_ms = rng.range(300, 1500);
    let cut_at = rng.chance(70).then(|| rng.below(run_ms));
    let cut_link = |_: &Server| {
        cut.cut(REPLICA, PRIMARY, PORT)?;
        st.cuts += 1;
        Ok(())
    };
    // Half the clients confirm their grants with WAIT.
    let client = |cid: usize, c, stop: &AtomicBool| client(c, r, cid, cid.is_multiple_of(2), stop);
    let fault = cut_at.map(|at| (at, cut_link));
    let acked: Vec<Acked> = kill_under_load(&mut primary, run_ms, fault, inputs, client)?
        .into_iter()
        .flatten()
        .collect();
    // Promote while the old primary is dead and the link still cut.
    let mut c = connect(&replica)?;
    promote(&mut c)?;
    let max_acked = acked.iter().map(|a| a.fence).max().unwrap_or(0);
    let mut infos = Vec::with_capacity(acked.len());
    for chunk in acked.chunks(1000) {
        let cmds: Vec<_> = chunk.iter().map(|a| args!["LOCK.INFO", &a.key]).collect();
        infos.extend(c.pipeline(&cmds).map_err(|e| e.to_string())?);
    }
    for (a, info) in acked.iter().zip(&infos) {
        let lost = lock_info(info).is_none_or(|(f, _)| f != a.fence);
        match a.wait {
            None => {
                st.plain.add(lost);
                if cut_at.is_none() {
                    st.plain_uncut.add(lost);
                }
            }
            Some(true) => st.confirmed.add(lost),
            Some(false) => st.unconfirmed.add(lost),
        }
    }
    let (regressions, _) = probe_fences(&mut c, &format!("rel:fo:probe:{r}"), 20, max_acked)?;
    st.probes += 20;
    st.fence_regressions += regressions;
    health(&replica, "the promoted replica")?;
    cut.heal()?;
    st.rounds += 1;
    Ok(())
}

/// Why the scenario cannot run here, if it cannot.
fn available() -> Result<(), String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err("needs root for ip netns and nft".into());
    }
    redis_lock_testkit::run_cmd(&["ip", "-V"]).map_err(|_| "`ip` (iproute2) not found")?;
    redis_lock_testkit::run_cmd(&["nft", "--version"])
        .map_err(|_| "`nft` (nftables) not found: bash scripts/deps-reliability.sh")?;
    Ok(())
}

pub const TITLE: &str = "Failover (link cut with nft, primary SIGKILLed, replica promoted)";
pub const TARGET: &str = "0 WAIT-confirmed locks lost, 0 fence regressions after promotion";

pub fn run(env: &Env, o: &mut Outcome) -> Result<(), String> {
    let name = format!("rlrel{}", std::process::id());
    let ns = available().and_then(|()| {
        Netns::create(&name).map_err(|e| format!("cannot create a network namespace: {e}"))
    });
    let cut = ns.as_ref().map_err(String::clone).and_then(|ns| {
        LinkCut::install(ns).map_err(|e| format!("nft does not work in the namespace: {e}"))
    });
    let mut cut = match cut {
        Ok(cut) => cut,
        Err(why) => {
            o.status = Status::NotRun(why);
            return Ok(());
        }
    };
    let rounds = env.n(20.0, 4.0);
    let mut rng = Rng::new(env.seed ^ 0x6661_696c);
    let mut st = Stats::default();
    for r in 0..rounds {
        if let Err(e) = round(env, &name, &mut cut, r, &mut rng, &mut st) {
            o.fail(format!("round {r}: {e}"));
            break;
        }
    }
    drop(cut);
    o.put("wait_ms", WAIT_MS);
    o.put("stats", &st);
    if st.confirmed.1 > 0 {
        o.fail(format!("{} WAIT-confirmed grants lost", st.confirmed.1));
    }
    if st.fence_regressions > 0 {
        o.fail(format!("{} fence regressions", st.fence_regressions));
    }
    if st.confirmed.0 == 0 && o.status == Status::Pass {
        o.fail("no WAIT-confirmed grant was made (nothing checked)");
    }
    Ok(())
}
