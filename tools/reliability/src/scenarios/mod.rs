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
pub mod guarded;
pub mod kinds;
pub mod leases;
pub mod memory;
pub mod mutex;
pub mod stale;

/// A scenario: fills in its outcome (figure, trials, notes; `o.fail` for a missed
/// target, `Status::NotRun` when it cannot run here); an `Err` is a missed target too.
pub type Scenario = fn(&Env, &mut Outcome) -> Result<(), String>;

/// A scenario's `--only` key (its module's name), its row's title and target, its run,
/// and whether it runs once on every server of `--servers` (one row each) or on `--server`.
pub type Def = (&'static str, &'static str, &'static str, Scenario, bool);

/// The [`Def`] of scenario module `$m`.
macro_rules! def {
    ($m:ident, $every_server:expr) => {
        (
            stringify!($m),
            $m::TITLE,
            $m::TARGET,
            $m::run,
            $every_server,
        )
    };
}

/// Every scenario, in report order.
pub const ALL: [Def; 11] = [
    def!(mutex, false),
    def!(durability, false),
    def!(leases, true),
    def!(failover, false),
    def!(stale, false),
    def!(guarded, true),
    def!(clock, true),
    def!(fuzz, false),
    def!(memory, false),
    def!(chaos, true),
    def!(kinds, true),
];
