//! Instructions per command under `valgrind --tool=callgrind`, which counts
//! instructions and so is stable on a noisy machine. One server runs under callgrind;
//! for each phase the counters are zeroed (`callgrind_control -z`), N commands are sent
//! (one connection, pipeline 16, every reply checked) and the counters dumped
//! (`callgrind_control -d`). Instructions per command = the dump's total / N; the PING
//! phase is the floor every command pays (network, parsing, dispatch, reply). The
//! instruction-count check of `make test` ([`guard`]) measures the same way.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::thread::sleep;
use std::time::{Duration, Instant};

use redis_lock_report::perf::{Callgrind, CgLevel, FnCost, Phase};
use redis_lock_testkit::run_cmd;

use crate::config::Config;
use crate::load::{self, Workload};
use crate::ops::{flushall, Op};
use crate::scaling::{at_levels, spread_extend};
use crate::Server;

/// The phases, in order. Keys: `cgm` module locks, `cgs` string locks, `cgg` locks
/// with a server-generated token. Each phase finds its keys in the state it needs:
/// ACQUIRE/SET on free keys, EXTEND/RELEASE on keys the earlier phases hold.
pub const PHASES: [(&str, Op, &[u8]); 8] = [
    ("PING", Op::Ping, b"cgp"),
    ("SET NX PX", Op::SetNx, b"cgs"),
    ("LOCK.ACQUIRE (TOKEN)", Op::Acquire, b"cgm"),
    ("LOCK.ACQUIRE (generated token)", Op::AcquireGen, b"cgg"),
    ("LOCK.EXTEND", Op::Extend, b"cgm"),
    ("EVALSHA extend", Op::EvalExtend, b"cgs"),
    ("LOCK.RELEASE", Op::Release, b"cgm"),
    ("EVALSHA release", Op::EvalRelease, b"cgs"),
];

/// Cost of one function per command, and the object it is in.
struct Cost {
    function: String,
    object: String,
    per_cmd: f64,
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
        // Functions still on the stack at the dump (main, aeMain, ...) show their
        // whole inclusive cost here; they are not a command's own work.
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

/// Inclusive instructions of the server's `call()` (command execution) per operation.
pub fn executing(dump: &Path, ops: u64) -> io::Result<f64> {
    Ok(annotate(dump, ops, true)?
        .iter()
        .find(|f| f.function == "call")
        .map_or(f64::NAN, |f| f.per_cmd))
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
    pid: String,
    out: PathBuf,
    dumps: u32,
}

impl Session {
    /// Starts `bin` under callgrind, emptied, with its dumps in `target/bench/<dir>`.
    pub fn start(bin: &Path, cfg: &Config, dir: &str) -> io::Result<Session> {
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
        let server = Server::start(bin, cfg, &wrapper, Duration::from_secs(180))?;
        flushall(&mut server.conn()?)?;
        Ok(Session {
            pid: server.kit.pid().to_string(),
            server,
            out,
            dumps: 0,
        })
    }

    /// Zero, run, dump; returns the dump and the instructions it counted.
    pub fn measure(&mut self, w: &Workload, ops: u64, what: &str) -> io::Result<(PathBuf, f64)> {
        control("-z", &self.pid)?;
        load::run(self.server.port, 1, 16, ops, what, w)?;
        control("-d", &self.pid)?;
        self.dumps += 1;
        let dump = PathBuf::from(format!("{}.{}", self.out.display(), self.dumps));
        let start = Instant::now();
        while !dump.exists() && start.elapsed() < Duration::from_secs(30) {
            sleep(Duration::from_millis(100));
        }
        let total = summary(&dump)? as f64;
        Ok((dump, total))
    }

    /// [`measure`](Self::measure) of `ops` of `op` on keys `prefix:...`.
    pub fn measure_op(
        &mut self,
        op: Op,
        prefix: &[u8],
        ops: u64,
        what: &str,
    ) -> io::Result<(PathBuf, f64)> {
        let scripts = self.server.scripts.clone();
        let w = op.load(prefix, &scripts, 0);
        self.measure(&w, ops, what)
    }
}

pub fn run(bin: &Path, cfg: &Config, date: &str) -> io::Result<Callgrind> {
    let mut session = Session::start(bin, cfg, "callgrind")?;
    let server_label = session.server.label.clone();
    let port = session.server.port;
    let mut phases = vec![];
    for (name, op, prefix) in PHASES {
        let (dump, total) = session.measure_op(op, prefix, cfg.cg_ops, name)?;
        let per_cmd = total / cfg.cg_ops as f64;
        let costs = annotate(&dump, cfg.cg_ops, false)?;
        let inclusive = api_costs(annotate(&dump, cfg.cg_ops, true)?);
        let module_self = costs
            .iter()
            .filter(|f| f.object.contains("redis_lock"))
            .map(|f| f.per_cmd)
            .sum();
        eprintln!("  [callgrind {server_label}] {name}: {per_cmd:.0} Ir/command");
        phases.push(Phase {
            name: name.to_string(),
            per_cmd,
            module_self,
            inclusive,
        });
    }
    // The held-lock levels, then the last level again with blocked waiters on top.
    let waiters = cfg.waiters * u64::from(!cfg.cg_levels.0.is_empty());
    let levels = at_levels(port, cfg, &cfg.cg_levels.0, waiters, |held, waiters| {
        level(&mut session, cfg, held, waiters)
    })?;
    Ok(Callgrind {
        date: date.to_string(),
        server: server_label,
        ops: cfg.cg_ops,
        phases,
        levels,
        baseline: read_tsv(&cfg.baseline()).ok(),
    })
}

/// Instructions per ACQUIRE+RELEASE cycle and per EXTEND spread over the held locks.
fn level(session: &mut Session, cfg: &Config, held: u64, waiters: u64) -> io::Result<CgLevel> {
    let cycle_ops = (cfg.cg_ops / 2).max(1) * 2;
    let cycles = cycle_ops / 2;
    let (d1, cycle) = session.measure_op(Op::CycleModule, b"cgc", cycle_ops, "cycle")?;
    let (d2, extend) = session.measure(&spread_extend(held, false), cfg.cg_ops, "extend")?;
    let l = CgLevel {
        held,
        waiters,
        cycle: cycle / cycles as f64,
        extend: extend / cfg.cg_ops as f64,
        cycle_exec: executing(&d1, cycles)?,
        extend_exec: executing(&d2, cfg.cg_ops)?,
    };
    eprintln!(
        "  [callgrind {}] {held} held, {waiters} waiters: {:.0} Ir per ACQUIRE+RELEASE ({:.0} executing), {:.0} Ir per EXTEND ({:.0} executing)",
        session.server.label, l.cycle, l.cycle_exec, l.extend, l.extend_exec
    );
    Ok(l)
}

/// A baseline file: `name<TAB>value` lines; `#` lines are comments, the first of which
/// is returned as the note.
pub fn read_tsv(path: &Path) -> io::Result<(String, Vec<(String, f64)>)> {
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
            let (k, v) = l.split_once('\t')?;
            Some((k.to_string(), v.trim().parse().ok()?))
        })
        .collect();
    Ok((note.unwrap_or_default(), rows))
}

/// Writes `header` (`#` lines) and then the rows with `decimals` decimals.
pub fn write_tsv<'a>(
    path: &Path,
    header: &str,
    rows: impl Iterator<Item = (&'a str, f64)>,
    decimals: usize,
) -> io::Result<()> {
    let mut s = header.to_string();
    for (name, v) in rows {
        s.push_str(&format!("{name}\t{v:.decimals$}\n"));
    }
    fs::write(path, s)
}

pub fn write_baseline(path: &Path, cg: &Callgrind) -> io::Result<()> {
    let header = format!(
        "# {}, {}, {} commands per phase; written by `make bench-callgrind-baseline`\n",
        cg.date, cg.server, cg.ops
    );
    let rows = cg.phases.iter().map(|p| (p.name.as_str(), p.per_cmd));
    write_tsv(path, &header, rows, 1)
}

/// Commands per phase: enough to average out a phase's fixed costs, small enough that the
/// whole guard runs in well under a minute.
pub const GUARD_OPS: u64 = 2_000;
/// Allowed rise over the baseline.
pub const TOLERANCE: f64 = 0.10;

/// The guarded commands (with the recipe commands measured beside them for reference),
/// each on keys in the state it needs: ACQUIRE/SET on free keys, EXTEND/RELEASE on the
/// keys the ACQUIRE phase holds.
const GUARD_PHASES: [(&str, Op, &[u8], bool); 5] = [
    ("SET NX PX", Op::SetNx, b"gs", false),
    ("LOCK.ACQUIRE", Op::Acquire, b"gm", true),
    ("LOCK.EXTEND", Op::Extend, b"gm", true),
    ("LOCK.RELEASE", Op::Release, b"gm", true),
    ("EVALSHA release", Op::EvalRelease, b"gs", false),
];

/// `redis-lock-bench guard`, the instruction-count check `make test` runs. Instructions
/// are deterministic where wall time is not: the same binary, inputs and server give the
/// same count whatever else the machine does. The guard measures, under callgrind on one
/// server, the instructions a command costs inside the server's `call()` (the command and
/// its propagation, without the event loop and the time-driven cron, which under
/// valgrind's slowdown run far more often per command than natively), and fails when
/// LOCK.ACQUIRE, LOCK.RELEASE or LOCK.EXTEND costs more than 10% above the baseline
/// checked into `bench/callgrind-guard.tsv`. The baseline is updated on purpose, with the
/// reason, in the same commit: `make perf-guard-baseline REASON="..."`.
///
/// With `reason`, writes the counts as the new baseline instead of checking.
pub fn guard(bin: &Path, cfg: &Config, reason: Option<&str>) -> io::Result<()> {
    let mut session = Session::start(bin, cfg, "guard")?;
    let label = session.server.label.clone();
    let mut now = vec![];
    for (name, op, prefix, guarded) in GUARD_PHASES {
        let (dump, _) = session.measure_op(op, prefix, GUARD_OPS, name)?;
        let ir = executing(&dump, GUARD_OPS)?;
        eprintln!("  [guard {label}] {name}: {ir:.0} instructions in call()");
        now.push((name.to_string(), ir, guarded));
    }
    let file = cfg.root.join("bench/callgrind-guard.tsv");
    if let Some(reason) = reason {
        let header = format!(
            "# {}: {label}, {GUARD_OPS} commands per phase, instructions inside call() per command.\n# Why this baseline: {reason}\n",
            redis_lock_report::fmt::now_utc()
        );
        let rows = now.iter().map(|(name, ir, _)| (name.as_str(), *ir));
        write_tsv(&file, &header, rows, 0)?;
        eprintln!("baseline written to {}", file.display());
        return Ok(());
    }
    let (_, baseline) = read_tsv(&file)?;
    for (name, ir, _) in &now {
        if let Some((_, base)) = baseline.iter().find(|(n, _)| n == name) {
            eprintln!(
                "  {name}: {ir:.0} now, {base:.0} baseline ({:+.1}%)",
                (ir / base - 1.0) * 100.0
            );
        }
    }
    let bad = regressions(&baseline, &now);
    if bad.is_empty() {
        eprintln!(
            "perf guard: every guarded command within {:.0}% of its baseline",
            TOLERANCE * 100.0
        );
        Ok(())
    } else {
        Err(io::Error::other(format!(
            "perf guard failed ({}):\n  {}",
            file.display(),
            bad.join("\n  ")
        )))
    }
}

/// Compares `now` with `baseline`; the failures, as lines to print.
pub fn regressions(baseline: &[(String, f64)], now: &[(String, f64, bool)]) -> Vec<String> {
    now.iter()
        .filter(|(_, _, guarded)| *guarded)
        .filter_map(|(name, ir, _)| {
            let Some((_, base)) = baseline.iter().find(|(n, _)| n == name) else {
                return Some(format!("{name}: no baseline"));
            };
            let rise = ir / base - 1.0;
            (!ir.is_finite() || rise > TOLERANCE).then(|| {
                format!(
                    "{name}: {ir:.0} instructions, {:+.1}% over the baseline {base:.0} (allowed {:+.0}%)",
                    rise * 100.0,
                    TOLERANCE * 100.0
                )
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rise_over_ten_percent_fails() {
        let row = |name: &str, ir: f64, guarded: bool| (name.to_string(), ir, guarded);
        let base = vec![("A".to_string(), 1000.0), ("B".to_string(), 1000.0)];
        let ok = [row("A", 1099.0, true), row("B", 900.0, true)];
        assert!(regressions(&base, &ok).is_empty());
        let bad = [row("A", 1101.0, true), row("B", 5000.0, false)];
        let r = regressions(&base, &bad);
        assert_eq!(r.len(), 1, "{r:?}");
        assert!(r[0].starts_with("A: 1101"), "{r:?}");
        let missing = [row("C", 1.0, true)];
        assert_eq!(regressions(&base, &missing), ["C: no baseline"]);
        assert_eq!(regressions(&base, &[row("A", f64::NAN, true)]).len(), 1);
    }
}
