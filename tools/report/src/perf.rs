//! The perf section of docs/BENCHMARKS.md (between `<!-- perf:begin -->` and
//! `<!-- perf:end -->`), rendered from docs/data/perf.json, which `make bench` writes.

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use crate::fmt::{ir, rate, verdict, x};

/// The comparisons with a goal, as the benchmark names them.
pub const ACQUIRE: &str = "ACQUIRE vs SET NX PX";
pub const RELEASE: &str = "RELEASE vs EVALSHA release";
pub const EXTEND: &str = "EXTEND vs EVALSHA extend";
pub const CYCLE: &str = "cycle: ACQUIRE+RELEASE vs SET NX PX+EVALSHA";
pub const PIPELINES: [usize; 2] = [1, 16];

/// The sizes a run used (the `BENCH_*` settings).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Settings {
    pub rounds: usize,
    pub clients: usize,
    pub ops_p1: u64,
    pub ops_p16: u64,
    pub lat_ops: u64,
    pub mem_locks: u64,
    pub waiters: u64,
    pub wait_locks: u64,
    pub levels: Vec<u64>,
    pub handoffs: usize,
    pub expiries: usize,
    pub cg_ops: u64,
    pub cg_levels: Vec<u64>,
    pub rb_rounds: usize,
    pub expiry_ttl_ms: u64,
}

impl Settings {
    /// The settings as `NAME=value` words.
    pub fn describe(&self) -> String {
        let list = |v: &[u64]| v.iter().map(u64::to_string).collect::<Vec<_>>().join(",");
        format!(
            "BENCH_ROUNDS={} BENCH_CLIENTS={} BENCH_OPS_P1={} BENCH_OPS_P16={} BENCH_LAT_OPS={} \
             BENCH_MEM_LOCKS={} BENCH_WAITERS={} BENCH_WAIT_LOCKS={} BENCH_LEVELS={} \
             BENCH_HANDOFFS={} BENCH_EXPIRIES={} BENCH_CG_OPS={} BENCH_CG_LEVELS={} BENCH_RB_ROUNDS={}",
            self.rounds,
            self.clients,
            self.ops_p1,
            self.ops_p16,
            self.lat_ops,
            self.mem_locks,
            self.waiters,
            self.wait_locks,
            list(&self.levels),
            self.handoffs,
            self.expiries,
            self.cg_ops,
            list(&self.cg_levels),
            self.rb_rounds
        )
    }
}

/// One comparison at one pipeline depth: module (A) against the recipe (B), operations
/// per second (medians over rounds) and the median of the per-round ratios.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PairResult {
    pub name: String,
    pub pipeline: usize,
    pub a: f64,
    pub b: f64,
    pub ratio: f64,
    pub ratio_min: f64,
    pub ratio_max: f64,
    pub goal: Option<f64>,
    /// Commands per counted operation (2 for a cycle).
    pub a_per_op: f64,
    pub b_per_op: f64,
    /// (A, B) of every round, as measured (empty in imported figures).
    #[serde(default)]
    pub rounds: Vec<(f64, f64)>,
}

impl PairResult {
    pub fn ratio(&self) -> f64 {
        self.ratio
    }
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Throughput {
    pub pairs: Vec<PairResult>,
    /// (pipeline, PING commands/s, median)
    pub ping: Vec<(usize, f64)>,
}

impl Throughput {
    pub fn ping_median(&self, pipeline: usize) -> f64 {
        self.ping
            .iter()
            .find(|(p, _)| *p == pipeline)
            .map_or(f64::NAN, |(_, v)| *v)
    }
    pub fn get(&self, name: &str, pipeline: usize) -> Option<&PairResult> {
        self.pairs
            .iter()
            .find(|r| r.name == name && r.pipeline == pipeline)
    }
}

/// Latency percentiles of one command, microseconds.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
pub struct Pcts {
    pub p50: f64,
    pub p99: f64,
    pub p999: f64,
    pub n: usize,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Latency {
    pub acquire: Pcts,
    pub set_nx: Pcts,
    pub release: Pcts,
    pub eval_release: Pcts,
    /// Median over rounds of (module p50 / recipe p50): below 1 means faster.
    pub acquire_p50_ratio: f64,
    pub release_p50_ratio: f64,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Memory {
    pub locks: u64,
    /// used_memory delta / locks, median over the rounds.
    pub module_per_lock: f64,
    pub string_per_lock: f64,
    /// `MEMORY USAGE` of one key of each kind, for reference.
    pub usage_module: i64,
    pub usage_string: i64,
    pub waiters: Option<WaiterMemory>,
}

#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
pub struct WaiterMemory {
    pub waiters: u64,
    pub locks: u64,
    /// Growth from idle connected clients to the same clients blocked, per waiter.
    pub per_waiter: f64,
    /// Growth from no clients to blocked clients, per waiter (connection included).
    pub per_waiter_with_conn: f64,
}

/// One level of the scaling curve.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Level {
    pub held: u64,
    pub waiters: u64,
    pub cycle_rate: f64,
    pub cycle_vs_recipe: f64,
    pub extend_rate: f64,
    pub extend_vs_pexpire: f64,
    /// RELEASE sent -> the waiter has its grant, ms.
    pub handoff_p50: f64,
    pub handoff_p99: f64,
    /// Lease deadline -> the waiter has its grant, ms.
    pub expiry_p50: f64,
    pub expiry_p99: f64,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Scaling {
    pub levels: Vec<Level>,
}

/// One `redis-benchmark` comparison (medians over rounds).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RbPair {
    pub name: String,
    pub pipeline: usize,
    pub a_cmd: String,
    pub b_cmd: String,
    pub a: f64,
    pub b: f64,
    pub ratio: f64,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct CrossCheck {
    pub pairs: Vec<RbPair>,
    /// (pipeline, PING requests/s, median)
    pub ping: Vec<(usize, f64)>,
    /// (pipeline, the option part of every command line)
    pub options: Vec<(usize, String)>,
}

/// Inclusive instructions per command of one function.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FnCost {
    pub function: String,
    pub per_cmd: f64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Phase {
    pub name: String,
    pub per_cmd: f64,
    /// Self cost of the module's own code per command.
    pub module_self: f64,
    /// Inclusive cost of the module's functions and the server API calls they make.
    pub inclusive: Vec<FnCost>,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct CgLevel {
    pub held: u64,
    pub waiters: u64,
    pub cycle: f64,
    pub extend: f64,
    pub cycle_exec: f64,
    pub extend_exec: f64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Callgrind {
    pub date: String,
    pub server: String,
    pub ops: u64,
    pub phases: Vec<Phase>,
    pub levels: Vec<CgLevel>,
    /// The "before" column: (note, rows) from bench/callgrind-baseline.tsv at the time.
    pub baseline: Option<(String, Vec<(String, f64)>)>,
}

/// Everything measured on one server.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ServerResults {
    pub throughput: Option<Throughput>,
    pub latency: Option<Latency>,
    /// "Redis 7.0.15"
    pub label: String,
    pub memory: Option<Memory>,
    pub scaling: Option<Scaling>,
    pub crosscheck: Option<CrossCheck>,
}

/// docs/data/perf.json: one `make bench` run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PerfRun {
    pub date: String,
    pub minutes: f64,
    pub machine: String,
    pub load_start: String,
    pub load_end: String,
    pub settings: Settings,
    /// The commands compared, as a user would type them (module, recipe, ...).
    pub commands: Vec<String>,
    pub release_lua: String,
    pub extend_lua: String,
    pub servers: Vec<ServerResults>,
    pub callgrind: Option<Callgrind>,
}

/// Memory per held exclusive lock against a `SET NX PX` string lock with the same token.
pub const MEMORY_GOAL: f64 = 1.4;
/// Instructions per command (callgrind): (module command, recipe command, most allowed).
pub const INSTRUCTION_GOALS: [(&str, &str, f64); 2] = [
    ("LOCK.ACQUIRE (TOKEN)", "SET NX PX", 1.2),
    ("LOCK.RELEASE", "EVALSHA release", 0.45),
];

/// The comparisons that have a goal, in the order measured, with the goal at each
/// pipeline depth of [`PIPELINES`] (None: no goal there).
fn goal_pairs(run: &PerfRun) -> Vec<(String, [Option<f64>; 2])> {
    let mut v: Vec<(String, [Option<f64>; 2])> = Vec::new();
    let pairs = run.servers.iter().filter_map(|s| s.throughput.as_ref());
    for p in pairs.flat_map(|t| &t.pairs) {
        let Some(g) = p.goal else { continue };
        let i = usize::from(p.pipeline > 1);
        match v.iter_mut().find(|(n, _)| *n == p.name) {
            Some((_, goals)) => goals[i] = Some(g),
            None => {
                let mut goals = [None, None];
                goals[i] = Some(g);
                v.push((p.name.clone(), goals));
            }
        }
    }
    v
}

fn goal_text(goals: &[Option<f64>; 2]) -> String {
    let g = |o: Option<f64>| o.map_or("–".into(), |v| format!("{v}×"));
    format!("≥ {} / {} (pipeline 1 / 16)", g(goals[0]), g(goals[1]))
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
pub fn headline(run: &PerfRun) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "Headline ratios (median of {} alternating rounds, 50 clients, pipeline 1 / 16; {}):",
        run.settings.rounds, run.date
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
            r(ACQUIRE),
            r(RELEASE),
            r(CYCLE),
            mem
        );
    }
    o
}

fn goals_table(o: &mut String, run: &PerfRun) {
    let _ = write!(o, "| goal |");
    for s in &run.servers {
        let _ = write!(o, " {} |", s.label);
    }
    let _ = write!(o, "\n|---|");
    for _ in &run.servers {
        let _ = write!(o, "---|");
    }
    o.push('\n');
    for (name, goals) in goal_pairs(run) {
        let _ = write!(o, "| {name} {} |", goal_text(&goals));
        for s in &run.servers {
            let a = pair(s, &name, 1).map_or(f64::NAN, PairResult::ratio);
            let b = pair(s, &name, 16).map_or(f64::NAN, PairResult::ratio);
            let met = [a, b]
                .iter()
                .zip(goals)
                .all(|(r, g)| g.is_none_or(|g| *r >= g));
            let _ = write!(o, " {} / {} {} |", x(a), x(b), verdict(met));
        }
        o.push('\n');
    }
    let _ = write!(o, "| memory per lock ≤ {MEMORY_GOAL}× a string lock |");
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
                    verdict(r <= MEMORY_GOAL)
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

fn throughput_section(o: &mut String, run: &PerfRun) {
    let cfg = &run.settings;
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
        for p in PIPELINES {
            let ping = t.ping_median(p);
            for r in t.pairs.iter().filter(|r| r.pipeline == p) {
                let (lo, hi) = (r.ratio_min, r.ratio_max);
                let goal = r.goal.map_or("–".into(), |g| {
                    format!("≥ {g}× {}", verdict(r.ratio() >= g))
                });
                // A cycle is two commands: compare commands per second with PING.
                let per_cmd = r.a * r.a_per_op;
                let recipe_cmd = r.b * r.b_per_op;
                let _ = writeln!(
                    o,
                    "| {} | {p} | {} | {} | {} ({:.2}–{:.2}) | {goal} | {} | {:.0}% |",
                    r.name,
                    rate(r.a),
                    rate(r.b),
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
        "Commands sent (`k` is `bench:lock:<client>:<n>`, the token is 36 bytes):\n\n```\n{}\nPING\n\nrelease.lua: {}\nextend.lua:  {}\n```\n",
        run.commands.join("\n"),
        run.release_lua,
        run.extend_lua
    );
}

fn latency_section(o: &mut String, run: &PerfRun) {
    let _ = writeln!(
        o,
        "### 2. Latency\n\nOne client, one command at a time, timed with a monotonic clock around \
         send-and-read: ACQUIRE then RELEASE of a fresh key, against SET NX PX then EVALSHA release; \
         {} pairs per side per round, {} rounds alternated (ABBA). Microseconds; the ratio is the \
         median over rounds of module p50 / recipe p50 (below 1 is faster).\n",
        run.settings.lat_ops, run.settings.rounds
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

fn memory_section(o: &mut String, run: &PerfRun) {
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
        run.settings.mem_locks, run.settings.waiters, run.settings.wait_locks
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
            verdict(m.module_per_lock / m.string_per_lock <= MEMORY_GOAL),
            m.usage_module,
            m.usage_string
        );
    }
    o.push('\n');
}

fn scaling_section(o: &mut String, run: &PerfRun) {
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
        run.settings.rounds.max(1),
        run.settings.ops_p16 / 2,
        run.settings.handoffs,
        run.settings.expiries,
        run.settings.expiry_ttl_ms,
        run.settings.waiters,
        run.settings.wait_locks
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
pub fn callgrind_block(cg: &Callgrind) -> String {
    let mut o = String::new();
    let (date, baseline) = (&cg.date, &cg.baseline);
    let ping = phase_value(cg, "PING");
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
            .and_then(|(_, rows)| rows.iter().find(|(n, _)| *n == p.name).map(|(_, v)| *v));
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
        "| module vs recipe, instructions | module | recipe | module / recipe | goal |\n|---|---|---|---|---|"
    );
    for (a, b) in pairs {
        let (va, vb) = (phase_value(cg, a), phase_value(cg, b));
        let goal = INSTRUCTION_GOALS
            .iter()
            .find(|(m, r, _)| *m == a && *r == b)
            .map_or("–".into(), |(_, _, g)| {
                format!("≤ {g}× {}", verdict(va / vb <= *g))
            });
        let _ = writeln!(
            o,
            "| {a} vs {b} | {} | {} | {} | {goal} |",
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
        "| cycle: ACQUIRE+RELEASE vs SET NX PX+EVALSHA | {} | {} | {} | – |\n",
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

fn crosscheck_section(o: &mut String, run: &PerfRun) {
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
        run.settings.rb_rounds
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
                .map_or(f64::NAN, |(_, v)| *v);
            let _ = writeln!(
                o,
                "| {} | {} | {} | {} | {} | {} | {} |",
                s.label,
                p.name,
                p.pipeline,
                rate(p.a),
                rate(p.b),
                x(p.ratio),
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
fn gaps_section(o: &mut String, run: &PerfRun) {
    let mut lines = vec![];
    for s in &run.servers {
        for (name, _) in goal_pairs(run) {
            for p in PIPELINES {
                if let Some(r) = pair(s, &name, p) {
                    let Some(goal) = r.goal else { continue };
                    if r.ratio() < goal {
                        // No command can beat PING: PING / recipe bounds the ratio.
                        let ping = s.throughput.as_ref().map_or(f64::NAN, |t| t.ping_median(p));
                        let ceiling = ping / (r.b * r.b_per_op);
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
                            name,
                            x(r.ratio()),
                            (1.0 - r.ratio() / goal) * 100.0
                        ));
                    }
                }
            }
        }
        if let Some(m) = &s.memory {
            let r = m.module_per_lock / m.string_per_lock;
            if r > MEMORY_GOAL {
                lines.push(format!(
                    "- {}: a module lock takes {:.0} B against {:.0} B for a string lock ({}, goal ≤ {MEMORY_GOAL}×): {:.0} B per lock too many.",
                    s.label,
                    m.module_per_lock,
                    m.string_per_lock,
                    x(r),
                    m.module_per_lock - MEMORY_GOAL * m.string_per_lock
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
            "**Memory.** A string lock is one object with the token inline (Redis 8 and Valkey \
             also embed the key and its expiry in it). A module lock is the server's object, \
             the server's module-value wrapper and one 64-byte block holding the whole lock: \
             the token's 16-byte digest, the fence, the lease, the time of the grant, the \
             client id and an IPv4 address (an owner label or another kind of address adds a \
             second block). `MEMORY USAGE` says {} B against {} B for the string on the first \
             server. What is left of the gap is the server's: the wrapper and a value object \
             of its own, where a string lives inside its object.\n",
            m.usage_module, m.usage_string
        );
    }
}

/// Where an ACQUIRE's instructions go beyond a SET's, from the callgrind run: the
/// inclusive cost of each server call and of the module's own code, the most removing
/// it could save.
fn why_from_profile(o: &mut String, cg: &Callgrind) {
    let acq = "LOCK.ACQUIRE (TOKEN)";
    let get = |f: &str| {
        cg.phases
            .iter()
            .find(|p| p.name == acq)
            .and_then(|p| p.inclusive.iter().find(|c| c.function == f))
            .map_or(0.0, |c| c.per_cmd)
    };
    let gap = phase_value(cg, acq) - phase_value(cg, "SET NX PX");
    let _ = writeln!(
        o,
        "**Why** (instructions per command from table 5, {}): an ACQUIRE costs {} \
         instructions more than a SET NX PX. Where its instructions go (inclusive, the most \
         removing each could save):\n",
        cg.server,
        ir(gap)
    );
    let centres: [(&str, &str); 7] = [
        (
            "RM_ModuleTypeSetValue",
            "storing a module value: the server's object, its module-value wrapper and the key entry (a SET stores one string)",
        ),
        ("RM_SetAbsExpire", "the key's expiry"),
        ("RM_ReplyWithStringBuffer", "the token in the `[token, fence]` reply (a SET answers a shared `+OK`)"),
        ("RM_ReplyWithLongLong", "the fence in the reply"),
        ("RM_OpenKey", "opening the key"),
        (
            "RM_Replicate",
            "the replicated LOCK.REPL, built only while an AOF, a replica or a replication backlog can receive it",
        ),
        ("redis_lock::args::parse_acquire", "parsing the options"),
    ];
    let mut items = vec![];
    for (f, what) in centres {
        let c = get(f);
        if c >= 100.0 {
            items.push(format!("- `{f}`: {} per ACQUIRE, {what}.", ir(c)));
        }
    }
    for i in &items {
        let _ = writeln!(o, "{i}");
    }
    o.push('\n');
}

pub fn perf_section(run: &PerfRun) -> String {
    let mut o = String::new();
    let cfg = &run.settings;
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
        Some(cg) => o.push_str(&callgrind_block(cg)),
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
