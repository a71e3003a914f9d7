//! Wall-clock steps: the server runs with the LD_PRELOAD shim (scripts/reliability/
//! clockshift.c), whose offset file we rewrite to step its wall clock +/-10 min while
//! clients run a fenced mutex with waiters; judged on each client's monotonic clock. Then
//! restarts with the clock stepped: fences never go back. Details: docs/RELIABILITY.md.

use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::checker::{key_fence_regressions, Grant, Mode};
use crate::common::*;

const STEP_MS: i64 = 600_000;
/// How early a lease may end (or a `BLOCK` wait be answered) against its holder's own
/// deadline: the server counts whole ms. How late: one cron period at `hz 10`
/// (docs/commands.md, "Leases and time"), plus 50 ms of a shared machine's noise.
const EARLY_MS: u64 = 2;
const LATE_MS: u64 = 150;
/// How late in the short run (`make test`): the 150 ms above is a figure of the full run
/// on a quiet machine; CI runs on a loaded 2-core machine where a reply can be read 1-2 s
/// late. The faults the short run catches on that side are waits and leases stretched by
/// the clock's 10 min steps, or never ended.
const LATE_MS_SHORT: u64 = 2_000;
const MS: u64 = 1_000_000;
const CLIENTS: usize = 12;
const KEYS: usize = 6;

/// Rewrites the offset in place (never truncates: the shim has the file mapped).
fn set_offset(path: &Path, ms: i64) -> Result<(), String> {
    let f = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path);
    let text = format!("{ms:<31}\n");
    f.and_then(|f| f.write_all_at(text.as_bytes(), 0))
        .map_err(|e| format!("offset file: {e}"))
}

fn server_ms(c: &mut Conn) -> Result<i64, String> {
    let r = cmd(c, &args!["TIME"])?;
    let part = |i: usize| r.as_items()?.get(i)?.as_text()?.parse::<i64>().ok();
    match (part(0), part(1), r.as_items().map(<[Reply]>::len)) {
        (Some(s), Some(us), Some(2)) => Ok(s * 1000 + us / 1000),
        _ => Err(format!("TIME answered {r:?}")),
    }
}

/// One acquire as its client saw it (times on the client's monotonic clock, ns).
#[derive(Debug, Clone)]
struct Rec {
    key: usize,
    px: u64,
    block: u64,
    invoke: u64,
    complete: u64,
    /// None: the wait timed out. The release: sent, answered, its answer.
    fence: Option<u64>,
    release: Option<(u64, u64, bool)>,
}

#[derive(Debug, Default, serde::Serialize)]
struct Stats {
    acquires: u64,
    grants: u64,
    handoffs_after_expiry: u64,
    waits_timed_out: u64,
    releases: u64,
    abandoned: u64,
    steps: u64,
    /// Leases ended early; grants while the previous holder certainly held the lock;
    /// releases refused while certainly live; `BLOCK` timeouts and hand-offs off bounds.
    early: u64,
    double: u64,
    release_refused: u64,
    waits_short: u64,
    waits_long: u64,
    handoffs_late: u64,
    fence_regressions: u64,
    /// Extremes, ms: the earliest next grant against the previous holder's deadline, the
    /// latest hand-off after a lease was due, `BLOCK` timeouts against the wait asked.
    min_margin_ms: f64,
    max_handoff_ms: f64,
    min_wait_ms: f64,
    max_wait_ms: f64,
    restarts: u64,
    restart_fence_regressions: u64,
    examples: Vec<String>,
}

impl Stats {
    fn example(&mut self, e: String) {
        example(&mut self.examples, 6, || e);
    }
}

fn client(mut c: Conn, id: usize, mut rng: Rng, stop: &AtomicBool) -> Result<Vec<Rec>, String> {
    let mut out = Vec::new();
    for n in (1u64..).take_while(|_| !stop.load(Ordering::Relaxed)) {
        let key = rng.below(KEYS as u64) as usize;
        let (px, block) = (rng.range(80, 400), rng.range(30, 700));
        let (k, t) = (format!("rel:clk:{key}"), format!("clock-{id:02}-{n:012}"));
        let a = args!["LOCK.ACQUIRE", &k, "PX", px, "TOKEN", &t, "BLOCK", block];
        let invoke = now_ns();
        let r = cmd(&mut c, &a)?;
        let complete = now_ns();
        let fence = match r.grant() {
            Some((_, f)) => Some(f),
            None if r == Reply::Nil => None,
            None => return Err(format!("acquire answered {r:?}")),
        };
        let release = None;
        let mut rec = Rec {
            key,
            px,
            block,
            invoke,
            complete,
            fence,
            release,
        };
        if fence.is_some() && rng.chance(60) {
            // Work for part of the lease, then release.
            std::thread::sleep(Duration::from_millis(rng.below(px / 2)));
            let t0 = now_ns();
            let r = cmd(&mut c, &args!["LOCK.RELEASE", &k, &t])?;
            rec.release = Some((t0, now_ns(), r == Reply::Int(1)));
        }
        out.push(rec);
    }
    Ok(out)
}

fn check(recs: &mut [Rec], st: &mut Stats, late_ms: u64) {
    let ms = |ns: i128| ns as f64 / MS as f64;
    let (early, late_ns) = ((EARLY_MS * MS) as i128, (late_ms * MS) as i128);
    (st.min_margin_ms, st.min_wait_ms) = (f64::MAX, f64::MAX);
    (st.max_handoff_ms, st.max_wait_ms) = (f64::MIN, f64::MIN);
    for r in recs.iter() {
        st.acquires += 1;
        let (waited, block) = ((r.complete - r.invoke) as i128, r.block);
        match (r.fence, r.release) {
            (None, _) => {
                st.waits_timed_out += 1;
                let off = waited - (block * MS) as i128;
                st.min_wait_ms = st.min_wait_ms.min(ms(off));
                st.max_wait_ms = st.max_wait_ms.max(ms(off));
                let (short, long) = (off < -early, off > late_ns);
                st.waits_short += u64::from(short);
                st.waits_long += u64::from(long);
                if short || long {
                    st.example(format!(
                        "BLOCK {block} answered nil after {:.1} ms",
                        ms(waited)
                    ));
                }
            }
            (Some(_), None) => (st.grants, st.abandoned) = (st.grants + 1, st.abandoned + 1),
            (Some(_), Some((_, done, ok))) => {
                (st.grants, st.releases) = (st.grants + 1, st.releases + 1);
                // Certainly processed before the holder's own deadline.
                if !ok && done + EARLY_MS * MS < r.invoke + r.px * MS {
                    st.release_refused += 1;
                    let (into, px) = (ms((done - r.invoke) as i128), r.px);
                    st.example(format!(
                        "release {into:.1} ms into a {px} ms lease answered 0"
                    ));
                }
            }
        }
    }
    // Per key, in fence order: each grant against the one before it.
    let mut grants: Vec<&Rec> = recs.iter().filter(|r| r.fence.is_some()).collect();
    grants.sort_by_key(|r| (r.key, r.fence));
    for w in grants.windows(2).filter(|w| w[0].key == w[1].key) {
        let (a, b) = (w[0], w[1]);
        let (key, px, fa, fb) = (a.key, a.px, a.fence, b.fence);
        // The holder's own deadline, and when it gave the lock back.
        let deadline = a.invoke + a.px * MS;
        let released = a.release.map(|(sent, _, ok)| (sent, ok));
        let until = match released {
            Some((sent, true)) => sent.min(deadline),
            _ => deadline,
        };
        st.double += u64::from(b.complete < until);
        if !matches!(released, Some((_, true))) || released.is_some_and(|(s, _)| s >= deadline) {
            let margin = b.complete as i128 - deadline as i128;
            st.min_margin_ms = st.min_margin_ms.min(ms(margin));
            if margin < -early {
                st.early += 1;
                let before = ms(-margin);
                st.example(format!("key {key}: fence {fb:?} granted {before:.1} ms before the {px} ms lease of fence {fa:?} was due to end on its holder's clock"));
            }
            // A waiter already queued when the lease was due: handed the lock then.
            if a.release.is_none() && b.invoke + MS < a.invoke + a.px * MS {
                st.handoffs_after_expiry += 1;
                let late = b.complete as i128 - (a.complete + a.px * MS) as i128;
                st.max_handoff_ms = st.max_handoff_ms.max(ms(late));
                if late > late_ns {
                    st.handoffs_late += 1;
                    let after = ms(late);
                    st.example(format!("key {key}: lease of fence {fa:?} ({px} ms) handed to a waiter {after:.1} ms after it was due"));
                }
            }
        }
    }
    // Fences across the server (one key for the checker): a grant answered before
    // another was asked is lower.
    let across: Vec<Grant> = (recs.iter())
        .filter_map(|r| Some(((0, r.fence?), r.px, (r.invoke, r.complete))))
        .map(|(at, ttl, call)| Grant::new((0, 0), Mode::Exclusive, at, ttl, call))
        .collect();
    st.fence_regressions = key_fence_regressions(&across).0;
    let extremes = [&mut st.min_margin_ms, &mut st.min_wait_ms];
    for v in extremes
        .into_iter()
        .chain([&mut st.max_handoff_ms, &mut st.max_wait_ms])
    {
        if !v.is_finite() || v.abs() > 1e12 {
            *v = 0.0;
        }
        *v = (*v * 10.0).round() / 10.0;
    }
}

pub const TITLE: &str = "Clock steps (+/-10 min of the primary's wall clock, LD_PRELOAD shim)";
pub const TARGET: &str = "0 leases ended early (holders' own monotonic clocks), 0 double grants, waits and hand-offs within the stated resolution, fences never go back (also across restarts)";

pub fn run(env: &Env, o: &mut Outcome) -> Result<(), String> {
    if !env.shim.is_file() {
        let why = "not built (bash scripts/deps-reliability.sh)";
        o.status = Status::NotRun(format!("clock shim {} {why}", env.shim.display()));
        return Ok(());
    }
    let name = format!("clock-{}", env.server_name());
    let offset = env.work.join(format!("{name}-offset"));
    set_offset(&offset, 0)?;
    // appendfsync everysec during the run (an fsync per write stalls the event loop on a
    // busy disk), always from the restarts on (they are about the fence counter).
    let mut server = env
        .builder(&name)
        .arg("appendonly", "yes")
        .arg("appendfsync", "everysec")
        .env("LD_PRELOAD", &env.shim.to_string_lossy())
        .env("CLOCKSHIFT_FILE", &offset.to_string_lossy())
        .try_start()
        .map_err(|e| format!("server with the clock shim: {e}"))?;
    let mut a = connect(&server)?;
    // The shim moves the server's clock.
    let t0 = server_ms(&mut a)?;
    set_offset(&offset, STEP_MS)?;
    let t1 = server_ms(&mut a)?;
    set_offset(&offset, 0)?;
    let shifted = t1 - t0;
    if !(STEP_MS - 10_000..STEP_MS + 60_000).contains(&shifted) {
        return Err(format!(
            "the shim did not move TIME by +{STEP_MS} ms (moved {shifted} ms)"
        ));
    }

    let mut rng = Rng::new(env.seed ^ 0x636c_6f63);
    let steps = env.n(24.0, 6.0);
    let gap = if env.short { 400 } else { 900 };
    let inputs = (0..CLIENTS)
        .map(|i| Ok((connect_for(&server, 10)?, rng.fork(i as u64))))
        .collect::<Result<Vec<_>, String>>()?;
    let stop = AtomicBool::new(false);
    let mut st = Stats::default();
    let mut offsets = Vec::new();
    let started = Instant::now();
    let results: Vec<Result<Vec<Rec>, String>> = std::thread::scope(|s| {
        let handles: Vec<_> = inputs
            .into_iter()
            .enumerate()
            .map(|(i, (c, r))| {
                let stop = &stop;
                s.spawn(move || client(c, i, r, stop))
            })
            .collect();
        // Steps: 0 -> +10 min -> 0 -> -10 min -> 0 -> +10 min ..., each one of STEP_MS.
        for i in 0..steps {
            std::thread::sleep(Duration::from_millis(rng.range(gap / 2, gap)));
            let at = [STEP_MS, 0, -STEP_MS, 0][i as usize % 4];
            if set_offset(&offset, at).is_err() {
                break;
            }
            offsets.push(at);
            st.steps += 1;
        }
        std::thread::sleep(Duration::from_millis(gap));
        stop.store(true, Ordering::Relaxed);
        joined(handles.into_iter().map(|h| h.join()))
    })?;
    let secs = started.elapsed().as_secs_f64();
    let mut recs = Vec::new();
    for r in results {
        recs.extend(r?);
    }
    let late_ms = if env.short { LATE_MS_SHORT } else { LATE_MS };
    check(&mut recs, &mut st, late_ms);
    let mut max_fence = recs.iter().filter_map(|r| r.fence).max().unwrap_or(0);

    // Restarts with the clock stepped back, then forward, from the AOF as written and
    // after a rewrite (which keeps only live locks and the saved counter).
    drop(a);
    for (i, step) in [-STEP_MS, STEP_MS, -STEP_MS].into_iter().enumerate() {
        let mut c = connect(&server)?;
        must(&mut c, &args!["CONFIG", "SET", "appendfsync", "always"])?;
        if i == 2 {
            rewrite_aof(&server, &mut c)?;
        }
        // Released before the kill: the highest fence then lives only in the counter.
        let (tok, f) = acquire(&mut c, "rel:clk:restart", 1000)?;
        st.restart_fence_regressions += u64::from(f <= max_fence);
        max_fence = max_fence.max(f);
        cmd(&mut c, &args!["LOCK.RELEASE", "rel:clk:restart", &tok])?;
        drop(c);
        server.kill9();
        set_offset(&offset, step)?;
        server.try_restart()?;
        let mut c = connect(&server)?;
        let (bad, f) = probe_fences(&mut c, &format!("rel:clk:after:{i}"), 1, max_fence)?;
        st.restart_fence_regressions += bad;
        max_fence = max_fence.max(f);
        st.restarts += 1;
    }
    set_offset(&offset, 0)?;
    o.put("step_ms", STEP_MS);
    o.put("bounds_ms", [EARLY_MS, late_ms]);
    o.put("shape", [CLIENTS, KEYS]);
    o.put("offsets", &offsets);
    o.put("secs", secs);
    o.put("gap_ms", gap);
    let bad = [
        ("leases ended early", st.early),
        ("double grants", st.double),
        (
            "releases refused while the lease was live",
            st.release_refused,
        ),
        ("BLOCK timeouts cut short", st.waits_short),
        ("BLOCK timeouts stretched", st.waits_long),
        ("hand-offs late", st.handoffs_late),
        ("fence regressions", st.fence_regressions),
        (
            "fence regressions after a restart",
            st.restart_fence_regressions,
        ),
    ];
    for (what, n) in bad {
        o.fail_if(n > 0, format!("{n} {what}"));
    }
    o.fail_if(
        st.handoffs_after_expiry == 0 || st.waits_timed_out == 0,
        "no hand-off after an expiry or no BLOCK timeout happened (nothing checked)",
    );
    o.put("stats", &st);
    o.healthy(&server, "the server");
    Ok(())
}
