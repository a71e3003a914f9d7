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
    /// The servers of the scenarios that run on every server.
    pub servers: Vec<PathBuf>,
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

/// The notes a fenced check ends with: critical sections that outran their own lease
/// (`late`: how many, and the store anomalies they explain), each kind of violation, and
/// the first six examples.
pub fn note_checks<'a, K: std::fmt::Display + 'a>(
    o: &mut Outcome,
    late: (u64, u64),
    violations: impl IntoIterator<Item = (K, &'a u64)>,
    examples: &[String],
) {
    o.note(format!(
        "Critical sections that outran their own lease (a client delayed past it, not a lock fault): {}; store anomalies they explain: {}.",
        late.0, late.1
    ));
    for (k, n) in violations {
        o.note(format!("Violation `{k}`: {n}"));
    }
    for e in examples.iter().take(6) {
        o.note(format!("Example: {e}"));
    }
}

/// Fails a full run that made fewer acquisitions than asked for (a short run only says so).
pub fn short_of(o: &mut Outcome, env: &Env, got: u64, target: u64) {
    if got < target {
        let msg = format!(
            "{} acquisitions, below the {} asked for",
            thousands(got),
            thousands(target)
        );
        if env.short {
            o.note(msg);
        } else {
            o.fail(msg);
        }
    }
}

/// The client ids of a lock's holders, from a `LOCK.INFO` reply (none when free).
pub fn holder_ids(info: &Reply) -> Vec<u64> {
    let Some(list) = info.get("holder-list") else {
        return Vec::new();
    };
    list.as_items()
        .unwrap_or_default()
        .iter()
        .filter_map(|h| u64::try_from(h.get("client-id")?.as_int()?).ok())
        .collect()
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
