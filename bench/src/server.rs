//! Throw-away servers on free loopback ports, each in its own directory, with the
//! module loaded; stopped (and their directory removed) on drop.

use std::fs;
use std::io;
use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use crate::resp::{Conn, Reply};

/// A server binary to benchmark against.
#[derive(Debug, Clone)]
pub struct ServerSpec {
    /// "Redis 7.0.15", "Valkey 8.1.8".
    pub label: String,
    pub bin: PathBuf,
}

impl ServerSpec {
    /// Reads the flavor and version from `<bin> --version`.
    pub fn detect(bin: &Path) -> io::Result<ServerSpec> {
        let out = Command::new(bin).arg("--version").output()?;
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        let flavor = if text.to_ascii_lowercase().starts_with("valkey") {
            "Valkey"
        } else {
            "Redis"
        };
        let version = text
            .split_whitespace()
            .find_map(|w| w.strip_prefix("v="))
            .ok_or_else(|| {
                io::Error::other(format!("{}: no version in {text:?}", bin.display()))
            })?;
        Ok(ServerSpec {
            label: format!("{flavor} {version}"),
            bin: bin.to_path_buf(),
        })
    }
}

pub struct Server {
    child: Child,
    pub port: u16,
    pub dir: PathBuf,
    pub label: String,
}

fn free_port() -> io::Result<u16> {
    let l = TcpListener::bind("127.0.0.1:0")?;
    Ok(l.local_addr()?.port())
}

static NEXT_DIR: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

impl Server {
    /// Starts `spec` with the module; `wrapper` (e.g. valgrind and its options) goes in
    /// front of the server binary. Waits until it answers PING.
    pub fn start(
        spec: &ServerSpec,
        module: &Path,
        work: &Path,
        wrapper: &[String],
        ready_timeout: Duration,
    ) -> io::Result<Server> {
        let mut last_err = None;
        for _ in 0..5 {
            match Self::try_start(spec, module, work, wrapper, ready_timeout) {
                Ok(s) => return Ok(s),
                Err(e) => last_err = Some(e),
            }
        }
        Err(last_err.unwrap_or_else(|| io::Error::other("server did not start")))
    }

    fn try_start(
        spec: &ServerSpec,
        module: &Path,
        work: &Path,
        wrapper: &[String],
        ready_timeout: Duration,
    ) -> io::Result<Server> {
        let port = free_port()?;
        let n = NEXT_DIR.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = work.join(format!("server-{}-{port}-{n}", std::process::id()));
        fs::create_dir_all(&dir)?;
        let args: Vec<String> = [
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--protected-mode",
            "no",
            "--maxclients",
            "15000",
            "--dir",
            &dir.to_string_lossy(),
            "--logfile",
            "server.log",
            "--loadmodule",
            &module.to_string_lossy(),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let mut cmd = match wrapper.split_first() {
            Some((first, rest)) => {
                let mut c = Command::new(first);
                c.args(rest).arg(&spec.bin);
                c
            }
            None => Command::new(&spec.bin),
        };
        // If this process dies (Ctrl-C, kill), the kernel stops the server too.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        cmd.args(&args)
            .current_dir(&dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(fs::File::create(dir.join("stderr.log"))?));
        let child = cmd.spawn()?;
        let mut server = Server {
            child,
            port,
            dir,
            label: spec.label.clone(),
        };
        let deadline = Instant::now() + ready_timeout;
        loop {
            if let Ok(Some(status)) = server.child.try_wait() {
                return Err(io::Error::other(format!(
                    "{} exited at start ({status}); log:\n{}",
                    spec.label,
                    server.log_tail()
                )));
            }
            if let Ok(mut c) = Conn::connect(port, Duration::from_secs(5)) {
                if let Ok(Reply::Status(s)) = c.call(&[b"PING"]) {
                    if s == "PONG" {
                        return Ok(server);
                    }
                }
            }
            if Instant::now() > deadline {
                return Err(io::Error::other(format!(
                    "{} did not answer PING in {ready_timeout:?}; log:\n{}",
                    spec.label,
                    server.log_tail()
                )));
            }
            sleep(Duration::from_millis(50));
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn conn(&self) -> io::Result<Conn> {
        Conn::connect(self.port, Duration::from_secs(120))
    }

    pub fn log_tail(&self) -> String {
        let mut s = String::new();
        for f in ["server.log", "stderr.log"] {
            if let Ok(t) = fs::read_to_string(self.dir.join(f)) {
                let lines: Vec<&str> = t.lines().collect();
                let from = lines.len().saturating_sub(30);
                s.push_str(&lines[from..].join("\n"));
                s.push('\n');
            }
        }
        s
    }

    /// Stops the server: SIGTERM, then SIGKILL if it lingers.
    pub fn stop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
            let deadline = Instant::now() + Duration::from_secs(30);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = self.child.try_wait() {
                    break;
                }
                sleep(Duration::from_millis(50));
            }
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
        let _ = fs::remove_dir_all(&self.dir);
    }
}
