//! Rust client for the redis-lock module.
//!
//! - [`LockClient`]: locks on one server (or a Redis Cluster): [`LockClient::acquire`]
//!   returns a [`LockGuard`] with the token and the fencing token; waiting uses the
//!   module's FIFO `BLOCK`; optional auto-renewal (`LOCK.EXTEND` every third of the TTL)
//!   with a hard cap on the hold time; a loss signal ([`LockGuard::lost`]) that fires as
//!   soon as a renewal fails or the lease ends; a time limit on every network call.
//! - Three kinds of lock ([`LockMode`]): exclusive, shared (a read-write lock:
//!   [`AcquireOptions::shared`]) and counted (a semaphore: [`AcquireOptions::limit`]).
//! - Sessions ([`LockClient::session`]): one lease for any number of locks, one
//!   keepalive task for all of them, released together when the session is closed or
//!   ends (bound to its connection, when the process dies); several keys all or none
//!   ([`Session::acquire_all`], `LOCK.ACQUIREALL`). One server only.
//! - [`Redlock`]: the same guard over a majority of N independent servers, with quorum
//!   fencing (fences strictly increase across Redlock grants, see [`redlock`]).
//! - Grants confirmed on the server's replicas by default ([`Confirm`]): a grant that a
//!   failover could lose is given back and reported, never returned.
//! - Once per period ([`AcquireOptions::hold`], [`LockGuard::release_after`]): keep the
//!   lock after the work until its period ends.
//! - Bounded calls: every network call has a time limit ([`ClientOptions`]); errors name
//!   the server by `host:port` and never show a password, a token or a command's
//!   arguments.
//! - Guarded writes: [`LockGuard::if_held`] runs a command only while the guard's token
//!   holds the lock, atomically on the server (`LOCK.IFHELD`); [`LockClient::if_fence`]
//!   does it for code handed only a fence (`LOCK.IFFENCE`); [`LockClient::check`] is
//!   `LOCK.CHECK`. A refusal is [`Error::NotHeld`].
//! - Leader election ([`LockClient::campaign`], [`Leadership::proclaim`],
//!   [`Leadership::resign`], [`LockClient::leader`], [`LockClient::observe`]), with the
//!   semantics of etcd's election API, observed through `LOCK.WATCH` without polling.
//! - Monitoring: [`LockClient::server_stats`] (the module's `INFO lock` counters) and
//!   [`LockClient::scan_locks`] (the lock keys, a `SCAN` step at a time); the CLI's
//!   `redis-lock metrics` serves them to Prometheus.
//! - Where the module is not loaded, a node falls back to `SET NX PX` + Lua
//!   compare-and-delete (and a warning is logged through the `log` crate).
//!
//! The `redis-lock` binary of this crate is a flock(1)-like CLI over the same code.
//! docs/CLIENT.md in the repository documents both.

/// `acquire(name, ttl, wait)` and `acquire_with(name, opts)` as [`LockClient`] and
/// [`Redlock`] both have them (each with its own docs, given first): the options are
/// checked here, then the type's own `take(name, opts)` acquires.
macro_rules! acquire_methods {
    ($(#[$acquire:meta])* acquire; $(#[$with:meta])* acquire_with;) => {
        $(#[$acquire])*
        pub async fn acquire(
            &self,
            name: &str,
            ttl: std::time::Duration,
            wait: Option<std::time::Duration>,
        ) -> crate::Result<Option<crate::LockGuard>> {
            let mut o = crate::AcquireOptions::new(ttl);
            o.wait = wait;
            self.acquire_with(name, &o).await
        }

        $(#[$with])*
        pub async fn acquire_with(
            &self,
            name: &str,
            opts: &crate::AcquireOptions,
        ) -> crate::Result<Option<crate::LockGuard>> {
            opts.validate()?;
            self.take(name, opts).await
        }
    };
}

/// Chained option setters, one line each: `fn name(arg: T) => field = value;` is
/// `pub fn name(mut self, arg: T) -> Self` that sets `self.field` to `value`.
macro_rules! setters {
    ($($(#[$doc:meta])* fn $name:ident($($arg:ident: $ty:ty)?) => $field:ident = $val:expr;)*) => {
        $(
            $(#[$doc])*
            pub fn $name(mut self, $($arg: $ty)?) -> Self {
                self.$field = $val;
                self
            }
        )*
    };
}

/// `Debug` for a type that shows only the fields it lists (so never a token): `field`
/// shows `self.field`; `name: f(field)` shows `f(&self.field)` as `name`. A trailing
/// `..` marks fields left out (`finish_non_exhaustive`).
macro_rules! debug_shows {
    (@value $s:ident $name:ident) => { &$s.$name };
    (@value $s:ident $name:ident $show:ident $field:ident) => { &$show(&$s.$field) };
    (@end $d:expr) => { $d.finish() };
    (@end $d:expr, ..) => { $d.finish_non_exhaustive() };
    ($ty:ident { $($name:ident $(: $show:ident($field:ident))?),* } $($etc:tt)?) => {
        impl std::fmt::Debug for $ty {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                let mut d = f.debug_struct(stringify!($ty));
                $(d.field(stringify!($name), debug_shows!(@value self $name $($show $field)?));)*
                debug_shows!(@end d $(, $etc)?)
            }
        }
    };
}

/// How a `Debug` shows a secret: whether it is set, never what it is.
fn redacted(secret: &Option<String>) -> Option<&'static str> {
    secret.as_ref().map(|_| "<set>")
}

mod election;
mod error;
mod info;
mod lease;
mod node;
mod options;
pub mod redlock;
mod session;
mod single;
mod stats;
mod target;

pub use election::{CampaignOptions, Leader, Leadership, ObserveOptions, Observer};
pub use error::{Error, Result};
pub use info::{HolderInfo, LockInfo, SessionInfo};
pub use lease::{LeaseStatus, LeaseWatch, LockGuard, LossReason};
pub use options::{
    drift, AcquireOptions, ClientOptions, Confirm, LockMode, Renewal, Tls, MAX_LIMIT,
};
/// The `redis` crate this client is built on: hand [`LockClient::from_client`] a
/// `redis::Client`, and [`LockGuard::if_held`] a `redis::Cmd`, of this version.
pub use redis;
pub use redlock::{Redlock, RedlockOptions};
pub use session::{Session, SessionLockOptions, SessionOptions, MAX_KEYS};
pub use single::LockClient;
pub use target::redact_url;
