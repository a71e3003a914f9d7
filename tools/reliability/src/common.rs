//! What every scenario gets (`Env`) and gives back (an [`Outcome`] row), and the helpers
//! they share (servers, RESP and the clock come from the test kit).

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

pub use redis_lock_report::fmt::thousands;
pub use redis_lock_report::reliability::{Outcome, Status};
pub use redis_lock_testkit::{
    args, now_ns, unix_ms, wait_until, RawConn as Conn, Resp as Reply, Rng, Server, ServerBuilder,
};

#[derive(Debug, Clone)]
pub struct Env {
    pub repo: PathBuf,
    pub server_bin: PathBuf,
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
    /// `full`, or `short` for the CI run, scaled by SCALE: a count (at least 1) or seconds.
    fn scaled(&self, full: f64, short: f64) -> f64 {
        let base = if self.short { short } else { full };
        base * self.scale
    }

    pub fn n(&self, full: f64, short: f64) -> u64 {
        self.scaled(full, short).round().max(1.0) as u64
    }

    pub fn secs(&self, full: f64, short: f64) -> Duration {
        Duration::from_secs_f64(self.scaled(full, short).max(0.5))
    }

    /// A server with the module, no persistence, in a fresh directory `name` of the work dir.
    pub fn builder(&self, name: &str) -> ServerBuilder {
        let dir = self.work.join(name);
        let _ = std::fs::remove_dir_all(&dir);
        let _ = std::fs::create_dir_all(&dir);
        ServerBuilder::new()
            .bin(self.server_bin.clone())
            .module(&self.module)
            .dir(dir)
            .start_timeout(Duration::from_secs(20))
    }

    pub fn start(&self, name: &str) -> Result<Server, String> {
        self.start_with(name, "")
    }

    /// [`start`](Self::start) with server options `conf`: `name value...`, `;` apart.
    pub fn start_with(&self, name: &str, conf: &str) -> Result<Server, String> {
        let opts = conf.split(';').map(words).filter(|w| !w.is_empty());
        let b = opts.fold(self.builder(name), |b, w| b.arg_multi(w[0], &w[1..]));
        b.try_start()
    }

    pub fn server_name(&self) -> String {
        let name = self.server_bin.file_name().map(|f| f.to_string_lossy());
        name.map_or("server".into(), |f| f.into_owned())
    }
}

/// A connection with a 5 s timeout (from inside the server's namespace, if any).
pub fn connect(s: &Server) -> Result<Conn, String> {
    s.try_raw(Duration::from_secs(5))
        .map_err(|e| format!("connect to {}: {e}", s.addr()))
}

/// A connection to `addr`, made within `connect`, whose replies may take up to `read`.
pub fn open(addr: std::net::SocketAddr, connect: Duration, read: Duration) -> Result<Conn, String> {
    let c = Conn::open(addr, connect).map_err(|e| format!("connect {addr}: {e}"))?;
    c.try_set_read_timeout(Some(read))
        .map_err(|e| e.to_string())?;
    Ok(c)
}

/// A connection whose replies may take up to `secs`.
pub fn connect_for(s: &Server, secs: u64) -> Result<Conn, String> {
    let c = connect(s)?;
    c.try_set_read_timeout(Some(Duration::from_secs(secs)))
        .map_err(|e| e.to_string())?;
    Ok(c)
}

/// Events counted by name (a name never counted is 0).
#[derive(Debug, Default, Clone, serde::Serialize)]
#[serde(transparent)]
pub struct Counts(std::collections::BTreeMap<&'static str, u64>);

impl Counts {
    pub fn bump(&mut self, name: &'static str) {
        self.add_n(name, 1);
    }

    pub fn add_n(&mut self, name: &'static str, n: u64) {
        *self.0.entry(name).or_insert(0) += n;
    }

    pub fn get(&self, name: &str) -> u64 {
        self.0.get(name).copied().unwrap_or(0)
    }

    pub fn add(&mut self, o: &Counts) {
        o.0.iter().for_each(|(k, v)| self.add_n(k, *v));
    }

    pub fn total(&self) -> u64 {
        self.0.values().sum()
    }
}

/// Adds an example to `v` while it has fewer than `max`.
pub fn example(v: &mut Vec<String>, max: usize, e: impl FnOnce() -> String) {
    if v.len() < max {
        v.push(e());
    }
}

/// What threads returned, or an error if one panicked.
pub fn joined<T>(hs: impl IntoIterator<Item = std::thread::Result<T>>) -> Result<Vec<T>, String> {
    let out = hs
        .into_iter()
        .map(|h| h.map_err(|_| "a thread panicked".to_string()));
    out.collect()
}

/// One command and its reply (an error reply is a reply; a lost connection an `Err`).
pub fn cmd<A: AsRef<[u8]>>(c: &mut Conn, a: &[A]) -> Result<Reply, String> {
    c.call(a)
        .map_err(|e| format!("{}: {e}", String::from_utf8_lossy(a[0].as_ref())))
}

/// A command that must not answer an error (`Err`: the command and its reply).
pub fn must<A: AsRef<[u8]>>(c: &mut Conn, a: &[A]) -> Result<Reply, String> {
    let r = cmd(c, a)?;
    if r.is_error() {
        let words: Vec<_> = a
            .iter()
            .map(|w| String::from_utf8_lossy(w.as_ref()))
            .collect();
        return Err(format!("{}: {r:?}", words.join(" ")));
    }
    Ok(r)
}

pub fn words(s: &str) -> Vec<&str> {
    s.split_whitespace().collect()
}

/// A `LOCK.ACQUIRE` that must be granted: (token, fence).
pub fn grant<A: AsRef<[u8]>>(c: &mut Conn, a: &[A]) -> Result<(Vec<u8>, u64), String> {
    let r = cmd(c, a)?;
    r.grant().ok_or_else(|| {
        let key = a
            .get(1)
            .map(|k| String::from_utf8_lossy(k.as_ref()).into_owned());
        format!("acquire of {} answered {r:?}", key.unwrap_or_default())
    })
}

/// `LOCK.ACQUIRE key PX ttl`, which must be granted: (token, fence).
pub fn acquire(c: &mut Conn, key: &str, ttl: u64) -> Result<(Vec<u8>, u64), String> {
    grant(c, &args!["LOCK.ACQUIRE", key, "PX", ttl])
}

/// `REPLICAOF NO ONE`: the replica `s` becomes a primary.
pub fn promote(s: &Server) -> Result<(), String> {
    must(&mut connect(s)?, &args!["REPLICAOF", "NO", "ONE"]).map(drop)
}

/// `BGREWRITEAOF`, and the rewrite finished.
pub fn rewrite_aof(s: &Server, c: &mut Conn) -> Result<(), String> {
    must(c, &args!["BGREWRITEAOF"])?;
    let idle = |f: &str| s.info_field("persistence", f).as_deref() == Some("0");
    let done = || idle("aof_rewrite_in_progress") && idle("aof_rewrite_scheduled");
    if !wait_until(Duration::from_secs(20), done) {
        return Err("AOF rewrite did not finish".into());
    }
    Ok(())
}

/// Fresh grants of `n` keys `{prefix}:i`: how many had a fence not above `above`, and the
/// highest fence.
pub fn probe_fences(c: &mut Conn, prefix: &str, n: u64, above: u64) -> Result<(u64, u64), String> {
    let (mut regressions, mut max) = (0, 0);
    for i in 0..n {
        let (_, fence) = acquire(c, &format!("{prefix}:{i}"), 1000)?;
        regressions += u64::from(fence <= above);
        max = max.max(fence);
    }
    Ok((regressions, max))
}

/// A server is fine when it answers, caught no panic and logged no crash.
pub fn health(s: &Server, what: &str) -> Result<(), String> {
    let log = s.log();
    for mark in [
        "crashed by signal",
        "ASSERTION FAILED",
        "BUG REPORT START",
        "Guru Meditation",
    ] {
        if let Some(at) = log.find(mark) {
            let start = log[..at].rfind("\n\n").map_or(0, |i| i + 2);
            let excerpt: String = log[start..].lines().take(25).collect::<Vec<_>>().join("\n");
            return Err(format!(
                "{what} crashed ({mark}); log {}:\n{excerpt}",
                s.log_path().display()
            ));
        }
    }
    let alive = connect(s).is_ok_and(|mut c| c.call(&args!["PING"]).is_ok());
    if !alive {
        return Err(format!("{what} does not answer PING\n{}", s.log_tail()));
    }
    match panics(s) {
        Some(0) => Ok(()),
        p => Err(format!("{what}: lock_panics = {p:?}")),
    }
}

/// How a scenario marks its row failed: when `bad`; unless the server is [healthy](health).
pub trait Verdict {
    fn fail_if(&mut self, bad: bool, why: impl Into<String>);
    fn healthy(&mut self, s: &Server, what: &str);
}

impl Verdict for Outcome {
    fn fail_if(&mut self, bad: bool, why: impl Into<String>) {
        if bad {
            self.fail(why);
        }
    }

    fn healthy(&mut self, s: &Server, what: &str) {
        if let Err(e) = health(s, what) {
            self.fail(e);
        }
    }
}

/// One round of a crash run: a thread `client(i, input, stop)` per input works for
/// `run_ms`, with `fault(server)` applied `at` ms in; then `server` is SIGKILLed, `stop`
/// raised, and the clients' results collected.
pub fn kill_under_load<C: Send, T: Send>(
    server: &mut Server,
    run_ms: u64,
    fault: Option<(u64, impl FnOnce(&Server) -> Result<(), String>)>,
    inputs: Vec<C>,
    client: impl Fn(usize, C, &AtomicBool) -> T + Sync,
) -> Result<Vec<T>, String> {
    let (t0, stop) = (Instant::now(), AtomicBool::new(false));
    std::thread::scope(|s| {
        let handles: Vec<_> = (inputs.into_iter().enumerate())
            .map(|(i, input)| {
                let (client, stop) = (&client, &stop);
                s.spawn(move || client(i, input, stop))
            })
            .collect();
        let worked = fault.map_or(Ok(()), |(at, fault)| {
            std::thread::sleep(Duration::from_millis(at));
            fault(server)
        });
        std::thread::sleep(Duration::from_millis(run_ms).saturating_sub(t0.elapsed()));
        server.kill9();
        stop.store(true, Ordering::Relaxed);
        worked.and(joined(handles.into_iter().map(|h| h.join())))
    })
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
