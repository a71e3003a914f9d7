//! Server processes (optionally inside a network namespace, under valgrind, or with an
//! LD_PRELOAD shim), network namespaces and nft link cuts, and signals.

use std::fs::{self, File};
use std::io::{self, Read, Seek, SeekFrom};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use crate::resp::Conn;

pub const IO_TIMEOUT: Duration = Duration::from_secs(10);

/// A loopback port that was free a moment ago.
pub fn free_port() -> io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Connects to `addr`, from inside network namespace `ns` when given: a short-lived
/// thread enters the namespace and opens the socket, which stays in that namespace.
pub fn connect(ns: Option<&str>, addr: SocketAddr, timeout: Duration) -> io::Result<Conn> {
    let stream = match ns {
        None => TcpStream::connect_timeout(&addr, timeout)?,
        Some(ns) => {
            let path = format!("/var/run/netns/{ns}");
            std::thread::spawn(move || -> io::Result<TcpStream> {
                let f = File::open(&path)?;
                // SAFETY: setns on a valid namespace fd; it only affects this thread.
                if unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                    return Err(io::Error::last_os_error());
                }
                TcpStream::connect_timeout(&addr, timeout)
            })
            .join()
            .map_err(|_| io::Error::other("connect thread panicked"))??
        }
    };
    Conn::from_stream(stream, IO_TIMEOUT)
}

/// Sends `sig` to `pid`.
pub fn signal(pid: u32, sig: libc::c_int) -> bool {
    // SAFETY: kill(2) on a pid we spawned.
    unsafe { libc::kill(pid as libc::pid_t, sig) == 0 }
}

pub fn file_tail(path: &Path, lines: usize) -> String {
    let Ok(mut f) = File::open(path) else {
        return String::new();
    };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = f.seek(SeekFrom::Start(len.saturating_sub(64 * 1024)));
    let mut buf = Vec::new();
    let _ = f.read_to_end(&mut buf);
    let text = String::from_utf8_lossy(&buf);
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

#[derive(Debug, Clone)]
pub struct ServerCfg {
    pub bin: PathBuf,
    pub host: Ipv4Addr,
    pub port: u16,
    pub dir: PathBuf,
    /// `--name value...` options after the defaults.
    pub args: Vec<(String, Vec<String>)>,
    /// The module and its arguments; `None` starts a plain server.
    pub module: Option<(PathBuf, Vec<String>)>,
    pub netns: Option<String>,
    pub env: Vec<(String, String)>,
    /// A command the server runs under (valgrind ...).
    pub wrapper: Vec<String>,
    pub ready_timeout: Duration,
}

impl ServerCfg {
    pub fn new(bin: &Path, dir: &Path, module: Option<&Path>) -> io::Result<ServerCfg> {
        Ok(ServerCfg {
            bin: bin.to_path_buf(),
            host: Ipv4Addr::LOCALHOST,
            port: free_port()?,
            dir: dir.to_path_buf(),
            args: Vec::new(),
            module: module.map(|m| (m.to_path_buf(), Vec::new())),
            netns: None,
            env: Vec::new(),
            wrapper: Vec::new(),
            ready_timeout: Duration::from_secs(20),
        })
    }

    pub fn arg(mut self, k: &str, vs: &[&str]) -> Self {
        self.args
            .push((k.to_string(), vs.iter().map(|s| s.to_string()).collect()));
        self
    }

    pub fn addr(&self) -> SocketAddr {
        SocketAddr::new(IpAddr::V4(self.host), self.port)
    }

    fn argv(&self) -> Vec<String> {
        let mut a: Vec<String> = Vec::new();
        let mut opt = |k: &str, vs: &[String]| {
            a.push(format!("--{k}"));
            a.extend(vs.iter().cloned());
        };
        let s = |x: &str| vec![x.to_string()];
        opt("bind", &s(&self.host.to_string()));
        opt("port", &s(&self.port.to_string()));
        opt("dir", &s(&self.dir.to_string_lossy()));
        opt(
            "logfile",
            &s(&self.dir.join("server.log").to_string_lossy()),
        );
        opt("save", &s(""));
        opt("appendonly", &s("no"));
        opt("daemonize", &s("no"));
        opt("protected-mode", &s("no"));
        for (k, vs) in &self.args {
            opt(k, vs);
        }
        if let Some((m, margs)) = &self.module {
            let mut vs = vec![m.to_string_lossy().into_owned()];
            vs.extend(margs.iter().cloned());
            opt("loadmodule", &vs);
        }
        a
    }
}

pub struct Server {
    pub cfg: ServerCfg,
    child: Option<Child>,
}

impl Server {
    pub fn start(cfg: ServerCfg) -> Result<Server, String> {
        fs::create_dir_all(&cfg.dir).map_err(|e| format!("mkdir {}: {e}", cfg.dir.display()))?;
        let mut s = Server { cfg, child: None };
        s.launch()?;
        Ok(s)
    }

    pub fn launch(&mut self) -> Result<(), String> {
        let out = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.cfg.dir.join("stdout.log"))
            .map_err(|e| e.to_string())?;
        let err = out.try_clone().map_err(|e| e.to_string())?;
        let mut argv: Vec<String> = Vec::new();
        if let Some(ns) = &self.cfg.netns {
            argv.extend(["ip", "netns", "exec", ns].map(String::from));
        }
        argv.extend(self.cfg.wrapper.iter().cloned());
        argv.push(self.cfg.bin.to_string_lossy().into_owned());
        argv.extend(self.cfg.argv());
        let mut cmd = Command::new(&argv[0]);
        cmd.args(&argv[1..])
            .current_dir(&self.cfg.dir)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        for (k, v) in &self.cfg.env {
            cmd.env(k, v);
        }
        let child = cmd.spawn().map_err(|e| format!("spawn {}: {e}", argv[0]))?;
        self.child = Some(child);
        let deadline = Instant::now() + self.cfg.ready_timeout;
        loop {
            if !self.is_running() {
                let tail = self.log_tail();
                self.child = None;
                return Err(format!("server exited at start-up\n{tail}"));
            }
            if let Ok(true) = self.ready() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                let tail = self.log_tail();
                self.kill9();
                return Err(format!("server not ready in time\n{tail}"));
            }
            sleep(Duration::from_millis(20));
        }
    }

    /// PING answers and the data set is loaded.
    fn ready(&self) -> io::Result<bool> {
        let mut c = self.connect_timeout(Duration::from_millis(500))?;
        c.set_read_timeout(Duration::from_secs(2))?;
        let pong = c.cmd(&crate::args!["PING"])?;
        if pong.as_text().as_deref() != Some("PONG") {
            return Ok(false);
        }
        let info = c.cmd(&crate::args!["INFO", "persistence"])?;
        Ok(!info.as_text().unwrap_or_default().contains("loading:1"))
    }

    pub fn connect(&self) -> io::Result<Conn> {
        self.connect_timeout(Duration::from_secs(5))
    }

    pub fn connect_timeout(&self, t: Duration) -> io::Result<Conn> {
        connect(self.cfg.netns.as_deref(), self.cfg.addr(), t)
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    pub fn is_running(&mut self) -> bool {
        match self.child.as_mut() {
            Some(c) => matches!(c.try_wait(), Ok(None)),
            None => false,
        }
    }

    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Waits up to `t` for the process to exit by itself (after SHUTDOWN).
    pub fn wait_exit(&mut self, t: Duration) -> bool {
        let deadline = Instant::now() + t;
        while Instant::now() < deadline {
            if !self.is_running() {
                self.child = None;
                return true;
            }
            sleep(Duration::from_millis(20));
        }
        false
    }

    pub fn log_path(&self) -> PathBuf {
        self.cfg.dir.join("server.log")
    }

    pub fn log_tail(&self) -> String {
        format!(
            "--- {}\n{}\n--- stdout\n{}",
            self.log_path().display(),
            file_tail(&self.log_path(), 30),
            file_tail(&self.cfg.dir.join("stdout.log"), 10)
        )
    }

    /// `INFO <section>` field value.
    pub fn info_field(&self, section: &str, field: &str) -> Option<String> {
        let mut c = self.connect().ok()?;
        let text = c.cmd(&crate::args!["INFO", section]).ok()?.as_text()?;
        info_field(&text, field)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill9();
    }
}

pub fn info_field(info: &str, field: &str) -> Option<String> {
    info.lines().find_map(|l| {
        l.trim_end()
            .strip_prefix(field)
            .and_then(|r| r.strip_prefix(':'))
            .map(str::to_string)
    })
}

/// Runs a command; Err with its output when it fails.
pub fn run(argv: &[&str]) -> Result<String, String> {
    let out = Command::new(argv[0])
        .args(&argv[1..])
        .stdin(Stdio::null())
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

/// A network namespace of our own with its loopback up; deleted on drop.
pub struct Netns {
    pub name: String,
}

impl Netns {
    pub fn create(name: &str) -> Result<Netns, String> {
        let _ = run(&["ip", "netns", "del", name]);
        run(&["ip", "netns", "add", name])?;
        let ns = Netns {
            name: name.to_string(),
        };
        ns.exec(&["ip", "link", "set", "lo", "up"])?;
        Ok(ns)
    }

    pub fn exec(&self, argv: &[&str]) -> Result<String, String> {
        let mut full = vec!["ip", "netns", "exec", &self.name];
        full.extend_from_slice(argv);
        run(&full)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = run(&["ip", "netns", "del", &self.name]);
    }
}

/// Drops TCP between `a` and `b:port` in both directions inside a namespace (nft).
pub struct LinkCut<'a> {
    ns: &'a Netns,
    cut: bool,
}

impl<'a> LinkCut<'a> {
    pub fn install(ns: &'a Netns) -> Result<LinkCut<'a>, String> {
        ns.exec(&["nft", "add", "table", "inet", "rlrel"])?;
        ns.exec(&[
            "nft",
            "add chain inet rlrel out { type filter hook output priority 0 ; policy accept ; }",
        ])?;
        Ok(LinkCut { ns, cut: false })
    }

    /// Starts dropping every packet from `replica` to `primary:port` and back.
    pub fn cut(&mut self, replica: Ipv4Addr, primary: Ipv4Addr, port: u16) -> Result<(), String> {
        let p = port.to_string();
        let (r, m) = (replica.to_string(), primary.to_string());
        self.ns.exec(&[
            "nft", "add", "rule", "inet", "rlrel", "out", "ip", "saddr", &r, "ip", "daddr", &m,
            "tcp", "dport", &p, "drop",
        ])?;
        self.ns.exec(&[
            "nft", "add", "rule", "inet", "rlrel", "out", "ip", "saddr", &m, "ip", "daddr", &r,
            "tcp", "sport", &p, "drop",
        ])?;
        self.cut = true;
        Ok(())
    }

    pub fn heal(&mut self) -> Result<(), String> {
        if self.cut {
            self.ns
                .exec(&["nft", "flush", "chain", "inet", "rlrel", "out"])?;
            self.cut = false;
        }
        Ok(())
    }
}

impl Drop for LinkCut<'_> {
    fn drop(&mut self) {
        let _ = self.ns.exec(&["nft", "delete", "table", "inet", "rlrel"]);
    }
}
