//! What every scenario gets (`Env`) and gives back (an [`Outcome`] row for the JSON),
//! and the helpers they share. Servers, RESP and the clock come from the test kit.

use std::path::PathBuf;
use std::time::Duration;

pub use redis_lock_report::fmt::{pct, thousands};
pub use redis_lock_report::reliability::{Outcome, Status};
pub use redis_lock_testkit::{
    now_ns, unix_ms, RawConn as Conn, Resp as Reply, Server, ServerBuilder,
};

#[derive(Debug, Clone)]
pub struct Env {
    pub repo: PathBuf,
    pub server_bin: PathBuf,
    pub module: PathBuf,
    pub shim: PathBuf,
    pub exe: PathBuf,
    pub work: PathBuf,
    pub scale: f64,
    pub short: bool,
    pub seed: u64,
}

impl Env {
    /// `full` scaled by SCALE, or `short` (also scaled) for the CI run; at least 1.
    pub fn n(&self, full: f64, short: f64) -> u64 {
        let base = if self.short { short } else { full };
        (base * self.scale).round().max(1.0) as u64
    }

    pub fn secs(&self, full: f64, short: f64) -> Duration {
        let base = if self.short { short } else { full };
        Duration::from_secs_f64((base * self.scale).max(0.5))
    }

    /// A fresh directory for one server.
    pub fn dir(&self, name: &str) -> PathBuf {
        let d = self.work.join(name);
        let _ = std::fs::remove_dir_all(&d);
        let _ = std::fs::create_dir_all(&d);
        d
    }

    /// A server with the module, no persistence, on a free loopback port, in a fresh
    /// directory `name` of the run's work dir (see [`ServerBuilder`] for the rest).
    pub fn builder(&self, name: &str) -> ServerBuilder {
        ServerBuilder::new()
            .bin(self.server_bin.clone())
            .module(&self.module)
            .dir(self.dir(name))
            .start_timeout(Duration::from_secs(20))
    }

    /// The same server without the module.
    pub fn plain(&self, name: &str) -> ServerBuilder {
        self.builder(name).no_module()
    }

    pub fn start(&self, name: &str) -> Result<Server, String> {
        self.builder(name).try_start()
    }
}

/// A connection with a 5 s timeout (from inside the server's namespace, if any).
pub fn connect(s: &Server) -> Result<Conn, String> {
    s.try_raw(Duration::from_secs(5))
        .map_err(|e| format!("connect to {}: {e}", s.addr()))
}

/// The `INFO lock` counter `lock_panics` (caught Rust panics), if the server answers.
pub fn panics(s: &Server) -> Option<u64> {
    s.info_field("lock", "lock_panics")?.parse().ok()
}

/// LOCK.INFO fields of a held lock: (fence, expires-at); None when free.
pub fn lock_info(r: &Reply) -> Option<(u64, i64)> {
    let fence = u64::try_from(r.get("fence")?.as_int()?).ok()?;
    let exp = r.get("expires-at")?.as_int()?;
    Some((fence, exp))
}
