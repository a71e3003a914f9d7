//! The readers/writers and semaphore cells of the contention section of
//! docs/BENCHMARKS.md, and docs/contention-kinds.png: the module's `SHARED` and
//! `LIMIT n` locks with `BLOCK` against the client-side recipes people use for the same
//! job. Rendered from the `kinds` of docs/data/contention.json.

use std::fmt::Write as _;
use std::path::Path;

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use serde::{Deserialize, Serialize};

use crate::chart::{decades, FONT};
use crate::contention::{ms, per_sec, ContentionRun};
use crate::Error;

/// Pause between two attempts of the client-side read-write lock recipes: uniform in
/// this range of µs (10 ms ± 5 ms, node-redlock's jitter as the mutex cells use it).
pub const RW_POLL_US: (u64, u64) = (5_000, 14_999);
/// Pause between two attempts of the sorted-set semaphore (redis-semaphore's default
/// `retryInterval` for npm).
pub const SEM_POLL_MS: u64 = 10;
/// Lease of a waiting writer's announcement in the writer-first recipe (refreshed at
/// every attempt of that writer).
pub const INTENT_MS: u64 = 1_000;

/// Throughput, waits and fairness of one group of a cell's clients (its readers, its
/// writers, or all of them). See tools/contention/src/stats.rs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RoleStats {
    pub clients: usize,
    pub acquisitions: u64,
    /// Acquisitions ÷ the cell's time to its last release.
    pub per_second: f64,
    /// From a client's first attempt to its grant (a wait that never ended counts with
    /// its length when the client gave up).
    pub wait_p50_ms: f64,
    pub wait_p99_ms: f64,
    pub wait_max_ms: f64,
    /// Jain's index over acquisitions per client of the group.
    pub jain: f64,
    /// Clients of the group still waiting when they gave up.
    pub gave_up: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KindSummary {
    pub elapsed_s: f64,
    pub all: RoleStats,
    /// A readers/writers cell's readers and writers (none in a semaphore cell).
    pub readers: Option<RoleStats>,
    pub writers: Option<RoleStats>,
    pub commands_per_acquisition: f64,
    pub round_trips_per_acquisition: f64,
    /// The most clients that held the lock at one instant.
    pub peak_holders: u64,
    /// Holders on average over the cell.
    pub mean_holders: f64,
    /// Grants that broke the lock's rule (a writer next to another holder, a reader
    /// next to a writer, more than `limit` holders).
    pub violations: u64,
    /// Reader grants that overtook a waiting writer (asked after it, granted before it),
    /// in all and the most during one writer's wait.
    pub overtakes: u64,
    pub overtakes_most: u64,
}

/// One readers/writers (`family` `rw`) or semaphore (`sem`) cell.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct KindCell {
    pub family: String,
    /// `shared`, `module`, `jitter`, `rw-script`, `rw-script-wfirst` (rw);
    /// `limit`, `zset` (sem).
    pub method: String,
    pub label: String,
    /// Readers and writers of an rw cell (0 in a semaphore cell).
    pub readers: usize,
    pub writers: usize,
    /// Every client of the cell.
    pub clients: usize,
    /// Permits of a semaphore cell.
    pub limit: Option<u32>,
    pub hold_ms: u64,
    pub summary: KindSummary,
    /// Calls of the clients' commands from INFO commandstats, and the clients' own count.
    pub server_commands: u64,
    pub client_commands: u64,
    /// Cores kept busy by other processes during the cell.
    pub other_cores: Option<f64>,
}

/// The cells of one family (`rw`, `sem`), critical-section length first, then in the
/// order the run measured them.
fn family<'a>(kinds: &'a [KindCell], id: &str) -> Vec<&'a KindCell> {
    let mut v: Vec<&KindCell> = kinds.iter().filter(|c| c.family == id).collect();
    v.sort_by_key(|c| c.hold_ms); // stable: the run's order within one c
    v
}

fn find<'a>(cells: &[&'a KindCell], method: &str, hold_ms: u64) -> Option<&'a KindCell> {
    cells
        .iter()
        .copied()
        .find(|c| c.method == method && c.hold_ms == hold_ms)
}

fn holds(cells: &[&KindCell]) -> Vec<u64> {
    let mut v: Vec<u64> = cells.iter().map(|c| c.hold_ms).collect();
    v.dedup(); // sorted by `family`
    v
}

fn other(c: &KindCell) -> String {
    c.other_cores
        .map_or_else(|| "?".to_string(), |v| format!("{v:.1}"))
}

/// A longest wait, marked when clients gave up waiting.
fn longest(g: &RoleStats) -> String {
    if g.gave_up > 0 {
        format!("{} ({} gave up)", ms(g.wait_max_ms), g.gave_up)
    } else {
        ms(g.wait_max_ms)
    }
}

/// The method's name, flagged when a grant broke the lock's rule.
fn name(c: &KindCell) -> String {
    if c.summary.violations > 0 && c.family == "rw" {
        format!("{} **{} VIOLATIONS**", c.label, c.summary.violations)
    } else {
        c.label.clone()
    }
}

fn rw_table(out: &mut String, cells: &[&KindCell]) {
    let _ = writeln!(
        out,
        "| method | c | reads/s | writes/s | reader wait p99 | writer wait p50 | writer wait p99 | writer's longest wait | readers past a waiting writer: all / most in one wait | holders at once: most / mean | commands/acq. | Jain (readers) | other load |"
    );
    let _ = writeln!(out, "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|");
    for c in cells {
        let s = &c.summary;
        let (Some(r), Some(w)) = (&s.readers, &s.writers) else {
            continue;
        };
        let _ = writeln!(
            out,
            "| {} | {} ms | {} | {} | {} | {} | {} | {} | {} / {} | {} / {:.2} | {:.2} | {:.3} | {} |",
            name(c),
            c.hold_ms,
            per_sec(r.per_second),
            per_sec(w.per_second),
            ms(r.wait_p99_ms),
            ms(w.wait_p50_ms),
            ms(w.wait_p99_ms),
            longest(w),
            s.overtakes,
            s.overtakes_most,
            s.peak_holders,
            s.mean_holders,
            s.commands_per_acquisition,
            r.jain,
            other(c),
        );
    }
}

fn sem_table(out: &mut String, cells: &[&KindCell]) {
    let _ = writeln!(
        out,
        "| method | c | acquisitions/s | permits in use (mean) | holders at once (most) | grants beyond n | wait p50 | wait p99 | longest wait | commands/acq. | round trips/acq. | Jain | other load |"
    );
    let _ = writeln!(out, "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|");
    for c in cells {
        let s = &c.summary;
        let beyond = if s.violations > 0 {
            format!("**{}**", s.violations)
        } else {
            "0".to_string()
        };
        let _ = writeln!(
            out,
            "| {} | {} ms | {} | {:.2} of {} | {} | {} | {} | {} | {} | {:.2} | {:.2} | {:.3} | {} |",
            c.label,
            c.hold_ms,
            per_sec(s.all.per_second),
            s.mean_holders,
            c.limit.unwrap_or(0),
            s.peak_holders,
            beyond,
            ms(s.all.wait_p50_ms),
            ms(s.all.wait_p99_ms),
            longest(&s.all),
            s.commands_per_acquisition,
            s.round_trips_per_acquisition,
            s.all.jain,
            other(c),
        );
    }
}

/// "0 ms: x; 1 ms: y" over the cells of `method`.
fn per_hold(cells: &[&KindCell], method: &str, f: impl Fn(&KindCell) -> String) -> String {
    cells
        .iter()
        .filter(|c| c.method == method)
        .map(|c| format!("{} at c = {} ms", f(c), c.hold_ms))
        .collect::<Vec<_>>()
        .join(", ")
}

fn rw_goals(out: &mut String, rw: &[&KindCell]) {
    let module: Vec<&&KindCell> = rw.iter().filter(|c| c.method == "shared").collect();
    if module.is_empty() {
        return;
    }
    let writers = |c: &KindCell| c.summary.writers.clone();
    // Bounded bypass, the textbook form of "no starvation": while a writer waits, each
    // reader gets in ahead of it at most once (see the column's definition).
    let fed = module.iter().all(|c| {
        c.summary.overtakes_most <= c.readers as u64
            && writers(c).is_some_and(|w| w.gave_up == 0 && w.acquisitions > 0)
    });
    let reads: u64 = module
        .iter()
        .filter_map(|c| c.summary.readers.as_ref().map(|r| r.acquisitions))
        .sum();
    let _ = write!(
        out,
        "- No writer starves (bounded bypass: while a writer waits, no more readers get in \
         ahead of it than there are readers, {}): **{}**. The most readers past one waiting \
         writer: {}; {} of {} reader grants in all; the writer's longest wait was {}",
        module.first().map_or(0, |c| c.readers),
        if fed { "met" } else { "not met" },
        per_hold(rw, "shared", |c| c.summary.overtakes_most.to_string()),
        module.iter().map(|c| c.summary.overtakes).sum::<u64>(),
        reads,
        per_hold(rw, "shared", |c| {
            writers(c).map_or_else(|| "?".into(), |w| longest(&w))
        }),
    );
    let starved = rw
        .iter()
        .filter(|c| c.method == "rw-script")
        .max_by(|a, b| {
            let w = |c: &KindCell| writers(c).map_or(0.0, |w| w.wait_max_ms);
            w(a).total_cmp(&w(b))
        });
    match starved.and_then(|c| writers(c).map(|w| (c, w))) {
        Some((c, w)) => {
            let _ = writeln!(
                out,
                ". The readers-first Lua lock at c = {} ms let up to {} readers past one \
                 waiting writer ({} in all), which waited up to {} ({} write{} in the {:.2} s \
                 the cell ran).",
                c.hold_ms,
                c.summary.overtakes_most,
                c.summary.overtakes,
                longest(&w),
                w.acquisitions,
                if w.acquisitions == 1 { "" } else { "s" },
                c.summary.elapsed_s,
            );
        }
        None => {
            let _ = writeln!(out, ".");
        }
    }
    let ratio = |other: &'static str| {
        per_hold(rw, "shared", move |c| {
            let reads = |m: &KindCell| m.summary.readers.as_ref().map_or(0.0, |r| r.per_second);
            find(rw, other, c.hold_ms)
                .map_or_else(|| "?".into(), |m| format!("{:.1}×", reads(c) / reads(m)))
        })
    };
    let _ = write!(
        out,
        "- Readers share the lock: up to {} readers at once ({}); reads/s against one module \
         mutex for everybody: {}",
        module
            .iter()
            .map(|c| c.summary.peak_holders)
            .max()
            .unwrap_or(0),
        per_hold(rw, "shared", |c| format!(
            "{:.2} on average",
            c.summary.mean_holders
        )),
        ratio("module"),
    );
    if rw.iter().any(|c| c.method == "rw-script-wfirst") {
        let _ = write!(
            out,
            "; against the writer-first Lua lock, whose readers poll while the writer \
             takes the lock again and again: {}",
            ratio("rw-script-wfirst")
        );
    }
    let _ = writeln!(out, ".");
}

fn sem_goals(out: &mut String, sem: &[&KindCell]) {
    let module: Vec<&&KindCell> = sem.iter().filter(|c| c.method == "limit").collect();
    if module.is_empty() {
        return;
    }
    // FIFO's bound: the clients ahead go through the n permits in turns of c, one
    // hand-off each, the overhead budgeted as in the mutex goals (1 ms).
    let bound = |c: &KindCell| {
        let n = c.limit.unwrap_or(1).max(1) as usize;
        c.clients.div_ceil(n) as f64 * (c.hold_ms as f64 + 1.0)
    };
    let over: Vec<&&&KindCell> = module
        .iter()
        .filter(|c| c.summary.all.wait_max_ms > bound(c))
        .collect();
    let p99_met = module.iter().all(|c| c.summary.all.wait_p99_ms <= bound(c));
    let _ = write!(
        out,
        "- Semaphore: longest wait within FIFO's bound ⌈N / n⌉ × (c + 1 ms): **{}**",
        if over.is_empty() { "met" } else { "not met" }
    );
    if over.is_empty() {
        let _ = write!(
            out,
            " ({})",
            per_hold(sem, "limit", |c| ms(c.summary.all.wait_max_ms))
        );
    } else {
        let _ = write!(out, "; over it:");
        for (i, c) in over.iter().enumerate() {
            let _ = write!(
                out,
                "{} c = {} ms: longest {:.2} ms against {:.2} ms (p99 {:.2} ms)",
                if i == 0 { "" } else { ";" },
                c.hold_ms,
                c.summary.all.wait_max_ms,
                bound(c),
                c.summary.all.wait_p99_ms,
            );
        }
    }
    let _ = writeln!(
        out,
        "; 99th-percentile wait within it: **{}**.",
        if p99_met {
            "met in every cell"
        } else {
            "not met"
        }
    );
    let _ = write!(
        out,
        "- Permits in use on average: {} for the module",
        per_hold(sem, "limit", |c| format!(
            "{:.2} of {}",
            c.summary.mean_holders,
            c.limit.unwrap_or(0)
        ))
    );
    if sem.iter().any(|c| c.method == "zset") {
        let _ = write!(
            out,
            "; {} for the sorted-set recipe, which gave out {} permits beyond n (up to {} holders at once)",
            per_hold(sem, "zset", |c| format!("{:.2}", c.summary.mean_holders)),
            sem.iter()
                .filter(|c| c.method == "zset")
                .map(|c| c.summary.violations)
                .sum::<u64>(),
            sem.iter()
                .filter(|c| c.method == "zset")
                .map(|c| c.summary.peak_holders)
                .max()
                .unwrap_or(0),
        );
    }
    let _ = writeln!(out, ".");
}

/// Goals both families share: 2 commands per acquisition, no grant against the rule.
fn common_goals(out: &mut String, module: &[&KindCell]) {
    if module.is_empty() {
        return;
    }
    let exact = module
        .iter()
        .all(|c| (c.summary.commands_per_acquisition - 2.0).abs() < 1e-9);
    let _ = writeln!(
        out,
        "- Exactly 2 commands per acquisition (`SHARED`, exclusive and `LIMIT`): **{}**.",
        if exact { "met" } else { "not met" }
    );
    let bad: u64 = module.iter().map(|c| c.summary.violations).sum();
    let _ = writeln!(
        out,
        "- No grant against the lock's rule (a writer beside another holder, a reader beside \
         a writer, more than n permits): **{}** ({} violations over {} acquisitions).",
        if bad == 0 { "met" } else { "not met" },
        bad,
        module
            .iter()
            .map(|c| c.summary.all.acquisitions)
            .sum::<u64>()
    );
}

/// The readers/writers and semaphore part of the contention section; empty when the run
/// had no such cells.
pub fn section(out: &mut String, kinds: &[KindCell]) {
    let rw = family(kinds, "rw");
    let sem = family(kinds, "sem");
    if rw.is_empty() && sem.is_empty() {
        return;
    }
    let (lo, hi) = RW_POLL_US;
    let jitter = format!(
        "{:.0} ms ± {:.0} ms",
        (lo + hi + 1) as f64 / 2e3,
        (hi + 1 - lo) as f64 / 2e3
    );
    if let Some(first) = rw.first() {
        let _ = writeln!(
            out,
            "### Readers and writers: {} readers + {} writer{}, one lock\n",
            first.readers,
            first.writers,
            if first.writers == 1 { "" } else { "s" }
        );
        let _ = writeln!(
            out,
            "The same loop as above (acquire, hold c ms, release, again at once), but the \
             readers ask for a shared hold and the writer{} for an exclusive one. Methods:\n",
            if first.writers == 1 { "" } else { "s" }
        );
        let _ = writeln!(
            out,
            "- **module SHARED BLOCK**: readers `LOCK.ACQUIRE k SHARED PX 10000 BLOCK 10000`, \
             the writer the same without `SHARED`; `LOCK.RELEASE k token`. One FIFO queue: \
             readers at its head are granted together, and a waiting writer holds back every \
             reader that comes after it."
        );
        let _ = writeln!(
            out,
            "- **(a) one mutex** for everybody, readers included: the module's \
             `LOCK.ACQUIRE k PX 10000 BLOCK 10000`, and the `SET NX PX` recipe retried after \
             {jitter} (method (b) of the mutex cells)."
        );
        let _ = writeln!(
            out,
            "- **(b) Lua read-write lock**, the client-side recipe: one hash per lock holding a \
             reader count and the writer's token, changed only by Lua scripts (`EVALSHA`), as \
             Redisson's RReadWriteLock (a hash with the mode and its holders) and Community \
             Solid Server's RedisLocker (a read counter and a write flag) keep it. A reader gets \
             in while no writer holds it (`HEXISTS writer`, `HINCRBY readers 1`, `PEXPIRE`); a \
             writer once there is neither writer nor reader (`HSET writer token`); releases \
             are `HINCRBY readers -1` and a compare-and-`HDEL`. A refused client sleeps \
             {jitter} and tries again. *Readers first* is that; in *writer first* (the \
             \"writer's priority\" of python's redis-rw-lock) a refused writer also writes its \
             token to a second key (`SET k:writer-waiting token PX {INTENT_MS}`), which keeps \
             new readers out and lets only that writer in next.\n"
        );
        let _ = writeln!(
            out,
            "Columns: *reads/s*, *writes/s*: the readers' and the writers' acquisitions ÷ the \
             cell's time to its last release. *Wait*: from a client's first attempt to its \
             grant. *Readers past a waiting writer*: reader grants that went, before a waiting \
             writer got the lock, to a reader that started to ask 1 ms or more after the \
             writer's request had been written to its socket (so the reader's request reached \
             the server later); in all, and the most during one writer's wait. A FIFO queue \
             bounds the most: only a reader whose request the server read first in the same \
             pass over its sockets (after a stall of the server, say) can get ahead, at most \
             each reader once. A lock that lets readers in while a writer waits has no bound: \
             the writer waits for as long as readers keep coming. *Holders at once*: the most, and the average, of clients \
             whose critical sections overlapped (from the grant reply to the release request, \
             a span within which the server held the lock for them). *Jain (readers)*: over the \
             readers' acquisitions (the writer's differ by design).\n"
        );
        rw_table(out, &rw);
        out.push('\n');
    }
    if let Some(first) = sem.first() {
        let n = first.limit.unwrap_or(0);
        let _ = writeln!(
            out,
            "### Semaphore: {} clients, {n} permits\n",
            first.clients
        );
        let _ = writeln!(
            out,
            "The same loop, each client taking one of the {n} permits. Methods:\n"
        );
        let _ = writeln!(
            out,
            "- **module LIMIT n BLOCK**: `LOCK.ACQUIRE k LIMIT {n} PX 10000 BLOCK 10000`, \
             `LOCK.RELEASE k token`; the queue grants its waiters in order while permits are \
             free."
        );
        let _ = writeln!(
            out,
            "- **sorted-set semaphore**, the recipe of *Redis in Action* (6.3) and many blog \
             posts: in one `MULTI`/`EXEC` round trip `ZREMRANGEBYSCORE k -inf (now−10 s` (drop \
             holders whose lease ended), `ZADD k now id`, `ZRANK k id`; a rank below {n} holds \
             a permit, otherwise `ZREM k id`, sleep {SEM_POLL_MS} ms (redis-semaphore's default \
             `retryInterval` for node) and try again. Release: `ZREM k id`. `now` is the \
             client's clock in µs, read just before the `MULTI`; a client whose request \
             reaches the server later than one that read its clock after it ranks ahead of \
             that one, and both may hold a permit: more than {n} holders at once.\n"
        );
        let _ = writeln!(
            out,
            "Columns as above; *permits in use*: holders on average over the cell, out of \
             {n}; *grants beyond n*: grants that made more than {n} holders at once; \
             *round trips/acq.*: the `MULTI` … `EXEC` of one attempt is sent as one write, \
             five commands.\n"
        );
        sem_table(out, &sem);
        out.push('\n');
    }
    let _ = writeln!(out, "### Goals (module: SHARED and LIMIT)\n");
    rw_goals(out, &rw);
    sem_goals(out, &sem);
    let module: Vec<&KindCell> = rw
        .iter()
        .chain(&sem)
        .copied()
        .filter(|c| matches!(c.method.as_str(), "shared" | "limit"))
        .collect();
    common_goals(out, &module);
    out.push('\n');
    let _ = writeln!(
        out,
        "![Readers/writers and semaphore: throughput and waits per method](contention-kinds.png)\n"
    );
}

/// A method's name on the chart's axis.
fn short_label(method: &str) -> &str {
    match method {
        "shared" => "module SHARED",
        "module" => "one mutex: module",
        "jitter" => "one mutex: SET NX",
        "rw-script" => "Lua, readers first",
        "rw-script-wfirst" => "Lua, writer first",
        "limit" => "module LIMIT",
        "zset" => "sorted set",
        other => other,
    }
}

/// One panel of docs/contention-kinds.png: a group of bars per method, one bar per
/// critical-section length, on a log axis.
struct KindPanel<'a> {
    title: String,
    cells: Vec<&'a KindCell>,
    value: fn(&KindCell) -> f64,
    unit: &'static str,
    color: RGBColor,
}

fn methods_of<'a>(cells: &[&'a KindCell]) -> Vec<&'a str> {
    let mut v: Vec<&str> = Vec::new();
    for c in cells {
        if !v.contains(&c.method.as_str()) {
            v.push(&c.method);
        }
    }
    v
}

fn tick(y: f64) -> String {
    if y >= 1000.0 {
        format!("{:.0}k", y / 1000.0)
    } else if y >= 1.0 {
        format!("{y:.0}")
    } else {
        let digits = (-y.log10().floor()) as usize;
        format!("{y:.digits$}")
    }
}

fn bar_label(v: f64) -> String {
    crate::fmt::scaled(
        v,
        &[
            (1e4, 1e3, 0, "k"),
            (1e3, 1e3, 1, "k"),
            (10.0, 1.0, 0, ""),
            (f64::MIN, 1.0, 1, ""),
        ],
    )
}

fn draw_panel(area: &DrawingArea<BitMapBackend, Shift>, p: &KindPanel) -> Result<(), Error> {
    let methods = methods_of(&p.cells);
    let holds = holds(&p.cells);
    // Bars start at the axis' floor; a 0 (nothing measured) sits on it.
    let (lo, hi) = decades(p.cells.iter().map(|c| (p.value)(c)).filter(|v| *v > 0.0));
    let floor = |v: f64| v.max(lo);
    let n = methods.len().max(1) as f64;
    let mut chart = ChartBuilder::on(area)
        .caption(&p.title, (FONT, 20).into_font())
        .margin(16)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(-0.5f64..n - 0.5, (lo..hi * 1.8).log_scale())?;
    let category = |x: &f64| {
        let g = x.round();
        let name = (g >= 0.0 && (x - g).abs() < 0.01).then(|| methods.get(g as usize));
        name.flatten()
            .map_or(String::new(), |m| short_label(m).to_string())
    };
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(methods.len())
        .x_label_formatter(&category)
        .y_desc(p.unit)
        .y_label_formatter(&|y| tick(*y))
        .label_style((FONT, 14).into_font())
        .axis_desc_style((FONT, 15).into_font())
        .light_line_style(RGBColor(235, 235, 235))
        .draw()?;
    let bw = 0.8 / holds.len().max(1) as f64;
    for (hi_i, &hold) in holds.iter().enumerate() {
        // Shorter critical sections pale, the longest in full colour.
        let t = if holds.len() > 1 {
            hi_i as f64 / (holds.len() - 1) as f64
        } else {
            1.0
        };
        let mix = |v: u8| (255.0 - (255.0 - f64::from(v)) * (0.4 + 0.6 * t)) as u8;
        let color = RGBColor(mix(p.color.0), mix(p.color.1), mix(p.color.2));
        let bars: Vec<(f64, f64)> = methods
            .iter()
            .enumerate()
            .filter_map(|(g, m)| {
                find(&p.cells, m, hold).map(|c| (g as f64 - 0.4 + hi_i as f64 * bw, (p.value)(c)))
            })
            .collect();
        chart
            .draw_series(bars.iter().map(|&(x, v)| {
                Rectangle::new([(x, lo), (x + bw * 0.9, floor(v))], color.filled())
            }))?
            .label(format!("c = {hold} ms"))
            .legend(move |(x, y)| Rectangle::new([(x, y - 6), (x + 12, y + 6)], color.filled()));
        let font = (FONT, 13)
            .into_font()
            .color(&RGBColor(60, 60, 60))
            .pos(Pos::new(HPos::Center, VPos::Bottom));
        chart.draw_series(bars.iter().map(|&(x, v)| {
            Text::new(bar_label(v), (x + bw * 0.45, floor(v) * 1.04), font.clone())
        }))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(RGBColor(200, 200, 200))
        .label_font((FONT, 14).into_font())
        .draw()?;
    Ok(())
}

/// docs/contention-kinds.png: per method, throughput (top) and waits (bottom) of the
/// readers/writers cells (left) and the semaphore cells (right).
pub fn draw(path: &Path, run: &ContentionRun) -> Result<(), Error> {
    crate::chart::register_fonts()?;
    let rw = family(&run.kinds, "rw");
    let sem = family(&run.kinds, "sem");
    let mut columns: Vec<[KindPanel; 2]> = Vec::new();
    if let Some(first) = rw.first() {
        let who = format!("{} readers + {} writer", first.readers, first.writers);
        let blue = RGBColor(0, 114, 178);
        columns.push([
            KindPanel {
                title: format!("{who}: reads / s (log)"),
                cells: rw.clone(),
                value: |c| c.summary.readers.as_ref().map_or(0.0, |r| r.per_second),
                unit: "reads / s",
                color: blue,
            },
            KindPanel {
                title: format!("{who}: writer's longest wait (ms, log)"),
                cells: rw.clone(),
                value: |c| c.summary.writers.as_ref().map_or(0.0, |w| w.wait_max_ms),
                unit: "ms",
                color: RGBColor(213, 94, 0),
            },
        ]);
    }
    if let Some(first) = sem.first() {
        let who = format!(
            "{} clients, {} permits",
            first.clients,
            first.limit.unwrap_or(0)
        );
        let green = RGBColor(0, 158, 115);
        columns.push([
            KindPanel {
                title: format!("{who}: acquisitions / s (log)"),
                cells: sem.clone(),
                value: |c| c.summary.all.per_second,
                unit: "acquisitions / s",
                color: green,
            },
            KindPanel {
                title: format!("{who}: wait p99 (ms, log)"),
                cells: sem.clone(),
                value: |c| c.summary.all.wait_p99_ms,
                unit: "ms",
                color: RGBColor(204, 121, 167),
            },
        ]);
    }
    if columns.is_empty() {
        return Ok(());
    }
    let cols = columns.len();
    let body = crate::chart::titled(
        path,
        (760 * cols as u32, 900),
        (
            "Readers/writers and semaphore: the module's queue against client-side recipes",
            26,
        ),
        format!(
            "{}, {} s per cell, loopback; {}",
            run.info.server, run.info.secs_per_cell, run.info.date_utc
        ),
    )?;
    let areas = body.split_evenly((2, cols));
    for (col, panels) in columns.iter().enumerate() {
        for (row, panel) in panels.iter().enumerate() {
            draw_panel(&areas[row * cols + col], panel)?;
        }
    }
    body.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contention::{section as whole_section, RunInfo};

    fn group(clients: usize, acquisitions: u64, wait_max_ms: f64) -> RoleStats {
        RoleStats {
            clients,
            acquisitions,
            per_second: acquisitions as f64 / 3.0,
            wait_p50_ms: wait_max_ms / 4.0,
            wait_p99_ms: wait_max_ms / 2.0,
            wait_max_ms,
            jain: 1.0,
            gave_up: 0,
        }
    }

    fn rw_cell(method: &str, reads: u64, writes: u64, writer_wait_ms: f64) -> KindCell {
        KindCell {
            family: "rw".into(),
            method: method.into(),
            label: format!("label of {method}"),
            readers: 8,
            writers: 1,
            clients: 9,
            limit: None,
            hold_ms: 1,
            summary: KindSummary {
                elapsed_s: 3.0,
                all: group(9, reads + writes, writer_wait_ms),
                readers: Some(group(8, reads, 2.0)),
                writers: Some(group(1, writes, writer_wait_ms)),
                commands_per_acquisition: 2.0,
                round_trips_per_acquisition: 2.0,
                peak_holders: 8,
                mean_holders: 3.5,
                violations: 0,
                overtakes: 0,
                overtakes_most: 0,
            },
            server_commands: 0,
            client_commands: 0,
            other_cores: Some(0.1),
        }
    }

    fn sem_cell(method: &str, wait_max_ms: f64, violations: u64) -> KindCell {
        KindCell {
            family: "sem".into(),
            method: method.into(),
            label: format!("label of {method}"),
            readers: 0,
            writers: 0,
            clients: 16,
            limit: Some(4),
            hold_ms: 1,
            summary: KindSummary {
                elapsed_s: 3.0,
                all: group(16, 9000, wait_max_ms),
                readers: None,
                writers: None,
                commands_per_acquisition: 2.0,
                round_trips_per_acquisition: 2.0,
                peak_holders: 4 + violations.min(1),
                mean_holders: 3.5,
                violations,
                overtakes: 0,
                overtakes_most: 0,
            },
            server_commands: 0,
            client_commands: 0,
            other_cores: None,
        }
    }

    fn cells() -> Vec<KindCell> {
        vec![
            rw_cell("shared", 9000, 1000, 1.7),
            rw_cell("module", 2000, 250, 14.0),
            rw_cell("rw-script", 16000, 1, 3000.0),
            sem_cell("limit", 6.0, 0),
            sem_cell("zset", 300.0, 12),
        ]
    }

    fn render(kinds: &[KindCell]) -> String {
        let mut out = String::new();
        section(&mut out, kinds);
        out
    }

    #[test]
    fn tables_and_goals_follow_the_cells() {
        let mut kinds = cells();
        let text = render(&kinds);
        assert!(text.contains("### Readers and writers: 8 readers + 1 writer, one lock"));
        assert!(text.contains("### Semaphore: 16 clients, 4 permits"));
        assert!(text.contains(
            "than there are readers, 8): **met**. The most readers past one waiting writer: 0 at c = 1 ms; 0 of 9000 reader grants"
        ));
        assert!(text.contains("which waited up to 3.00 s (1 write in the 3.00 s the cell ran)"));
        assert!(text.contains("mutex for everybody: 4.5× at c = 1 ms."));
        assert!(text.contains("FIFO's bound ⌈N / n⌉ × (c + 1 ms): **met** (6.0 ms at c = 1 ms)"));
        assert!(text.contains("which gave out 12 permits beyond n (up to 5 holders at once)"));
        assert!(text.contains("| label of zset | 1 ms | 3000 | 3.50 of 4 | 5 | **12** |"));
        assert!(text.contains("rule (a writer beside another holder, a reader beside a writer, more than n permits): **met** (0 violations"));

        // One reader past a waiting writer, a semaphore wait over the bound, a
        // violation in a module cell: each turns its goal.
        kinds[0].summary.overtakes = 12;
        kinds[0].summary.overtakes_most = 8;
        assert!(render(&kinds).contains("readers, 8): **met**. The most readers past one waiting writer: 8 at c = 1 ms; 12 of 9000"));
        kinds[0].summary.overtakes_most = 9;
        kinds[3].summary.all.wait_max_ms = 8.5;
        kinds[3].summary.violations = 2;
        let text = render(&kinds);
        assert!(
            text.contains("readers, 8): **not met**. The most readers past one waiting writer: 9")
        );
        assert!(text.contains("**not met**; over it: c = 1 ms: longest 8.50 ms against 8.00 ms"));
        assert!(text.contains("more than n permits): **not met** (2 violations over 19000"));
        kinds[0].summary.violations = 3;
        assert!(render(&kinds).contains("| label of shared **3 VIOLATIONS** | 1 ms |"));
    }

    #[test]
    fn runs_saved_before_these_cells_still_load_and_render() {
        let json = r#"{"info": {"date_utc": "d", "command": "c", "server": "s", "machine": "m",
            "secs_per_cell": 3.0, "wall_secs": 1.0, "signal_expire_ms": 1000}, "cells": []}"#;
        let run: ContentionRun = serde_json::from_str(json).expect("old run");
        assert!(run.kinds.is_empty());
        let text = whole_section(&run.info, &run.cells, &run.kinds);
        assert!(!text.contains("Readers and writers"));
        assert!(text.contains("Reproduce: `make bench-contention`"));
        assert!(render(&[]).is_empty());
    }

    #[test]
    fn the_chart_is_drawn() {
        let run = ContentionRun {
            info: RunInfo {
                date_utc: "2026-01-01 00:00 UTC".into(),
                command: "test".into(),
                server: "Redis".into(),
                machine: "m".into(),
                secs_per_cell: 3.0,
                wall_secs: 1.0,
                signal_expire_ms: 1000,
            },
            cells: Vec::new(),
            kinds: cells(),
        };
        let path = std::env::temp_dir().join(format!(
            "redis-lock-contention-kinds-{}.png",
            std::process::id()
        ));
        draw(&path, &run).expect("draw");
        let bytes = std::fs::read(&path).expect("png written");
        let _ = std::fs::remove_file(&path);
        assert!(bytes.starts_with(b"\x89PNG"), "a PNG file");
        assert!(bytes.len() > 10_000, "with something drawn on it");
    }
}
