//! The cluster section of docs/BENCHMARKS.md, from docs/data/cluster.json (`make
//! bench-cluster`): what a cluster sustains and what the fence exchange costs on the bus.

use minijinja::context;
use minijinja::value::Serde;
use serde::{Deserialize, Serialize};

use crate::template::render;
use crate::Error;

/// The goals of issue 27: grants per second while slots keep arriving, against the same
/// load with nothing moving, on keys of slots the node always had and on keys of slots
/// that arrived at least [`Moving::settled_ms`] earlier.
pub const GOAL_HOME: f64 = 0.7;
pub const GOAL_ARRIVED: f64 = 0.6;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ClusterRun {
    pub date: String,
    pub command: String,
    pub minutes: f64,
    pub machine: String,
    pub load_start: String,
    pub load_end: String,
    /// The run's settings (`BENCH_CLUSTER_*`).
    pub settings: serde_json::Value,
    pub servers: Vec<ClusterServer>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ClusterServer {
    pub label: String,
    pub scale: Vec<Scale>,
    pub moving: Moving,
}

/// Acquire/release loops on a cluster of `masters` primaries.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Scale {
    pub masters: usize,
    pub clients: usize,
    pub secs: f64,
    pub grants: u64,
    pub grants_per_sec: f64,
    /// Module messages the nodes sent on the cluster bus during the load (`CLUSTER INFO`
    /// `cluster_stats_messages_module_sent`, summed over the nodes), and per grant.
    pub bus_messages: u64,
    pub bus_per_grant: f64,
    /// The same count with no load, per second (the periodic state broadcasts).
    pub idle_bus_per_sec: f64,
}

/// Two primaries; node 1 keeps receiving slots from node 0 by `CLUSTER SETSLOT` in every
/// other window of `window_ms` (`windows` pairs, which state comes first alternating).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Moving {
    /// Time spent moving (as much was spent quiet).
    pub secs: f64,
    pub windows: usize,
    pub window_ms: u64,
    pub slots_moved: u64,
    /// The pause between two moves (ms), on top of the moves' own round trips.
    pub gap_ms: u64,
    /// A key's slot counts as arrived this long after it arrived.
    pub settled_ms: u64,
    /// Grants per second with nothing moving, then while slots arrive: on keys of slots
    /// node 1 always had, and on keys of slots that arrived earlier.
    pub home_quiet: f64,
    pub home_moving: f64,
    pub arrived_quiet: f64,
    pub arrived_moving: f64,
    /// The same ratios (moving / quiet) without the module (`SET NX PX` and `DEL`): the
    /// server's own cost of the moves.
    pub plain_home_ratio: f64,
    pub plain_arrived_ratio: f64,
    /// TRYAGAIN answers while slots moved.
    pub tryagain_home: u64,
    pub tryagain_arrived: u64,
    /// From a slot's arrival (its `SETSLOT NODE` answered) to the first grant on a key
    /// of it, asked at once and retried on TRYAGAIN: percentiles (ms) over the probes.
    pub first_grant_p50_ms: f64,
    pub first_grant_p99_ms: f64,
    pub first_grant_max_ms: f64,
    pub probes: u64,
    /// Module bus messages per slot that arrived (requests, answers and broadcasts).
    pub bus_per_slot: f64,
}

impl Moving {
    pub fn home_ratio(&self) -> f64 {
        self.home_moving / self.home_quiet
    }
    pub fn arrived_ratio(&self) -> f64 {
        self.arrived_moving / self.arrived_quiet
    }
}

pub fn section(run: &ClusterRun) -> Result<String, Error> {
    let ratios: Vec<[f64; 4]> = (run.servers.iter())
        .map(|s| {
            let m = &s.moving;
            let plain = [m.plain_home_ratio, m.plain_arrived_ratio];
            [m.home_ratio(), m.arrived_ratio(), plain[0], plain[1]]
        })
        .collect();
    let ctx = context! {
        run => Serde(run),
        ratios,
        goal_home => GOAL_HOME,
        goal_arrived => GOAL_ARRIVED,
    };
    render("cluster.md.j2", ctx)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run() -> ClusterRun {
        let json = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/data/cluster.json");
        crate::load(std::path::Path::new(json)).expect("docs/data/cluster.json")
    }

    #[test]
    fn the_section_shows_every_server_and_the_goals() {
        let run = run();
        let text = section(&run).expect("rendered");
        for s in &run.servers {
            assert!(text.contains(&s.label), "{}", s.label);
        }
        assert!(text.contains("≥ 0.7×") && text.contains("≥ 0.6×"), "{text}");
    }
}
