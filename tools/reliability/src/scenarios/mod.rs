//! One file per scenario. Each gets the run's [`Env`] (servers come from its
//! [`builder`](Env::builder): standalone, [`ReplicaPair`](redis_lock_testkit::ReplicaPair),
//! [`Cluster`](redis_lock_testkit::Cluster)) and returns one [`Outcome`]: the row and the
//! notes that go into docs/data/reliability.json. A new scenario is a new file plus one
//! line in [`ALL`]: `pub const TITLE`, `pub const TARGET` and `pub fn run`.

use crate::common::{Env, Outcome};

pub mod clock;
pub mod durability;
pub mod failover;
pub mod fuzz;
pub mod memory;
pub mod mutex;
pub mod stale;

/// A scenario: fills in its outcome (figure, trials, notes; `o.fail` for a missed
/// target, `Status::NotRun` when it cannot run here); an `Err` is a missed target too.
pub type Scenario = fn(&Env, &mut Outcome) -> Result<(), String>;

/// Every scenario, in report order: (key for `--only`, title, target, the scenario).
pub const ALL: [(&str, &str, &str, Scenario); 7] = [
    ("mutex", mutex::TITLE, mutex::TARGET, mutex::run),
    (
        "durability",
        durability::TITLE,
        durability::TARGET,
        durability::run,
    ),
    ("failover", failover::TITLE, failover::TARGET, failover::run),
    ("stale", stale::TITLE, stale::TARGET, stale::run),
    ("clock", clock::TITLE, clock::TARGET, clock::run),
    ("fuzz", fuzz::TITLE, fuzz::TARGET, fuzz::run),
    ("memory", memory::TITLE, memory::TARGET, memory::run),
];
