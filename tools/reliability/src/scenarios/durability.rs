//! Restart durability: clients acquire, extend and release while the server is SIGKILLed
//! (sometimes in an AOF rewrite); after the restart every acknowledged state must be there
//! (token digest in DUMP, fence, a lease ending no earlier), releases stay released, and
//! the next fence is above all before. docs/RELIABILITY.md has the targets per mode.

use std::sync::atomic::{AtomicBool, Ordering};

use crate::common::*;

const CLIENTS: usize = 8;
const KEYS_PER_CLIENT: usize = 32;
const TTL: u64 = 600_000;
/// How much earlier than acknowledged a restored `expires-at` may be (whole ms, and the
/// wall-clock estimate of a monotonic deadline, taken twice).
const EARLY_MS: i64 = 5;

#[derive(Debug, Clone, PartialEq)]
enum Known {
    Untouched,
    Free,
    Held {
        token: Vec<u8>,
        fence: u64,
        exp: Option<i64>,
    },
}

#[derive(Debug, Clone, PartialEq)]
enum Pending {
    Acquire(Vec<u8>),
    Release,
    Extend,
}

#[derive(Debug, Clone)]
struct KeyModel {
    key: String,
    known: Known,
    pending: Option<Pending>,
}

/// The persistence modes (an AOF mode's name is its `appendfsync` option), and their kills
/// (full, short run).
const MODES: [(&str, f64, f64); 3] = [
    ("appendfsync always", 25.0, 4.0),
    ("appendfsync everysec", 10.0, 2.0),
    ("RDB only (save 1 1)", 10.0, 2.0),
];

#[derive(Debug, Default, Clone, serde::Serialize)]
struct Stats {
    mode: &'static str,
    rounds: u64,
    acked_ops: u64,
    held_checked: u64,
    lost: u64,
    changed: u64,
    free_checked: u64,
    resurrected: u64,
    /// In flight at the kill; of those, in neither the old nor the new state.
    ambiguous: u64,
    ambiguous_bad: u64,
    fence_regressions: u64,
    rewrites: u64,
    /// RDB: `rdb_changes_since_last_save` after 3 grants on a fresh key each (what the
    /// server's `save` points count).
    changes_counted: Option<u64>,
    #[serde(skip)]
    errors: Vec<String>,
}

struct ClientOut {
    keys: Vec<KeyModel>,
    acked: u64,
    errors: Vec<String>,
}

fn client(mut c: Conn, round: u64, cid: usize, mut rng: Rng, stop: &AtomicBool) -> ClientOut {
    let mut keys: Vec<KeyModel> = (0..KEYS_PER_CLIENT)
        .map(|i| KeyModel {
            key: format!("rel:dur:{round}:{cid}:{i}"),
            known: Known::Untouched,
            pending: None,
        })
        .collect();
    let (mut acked, mut errors, mut n) = (0u64, Vec::new(), 0u64);
    while !stop.load(Ordering::Relaxed) {
        let i = rng.below(KEYS_PER_CLIENT as u64) as usize;
        let m = &mut keys[i];
        n += 1;
        let (cmd, pending, what) = match &m.known {
            Known::Held { token, .. } if rng.chance(40) => (
                args!["LOCK.RELEASE", &m.key, token],
                Pending::Release,
                "release of a held key",
            ),
            Known::Held { token, .. } => (
                args!["LOCK.EXTEND", &m.key, token, "PX", TTL],
                Pending::Extend,
                "extend of a held key",
            ),
            Known::Untouched | Known::Free => {
                let token = format!("tok-{round:03}-{cid:02}-{i:02}-{n:06}").into_bytes();
                let a = args!["LOCK.ACQUIRE", &m.key, "PX", TTL, "TOKEN", &token];
                (a, Pending::Acquire(token), "acquire of a free key")
            }
        };
        // Grants and extends are followed by the expiry the server set.
        let info = pending != Pending::Release;
        m.pending = Some(pending);
        c.queue(&cmd);
        if info {
            c.queue(&args!["LOCK.INFO", &m.key]);
        }
        if c.flush().is_err() {
            break;
        }
        let Ok(r) = c.read() else { break };
        let held = |(token, fence)| Known::Held {
            token,
            fence,
            exp: None,
        };
        let next = match (&m.pending, &m.known) {
            (Some(Pending::Acquire(t)), _) => r.grant().filter(|g| g.0 == *t).map(held),
            (Some(Pending::Release), _) => (r == Reply::Int(1)).then_some(Known::Free),
            (_, Known::Held { token, fence, .. }) => {
                (r == Reply::Int(1)).then(|| held((token.clone(), *fence)))
            }
            _ => None,
        };
        let Some(next) = next else {
            errors.push(format!("{what} answered {r:?}"));
            break;
        };
        (m.known, m.pending) = (next, None);
        acked += 1;
        if info {
            let Ok(info) = c.read() else { break };
            if let (Known::Held { exp, .. }, Some((_, e))) = (&mut m.known, lock_info(&info)) {
                *exp = Some(e);
            }
        }
    }
    ClientOut {
        keys,
        acked,
        errors,
    }
}

/// What the restarted server holds for a key: (fence, expires-at, the token's digest found
/// in DUMP).
fn actual(
    c: &mut Conn,
    key: &str,
    token: Option<&[u8]>,
) -> Result<Option<(u64, i64, bool)>, String> {
    let info = cmd(c, &args!["LOCK.INFO", key])?;
    if info == Reply::Nil {
        return Ok(None);
    }
    let (fence, exp) = lock_info(&info).ok_or_else(|| format!("bad LOCK.INFO {info:?}"))?;
    let Some(t) = token else {
        return Ok(Some((fence, exp, false)));
    };
    let dump = cmd(c, &args!["DUMP", key])?;
    let digest = redis_lock_testkit::lock::token_digest(t);
    let has_token = dump
        .as_bytes()
        .is_some_and(|d| d.windows(digest.len()).any(|w| w == digest));
    Ok(Some((fence, exp, has_token)))
}

fn verify(
    c: &mut Conn,
    keys: &[KeyModel],
    st: &mut Stats,
    max_fence: &mut u64,
) -> Result<(), String> {
    for m in keys {
        let token = match (&m.known, &m.pending) {
            (_, Some(Pending::Acquire(t))) => Some(t.as_slice()),
            (Known::Held { token, .. }, _) => Some(token.as_slice()),
            _ => None,
        };
        let got = actual(c, &m.key, token)?;
        if let Some((f, _, _)) = got {
            *max_fence = (*max_fence).max(f);
        }
        match (&m.known, &m.pending, got) {
            (Known::Untouched, None, None) => {}
            (Known::Untouched, None, Some(_)) => st.ambiguous_bad += 1,
            (Known::Free, None, g) => {
                st.free_checked += 1;
                st.resurrected += u64::from(g.is_some());
            }
            (Known::Held { fence, exp, .. }, None, g) => {
                st.held_checked += 1;
                // Copies carry the time left: the restored lease may end later (by the
                // downtime), never earlier.
                let changed = |(f, e, tok): (u64, i64, bool)| {
                    f != *fence || !tok || exp.is_some_and(|x| e < x - EARLY_MS)
                };
                st.lost += u64::from(g.is_none());
                st.changed += u64::from(g.is_some_and(changed));
            }
            // In flight at the kill: either outcome is fine, nothing else is.
            (_, Some(Pending::Acquire(_)), g) => {
                st.ambiguous += 1;
                st.ambiguous_bad += u64::from(g.is_some_and(|(_, _, tok)| !tok));
            }
            (Known::Held { fence, .. }, Some(_), g) => {
                st.ambiguous += 1;
                st.ambiguous_bad += u64::from(g.is_some_and(|(f, _, tok)| f != *fence || !tok));
            }
            (_, Some(_), _) => st.ambiguous += 1,
        }
    }
    Ok(())
}

/// Kills under load with persistence mode `i` of [`MODES`].
fn run_mode(env: &Env, i: usize, rounds: u64, rng: &mut Rng) -> Result<Stats, String> {
    let name = MODES[i].0;
    let rdb = !name.starts_with("appendfsync");
    let conf = if rdb {
        "save 1 1".into()
    } else {
        format!("appendonly yes; {name}")
    };
    let mut server = env.start_with(&format!("dur-{i}"), &conf)?;
    let mut st = Stats {
        mode: name,
        ..Stats::default()
    };
    let mut max_acked_fence = 0u64;
    for round in 0..rounds {
        let inputs = (0..CLIENTS)
            .map(|cid| Ok((connect(&server)?, rng.fork(round * 100 + cid as u64))))
            .collect::<Result<Vec<_>, String>>()?;
        // RDB snapshots come at most once a second: give them time to happen.
        let run_ms = if rdb {
            rng.range(1000, 4000)
        } else {
            rng.range(200, 1200)
        };
        let rewrite_at = (!rdb && rng.chance(50)).then(|| rng.below(run_ms));
        let rewrite = |s: &Server| {
            let r = cmd(&mut connect(s)?, &args!["BGREWRITEAOF"])?;
            st.rewrites += u64::from(!r.is_error());
            Ok(())
        };
        let fault = rewrite_at.map(|at| (at, rewrite));
        let client = |cid, (c, r), stop: &AtomicBool| client(c, round, cid, r, stop);
        let outs = kill_under_load(&mut server, run_ms, fault, inputs, client)?;
        server
            .try_restart()
            .map_err(|e| format!("restart after SIGKILL failed (round {round}): {e}"))?;
        let mut c = connect(&server)?;
        let mut restored_max = 0u64;
        for o in &outs {
            st.acked_ops += o.acked;
            st.errors.extend(o.errors.iter().cloned());
            for m in &o.keys {
                if let Known::Held { fence, .. } = m.known {
                    max_acked_fence = max_acked_fence.max(fence);
                }
            }
            verify(&mut c, &o.keys, &mut st, &mut restored_max)?;
        }
        // The next grant must be above everything acknowledged or restored.
        let above = max_acked_fence.max(restored_max);
        let (bad, fence) = probe_fences(&mut c, &format!("rel:dur:probe:{round}"), 1, above)?;
        st.fence_regressions += bad;
        max_acked_fence = max_acked_fence.max(fence);
        st.rounds += 1;
    }
    if rdb {
        let mut c = connect(&server)?;
        let before = server.info_field("persistence", "rdb_changes_since_last_save");
        for i in 0..3 {
            acquire(&mut c, &format!("rel:dur:dirty:{i}"), TTL)?;
        }
        let after = server.info_field("persistence", "rdb_changes_since_last_save");
        let n = |v: Option<String>| v.and_then(|v| v.parse::<u64>().ok());
        st.changes_counted = n(after).zip(n(before)).map(|(a, b)| a.saturating_sub(b));
    }
    st.errors.extend(health(&server, "the server").err());
    Ok(st)
}

pub const TITLE: &str = "Restart durability (SIGKILL under load)";
pub const TARGET: &str =
    "appendfsync always: 0 acknowledged locks lost or changed, 0 fence regressions";

pub fn run(env: &Env, o: &mut Outcome) -> Result<(), String> {
    let mut rng = Rng::new(env.seed ^ 0x6475_7261);
    let mut modes = vec![];
    for (i, (name, full, short)) in MODES.into_iter().enumerate() {
        let st = match run_mode(env, i, env.n(full, short), &mut rng) {
            Ok(st) => st,
            Err(e) => {
                o.fail(format!("{name}: {e}"));
                continue;
            }
        };
        let bad = st.lost + st.changed + st.resurrected + st.ambiguous_bad;
        o.fail_if(
            name == "appendfsync always" && bad > 0,
            format!("{bad} acknowledged states lost or changed with appendfsync always"),
        );
        let regressions = st.fence_regressions;
        o.fail_if(
            regressions > 0,
            format!("{name}: {regressions} fence regressions"),
        );
        if let Some(e) = st.errors.first() {
            o.fail(format!("{name}: {e}"));
        }
        modes.push(st);
    }
    o.put("modes", modes);
    Ok(())
}
