//! The readers/writers and semaphore cells of the contention section of
//! docs/BENCHMARKS.md, and docs/contention-kinds.png: the module's `SHARED` and
//! `LIMIT n` locks with `BLOCK` against the client-side recipes people use for the same
//! job. Rendered from the `kinds` of docs/data/contention.json.

use serde::{Deserialize, Serialize};

/// Pause between two attempts of the client-side read-write lock recipes: uniform in
/// this range of µs (10 ms ± 5 ms, node-redlock's jitter as the mutex cells use it).
pub const RW_POLL_US: (u64, u64) = (5_000, 14_999);
/// Pause between two attempts of the sorted-set semaphore (redis-semaphore's default
/// `retryInterval` for npm).
pub const SEM_POLL_MS: u64 = 10;
/// Lease of a waiting writer's announcement in the writer-first recipe (refreshed at
/// every attempt of that writer).
pub const INTENT_MS: u64 = 1_000;

/// Throughput, waits and fairness of one group of a cell's clients (its readers, its
/// writers, or all of them). See tools/contention/src/stats.rs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RoleStats {
    pub clients: usize,
    pub acquisitions: u64,
    /// Acquisitions ÷ the cell's time to its last release.
    pub per_second: f64,
    /// From a client's first attempt to its grant (a wait that never ended counts with
    /// its length when the client gave up).
    pub wait_p50_ms: f64,
    pub wait_p99_ms: f64,
    pub wait_max_ms: f64,
    /// Jain's index over acquisitions per client of the group.
    pub jain: f64,
    /// Clients of the group still waiting when they gave up.
    pub gave_up: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KindSummary {
    pub elapsed_s: f64,
    pub all: RoleStats,
    /// A readers/writers cell's readers and writers (none in a semaphore cell).
    pub readers: Option<RoleStats>,
    pub writers: Option<RoleStats>,
    pub commands_per_acquisition: f64,
    pub round_trips_per_acquisition: f64,
    /// The most clients that held the lock at one instant.
    pub peak_holders: u64,
    /// Holders on average over the cell.
    pub mean_holders: f64,
    /// Grants that broke the lock's rule (a writer next to another holder, a reader
    /// next to a writer, more than `limit` holders).
    pub violations: u64,
    /// Reader grants that overtook a waiting writer (asked after it, granted before it).
    pub overtakes: u64,
}

/// One readers/writers (`family` `rw`) or semaphore (`sem`) cell.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct KindCell {
    pub family: String,
    /// `shared`, `module`, `jitter`, `rw-script`, `rw-script-wfirst` (rw);
    /// `limit`, `zset` (sem).
    pub method: String,
    pub label: String,
    /// Readers and writers of an rw cell (0 in a semaphore cell).
    pub readers: usize,
    pub writers: usize,
    /// Every client of the cell.
    pub clients: usize,
    /// Permits of a semaphore cell.
    pub limit: Option<u32>,
    pub hold_ms: u64,
    pub summary: KindSummary,
    /// Calls of the clients' commands from INFO commandstats, and the clients' own count.
    pub server_commands: u64,
    pub client_commands: u64,
    /// Cores kept busy by other processes during the cell.
    pub other_cores: Option<f64>,
}
