//! The server the benchmark runs against: a throw-away `redis-server` with the module,
//! on a free loopback port and in its own temporary directory, killed on drop.

use std::fs;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use crate::Error;

pub struct Server {
    pub port: u16,
    /// `redis_version:` (or `valkey_version:`) from INFO server.
    pub version: String,
    child: Child,
    dir: PathBuf,
}

impl Server {
    pub fn start(bin: &Path, module: &Path) -> Result<Server, Error> {
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let dir =
            std::env::temp_dir().join(format!("redis-lock-contention-{}", std::process::id()));
        fs::create_dir_all(&dir)?;
        let log = fs::File::create(dir.join("stdout.log"))?;
        let child = Command::new(bin)
            .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
            .arg("--dir")
            .arg(&dir)
            .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
            .arg("--loadmodule")
            .arg(module)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", bin.display()))?;
        let mut server = Server {
            port,
            version: String::new(),
            child,
            dir,
        };
        server.version = server.wait_ready(Duration::from_secs(10))?;
        Ok(server)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    pub fn connect(&self) -> Result<redis::Connection, Error> {
        let c =
            redis::Client::open(self.url())?.get_connection_with_timeout(Duration::from_secs(5))?;
        // Nothing in a cell should take this long; a hung call fails the run instead.
        c.set_read_timeout(Some(Duration::from_secs(60)))?;
        c.set_write_timeout(Some(Duration::from_secs(10)))?;
        Ok(c)
    }

    fn wait_ready(&mut self, timeout: Duration) -> Result<String, Error> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait()? {
                let log = fs::read_to_string(self.dir.join("stdout.log")).unwrap_or_default();
                return Err(format!("server exited at start ({status}):\n{log}").into());
            }
            if let Ok(mut c) = self.connect() {
                let info: redis::RedisResult<String> =
                    redis::cmd("INFO").arg("server").query(&mut c);
                if let Ok(info) = info {
                    let version = info
                        .lines()
                        .find_map(|l| {
                            l.strip_prefix("redis_version:")
                                .map(|v| format!("Redis {}", v.trim()))
                                .or_else(|| {
                                    l.strip_prefix("valkey_version:")
                                        .map(|v| format!("Valkey {}", v.trim()))
                                })
                        })
                        .unwrap_or_else(|| "unknown server".into());
                    return Ok(version);
                }
            }
            if Instant::now() >= deadline {
                return Err("server did not answer within 10 s".into());
            }
            sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = fs::remove_dir_all(&self.dir);
    }
}
