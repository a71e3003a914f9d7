//! redis-lock-reliability: fault-injection runs against real servers with the module (see
//! the Makefile's `reliability` targets); exits non-zero when a row fails or cannot run.

mod checker;
mod common;
mod linear;
mod link;
mod scenarios;
mod workload;

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::Instant;

use clap::{Args, Parser, Subcommand};
use redis_lock_report::reliability::{Cells, ReliabilityRun, RowRun, ServerId};

use common::{unix_ms, Env, Outcome, Status};

const MODULE: &str = "target/release/libredis_lock.so";
const SERVER: &str = "/usr/bin/redis-server";

#[derive(Parser)]
#[command(about = "Fault-injection runs against real servers with the module loaded")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run the scenarios.
    Run(RunArgs),
    /// Internal: the paused holder of the stale scenario.
    StaleHolder { args: Vec<String> },
    /// Internal: a session holder of the sessions scenario (SIGKILLed).
    SessionHolder { args: Vec<String> },
}

#[derive(Args)]
struct RunArgs {
    /// Fewer operations, the same code and assertions (CI).
    #[arg(long)]
    short: bool,
    /// Multiplies every count and time budget.
    #[arg(long, env = "SCALE", default_value_t = 1.0)]
    scale: f64,
    /// The run's random seed (default: from the clock; printed by every run).
    #[arg(long, env = "SEED")]
    seed: Option<u64>,
    /// Some scenarios only (mutex, durability, leases, failover, stale, guarded, clock,
    /// fuzz, memory, chaos, kinds, sessions).
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// Save the outcomes here and render docs/RELIABILITY.md next to it (DIR/../..).
    /// With --only, the rows of those scenarios replace theirs in the file and the
    /// other rows stay as they are.
    #[arg(long)]
    json: Option<PathBuf>,
    #[arg(long, env = "RELIABILITY_SERVER", default_value = SERVER)]
    server: PathBuf,
    /// The servers of the scenarios that run on every server (leases, guarded, clock,
    /// chaos, kinds, sessions), comma separated; default: --server.
    #[arg(long, env = "RELIABILITY_SERVERS", value_delimiter = ',')]
    servers: Vec<PathBuf>,
    #[arg(long, env = "LOCK_MODULE", default_value = MODULE)]
    module: PathBuf,
}

fn main() -> ExitCode {
    match Cli::parse().command {
        Cmd::Run(a) => run(a),
        Cmd::StaleHolder { args } => scenarios::stale::holder_main(&args),
        Cmd::SessionHolder { args } => scenarios::sessions::holder_main(&args),
    }
}

/// The output of a command, "" when it fails.
fn sh(cmd: &str, args: &[&str]) -> String {
    Command::new(cmd)
        .args(args)
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

fn env_of(a: &RunArgs) -> Result<Env, String> {
    let repo = std::env::current_dir().map_err(|e| e.to_string())?;
    if !(0.01..=100.0).contains(&a.scale) {
        return Err("--scale must be within 0.01..100".into());
    }
    let known = |k: &&String| scenarios::ALL.iter().any(|s| s.0 == k.as_str());
    if let Some(k) = a.only.iter().find(|k| !known(k)) {
        return Err(format!("unknown scenario {k}"));
    }
    // Servers run with their data directory as working directory. Made absolute (join
    // keeps an absolute path) without resolving links: /usr/bin/redis-server is a link
    // that acts on argv[0].
    let abs = |p: &Path| repo.join(p);
    let servers: Vec<PathBuf> = if a.servers.is_empty() {
        vec![abs(&a.server)]
    } else {
        a.servers.iter().map(|p| abs(p)).collect()
    };
    if let Some(p) = servers.iter().find(|p| !p.is_file()) {
        return Err(format!(
            "server binary {} not found (make deps)",
            p.display()
        ));
    }
    let module = abs(&a.module);
    if !module.is_file() {
        let m = module.display();
        return Err(format!("module not found at {m} (cargo build --release)"));
    }
    Ok(Env {
        server_bin: abs(&a.server),
        servers,
        module,
        shim: repo.join("target/reliability/libclockshift.so"),
        exe: std::env::current_exe().map_err(|e| e.to_string())?,
        work: std::env::temp_dir().join(format!("redis-lock-reliability-{}", std::process::id())),
        scale: a.scale,
        short: a.short,
        seed: a
            .seed
            .unwrap_or(unix_ms() as u64 ^ u64::from(std::process::id())),
        repo,
    })
}

fn run(a: RunArgs) -> ExitCode {
    let env = match env_of(&a) {
        Ok(e) => e,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let _ = std::fs::create_dir_all(&env.work);
    if env.short {
        link::short_run_grace();
    }
    let kind = if env.short { "short" } else { "full" };
    let (bin, work) = (env.server_bin.display(), env.work.display());
    let (scale, seed) = (env.scale, env.seed);
    println!("reliability: {kind} run, scale {scale}, seed {seed}, server {bin}, work dir {work}");
    let started = unix_ms();
    let mut outcomes: Vec<Outcome> = Vec::new();
    for (i, &(key, title, target, run, every_server)) in scenarios::ALL.iter().enumerate() {
        if !a.only.is_empty() && !a.only.iter().any(|k| k == key) {
            continue;
        }
        let servers = match every_server {
            true => env.servers.clone(),
            false => vec![env.server_bin.clone()],
        };
        for bin in servers {
            let mut env = env.clone();
            env.server_bin = bin;
            let mut o = Outcome::new(i as u32 + 1, key, title, target);
            if every_server {
                let bin = &env.server_bin;
                let label = redis_lock_testkit::flavor_of(bin).map(|f| f.label());
                let label = label.unwrap_or_else(|_| bin.display().to_string());
                // Relative to the repository when inside it.
                let path = bin.strip_prefix(&env.repo).unwrap_or(bin);
                let path = path.display().to_string();
                o.server = Some(ServerId { label, path });
            }
            println!("== [{}] {} ...", i + 1, o.full_title());
            let t = Instant::now();
            if let Err(e) = run(&env, &mut o) {
                o.fail(e);
            }
            o.secs = t.elapsed().as_secs_f64();
            let verdict = match &o.status {
                Status::Pass => "PASS".to_string(),
                Status::Fail(w) => format!("FAIL ({w})"),
                Status::NotRun(w) => format!("NOT RUN ({w})"),
            };
            let c = o.cells().unwrap_or_else(|e| Cells {
                figure: format!("(the row's template failed: {e})"),
                trials: String::new(),
                notes: o.notes.clone(),
            });
            let (n, title, secs, figure, trials) =
                (i + 1, o.full_title(), o.secs, c.figure, c.trials);
            println!("== [{n}] {title}: {verdict} -- {figure} [{trials}] in {secs:.0} s");
            for n in &c.notes {
                println!("     {n}");
            }
            outcomes.push(o);
        }
    }
    let passed = outcomes.iter().filter(|o| o.status == Status::Pass).count();
    let failed = outcomes.len() - passed;
    if let Some(json) = &a.json {
        if let Err(e) = save(&env, json, started, &outcomes, &a.only) {
            eprintln!("cannot save {}: {e}", json.display());
            return ExitCode::from(1);
        }
    }
    let _ = std::fs::remove_dir_all(&env.work);
    for o in &outcomes {
        if let Status::NotRun(w) = &o.status {
            println!("NOT RUN (counted as failed): {} -- {w}", o.full_title());
        }
    }
    println!("reliability: {passed} passed, {failed} failed");
    ExitCode::from(u8::from(failed > 0))
}

fn save(
    env: &Env,
    json: &Path,
    started: i64,
    outcomes: &[Outcome],
    only: &[String],
) -> Result<(), redis_lock_report::Error> {
    let (date, time) = redis_lock_report::fmt::utc(started);
    let repo = env.repo.to_string_lossy();
    let commit = sh("git", &["-C", &repo, "rev-parse", "--short", "HEAD"]);
    let dirty = !sh("git", &["-C", &repo, "status", "--porcelain", "--", "src"]).is_empty();
    let (short, scale, seed) = (env.short, env.scale, env.seed);
    let run = if only.is_empty() {
        let version = sh(&env.server_bin.to_string_lossy(), &["--version"]);
        let fs = sh("df", &["--output=fstype", &env.work.to_string_lossy()]);
        let renumbered = |(i, o): (usize, &Outcome)| Outcome {
            id: i as u32 + 1,
            ..o.clone()
        };
        ReliabilityRun {
            date,
            time,
            short,
            scale,
            seed,
            minutes: (unix_ms() - started) as f64 / 60_000.0,
            server_path: env.server_bin.display().to_string(),
            server_version: version
                .split_whitespace()
                .take(3)
                .collect::<Vec<_>>()
                .join(" "),
            commit,
            dirty,
            cpus: std::thread::available_parallelism().map_or(0, |n| n.get()),
            kernel: sh("uname", &["-r"]),
            fs: fs.lines().last().unwrap_or("").to_string(),
            outcomes: outcomes.iter().enumerate().map(renumbered).collect(),
        }
    } else {
        // Some scenarios only: their rows replace theirs in the saved run.
        let mut run: ReliabilityRun = redis_lock_report::load(json)?;
        let only = only.to_vec();
        let row_run = RowRun {
            date,
            time,
            short,
            scale,
            seed,
            commit,
            dirty,
            only,
        };
        let order = |key: &str| scenarios::ALL.iter().position(|d| d.0 == key);
        let order = |key: &str| order(key).unwrap_or(usize::MAX);
        run.merge(outcomes.to_vec(), row_run, order);
        run
    };
    redis_lock_report::save(json, &run)?;
    // docs/RELIABILITY.md next to DIR/../.. of `json` (the other documents: `make docs`).
    let root = json.ancestors().nth(3).unwrap_or(Path::new("."));
    let out = root.join("docs/RELIABILITY.md");
    std::fs::write(&out, redis_lock_report::reliability::render(&run)?)?;
    println!("wrote {}", out.display());
    Ok(())
}
