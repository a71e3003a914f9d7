//! `redis-lock-bench`: measures redis-lock against the `SET NX PX` + `EVALSHA` recipe it
//! replaces, on every server, and writes the perf section of docs/BENCHMARKS.md and the
//! chart docs/perf.png.
//!
//! ```text
//! redis-lock-bench all                       every suite on every server (make bench)
//! redis-lock-bench callgrind                 instructions per command only (make bench-callgrind)
//! redis-lock-bench callgrind --save-baseline  ... and record them as the "before" column
//! ```
//! Sizes and durations come from `BENCH_*` environment variables (see config.rs).

mod callgrind;
mod chart;
mod config;
mod crosscheck;
mod latency;
mod load;
mod memory;
mod ops;
mod png;
mod report;
mod resp;
mod scaling;
mod server;
mod stats;
mod throughput;

use std::io;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use config::Config;
use server::{Server, ServerSpec};

/// Everything measured on one server.
#[derive(Debug, Clone)]
pub struct ServerResults {
    pub label: String,
    pub throughput: Option<throughput::Throughput>,
    pub latency: Option<latency::Latency>,
    pub memory: Option<memory::Memory>,
    pub scaling: Option<scaling::Scaling>,
    pub crosscheck: Option<crosscheck::CrossCheck>,
}

/// The whole run, as the report needs it.
pub struct Run {
    pub cfg: Config,
    pub date: String,
    pub minutes: f64,
    pub machine: String,
    pub load_start: String,
    pub load_end: String,
    pub servers: Vec<ServerResults>,
    pub callgrind: Option<callgrind::Callgrind>,
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".into())
}

fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .map(|v| v.trim_start_matches([' ', '\t', ':']).to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    format!("{cores} cores, {cpu}")
}

/// UTC date and time from the system clock, `YYYY-MM-DD HH:MM UTC`.
pub fn now_utc() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // Days to civil date (H. Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02} UTC",
        rem / 3600,
        rem % 3600 / 60
    )
}

fn bench_server(spec: &ServerSpec, cfg: &Config) -> io::Result<ServerResults> {
    eprintln!("== {} ({})", spec.label, spec.bin.display());
    let server = Server::start(
        spec,
        &cfg.module,
        &cfg.work,
        &[],
        std::time::Duration::from_secs(30),
    )?;
    let mut c = server.conn()?;
    let scripts = ops::Scripts::load(&mut c)?;
    let mut r = ServerResults {
        label: spec.label.clone(),
        throughput: None,
        latency: None,
        memory: None,
        scaling: None,
        crosscheck: None,
    };
    let t = Instant::now();
    if cfg.has("throughput") {
        r.throughput = Some(throughput::run(&server, cfg, &scripts)?);
        eprintln!("  throughput done in {:.0}s", t.elapsed().as_secs_f64());
    }
    if cfg.has("latency") {
        r.latency = Some(latency::run(&server, cfg, &scripts)?);
        eprintln!("  latency done at {:.0}s", t.elapsed().as_secs_f64());
    }
    if cfg.has("memory") {
        r.memory = Some(memory::run(&server, cfg, &scripts)?);
        eprintln!("  memory done at {:.0}s", t.elapsed().as_secs_f64());
    }
    if cfg.has("scaling") {
        r.scaling = Some(scaling::run(&server, cfg, &scripts)?);
        eprintln!("  scaling done at {:.0}s", t.elapsed().as_secs_f64());
    }
    if cfg.has("crosscheck") && cfg.rb_rounds > 0 {
        r.crosscheck = Some(crosscheck::run(&server, cfg, &scripts)?);
        eprintln!(
            "  redis-benchmark cross-check done at {:.0}s",
            t.elapsed().as_secs_f64()
        );
    }
    Ok(r)
}

/// The server callgrind runs on: the first one (Redis 7.0.15 by default).
fn callgrind_spec(cfg: &Config) -> io::Result<ServerSpec> {
    let bin = std::env::var("BENCH_CG_SERVER")
        .map(PathBuf::from)
        .ok()
        .or_else(|| cfg.servers.first().cloned())
        .ok_or_else(|| io::Error::other("no server to run callgrind on"))?;
    ServerSpec::detect(&bin)
}

fn all(cfg: Config) -> io::Result<()> {
    let started = Instant::now();
    let date = now_utc();
    let load_start = loadavg();
    let mut servers = vec![];
    for bin in &cfg.servers {
        let spec = ServerSpec::detect(bin)?;
        servers.push(bench_server(&spec, &cfg)?);
    }
    let callgrind = if cfg.has("callgrind") {
        Some(callgrind::run(&callgrind_spec(&cfg)?, &cfg)?)
    } else {
        None
    };
    let run = Run {
        date,
        minutes: started.elapsed().as_secs_f64() / 60.0,
        machine: machine(),
        load_start,
        load_end: loadavg(),
        servers,
        callgrind,
        cfg,
    };
    let section = report::perf_section(&run);
    report::write_section(&run.cfg.doc, "perf", &section)?;
    let png = chart::render(&run);
    std::fs::write(&run.cfg.png, png)?;
    eprintln!("{}", report::headline(&run));
    eprintln!(
        "wrote {} and {} in {:.1} min",
        run.cfg.doc.display(),
        run.cfg.png.display(),
        run.minutes
    );
    Ok(())
}

fn callgrind_only(cfg: Config, save_baseline: bool) -> io::Result<()> {
    let date = now_utc();
    let cg = callgrind::run(&callgrind_spec(&cfg)?, &cfg)?;
    if save_baseline {
        callgrind::write_baseline(&cfg.baseline, &cg, &date)?;
        eprintln!("baseline written to {}", cfg.baseline.display());
    }
    let block = report::callgrind_block(&cg, &cfg, &date);
    report::write_section(&cfg.doc, "perf:callgrind", &block)?;
    eprintln!("{block}");
    Ok(())
}

/// Raises the open-file limit to its hard maximum (the servers started from here inherit
/// it) and returns it: 10^4 waiters need 10^4 connections on both ends.
fn raise_fd_limit() -> u64 {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) != 0 {
            return 1024;
        }
        r.rlim_cur = r.rlim_max;
        libc::setrlimit(libc::RLIMIT_NOFILE, &r);
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut r);
    }
    r.rlim_cur
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let root = std::env::var("BENCH_ROOT")
        .map(PathBuf::from)
        .or_else(|_| std::env::current_dir())
        .unwrap_or_else(|_| PathBuf::from("."));
    let mut cfg = Config::from_env(root);
    let fds = raise_fd_limit();
    let usable = fds.saturating_sub(500);
    if cfg.waiters > usable {
        eprintln!(
            "open-file limit is {fds}: measuring {usable} waiters instead of {}",
            cfg.waiters
        );
        cfg.waiters = usable;
    }
    if let Err(e) = std::fs::create_dir_all(&cfg.work) {
        eprintln!("cannot create {}: {e}", cfg.work.display());
        return ExitCode::FAILURE;
    }
    let result = match args.first().map(String::as_str) {
        None | Some("all") => all(cfg),
        Some("callgrind") => callgrind_only(cfg, args.iter().any(|a| a == "--save-baseline")),
        Some(other) => {
            eprintln!("unknown command {other:?}; use: all | callgrind [--save-baseline]");
            return ExitCode::FAILURE;
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("benchmark failed: {e}");
            ExitCode::FAILURE
        }
    }
}
