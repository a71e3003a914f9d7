//! Runs sessions: each shown command by a new `redis-cli --no-raw` (as typed at a prompt),
//! set-up and look-ups over a RESP connection of the runner's own.

use std::collections::HashMap;
use std::io::Read;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use redis_lock_testkit::{RawConn, Resp};

use crate::script::{split_args, substitute, Session, Step, DEFAULT_PROMPT};

/// How long one shown command may take before the session fails.
pub const COMMAND_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a `!start` command gets to show up as a blocked client.
pub const BLOCK_TIMEOUT: Duration = Duration::from_secs(10);

/// The `redis-cli` the sessions run: `$REDIS_CLI`, or `redis-cli` on `PATH`.
pub fn redis_cli() -> PathBuf {
    std::env::var_os("REDIS_CLI")
        .filter(|v| !v.is_empty())
        .map_or_else(|| PathBuf::from("redis-cli"), PathBuf::from)
}

/// Runs sessions, in order, against the server on `127.0.0.1:port`; variables set by
/// `!fence` carry over from one session to the next.
pub struct Runner {
    port: u16,
    cli: PathBuf,
    conn: RawConn,
    vars: HashMap<String, u64>,
}

struct Background {
    child: Child,
}

impl Drop for Background {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Waits up to `timeout` for a child to end and returns its stdout then stderr
/// (`redis-cli --no-raw` writes replies, errors included, to stdout).
fn finish(child: &mut Child, timeout: Duration, what: &str) -> Result<String, String> {
    let t0 = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if t0.elapsed() < timeout => sleep(Duration::from_millis(2)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("{what}: no reply within {timeout:?}"));
            }
            Err(e) => return Err(format!("{what}: {e}")),
        }
    }
    let mut out = String::new();
    let pipes: [Option<&mut dyn Read>; 2] = [
        child.stdout.as_mut().map(|s| s as &mut dyn Read),
        child.stderr.as_mut().map(|s| s as &mut dyn Read),
    ];
    for (s, name) in pipes.into_iter().zip(["output", "errors"]) {
        let read = s.map_or(Ok(0), |s| s.read_to_string(&mut out));
        read.map_err(|e| format!("{what}: reading its {name}: {e}"))?;
    }
    Ok(out)
}

impl Runner {
    pub fn new(port: u16) -> Result<Runner, String> {
        let conn = RawConn::open(([127, 0, 0, 1], port).into(), Duration::from_secs(10))
            .map_err(|e| format!("connect to 127.0.0.1:{port}: {e}"))?;
        let cli = redis_cli();
        let probe = Command::new(&cli).arg("--version").output().map_err(|e| {
            format!(
                "{} cannot run ({e}): the sessions need redis-cli (Debian: redis-tools; \
                 or set REDIS_CLI)",
                cli.display()
            )
        })?;
        if !probe.status.success() {
            return Err(format!("{} --version failed", cli.display()));
        }
        Ok(Runner {
            port,
            cli,
            conn,
            vars: HashMap::new(),
        })
    }

    /// Starts `redis-cli --no-raw` with the arguments of `line`.
    fn spawn_cli(&self, line: &str) -> Result<Child, String> {
        use std::os::unix::ffi::OsStringExt;
        let args = split_args(line)?
            .into_iter()
            .map(std::ffi::OsString::from_vec);
        Command::new(&self.cli)
            .args(["--no-raw", "-h", "127.0.0.1", "-p"])
            .arg(self.port.to_string())
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("redis-cli: {e}"))
    }

    fn call(&mut self, args: &[Vec<u8>]) -> Result<Resp, String> {
        self.conn
            .call(args)
            .map_err(|e| format!("the runner's own connection: {e}"))
    }

    fn blocked_clients(&mut self) -> Result<u64, String> {
        self.conn
            .info_u64("clients", "blocked_clients")
            .map_err(|e| format!("INFO clients: {e}"))
    }

    /// The fence of the key's holder (the first by fence of several), from LOCK.INFO.
    fn fence_of(&mut self, key: &str) -> Result<u64, String> {
        let r = self.call(&[b"LOCK.INFO".to_vec(), key.as_bytes().to_vec()])?;
        if r.try_pairs().is_none() {
            return Err(format!(
                "!fence {key}: LOCK.INFO answered {r:?} (is it held?)"
            ));
        }
        if let Some(Resp::Int(f)) = r.get("fence") {
            return u64::try_from(f).map_err(|_| format!("!fence {key}: fence {f}"));
        }
        let first = |list: Resp| list.as_items()?.first()?.get("fence")?.as_int();
        let fence = r.get("holder-list").and_then(first);
        let fence = fence.and_then(|f| u64::try_from(f).ok());
        fence.ok_or_else(|| format!("!fence {key}: no holder in {r:?}"))
    }

    /// Runs one session and returns its transcript (what goes between the code fences).
    pub fn run(&mut self, s: &Session) -> Result<String, String> {
        let mut out = String::new();
        let mut prompt = DEFAULT_PROMPT.to_string();
        let mut bg: HashMap<String, Background> = HashMap::new();
        for (n, step) in &s.steps {
            let at = |e: String| format!("docs/sessions/{}.txt:{n}: {e}", s.name);
            let vars = self.vars.clone();
            let sub = |l: &str| substitute(l, &|v| vars.get(v).copied()).map_err(at);
            match step {
                Step::Comment(c) => {
                    out.push_str(c);
                    out.push('\n');
                }
                Step::Prompt(p) => prompt.clone_from(p),
                Step::Sleep(d) => sleep(*d),
                Step::Fence { key, var } => {
                    let f = self.fence_of(key).map_err(at)?;
                    self.vars.insert(var.clone(), f);
                }
                Step::Hidden(line) => {
                    let line = sub(line)?;
                    let r = self.call(&split_args(&line).map_err(at)?).map_err(at)?;
                    if let Resp::Error(e) = r {
                        return Err(at(format!("set-up `{line}` failed: {e}")));
                    }
                }
                Step::Run(line) => {
                    let line = sub(line)?;
                    out.push_str(&format!("{prompt} {line}\n"));
                    let mut child = self.spawn_cli(&line).map_err(at)?;
                    out.push_str(&finish(&mut child, COMMAND_TIMEOUT, &line).map_err(at)?);
                }
                Step::Start { client, line } => {
                    let line = sub(line)?;
                    if bg.contains_key(client) {
                        return Err(at(format!("client {client} already waits")));
                    }
                    out.push_str(&format!("{prompt} {line}\n"));
                    let before = self.blocked_clients().map_err(at)?;
                    let mut b = Background {
                        child: self.spawn_cli(&line).map_err(at)?,
                    };
                    let t0 = Instant::now();
                    while self.blocked_clients().map_err(at)? <= before {
                        let ended = b.child.try_wait().map_err(|e| at(e.to_string()))?;
                        if ended.is_some() || t0.elapsed() > BLOCK_TIMEOUT {
                            let got =
                                finish(&mut b.child, Duration::ZERO, &line).unwrap_or_default();
                            return Err(at(format!(
                                "`{line}` did not block (a !start command must wait); it answered: {got}"
                            )));
                        }
                        sleep(Duration::from_millis(2));
                    }
                    bg.insert(client.clone(), b);
                }
                Step::Reply { client, prefix } => {
                    let mut b = bg
                        .remove(client)
                        .ok_or_else(|| at(format!("no !start for client {client}")))?;
                    let got = finish(&mut b.child, COMMAND_TIMEOUT, client).map_err(at)?;
                    let Some(p) = prefix else {
                        out.push_str(&got);
                        continue;
                    };
                    // The first line after the prefix, the others indented as far.
                    let mut head = format!("{p} ");
                    for l in got.lines() {
                        out.push_str(&format!("{head}{l}\n"));
                        head = " ".repeat(p.chars().count() + 1);
                    }
                }
            }
        }
        // Background clients nobody waited for (a watcher shown blocking) end with the
        // session (dropping them kills their redis-cli).
        drop(bg);
        Ok(out)
    }

    /// Runs sessions in order and returns each transcript by name.
    pub fn run_all(&mut self, sessions: &[Session]) -> Result<Vec<(String, String)>, String> {
        sessions
            .iter()
            .map(|s| self.run(s).map(|t| (s.name.clone(), t)))
            .collect()
    }
}
