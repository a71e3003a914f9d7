//! Instructions per command under `valgrind --tool=callgrind` (stable on a noisy
//! machine): per phase, one server emptied and filled with the keys the command needs,
//! counters zeroed, N commands sent on one connection (every reply checked), counters
//! dumped; per command, the dump's total and the inclusive cost of `call()` and of
//! `processCommand`, compared with `SET NX PX` on the same binary without the module.
//! The instruction-count check of `make test` ([`guard`]) measures the same way.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::thread::sleep;
use std::time::{Duration, Instant};

use redis_lock_report::perf::{Callgrind, CgLevel, FnCost, Phase};
use redis_lock_testkit::{run_cmd, Resp};

use crate::config::Config;
use crate::load::{self, Batch, Workload};
use crate::ops::{self, flushall, Needs, Op};
use crate::scaling::{at_levels, spread_extend};
use crate::{On, Server};

/// A server of the phases: its module, and whether it writes an AOF (`appendfsync no`).
type Srv = (On, bool);
const PLAIN: Srv = (On::Plain, false);
const LOCK: Srv = (On::Lock, false);

/// The phases of `make bench`, server by server, each on fresh keys of its own.
pub const PHASES: [(&str, Srv, &Op); 19] = [
    ("PING", PLAIN, &ops::PING),
    ("SET NX PX", PLAIN, &ops::SET_NX),
    ("EVALSHA extend", PLAIN, &ops::EVAL_EXTEND),
    ("EVALSHA release", PLAIN, &ops::EVAL_RELEASE),
    ("SET PX", PLAIN, &ops::SET_PX),
    ("SET", PLAIN, &ops::SET),
    ("GET", PLAIN, &ops::GET),
    ("EXPIRE", PLAIN, &ops::EXPIRE),
    ("DEL", PLAIN, &ops::DEL),
    ("LOCK.ACQUIRE (TOKEN)", LOCK, &ops::ACQUIRE),
    ("LOCK.ACQUIRE (generated token)", LOCK, &ops::ACQUIRE_GEN),
    ("LOCK.EXTEND", LOCK, &ops::EXTEND),
    ("LOCK.RELEASE", LOCK, &ops::RELEASE),
    ("LOCK.ACQUIRE SHARED, fresh key", LOCK, &ops::SHARED),
    (
        "LOCK.ACQUIRE SHARED, 20,000 holders",
        LOCK,
        &ops::SHARED_CROWD,
    ),
    ("floor", (On::Floor, false), &ops::FLOOR),
    ("floor, no expiry", (On::Floor, false), &ops::FLOOR_NOEXP),
    ("SET NX PX, AOF", (On::Plain, true), &ops::SET_NX),
    ("LOCK.ACQUIRE (TOKEN), AOF", (On::Lock, true), &ops::ACQUIRE),
];

/// The taxes: each of these again on the server of the phases without the module, once
/// it has loaded the module (`MODULE LOAD`), so that both counts share one process and
/// its hash seed (which decides where each name and key sits in the server's tables), and
/// the difference is what loading the module changed.
const TAX_PHASES: [(&str, &Op); 6] = [
    ("SET NX PX, module loaded", &ops::SET_NX),
    ("SET PX, module loaded", &ops::SET_PX),
    ("SET, module loaded", &ops::SET),
    ("GET, module loaded", &ops::GET),
    ("EXPIRE, module loaded", &ops::EXPIRE),
    ("DEL, module loaded", &ops::DEL),
];

/// Phases on the server without the module where it has Valkey 9's native commands: the
/// compare-and-delete and compare-and-set LOCK.RELEASE and LOCK.EXTEND stand beside.
const NATIVE_PHASES: [(&str, Srv, &Op); 2] = [
    ("DELIFEQ", PLAIN, &ops::DELIFEQ),
    ("SET IFEQ PX", PLAIN, &ops::SET_IFEQ),
];

/// Commands per phase on the crowded key (each costs as much as its holders).
const CROWD_OPS: u64 = 1_000;

/// Cost of one function per command, and the object it is in.
struct Cost {
    function: String,
    object: String,
    per_cmd: f64,
}

/// What a dump counted, per command.
pub struct Costs {
    pub total: f64,
    pub call: f64,
    pub process: f64,
    /// The command filters (`moduleCallCommandFilters`; 0 without a module that has one).
    pub filters: f64,
    /// Inclusive costs of the module's functions and the server API calls.
    pub inclusive: Vec<FnCost>,
}

/// `callgrind_control <op> <pid>`.
fn control(op: &str, pid: &str) -> io::Result<()> {
    match run_cmd(&["callgrind_control", op, pid]) {
        Ok(text) if text.contains("OK") => Ok(()),
        Ok(text) | Err(text) => Err(io::Error::other(format!("callgrind_control {op}: {text}"))),
    }
}

/// `summary:` of a callgrind dump: the instructions it counted.
pub fn summary(path: &Path) -> io::Result<u64> {
    let text = fs::read_to_string(path)?;
    text.lines()
        .find_map(|l| l.strip_prefix("summary:"))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| io::Error::other(format!("no summary in {}", path.display())))
}

/// Cost per function from `callgrind_annotate`: self cost, or inclusive cost.
fn annotate(path: &Path, ops: u64, inclusive: bool) -> io::Result<Vec<Cost>> {
    let mode = if inclusive { "yes" } else { "no" };
    let out = Command::new("callgrind_annotate")
        .arg(format!("--inclusive={mode}"))
        .arg("--threshold=100")
        .arg(path)
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let name = format!(
        "{}.{}.txt",
        path.file_name()
            .map_or("dump".into(), |f| f.to_string_lossy()),
        if inclusive { "inclusive" } else { "self" }
    );
    fs::write(path.with_file_name(name), &text)?;
    let total = summary(path)? as f64;
    let mut v = vec![];
    for line in text.lines() {
        // "  1,234 ( 5.6%)  file:function [object]"
        let Some((num, rest)) = line.trim().split_once(' ') else {
            continue;
        };
        let (Ok(ir), Some((_, rest))) = (num.replace(',', "").parse::<u64>(), rest.split_once(')'))
        else {
            continue;
        };
        let rest = rest.trim();
        if rest.is_empty() || rest == "PROGRAM TOTALS" {
            continue;
        }
        // Functions on the stack at the dump (main, aeMain, ...): not a command's work.
        if !inclusive && ir as f64 > total * 0.5 {
            continue;
        }
        let (func, object) = match rest.rsplit_once(" [") {
            Some((f, o)) => (f, o.trim_end_matches(']')),
            None => (rest, ""),
        };
        // "file:function", then " (N×)" call counts in the inclusive listing.
        let func = func.split_once(':').map_or(func, |(_, f)| f);
        let func = match func.rsplit_once(" (") {
            Some((f, count)) if count.ends_with("x)") => f,
            _ => func,
        };
        v.push(Cost {
            function: func.to_string(),
            object: Path::new(object)
                .file_name()
                .map_or(object.to_string(), |f| f.to_string_lossy().into_owned()),
            per_cmd: ir as f64 / ops as f64,
        });
    }
    Ok(v)
}

/// The costs per command of `ops` commands in `dump`.
pub fn costs(dump: &Path, ops: u64) -> io::Result<Costs> {
    let all = annotate(dump, ops, true)?;
    let get = |f: &str| {
        all.iter()
            .find(|c| c.function == f)
            .map_or(f64::NAN, |c| c.per_cmd)
    };
    let (call, process) = (get("call"), get("processCommand"));
    let filters = get("moduleCallCommandFilters");
    Ok(Costs {
        total: summary(dump)? as f64 / ops as f64,
        call,
        process,
        filters: if filters.is_nan() { 0.0 } else { filters },
        inclusive: api_costs(all),
    })
}

/// Keeps the server API calls (`RM_*`) and the module's own functions, once each
/// (inlined code shows up under several file names), most expensive first.
fn api_costs(all: Vec<Cost>) -> Vec<FnCost> {
    let mut v: Vec<FnCost> = vec![];
    for f in all {
        let interesting = f.function.starts_with("RM_")
            || f.function.starts_with("redis_lock::")
            || f.function == "moduleNotifyKeyspaceEvent";
        if !interesting {
            continue;
        }
        match v.iter_mut().find(|g| g.function == f.function) {
            Some(g) => g.per_cmd = g.per_cmd.max(f.per_cmd),
            None => v.push(FnCost {
                function: f.function,
                per_cmd: f.per_cmd,
            }),
        }
    }
    v.sort_by(|a, b| b.per_cmd.total_cmp(&a.per_cmd));
    v
}

/// A server running under callgrind, and the dumps taken of it.
pub struct Session {
    pub server: Server,
    /// What the server runs: `PLAIN` until it loads the module (`MODULE LOAD`), then `LOCK`.
    pub on: Srv,
    /// Commands in flight on the measuring connection.
    pub pipeline: usize,
    pid: String,
    out: PathBuf,
    dumps: u32,
    started: Instant,
}

impl Session {
    /// Starts `bin` under callgrind, emptied, dumps in `target/bench/<dir>`; `exact`: the
    /// guard's counts, which repeat to the instruction.
    pub fn start(
        bin: &Path,
        cfg: &Config,
        (on, aof): Srv,
        dir: &str,
        exact: bool,
    ) -> io::Result<Session> {
        let dir = cfg.path(&Path::new("target/bench").join(dir));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir)?;
        let out = dir.join("cg.out");
        let wrapper: Vec<String> = vec![
            "valgrind".into(),
            "--tool=callgrind".into(),
            format!("--callgrind-out-file={}", out.display()),
            "--dump-instr=no".into(),
        ];
        // No slow log (under valgrind a command can pass its 10 ms) and no rehashing in the
        // cron (how much it does before a command depends on timing): neither is its cost.
        let mut extra = vec![("slowlog-log-slower-than", "-1"), ("activerehashing", "no")];
        if on == On::Plain {
            // The module's taxes are counted on this server once it has loaded the module.
            extra.push(("enable-module-command", "yes"));
        }
        if aof {
            extra.extend([("appendonly", "yes"), ("appendfsync", "no")]);
        }
        // jemalloc does not purge (by the clock, inside whichever call comes then); `exact`
        // also turns off its thread cache, whose bin flushes (a few hundred instructions)
        // depend on all earlier allocations: counts are higher, and repeat within 0.3%
        // (JE_MALLOC_CONF: for a server built with its own jemalloc).
        let jemalloc = match exact {
            true => "tcache:false,dirty_decay_ms:-1,muzzy_decay_ms:-1",
            false => "dirty_decay_ms:-1,muzzy_decay_ms:-1",
        };
        let env = [("MALLOC_CONF", jemalloc), ("JE_MALLOC_CONF", jemalloc)];
        let ready = Duration::from_secs(180);
        let server = Server::start(bin, cfg, on, (&extra, &env), &wrapper, ready)?;
        flushall(&mut server.conn()?)?;
        Ok(Session {
            on: (on, aof),
            // One command at a time when exact: each arrives in a read of its own, so what
            // the server allocates around it does not depend on how a pipeline was split.
            pipeline: if exact { 1 } else { 16 },
            pid: server.kit.pid().to_string(),
            server,
            out,
            dumps: 0,
            started: Instant::now(),
        })
    }

    /// Zero, run (grouped as `batch` says, else the session's pipeline), dump; the dump.
    pub fn measure(
        &mut self,
        w: &Workload,
        ops: u64,
        batch: Option<Batch>,
        what: &str,
    ) -> io::Result<PathBuf> {
        self.zero()?;
        let batch = batch.unwrap_or(Batch::Pipeline(self.pipeline as u64));
        load::run(self.server.port, 1, batch, ops, what, w)?;
        self.dump()
    }

    /// Zeroes the counters: what runs from here until [`dump`](Self::dump) is counted.
    pub fn zero(&self) -> io::Result<()> {
        control("-z", &self.pid)
    }

    /// Dumps the counters since [`zero`](Self::zero); returns the dump once written.
    pub fn dump(&mut self) -> io::Result<PathBuf> {
        control("-d", &self.pid)?;
        self.dumps += 1;
        let dump = PathBuf::from(format!("{}.{}", self.out.display(), self.dumps));
        let start = Instant::now();
        while summary(&dump).is_err() && start.elapsed() < Duration::from_secs(30) {
            sleep(Duration::from_millis(100));
        }
        Ok(dump)
    }

    /// `ops` of `op` on fresh keys `prefix:...` of an emptied server holding what `op`
    /// needs; measured (the dump) unless `warm_up`. An exact phase first sizes the key
    /// table so that it neither grows nor shrinks during the phase (not the command's cost).
    pub fn phase(&mut self, op: &Op, prefix: &str, ops: u64, warm_up: bool) -> io::Result<PathBuf> {
        let (port, s) = (self.server.port, self.server.scripts.clone());
        flushall(&mut self.server.conn()?)?;
        if !warm_up && self.pipeline == 1 {
            let room = (2 * ops).next_power_of_two() * 9 / 10;
            load::run(port, 1, 256, room, "sizing", &ops::SET.load(b"bg", &s, 0))?;
            load::run(port, 1, 256, ops, "sizing", &ops::DEL.load(b"bg", &s, 0))?;
        }
        let fill = format!("{prefix}-fill");
        match op.needs {
            Needs::Held(f) | Needs::Kept(f) => {
                load::run(port, 1, 64, ops, "fill", &f.load(prefix.as_bytes(), &s, 0))
            }
            Needs::Crowd(n) => load::run(port, 1, 64, n, "crowd", &op.load(fill.as_bytes(), &s, 0)),
            Needs::Nothing => Ok(0.0),
        }?;
        let w = op.load(prefix.as_bytes(), &s, 0);
        match warm_up {
            true => load::run(port, 1, self.pipeline, ops, "warm-up", &w).map(|_| PathBuf::new()),
            false => self.measure(&w, ops, None, &op.shown()),
        }
    }

    /// Waits until the server has run for `settle` (every periodic check has run once).
    pub fn settle(&self, settle: Duration) {
        sleep(settle.saturating_sub(self.started.elapsed()));
    }
}

/// The phases of `make bench` on `bin`, then (`levels`) the held-lock levels.
pub fn run(bin: &Path, cfg: &Config, date: &str, levels: bool) -> io::Result<Callgrind> {
    let (mut phases, mut label) = (Vec::<Phase>::new(), String::new());
    // One server after the other, each for its run of phases.
    for group in PHASES.chunk_by(|a, b| a.1 == b.1) {
        let mut s = Session::start(bin, cfg, group[0].1, "callgrind", false)?;
        s.settle(SETTLE);
        label.clone_from(&s.server.label);
        let mut group = group.to_vec();
        if group[0].1 == PLAIN && knows(&mut s.server.conn()?, "DELIFEQ")? {
            group.extend(NATIVE_PHASES);
        }
        let taxes = match group[0].1 == PLAIN {
            true => &TAX_PHASES[..],
            false => &[],
        };
        let taxes = taxes.iter().map(|&(name, op)| (name, LOCK, op));
        for (name, srv, op) in group.into_iter().chain(taxes) {
            if srv == LOCK && s.on == PLAIN {
                let module = cfg.path(&cfg.module);
                let r = s
                    .server
                    .conn()?
                    .call(&["MODULE", "LOAD", &module.to_string_lossy()])?;
                if r != Resp::Simple("OK".into()) {
                    return Err(io::Error::other(format!(
                        "MODULE LOAD {}: {r:?}",
                        module.display()
                    )));
                }
                s.on = LOCK;
                s.settle(SETTLE + s.started.elapsed());
            }
            let (i, crowd) = (phases.len(), matches!(op.needs, Needs::Crowd(_)));
            let n = if crowd { CROWD_OPS } else { u64::MAX }.min(cfg.cg_ops);
            s.phase(op, &format!("cg{i}"), n.min(GUARD_OPS), true)?;
            let dump = s.phase(op, &format!("cg{i}"), n, false)?;
            let c = costs(&dump, n)?;
            let module_self = annotate(&dump, n, false)?
                .iter()
                .filter(|f| f.object.contains("redis_lock"))
                .map(|f| f.per_cmd)
                .sum();
            eprintln!("  [callgrind {label}] {name}: {:.0} Ir/command, {:.0} in call(), {:.0} in processCommand", c.total, c.call, c.process);
            phases.push(Phase {
                name: name.to_string(),
                server: server_name(srv).into(),
                command: op.shown(),
                per_cmd: c.total,
                call: c.call,
                process: c.process,
                filters: c.filters,
                module_self,
                inclusive: c.inclusive,
            });
        }
    }
    // The held-lock levels, then the last level again with blocked waiters on top.
    let levels = match levels && !cfg.cg_levels.0.is_empty() {
        true => {
            let mut session = Session::start(bin, cfg, LOCK, "callgrind-levels", false)?;
            let port = session.server.port;
            at_levels(port, cfg, &cfg.cg_levels.0, cfg.waiters, |held, waiters| {
                level(&mut session, cfg, held, waiters)
            })?
        }
        false => vec![],
    };
    // The "before" column was recorded on the first server.
    let baseline = read_tsv(&cfg.baseline())
        .ok()
        .filter(|(note, _)| note.contains(&label));
    Ok(Callgrind {
        date: date.to_string(),
        server: label,
        ops: cfg.cg_ops,
        phases,
        levels,
        baseline: baseline
            .map(|(note, rows)| (note, rows.into_iter().map(|r| (r.0, r.1)).collect())),
    })
}

/// Whether the server knows `command` (`COMMAND INFO` answers nil for one it does not).
pub fn knows(c: &mut redis_lock_testkit::RawConn, command: &str) -> io::Result<bool> {
    let r = c.call(&["COMMAND", "INFO", command])?;
    Ok(matches!(r, Resp::Array(v) if v.first().is_some_and(|x| *x != Resp::Nil)))
}

/// How the report names a phase's server.
pub fn server_name((on, aof): Srv) -> &'static str {
    match (on, aof) {
        (On::Plain, false) => "without the module",
        (On::Plain, true) => "without the module, AOF",
        (On::Lock, false) => "with the module",
        (On::Lock, true) => "with the module, AOF",
        (On::Floor, _) => "with the floor module",
    }
}

/// Instructions per ACQUIRE+RELEASE cycle and per EXTEND spread over the held locks.
fn level(session: &mut Session, cfg: &Config, held: u64, waiters: u64) -> io::Result<CgLevel> {
    let cycle_ops = (cfg.cg_ops / 2).max(1) * 2;
    let cycles = cycle_ops / 2;
    let s = session.server.scripts.clone();
    let d1 = session.measure(&ops::CYCLE.load(b"cgc", &s, 0), cycle_ops, None, "cycle")?;
    let d2 = session.measure(&spread_extend(held, false), cfg.cg_ops, None, "extend")?;
    let (c1, c2) = (costs(&d1, cycles)?, costs(&d2, cfg.cg_ops)?);
    let l = CgLevel {
        held,
        waiters,
        cycle: c1.total,
        extend: c2.total,
        cycle_exec: c1.call,
        extend_exec: c2.call,
    };
    eprintln!(
        "  [callgrind {}] {held} held, {waiters} waiters: {:.0} Ir per ACQUIRE+RELEASE ({:.0} executing), {:.0} Ir per EXTEND ({:.0} executing)",
        session.server.label, l.cycle, l.cycle_exec, l.extend, l.extend_exec
    );
    Ok(l)
}

/// A row of a baseline file: name, value, tolerance.
pub type Row = (String, f64, f64);

/// A baseline file: `name<TAB>value[<TAB>tolerance]` lines (tolerance 0.10 when not
/// given); `#` lines are comments, the first of which is returned as the note.
pub fn read_tsv(path: &Path) -> io::Result<(String, Vec<Row>)> {
    let text = fs::read_to_string(path)
        .map_err(|e| io::Error::other(format!("{}: {e}", path.display())))?;
    let note = text.lines().find_map(|l| {
        let c = l.strip_prefix('#')?.trim();
        (!c.is_empty()).then(|| c.to_string())
    });
    let rows = text
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let mut f = l.split('\t');
            let (k, v) = (f.next()?, f.next()?.trim().parse().ok()?);
            let tolerance = f.next().map_or(Some(0.1), |t| t.trim().parse().ok())?;
            Some((k.to_string(), v, tolerance))
        });
    Ok((note.unwrap_or_default(), rows.collect()))
}

/// Writes `header` (`#` lines) and then the rows with `decimals` decimals.
pub fn write_tsv<'a>(
    path: &Path,
    header: &str,
    rows: impl Iterator<Item = (&'a str, f64, Option<f64>)>,
    decimals: usize,
) -> io::Result<()> {
    let mut s = header.to_string();
    for (name, v, tol) in rows {
        s.push_str(&format!("{name}\t{v:.decimals$}"));
        s.push_str(&tol.map_or("\n".into(), |t| format!("\t{t}\n")));
    }
    fs::write(path, s)
}

pub fn write_baseline(path: &Path, cg: &Callgrind) -> io::Result<()> {
    let header = format!(
        "# {}, {}, {} commands per phase, instructions inside call() per command; written by `make bench-callgrind-baseline`\n",
        cg.date, cg.server, cg.ops
    );
    let rows = cg.phases.iter().map(|p| (p.name.as_str(), p.call, None));
    write_tsv(path, &header, rows, 1)
}

/// Commands per phase of the guard: enough to average out a phase's fixed costs, few
/// enough that the guard runs in about a minute.
pub const GUARD_OPS: u64 = 4_000;
/// The rise a guarded ratio may take: about 800 instructions on LOCK.ACQUIRE, and 5% of
/// a command that merely runs beside the module (its repeat-to-repeat spread is under 3%).
pub const TOLERANCE: f64 = 0.07;
pub const TAX_TOLERANCE: f64 = 0.05;
/// How long a server runs before the guard measures on it (see [`Session::settle`]).
pub const SETTLE: Duration = Duration::from_secs(3);

/// The guarded ratios: (name, command with the module, divisor without it), inside
/// `call()`; a "tax" (issue 21) also counts the command filters a module adds (the rest
/// of `processCommand` costs what the server's random hash seed makes it, module or not).
const GUARDED: [(&str, &Op, &Op); 8] = [
    ("LOCK.ACQUIRE / SET NX PX", &ops::ACQUIRE, &ops::SET_NX),
    ("LOCK.EXTEND / SET NX PX", &ops::EXTEND, &ops::SET_NX),
    ("LOCK.RELEASE / SET NX PX", &ops::RELEASE, &ops::SET_NX),
    ("tax on SET PX", &ops::SET_PX, &ops::SET_PX),
    ("tax on SET", &ops::SET, &ops::SET),
    ("tax on GET", &ops::GET, &ops::GET),
    ("tax on EXPIRE", &ops::EXPIRE, &ops::EXPIRE),
    ("tax on DEL", &ops::DEL, &ops::DEL),
];

/// The commands the guard measures on `on`'s server, in order (each once).
fn guard_ops(on: On) -> Vec<&'static Op> {
    let mut v: Vec<&Op> = vec![];
    for (_, a, b) in GUARDED {
        let op = if on == On::Lock { a } else { b };
        if !v.iter().any(|x| x.words == op.words) {
            v.push(op);
        }
    }
    v
}

/// One guard pass on `on`'s server: every phase once to warm up, then each measured.
fn guard_pass(bin: &Path, cfg: &Config, on: On) -> io::Result<Vec<(&'static Op, Costs)>> {
    let mut s = Session::start(bin, cfg, (on, false), &format!("guard-{on:?}"), true)?;
    let ops = guard_ops(on);
    for (i, op) in ops.iter().enumerate() {
        s.phase(op, &format!("g{i}"), GUARD_OPS, true)?;
    }
    s.settle(SETTLE);
    let mut out = vec![];
    for (i, op) in ops.iter().enumerate() {
        let c = costs(&s.phase(op, &format!("g{i}"), GUARD_OPS, false)?, GUARD_OPS)?;
        let (label, shown) = (&s.server.label, op.shown());
        eprintln!(
            "  [guard {label} {on:?}] {shown}: {:.0} in call(), {:.0} in the command filters",
            c.call, c.filters
        );
        out.push((*op, c));
    }
    Ok(out)
}

/// `redis-lock-bench guard`, the instruction-count check of `make test`: each ratio of
/// [`GUARDED`] counted in one run on one binary (the same under any load or build), after
/// each server ran every phase once and for [`SETTLE`]. It fails when a ratio rises above
/// bench/callgrind-guard.tsv by more than the tolerance there; with `reason`, it writes
/// the ratios as the new baseline instead (`make perf-guard-baseline REASON="..."`).
pub fn guard(bin: &Path, cfg: &Config, reason: Option<&str>) -> io::Result<()> {
    let (lock, plain) = (
        guard_pass(bin, cfg, On::Lock)?,
        guard_pass(bin, cfg, On::Plain)?,
    );
    let count = |pass: &[(&Op, Costs)], op: &Op, tax: bool| {
        let found = pass.iter().find(|(o, _)| o.words == op.words);
        found.map_or(f64::NAN, |(_, c)| {
            c.call + if tax { c.filters } else { 0.0 }
        })
    };
    let now: Vec<(&str, f64)> = (GUARDED.iter())
        .map(|&(name, a, b)| {
            let tax = name.starts_with("tax");
            let (a, b) = (count(&lock, a, tax), count(&plain, b, tax));
            eprintln!("  {name}: {a:.0} / {b:.0} instructions = {:.3}", a / b);
            (name, a / b)
        })
        .collect();
    let file = cfg.root.join("bench/callgrind-guard.tsv");
    if let Some(reason) = reason {
        let header = format!(
            "# {}: {}, {GUARD_OPS} commands per phase; each row a ratio of instructions per command (see GUARDED in bench/src/callgrind.rs) and the rise it may take.\n# Why this baseline: {reason}\n",
            redis_lock_report::fmt::now_utc(),
            redis_lock_testkit::flavor_of(bin).map_or_else(|e| e, |f| f.label())
        );
        let tol = |n: &str| {
            if n.starts_with("tax") {
                TAX_TOLERANCE
            } else {
                TOLERANCE
            }
        };
        let rows = now.iter().map(|&(n, r)| (n, r, Some(tol(n))));
        write_tsv(&file, &header, rows, 3)?;
        eprintln!("baseline written to {}", file.display());
        return Ok(());
    }
    let bad = regressions(&read_tsv(&file)?.1, &now);
    if bad.is_empty() {
        eprintln!("perf guard: every guarded ratio within its tolerance of the baseline");
        Ok(())
    } else {
        let (file, bad) = (file.display(), bad.join("\n  "));
        Err(io::Error::other(format!(
            "perf guard failed ({file}):\n  {bad}"
        )))
    }
}

/// Compares `now` with `baseline` (printing each row that has one); the failures.
pub fn regressions(baseline: &[Row], now: &[(&str, f64)]) -> Vec<String> {
    now.iter()
        .filter_map(|(name, r)| {
            let Some((_, base, tol)) = baseline.iter().find(|b| b.0 == *name) else {
                return Some(format!("{name}: no baseline"));
            };
            let rise = r / base - 1.0;
            let (over, allowed) = (
                format!("{:+.1}%", rise * 100.0),
                format!("{:+.0}%", tol * 100.0),
            );
            eprintln!("  {name}: {r:.3} now, {base:.3} baseline ({over}, allowed {allowed})");
            (!r.is_finite() || rise > *tol).then(|| {
                format!("{name}: {r:.3}, {over} over the baseline {base:.3} (allowed {allowed})")
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rise_over_the_tolerance_fails() {
        let base = vec![("A".to_string(), 1.0, 0.1), ("tax".to_string(), 1.0, 0.02)];
        assert!(regressions(&base, &[("A", 1.099), ("tax", 0.9)]).is_empty());
        let r = regressions(&base, &[("A", 1.101), ("tax", 1.021)]);
        assert_eq!(r.len(), 2, "{r:?}");
        assert!(
            r[0].starts_with("A: 1.101") && r[1].starts_with("tax: 1.021"),
            "{r:?}"
        );
        assert_eq!(regressions(&base, &[("C", 1.0)]), ["C: no baseline"]);
        assert_eq!(regressions(&base, &[("A", f64::NAN)]).len(), 1);
    }

    #[test]
    fn every_guarded_command_is_measured_once() {
        let (lock, plain) = (guard_ops(On::Lock), guard_ops(On::Plain));
        assert_eq!((lock.len(), plain.len()), (8, 6));
    }
}
