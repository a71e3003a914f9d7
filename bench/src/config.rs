//! Settings: every size and duration is an option with a `BENCH_*` variable and a default.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use redis_lock_testkit::List;

#[derive(Parser, Debug)]
#[command(
    about = "redis-lock against the SET NX PX + EVALSHA recipe; writes docs/data/perf.json and renders the docs"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub cfg: Config,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Every suite on every server (make bench).
    All,
    /// Only issue 23's guarded writes, observe hand-offs and their instruction counts.
    Guarded,
    /// Only issue 30's keepalive traffic, a session against per-lock renewal.
    Keepalive,
    /// Instructions per command only (make bench-callgrind).
    Callgrind {
        /// Also record the counts as the "before" column.
        #[arg(long)]
        save_baseline: bool,
    },
    /// Issue 27's cluster figures: 1 and 3 primaries, slots arriving (make bench-cluster).
    Cluster,
    /// The instruction-count check of `make test` (make perf-guard).
    Guard {
        /// Write the measured counts as the new baseline, giving the reason.
        #[arg(long, value_name = "REASON")]
        save_baseline: Option<String>,
    },
}

fn positive(s: &str) -> Result<usize, String> {
    match s.trim().parse() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(format!("not a positive number: {s}")),
    }
}

/// Held-lock levels, as measured: the fill spreads keys over 4 connections.
fn levels(s: &str) -> Result<List<u64>, String> {
    let levels: List<u64> = s.parse()?;
    Ok(List(levels.0.iter().map(|n| (n / 4).max(1) * 4).collect()))
}

#[derive(Args, Debug, Clone, serde::Serialize)]
pub struct Config {
    /// Rounds of A/B alternation (throughput, latency, scaling).
    #[arg(long, env = "BENCH_ROUNDS", default_value_t = 5, value_parser = positive)]
    pub rounds: usize,
    #[arg(long, env = "BENCH_CLIENTS", default_value_t = 50, value_parser = positive)]
    pub clients: usize,
    /// Commands per throughput run, unpipelined and with pipeline 16.
    #[arg(long, env = "BENCH_OPS_P1", default_value_t = 50_000)]
    pub ops_p1: u64,
    #[arg(long, env = "BENCH_OPS_P16", default_value_t = 400_000)]
    pub ops_p16: u64,
    /// ACQUIRE/RELEASE pairs per latency round and side.
    #[arg(long, env = "BENCH_LAT_OPS", default_value_t = 4_000)]
    pub lat_ops: u64,
    /// Locks for the bytes-per-lock measurement.
    #[arg(long, env = "BENCH_MEM_LOCKS", default_value_t = 1_000_000)]
    pub mem_locks: u64,
    /// Blocked waiters (memory and scaling) and the locks they wait on.
    #[arg(long, env = "BENCH_WAITERS", default_value_t = 10_000)]
    pub waiters: u64,
    #[arg(long, env = "BENCH_WAIT_LOCKS", default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..))]
    pub wait_locks: u64,
    /// Held-lock levels of the scaling curve.
    #[arg(long, env = "BENCH_LEVELS", default_value = "1000,100000,1000000", value_parser = levels)]
    pub levels: List<u64>,
    #[arg(long, env = "BENCH_HANDOFFS", default_value_t = 200)]
    pub handoffs: usize,
    #[arg(long, env = "BENCH_EXPIRIES", default_value_t = 30)]
    pub expiries: usize,
    /// Commands per callgrind phase, and the held-lock levels it also measures.
    #[arg(long, env = "BENCH_CG_OPS", default_value_t = 20_000)]
    pub cg_ops: u64,
    #[arg(long, env = "BENCH_CG_LEVELS", default_value = "1000,10000,100000", value_parser = levels)]
    pub cg_levels: List<u64>,
    /// Observe hand-offs per watcher count (fewer above 100 watchers), the watcher
    /// counts; hand-offs per polling interval of the polling alternative, intervals (ms).
    #[arg(long, env = "BENCH_OBS_HANDOFFS", default_value_t = 2000, value_parser = positive)]
    pub obs_handoffs: usize,
    #[arg(long, env = "BENCH_OBS_WATCHERS", default_value = "0,1,100,1000")]
    pub obs_watchers: List<u64>,
    #[arg(long, env = "BENCH_POLL_HANDOFFS", default_value_t = 60)]
    pub poll_handoffs: usize,
    #[arg(long, env = "BENCH_POLL_MS", default_value = "10,100")]
    pub poll_ms: List<u64>,
    /// Suites to run (guarded: also its instruction counts; keepalive: on the first
    /// server, under callgrind).
    #[arg(
        long,
        env = "BENCH_SUITES",
        default_value = "throughput,latency,memory,scaling,guarded,callgrind,keepalive"
    )]
    pub suites: List<String>,
    /// Server binaries, in report order.
    #[arg(
        long,
        env = "BENCH_SERVERS",
        default_value = "/usr/bin/redis-server,.servers/redis-8.2.3/redis-server,.servers/valkey-8.1.8/valkey-server,.servers/valkey-9.1.2/valkey-server"
    )]
    pub servers: List<PathBuf>,
    #[arg(
        long,
        env = "LOCK_MODULE",
        default_value = "target/release/libredis_lock.so"
    )]
    pub module: PathBuf,
    /// The repository: docs/ and bench/callgrind-baseline.tsv are under it.
    #[arg(long, env = "BENCH_ROOT", default_value = ".")]
    pub root: PathBuf,
    /// Where the measurements go (default ROOT/docs/data/perf.json); docs render beside.
    #[arg(long, env = "BENCH_JSON")]
    pub json: Option<PathBuf>,
    /// Cluster part: seconds per measurement (per state where slots move or not),
    /// client threads of the 1 and 3 primary loops, the windows in which slots move or
    /// not in turn (ms), the pause between two slot moves (ms), where to save (default
    /// ROOT/docs/data/cluster.json).
    #[arg(long, env = "BENCH_CLUSTER_SECS", default_value_t = 6.0)]
    pub cluster_secs: f64,
    #[arg(long, env = "BENCH_CLUSTER_CLIENTS", default_value_t = 8, value_parser = positive)]
    pub cluster_clients: usize,
    #[arg(long, env = "BENCH_CLUSTER_WINDOW_MS", default_value_t = 200, value_parser = clap::value_parser!(u64).range(10..))]
    pub cluster_window_ms: u64,
    #[arg(long, env = "BENCH_CLUSTER_GAP_MS", default_value_t = 3)]
    pub cluster_gap_ms: u64,
    #[arg(long, env = "BENCH_CLUSTER_JSON")]
    pub cluster_json: Option<PathBuf>,
    /// Lease of the probe lock in the expiry measurement (not a setting).
    #[arg(skip = crate::scaling::EXPIRY_TTL_MS)]
    pub expiry_ttl_ms: u64,
}

impl Config {
    /// Commands per throughput run at this pipeline depth.
    pub fn ops(&self, pipeline: usize) -> u64 {
        if pipeline > 1 {
            self.ops_p16
        } else {
            self.ops_p1
        }
    }

    pub fn has(&self, suite: &str) -> bool {
        self.suites.0.iter().any(|s| s == suite)
    }

    /// A path under the repository root, unless absolute.
    pub fn path(&self, p: &std::path::Path) -> PathBuf {
        self.root.join(p)
    }

    pub fn json(&self) -> PathBuf {
        self.json
            .clone()
            .unwrap_or_else(|| self.root.join(redis_lock_report::PERF_JSON))
    }

    pub fn baseline(&self) -> PathBuf {
        self.root.join("bench/callgrind-baseline.tsv")
    }
}
