//! `make bench-contention`: N clients contend for one lock, each holding it c ms, against
//! a redis-server (with the module) that this program starts itself. Compares the
//! module's server-side FIFO hand-off (`LOCK.ACQUIRE ... BLOCK`) with the waiting
//! recipes lock libraries use today, and writes the tables into docs/BENCHMARKS.md
//! (between `<!-- contention:begin -->` and `<!-- contention:end -->` only) and a chart
//! into docs/contention.png.
//!
//! Usage: `redis-lock-contention [--docs docs/BENCHMARKS.md] [--chart docs/contention.png]`
//!
//! Environment:
//! - `CONTENTION_SECS`: seconds per cell (default 3)
//! - `CONTENTION_N`: client counts (default `1,2,8,64`)
//! - `CONTENTION_HOLD_MS`: critical-section lengths in ms (default `0,1`)
//! - `CONTENTION_METHODS`: subset of `module,poll100,jitter,blpop` (default all)
//! - `LOCK_SERVER_BIN` (default `/usr/bin/redis-server`), `LOCK_MODULE` (default
//!   `<workspace>/target/release/libredis_lock.so`)

mod chart;
mod cpu;
mod methods;
mod report;
mod run;
mod server;
mod stats;

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use methods::{Method, Scripts, ALL};
use report::RunInfo;
use run::{run_cell, CellResult};
use server::Server;

pub type Error = Box<dyn std::error::Error + Send + Sync>;

struct Config {
    secs: f64,
    ns: Vec<usize>,
    holds: Vec<u64>,
    methods: Vec<Method>,
    server_bin: PathBuf,
    module: PathBuf,
    docs: Option<PathBuf>,
    chart: Option<PathBuf>,
}

fn env_list<T: std::str::FromStr>(var: &str, default: &str) -> Result<Vec<T>, Error> {
    let raw = std::env::var(var).unwrap_or_else(|_| default.to_string());
    raw.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.parse::<T>()
                .map_err(|_| format!("{var}: cannot parse {s:?}").into())
        })
        .collect()
}

fn config() -> Result<Config, Error> {
    let secs: f64 = std::env::var("CONTENTION_SECS")
        .unwrap_or_else(|_| "3".into())
        .parse()
        .map_err(|_| "CONTENTION_SECS must be a number of seconds")?;
    if !(secs > 0.0 && secs <= 3600.0) {
        return Err("CONTENTION_SECS must be in (0, 3600]".into());
    }
    let ns: Vec<usize> = env_list("CONTENTION_N", "1,2,8,64")?;
    if ns.iter().any(|&n| n == 0 || n > 1000) {
        return Err("CONTENTION_N: each N must be 1..=1000".into());
    }
    let holds: Vec<u64> = env_list("CONTENTION_HOLD_MS", "0,1")?;
    let method_ids: Vec<String> = env_list("CONTENTION_METHODS", "module,poll100,jitter,blpop")?;
    let methods = method_ids
        .iter()
        .map(|id| Method::from_id(id).ok_or_else(|| format!("CONTENTION_METHODS: unknown {id:?}")))
        .collect::<Result<Vec<_>, _>>()?;
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let server_bin = std::env::var_os("LOCK_SERVER_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/bin/redis-server"));
    let module = std::env::var_os("LOCK_MODULE")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace.join("target/release/libredis_lock.so"));
    let module = module.canonicalize().map_err(|e| {
        format!(
            "module {}: {e} (run `cargo build --release`)",
            module.display()
        )
    })?;

    let mut docs = None;
    let mut chart = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--docs" => docs = Some(PathBuf::from(args.next().ok_or("--docs needs a path")?)),
            "--chart" => chart = Some(PathBuf::from(args.next().ok_or("--chart needs a path")?)),
            other => return Err(format!("unknown argument {other:?}").into()),
        }
    }
    Ok(Config {
        secs,
        ns,
        holds,
        methods,
        server_bin,
        module,
        docs,
        chart,
    })
}

/// The command line to quote in the docs: `make bench-contention` (with any CONTENTION_*
/// overrides) when run through make, else this program's own argv.
fn command_text() -> String {
    let overrides: Vec<String> = [
        "CONTENTION_SECS",
        "CONTENTION_N",
        "CONTENTION_HOLD_MS",
        "CONTENTION_METHODS",
    ]
    .iter()
    .filter_map(|v| std::env::var(v).ok().map(|x| format!("{v}={x}")))
    .collect();
    if std::env::var_os("CONTENTION_VIA_MAKE").is_some() {
        let mut parts = overrides;
        parts.push("make bench-contention".into());
        parts.join(" ")
    } else {
        let mut parts = overrides;
        parts.extend(std::env::args());
        parts.join(" ")
    }
}

fn machine() -> String {
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let model = fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines().find_map(|l| {
                l.strip_prefix("model name")
                    .map(|r| r.trim_start_matches([' ', '\t', ':']).to_string())
            })
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let load = fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|t| t.split_whitespace().next().map(str::to_string))
        .unwrap_or_else(|| "?".into());
    format!("{cores} cores ({model}), Linux, load average {load} when the run started; clients and server share the cores")
}

fn print_row(c: &CellResult) {
    let s = &c.summary;
    println!(
        "{:<28} N={:<3} c={}ms {:>8.1} cs/s  hand-off p50 {:>7.1} µs p99 {:>8.1} µs (n={:<6}) same {:>3.0}%  cmds/acq {:>6.2}  wait p99 {:>7.1} ms max {:>7.1} ms  jain {:.3}  hold {:.2}/{:.1} ms  other procs {:.2} cores{}{}{}",
        c.method.label(),
        c.n,
        c.hold_ms,
        s.per_second,
        s.handoff_p50_us,
        s.handoff_p99_us,
        s.handoffs,
        s.same_client_again * 100.0,
        s.commands_per_acquisition,
        s.wait_p99_ms,
        s.max_wait_ms,
        s.jain,
        s.hold_mean_ms,
        s.hold_max_ms,
        c.other_cores.unwrap_or(f64::NAN),
        if s.gave_up > 0 { format!("  gave up: {}", s.gave_up) } else { String::new() },
        if s.overlaps > 0 { format!("  OVERLAPS: {}", s.overlaps) } else { String::new() },
        if c.server_commands != c.client_commands {
            format!("  (server counted {} commands, clients {})", c.server_commands, c.client_commands)
        } else {
            String::new()
        },
    );
}

fn main() {
    if let Err(e) = real_main() {
        eprintln!("bench-contention: {e}");
        std::process::exit(1);
    }
}

fn real_main() -> Result<(), Error> {
    let cfg = config()?;
    let started = Instant::now();
    let date = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let machine = machine();
    let server = Server::start(&cfg.server_bin, &cfg.module)?;
    println!(
        "bench-contention: {} on port {}, {} s per cell, N = {:?}, c = {:?} ms",
        server.version, server.port, cfg.secs, cfg.ns, cfg.holds
    );
    let scripts = Scripts::load(&mut server.connect()?)?;
    let duration = Duration::from_secs_f64(cfg.secs);
    // Warm-up (discarded): connections, allocator, CPU frequency.
    run_cell(
        &server,
        &scripts,
        Method::Module,
        2,
        0,
        Duration::from_millis(500),
    )?;

    let mut cells = Vec::new();
    for &hold in &cfg.holds {
        for m in ALL.into_iter().filter(|m| cfg.methods.contains(m)) {
            for &n in &cfg.ns {
                let cell = run_cell(&server, &scripts, m, n, hold, duration)?;
                print_row(&cell);
                cells.push(cell);
            }
        }
    }
    let broken: Vec<&CellResult> = cells.iter().filter(|c| c.summary.overlaps > 0).collect();

    let info = RunInfo {
        date_utc: report::utc_date(date),
        command: command_text(),
        server: server.version.clone(),
        machine,
        secs_per_cell: cfg.secs,
        wall_secs: started.elapsed().as_secs_f64(),
    };
    drop(server);
    if let Some(path) = &cfg.docs {
        let doc = fs::read_to_string(path).unwrap_or_else(|_| "# Benchmarks\n".to_string());
        let out = report::splice(&doc, &report::section(&info, &cells))?;
        fs::write(path, out)?;
        println!("wrote {}", path.display());
    }
    if let Some(path) = &cfg.chart {
        let subtitle = format!(
            "{}, {} s per cell, loopback; {}",
            info.server, info.secs_per_cell, info.date_utc
        );
        chart::draw(path, &cells, &subtitle)?;
        println!("wrote {}", path.display());
    }
    if !broken.is_empty() {
        return Err(format!(
            "{} cell(s) saw two holders at once (overlapping critical sections)",
            broken.len()
        )
        .into());
    }
    Ok(())
}
