//! `make bench-contention`: N clients contend for one lock (a mutex, `SHARED`, `LIMIT n`)
//! on a server this program starts, the module's `BLOCK` against today's waiting recipes;
//! saves docs/data/contention.json and renders the docs from it.

mod cpu;
mod methods;
mod run;
mod stats;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::{CommandFactory, Parser};
use redis_lock_report::contention::{ContentionRun, RunInfo};
use redis_lock_testkit::{flavor_of, List, ServerBuilder};

use methods::{Family, Method, Scripts};
use run::{Bench, Shape};

pub type Error = Box<dyn std::error::Error + Send + Sync>;

const MODULE: &str = "target/release/libredis_lock.so";

#[derive(Parser, Debug)]
#[command(about = "N clients contend for one lock: the module's BLOCK against polling recipes")]
struct Config {
    /// Seconds per cell.
    #[arg(long, env = "CONTENTION_SECS", default_value_t = 3.0)]
    secs: f64,
    /// Client counts.
    #[arg(long, env = "CONTENTION_N", default_value = "1,2,8,64")]
    n: List<usize>,
    /// Critical-section lengths in ms.
    #[arg(long, env = "CONTENTION_HOLD_MS", default_value = "0,1")]
    hold_ms: List<u64>,
    /// Methods of the mutex cells: module, poll100, jitter, blpop [default: all].
    #[arg(long, env = "CONTENTION_METHODS")]
    methods: Option<List<String>>,
    /// Which cells: mutex (N clients, one lock), rw (readers and writers), sem (semaphore).
    #[arg(long, env = "CONTENTION_CELLS", default_value = "mutex,rw,sem")]
    cells: List<String>,
    /// Readers and writers of the rw cells.
    #[arg(long, env = "CONTENTION_RW", default_value = "8,1")]
    rw: List<usize>,
    /// Methods of the rw cells: shared, module, jitter, rw-script, rw-script-wfirst
    /// [default: all].
    #[arg(long, env = "CONTENTION_RW_METHODS")]
    rw_methods: Option<List<String>>,
    /// Clients and permits (LIMIT) of the sem cells.
    #[arg(long, env = "CONTENTION_SEM", default_value = "16,4")]
    sem: List<usize>,
    /// Methods of the sem cells: limit, zset [default: all].
    #[arg(long, env = "CONTENTION_SEM_METHODS")]
    sem_methods: Option<List<String>>,
    #[arg(long, env = "LOCK_SERVER_BIN", default_value = "/usr/bin/redis-server")]
    server: PathBuf,
    #[arg(long, env = "LOCK_MODULE", default_value = MODULE)]
    module: PathBuf,
    /// Where the cells are saved; the docs are rendered next to it (DIR/../..).
    #[arg(long, env = "CONTENTION_JSON", default_value = redis_lock_report::CONTENTION_JSON)]
    json: PathBuf,
    /// How the run was started, for the docs (`make bench-contention` sets it).
    #[arg(long, env = "CONTENTION_COMMAND")]
    command: Option<String>,
}

fn machine() -> String {
    let load = redis_lock_report::fmt::loadavg();
    let load = load.split(' ').next().unwrap_or("?");
    let m = redis_lock_report::fmt::machine();
    format!(
        "{m}, Linux, load average {load} when the run started; clients and server share the cores"
    )
}

fn main() {
    if let Err(e) = real_main() {
        eprintln!("bench-contention: {e}");
        std::process::exit(1);
    }
}

fn real_main() -> Result<(), Error> {
    let cfg = Config::parse();
    if !(cfg.secs > 0.0 && cfg.secs <= 3600.0) {
        return Err("--secs must be in (0, 3600]".into());
    }
    if cfg.n.0.iter().any(|&n| n == 0 || n > 1000) {
        return Err("--n: each N must be 1..=1000".into());
    }
    let families = cfg
        .cells
        .0
        .iter()
        .map(|id| Family::from_id(id).ok_or_else(|| format!("unknown cells {id:?}")))
        .collect::<Result<Vec<_>, _>>()?;
    // A family's methods: those asked for (all by default), in the family's own order.
    let pick = |family: Family, ids: &Option<List<String>>| -> Result<Vec<Method>, Error> {
        if !families.contains(&family) {
            return Ok(Vec::new());
        }
        let asked = ids.iter().flat_map(|l| &l.0);
        if let Some(id) = asked
            .clone()
            .find(|id| Method::from_id(family, id).is_none())
        {
            return Err(format!("unknown {} method {id:?}", family.id()).into());
        }
        let wanted = |m: &Method| ids.is_none() || asked.clone().any(|id| id == m.id());
        Ok(family.methods().iter().copied().filter(wanted).collect())
    };
    let methods = pick(Family::Mutex, &cfg.methods)?;
    let rw_methods = pick(Family::ReadWrite, &cfg.rw_methods)?;
    let sem_methods = pick(Family::Semaphore, &cfg.sem_methods)?;
    let rw_shape = match cfg.rw.0[..] {
        [r, w] if r + w > 0 && r + w <= 1000 => Shape::read_write(r, w),
        _ => return Err("--rw: READERS,WRITERS, 1..=1000 clients in all".into()),
    };
    let sem_shape = match cfg.sem.0[..] {
        [n, limit] if (1..=1000).contains(&n) && (1..=1000).contains(&limit) => {
            Shape::semaphore(n, limit as u32)
        }
        _ => return Err("--sem: CLIENTS,LIMIT, each 1..=1000".into()),
    };
    let started = Instant::now();
    let date = redis_lock_report::fmt::now_utc();
    let machine = machine();
    let label = flavor_of(&cfg.server)?.label();
    let server = ServerBuilder::new()
        .bin(cfg.server.clone())
        .module(&cfg.module)
        .try_start()?;
    println!(
        "bench-contention: {label} on port {}, {} s per cell, N = {:?}, c = {:?} ms",
        server.port, cfg.secs, cfg.n.0, cfg.hold_ms.0
    );
    let scripts = Scripts::load(&mut run::connect(&server)?)?;
    let bench = Bench {
        server: &server,
        scripts: &scripts,
        duration: Duration::from_secs_f64(cfg.secs),
    };
    // Warm-up (discarded): connections, allocator, CPU frequency.
    let warm_up = Bench {
        duration: Duration::from_millis(500),
        ..bench
    };
    warm_up.cell(Method::Module, &Shape::mutex(2), 0)?;

    // The mutex cells for every N, then the readers/writers and the semaphore cells.
    let mutex: Vec<Shape> = cfg.n.0.iter().map(|&n| Shape::mutex(n)).collect();
    let groups = [
        (mutex, methods),
        (vec![rw_shape], rw_methods),
        (vec![sem_shape], sem_methods),
    ];
    let mut cells = Vec::new();
    for (shapes, group_methods) in &groups {
        for &hold in &cfg.hold_ms.0 {
            for &m in group_methods {
                for shape in shapes {
                    cells.push(bench.cell(m, shape, hold)?);
                    run::print_row(cells.last().ok_or("no cell")?);
                }
            }
        }
    }
    drop(server);
    // A grant against the rule is a bug (in the module or this tool), except the sorted-set
    // semaphore's over-admission: the recipe's own (ranks from the clients' clocks).
    let broken = (cells.iter())
        .filter(|c| c.summary.violations > 0 && c.method != Method::ZsetPoll.id())
        .count();
    // The command to quote in the docs, with any CONTENTION_* overrides in front.
    let mut command: Vec<String> = Config::command()
        .get_arguments()
        .filter_map(|a| a.get_env()?.to_str())
        .filter(|v| {
            v.starts_with("CONTENTION_") && *v != "CONTENTION_JSON" && *v != "CONTENTION_COMMAND"
        })
        .filter_map(|v| std::env::var(v).ok().map(|x| format!("{v}={x}")))
        .collect();
    match cfg.command {
        Some(c) => command.push(c),
        None => command.extend(std::env::args()),
    }
    let command = command.join(" ");
    let run = ContentionRun {
        info: RunInfo {
            date_utc: date,
            command,
            server: label,
            machine,
            secs_per_cell: cfg.secs,
            wall_secs: started.elapsed().as_secs_f64(),
            signal_expire_ms: methods::SIGNAL_EXPIRE_MS,
        },
        cells,
    };
    redis_lock_report::save(&cfg.json, &run)?;
    let root = cfg.json.ancestors().nth(3).unwrap_or(Path::new("."));
    for f in redis_lock_report::render_all(root)? {
        println!("wrote {}", f.display());
    }
    if broken > 0 {
        return Err(format!(
            "{broken} cell(s) saw more holders at once than the lock allows (overlapping critical sections)"
        )
        .into());
    }
    Ok(())
}
