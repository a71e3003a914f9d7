//! Shared integration-test harness: starts throw-away `redis-server` / `valkey-server`
//! processes on free loopback ports, each with its own data directory, and (by default)
//! the module loaded.
//!
//! Environment:
//! - `LOCK_SERVER_BIN`: server binary (default: `redis-server` on `PATH`).
//! - `LOCK_MODULE`: the module `.so` (default: `<crate>/target/release/libredis_lock.so`,
//!   or under `$CARGO_TARGET_DIR/release/` when that is set).
//! - `LOCK_REDIS_CLI`: `redis-cli` used to create clusters (default: `redis-cli` on `PATH`).
//! - `LOCK_KEEP_DIRS=1`: keep every server's directory (normally kept only when the test
//!   panicked).
//!
//! Each integration test file uses `mod common;` and only some of this API.
#![allow(dead_code)]

use std::fs;
use std::io::{Read, Seek, SeekFrom};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;
use std::thread::sleep;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// How long a server gets to come up (accept PING and finish loading its data).
pub const START_TIMEOUT: Duration = Duration::from_secs(10);
/// Read/write timeout of connections handed out by [`Server::conn`].
pub const IO_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a cluster gets to reach `cluster_state:ok` on every node.
pub const CLUSTER_TIMEOUT: Duration = Duration::from_secs(60);

const LOG_TAIL_LINES: usize = 60;
const PORT_RETRIES: usize = 5;

// ------------------------------------------------------------------------------------
// Locations of the binaries and the module

fn find_on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

fn env_path(var: &str) -> Option<PathBuf> {
    std::env::var_os(var)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

/// The server binary: `$LOCK_SERVER_BIN`, or `redis-server` found on `PATH`.
pub fn server_bin() -> PathBuf {
    env_path("LOCK_SERVER_BIN")
        .or_else(|| find_on_path("redis-server"))
        .unwrap_or_else(|| PathBuf::from("redis-server"))
}

/// `redis-cli`: `$LOCK_REDIS_CLI`, or `redis-cli` found on `PATH`.
pub fn redis_cli_bin() -> PathBuf {
    env_path("LOCK_REDIS_CLI")
        .or_else(|| find_on_path("redis-cli"))
        .unwrap_or_else(|| PathBuf::from("redis-cli"))
}

/// The module: `$LOCK_MODULE`, or the release build of this crate. Panics when missing.
pub fn module_path() -> PathBuf {
    let path = env_path("LOCK_MODULE").unwrap_or_else(|| {
        let target = env_path("CARGO_TARGET_DIR")
            .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target"));
        target.join("release").join("libredis_lock.so")
    });
    if !path.is_file() {
        panic!(
            "module not found at {}: build it first with `cargo build --release` \
             (or set LOCK_MODULE=/abs/path/libredis_lock.so)",
            path.display()
        );
    }
    path.canonicalize().unwrap_or(path)
}

// ------------------------------------------------------------------------------------
// Server flavor

/// Which server `server_bin()` is, from its `--version` output.
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
    pub fn is_redis(&self) -> bool {
        self.name == "redis"
    }
    /// True when the version is `major.minor` or later.
    pub fn at_least(&self, major: u32, minor: u32) -> bool {
        (self.major, self.minor) >= (major, minor)
    }
    /// `"7.0.15"`.
    pub fn version(&self) -> String {
        format!("{}.{}.{}", self.major, self.minor, self.patch)
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
    let name = if lower.starts_with("valkey") {
        "valkey"
    } else if lower.starts_with("redis") {
        "redis"
    } else {
        return None;
    };
    let v = lower
        .split_whitespace()
        .find_map(|w| w.strip_prefix("v="))?;
    let mut parts = v.split('.').map(|p| p.parse::<u32>().ok());
    let major = parts.next()??;
    let minor = parts.next()??;
    let patch = parts.next().flatten().unwrap_or(0);
    Some(Flavor {
        name,
        major,
        minor,
        patch,
    })
}

/// The flavor of `server_bin()`, from `<bin> --version` (run once per test process).
pub fn server_flavor() -> Flavor {
    static FLAVOR: OnceLock<Flavor> = OnceLock::new();
    *FLAVOR.get_or_init(|| {
        let bin = server_bin();
        let out = Command::new(&bin)
            .arg("--version")
            .output()
            .unwrap_or_else(|e| panic!("cannot run {} --version: {e}", bin.display()));
        let text = String::from_utf8_lossy(&out.stdout);
        parse_flavor(&text).unwrap_or_else(|| {
            panic!(
                "cannot parse `{} --version` output: {text:?}",
                bin.display()
            )
        })
    })
}

// ------------------------------------------------------------------------------------
// Small helpers

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

/// A fresh, empty, uniquely named directory under the system temp dir. Nothing removes
/// it automatically unless a [`Server`] created it itself.
pub fn temp_dir() -> PathBuf {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let base = std::env::temp_dir().join("redis-lock-tests");
    fs::create_dir_all(&base).expect("create temp base dir");
    loop {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let dir = base.join(format!("srv-{}-{n}-{nanos:08x}", std::process::id()));
        match fs::create_dir(&dir) {
            Ok(()) => return dir,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => panic!("create {}: {e}", dir.display()),
        }
    }
}

/// The last `n` lines of a file ("" when it does not exist).
fn file_tail(path: &Path, n: usize) -> String {
    let mut f = match fs::File::open(path) {
        Ok(f) => f,
        Err(_) => return String::new(),
    };
    // Logs stay small in tests, but only read the last 256 KiB anyway.
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = f.seek(SeekFrom::Start(len.saturating_sub(256 * 1024)));
    let mut buf = Vec::new();
    let _ = f.read_to_end(&mut buf);
    let text = String::from_utf8_lossy(&buf);
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

fn info_field(info: &str, field: &str) -> Option<String> {
    info.lines().find_map(|l| {
        l.trim_end()
            .strip_prefix(field)
            .and_then(|r| r.strip_prefix(':'))
            .map(str::to_string)
    })
}

// ------------------------------------------------------------------------------------
// ServerBuilder

/// Builder for a throw-away server. Defaults: fresh temp dir, free port, module loaded,
/// no persistence (`--save "" --appendonly no`), `--enable-debug-command yes`.
#[derive(Debug, Clone)]
pub struct ServerBuilder {
    bin: Option<PathBuf>,
    module: bool,
    module_args: Vec<String>,
    args: Vec<(String, Vec<String>)>,
    dir: Option<PathBuf>,
    port: Option<u16>,
    start_timeout: Duration,
}

impl Default for ServerBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl ServerBuilder {
    pub fn new() -> Self {
        ServerBuilder {
            bin: None,
            module: true,
            module_args: Vec::new(),
            args: Vec::new(),
            dir: None,
            port: None,
            start_timeout: START_TIMEOUT,
        }
    }

    /// Module arguments, appended after the `.so` on `--loadmodule`.
    pub fn module_args(mut self, args: &[&str]) -> Self {
        self.module_args.extend(args.iter().map(|s| s.to_string()));
        self
    }

    /// An extra `--k v` server option (after the defaults, so it overrides them).
    pub fn arg(mut self, k: &str, v: &str) -> Self {
        self.args
            .push((k.trim_start_matches('-').to_string(), vec![v.to_string()]));
        self
    }

    /// An extra server option with several values (`--save 3600 1 300 100`), or none.
    pub fn arg_multi(mut self, k: &str, vs: &[&str]) -> Self {
        self.args.push((
            k.trim_start_matches('-').to_string(),
            vs.iter().map(|s| s.to_string()).collect(),
        ));
        self
    }

    /// Reuse a data directory (restart tests). The server does not remove a directory it
    /// was given; the [`Server`] that created it (or the test) owns it.
    pub fn dir(mut self, dir: PathBuf) -> Self {
        self.dir = Some(dir);
        self
    }

    /// A fixed port (e.g. restart on the same port). No retry on "Address already in use".
    pub fn port(mut self, port: u16) -> Self {
        self.port = Some(port);
        self
    }

    /// Start without the module.
    pub fn no_module(mut self) -> Self {
        self.module = false;
        self
    }

    /// Use another server binary than [`server_bin()`].
    pub fn bin(mut self, bin: PathBuf) -> Self {
        self.bin = Some(bin);
        self
    }

    /// How long to wait for the server to come up (default 10 s).
    pub fn start_timeout(mut self, t: Duration) -> Self {
        self.start_timeout = t;
        self
    }

    /// Starts the server and waits until it answers PING and is not loading.
    /// Panics with the tail of its log when it does not come up.
    pub fn start(self) -> Server {
        match self.start_inner(true) {
            Ok(s) => s,
            Err(e) => panic!("server failed to start:\n{e}"),
        }
    }

    /// Like [`start`](Self::start), but returns `Err(log tail)` instead of panicking (for
    /// tests that expect the server or the module load to fail).
    pub fn try_start(self) -> Result<Server, String> {
        self.start_inner(false)
    }

    fn start_inner(self, keep_dir_on_failure: bool) -> Result<Server, String> {
        let bin = self.bin.clone().unwrap_or_else(server_bin);
        let module = if self.module {
            Some(module_path())
        } else {
            None
        };
        let (dir, owns_dir) = match &self.dir {
            Some(d) => {
                fs::create_dir_all(d).map_err(|e| format!("create {}: {e}", d.display()))?;
                (d.canonicalize().unwrap_or_else(|_| d.clone()), false)
            }
            None => (temp_dir(), true),
        };

        let attempts = if self.port.is_some() { 1 } else { PORT_RETRIES };
        let mut last_err = String::new();
        for _ in 0..attempts {
            let port = self.port.unwrap_or_else(free_port);
            let argv = self.argv(port, &dir, module.as_deref());
            let mut server = Server {
                port,
                dir: dir.clone(),
                bin: bin.clone(),
                argv,
                child: None,
                owns_dir,
                start_timeout: self.start_timeout,
            };
            match server.launch() {
                Ok(()) => return Ok(server),
                Err(e) => {
                    let in_use = e.contains("Address already in use");
                    last_err = e;
                    server.owns_dir = false; // the dir is dealt with below
                    drop(server);
                    if !in_use {
                        break;
                    }
                    if owns_dir {
                        // Start the next attempt with clean logs.
                        let _ = fs::remove_file(dir.join("server.log"));
                        let _ = fs::remove_file(dir.join("stdout.log"));
                    }
                }
            }
        }
        let kept = if owns_dir && !keep_dir_on_failure && !keep_dirs() {
            let _ = fs::remove_dir_all(&dir);
            String::new()
        } else {
            format!(" (dir {} kept)", dir.display())
        };
        Err(format!("server did not start{kept}\n{last_err}"))
    }

    fn argv(&self, port: u16, dir: &Path, module: Option<&Path>) -> Vec<String> {
        let mut a: Vec<String> = Vec::new();
        let mut opt = |k: &str, vs: &[&str]| {
            a.push(format!("--{k}"));
            a.extend(vs.iter().map(|s| s.to_string()));
        };
        opt("bind", &["127.0.0.1"]);
        opt("port", &[&port.to_string()]);
        opt("dir", &[&dir.to_string_lossy()]);
        opt("logfile", &[&dir.join("server.log").to_string_lossy()]);
        opt("save", &[""]);
        opt("appendonly", &["no"]);
        opt("daemonize", &["no"]);
        opt("enable-debug-command", &["yes"]);
        for (k, vs) in &self.args {
            let vs: Vec<&str> = vs.iter().map(String::as_str).collect();
            opt(k, &vs);
        }
        if let Some(m) = module {
            let mut vs = vec![m.to_string_lossy().into_owned()];
            vs.extend(self.module_args.iter().cloned());
            let vs: Vec<&str> = vs.iter().map(String::as_str).collect();
            opt("loadmodule", &vs);
        }
        a
    }
}

// ------------------------------------------------------------------------------------
// Server

/// A running (or stopped, restartable) server process. Dropping it kills the process and
/// removes its directory (kept, and its path printed, when the test panicked).
#[derive(Debug)]
pub struct Server {
    pub port: u16,
    pub dir: PathBuf,
    bin: PathBuf,
    argv: Vec<String>,
    child: Option<Child>,
    owns_dir: bool,
    start_timeout: Duration,
}

impl Server {
    /// `redis://127.0.0.1:port/`
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// `127.0.0.1:port`
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub fn client(&self) -> redis::Client {
        redis::Client::open(self.url()).expect("redis::Client::open")
    }

    /// A new connection with 10 s connect/read/write timeouts.
    pub fn conn(&self) -> redis::Connection {
        let c = self
            .client()
            .get_connection_with_timeout(IO_TIMEOUT)
            .unwrap_or_else(|e| panic!("connect to {}: {e}", self.addr()));
        c.set_read_timeout(Some(IO_TIMEOUT)).expect("read timeout");
        c.set_write_timeout(Some(IO_TIMEOUT))
            .expect("write timeout");
        c
    }

    /// The process id. Panics when the server is not running.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("server is not running").id()
    }

    /// True while the process has not exited.
    pub fn is_running(&mut self) -> bool {
        match self.child.as_mut() {
            Some(c) => matches!(c.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// Path of the server's log file.
    pub fn log_path(&self) -> PathBuf {
        self.dir.join("server.log")
    }

    /// The whole log file (all runs of this server, restarts included).
    pub fn log(&self) -> String {
        fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// Last lines of the log file and of the captured stdout/stderr.
    pub fn log_tail(&self) -> String {
        let mut s = format!(
            "--- {} (last {LOG_TAIL_LINES} lines) ---\n{}",
            self.log_path().display(),
            file_tail(&self.log_path(), LOG_TAIL_LINES)
        );
        let out = file_tail(&self.dir.join("stdout.log"), 20);
        if !out.trim().is_empty() {
            s.push_str("\n--- stdout/stderr ---\n");
            s.push_str(&out);
        }
        s
    }

    /// SIGKILL the process and wait for it.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Graceful stop: `SHUTDOWN NOSAVE`, then SIGTERM, then SIGKILL (10 s each at most).
    pub fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        if let Ok(mut c) = self
            .client()
            .get_connection_with_timeout(Duration::from_secs(2))
        {
            let _ = c.set_read_timeout(Some(Duration::from_secs(5)));
            // The reply is normally a closed connection.
            let _: redis::RedisResult<()> = redis::cmd("SHUTDOWN").arg("NOSAVE").query(&mut c);
        }
        if wait_child(&mut child, Duration::from_secs(10)) {
            return;
        }
        // SAFETY: plain kill(2) on our own child's pid.
        unsafe {
            libc::kill(child.id() as libc::pid_t, libc::SIGTERM);
        }
        if !wait_child(&mut child, Duration::from_secs(10)) {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again: same binary, port, dir and arguments. Kills it first if it
    /// is still running. Panics with the log tail when it does not come up.
    pub fn restart(&mut self) {
        if let Err(e) = self.try_restart() {
            panic!("server failed to restart:\n{e}");
        }
    }

    /// Like [`restart`](Self::restart) but returns `Err(log tail)`.
    pub fn try_restart(&mut self) -> Result<(), String> {
        self.kill9();
        // The port was ours a moment ago; something else may hold it for a short while.
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            match self.launch() {
                Ok(()) => return Ok(()),
                Err(e) if e.contains("Address already in use") && Instant::now() < deadline => {
                    sleep(Duration::from_millis(200));
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Spawns the process and waits until it is ready; on failure the process is gone and
    /// the error holds the log tail.
    fn launch(&mut self) -> Result<(), String> {
        assert!(self.child.is_none(), "server already running");
        let out = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("stdout.log"))
            .map_err(|e| format!("open stdout.log: {e}"))?;
        let err = out.try_clone().map_err(|e| e.to_string())?;
        let child = Command::new(&self.bin)
            .args(&self.argv)
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(|e| format!("spawn {}: {e}", self.bin.display()))?;
        self.child = Some(child);
        match self.wait_ready(self.start_timeout) {
            Ok(()) => Ok(()),
            Err(why) => {
                self.kill9();
                Err(format!(
                    "{} on port {}: {why}\ncommand: {} {}\n{}",
                    self.bin.display(),
                    self.port,
                    self.bin.display(),
                    self.argv
                        .iter()
                        .map(|a| if a.is_empty() {
                            "\"\"".into()
                        } else {
                            a.clone()
                        })
                        .collect::<Vec<_>>()
                        .join(" "),
                    self.log_tail()
                ))
            }
        }
    }

    /// Waits until PING answers PONG and `INFO persistence` no longer says `loading:1`.
    pub fn wait_ready(&mut self, timeout: Duration) -> Result<(), String> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(c) = self.child.as_mut() {
                match c.try_wait() {
                    Ok(Some(status)) => return Err(format!("server exited early ({status})")),
                    Ok(None) => {}
                    Err(e) => return Err(format!("try_wait: {e}")),
                }
            } else {
                return Err("server is not running".into());
            }
            let last = match self.probe() {
                Ok(true) => return Ok(()),
                Ok(false) => "still loading".to_string(),
                Err(e) => e,
            };
            if Instant::now() >= deadline {
                return Err(format!("not ready within {timeout:?} (last: {last})"));
            }
            sleep(Duration::from_millis(20));
        }
    }

    fn probe(&self) -> Result<bool, String> {
        let mut c = self
            .client()
            .get_connection_with_timeout(Duration::from_millis(500))
            .map_err(|e| e.to_string())?;
        c.set_read_timeout(Some(Duration::from_secs(2)))
            .map_err(|e| e.to_string())?;
        let pong: String = redis::cmd("PING")
            .query(&mut c)
            .map_err(|e| e.to_string())?;
        if pong != "PONG" {
            return Err(format!("PING answered {pong:?}"));
        }
        let info: String = redis::cmd("INFO")
            .arg("persistence")
            .query(&mut c)
            .map_err(|e| e.to_string())?;
        Ok(info_field(&info, "loading").as_deref() != Some("1"))
    }

    /// `INFO <section>` parsed into the value of one field.
    pub fn info_field(&self, section: &str, field: &str) -> Option<String> {
        let mut c = self.conn();
        let info: String = redis::cmd("INFO").arg(section).query(&mut c).ok()?;
        info_field(&info, field)
    }
}

fn wait_child(child: &mut Child, timeout: Duration) -> bool {
    wait_until(timeout, || !matches!(child.try_wait(), Ok(None)))
}

fn keep_dirs() -> bool {
    std::env::var_os("LOCK_KEEP_DIRS").is_some_and(|v| !v.is_empty() && v != "0")
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill9();
        if std::thread::panicking() || keep_dirs() {
            eprintln!(
                "[harness] kept server dir {} (port {}, log {})",
                self.dir.display(),
                self.port,
                self.log_path().display()
            );
        } else if self.owns_dir {
            let _ = fs::remove_dir_all(&self.dir);
        }
    }
}

// ------------------------------------------------------------------------------------
// Cluster

/// A cluster of `masters` primaries (no replicas), every node started by the harness.
#[derive(Debug)]
pub struct Cluster {
    pub nodes: Vec<Server>,
}

impl Cluster {
    /// Starts `masters` nodes with the module loaded and joins them into one cluster.
    pub fn start(masters: usize) -> Cluster {
        Self::start_with(masters, |b| b)
    }

    /// Like [`start`](Self::start); `configure` adjusts each node's builder (e.g.
    /// `|b| b.no_module()` or `|b| b.module_args(&[...])`).
    pub fn start_with(
        masters: usize,
        configure: impl Fn(ServerBuilder) -> ServerBuilder,
    ) -> Cluster {
        assert!(masters >= 1, "a cluster needs at least one master");
        let nodes: Vec<Server> = (0..masters)
            .map(|_| {
                configure(ServerBuilder::new())
                    .arg("cluster-enabled", "yes")
                    .arg("cluster-config-file", "nodes.conf")
                    .arg("cluster-node-timeout", "5000")
                    .start()
            })
            .collect();
        let cluster = Cluster { nodes };
        if masters >= 3 {
            cluster.create_with_redis_cli();
        } else {
            // redis-cli --cluster create wants at least 3 masters: assign slots by hand.
            cluster.create_by_hand();
        }
        if !cluster.wait_ok(CLUSTER_TIMEOUT) {
            panic!(
                "cluster did not reach cluster_state:ok within {CLUSTER_TIMEOUT:?}\n{}",
                cluster.describe()
            );
        }
        cluster
    }

    fn create_with_redis_cli(&self) {
        let cli = redis_cli_bin();
        let mut cmd = Command::new(&cli);
        cmd.arg("--cluster").arg("create");
        for n in &self.nodes {
            cmd.arg(n.addr());
        }
        cmd.args(["--cluster-replicas", "0", "--cluster-yes"]);
        let log = self.nodes[0].dir.join("cluster-create.log");
        let out = fs::File::create(&log).expect("create cluster-create.log");
        let err = out.try_clone().expect("clone log handle");
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {} --cluster create: {e}", cli.display()));
        if !wait_child(&mut child, CLUSTER_TIMEOUT) {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "redis-cli --cluster create timed out\n{}",
                file_tail(&log, 40)
            );
        }
        let status = child.wait().expect("wait redis-cli");
        if !status.success() {
            panic!(
                "redis-cli --cluster create failed ({status})\n{}\n{}",
                file_tail(&log, 40),
                self.describe()
            );
        }
    }

    fn create_by_hand(&self) {
        let n = self.nodes.len();
        for (i, node) in self.nodes.iter().enumerate() {
            let first = i * 16384 / n;
            let last = (i + 1) * 16384 / n - 1;
            let mut c = node.conn();
            let slots: Vec<usize> = (first..=last).collect();
            let _: () = redis::cmd("CLUSTER")
                .arg("ADDSLOTS")
                .arg(&slots)
                .query(&mut c)
                .unwrap_or_else(|e| panic!("CLUSTER ADDSLOTS on {}: {e}", node.addr()));
        }
        let mut c0 = self.nodes[0].conn();
        for node in &self.nodes[1..] {
            let _: () = redis::cmd("CLUSTER")
                .arg("MEET")
                .arg("127.0.0.1")
                .arg(node.port)
                .query(&mut c0)
                .unwrap_or_else(|e| panic!("CLUSTER MEET {}: {e}", node.addr()));
        }
    }

    /// Waits until every node reports `cluster_state:ok` and knows every other node.
    pub fn wait_ok(&self, timeout: Duration) -> bool {
        let n = self.nodes.len().to_string();
        wait_until(timeout, || {
            self.nodes.iter().all(|node| {
                let info = cluster_info(node);
                info_field(&info, "cluster_state").as_deref() == Some("ok")
                    && info_field(&info, "cluster_known_nodes").as_deref() == Some(n.as_str())
            })
        })
    }

    /// `CLUSTER INFO` of every node, for failure messages.
    pub fn describe(&self) -> String {
        self.nodes
            .iter()
            .map(|n| format!("== {}\n{}\n{}", n.addr(), cluster_info(n), n.log_tail()))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// A cluster client seeded with every node, 10 s connect and response timeouts.
    pub fn cluster_client(&self) -> redis::cluster::ClusterClient {
        redis::cluster::ClusterClientBuilder::new(
            self.nodes.iter().map(|n| n.url()).collect::<Vec<_>>(),
        )
        .connection_timeout(IO_TIMEOUT)
        .response_timeout(IO_TIMEOUT)
        .build()
        .expect("build cluster client")
    }

    /// The node serving `key`'s hash slot.
    pub fn node_for_key(&self, key: &str) -> &Server {
        let slot = key_slot(key.as_bytes());
        let mut c = self.nodes[0].conn();
        let shards: redis::Value = redis::cmd("CLUSTER")
            .arg("SLOTS")
            .query(&mut c)
            .expect("CLUSTER SLOTS");
        let redis::Value::Array(ranges) = shards else {
            panic!("unexpected CLUSTER SLOTS reply {shards:?}")
        };
        for r in ranges {
            let redis::Value::Array(items) = r else {
                continue;
            };
            let num = |v: &redis::Value| match v {
                redis::Value::Int(i) => *i,
                _ => -1,
            };
            if items.len() < 3 {
                continue;
            }
            let (lo, hi) = (num(&items[0]), num(&items[1]));
            if (lo..=hi).contains(&(slot as i64)) {
                if let redis::Value::Array(master) = &items[2] {
                    let port = num(&master[1]);
                    if let Some(n) = self.nodes.iter().find(|n| i64::from(n.port) == port) {
                        return n;
                    }
                }
            }
        }
        panic!("no node serves slot {slot} of key {key:?}")
    }
}

fn cluster_info(node: &Server) -> String {
    let Ok(mut c) = node
        .client()
        .get_connection_with_timeout(Duration::from_secs(2))
    else {
        return String::new();
    };
    let _ = c.set_read_timeout(Some(Duration::from_secs(2)));
    redis::cmd("CLUSTER")
        .arg("INFO")
        .query::<String>(&mut c)
        .unwrap_or_default()
}

/// The cluster hash slot of a key (CRC16/XMODEM mod 16384, honouring `{hash tags}`).
pub fn key_slot(key: &[u8]) -> u16 {
    let mut k = key;
    if let Some(open) = key.iter().position(|&b| b == b'{') {
        if let Some(len) = key[open + 1..].iter().position(|&b| b == b'}') {
            if len > 0 {
                k = &key[open + 1..open + 1 + len];
            }
        }
    }
    let mut crc: u16 = 0;
    for &b in k {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % 16384
}

// ------------------------------------------------------------------------------------
// Raw RESP connection: exact reply types and error texts, RESP2 or RESP3 (`HELLO 3`).

/// One reply as the server sent it. `Nil` covers RESP2 `$-1` / `*-1` and RESP3 `_`.
#[derive(Debug, Clone, PartialEq)]
pub enum Resp {
    Simple(String),
    Error(String),
    Int(i64),
    Bulk(Vec<u8>),
    Nil,
    Array(Vec<Resp>),
    Map(Vec<(Resp, Resp)>),
    Set(Vec<Resp>),
    Push(Vec<Resp>),
    Double(String),
    Bool(bool),
    BigNum(String),
    Verbatim(String, Vec<u8>),
}

impl Resp {
    pub fn is_error(&self) -> bool {
        matches!(self, Resp::Error(_))
    }

    /// The integer of an `Int` reply; panics otherwise.
    pub fn int(&self) -> i64 {
        match self {
            Resp::Int(i) => *i,
            other => panic!("expected an integer reply, got {other:?}"),
        }
    }

    /// The bytes of a bulk, simple or verbatim string; panics otherwise.
    pub fn bytes(&self) -> Vec<u8> {
        match self {
            Resp::Bulk(b) | Resp::Verbatim(_, b) => b.clone(),
            Resp::Simple(s) => s.as_bytes().to_vec(),
            other => panic!("expected a string reply, got {other:?}"),
        }
    }

    /// `bytes()` as UTF-8 (lossy).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.bytes()).into_owned()
    }

    /// The elements of an array, set or push reply; panics otherwise.
    pub fn items(&self) -> Vec<Resp> {
        match self {
            Resp::Array(v) | Resp::Set(v) | Resp::Push(v) => v.clone(),
            other => panic!("expected an array reply, got {other:?}"),
        }
    }

    /// The error text (`"ERR ..."`); panics when the reply is not an error.
    pub fn err(&self) -> String {
        match self {
            Resp::Error(e) => e.clone(),
            other => panic!("expected an error reply, got {other:?}"),
        }
    }

    /// Field/value pairs of a RESP3 map or of a RESP2 flat field-value array, with the
    /// field names as text. Panics on anything else (or an odd-length array).
    pub fn pairs(&self) -> Vec<(String, Resp)> {
        match self {
            Resp::Map(m) => m.iter().map(|(k, v)| (k.text(), v.clone())).collect(),
            Resp::Array(a) => {
                assert!(a.len() % 2 == 0, "odd-length field/value array {a:?}");
                a.chunks(2).map(|p| (p[0].text(), p[1].clone())).collect()
            }
            other => panic!("expected a map or a flat field/value array, got {other:?}"),
        }
    }

    /// The value of one field of [`pairs`](Self::pairs).
    pub fn field(&self, name: &str) -> Option<Resp> {
        self.pairs()
            .into_iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v)
    }
}

/// True when `text` starts with an error code: one or more of `A-Z`, then (optionally)
/// `0-9`/`_`/`A-Z`, ended by a space or the end of the text (`ERR ...`, `WRONGTYPE ...`).
pub fn starts_with_error_code(text: &str) -> bool {
    let code = text.split(' ').next().unwrap_or("");
    code.as_bytes().first().is_some_and(u8::is_ascii_uppercase)
        && code
            .bytes()
            .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_')
}

/// A plain TCP connection speaking RESP by hand, so that tests see exactly what the
/// server sent (types, nils, maps, error texts) and can leave a command unanswered
/// (a blocked client) while they do other things.
pub struct RawConn {
    reader: std::io::BufReader<std::net::TcpStream>,
    writer: std::net::TcpStream,
}

impl RawConn {
    /// A RESP2 connection with [`IO_TIMEOUT`] read/write timeouts.
    pub fn connect(port: u16) -> RawConn {
        let s = std::net::TcpStream::connect(("127.0.0.1", port))
            .unwrap_or_else(|e| panic!("connect to 127.0.0.1:{port}: {e}"));
        s.set_read_timeout(Some(IO_TIMEOUT)).expect("read timeout");
        s.set_write_timeout(Some(IO_TIMEOUT))
            .expect("write timeout");
        s.set_nodelay(true).expect("nodelay");
        let w = s.try_clone().expect("clone stream");
        RawConn {
            reader: std::io::BufReader::new(s),
            writer: w,
        }
    }

    /// A connection switched to RESP3 with `HELLO 3` (panics when the server refuses).
    pub fn connect_resp3(port: u16) -> RawConn {
        let mut c = RawConn::connect(port);
        let hello = c.cmd(&["HELLO", "3"]);
        assert!(
            matches!(hello, Resp::Map(_)),
            "HELLO 3 should answer a RESP3 map, got {hello:?}"
        );
        c
    }

    pub fn set_read_timeout(&self, t: Option<Duration>) {
        self.writer.set_read_timeout(t).expect("set_read_timeout");
    }

    /// Sends one command without reading its reply.
    pub fn send<A: AsRef<[u8]>>(&mut self, args: &[A]) {
        use std::io::Write;
        let mut buf = format!("*{}\r\n", args.len()).into_bytes();
        for a in args {
            let a = a.as_ref();
            buf.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
            buf.extend_from_slice(a);
            buf.extend_from_slice(b"\r\n");
        }
        self.writer.write_all(&buf).expect("write command");
    }

    /// Writes bytes as they are (several commands in one write, malformed input).
    pub fn send_raw(&mut self, bytes: &[u8]) {
        use std::io::Write;
        self.writer.write_all(bytes).expect("write bytes");
    }

    /// Reads one reply (RESP3 attributes are skipped).
    pub fn read(&mut self) -> std::io::Result<Resp> {
        loop {
            let r = read_resp(&mut self.reader)?;
            if let Some(r) = r {
                return Ok(r);
            }
        }
    }

    /// Sends a command and reads its reply; panics on an I/O error or timeout.
    pub fn cmd<A: AsRef<[u8]>>(&mut self, args: &[A]) -> Resp {
        self.send(args);
        let name =
            String::from_utf8_lossy(args.first().map_or(&b""[..], |a| a.as_ref())).into_owned();
        self.read()
            .unwrap_or_else(|e| panic!("reading the reply to {name}: {e}"))
    }
}

fn resp_line(r: &mut impl std::io::BufRead) -> std::io::Result<Vec<u8>> {
    let mut line = Vec::new();
    r.read_until(b'\n', &mut line)?;
    if line.is_empty() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            "connection closed",
        ));
    }
    if !line.ends_with(b"\r\n") {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("line without CRLF: {:?}", String::from_utf8_lossy(&line)),
        ));
    }
    line.truncate(line.len() - 2);
    Ok(line)
}

fn resp_bad(what: &str) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_string())
}

fn resp_len(s: &[u8]) -> std::io::Result<i64> {
    std::str::from_utf8(s)
        .ok()
        .and_then(|s| s.parse::<i64>().ok())
        .ok_or_else(|| resp_bad(&format!("bad length {:?}", String::from_utf8_lossy(s))))
}

/// One RESP2/RESP3 value; `None` for an attribute (which precedes the real reply).
fn read_resp(r: &mut impl std::io::BufRead) -> std::io::Result<Option<Resp>> {
    let line = resp_line(r)?;
    let (&kind, rest) = line.split_first().ok_or_else(|| resp_bad("empty line"))?;
    let text = || String::from_utf8_lossy(rest).into_owned();
    let many = |n: i64, r: &mut dyn std::io::BufRead| -> std::io::Result<Vec<Resp>> {
        let mut v = Vec::new();
        for _ in 0..n {
            v.push(read_value(r)?);
        }
        Ok(v)
    };
    let blob = |n: i64, r: &mut dyn std::io::BufRead| -> std::io::Result<Vec<u8>> {
        let n = usize::try_from(n).map_err(|_| resp_bad("negative length"))?;
        let mut b = vec![0u8; n + 2];
        r.read_exact(&mut b)?;
        if !b.ends_with(b"\r\n") {
            return Err(resp_bad("blob without CRLF"));
        }
        b.truncate(n);
        Ok(b)
    };
    Ok(Some(match kind {
        b'+' => Resp::Simple(text()),
        b'-' => Resp::Error(text()),
        b':' => Resp::Int(resp_len(rest)?),
        b'$' => match resp_len(rest)? {
            -1 => Resp::Nil,
            n => Resp::Bulk(blob(n, r)?),
        },
        b'*' => match resp_len(rest)? {
            -1 => Resp::Nil,
            n => Resp::Array(many(n, r)?),
        },
        b'_' => Resp::Nil,
        b'#' => Resp::Bool(rest == b"t"),
        b',' => Resp::Double(text()),
        b'(' => Resp::BigNum(text()),
        b'!' => {
            let b = blob(resp_len(rest)?, r)?;
            Resp::Error(String::from_utf8_lossy(&b).into_owned())
        }
        b'=' => {
            let b = blob(resp_len(rest)?, r)?;
            let (fmt, body) = if b.len() >= 4 && b[3] == b':' {
                (
                    String::from_utf8_lossy(&b[..3]).into_owned(),
                    b[4..].to_vec(),
                )
            } else {
                (String::new(), b)
            };
            Resp::Verbatim(fmt, body)
        }
        b'~' => Resp::Set(many(resp_len(rest)?, r)?),
        b'>' => Resp::Push(many(resp_len(rest)?, r)?),
        b'%' => {
            let n = resp_len(rest)?;
            let flat = many(n.saturating_mul(2), r)?;
            Resp::Map(
                flat.chunks(2)
                    .map(|p| (p[0].clone(), p[1].clone()))
                    .collect(),
            )
        }
        b'|' => {
            let n = resp_len(rest)?;
            many(n.saturating_mul(2), r)?;
            return Ok(None);
        }
        other => {
            return Err(resp_bad(&format!(
                "unknown RESP type byte {:?} in {:?}",
                other as char,
                String::from_utf8_lossy(&line)
            )))
        }
    }))
}

fn read_value(r: &mut dyn std::io::BufRead) -> std::io::Result<Resp> {
    let mut r = r;
    loop {
        if let Some(v) = read_resp(&mut r)? {
            return Ok(v);
        }
    }
}

/// `INFO <section>` of a server as `field -> value` (comment and blank lines skipped).
pub fn info_map(c: &mut RawConn, section: &str) -> std::collections::HashMap<String, String> {
    let text = c.cmd(&["INFO", section]).text();
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.trim_end().split_once(':'))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// One numeric field of `INFO lock` (`lock_` prefix optional); panics when missing.
pub fn lock_stat(c: &mut RawConn, field: &str) -> i64 {
    let name = if field.starts_with("lock_") {
        field.to_string()
    } else {
        format!("lock_{field}")
    };
    let m = info_map(c, "lock");
    m.get(&name)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("INFO lock has no numeric {name}: {m:?}"))
}

/// Milliseconds since the Unix epoch, from this machine's clock.
pub fn unix_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}
