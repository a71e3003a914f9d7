//! One file per scenario. Each gets the run's [`Env`] (servers come from its
//! [`builder`](Env::builder): standalone, [`ReplicaPair`](redis_lock_testkit::ReplicaPair),
//! [`Cluster`](redis_lock_testkit::Cluster)) and returns one [`Outcome`]: the row and the
//! notes that go into docs/data/reliability.json. A new scenario is a new file plus one
//! line in [`ALL`].

use crate::common::{Env, Outcome};

pub mod clock;
pub mod durability;
pub mod failover;
pub mod fuzz;
pub mod memory;
pub mod mutex;
pub mod stale;

/// A scenario: runs against the run's environment and reports one outcome.
pub type Scenario = fn(&Env) -> Outcome;

/// Every scenario, in report order: (key for `--only`, the scenario).
pub const ALL: [(&str, Scenario); 7] = [
    ("mutex", mutex::run),
    ("durability", durability::run),
    ("failover", failover::run),
    ("stale", stale::run),
    ("clock", clock::run),
    ("fuzz", fuzz::run),
    ("memory", memory::run),
];
