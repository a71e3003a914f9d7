pub mod clock;
pub mod durability;
pub mod failover;
pub mod fuzz;
pub mod memory;
pub mod mutex;
pub mod stale;
