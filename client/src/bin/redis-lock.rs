//! `redis-lock`: locks from the shell and from cron, like flock(1) but across machines.
//! See `redis-lock --help` and docs/CLIENT.md.

use std::ffi::OsString;
use std::process::ExitStatus;
use std::time::Duration;

use redis_lock_client::{
    AcquireOptions, ClientOptions, LockClient, LockGuard, Redlock, RedlockOptions, Renewal,
};
use tokio::signal::unix::{signal, SignalKind};

const EXIT_NOT_HELD: i32 = 1;
const EXIT_USAGE: i32 = 64; // EX_USAGE
const EXIT_UNAVAILABLE: i32 = 69; // EX_UNAVAILABLE
const EXIT_BUSY: i32 = 75; // EX_TEMPFAIL
const EXIT_LOST: i32 = 76;
const EXIT_CANNOT_EXEC: i32 = 126;
const EXIT_NOT_FOUND: i32 = 127;

const DEFAULT_URL: &str = "redis://127.0.0.1:6379";

const USAGE: &str = "\
redis-lock: distributed locks from the shell, on the redis-lock module

USAGE:
  redis-lock run     [OPTIONS] NAME -- CMD [ARGS...]
        take NAME, run CMD while renewing the lease, release when CMD exits, and exit
        with CMD's exit code. Busy: exit 75 without running CMD. Lease lost while CMD
        runs: SIGTERM to CMD (SIGKILL after --grace), exit 76. CMD gets REDIS_LOCK_NAME,
        REDIS_LOCK_TOKEN and REDIS_LOCK_FENCE (empty when there is no fence).
  redis-lock acquire [OPTIONS] NAME
        take NAME for --ttl and print REDIS_LOCK_TOKEN=... and REDIS_LOCK_FENCE=...
        (for eval in a shell); busy: exit 75
  redis-lock release [OPTIONS] NAME [TOKEN]
        release (TOKEN defaults to $REDIS_LOCK_TOKEN); exit 1 if TOKEN did not hold it
  redis-lock extend  [OPTIONS] NAME [TOKEN]
        set the lease to --ttl from now; exit 1 if TOKEN does not hold it
  redis-lock info    [OPTIONS] NAME
        show LOCK.INFO; exit 1 if the lock is free

OPTIONS (before NAME):
  --url URL           server, default $REDIS_LOCK_URL or redis://127.0.0.1:6379
                      (a Redis Cluster node works too: commands are routed by key)
  --nodes URL,URL,..  Redlock over these independent servers instead of --url
  --ttl MS            lease length, default 30000
  --wait MS           wait up to MS for a busy lock, default 0 (do not wait)
  --owner LABEL       label shown by LOCK.INFO, default <hostname>:<pid>
  --token TOKEN       (acquire) hold the lock with this token instead of a random one
  --max-hold MS       (run) cap on the total hold time, default 86400000 (24 h)
  --grace MS          (run) time between SIGTERM and SIGKILL, default 10000
  --timeout MS        limit for one network call, default 2000
  -q, --quiet         print errors only;  -v, --verbose: print debug lines
  -h, --help          this text;  -V, --version

EXIT CODES:
  0 ok (run: CMD's own exit code; 128+N when CMD died of signal N)
  1 release/extend: not held by TOKEN; info: the lock is free
  64 usage error    69 server unreachable or error    75 busy (not acquired)
  76 lease lost while CMD ran    126 CMD not executable    127 CMD not found
";

// ------------------------------------------------------------------------------------
// Logging to stderr

struct StderrLog;

static LOGGER: StderrLog = StderrLog;

impl log::Log for StderrLog {
    fn enabled(&self, m: &log::Metadata<'_>) -> bool {
        // Our own lines at the chosen level; other crates' only when they warn.
        m.level() <= log::max_level()
            && (m.target().starts_with("redis_lock") || m.level() <= log::Level::Warn)
    }
    fn log(&self, r: &log::Record<'_>) {
        if self.enabled(r.metadata()) {
            eprintln!("redis-lock: {}", r.args());
        }
    }
    fn flush(&self) {}
}

// ------------------------------------------------------------------------------------
// Arguments

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sub {
    Run,
    Acquire,
    Release,
    Extend,
    Info,
}

#[derive(Debug)]
struct Args {
    sub: Sub,
    url: String,
    nodes: Option<Vec<String>>,
    ttl: Duration,
    wait: Option<Duration>,
    owner: Option<String>,
    token: Option<String>,
    max_hold: Duration,
    grace: Duration,
    timeout: Duration,
    verbosity: log::LevelFilter,
    name: String,
    rest: Vec<OsString>,
}

enum Parsed {
    Args(Box<Args>),
    Help,
    Version,
}

fn ms(opt: &str, v: &str) -> Result<Duration, String> {
    v.parse::<u64>()
        .map(Duration::from_millis)
        .map_err(|_| format!("{opt} wants milliseconds, got {v:?}"))
}

fn parse(argv: Vec<OsString>) -> Result<Parsed, String> {
    let mut it = argv.into_iter().skip(1).peekable();
    let mut sub = None;
    let mut a = Args {
        sub: Sub::Run,
        url: std::env::var("REDIS_LOCK_URL")
            .ok()
            .filter(|u| !u.is_empty())
            .unwrap_or_else(|| DEFAULT_URL.into()),
        nodes: None,
        ttl: Duration::from_millis(30_000),
        wait: None,
        owner: None,
        token: None,
        max_hold: Duration::from_millis(86_400_000),
        grace: Duration::from_millis(10_000),
        timeout: Duration::from_millis(2_000),
        verbosity: log::LevelFilter::Info,
        name: String::new(),
        rest: Vec::new(),
    };
    let mut url_given = false;
    let mut name = None;
    while let Some(raw) = it.next() {
        let s = raw
            .to_str()
            .ok_or_else(|| format!("argument {raw:?} is not UTF-8"))?
            .to_string();
        if s == "-h" || s == "--help" {
            return Ok(Parsed::Help);
        }
        if s == "-V" || s == "--version" {
            return Ok(Parsed::Version);
        }
        if s == "-q" || s == "--quiet" {
            a.verbosity = log::LevelFilter::Error;
            continue;
        }
        if s == "-v" || s == "--verbose" {
            a.verbosity = log::LevelFilter::Debug;
            continue;
        }
        if let Some(opt) = s.strip_prefix("--").filter(|o| !o.is_empty()) {
            let (key, inline) = match opt.split_once('=') {
                Some((k, v)) => (k.to_string(), Some(v.to_string())),
                None => (opt.to_string(), None),
            };
            let mut value = || -> Result<String, String> {
                match &inline {
                    Some(v) => Ok(v.clone()),
                    None => it
                        .next()
                        .and_then(|v| v.into_string().ok())
                        .ok_or_else(|| format!("--{key} needs a value")),
                }
            };
            match key.as_str() {
                "url" => {
                    a.url = value()?;
                    url_given = true;
                }
                "nodes" => {
                    let v = value()?;
                    let nodes: Vec<String> = v
                        .split(',')
                        .map(str::trim)
                        .filter(|n| !n.is_empty())
                        .map(String::from)
                        .collect();
                    if nodes.is_empty() {
                        return Err("--nodes needs at least one URL".into());
                    }
                    a.nodes = Some(nodes);
                }
                "ttl" => a.ttl = ms("--ttl", &value()?)?,
                "wait" => {
                    let w = ms("--wait", &value()?)?;
                    a.wait = (!w.is_zero()).then_some(w);
                }
                "owner" => a.owner = Some(value()?),
                "token" => a.token = Some(value()?),
                "max-hold" => a.max_hold = ms("--max-hold", &value()?)?,
                "grace" => a.grace = ms("--grace", &value()?)?,
                "timeout" => a.timeout = ms("--timeout", &value()?)?,
                _ => return Err(format!("unknown option --{key}")),
            }
            continue;
        }
        if s.starts_with('-') && s.len() > 1 {
            return Err(format!("unknown option {s}"));
        }
        if sub.is_none() {
            sub = Some(match s.as_str() {
                "run" => Sub::Run,
                "acquire" => Sub::Acquire,
                "release" => Sub::Release,
                "extend" => Sub::Extend,
                "info" => Sub::Info,
                _ => return Err(format!("unknown subcommand {s:?}")),
            });
            continue;
        }
        name = Some(s);
        break;
    }
    let Some(sub) = sub else {
        return Err("no subcommand given".into());
    };
    a.sub = sub;
    a.name = name.ok_or("no lock NAME given")?;
    if url_given && a.nodes.is_some() {
        return Err("give either --url or --nodes, not both".into());
    }
    if a.ttl.is_zero() || a.max_hold.is_zero() || a.timeout.is_zero() {
        return Err("--ttl, --max-hold and --timeout must be positive".into());
    }
    let mut rest: Vec<OsString> = it.collect();
    match sub {
        Sub::Run => {
            if rest.first().is_some_and(|r| r == "--") {
                rest.remove(0);
            }
            if rest.is_empty() {
                return Err("run needs a command: redis-lock run NAME -- CMD [ARGS...]".into());
            }
        }
        Sub::Release | Sub::Extend => {
            if rest.len() > 1 {
                return Err("too many arguments".into());
            }
            if let Some(t) = rest.pop() {
                a.token = Some(t.into_string().map_err(|_| "TOKEN is not UTF-8")?);
            }
            if a.token.is_none() {
                a.token = std::env::var("REDIS_LOCK_TOKEN")
                    .ok()
                    .filter(|t| !t.is_empty());
            }
            if a.token.is_none() {
                return Err("no TOKEN given (argument or $REDIS_LOCK_TOKEN)".into());
            }
        }
        Sub::Acquire | Sub::Info => {
            if !rest.is_empty() {
                return Err("too many arguments".into());
            }
        }
    }
    a.rest = rest;
    Ok(Parsed::Args(Box::new(a)))
}

// ------------------------------------------------------------------------------------
// One server or a Redlock quorum

enum Locker {
    Single(LockClient),
    Quorum(Redlock),
}

impl Locker {
    fn busy_message(&self, name: &str) -> String {
        match self {
            Locker::Single(_) => format!("{name} is held elsewhere"),
            Locker::Quorum(q) => format!(
                "{name}: no majority ({} of {} nodes) granted it (held elsewhere, or nodes down)",
                q.quorum(),
                q.nodes()
            ),
        }
    }

    async fn new(a: &Args) -> Result<Locker, String> {
        let client = ClientOptions {
            connect_timeout: a.timeout,
            io_timeout: a.timeout,
            cluster: None,
        };
        match &a.nodes {
            Some(nodes) => {
                let opts = RedlockOptions {
                    client: ClientOptions {
                        cluster: Some(false),
                        ..client
                    },
                    ..RedlockOptions::default()
                };
                Redlock::with_options(nodes, opts)
                    .map(Locker::Quorum)
                    .map_err(|e| e.to_string())
            }
            None => LockClient::connect_with(&a.url, client)
                .await
                .map(Locker::Single)
                .map_err(|e| format!("{}: {e}", a.url)),
        }
    }

    async fn acquire(&self, name: &str, o: &AcquireOptions) -> Result<Option<LockGuard>, String> {
        match self {
            Locker::Single(c) => c.acquire_with(name, o).await,
            Locker::Quorum(q) => q.acquire_with(name, o).await,
        }
        .map_err(|e| e.to_string())
    }
}

fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most buf.len() bytes into our buffer.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return "localhost".into();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

fn acquire_options(a: &Args, renew: bool) -> AcquireOptions {
    let mut o = AcquireOptions::new(a.ttl);
    o.wait = a.wait;
    o.owner = Some(
        a.owner
            .clone()
            .unwrap_or_else(|| format!("{}:{}", hostname(), std::process::id())),
    );
    o.token = a.token.clone();
    if renew {
        o.renew = Some(Renewal::capped(a.max_hold));
    }
    o
}

/// Single-quotes a value for `eval` in a POSIX shell.
fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

// ------------------------------------------------------------------------------------
// Subcommands

async fn cmd_acquire(a: &Args, locker: &Locker) -> i32 {
    match locker.acquire(&a.name, &acquire_options(a, false)).await {
        Ok(Some(guard)) => {
            let (token, fence) = guard.detach();
            println!("REDIS_LOCK_TOKEN={}", shell_quote(&token));
            println!(
                "REDIS_LOCK_FENCE={}",
                fence.map(|f| f.to_string()).unwrap_or_default()
            );
            0
        }
        Ok(None) => {
            log::info!("{}", locker.busy_message(&a.name));
            EXIT_BUSY
        }
        Err(e) => {
            log::error!("{e}");
            EXIT_UNAVAILABLE
        }
    }
}

async fn cmd_release_extend(a: &Args, locker: &Locker) -> i32 {
    let token = a.token.as_deref().unwrap_or_default();
    let outcome = match (a.sub, locker) {
        (Sub::Release, Locker::Single(c)) => c.release(&a.name, token).await,
        (Sub::Release, Locker::Quorum(q)) => Ok(q.release(&a.name, token).await >= q.quorum()),
        (_, Locker::Single(c)) => c.extend(&a.name, token, a.ttl).await,
        (_, Locker::Quorum(q)) => q.extend(&a.name, token, a.ttl).await,
    };
    match outcome {
        Ok(true) => 0,
        Ok(false) => {
            log::info!("{} is not held by this token", a.name);
            EXIT_NOT_HELD
        }
        Err(e) => {
            log::error!("{e}");
            EXIT_UNAVAILABLE
        }
    }
}

fn print_info(info: &redis_lock_client::LockInfo, indent: &str) {
    for (k, v) in &info.fields {
        println!("{indent}{k}: {}", v.as_deref().unwrap_or("(nil)"));
    }
}

async fn cmd_info(a: &Args, locker: &Locker) -> i32 {
    match locker {
        Locker::Single(c) => match c.info(&a.name).await {
            Ok(Some(info)) => {
                print_info(&info, "");
                0
            }
            Ok(None) => {
                println!("free");
                EXIT_NOT_HELD
            }
            Err(e) => {
                log::error!("{e}");
                EXIT_UNAVAILABLE
            }
        },
        Locker::Quorum(q) => {
            let mut held = 0;
            for (url, r) in q.info(&a.name).await {
                println!("{url}:");
                match r {
                    Ok(Some(info)) => {
                        held += 1;
                        print_info(&info, "  ");
                    }
                    Ok(None) => println!("  free"),
                    Err(e) => println!("  error: {e}"),
                }
            }
            if held > 0 {
                0
            } else {
                EXIT_NOT_HELD
            }
        }
    }
}

fn exit_code(status: ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(EXIT_UNAVAILABLE)
}

/// Sends `sig` to CMD's process group (CMD runs in a group of its own).
fn signal_group(pgid: i32, sig: i32) {
    if pgid > 0 {
        // SAFETY: kill(2) on the process group we created for our child.
        unsafe {
            libc::kill(-pgid, sig);
        }
    }
}

async fn release_quietly(guard: LockGuard, name: &str) {
    match guard.release().await {
        Ok(true) => log::debug!("released {name}"),
        Ok(false) => log::debug!("{name} was no longer held at release"),
        Err(e) => log::warn!("release of {name} failed: {e}"),
    }
}

async fn cmd_run(a: &Args, locker: &Locker) -> i32 {
    let guard = match locker.acquire(&a.name, &acquire_options(a, true)).await {
        Ok(Some(g)) => g,
        Ok(None) => {
            log::info!("{}; not running the command", locker.busy_message(&a.name));
            return EXIT_BUSY;
        }
        Err(e) => {
            log::error!("{e}");
            return EXIT_UNAVAILABLE;
        }
    };
    log::debug!("acquired {} (fence {:?})", a.name, guard.fence());
    let mut cmd = tokio::process::Command::new(&a.rest[0]);
    cmd.args(&a.rest[1..])
        .env("REDIS_LOCK_NAME", &a.name)
        .env("REDIS_LOCK_TOKEN", guard.token())
        .env(
            "REDIS_LOCK_FENCE",
            guard.fence().map(|f| f.to_string()).unwrap_or_default(),
        )
        // A group of its own, so that SIGTERM/SIGKILL reach the whole job (a shell
        // script and its children), not only the first process.
        .process_group(0);
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            log::error!("cannot run {:?}: {e}", a.rest[0]);
            release_quietly(guard, &a.name).await;
            return if e.kind() == std::io::ErrorKind::NotFound {
                EXIT_NOT_FOUND
            } else {
                EXIT_CANNOT_EXEC
            };
        }
    };
    let pgid = child.id().and_then(|p| i32::try_from(p).ok()).unwrap_or(0);
    let (Ok(mut term), Ok(mut int), Ok(mut hup)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
        signal(SignalKind::hangup()),
    ) else {
        log::error!("cannot install signal handlers");
        signal_group(pgid, libc::SIGKILL);
        let _ = child.wait().await;
        release_quietly(guard, &a.name).await;
        return EXIT_UNAVAILABLE;
    };
    let lost = guard.lost();
    tokio::pin!(lost);
    loop {
        tokio::select! {
            status = child.wait() => {
                let code = match status {
                    Ok(s) => exit_code(s),
                    Err(e) => {
                        log::error!("waiting for the command failed: {e}");
                        EXIT_UNAVAILABLE
                    }
                };
                release_quietly(guard, &a.name).await;
                return code;
            }
            reason = &mut lost => {
                let reason = reason.map_or_else(|| "released".to_string(), |r| r.to_string());
                log::warn!(
                    "lease on {} lost ({reason}); sending SIGTERM to the command",
                    a.name
                );
                signal_group(pgid, libc::SIGTERM);
                if tokio::time::timeout(a.grace, child.wait()).await.is_err() {
                    log::warn!(
                        "the command did not exit within {} ms of SIGTERM; sending SIGKILL",
                        a.grace.as_millis()
                    );
                    signal_group(pgid, libc::SIGKILL);
                    let _ = child.wait().await;
                }
                release_quietly(guard, &a.name).await;
                return EXIT_LOST;
            }
            _ = term.recv() => signal_group(pgid, libc::SIGTERM),
            _ = int.recv() => signal_group(pgid, libc::SIGINT),
            _ = hup.recv() => signal_group(pgid, libc::SIGHUP),
        }
    }
}

async fn main_async(a: Args) -> i32 {
    let locker = match Locker::new(&a).await {
        Ok(l) => l,
        Err(e) => {
            log::error!("{e}");
            return EXIT_UNAVAILABLE;
        }
    };
    match a.sub {
        Sub::Run => cmd_run(&a, &locker).await,
        Sub::Acquire => cmd_acquire(&a, &locker).await,
        Sub::Release | Sub::Extend => cmd_release_extend(&a, &locker).await,
        Sub::Info => cmd_info(&a, &locker).await,
    }
}

fn main() {
    let _ = log::set_logger(&LOGGER);
    log::set_max_level(log::LevelFilter::Info);
    let args = match parse(std::env::args_os().collect()) {
        Ok(Parsed::Args(a)) => a,
        Ok(Parsed::Help) => {
            print!("{USAGE}");
            std::process::exit(0);
        }
        Ok(Parsed::Version) => {
            println!("redis-lock {}", env!("CARGO_PKG_VERSION"));
            std::process::exit(0);
        }
        Err(e) => {
            eprintln!("redis-lock: {e}\nTry 'redis-lock --help'.");
            std::process::exit(EXIT_USAGE);
        }
    };
    log::set_max_level(args.verbosity);
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("redis-lock: cannot start the runtime: {e}");
            std::process::exit(EXIT_UNAVAILABLE);
        }
    };
    let code = rt.block_on(main_async(*args));
    // Do not wait for stray tasks (a release on drop, a dead node's connect).
    rt.shutdown_timeout(Duration::from_millis(100));
    std::process::exit(code);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(args: &[&str]) -> Result<Parsed, String> {
        let mut v = vec![OsString::from("redis-lock")];
        v.extend(args.iter().map(OsString::from));
        parse(v)
    }

    fn args(a: &[&str]) -> Args {
        match p(a) {
            Ok(Parsed::Args(a)) => *a,
            Ok(_) => panic!("help/version"),
            Err(e) => panic!("{e}"),
        }
    }

    #[test]
    fn parses_run() {
        let a = args(&[
            "run",
            "--url",
            "redis://h:1",
            "--ttl=500",
            "--wait",
            "100",
            "job",
            "--",
            "sh",
            "-c",
            "exit 3",
        ]);
        assert_eq!(a.sub, Sub::Run);
        assert_eq!(a.url, "redis://h:1");
        assert_eq!(a.ttl, Duration::from_millis(500));
        assert_eq!(a.wait, Some(Duration::from_millis(100)));
        assert_eq!(a.name, "job");
        assert_eq!(a.rest, vec!["sh", "-c", "exit 3"]);
        let a = args(&["run", "--nodes", "redis://a,redis://b,,", "job", "true"]);
        assert_eq!(a.nodes.unwrap(), vec!["redis://a", "redis://b"]);
        assert_eq!(a.rest, vec!["true"]);
        assert_eq!(args(&["run", "--wait", "0", "j", "--", "x"]).wait, None);
    }

    #[test]
    fn rejects_bad_usage() {
        assert!(p(&[]).is_err());
        assert!(p(&["run", "job"]).is_err());
        assert!(p(&["run", "--ttl", "abc", "job", "--", "x"]).is_err());
        assert!(p(&["run", "--ttl", "0", "job", "--", "x"]).is_err());
        assert!(p(&["run", "--url", "u", "--nodes", "a", "job", "--", "x"]).is_err());
        assert!(p(&["frob", "job"]).is_err());
        assert!(p(&["info", "job", "extra"]).is_err());
        assert!(p(&["acquire", "--bogus", "job"]).is_err());
        assert!(matches!(p(&["--help"]), Ok(Parsed::Help)));
    }

    #[test]
    fn token_from_argument() {
        let a = args(&["release", "job", "tok-1"]);
        assert_eq!(a.token.as_deref(), Some("tok-1"));
    }

    #[test]
    fn quotes_for_the_shell() {
        assert_eq!(shell_quote("a'b"), "'a'\\''b'");
        assert_eq!(shell_quote("plain"), "'plain'");
    }
}
