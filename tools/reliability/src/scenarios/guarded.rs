//! Guarded writes (LOCK.IFHELD): old holders write, pause past their short leases and
//! write again while new holders take the keys; each key's log proves whether a stale
//! write landed. The control uses plain `RPUSH`. Details: docs/RELIABILITY.md.

use std::time::{Duration, Instant};

use crate::common::*;

/// The old holders' leases, and the keys of a round.
const TTL_MS: u64 = 40;
const KEYS: usize = 250;

#[derive(Debug, Default, Clone, serde::Serialize)]
struct Stats {
    rounds: u64,
    /// Leases of old holders that ran out (never released).
    expiries: u64,
    new_grants: u64,
    /// Writes while the lease was live: accepted, refused.
    on_time: (u64, u64),
    /// Late writes (after the pause): accepted (still held, or unguarded), refused
    /// with NOTHELD.
    late_accepted: u64,
    late_refused: u64,
    /// Late writes accepted after the next holder had been granted the key.
    late_accepted_after_next: u64,
    /// From the logs: entries with a fence below one logged before them.
    stale_applied: u64,
    /// New holders whose fence was not above the old holder's.
    fence_regressions: u64,
    log_entries: u64,
    #[serde(skip)]
    examples: Vec<String>,
}

fn not_held(r: &Reply) -> Result<bool, String> {
    match r {
        Reply::Error(e) if e.starts_with("NOTHELD") => Ok(true),
        r if r.as_int().is_some() => Ok(false),
        r => Err(format!("guarded write answered {r:?}")),
    }
}

/// One round over the KEYS keys `{prefix:i}` (guarded or not).
fn round(
    server: &Server,
    prefix: &str,
    guarded: bool,
    r: u64,
    rng: &mut Rng,
    st: &mut Stats,
) -> Result<(), String> {
    let key = |i: usize| format!("{{{prefix}:{i}}}");
    let log = |i: usize| format!("{{{prefix}:{i}}}:log");
    let write = |k: usize, token: &str, fence: u64| -> Vec<Vec<u8>> {
        if guarded {
            args!["LOCK.IFHELD", key(k), token, "RPUSH", log(k), fence]
        } else {
            args!["RPUSH", log(k), fence]
        }
    };
    let mut old = connect(server)?;
    let acquires: Vec<_> = (0..KEYS)
        .map(|k| {
            let t = format!("old-{r:06}-{k:06}-guarded");
            args!["LOCK.ACQUIRE", key(k), "PX", TTL_MS, "TOKEN", t]
        })
        .collect();
    let t0 = Instant::now();
    let replies = old.pipeline(&acquires).map_err(|e| e.to_string())?;
    let mut held = Vec::with_capacity(KEYS);
    for (k, rep) in replies.iter().enumerate() {
        let what = || format!("old holder's acquire of {} answered {rep:?}", key(k));
        let (token, fence) = rep.grant().ok_or_else(what)?;
        held.push((String::from_utf8_lossy(&token).into_owned(), fence));
    }
    let writes: Vec<_> = (0..KEYS).map(|k| write(k, &held[k].0, held[k].1)).collect();
    for rep in old.pipeline(&writes).map_err(|e| e.to_string())? {
        let refused = not_held(&rep)?;
        st.on_time.0 += u64::from(!refused);
        st.on_time.1 += u64::from(refused);
    }
    // The new holders wait for each lease to end; the old one wakes at a random moment
    // from before its leases end to well after, and writes again.
    let wait_ms = rng.range(0, 2 * TTL_MS);
    let pause_ms = rng.range(TTL_MS / 2, 4 * TTL_MS);
    let mut order: Vec<usize> = (0..KEYS).collect();
    for i in (1..order.len()).rev() {
        order.swap(i, rng.below(i as u64 + 1) as usize);
    }
    let news = std::thread::scope(|s| -> Result<Vec<(u64, Duration)>, String> {
        let newer = s.spawn(|| -> Result<Vec<(u64, Duration)>, String> {
            let mut c = connect_for(server, 10)?;
            std::thread::sleep(Duration::from_millis(wait_ms));
            let mut out = Vec::with_capacity(KEYS);
            for k in 0..KEYS {
                let t = format!("new-{r:06}-{k:06}-guarded");
                let (name, ms) = (key(k), 5000u64);
                let (_, fence) = grant(
                    &mut c,
                    &args!["LOCK.ACQUIRE", name, "PX", ms, "TOKEN", &t, "BLOCK", ms],
                )?;
                let granted = t0.elapsed();
                let w = cmd(&mut c, &write(k, &t, fence))?;
                if not_held(&w)? {
                    return Err(format!("the new holder's write to {} was refused", key(k)));
                }
                cmd(&mut c, &args!["LOCK.RELEASE", key(k), &t])?;
                out.push((fence, granted));
            }
            Ok(out)
        });
        std::thread::sleep(Duration::from_millis(pause_ms));
        let late: Vec<_> = order
            .iter()
            .map(|&k| write(k, &held[k].0, held[k].1))
            .collect();
        let sent = t0.elapsed();
        let replies = old.pipeline(&late).map_err(|e| e.to_string());
        let news = joined([newer.join()])?.remove(0)?;
        for (&k, rep) in order.iter().zip(replies?) {
            let refused = not_held(&rep)?;
            st.late_refused += u64::from(refused);
            st.late_accepted += u64::from(!refused);
            // Sent after the next holder of this key was granted it.
            st.late_accepted_after_next += u64::from(!refused && guarded && news[k].1 < sent);
        }
        Ok(news)
    })?;
    for (k, (fence, _)) in news.iter().enumerate() {
        st.new_grants += 1;
        st.fence_regressions += u64::from(*fence <= held[k].1);
    }
    st.expiries += KEYS as u64;
    st.rounds += 1;
    Ok(())
}

/// Reads every log: entries below an earlier entry are stale writes that landed.
fn audit(server: &Server, prefix: &str, st: &mut Stats) -> Result<(), String> {
    let mut c = connect(server)?;
    let cmds: Vec<_> = (0..KEYS)
        .map(|k| args!["LRANGE", format!("{{{prefix}:{k}}}:log"), 0u64, -1i64])
        .collect();
    let logs = c.pipeline(&cmds).map_err(|e| e.to_string())?;
    for (k, rep) in logs.iter().enumerate() {
        let items = rep
            .as_items()
            .ok_or_else(|| format!("LRANGE answered {rep:?}"))?;
        let mut max = 0u64;
        for it in items {
            let f = it.as_text().and_then(|t| t.parse::<u64>().ok());
            let f = f.ok_or_else(|| format!("log entry {it:?}"))?;
            st.log_entries += 1;
            if f < max {
                st.stale_applied += 1;
                example(&mut st.examples, 3, || {
                    format!("key {k}: fence {f} written after fence {max}")
                });
            }
            max = max.max(f);
        }
    }
    Ok(())
}

pub const TITLE: &str = "Guarded writes (LOCK.IFHELD of holders paused past their leases)";
pub const TARGET: &str = "0 stale writes applied over 10,000 lease expiries; the unguarded control shows stale writes applied";

pub fn run(env: &Env, o: &mut Outcome) -> Result<(), String> {
    let server = env.start("guarded")?;
    let mut rng = Rng::new(env.seed ^ 0x6775_6172);
    let rounds = env.n(40.0, 4.0);
    let (mut g, mut p) = (Stats::default(), Stats::default());
    let t = Instant::now();
    for r in 0..rounds {
        round(&server, "rel:g", true, r, &mut rng, &mut g)
            .map_err(|e| format!("guarded round {r}: {e}"))?;
    }
    audit(&server, "rel:g", &mut g)?;
    let secs = t.elapsed().as_secs_f64();
    // The control shows the hazard: a round whose pause ended before any lease did shows
    // none, so it runs on (at most 8 rounds more) until its logs show a stale write.
    let least = rounds.div_ceil(4);
    for r in 0..least + 8 {
        round(&server, "rel:p", false, r, &mut rng, &mut p)
            .map_err(|e| format!("control round {r}: {e}"))?;
        if r + 1 >= least {
            let mut seen = p.clone();
            audit(&server, "rel:p", &mut seen)?;
            if seen.stale_applied > 0 || r + 1 == least + 8 {
                p = seen;
                break;
            }
        }
    }
    o.put("ttl", TTL_MS);
    o.put("keys", KEYS);
    o.put("secs", secs);
    o.put("guarded", &g);
    o.put("plain", &p);
    o.put("examples", [&g.examples[..], &p.examples[..]].concat());
    let target = env.n(10_000.0, 1_000.0);
    let (stale, after) = (g.stale_applied, g.late_accepted_after_next);
    o.fail_if(
        stale > 0 || after > 0,
        format!("{stale} stale guarded writes applied ({after} accepted after the next grant)"),
    );
    o.fail_if(
        g.fence_regressions + p.fence_regressions > 0,
        "a new holder's fence was not above the old holder's",
    );
    o.fail_if(
        g.late_refused == 0,
        "no late write was refused (the pauses did not outlast the leases)",
    );
    o.fail_if(
        p.stale_applied == 0,
        "the unguarded control applied no stale write (nothing shown)",
    );
    let expiries = g.expiries;
    o.fail_if(
        expiries < target,
        format!("{expiries} lease expiries, below {target}"),
    );
    o.healthy(&server, "the server");
    Ok(())
}
