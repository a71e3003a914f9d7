//! Throw-away servers (any binary; restartable on the same port and directory; in a netns,
//! under valgrind or with an `LD_PRELOAD` shim) and the topologies built from them.

use std::fs::{self, File};
use std::io::{self, Read, Seek, SeekFrom};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use crate::resp::{RawConn, Resp};
use crate::{info_field, module_path, server_bin, temp_dir, wait_until};
use crate::{CLUSTER_TIMEOUT, IO_TIMEOUT, START_TIMEOUT};

const LOG_TAIL_LINES: usize = 60;
const PORT_RETRIES: usize = 5;

/// The last `n` lines of a file ("" when it does not exist); reads at most 256 KiB.
pub fn file_tail(path: &Path, n: usize) -> String {
    let Ok(mut f) = File::open(path) else {
        return String::new();
    };
    let len = f.metadata().map_or(0, |m| m.len());
    let _ = f.seek(SeekFrom::Start(len.saturating_sub(256 * 1024)));
    let mut buf = Vec::new();
    let _ = f.read_to_end(&mut buf);
    let text = String::from_utf8_lossy(&buf);
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// A TCP connection to `addr`, opened from inside network namespace `netns` when given
/// (a short-lived thread enters the namespace; the socket stays in it).
pub fn connect_in(
    netns: Option<&str>,
    addr: SocketAddr,
    timeout: Duration,
) -> io::Result<TcpStream> {
    let Some(ns) = netns else {
        return TcpStream::connect_timeout(&addr, timeout);
    };
    let path = format!("/var/run/netns/{ns}");
    std::thread::spawn(move || -> io::Result<TcpStream> {
        let f = File::open(&path)?;
        // SAFETY: setns on a namespace fd we just opened; it only affects this thread.
        if unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
            return Err(io::Error::last_os_error());
        }
        TcpStream::connect_timeout(&addr, timeout)
    })
    .join()
    .map_err(|_| io::Error::other("connect thread panicked"))?
}

/// `name(value) => field value;`: builder methods that set the field of that name.
macro_rules! setters {
    ($($(#[$doc:meta])* $name:ident($($v:ident: $t:ty)?) => $value:expr;)*) => {$(
        $(#[$doc])*
        pub fn $name(mut self, $($v: $t)?) -> Self {
            self.$name = $value;
            self
        }
    )*};
}

/// Builder for a throw-away server. Defaults: fresh temp dir, free port on 127.0.0.1,
/// module loaded, no persistence (`--save "" --appendonly no`), debug commands enabled.
#[derive(Debug, Clone, Default)]
pub struct ServerBuilder {
    bin: Option<PathBuf>,
    no_module: bool,
    module: Option<PathBuf>,
    module_args: Vec<String>,
    args: Vec<(String, Vec<String>)>,
    dir: Option<PathBuf>,
    port: Option<u16>,
    host: Option<Ipv4Addr>,
    netns: Option<String>,
    wrapper: Vec<String>,
    env: Vec<(String, String)>,
    die_with_parent: bool,
    start_timeout: Option<Duration>,
}

impl ServerBuilder {
    pub fn new() -> Self {
        Self::default()
    }

    /// Module arguments, appended after the `.so` on `--loadmodule`.
    pub fn module_args(mut self, args: &[&str]) -> Self {
        self.module_args.extend(args.iter().map(|s| s.to_string()));
        self
    }

    /// An extra `--k v` server option (after the defaults, so it overrides them).
    pub fn arg(self, k: &str, v: &str) -> Self {
        self.arg_multi(k, &[v])
    }

    /// An extra server option with several values (`--save 3600 1 300 100`), or none.
    pub fn arg_multi(mut self, k: &str, vs: &[&str]) -> Self {
        let vs = vs.iter().map(|s| s.to_string()).collect();
        self.args.push((k.trim_start_matches('-').to_string(), vs));
        self
    }

    setters! {
        /// Reuse a data directory (restart tests); a server never removes a dir it was given.
        dir(dir: PathBuf) => Some(dir);
        /// A fixed port (restart on the same port); no retry on "Address already in use".
        port(port: u16) => Some(port);
        no_module() => true;
        /// Load this module file instead of [`module_path()`].
        module(so: &Path) => Some(so.to_path_buf());
        /// Use another server binary than [`server_bin()`].
        bin(bin: PathBuf) => Some(bin);
        /// Listen on this address (inside a namespace: 127.0.0.2, ...).
        host(host: Ipv4Addr) => Some(host);
        /// Run inside network namespace `name` (`ip netns exec`; see [`crate::net::Netns`]).
        netns(name: &str) => Some(name.to_string());
        /// Run under a wrapper command (`valgrind --tool=...`).
        wrapper(argv: &[String]) => argv.to_vec();
        /// SIGKILL the server when the thread that started it ends (single-threaded callers).
        die_with_parent() => true;
        /// How long to wait for the server to come up (default 10 s).
        start_timeout(t: Duration) => Some(t);
    }

    /// An environment variable for the server (`LD_PRELOAD`, ...).
    pub fn env(mut self, k: &str, v: &str) -> Self {
        self.env.push((k.to_string(), v.to_string()));
        self
    }

    /// Starts the server and waits until it answers PING and is not loading.
    /// Panics with the tail of its log when it does not come up.
    pub fn start(self) -> Server {
        self.start_inner(true)
            .unwrap_or_else(|e| panic!("server failed to start:\n{e}"))
    }

    /// Like [`start`](Self::start), but returns `Err(log tail)` instead of panicking.
    pub fn try_start(self) -> Result<Server, String> {
        self.start_inner(false)
    }

    /// Starts the server with `replicaof primary` and waits up to `timeout` for its sync.
    pub fn try_start_replica_of(
        self,
        primary: &Server,
        timeout: Duration,
    ) -> Result<Server, String> {
        let (host, port) = (primary.host.to_string(), primary.port.to_string());
        let replica = self.arg_multi("replicaof", &[&host, &port]).try_start()?;
        replica.wait_synced(timeout)?;
        // The primary's side too: a replica may say its link is up while the primary still
        // holds it in a sync (state=wait_bgsave on Redis 7.0.15 under load, not yet online).
        primary.wait_replica_online(replica.port, timeout)?;
        Ok(replica)
    }

    fn start_inner(self, keep_dir_on_failure: bool) -> Result<Server, String> {
        let module = (!self.no_module).then(|| self.module.clone().unwrap_or_else(module_path));
        let (dir, owns_dir) = match &self.dir {
            Some(d) => {
                fs::create_dir_all(d).map_err(|e| format!("create {}: {e}", d.display()))?;
                (d.canonicalize().unwrap_or_else(|_| d.clone()), false)
            }
            None => (temp_dir(), true),
        };
        let host = self.host.unwrap_or(Ipv4Addr::LOCALHOST);
        let attempts = if self.port.is_some() { 1 } else { PORT_RETRIES };
        let mut last_err = String::new();
        for _ in 0..attempts {
            let port = self.port.unwrap_or_else(crate::free_port);
            let mut server = Server {
                port,
                host,
                dir: dir.clone(),
                bin: self.bin.clone().unwrap_or_else(server_bin),
                argv: self.argv(host, port, &dir, module.as_deref()),
                opts: self.clone(),
                child: None,
                owns_dir: false,
            };
            match server.launch() {
                Ok(()) => {
                    server.owns_dir = owns_dir;
                    return Ok(server);
                }
                Err(e) if e.contains("Address already in use") => {
                    last_err = e;
                    // The next attempt starts with clean logs.
                    let _ = fs::remove_file(dir.join("server.log"));
                    let _ = fs::remove_file(dir.join("stdout.log"));
                }
                Err(e) => {
                    last_err = e;
                    break;
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

    fn argv(&self, host: Ipv4Addr, port: u16, dir: &Path, module: Option<&Path>) -> Vec<String> {
        let text = |p: &Path| p.to_string_lossy().into_owned();
        let mut opts: Vec<(String, Vec<String>)> = [
            ("bind", host.to_string()),
            ("port", port.to_string()),
            ("dir", text(dir)),
            ("logfile", text(&dir.join("server.log"))),
            ("save", String::new()),
            ("appendonly", "no".into()),
            ("daemonize", "no".into()),
            ("protected-mode", "no".into()),
            ("enable-debug-command", "yes".into()),
        ]
        .map(|(k, v)| (k.to_string(), vec![v]))
        .to_vec();
        opts.extend(self.args.iter().cloned());
        if let Some(m) = module {
            let so_and_args = [vec![text(m)], self.module_args.clone()].concat();
            opts.push(("loadmodule".into(), so_and_args));
        }
        let flag = |(k, vs): (String, Vec<String>)| std::iter::once(format!("--{k}")).chain(vs);
        opts.into_iter().flat_map(flag).collect()
    }
}

/// A running (or stopped, restartable) server process. Dropping it kills the process and
/// removes its directory if it created it (kept, and its path printed, after a panic).
#[derive(Debug)]
pub struct Server {
    pub port: u16,
    pub host: Ipv4Addr,
    pub dir: PathBuf,
    bin: PathBuf,
    argv: Vec<String>,
    /// What it was built with (namespace, wrapper, environment, start timeout).
    opts: ServerBuilder,
    child: Option<Child>,
    owns_dir: bool,
}

impl Server {
    /// `redis://host:port/`
    pub fn url(&self) -> String {
        format!("redis://{}:{}/", self.host, self.port)
    }

    /// `host:port`
    pub fn addr(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }

    pub fn socket_addr(&self) -> SocketAddr {
        SocketAddr::from((self.host, self.port))
    }

    pub fn client(&self) -> redis::Client {
        redis::Client::open(self.url()).expect("redis::Client::open")
    }

    /// A new `redis` connection with 10 s connect/read/write timeouts (not in a netns).
    pub fn conn(&self) -> redis::Connection {
        let c = self
            .client()
            .get_connection_with_timeout(IO_TIMEOUT)
            .unwrap_or_else(|e| panic!("connect to {}: {e}", self.addr()));
        let t = Some(IO_TIMEOUT);
        c.set_read_timeout(t).expect("read timeout");
        c.set_write_timeout(t).expect("write timeout");
        c
    }

    /// A [`RawConn`] (from inside the server's network namespace, if any).
    pub fn try_raw(&self, timeout: Duration) -> io::Result<RawConn> {
        let s = connect_in(self.opts.netns.as_deref(), self.socket_addr(), timeout)?;
        RawConn::from_stream(s, timeout)
    }

    /// [`try_raw`](Self::try_raw) with [`IO_TIMEOUT`]; panics on failure.
    pub fn raw(&self) -> RawConn {
        self.try_raw(IO_TIMEOUT)
            .unwrap_or_else(|e| panic!("connect to {}: {e}", self.addr()))
    }

    /// The process id, `None` when the server is not running.
    pub fn try_pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The process id. Panics when the server is not running.
    pub fn pid(&self) -> u32 {
        self.try_pid().expect("server is not running")
    }

    /// True while the process has not exited.
    pub fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

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

    /// Waits up to `t` for the process to exit by itself (after SHUTDOWN).
    pub fn wait_exit(&mut self, t: Duration) -> bool {
        let exited = match self.child.as_mut() {
            Some(c) => wait_until(t, || !matches!(c.try_wait(), Ok(None))),
            None => true,
        };
        if exited {
            self.child = None;
        }
        exited
    }

    /// Graceful stop: `SHUTDOWN NOSAVE`, then SIGTERM, then SIGKILL (10 s each at most).
    pub fn stop(&mut self) {
        let Some(pid) = self.try_pid() else { return };
        if let Ok(mut c) = self.try_raw(Duration::from_secs(2)) {
            // The reply is normally a closed connection.
            let _ = c.call(&["SHUTDOWN", "NOSAVE"]);
        }
        if self.wait_exit(Duration::from_secs(10)) {
            return;
        }
        crate::signal(pid, libc::SIGTERM);
        if !self.wait_exit(Duration::from_secs(10)) {
            self.kill9();
        }
    }

    /// Starts the server again (same binary, port, dir and arguments), killing it first if
    /// it still runs. Panics with the log tail when it does not come up.
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
                Err(e) if e.contains("Address already in use") && Instant::now() < deadline => {
                    sleep(Duration::from_millis(200));
                }
                r => return r,
            }
        }
    }

    /// Restarts the server (same port, dir and arguments) as a replica of `primary`, so
    /// that it never comes up as a primary of its own (a killed primary rejoining).
    pub fn try_restart_as_replica_of(&mut self, primary: &Server) -> Result<(), String> {
        if let Some(i) = self.argv.iter().position(|a| a == "--replicaof") {
            self.argv.drain(i..(i + 3).min(self.argv.len()));
        }
        let (host, port) = (primary.host.to_string(), primary.port.to_string());
        self.argv.extend(["--replicaof".to_string(), host, port]);
        self.try_restart()
    }

    /// `master` or `slave` (the first element of `ROLE`), `None` when unreachable.
    pub fn role(&self) -> Option<String> {
        let r = self.ask(Duration::from_secs(2), &["ROLE"])?;
        r.as_items()?.first()?.as_text()
    }

    /// The reply to `cmd` on a new connection, `None` when unreachable.
    fn ask(&self, timeout: Duration, cmd: &[&str]) -> Option<Resp> {
        self.try_raw(timeout).ok()?.call(cmd).ok()
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
        let mut argv: Vec<String> = Vec::new();
        if let Some(ns) = &self.opts.netns {
            argv.extend(["ip", "netns", "exec", ns].map(String::from));
        }
        argv.extend(self.opts.wrapper.iter().cloned());
        argv.push(self.bin.to_string_lossy().into_owned());
        argv.extend(self.argv.iter().cloned());
        let mut cmd = Command::new(&argv[0]);
        cmd.args(&argv[1..])
            .envs(self.opts.env.iter().map(|(k, v)| (k, v)))
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        if self.opts.die_with_parent {
            // SAFETY: prctl is async-signal-safe and touches no memory of ours.
            unsafe {
                cmd.pre_exec(|| {
                    libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                    Ok(())
                });
            }
        }
        let child = cmd.spawn().map_err(|e| format!("spawn {}: {e}", argv[0]))?;
        self.child = Some(child);
        self.wait_ready().map_err(|why| {
            self.kill9();
            let shown: Vec<&str> = argv
                .iter()
                .map(|a| if a.is_empty() { "\"\"" } else { a })
                .collect();
            format!(
                "{} on port {}: {why}\ncommand: {}\n{}",
                self.bin.display(),
                self.port,
                shown.join(" "),
                self.log_tail()
            )
        })
    }

    /// Waits until PING answers PONG and `INFO persistence` no longer says `loading:1`.
    fn wait_ready(&mut self) -> Result<(), String> {
        let timeout = self.opts.start_timeout.unwrap_or(START_TIMEOUT);
        let deadline = Instant::now() + timeout;
        loop {
            match self.child.as_mut().map(Child::try_wait) {
                None => return Err("server is not running".into()),
                Some(Ok(Some(status))) => return Err(format!("server exited early ({status})")),
                Some(Err(e)) => return Err(format!("try_wait: {e}")),
                Some(Ok(None)) => {}
            }
            let last = match self.probe() {
                Ok(true) => return Ok(()),
                Ok(false) => "still loading".to_string(),
                Err(e) => e.to_string(),
            };
            if Instant::now() >= deadline {
                return Err(format!("not ready within {timeout:?} (last: {last})"));
            }
            sleep(Duration::from_millis(20));
        }
    }

    fn probe(&self) -> io::Result<bool> {
        let mut c = self.try_raw(Duration::from_millis(500))?;
        c.try_set_read_timeout(Some(Duration::from_secs(2)))?;
        let pong = c.call(&["PING"])?;
        if pong.as_text().as_deref() != Some("PONG") {
            return Err(io::Error::other(format!("PING answered {pong:?}")));
        }
        let info = c.call(&["INFO", "persistence"])?.as_text();
        Ok(info.and_then(|t| info_field(&t, "loading")).as_deref() != Some("1"))
    }

    /// The value of one `INFO <section>` field, `None` when absent or unreachable.
    pub fn info_field(&self, section: &str, field: &str) -> Option<String> {
        info_field(&self.info_section(section)?, field)
    }

    /// The text of `INFO <section>`, `None` when unreachable.
    pub fn info_section(&self, section: &str) -> Option<String> {
        self.ask(IO_TIMEOUT, &["INFO", section])?.as_text()
    }

    /// Waits until this primary lists its replica on `port` as `state=online`.
    pub fn wait_replica_online(&self, port: u16, timeout: Duration) -> Result<(), String> {
        let online = format!("port={port},state=online");
        let seen = || {
            let text = self.info_section("replication");
            text.is_some_and(|t| t.contains(&online))
        };
        self.wait_for(timeout, seen, "the primary never saw its replica online")
    }

    /// Waits until this replica's link to its primary is up and no sync is running.
    pub fn wait_synced(&self, timeout: Duration) -> Result<(), String> {
        let is = |field, want| self.info_field("replication", field).as_deref() == Some(want);
        let synced = || is("master_link_status", "up") && is("master_sync_in_progress", "0");
        self.wait_for(timeout, synced, "replica never synced")
    }

    /// True when no background save or AOF rewrite runs or is scheduled.
    pub fn persistence_idle(&self) -> bool {
        [
            "aof_rewrite_in_progress",
            "aof_rewrite_scheduled",
            "rdb_bgsave_in_progress",
        ]
        .iter()
        .all(|f| self.info_field("persistence", f).as_deref() == Some("0"))
    }

    /// Runs BGREWRITEAOF (started now, or scheduled behind a save or a replica's sync)
    /// and waits up to `timeout` until no save or rewrite runs or is scheduled and the
    /// rewrite has succeeded.
    pub fn rewrite_aof(&self, timeout: Duration) -> Result<(), String> {
        let r = self.ask(IO_TIMEOUT, &["BGREWRITEAOF"]);
        let text = r.as_ref().and_then(Resp::as_text).unwrap_or_default();
        if !text.starts_with("Background append only file rewriting") {
            return Err(format!("BGREWRITEAOF answered {r:?}"));
        }
        self.wait_for(
            timeout,
            || self.persistence_idle(),
            "the AOF rewrite did not end",
        )?;
        match self.info_field("persistence", "aof_last_bgrewrite_status") {
            Some(s) if s == "ok" => Ok(()),
            s => Err(format!("the AOF rewrite ended {s:?}\n{}", self.log_tail())),
        }
    }

    /// `Err(what + log tail)` unless `f` turns true within `timeout`.
    fn wait_for(&self, t: Duration, f: impl FnMut() -> bool, what: &str) -> Result<(), String> {
        let log = || format!("{what}\n{}", self.log_tail());
        wait_until(t, f).then_some(()).ok_or_else(log)
    }
}

fn keep_dirs() -> bool {
    std::env::var_os("LOCK_KEEP_DIRS").is_some_and(|v| !v.is_empty() && v != "0")
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill9();
        if std::thread::panicking() || keep_dirs() {
            eprintln!(
                "[testkit] kept server dir {} (port {}, log {})",
                self.dir.display(),
                self.port,
                self.log_path().display()
            );
        } else if self.owns_dir {
            let _ = fs::remove_dir_all(&self.dir);
        }
    }
}

/// A primary and one replica of it, both started from builders.
#[derive(Debug)]
pub struct ReplicaPair {
    pub primary: Server,
    pub replica: Server,
}

impl ReplicaPair {
    /// Starts `primary`, then `replica` with `replicaof` pointing at it, and waits for
    /// the first full sync.
    pub fn try_start_with(
        primary: ServerBuilder,
        replica: ServerBuilder,
    ) -> Result<ReplicaPair, String> {
        let primary = primary.try_start()?;
        let replica = replica.try_start_replica_of(&primary, Duration::from_secs(20))?;
        Ok(ReplicaPair { primary, replica })
    }

    /// A coordinated `FAILOVER` (Redis 6.2+); once both report their new role and the new
    /// replica is synced, `primary` and `replica` swap. An aborted failover is an `Err`.
    pub fn failover(&mut self, timeout: Duration) -> Result<(), String> {
        self.primary
            .wait_replica_online(self.replica.port, timeout)?;
        let ms = timeout.as_millis().to_string();
        let conn = self.primary.try_raw(IO_TIMEOUT);
        let r = conn.and_then(|mut c| c.call(&["FAILOVER", "TIMEOUT", &ms]));
        match r {
            Ok(r) if !r.is_error() => {}
            r => return Err(format!("FAILOVER: {r:?}")),
        }
        let swapped = wait_until(timeout + Duration::from_secs(2), || {
            self.replica.role().as_deref() == Some("master")
                && self.primary.role().as_deref() == Some("slave")
        });
        if !swapped {
            return Err(format!(
                "FAILOVER did not complete within {timeout:?} (roles: {:?} / {:?})",
                self.primary.role(),
                self.replica.role()
            ));
        }
        std::mem::swap(&mut self.primary, &mut self.replica);
        self.replica.wait_synced(Duration::from_secs(20))
    }
}

/// A cluster of `masters` primaries (no replicas), every node started by the kit.
#[derive(Debug)]
pub struct Cluster {
    pub nodes: Vec<Server>,
}

impl Cluster {
    /// Starts `masters` nodes with the module loaded and joins them into one cluster.
    pub fn start(masters: usize) -> Cluster {
        Self::start_with(masters, |b| b)
    }

    /// Like [`start`](Self::start); `configure` adjusts each node's builder.
    pub fn start_with(
        masters: usize,
        configure: impl Fn(ServerBuilder) -> ServerBuilder,
    ) -> Cluster {
        Self::try_start_with(masters, configure).unwrap_or_else(|e| panic!("{e}"))
    }

    pub fn try_start_with(
        masters: usize,
        configure: impl Fn(ServerBuilder) -> ServerBuilder,
    ) -> Result<Cluster, String> {
        if masters == 0 {
            return Err("a cluster needs at least one master".into());
        }
        let nodes = (0..masters)
            .map(|_| {
                configure(ServerBuilder::new())
                    .arg("cluster-enabled", "yes")
                    .arg("cluster-config-file", "nodes.conf")
                    .arg("cluster-node-timeout", "5000")
                    .try_start()
            })
            .collect::<Result<Vec<_>, _>>()?;
        let cluster = Cluster { nodes };
        // Each node takes its share of the slots and its own config epoch (as `redis-cli
        // --cluster create`), then node 0 meets the others. With all epochs at 0 the nodes
        // settle by gossip, and a migration meanwhile meets "I'm not the owner of hash slot".
        let n = cluster.nodes.len();
        let check = |r: io::Result<Resp>, what: String| match r {
            Ok(r) if !r.is_error() => Ok(()),
            r => Err(format!("{what}: {r:?}")),
        };
        for (i, node) in cluster.nodes.iter().enumerate() {
            let mut cmd = vec!["CLUSTER".to_string(), "ADDSLOTS".to_string()];
            cmd.extend((i * 16384 / n..(i + 1) * 16384 / n).map(|s| s.to_string()));
            let addr = node.addr();
            check(node.raw().call(&cmd), format!("CLUSTER ADDSLOTS on {addr}"))?;
            let epoch = ["CLUSTER", "SET-CONFIG-EPOCH", &(i + 1).to_string()];
            let what = format!("{} on {addr}", epoch.join(" "));
            check(node.raw().call(&epoch), what)?;
        }
        let mut c0 = cluster.nodes[0].raw();
        for node in &cluster.nodes[1..] {
            let port = node.port.to_string();
            let meet = c0.call(&["CLUSTER", "MEET", "127.0.0.1", &port]);
            check(meet, format!("CLUSTER MEET {}", node.addr()))?;
        }
        if !cluster.wait_ok(CLUSTER_TIMEOUT) {
            return Err(format!(
                "cluster did not reach cluster_state:ok within {CLUSTER_TIMEOUT:?}\n{}",
                cluster.describe()
            ));
        }
        Ok(cluster)
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

    /// The index of the node serving `slot`, from node 0's `CLUSTER SLOTS`.
    pub fn slot_owner(&self, slot: u16) -> Option<usize> {
        let slots = self.nodes[0].ask(IO_TIMEOUT, &["CLUSTER", "SLOTS"])?;
        slots.as_items()?.iter().find_map(|range| {
            let [lo, hi, master, ..] = range.as_items()? else {
                return None;
            };
            let port = master.as_items()?.get(1)?.as_int()?;
            (lo.as_int()?..=hi.as_int()?)
                .contains(&i64::from(slot))
                .then(|| self.nodes.iter().position(|n| i64::from(n.port) == port))?
        })
    }

    /// Waits until every node says node `owner` serves `slot` (`CLUSTER SLOTS`) and all
    /// know the same current epoch: a node taking a slot bumps its config epoch only when
    /// it is not the highest it knows of, so a slot moved on before the epochs settled can
    /// be claimed back by an older owner's higher epoch.
    pub fn wait_slot_owner(&self, slot: u16, owner: usize, timeout: Duration) -> bool {
        let port = i64::from(self.nodes[owner].port);
        wait_until(timeout, || {
            let epochs: Vec<Option<String>> = (self.nodes.iter())
                .map(|n| info_field(&cluster_info(n), "cluster_current_epoch"))
                .collect();
            epochs[0].is_some()
                && epochs.iter().all(|e| *e == epochs[0])
                && self.nodes.iter().all(|n| {
                    let slots = n.ask(IO_TIMEOUT, &["CLUSTER", "SLOTS"]);
                    slots
                        .as_ref()
                        .and_then(Resp::as_items)
                        .is_some_and(|ranges| {
                            ranges.iter().any(|range| match range.as_items() {
                                Some([lo, hi, master, ..]) => {
                                    let within = (lo.as_int().unwrap_or(-1)
                                        ..=hi.as_int().unwrap_or(-1))
                                        .contains(&i64::from(slot));
                                    within
                                        && master.as_items().and_then(|m| m.get(1)?.as_int())
                                            == Some(port)
                                }
                                _ => false,
                            })
                        })
                })
        })
    }

    /// Moves `slot` to node `to` as `redis-cli --cluster reshard` does (IMPORTING, MIGRATING,
    /// MIGRATE every key, then SETSLOT NODE on the target, the source and the others), with
    /// `pause` before SETSLOT NODE (clients meet ASK and TRYAGAIN). Returns the keys moved.
    pub fn migrate_slot(&self, slot: u16, to: usize, pause: Duration) -> Result<u64, String> {
        let from = self
            .slot_owner(slot)
            .ok_or_else(|| format!("nobody serves slot {slot}"))?;
        if from == to {
            return Ok(0);
        }
        let mut conns = (self.nodes.iter())
            .map(|n| n.try_raw(IO_TIMEOUT).map_err(|e| e.to_string()))
            .collect::<Result<Vec<_>, _>>()?;
        let ids = Self::ids_of(&mut conns)?;
        self.move_slot(&mut conns, &ids, slot, from, to, pause)
    }

    /// Every node's id (`CLUSTER MYID`), over `conns` (one per node, in order).
    pub fn ids_of(conns: &mut [RawConn]) -> Result<Vec<String>, String> {
        (conns.iter_mut())
            .map(|c| match c.call(&["CLUSTER", "MYID"]) {
                Ok(Resp::Bulk(id)) => Ok(String::from_utf8_lossy(&id).into_owned()),
                r => Err(format!("CLUSTER MYID: {r:?}")),
            })
            .collect()
    }

    /// [`migrate_slot`](Self::migrate_slot) from a known owner over open connections (one
    /// per node, in order) and the nodes' ids: a few round trips per slot, for callers
    /// that move many.
    pub fn move_slot(
        &self,
        conns: &mut [RawConn],
        ids: &[String],
        slot: u16,
        from: usize,
        to: usize,
        pause: Duration,
    ) -> Result<u64, String> {
        let s = slot.to_string();
        let mut ok = |i: usize, cmd: &[&str]| match conns[i].call(cmd) {
            Ok(r) if !r.is_error() => Ok(r),
            r => Err(format!("{} on slot {slot}: {r:?}", cmd.join(" "))),
        };
        let (src_id, dst_id) = (ids[from].as_str(), ids[to].as_str());
        ok(to, &["CLUSTER", "SETSLOT", &s, "IMPORTING", src_id])?;
        ok(from, &["CLUSTER", "SETSLOT", &s, "MIGRATING", dst_id])?;
        let (host, port) = (
            self.nodes[to].host.to_string(),
            self.nodes[to].port.to_string(),
        );
        let mut moved = 0;
        for _ in 0..100 {
            let keys = ok(from, &["CLUSTER", "GETKEYSINSLOT", &s, "100"])?;
            let keys: Vec<String> = keys
                .as_items()
                .unwrap_or_default()
                .iter()
                .filter_map(|k| k.as_text())
                .collect();
            if keys.is_empty() {
                break;
            }
            for k in &keys {
                let r = ok(from, &["MIGRATE", &host, &port, k, "0", "5000"])?;
                moved += u64::from(r.as_text().as_deref() == Some("OK"));
            }
        }
        let left = ok(from, &["CLUSTER", "COUNTKEYSINSLOT", &s])?;
        if left.as_int() != Some(0) {
            return Err(format!(
                "slot {slot}: the source still holds {left:?} keys after MIGRATE"
            ));
        }
        sleep(pause);
        let setslot = ["CLUSTER", "SETSLOT", &s, "NODE", dst_id];
        ok(to, &setslot)?;
        ok(from, &setslot)?;
        for i in (0..self.nodes.len()).filter(|&i| i != from && i != to) {
            ok(i, &setslot)?;
        }
        Ok(moved)
    }

    /// `CLUSTER INFO` and the log tail of every node, for failure messages.
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
            self.nodes.iter().map(Server::url).collect::<Vec<_>>(),
        )
        .connection_timeout(IO_TIMEOUT)
        .response_timeout(IO_TIMEOUT)
        .build()
        .expect("build cluster client")
    }

    /// The node serving `key`'s hash slot (asked with `CLUSTER SLOTS`).
    pub fn node_for_key(&self, key: &str) -> &Server {
        let slot = key_slot(key.as_bytes());
        let owner = self.slot_owner(slot);
        &self.nodes[owner.unwrap_or_else(|| panic!("no node serves slot {slot} of key {key:?}"))]
    }
}

fn cluster_info(node: &Server) -> String {
    let info = node.ask(Duration::from_secs(2), &["CLUSTER", "INFO"]);
    info.and_then(|r| r.as_text()).unwrap_or_default()
}

/// The cluster hash slot of a key: CRC16 (XMODEM) mod 16384 of the key, or of its
/// `{hash tag}` when it has a non-empty one (the `redis` crate keeps its own private).
pub fn key_slot(key: &[u8]) -> u16 {
    let tagged = key.iter().position(|&b| b == b'{').and_then(|open| {
        let len = key[open + 1..].iter().position(|&b| b == b'}')?;
        (len > 0).then(|| &key[open + 1..open + 1 + len])
    });
    let mut crc: u16 = 0;
    for &b in tagged.unwrap_or(key) {
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

#[cfg(test)]
mod tests {
    use super::key_slot;

    #[test]
    fn key_slots_as_redis_cluster_computes_them() {
        // CRC16/XMODEM("123456789") = 0x31C3; "foo" is 12182 in the Redis docs.
        assert_eq!(key_slot(b"123456789"), 0x31C3);
        assert_eq!(key_slot(b"foo"), 12182);
        assert_eq!(key_slot(b""), 0);
        assert_eq!(key_slot(b"{user1000}.following"), key_slot(b"user1000"));
        assert_eq!(
            key_slot(b"a{}b"),
            key_slot(b"a{}b"),
            "an empty tag hashes the key"
        );
        assert_ne!(key_slot(b"a{}b"), key_slot(b""));
    }
}
