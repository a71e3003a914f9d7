//! One file per scenario. Each gets the run's [`Env`] (servers come from its
//! [`builder`](Env::builder): standalone, [`ReplicaPair`](redis_lock_testkit::ReplicaPair),
//! [`Cluster`](redis_lock_testkit::Cluster)) and returns one [`Outcome`]: the row and the
//! notes that go into docs/data/reliability.json. A new scenario is a new file plus one
//! line in [`ALL`]: `pub const TITLE`, `pub const TARGET` and `pub fn run`. A scenario
//! that runs on every server of `--servers` gets one row per server.

use crate::common::{Env, Outcome};

pub mod chaos;
pub mod clock;
pub mod durability;
pub mod failover;
pub mod fuzz;
pub mod kinds;
pub mod memory;
pub mod mutex;
pub mod stale;

/// A scenario: fills in its outcome (figure, trials, notes; `o.fail` for a missed
/// target, `Status::NotRun` when it cannot run here); an `Err` is a missed target too.
pub type Scenario = fn(&Env, &mut Outcome) -> Result<(), String>;

pub struct Def {
    /// The key for `--only`.
    pub key: &'static str,
    pub title: &'static str,
    pub target: &'static str,
    pub run: Scenario,
    /// Runs once on every server of `--servers` (one row each), else on `--server`.
    pub every_server: bool,
}

const fn one(key: &'static str, title: &'static str, target: &'static str, run: Scenario) -> Def {
    Def {
        key,
        title,
        target,
        run,
        every_server: false,
    }
}

/// Every scenario, in report order.
pub const ALL: [Def; 9] = [
    one("mutex", mutex::TITLE, mutex::TARGET, mutex::run),
    one(
        "durability",
        durability::TITLE,
        durability::TARGET,
        durability::run,
    ),
    one("failover", failover::TITLE, failover::TARGET, failover::run),
    one("stale", stale::TITLE, stale::TARGET, stale::run),
    one("clock", clock::TITLE, clock::TARGET, clock::run),
    one("fuzz", fuzz::TITLE, fuzz::TARGET, fuzz::run),
    one("memory", memory::TITLE, memory::TARGET, memory::run),
    Def {
        every_server: true,
        ..one("chaos", chaos::TITLE, chaos::TARGET, chaos::run)
    },
    Def {
        every_server: true,
        ..one("kinds", kinds::TITLE, kinds::TARGET, kinds::run)
    },
];
