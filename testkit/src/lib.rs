//! The test kit of every test, benchmark and tool: throw-away servers ([`ServerBuilder`],
//! [`Server`]) and topologies ([`Cluster`], [`ReplicaPair`]), a hand-written RESP2/RESP3
//! client ([`RawConn`]) and typed lock commands ([`lock`]).
//!
//! Environment: `LOCK_SERVER_BIN` (default `redis-server` on `PATH`), `LOCK_MODULE`
//! (default [`module_path`]), `LOCK_KEEP_DIRS=1` (keep every server's directory, not only
//! those of a thread that panicked).

pub mod lock;
pub mod net;
pub mod paths;
pub mod resp;
pub mod rng;
pub mod server;

pub use resp::{encode, starts_with_error_code, RawConn, Resp};
pub use rng::Rng;
pub use server::{key_slot, Cluster, ReplicaPair, Server, ServerBuilder};

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::thread::sleep;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// How long a server gets to answer PING and finish loading its data.
pub const START_TIMEOUT: Duration = Duration::from_secs(10);
/// Read/write timeout of the connections handed out by [`Server::conn`] and [`RawConn`].
pub const IO_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a cluster gets to reach `cluster_state:ok` on every node.
pub const CLUSTER_TIMEOUT: Duration = Duration::from_secs(60);

fn env_path(var: &str) -> Option<PathBuf> {
    std::env::var_os(var)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

/// The server binary: `$LOCK_SERVER_BIN`, or `redis-server` (looked up on `PATH`).
pub fn server_bin() -> PathBuf {
    env_path("LOCK_SERVER_BIN").unwrap_or_else(|| PathBuf::from("redis-server"))
}

/// `$CARGO_TARGET_DIR`, or the workspace's `target/`.
pub(crate) fn target_dir() -> PathBuf {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    env_path("CARGO_TARGET_DIR").unwrap_or_else(|| workspace.join("target"))
}

/// The module, absolute: `$LOCK_MODULE`, or `release/libredis_lock.so` under
/// [`target_dir`]. Panics when it is missing.
pub fn module_path() -> PathBuf {
    let path =
        env_path("LOCK_MODULE").unwrap_or_else(|| target_dir().join("release/libredis_lock.so"));
    if !path.is_file() {
        panic!(
            "module not found at {}: build it first with `cargo build --release` \
             (or set LOCK_MODULE=/abs/path/libredis_lock.so)",
            path.display()
        );
    }
    path.canonicalize().unwrap_or(path)
}

/// Which server a binary is, from its `--version` output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Flavor {
    /// `"redis"` or `"valkey"`.
    pub name: &'static str,
    pub major: u32,
    pub minor: u32,
    pub patch: u32,
}

impl Flavor {
    pub fn is_valkey(&self) -> bool {
        self.name == "valkey"
    }
    /// True when the version is `major.minor` or later.
    pub fn at_least(&self, major: u32, minor: u32) -> bool {
        (self.major, self.minor) >= (major, minor)
    }
    /// `"7.0.15"`.
    pub fn version(&self) -> String {
        format!("{}.{}.{}", self.major, self.minor, self.patch)
    }
    /// `"Redis 7.0.15"`, `"Valkey 8.1.8"`: how reports name a server.
    pub fn label(&self) -> String {
        let name = if self.is_valkey() { "Valkey" } else { "Redis" };
        format!("{name} {}", self.version())
    }
}

impl std::fmt::Display for Flavor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.name, self.version())
    }
}

/// Parses `Redis server v=7.0.15 ...` / `Valkey server v=8.1.8 ...`.
pub fn parse_flavor(version_output: &str) -> Option<Flavor> {
    let lower = version_output.to_ascii_lowercase();
    let name = ["valkey", "redis"]
        .into_iter()
        .find(|n| lower.starts_with(n))?;
    let v = lower
        .split_whitespace()
        .find_map(|w| w.strip_prefix("v="))?;
    let mut parts = v.split('.').map(|p| p.parse::<u32>().ok());
    let (major, minor) = (parts.next()??, parts.next()??);
    let patch = parts.next().flatten().unwrap_or(0);
    Some(Flavor {
        name,
        major,
        minor,
        patch,
    })
}

/// The flavor of any server binary (runs `<bin> --version`).
pub fn flavor_of(bin: &Path) -> Result<Flavor, String> {
    let out = Command::new(bin)
        .arg("--version")
        .output()
        .map_err(|e| format!("cannot run {} --version: {e}", bin.display()))?;
    let text = String::from_utf8_lossy(&out.stdout);
    parse_flavor(&text)
        .ok_or_else(|| format!("cannot parse `{} --version`: {text:?}", bin.display()))
}

/// The flavor of [`server_bin()`] (asked once per process). Panics when unknown.
pub fn server_flavor() -> Flavor {
    static FLAVOR: OnceLock<Flavor> = OnceLock::new();
    *FLAVOR.get_or_init(|| flavor_of(&server_bin()).unwrap_or_else(|e| panic!("{e}")))
}

/// A loopback port that was free a moment ago (bind 127.0.0.1:0, read it, close it).
pub fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    l.local_addr().expect("local_addr").port()
}

/// Polls `f` every 10 ms until it returns true (→ true) or `timeout` passes (→ false).
pub fn wait_until(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if f() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        sleep(Duration::from_millis(10));
    }
}

/// Reads `used_memory` (by `read`) every 200 ms until seven readings in a row (1.2 s) lie
/// within 16 KiB, and returns the last, or `Err(readings)` after 30 s. The server frees in
/// its own time: the two ~35 KB temporary clients of each module-blocked client go at most
/// 50 per cron run (module.c `modulesCron`: 2,000 take ~4 s); INFO itself moves ~1 KiB.
pub fn settled_memory(mut read: impl FnMut() -> i64) -> Result<i64, Vec<i64>> {
    let mut recent: Vec<i64> = Vec::new();
    let mut last = 0;
    let ok = wait_until(Duration::from_secs(30), || {
        last = read();
        recent.push(last);
        if recent.len() > 7 {
            recent.remove(0);
        }
        sleep(Duration::from_millis(200));
        let (lo, hi) = (recent.iter().min(), recent.iter().max());
        recent.len() == 7 && matches!((lo, hi), (Some(lo), Some(hi)) if hi - lo < 16 * 1024)
    });
    if ok {
        Ok(last)
    } else {
        Err(recent)
    }
}

/// A fresh, empty directory under the system temp dir; removed only by a [`Server`] that
/// created it itself.
pub fn temp_dir() -> PathBuf {
    let base = std::env::temp_dir().join("redis-lock-tests");
    std::fs::create_dir_all(&base).expect("create temp base dir");
    tempfile::Builder::new()
        .prefix(&format!("srv-{}-", std::process::id()))
        .tempdir_in(&base)
        .unwrap_or_else(|e| panic!("create a directory in {}: {e}", base.display()))
        .keep()
}

/// Milliseconds since the Unix epoch, from this machine's clock.
pub fn unix_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// Nanoseconds since the first call, on the monotonic clock (one clock for all threads).
pub fn now_ns() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

/// The value of `field` in an `INFO` text (`field:value` lines).
pub fn info_field(info: &str, field: &str) -> Option<String> {
    let value = |l: &str| Some(l.trim_end().strip_prefix(field)?.strip_prefix(':')?.into());
    info.lines().find_map(value)
}

/// Sends `sig` to `pid` (a process this program started); true when delivered.
pub fn signal(pid: u32, sig: i32) -> bool {
    // SAFETY: kill(2) has no memory-safety preconditions.
    unsafe { libc::kill(pid as libc::pid_t, sig) == 0 }
}

/// SIGSTOPs a process and SIGCONTs it when dropped (also when a test panics).
pub struct Stopped(pub u32);

impl Stopped {
    pub fn new(pid: u32) -> Stopped {
        signal(pid, libc::SIGSTOP);
        Stopped(pid)
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        signal(self.0, libc::SIGCONT);
    }
}

/// A comma-separated list on a command line (`--n 1,2,8`, or `CONTENTION_N=1,2,8`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(transparent)]
pub struct List<T>(pub Vec<T>);

impl<T: std::str::FromStr> std::str::FromStr for List<T> {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let items = s.split(',').map(str::trim).filter(|x| !x.is_empty());
        items
            .map(|x| x.parse().map_err(|_| format!("cannot parse {x:?}")))
            .collect::<Result<_, _>>()
            .map(List)
    }
}

/// Runs a command to completion; `Err` with its output when it fails.
pub fn run_cmd(argv: &[&str]) -> Result<String, String> {
    let (bin, rest) = argv.split_first().ok_or("empty command")?;
    let out = Command::new(bin)
        .args(rest)
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| format!("{}: {e}", argv.join(" ")))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "`{}` failed ({}): {}{}",
            argv.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// One `#[test]` per case of a test body that takes one argument:
/// `cases!(body: test_name_a => arg_a, test_name_b => arg_b);`
#[macro_export]
macro_rules! cases {
    ($body:ident: $($name:ident => $arg:expr),+ $(,)?) => {
        $(
            #[test]
            fn $name() {
                $body($arg);
            }
        )+
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flavors_parse() {
        let f = parse_flavor("Redis server v=7.0.15 sha=00000000:0 malloc=jemalloc-5.3.0").unwrap();
        assert_eq!(
            (f.name, f.version(), f.label()),
            ("redis", "7.0.15".into(), "Redis 7.0.15".into())
        );
        let v = parse_flavor("Valkey server v=8.1.8 sha=0 bits=64").unwrap();
        assert!(v.is_valkey() && v.at_least(8, 1) && !v.at_least(8, 2));
        assert_eq!(parse_flavor("KeyDB v=1"), None);
    }

    #[test]
    fn lists_parse() {
        assert_eq!("1, 2,1000".parse::<List<u64>>(), Ok(List(vec![1, 2, 1000])));
        assert!("1,x".parse::<List<u64>>().is_err());
    }

    #[test]
    fn info_fields_and_temp_dirs() {
        let info = "# Server\r\nredis_version:7.0.15\r\nloading:0\r\n";
        assert_eq!(info_field(info, "loading").as_deref(), Some("0"));
        assert_eq!(info_field(info, "load"), None);
        let (a, b) = (temp_dir(), temp_dir());
        assert!(a.is_dir() && b.is_dir() && a != b);
        let _ = (std::fs::remove_dir(a), std::fs::remove_dir(b));
    }
}
