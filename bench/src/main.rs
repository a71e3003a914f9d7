//! `redis-lock-bench`: redis-lock against the `SET NX PX` + `EVALSHA` recipe on every
//! server, saved as docs/data/perf.json and rendered into docs/BENCHMARKS.md and
//! docs/perf.png. Subcommands and their `make` targets: `--help`, and the Makefile.

/// `return Err(io::Error::other(format!(...)))`.
macro_rules! bail {
    ($($arg:tt)*) => {
        return Err(std::io::Error::other(format!($($arg)*)))
    };
}

mod callgrind;
mod cluster;
mod config;
mod guarded;
mod keepalive;
mod latency;
mod load;
mod memory;
mod ops;
mod scaling;
mod stats;
mod throughput;

use std::io;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;
use redis_lock_report::perf::{PerfRun, ServerResults};
use redis_lock_testkit::{flavor_of, List, RawConn, ServerBuilder};

use config::{Cli, Command, Config};

/// The module a server has loaded: redis-lock, none (the recipe runs there), the floor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum On {
    Lock,
    Plain,
    Floor,
}

/// The floor module (bench/floor), built by `make bench-floor`.
const FLOOR: &str = "target/release/libredis_lock_floor.so";

/// `name value` pairs: server settings, or environment variables.
pub type Settings<'a> = &'a [(&'a str, &'a str)];

/// A server of a comparison, its label ("Redis 7.0.15"), scripts and the run's settings.
pub struct Server {
    pub kit: redis_lock_testkit::Server,
    pub label: String,
    pub port: u16,
    pub scripts: ops::Scripts,
    pub cfg: Config,
}

impl Server {
    /// Starts `bin` with `on`'s module, settings `extra`, environment `env`, under `wrapper`.
    pub fn start(
        bin: &Path,
        cfg: &Config,
        on: On,
        (extra, env): (Settings, Settings),
        wrapper: &[String],
        ready: Duration,
    ) -> io::Result<Server> {
        let label = flavor_of(bin).map_err(io::Error::other)?.label();
        let b = ServerBuilder::new().bin(bin.to_path_buf());
        let b = match on {
            On::Lock => b.module(&cfg.path(&cfg.module)),
            On::Plain => b.no_module(),
            On::Floor => b.module(&cfg.path(Path::new(FLOOR))),
        };
        let b = extra.iter().fold(b, |b, (k, v)| b.arg(k, v));
        let b = env.iter().fold(b, |b, (k, v)| b.env(k, v));
        let kit = (b
            .arg("maxclients", "15000")
            .wrapper(wrapper)
            .die_with_parent())
        .start_timeout(ready)
        .try_start()
        .map_err(io::Error::other)?;
        let scripts = ops::Scripts::load(&mut kit.try_raw(Duration::from_secs(120))?)?;
        Ok(Server {
            port: kit.port,
            kit,
            label,
            scripts,
            cfg: cfg.clone(),
        })
    }

    pub fn conn(&self) -> io::Result<RawConn> {
        self.kit.try_raw(Duration::from_secs(120))
    }
}

/// One binary three times: with the module, without it, with the floor module.
pub struct Rig {
    pub lock: Server,
    pub plain: Server,
    pub floor: Server,
}

impl Rig {
    fn start(bin: &Path, cfg: &Config) -> io::Result<Rig> {
        let start = |on| Server::start(bin, cfg, on, (&[], &[]), &[], Duration::from_secs(30));
        Ok(Rig {
            lock: start(On::Lock)?,
            plain: start(On::Plain)?,
            floor: start(On::Floor)?,
        })
    }

    pub fn on(&self, on: On) -> &Server {
        match on {
            On::Lock => &self.lock,
            On::Plain => &self.plain,
            On::Floor => &self.floor,
        }
    }
}

fn bench_server(bin: &Path, cfg: &Config, first: bool, date: &str) -> io::Result<ServerResults> {
    let rig = Rig::start(bin, cfg)?;
    let s = &rig.lock;
    eprintln!("== {} ({})", s.label, bin.display());
    let t = Instant::now();
    // Each suite that is asked for gives its field and leaves the servers empty.
    let suite = |name: &str| cfg.has(name);
    let done = |name: &str| {
        for s in [&rig.lock, &rig.plain, &rig.floor] {
            ops::flushall(&mut s.conn()?)?;
        }
        eprintln!("  {name} done at {:.0}s", t.elapsed().as_secs_f64());
        Ok::<_, io::Error>(())
    };
    macro_rules! run {
        ($name:literal, $run:expr) => {
            if suite($name) {
                let r = $run?;
                done($name)?;
                Some(r)
            } else {
                None
            }
        };
    }
    Ok(ServerResults {
        label: s.label.clone(),
        throughput: run!("throughput", throughput::run(&rig)),
        latency: run!("latency", latency::run(&rig)),
        memory: run!("memory", memory::run(s)),
        scaling: run!("scaling", scaling::run(s)),
        guarded: run!("guarded", guarded::run(&rig, first, date)),
    })
}

/// The server the guard and the guarded-write counts run on: the first one (Redis 7.0.15
/// by default).
fn callgrind_bin(cfg: &Config) -> io::Result<PathBuf> {
    (cfg.servers.0.first())
        .map(|b| cfg.path(b))
        .ok_or_else(|| io::Error::other("no server to run callgrind on"))
}

/// The instruction counts on every server (the held-lock levels on the first only).
fn callgrind_all(cfg: &Config, date: &str) -> io::Result<Vec<redis_lock_report::perf::Callgrind>> {
    (cfg.servers.0.iter().enumerate())
        .map(|(i, bin)| callgrind::run(&cfg.path(bin), cfg, date, i == 0))
        .collect()
}

/// Saves the run and renders the docs next to the JSON.
fn save_and_render(cfg: &Config, run: &PerfRun) -> io::Result<()> {
    let json = cfg.json();
    redis_lock_report::save(&json, run).map_err(io::Error::other)?;
    eprintln!("saved {}", json.display());
    render(&json, run)
}

/// Renders every document under the JSON's repository; when another document's data
/// cannot be rendered (not this benchmark's), at least the perf section and its chart.
fn render(json: &Path, run: &PerfRun) -> io::Result<()> {
    let root = json.ancestors().nth(3).unwrap_or(Path::new("."));
    match redis_lock_report::render_all(root) {
        Ok(wrote) => eprintln!("rendered {wrote:?}"),
        Err(e) => {
            eprintln!("rendering every document failed ({e}); rendering the perf section only");
            let md = root.join("docs/BENCHMARKS.md");
            let text = std::fs::read_to_string(&md).unwrap_or_else(|_| "# Benchmarks\n".into());
            let section = redis_lock_report::perf::perf_section(run).map_err(io::Error::other)?;
            let text =
                redis_lock_report::splice(&text, "perf", &section).map_err(io::Error::other)?;
            std::fs::write(&md, text)?;
            let png = root.join("docs/perf.png");
            redis_lock_report::chart::perf(&png, run).map_err(io::Error::other)?;
            eprintln!("rendered {} and {}", md.display(), png.display());
        }
    }
    Ok(())
}

fn all(cfg: &Config) -> io::Result<()> {
    let started = Instant::now();
    let date = redis_lock_report::fmt::now_utc();
    let load_start = redis_lock_report::fmt::loadavg();
    let servers = (cfg.servers.0.iter().enumerate())
        .map(|(i, bin)| bench_server(&cfg.path(bin), cfg, i == 0, &date))
        .collect::<io::Result<_>>()?;
    let cg = |suite| cfg.has(suite).then(|| callgrind_bin(cfg)).transpose();
    let callgrind = match cfg.has("callgrind") {
        true => callgrind_all(cfg, &date)?,
        false => vec![],
    };
    let guarded_callgrind = cg("guarded")?.map(|b| guarded::callgrind(&b, cfg, &date));
    let guarded_callgrind = guarded_callgrind.transpose()?;
    let keepalive = cg("keepalive")?.map(|b| keepalive::run(&b, cfg, &date));
    let keepalive = keepalive.transpose()?;
    let run = PerfRun {
        date,
        minutes: started.elapsed().as_secs_f64() / 60.0,
        machine: redis_lock_report::fmt::machine(),
        load_start,
        load_end: redis_lock_report::fmt::loadavg(),
        settings: serde_json::to_value(cfg).map_err(io::Error::other)?,
        release_lua: ops::RELEASE_LUA.into(),
        extend_lua: ops::EXTEND_LUA.into(),
        servers,
        callgrind,
        guarded_callgrind,
        keepalive,
    };
    eprintln!("{}", redis_lock_report::perf::headline(&run));
    save_and_render(cfg, &run)
}

/// Only the callgrind tables, on every server: replaces them in the saved run.
fn callgrind_only(cfg: &Config, save_baseline: bool) -> io::Result<()> {
    let date = redis_lock_report::fmt::now_utc();
    let cg = callgrind_all(cfg, &date)?;
    if let (true, Some(first)) = (save_baseline, cg.first()) {
        callgrind::write_baseline(&cfg.baseline(), first)?;
        eprintln!("baseline written to {}", cfg.baseline().display());
    }
    let mut run: PerfRun = redis_lock_report::load(&cfg.json()).map_err(io::Error::other)?;
    run.callgrind = cg;
    eprintln!("{}", redis_lock_report::perf::callgrind_block(&run));
    eprintln!("{}", redis_lock_report::perf::headline(&run));
    save_and_render(cfg, &run)
}

/// Only issue 23's guarded writes, observe hand-offs and their instruction counts,
/// replaced in the saved run (whose section says when each part was measured).
fn guarded_only(cfg: &Config) -> io::Result<()> {
    let date = redis_lock_report::fmt::now_utc();
    let mut run: PerfRun = redis_lock_report::load(&cfg.json()).map_err(io::Error::other)?;
    let only = Config {
        suites: List(vec!["guarded".into()]),
        ..cfg.clone()
    };
    for (i, bin) in cfg.servers.0.iter().enumerate() {
        let r = bench_server(&cfg.path(bin), &only, i == 0, &date)?;
        match run.servers.iter_mut().find(|s| s.label == r.label) {
            Some(s) => s.guarded = r.guarded,
            None => run.servers.push(r),
        }
    }
    run.guarded_callgrind = Some(guarded::callgrind(&callgrind_bin(cfg)?, cfg, &date)?);
    // The settings this part ran with, beside those of the run it joins.
    let now = serde_json::to_value(cfg).map_err(io::Error::other)?;
    if let Some(saved) = run.settings.as_object_mut() {
        for k in ["obs_handoffs", "obs_watchers", "poll_handoffs", "poll_ms"] {
            saved.insert(k.into(), now[k].clone());
        }
    }
    save_and_render(cfg, &run)
}

/// Only issue 30's keepalive comparison, replaced in the saved run.
fn keepalive_only(cfg: &Config) -> io::Result<()> {
    let date = redis_lock_report::fmt::now_utc();
    let mut run: PerfRun = redis_lock_report::load(&cfg.json()).map_err(io::Error::other)?;
    run.keepalive = Some(keepalive::run(&callgrind_bin(cfg)?, cfg, &date)?);
    save_and_render(cfg, &run)
}

/// Raises the open-file limit (the servers inherit it) to its hard maximum, returned:
/// 10^4 waiters need 10^4 connections on both ends.
fn raise_fd_limit() -> u64 {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit on a valid rlimit struct of ours.
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
    let cli = Cli::parse();
    let mut cfg = cli.cfg;
    let usable = raise_fd_limit().saturating_sub(500);
    if cfg.waiters > usable {
        eprintln!(
            "open-file limit: measuring {usable} waiters instead of {}",
            cfg.waiters
        );
        cfg.waiters = usable;
    }
    let result = match cli.command {
        None | Some(Command::All) => all(&cfg),
        Some(Command::Guarded) => guarded_only(&cfg),
        Some(Command::Keepalive) => keepalive_only(&cfg),
        Some(Command::Cluster) => cluster::run(&cfg),
        Some(Command::Callgrind { save_baseline }) => callgrind_only(&cfg, save_baseline),
        Some(Command::Guard { save_baseline }) => callgrind_bin(&cfg)
            .and_then(|bin| callgrind::guard(&bin, &cfg, save_baseline.as_deref())),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("benchmark failed: {e}");
            ExitCode::FAILURE
        }
    }
}
