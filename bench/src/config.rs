//! Settings: every size and duration comes from an environment variable with a default,
//! so a full run can be shortened (`BENCH_ROUNDS=3 make bench`) or made longer.

use std::path::PathBuf;

#[derive(Debug, Clone)]
pub struct Config {
    /// Rounds of A/B alternation (throughput, latency, memory-free suites).
    pub rounds: usize,
    pub clients: usize,
    /// Commands per throughput run, unpipelined and with pipeline 16.
    pub ops_p1: u64,
    pub ops_p16: u64,
    /// ACQUIRE/RELEASE pairs per latency round and side.
    pub lat_ops: u64,
    /// Locks for the bytes-per-lock measurement.
    pub mem_locks: u64,
    /// Blocked waiters (memory and scaling) and the locks they wait on.
    pub waiters: u64,
    pub wait_locks: u64,
    /// Held-lock levels of the scaling curve.
    pub levels: Vec<u64>,
    pub handoffs: usize,
    pub expiries: usize,
    /// Commands per callgrind phase, and the held-lock levels it also measures.
    pub cg_ops: u64,
    pub cg_levels: Vec<u64>,
    /// Rounds of the redis-benchmark cross-check (0 skips it).
    pub rb_rounds: usize,
    /// Suites to run: throughput, latency, memory, scaling, crosscheck, callgrind.
    pub suites: Vec<String>,
    pub servers: Vec<PathBuf>,
    pub module: PathBuf,
    pub doc: PathBuf,
    pub png: PathBuf,
    pub baseline: PathBuf,
    /// Scratch space for server directories and callgrind dumps.
    pub work: PathBuf,
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.trim().replace('_', "").parse().ok())
        .unwrap_or(default)
}

fn env_list(name: &str, default: &str) -> Vec<String> {
    std::env::var(name)
        .ok()
        .filter(|v| !v.trim().is_empty())
        .unwrap_or_else(|| default.to_string())
        .split([',', ' '])
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect()
}

fn env_path(name: &str) -> Option<PathBuf> {
    std::env::var_os(name)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

pub const ALL_SUITES: &str = "throughput,latency,memory,scaling,crosscheck,callgrind";

impl Config {
    pub fn from_env(root: PathBuf) -> Config {
        let levels = env_list("BENCH_LEVELS", "1000,100000,1000000")
            .iter()
            .filter_map(|s| s.replace('_', "").parse().ok())
            // The fill spreads keys over 4 connections.
            .map(|n: u64| (n / 4).max(1) * 4)
            .collect();
        let servers = env_list(
            "BENCH_SERVERS",
            "/usr/bin/redis-server,.servers/redis-8.2.3/redis-server,.servers/valkey-8.1.8/valkey-server",
        )
        .into_iter()
        .map(|s| {
            let p = PathBuf::from(&s);
            if p.is_absolute() {
                p
            } else {
                root.join(p)
            }
        })
        .collect();
        Config {
            rounds: env_u64("BENCH_ROUNDS", 5).max(1) as usize,
            clients: env_u64("BENCH_CLIENTS", 50).max(1) as usize,
            ops_p1: env_u64("BENCH_OPS_P1", 50_000),
            ops_p16: env_u64("BENCH_OPS_P16", 400_000),
            lat_ops: env_u64("BENCH_LAT_OPS", 4_000),
            mem_locks: env_u64("BENCH_MEM_LOCKS", 1_000_000),
            waiters: env_u64("BENCH_WAITERS", 10_000),
            wait_locks: env_u64("BENCH_WAIT_LOCKS", 100).max(1),
            levels,
            handoffs: env_u64("BENCH_HANDOFFS", 200) as usize,
            expiries: env_u64("BENCH_EXPIRIES", 30) as usize,
            cg_ops: env_u64("BENCH_CG_OPS", 20_000),
            cg_levels: env_list("BENCH_CG_LEVELS", "1000,10000,100000")
                .iter()
                .filter_map(|s| s.replace('_', "").parse().ok())
                .map(|n: u64| (n / 4).max(1) * 4)
                .collect(),
            rb_rounds: env_u64("BENCH_RB_ROUNDS", 3) as usize,
            suites: env_list("BENCH_SUITES", ALL_SUITES),
            servers,
            module: env_path("LOCK_MODULE")
                .unwrap_or_else(|| root.join("target/release/libredis_lock.so")),
            doc: env_path("BENCH_DOC").unwrap_or_else(|| root.join("docs/BENCHMARKS.md")),
            png: env_path("BENCH_PNG").unwrap_or_else(|| root.join("docs/perf.png")),
            baseline: root.join("bench/callgrind-baseline.tsv"),
            work: root.join("target/bench"),
        }
    }

    pub fn has(&self, suite: &str) -> bool {
        self.suites.iter().any(|s| s == suite)
    }

    /// The settings as `NAME=value` words, for the report.
    pub fn describe(&self) -> String {
        format!(
            "BENCH_ROUNDS={} BENCH_CLIENTS={} BENCH_OPS_P1={} BENCH_OPS_P16={} BENCH_LAT_OPS={} \
             BENCH_MEM_LOCKS={} BENCH_WAITERS={} BENCH_WAIT_LOCKS={} BENCH_LEVELS={} \
             BENCH_HANDOFFS={} BENCH_EXPIRIES={} BENCH_CG_OPS={} BENCH_CG_LEVELS={} BENCH_RB_ROUNDS={}",
            self.rounds,
            self.clients,
            self.ops_p1,
            self.ops_p16,
            self.lat_ops,
            self.mem_locks,
            self.waiters,
            self.wait_locks,
            self.levels
                .iter()
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join(","),
            self.handoffs,
            self.expiries,
            self.cg_ops,
            self.cg_levels
                .iter()
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join(","),
            self.rb_rounds
        )
    }
}
