//! redis-lock-reliability: fault-injection runs against real servers with the module
//! loaded. `run` executes the scenarios, prints one line per property and a closing
//! `reliability: N passed, M failed`, exits non-zero when a target is missed or a
//! scenario could not run, and (with `--out`) writes docs/RELIABILITY.md.

// `args![..]` builds a Vec so that commands can be extended; passing one by reference
// is what clippy's useless_vec flags.
#![allow(clippy::useless_vec)]

mod checker;
mod common;
mod proc;
mod report;
mod resp;
mod rng;
mod scenarios;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use common::{Env, Outcome, Status};

const USAGE: &str = "usage:
  redis-lock-reliability run [--short] [--scale F] [--seed N] [--only KEY,...] [--out FILE]
                             [--server BIN] [--module SO] [--keep]
      KEY: mutex durability failover stale clock fuzz memory
  redis-lock-reliability stale-holder ...   (internal: the paused holder of scenario 4)";

pub const SCENARIOS: [&str; 7] = [
    "mutex",
    "durability",
    "failover",
    "stale",
    "clock",
    "fuzz",
    "memory",
];

fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    match argv.first().map(String::as_str) {
        Some("run") => run(&argv[1..]),
        Some("stale-holder") => scenarios::stale::holder_main(&argv[1..]),
        _ => {
            eprintln!("{USAGE}");
            ExitCode::from(2)
        }
    }
}

struct Opts {
    env: Env,
    only: Vec<String>,
    out: Option<PathBuf>,
    keep: bool,
}

fn parse(args: &[String]) -> Result<Opts, String> {
    let repo = std::env::current_dir().map_err(|e| e.to_string())?;
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let seed = common::unix_ms() as u64 ^ u64::from(std::process::id());
    let mut env = Env {
        server_bin: std::env::var_os("RELIABILITY_SERVER")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("/usr/bin/redis-server")),
        module: repo.join("target/release/libredis_lock.so"),
        shim: repo.join("target/reliability/libclockshift.so"),
        exe,
        work: std::env::temp_dir().join(format!("redis-lock-reliability-{}", std::process::id())),
        scale: 1.0,
        short: false,
        seed,
        repo,
    };
    let mut only = Vec::new();
    let mut out = None;
    let mut keep = false;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut val = || it.next().cloned().ok_or(format!("{a} needs a value"));
        match a.as_str() {
            "--short" => env.short = true,
            "--keep" => keep = true,
            "--scale" => {
                env.scale = val()?.parse().map_err(|_| "bad --scale".to_string())?;
                if !(0.01..=100.0).contains(&env.scale) {
                    return Err("--scale must be within 0.01..100".into());
                }
            }
            "--seed" => env.seed = val()?.parse().map_err(|_| "bad --seed".to_string())?,
            "--only" => {
                for k in val()?.split(',').filter(|k| !k.is_empty()) {
                    if !SCENARIOS.contains(&k) {
                        return Err(format!("unknown scenario {k}"));
                    }
                    only.push(k.to_string());
                }
            }
            "--out" => out = Some(PathBuf::from(val()?)),
            "--server" => env.server_bin = PathBuf::from(val()?),
            "--module" => env.module = PathBuf::from(val()?),
            _ => return Err(format!("unknown argument {a}")),
        }
    }
    // Servers run with their data directory as working directory. Made absolute
    // without resolving links: /usr/bin/redis-server is a link that acts on argv[0].
    for p in [&mut env.server_bin, &mut env.module] {
        if p.is_relative() {
            *p = env.repo.join(&*p);
        }
    }
    Ok(Opts {
        env,
        only,
        out,
        keep,
    })
}

fn run(args: &[String]) -> ExitCode {
    let opts = match parse(args) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("{e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let env = &opts.env;
    if !env.module.is_file() {
        eprintln!(
            "module not found at {} (cargo build --release)",
            env.module.display()
        );
        return ExitCode::from(2);
    }
    let _ = std::fs::create_dir_all(&env.work);
    println!(
        "reliability: {} run, scale {}, seed {}, server {}, work dir {}",
        if env.short { "short" } else { "full" },
        env.scale,
        env.seed,
        env.server_bin.display(),
        env.work.display()
    );
    let started = common::unix_ms();
    let mut outcomes: Vec<Outcome> = Vec::new();
    for (i, key) in SCENARIOS.iter().enumerate() {
        if !opts.only.is_empty() && !opts.only.iter().any(|k| k == key) {
            continue;
        }
        println!("== [{}] {key} ...", i + 1);
        let t = Instant::now();
        let mut o = match *key {
            "mutex" => scenarios::mutex::run(env),
            "durability" => scenarios::durability::run(env),
            "failover" => scenarios::failover::run(env),
            "stale" => scenarios::stale::run(env),
            "clock" => scenarios::clock::run(env),
            "fuzz" => scenarios::fuzz::run(env),
            _ => scenarios::memory::run(env),
        };
        o.id = i as u32 + 1;
        o.key = key;
        o.secs = t.elapsed().as_secs_f64();
        let verdict = match &o.status {
            Status::Pass => "PASS".to_string(),
            Status::Fail(w) => format!("FAIL ({w})"),
            Status::NotRun(w) => format!("NOT RUN ({w})"),
        };
        println!(
            "== [{}] {key}: {verdict} -- {} [{}] in {:.0} s",
            i + 1,
            o.figure,
            o.trials,
            o.secs
        );
        for n in &o.notes {
            println!("     {n}");
        }
        outcomes.push(o);
    }
    let passed = outcomes.iter().filter(|o| o.status == Status::Pass).count();
    let failed = outcomes.len() - passed;
    if let Some(out) = &opts.out {
        let text = report::render(env, &outcomes, started);
        match std::fs::write(out, text) {
            Ok(()) => println!("wrote {}", out.display()),
            Err(e) => {
                eprintln!("cannot write {}: {e}", out.display());
                return ExitCode::from(1);
            }
        }
    }
    if !opts.keep {
        let _ = std::fs::remove_dir_all(&env.work);
    }
    for o in &outcomes {
        if let Status::NotRun(w) = &o.status {
            println!("NOT RUN (counted as failed): {} -- {w}", o.key);
        }
    }
    println!("reliability: {passed} passed, {failed} failed");
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}
