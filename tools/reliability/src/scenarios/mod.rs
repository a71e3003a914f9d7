//! One file per scenario (`TITLE`, `TARGET`, `run`) and one line in [`ALL`]; each fills
//! one [`Outcome`] row of docs/data/reliability.json (one per server of `--servers` for
//! those that run on every server).

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
pub mod sessions;
pub mod stale;

/// Fills in its outcome (`o.fail`: a missed target, as is an `Err`; `Status::NotRun`).
pub type Scenario = fn(&Env, &mut Outcome) -> Result<(), String>;

/// `--only` key (the module's name), title, target, run, and whether it runs on every
/// server of `--servers` or on `--server`.
pub type Def = (&'static str, &'static str, &'static str, Scenario, bool);

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
pub const ALL: [Def; 12] = [
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
    def!(sessions, true),
];
