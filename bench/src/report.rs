//! The perf section of docs/BENCHMARKS.md, written between `<!-- perf:begin -->` and
//! `<!-- perf:end -->` (the rest of the file belongs to others and is kept as is).

use std::fmt::Write as _;
use std::fs;
use std::io;
use std::path::Path;

use crate::callgrind::{self, Callgrind};
use crate::config::Config;
use crate::ops::{Op, EXTEND_LUA, RELEASE_LUA};
use crate::stats::{median, min_max};
use crate::throughput::{PairResult, PAIRS, PIPELINES};
use crate::{Run, ServerResults};

const TITLE: &str = "# Benchmarks";

/// Replaces the text between the `name` markers in `doc`, creating the file (with the
/// perf and contention marker pairs) or the markers when missing.
pub fn write_section(doc: &Path, name: &str, content: &str) -> io::Result<()> {
    let mut text = fs::read_to_string(doc).unwrap_or_else(|_| {
        format!(
            "{TITLE}\n\n<!-- perf:begin -->\n<!-- perf:end -->\n\n<!-- contention:begin -->\n<!-- contention:end -->\n"
        )
    });
    let begin = format!("<!-- {name}:begin -->");
    let end = format!("<!-- {name}:end -->");
    if !text.contains(&begin) || !text.contains(&end) {
        // Sub-sections of ours left outside (the section is about to be written whole).
        text = remove_blocks(&text, &format!("<!-- {name}:"));
        let parent = name.split_once(':').map(|(p, _)| p);
        let parent_end = parent.map(|p| format!("<!-- {p}:end -->"));
        match parent_end.as_ref().and_then(|pe| text.find(pe.as_str())) {
            // A sub-section goes at the end of its parent section...
            Some(at) => text.insert_str(at, &format!("{begin}\n{end}\n")),
            // ... or, with no parent yet, inside a new parent at the end of the file.
            None => {
                if !text.ends_with('\n') {
                    text.push('\n');
                }
                text.push('\n');
                match parent {
                    Some(p) => text.push_str(&format!(
                        "<!-- {p}:begin -->\n{begin}\n{end}\n<!-- {p}:end -->\n"
                    )),
                    None => text.push_str(&format!("{begin}\n{end}\n")),
                }
            }
        }
    }
    let (Some(b), Some(e)) = (text.find(&begin), text.find(&end)) else {
        return Err(io::Error::other("markers vanished"));
    };
    if e < b {
        return Err(io::Error::other(format!(
            "{}: '{end}' comes before '{begin}'",
            doc.display()
        )));
    }
    let mut out = String::with_capacity(text.len() + content.len());
    out.push_str(&text[..b + begin.len()]);
    out.push('\n');
    out.push_str(content.trim_end());
    out.push('\n');
    out.push_str(&text[e..]);
    if let Some(dir) = doc.parent() {
        fs::create_dir_all(dir)?;
    }
    fs::write(doc, out)
}

/// Removes every `<!-- {prefix}X:begin --> ... <!-- {prefix}X:end -->` block.
fn remove_blocks(text: &str, prefix: &str) -> String {
    let mut out = text.to_string();
    while let Some(b) = out
        .find(prefix)
        .filter(|&b| out[b..].contains(":begin -->"))
    {
        let Some(tag_end) = out[b..].find("-->").map(|i| b + i + 3) else {
            break;
        };
        let tag = &out[b..tag_end];
        if !tag.ends_with(":begin -->") {
            break;
        }
        let closing = tag.replace(":begin -->", ":end -->");
        let Some(e) = out[tag_end..]
            .find(&closing)
            .map(|i| tag_end + i + closing.len())
        else {
            break;
        };
        let e = if out[e..].starts_with('\n') { e + 1 } else { e };
        out.replace_range(b..e, "");
    }
    out
}

fn rate(v: f64) -> String {
    if !v.is_finite() {
        "–".into()
    } else if v >= 1e6 {
        format!("{:.2}M", v / 1e6)
    } else if v >= 1e3 {
        format!("{:.1}k", v / 1e3)
    } else {
        format!("{v:.0}")
    }
}

fn x(r: f64) -> String {
    if r.is_finite() {
        format!("{r:.2}×")
    } else {
        "–".into()
    }
}

fn ir(v: f64) -> String {
    if !v.is_finite() {
        return "–".into();
    }
    let n = v.round() as i64;
    let s = n.abs().to_string();
    let mut out = String::new();
    for (i, ch) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(ch);
    }
    if n < 0 {
        format!("-{out}")
    } else {
        out
    }
}

fn verdict(ok: bool) -> &'static str {
    if ok {
        "met"
    } else {
        "**missed**"
    }
}

fn pair<'a>(s: &'a ServerResults, name: &str, p: usize) -> Option<&'a PairResult> {
    s.throughput.as_ref().and_then(|t| t.get(name, p))
}

/// Flatness of one server's scaling curve: the worst level-vs-first ratio of the
/// command rates (relative to PING) and the hand-off medians.
pub struct Flat {
    pub worst_rate: f64,
    pub handoff_max: f64,
    pub expiry_max: f64,
    pub ok: bool,
}

/// Rates within 0.80–1.25 of the smallest level (noise on this machine is about ±10%),
/// hand-off medians under 1 ms and expiry medians under 3 ms (timers have 1 ms
/// resolution) at every level.
pub fn flatness(s: &ServerResults) -> Option<Flat> {
    let sc = s.scaling.as_ref()?;
    let first = sc.levels.first()?;
    let mut worst: f64 = 1.0;
    let (mut h, mut e): (f64, f64) = (0.0, 0.0);
    for l in &sc.levels {
        for r in [
            l.cycle_vs_recipe / first.cycle_vs_recipe,
            l.extend_vs_pexpire / first.extend_vs_pexpire,
        ] {
            if (r - 1.0).abs() > (worst - 1.0).abs() {
                worst = r;
            }
        }
        h = h.max(l.handoff_p50);
        e = e.max(l.expiry_p50);
    }
    Some(Flat {
        worst_rate: worst,
        handoff_max: h,
        expiry_max: e,
        ok: (0.8..=1.25).contains(&worst) && h < 1.0 && e < 3.0,
    })
}

/// The README-sized summary of the headline ratios.
pub fn headline(run: &Run) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "Headline ratios (median of {} alternating rounds, 50 clients, pipeline 1 / 16; {}):",
        run.cfg.rounds, run.date
    );
    for s in &run.servers {
        let r = |n: &str| {
            let a = pair(s, n, 1).map_or(f64::NAN, PairResult::ratio);
            let b = pair(s, n, 16).map_or(f64::NAN, PairResult::ratio);
            format!("{} / {}", x(a), x(b))
        };
        let mem = s
            .memory
            .as_ref()
            .map_or("–".into(), |m| x(m.module_per_lock / m.string_per_lock));
        let flat = flatness(s).map_or("–".into(), |f| {
            if f.ok {
                "flat".to_string()
            } else {
                format!("NOT flat (worst {})", x(f.worst_rate))
            }
        });
        let _ = writeln!(
            o,
            "- {}: ACQUIRE {} of SET NX PX; RELEASE {} of EVALSHA; cycle {} of the recipe; memory {} of a string lock; scaling {flat}.",
            s.label,
            r(PAIRS[0].name),
            r(PAIRS[1].name),
            r(PAIRS[3].name),
            mem
        );
    }
    o
}

fn goals_table(o: &mut String, run: &Run) {
    let _ = write!(o, "| goal |");
    for s in &run.servers {
        let _ = write!(o, " {} |", s.label);
    }
    let _ = write!(o, "\n|---|");
    for _ in &run.servers {
        let _ = write!(o, "---|");
    }
    o.push('\n');
    for pr in PAIRS.iter().filter(|p| p.goal.is_some()) {
        let goal = pr.goal.unwrap_or(0.0);
        let _ = write!(o, "| {} ≥ {goal}× (pipeline 1 / 16) |", pr.name);
        for s in &run.servers {
            let a = pair(s, pr.name, 1).map_or(f64::NAN, PairResult::ratio);
            let b = pair(s, pr.name, 16).map_or(f64::NAN, PairResult::ratio);
            let _ = write!(
                o,
                " {} / {} {} |",
                x(a),
                x(b),
                verdict(a >= goal && b >= goal)
            );
        }
        o.push('\n');
    }
    let _ = write!(o, "| memory per lock ≤ 1.5× a string lock |");
    for s in &run.servers {
        match &s.memory {
            Some(m) => {
                let r = m.module_per_lock / m.string_per_lock;
                let _ = write!(
                    o,
                    " {} ({:.0} vs {:.0} B) {} |",
                    x(r),
                    m.module_per_lock,
                    m.string_per_lock,
                    verdict(r <= 1.5)
                );
            }
            None => o.push_str(" – |"),
        }
    }
    o.push('\n');
    let _ = write!(o, "| flat scaling, 10^3 → 10^6 locks (+10^4 waiters) |");
    for s in &run.servers {
        match flatness(s) {
            Some(f) => {
                let _ = write!(
                    o,
                    " worst rate {}, hand-off ≤ {:.2} ms, expiry ≤ {:.2} ms {} |",
                    x(f.worst_rate),
                    f.handoff_max,
                    f.expiry_max,
                    verdict(f.ok)
                );
            }
            None => o.push_str(" – |"),
        }
    }
    o.push('\n');
}

fn throughput_section(o: &mut String, run: &Run) {
    let cfg = &run.cfg;
    let _ = writeln!(
        o,
        "### 1. Throughput\n\n{} clients; each run sends {} commands unpipelined or {} with pipeline 16 \
         (one thread, `poll(2)`, each connection sends its batch and waits for all replies, like \
         `redis-benchmark -P`). Every reply is checked: a run where an ACQUIRE/SET did not grant, or \
         a RELEASE/EXTEND/EVALSHA did not answer `1`, aborts the benchmark, so the keys are always in \
         the intended state. Before each run the server is flushed; RELEASE and EVALSHA release run on \
         keys pre-acquired with the token they release with (one fresh key per operation); EXTEND and \
         EVALSHA extend on 2,000 pre-acquired keys per connection. Figures are operations per second \
         (cycles per second for the cycle), medians over {} rounds; the ratio is the median of the \
         per-round ratios, with its range.\n",
        cfg.clients, cfg.ops_p1, cfg.ops_p16, cfg.rounds
    );
    for s in &run.servers {
        let Some(t) = &s.throughput else { continue };
        let _ = writeln!(o, "**{}**\n", s.label);
        let _ = writeln!(
            o,
            "| comparison | pipeline | module | recipe | ratio (range) | goal | ceiling: PING / recipe | module / PING |\n|---|---|---|---|---|---|---|---|"
        );
        for &p in &PIPELINES {
            let ping = t.ping_median(p);
            for r in t.pairs.iter().filter(|r| r.pipeline == p) {
                let (lo, hi) = min_max(&r.ratios);
                let goal = r.pair.goal.map_or("–".into(), |g| {
                    format!("≥ {g}× {}", verdict(r.ratio() >= g))
                });
                // A cycle is two commands: compare commands per second with PING.
                let per_cmd = median(&r.a) * r.pair.a.commands_per_op() as f64;
                let recipe_cmd = median(&r.b) * r.pair.b.commands_per_op() as f64;
                let _ = writeln!(
                    o,
                    "| {} | {p} | {} | {} | {} ({:.2}–{:.2}) | {goal} | {} | {:.0}% |",
                    r.pair.name,
                    rate(median(&r.a)),
                    rate(median(&r.b)),
                    x(r.ratio()),
                    lo,
                    hi,
                    x(ping / recipe_cmd),
                    per_cmd / ping * 100.0
                );
            }
            let _ = writeln!(
                o,
                "| PING (ceiling) | {p} | {} | | | | | 100% |",
                rate(ping)
            );
        }
        o.push('\n');
    }
    let _ = writeln!(
        o,
        "Commands sent (`k` is `bench:lock:<client>:<n>`, the token is 36 bytes):\n\n```\n{}\n{}\n{}\n{}\n{}\n{}\n{}\n{}\nPING\n\nrelease.lua: {RELEASE_LUA}\nextend.lua:  {EXTEND_LUA}\n```\n",
        Op::Acquire.shown(),
        Op::SetNx.shown(),
        Op::Release.shown(),
        Op::EvalRelease.shown(),
        Op::Extend.shown(),
        Op::EvalExtend.shown(),
        Op::CycleModule.shown(),
        Op::CycleRecipe.shown()
    );
}

fn latency_section(o: &mut String, run: &Run) {
    let _ = writeln!(
        o,
        "### 2. Latency\n\nOne client, one command at a time, timed with a monotonic clock around \
         send-and-read: ACQUIRE then RELEASE of a fresh key, against SET NX PX then EVALSHA release; \
         {} pairs per side per round, {} rounds alternated (ABBA). Microseconds; the ratio is the \
         median over rounds of module p50 / recipe p50 (below 1 is faster).\n",
        run.cfg.lat_ops, run.cfg.rounds
    );
    let _ = writeln!(
        o,
        "| server | command | p50 | p99 | p99.9 | | recipe | p50 | p99 | p99.9 | p50 ratio |\n|---|---|---|---|---|---|---|---|---|---|---|"
    );
    for s in &run.servers {
        let Some(l) = &s.latency else { continue };
        for (name, a, rname, b, ratio) in [
            (
                "LOCK.ACQUIRE",
                l.acquire,
                "SET NX PX",
                l.set_nx,
                l.acquire_p50_ratio,
            ),
            (
                "LOCK.RELEASE",
                l.release,
                "EVALSHA release",
                l.eval_release,
                l.release_p50_ratio,
            ),
        ] {
            let _ = writeln!(
                o,
                "| {} | {name} | {:.1} | {:.1} | {:.1} | | {rname} | {:.1} | {:.1} | {:.1} | {} |",
                s.label,
                a.p50,
                a.p99,
                a.p999,
                b.p50,
                b.p99,
                b.p999,
                x(ratio)
            );
        }
    }
    o.push('\n');
}

fn memory_section(o: &mut String, run: &Run) {
    let _ = writeln!(
        o,
        "### 3. Memory\n\n`used_memory` growth over {} locks acquired pipelined (4 connections, \
         pipeline 256, lease 600 s, keys `mem:<c>:<nnnnnnnnn>`, 36-byte token), divided by the count; \
         twice each, alternated (ABBA), median. It includes the key, the dict entries and the share \
         of the hash tables, the same for both kinds. `MEMORY USAGE` of one key is shown for \
         reference. Waiters: {} clients blocked with `LOCK.ACQUIRE wl:<i mod {}> ... BLOCK 0`; \
         \"per waiter\" is the growth from the same clients connected and idle to blocked (what the \
         module and the server's blocked-client bookkeeping add), \"with connection\" also counts the \
         client connection itself. Each state is read after 4 s, so the server's client cron has \
         shrunk idle buffers.\n",
        run.cfg.mem_locks, run.cfg.waiters, run.cfg.wait_locks
    );
    let _ = writeln!(
        o,
        "| server | module lock, B | string lock, B | ratio | MEMORY USAGE module / string | per waiter, B | per waiter with connection, B |\n|---|---|---|---|---|---|---|"
    );
    for s in &run.servers {
        let Some(m) = &s.memory else { continue };
        let (w, wc) = m.waiters.map_or(("–".into(), "–".into()), |w| {
            (
                format!("{:.0}", w.per_waiter),
                format!("{:.0}", w.per_waiter_with_conn),
            )
        });
        let _ = writeln!(
            o,
            "| {} | {:.0} | {:.0} | {} {} | {} / {} | {w} | {wc} |",
            s.label,
            m.module_per_lock,
            m.string_per_lock,
            x(m.module_per_lock / m.string_per_lock),
            verdict(m.module_per_lock / m.string_per_lock <= 1.5),
            m.usage_module,
            m.usage_string
        );
    }
    o.push('\n');
}

fn scaling_section(o: &mut String, run: &Run) {
    let _ = writeln!(
        o,
        "### 4. Scaling\n\nModule locks (lease 1 h) are added up to each level. At each level, \
         {} repetitions (A/B alternated) of: the ACQUIRE+RELEASE cycle on fresh keys against the \
         SET NX PX + EVALSHA cycle, and LOCK.EXTEND on locks picked all over the held set against \
         `PEXPIRE` on the same keys (50 clients, pipeline 16, {} commands per run). Absolute rates \
         fall as the tables outgrow the CPU caches, for the server's own commands as much as for \
         the module's; the module's cost is flat (O(1)) when its ratio to the native command \
         stays put. Then {} hand-offs (a waiter blocked on a lock; time from sending RELEASE to \
         the waiter's reply) and {} expiries (a lock with a {} ms lease and a blocked waiter; time \
         from the lease deadline to the waiter's reply). The last row adds {} waiters blocked on \
         {} other locks. Flat = both ratios stay within 0.80–1.25 of the first level's, the \
         hand-off median stays under 1 ms and the expiry median under 3 ms (timers have 1 ms \
         resolution) at every level. The instruction counts per level (table 5) \
         show the same without the noise.\n",
        run.cfg.rounds.max(1),
        run.cfg.ops_p16 / 2,
        run.cfg.handoffs,
        run.cfg.expiries,
        crate::scaling::EXPIRY_TTL_MS,
        run.cfg.waiters,
        run.cfg.wait_locks
    );
    let _ = writeln!(
        o,
        "| server | held | waiters | cycles/s | cycle / recipe cycle | EXTEND/s | EXTEND / PEXPIRE | hand-off p50 / p99 ms | expiry → grant p50 / p99 ms |\n|---|---|---|---|---|---|---|---|---|"
    );
    for s in &run.servers {
        let Some(sc) = &s.scaling else { continue };
        for l in &sc.levels {
            let _ = writeln!(
                o,
                "| {} | {} | {} | {} | {} | {} | {} | {:.3} / {:.3} | {:.2} / {:.2} |",
                s.label,
                l.held,
                l.waiters,
                rate(l.cycle_rate),
                x(l.cycle_vs_recipe),
                rate(l.extend_rate),
                x(l.extend_vs_pexpire),
                l.handoff_p50,
                l.handoff_p99,
                l.expiry_p50,
                l.expiry_p99
            );
        }
    }
    o.push_str(
        "\nWithout a waiter, an expired lock is reclaimed by the server's own expiry (lazily on \
         access, or by the active expire cycle), exactly as a `SET NX PX` key is; the module arms a \
         timer at the lease deadline only for locks that have waiters.\n\n",
    );
}

fn phase_value(cg: &Callgrind, name: &str) -> f64 {
    cg.phases
        .iter()
        .find(|p| p.name == name)
        .map_or(f64::NAN, |p| p.per_cmd)
}

/// The callgrind table (also written alone by `make bench-callgrind`).
pub fn callgrind_block(cg: &Callgrind, cfg: &Config, date: &str) -> String {
    let mut o = String::new();
    let baseline = callgrind::read_baseline(&cfg.baseline);
    let ping = cg.get(Op::Ping);
    let _ = writeln!(
        o,
        "Measured {date} on {} under `valgrind --tool=callgrind` (`make bench-callgrind`): {} \
         commands per phase on one connection with pipeline 16, counters zeroed before and dumped \
         after each phase (`callgrind_control -z` / `-d`); instructions per command = the dump's \
         total / {}. The PING row is the floor every command pays (reading, parsing, dispatch, \
         reply); \"over PING\" is the command's own work.\n",
        cg.server, cg.ops, cg.ops
    );
    let before_note = match &baseline {
        Some((note, _)) => format!("before: {note}"),
        None => "no baseline recorded yet (`make bench-callgrind-baseline`)".into(),
    };
    let _ = writeln!(
        o,
        "| command | Ir / command | over PING | module's own code | before | change |\n|---|---|---|---|---|---|"
    );
    for p in &cg.phases {
        let before = baseline
            .as_ref()
            .and_then(|(_, rows)| rows.iter().find(|(n, _)| n == p.name).map(|(_, v)| *v));
        let (b, change) = match before {
            Some(b) => (ir(b), format!("{:+.1}%", (p.per_cmd / b - 1.0) * 100.0)),
            None => ("–".into(), "–".into()),
        };
        let own = if p.module_self > 0.0 {
            ir(p.module_self)
        } else {
            "–".into()
        };
        let _ = writeln!(
            o,
            "| {} | {} | {} | {own} | {b} | {change} |",
            p.name,
            ir(p.per_cmd),
            ir(p.per_cmd - ping)
        );
    }
    let _ = writeln!(o, "\n({before_note}.)\n");
    let pairs = [
        ("LOCK.ACQUIRE (TOKEN)", "SET NX PX"),
        ("LOCK.RELEASE", "EVALSHA release"),
        ("LOCK.EXTEND", "EVALSHA extend"),
    ];
    let _ = writeln!(
        o,
        "| module vs recipe, instructions | module | recipe | module / recipe |\n|---|---|---|---|"
    );
    for (a, b) in pairs {
        let (va, vb) = (phase_value(cg, a), phase_value(cg, b));
        let _ = writeln!(
            o,
            "| {a} vs {b} | {} | {} | {} |",
            ir(va),
            ir(vb),
            x(va / vb)
        );
    }
    let (ca, cb) = (
        phase_value(cg, "LOCK.ACQUIRE (TOKEN)") + phase_value(cg, "LOCK.RELEASE"),
        phase_value(cg, "SET NX PX") + phase_value(cg, "EVALSHA release"),
    );
    let _ = writeln!(
        o,
        "| cycle: ACQUIRE+RELEASE vs SET NX PX+EVALSHA | {} | {} | {} |\n",
        ir(ca),
        ir(cb),
        x(ca / cb)
    );
    if !cg.levels.is_empty() {
        let _ = writeln!(
            o,
            "Instructions at each number of held locks (same server, fresh counters per \
             measurement; EXTEND picks locks all over the held set; the last row adds clients \
             blocked on other locks). \"Executing\" counts only the server's `call()`, i.e. \
             without the event loop and the cron, which runs on a timer and so weighs about 50 \
             times more per command under valgrind than natively (with 10^4 idle clients, \
             `clientsCron` alone adds thousands of instructions per command here). O(1) means \
             the rows agree up to hash-table growth:\n\n\
             | held locks | waiters | ACQUIRE+RELEASE, Ir per cycle | executing | EXTEND, Ir | executing |\n|---|---|---|---|---|---|"
        );
        for l in &cg.levels {
            let _ = writeln!(
                o,
                "| {} | {} | {} | {} | {} | {} |",
                l.held,
                l.waiters,
                ir(l.cycle),
                ir(l.cycle_exec),
                ir(l.extend),
                ir(l.extend_exec)
            );
        }
        o.push('\n');
    }
    let _ = writeln!(
        o,
        "Where a module command's instructions go (inclusive cost per command of the module's \
         functions and of the server API calls they make; nested calls are counted in their \
         callers too):\n"
    );
    for p in cg.phases.iter().filter(|p| p.name.starts_with("LOCK.")) {
        let _ = writeln!(
            o,
            "<details><summary>{} — {} Ir/command</summary>\n",
            p.name,
            ir(p.per_cmd)
        );
        let _ = writeln!(o, "| function | Ir / command | share |\n|---|---|---|");
        for f in p.inclusive.iter().filter(|f| f.per_cmd >= 20.0).take(24) {
            let _ = writeln!(
                o,
                "| `{}` | {} | {:.1}% |",
                f.function,
                ir(f.per_cmd),
                f.per_cmd / p.per_cmd * 100.0
            );
        }
        let _ = writeln!(o, "\n</details>\n");
    }
    o
}

fn crosscheck_section(o: &mut String, run: &Run) {
    let any = run.servers.iter().any(|s| s.crosscheck.is_some());
    if !any {
        return;
    }
    let _ = writeln!(
        o,
        "### 6. Cross-check with the stock `redis-benchmark`\n\n`redis-benchmark` cannot check \
         replies, so ACQUIRE and SET draw keys from 10^9 random names on a flushed server (a repeat \
         is about one in 10^4; the run fails if INFO counts more than 1% renewals), and EXTEND runs \
         on 100,000 keys `ek:000000000000…` all held beforehand with the right token. RELEASE and \
         the cycle need one fresh held key per command, which `redis-benchmark` cannot arrange; see \
         the table above. Median of {} rounds, alternated.\n",
        run.cfg.rb_rounds
    );
    let _ = writeln!(
        o,
        "| server | comparison | pipeline | module | recipe | ratio | PING |\n|---|---|---|---|---|---|---|"
    );
    let mut commands = String::new();
    for s in &run.servers {
        let Some(cc) = &s.crosscheck else { continue };
        for p in &cc.pairs {
            let ping = cc
                .ping
                .iter()
                .find(|(pl, _)| *pl == p.pipeline)
                .map_or(f64::NAN, |(_, v)| median(v));
            let _ = writeln!(
                o,
                "| {} | {} | {} | {} | {} | {} | {} |",
                s.label,
                p.name,
                p.pipeline,
                rate(median(&p.a)),
                rate(median(&p.b)),
                x(p.ratio()),
                rate(ping)
            );
        }
        if commands.is_empty() {
            for (pl, opts) in &cc.options {
                let _ = writeln!(commands, "# pipeline {pl}");
                let _ = writeln!(
                    commands,
                    "redis-benchmark -h 127.0.0.1 -p $PORT --csv {opts} PING"
                );
                for p in cc.pairs.iter().filter(|p| p.pipeline == *pl) {
                    let keys = if p.a_cmd.contains("ek:") {
                        "-r 100000"
                    } else {
                        "-r 1000000000"
                    };
                    let _ = writeln!(
                        commands,
                        "redis-benchmark -h 127.0.0.1 -p $PORT --csv {opts} {keys} {}",
                        p.a_cmd
                    );
                    let _ = writeln!(
                        commands,
                        "redis-benchmark -h 127.0.0.1 -p $PORT --csv {opts} {keys} {}",
                        p.b_cmd
                    );
                }
            }
        }
    }
    let _ = writeln!(o, "\nThe exact command lines:\n\n```\n{}```\n", commands);
}

/// Gaps against the goals, and what the profile says about them.
fn gaps_section(o: &mut String, run: &Run) {
    let mut lines = vec![];
    for s in &run.servers {
        for pr in PAIRS.iter().filter(|p| p.goal.is_some()) {
            let goal = pr.goal.unwrap_or(0.0);
            for &p in &PIPELINES {
                if let Some(r) = pair(s, pr.name, p) {
                    if r.ratio() < goal {
                        // No command can beat PING: PING / recipe bounds the ratio.
                        let ping = s.throughput.as_ref().map_or(f64::NAN, |t| t.ping_median(p));
                        let ceiling = ping / (median(&r.b) * r.pair.b.commands_per_op() as f64);
                        let bound = if ceiling < goal {
                            format!(
                                " Out of reach here: even PING runs only {} as fast as the recipe at this depth (round trips and syscalls dominate).",
                                x(ceiling)
                            )
                        } else {
                            String::new()
                        };
                        lines.push(format!(
                            "- {}: {} at pipeline {p} is {} (goal {goal}×): {:.0}% short.{bound}",
                            s.label,
                            pr.name,
                            x(r.ratio()),
                            (1.0 - r.ratio() / goal) * 100.0
                        ));
                    }
                }
            }
        }
        if let Some(m) = &s.memory {
            let r = m.module_per_lock / m.string_per_lock;
            if r > 1.5 {
                lines.push(format!(
                    "- {}: a module lock takes {:.0} B against {:.0} B for a string lock ({}, goal ≤ 1.5×): {:.0} B per lock too many.",
                    s.label,
                    m.module_per_lock,
                    m.string_per_lock,
                    x(r),
                    m.module_per_lock - 1.5 * m.string_per_lock
                ));
            }
        }
        if let Some(f) = flatness(s) {
            if !f.ok {
                lines.push(format!(
                    "- {}: scaling is not flat by the criterion above (worst relative rate {}, hand-off ≤ {:.2} ms, expiry ≤ {:.2} ms).",
                    s.label,
                    x(f.worst_rate),
                    f.handoff_max,
                    f.expiry_max
                ));
            }
        }
    }
    let _ = writeln!(o, "### Where a goal is missed\n");
    if lines.is_empty() {
        let _ = writeln!(o, "Every goal is met in this run.\n");
        return;
    }
    for l in &lines {
        let _ = writeln!(o, "{l}");
    }
    o.push('\n');
    if let Some(cg) = &run.callgrind {
        why_from_profile(o, cg);
    }
    if let Some(m) = run.servers.iter().find_map(|s| s.memory.as_ref()) {
        let _ = writeln!(
            o,
            "**Memory.** A string lock is one string object holding the token. A module lock is \
             the server's object, a module-value wrapper, the lock state (`MEMORY USAGE` says \
             {} B against {} B for the string on the first server) and, in separate heap blocks, \
             the token and the client address; each block is rounded up to the allocator's size \
             class. What would close it: one allocation per lock holding the fixed fields, the \
             token, the owner and a packed client address (family, port, 4 or 16 address bytes) \
             instead of the text form — about 70–90 B for a 36-byte token instead of \
             ~180 B in three blocks.\n",
            m.usage_module, m.usage_string
        );
    }
}

/// The cost centres of the module commands, from the callgrind run, and what removing
/// each would save (its inclusive cost is the most it can save).
fn why_from_profile(o: &mut String, cg: &Callgrind) {
    let get = |phase: &str, f: &str| {
        cg.phases
            .iter()
            .find(|p| p.name == phase)
            .and_then(|p| p.inclusive.iter().find(|c| c.function == f))
            .map_or(0.0, |c| c.per_cmd)
    };
    let acq = "LOCK.ACQUIRE (TOKEN)";
    let (rel, ext) = ("LOCK.RELEASE", "LOCK.EXTEND");
    let gap = phase_value(cg, acq) - phase_value(cg, "SET NX PX");
    let _ = writeln!(
        o,
        "**Why, and what would close it** (instructions per command from table 5, {}): an \
         ACQUIRE costs {} instructions more than a SET NX PX. The cost centres, each with the \
         most its removal can save:\n",
        cg.server,
        ir(gap)
    );
    let mut items = vec![];
    let (r_acq, r_ext, r_rel) = (
        get(acq, "RM_Replicate"),
        get(ext, "RM_Replicate"),
        get(rel, "RM_Replicate"),
    );
    if r_acq + r_ext + r_rel > 300.0 {
        items.push(format!(
            "- `RM_Replicate`: {} per ACQUIRE, {} per EXTEND, {} per RELEASE. The server builds \
             the whole argument vector (a command lookup plus one string object per argument, \
             numbers converted with `sdsfromlonglong`) even when no AOF and no replica will \
             receive it; SET builds nothing in that case. Close it by propagating only when \
             something can listen (AOF on, or the server has had a replica or a fork since \
             start), by passing the numbers as pre-formatted buffers, and, for EXTEND of a \
             module lock, by propagating `PEXPIREAT` alone once the key's expiry is the only \
             record of the deadline.",
            ir(r_acq),
            ir(r_ext),
            ir(r_rel)
        ));
    }
    let addr = get(acq, "redis_lock::ffi::client_addr");
    if addr > 300.0 {
        items.push(format!(
            "- The client address: {} per ACQUIRE (`RM_GetClientInfoById` {} of it: \
             `getpeername` + `inet_ntop` + `sprintf` on every grant, then the text is copied \
             twice). Close it by caching the address per client id (dropped on the client's \
             disconnect event).",
            ir(addr),
            ir(get(acq, "RM_GetClientInfoById"))
        ));
    }
    let handoff = get(rel, "redis_lock::waiters::handoff");
    if handoff > 200.0 {
        items.push(format!(
            "- `waiters::handoff` on every RELEASE: {} even when nobody waits (the key name is \
             copied, the key opened a second time, two hash lookups). Close it by returning at \
             once when no queue exists.",
            ir(handoff)
        ));
    }
    let notify = get(acq, "RM_NotifyKeyspaceEvent");
    let tax = get("SET NX PX", "moduleNotifyKeyspaceEvent");
    if notify > 300.0 || tax > 300.0 {
        items.push(format!(
            "- Keyspace events: {} per lock command for its own `lock.*` event, most of it the \
             server creating a context to call the module's own generic-event subscriber; the \
             same subscription costs every `SET .. PX` {} (it fires a generic `expire` event), \
             on any key, so the recipe in these tables is slowed by the module too. A narrower \
             subscription (expired/evicted only, with the type's unlink callback seeing every \
             removal of a module lock) would remove both, at the price of waiters on a classic \
             string lock learning of its DEL only at its lease deadline.",
            ir(notify),
            ir(tax)
        ));
    }
    for i in &items {
        let _ = writeln!(o, "{i}");
    }
    o.push('\n');
}

pub fn perf_section(run: &Run) -> String {
    let mut o = String::new();
    let cfg = &run.cfg;
    let _ = writeln!(
        o,
        "## Performance: redis-lock against the recipe it replaces\n\n\
         _Generated by `make bench` on {} in {:.1} minutes; the next run replaces everything \
         between the perf markers._\n\n\
         **Machine:** {}; load average {} at the start, {} at the end. Other jobs share these \
         cores, so absolute numbers are low and noisy. Every comparison therefore runs A and B \
         alternately in the same run, on the same server process ({} rounds, ABBA order), and \
         reports the median of the per-round ratios.\n\n\
         ![make bench chart](perf.png)\n",
        run.date, run.minutes, run.machine, run.load_start, run.load_end, cfg.rounds
    );
    let _ = writeln!(o, "### Goals\n");
    goals_table(&mut o, run);
    o.push('\n');
    gaps_section(&mut o, run);
    throughput_section(&mut o, run);
    latency_section(&mut o, run);
    memory_section(&mut o, run);
    scaling_section(&mut o, run);
    let _ = writeln!(o, "### 5. Instructions per command (callgrind)\n");
    let _ = writeln!(o, "<!-- perf:callgrind:begin -->");
    match &run.callgrind {
        Some(cg) => o.push_str(&callgrind_block(cg, cfg, &run.date)),
        None => o.push_str("Not run (`make bench-callgrind`).\n"),
    }
    let _ = writeln!(o, "<!-- perf:callgrind:end -->\n");
    crosscheck_section(&mut o, run);
    let _ = writeln!(
        o,
        "### How to re-run\n\n```\nmake bench                      # everything, all three servers (~20 min here)\n\
         make bench-callgrind            # only the instruction counts (table 5)\n\
         make bench-callgrind-baseline   # record the current counts as the \"before\" column\n\
         BENCH_ROUNDS=3 BENCH_OPS_P16=200000 make bench   # shorter\n```\n\n\
         Settings of this run: `{}`. Servers: {}. The module is the release build \
         (`target/release/libredis_lock.so`); each server runs with `--save \"\" --appendonly no`, \
         no replicas.\n",
        cfg.describe(),
        run.servers
            .iter()
            .map(|s| s.label.clone())
            .collect::<Vec<_>>()
            .join(", ")
    );
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sections_are_replaced_in_place() {
        let dir = std::env::temp_dir().join(format!("bench-report-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let doc = dir.join("B.md");
        let _ = fs::remove_file(&doc);
        write_section(&doc, "perf", "one").unwrap();
        let t = fs::read_to_string(&doc).unwrap();
        assert!(t.contains("<!-- perf:begin -->\none\n<!-- perf:end -->"));
        assert!(t.contains("<!-- contention:begin -->\n<!-- contention:end -->"));
        // Someone else's section survives ours being rewritten.
        let t = t.replace(
            "<!-- contention:begin -->\n",
            "<!-- contention:begin -->\ntheirs\n",
        );
        fs::write(&doc, t).unwrap();
        write_section(
            &doc,
            "perf",
            "two\n<!-- perf:callgrind:begin -->\nx\n<!-- perf:callgrind:end -->",
        )
        .unwrap();
        write_section(&doc, "perf:callgrind", "y").unwrap();
        let t = fs::read_to_string(&doc).unwrap();
        assert!(t.contains(
            "two\n<!-- perf:callgrind:begin -->\ny\n<!-- perf:callgrind:end -->\n<!-- perf:end -->"
        ));
        assert!(t.contains("<!-- contention:begin -->\ntheirs\n<!-- contention:end -->"));
        assert!(!t.contains("one"));
        // A sub-section written before its parent lands inside a new parent block, and
        // writing the parent later leaves no stray copy behind.
        let doc2 = dir.join("C.md");
        fs::write(
            &doc2,
            "# B\n\n<!-- contention:begin -->\nc\n<!-- contention:end -->\n",
        )
        .unwrap();
        write_section(&doc2, "perf:callgrind", "cg").unwrap();
        let t = fs::read_to_string(&doc2).unwrap();
        assert!(t.contains("<!-- perf:begin -->\n<!-- perf:callgrind:begin -->\ncg\n<!-- perf:callgrind:end -->\n<!-- perf:end -->"));
        write_section(
            &doc2,
            "perf",
            "P\n<!-- perf:callgrind:begin -->\ncg2\n<!-- perf:callgrind:end -->",
        )
        .unwrap();
        let t = fs::read_to_string(&doc2).unwrap();
        assert_eq!(t.matches("perf:callgrind:begin").count(), 1);
        assert!(t.contains("cg2") && !t.contains("cg\n") && t.contains("\nc\n"));
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn numbers_format() {
        assert_eq!(ir(1234567.4), "1,234,567");
        assert_eq!(ir(999.0), "999");
        assert_eq!(rate(153_400.0), "153.4k");
        assert_eq!(x(0.954), "0.95×");
    }
}
