//! What every scenario gets (`Env`) and gives back (`Outcome`), and the one monotonic
//! clock all histories use.

use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::proc::{Server, ServerCfg};
use crate::resp::Reply;

/// Nanoseconds since the first call, on the monotonic clock (one clock for every thread).
pub fn now_ns() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

/// Unix time in ms from the wall clock.
pub fn unix_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

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

    /// A server with the module, no persistence, on a free loopback port.
    pub fn cfg(&self, name: &str) -> Result<ServerCfg, String> {
        ServerCfg::new(&self.server_bin, &self.dir(name), Some(&self.module))
            .map_err(|e| format!("no free port: {e}"))
    }

    pub fn start(&self, name: &str) -> Result<Server, String> {
        Server::start(self.cfg(name)?)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Status {
    Pass,
    Fail(String),
    NotRun(String),
}

#[derive(Debug, Clone)]
pub struct Outcome {
    pub id: u32,
    pub key: &'static str,
    pub title: &'static str,
    pub target: String,
    pub figure: String,
    pub trials: String,
    pub status: Status,
    /// Lines for the scenario's section in docs/RELIABILITY.md.
    pub notes: Vec<String>,
    pub secs: f64,
}

impl Outcome {
    pub fn new(id: u32, key: &'static str, title: &'static str, target: &str) -> Outcome {
        Outcome {
            id,
            key,
            title,
            target: target.to_string(),
            figure: String::new(),
            trials: String::new(),
            status: Status::Pass,
            notes: Vec::new(),
            secs: 0.0,
        }
    }

    /// Marks a missed target (keeps the first reason, adds the others to the notes).
    pub fn fail(&mut self, why: impl Into<String>) {
        let why = why.into();
        match &self.status {
            Status::Pass => self.status = Status::Fail(why),
            _ => self.notes.push(format!("Also failed: {why}")),
        }
    }

    pub fn note(&mut self, line: impl Into<String>) {
        self.notes.push(line.into());
    }
}

/// `1234567` -> `1,234,567`.
pub fn thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

pub fn pct(part: u64, whole: u64) -> String {
    if whole == 0 {
        return "n/a".into();
    }
    format!("{:.2}%", part as f64 * 100.0 / whole as f64)
}

/// The `INFO lock` counter `lock_panics` (caught Rust panics), if the server answers.
pub fn panics(s: &Server) -> Option<u64> {
    s.info_field("lock", "lock_panics")?.parse().ok()
}

/// LOCK.INFO fields of a held lock: (fence, expires-at); None when free.
pub fn lock_info(r: &Reply) -> Option<(u64, i64)> {
    let fence = u64::try_from(r.field("fence")?.as_int()?).ok()?;
    let exp = r.field("expires-at")?.as_int()?;
    Some((fence, exp))
}
