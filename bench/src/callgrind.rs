//! Instructions per command under `valgrind --tool=callgrind`, which counts
//! instructions and so is stable on a noisy machine. One server runs under callgrind;
//! for each phase the counters are zeroed (`callgrind_control -z`), N commands are sent
//! (one connection, pipeline 16, every reply checked) and the counters dumped
//! (`callgrind_control -d`). Instructions per command = the dump's total / N; the PING
//! phase is the floor every command pays (network, parsing, dispatch, reply).

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::thread::sleep;
use std::time::{Duration, Instant};

use redis_lock_report::perf::{Callgrind, CgLevel, FnCost, Phase};

use crate::config::Config;
use crate::load::{self, Workload};
use crate::memory::{block_all, connect_many, hold_locks};
use crate::ops::{flushall, Op, OpLoad, Scripts};
use crate::scaling::{top_up, SpreadExtend};
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
#[derive(Debug, Clone)]
struct Cost {
    function: String,
    object: String,
    per_cmd: f64,
}

fn control(args: &[&str]) -> io::Result<()> {
    let out = Command::new("callgrind_control").args(args).output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() || !text.contains("OK") {
        return Err(io::Error::other(format!(
            "callgrind_control {args:?} failed: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    Ok(())
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
        let line = line.trim();
        let Some((num, rest)) = line.split_once(' ') else {
            continue;
        };
        let Ok(ir) = num.replace(',', "").parse::<u64>() else {
            continue;
        };
        let Some((_, rest)) = rest.split_once(')') else {
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
    /// Starts `bin` under callgrind, with its dumps in `target/bench/<dir>`.
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
        let pid = server.pid().to_string();
        Ok(Session {
            server,
            pid,
            out,
            dumps: 0,
        })
    }

    /// Zero, run, dump; returns the dump and the instructions it counted.
    pub fn measure(
        &mut self,
        w: &dyn Workload,
        ops: u64,
        what: &str,
    ) -> io::Result<(PathBuf, f64)> {
        control(&["-z", &self.pid])?;
        load::run(self.server.port, 1, 16, ops, w)?.checked(what)?;
        control(&["-d", &self.pid])?;
        self.dumps += 1;
        let dump = PathBuf::from(format!("{}.{}", self.out.display(), self.dumps));
        let start = Instant::now();
        while !dump.exists() && start.elapsed() < Duration::from_secs(30) {
            sleep(Duration::from_millis(100));
        }
        let total = summary(&dump)? as f64;
        Ok((dump, total))
    }
}

pub fn run(bin: &Path, cfg: &Config, date: &str) -> io::Result<Callgrind> {
    let mut session = Session::start(bin, cfg, "callgrind")?;
    let mut c = session.server.conn()?;
    flushall(&mut c)?;
    let scripts = Scripts::load(&mut c)?;
    let server_label = session.server.label.clone();
    let port = session.server.port;
    let mut measure = |w: &dyn Workload, ops: u64, what: &str| -> io::Result<(PathBuf, f64)> {
        session.measure(w, ops, what)
    };
    let mut phases = vec![];
    for (name, op, prefix) in PHASES.iter() {
        let w = OpLoad {
            op: *op,
            prefix,
            scripts: &scripts,
            wrap: 0,
        };
        let (dump, total) = measure(&w, cfg.cg_ops, name)?;
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
    let mut levels = vec![];
    let mut held = 0;
    let cycle_ops = (cfg.cg_ops / 2).max(1) * 2;
    // The held-lock levels, then the last level again with blocked waiters on top.
    let cg_levels = cfg.cg_levels();
    let mut steps: Vec<(u64, u64)> = cg_levels.iter().map(|&n| (n, 0)).collect();
    if let (Some(&last), true) = (cg_levels.last(), cfg.waiters > 0) {
        steps.push((last, cfg.waiters));
    }
    let mut blocked = vec![];
    for (n, waiters) in steps {
        top_up(port, held, n)?;
        held = n;
        if waiters > 0 {
            hold_locks(&mut c, "wl", cfg.wait_locks)?;
            blocked = connect_many(port, waiters)?;
            block_all(&mut c, &mut blocked, "wl", cfg.wait_locks)?;
        }
        let w = OpLoad {
            op: Op::CycleModule,
            prefix: b"cgc",
            scripts: &scripts,
            wrap: 0,
        };
        let (d1, cycle) = measure(&w, cycle_ops, "cycle")?;
        let spread = SpreadExtend {
            held,
            pexpire: false,
        };
        let (d2, extend) = measure(&spread, cfg.cg_ops, "extend")?;
        let cycles = cycle_ops / 2;
        let l = CgLevel {
            held,
            waiters,
            cycle: cycle / cycles as f64,
            extend: extend / cfg.cg_ops as f64,
            cycle_exec: executing(&d1, cycles)?,
            extend_exec: executing(&d2, cfg.cg_ops)?,
        };
        eprintln!(
            "  [callgrind {server_label}] {held} held, {waiters} waiters: {:.0} Ir per ACQUIRE+RELEASE ({:.0} executing), {:.0} Ir per EXTEND ({:.0} executing)",
            l.cycle, l.cycle_exec, l.extend, l.extend_exec
        );
        levels.push(l);
    }
    drop(blocked);
    drop(c);
    Ok(Callgrind {
        date: date.to_string(),
        server: server_label,
        ops: cfg.cg_ops,
        phases,
        levels,
        baseline: read_baseline(&cfg.baseline()),
    })
}

/// The baseline ("before") file: `name<TAB>Ir/command` lines, `#` comments.
pub fn read_baseline(path: &Path) -> Option<(String, Vec<(String, f64)>)> {
    let text = fs::read_to_string(path).ok()?;
    let mut note = String::new();
    let mut rows = vec![];
    for line in text.lines() {
        if let Some(c) = line.strip_prefix('#') {
            if note.is_empty() {
                note = c.trim().to_string();
            }
            continue;
        }
        if let Some((k, v)) = line.split_once('\t') {
            if let Ok(v) = v.trim().parse() {
                rows.push((k.to_string(), v));
            }
        }
    }
    Some((note, rows))
}

pub fn write_baseline(path: &Path, cg: &Callgrind) -> io::Result<()> {
    let mut s = format!(
        "# {}, {}, {} commands per phase; written by `make bench-callgrind-baseline`\n",
        cg.date, cg.server, cg.ops
    );
    for p in &cg.phases {
        s.push_str(&format!("{}\t{:.1}\n", p.name, p.per_cmd));
    }
    fs::write(path, s)
}
