//! `redis-lock`: locks from the shell and from cron, like flock(1) but across machines.
//! See `redis-lock --help`, `redis-lock run --help` and docs/CLIENT.md.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitStatus;
use std::time::Duration;

use clap::{Args as ClapArgs, CommandFactory, Parser, Subcommand};
use redis_lock_client::{
    AcquireOptions, CampaignOptions, ClientOptions, Confirm, Error, Leader, LockClient, LockGuard,
    LockMode, LossReason, ObserveOptions, Redlock, RedlockOptions, Renewal, Session,
    SessionLockOptions, SessionOptions, Tls, MAX_KEYS, MAX_LIMIT,
};
use tokio::signal::unix::{signal, SignalKind};

#[path = "redis-lock/child.rs"]
mod child;
#[path = "redis-lock/metrics.rs"]
mod metrics;

/// `println!` that does not panic when stdout is closed early (`redis-lock info | head`):
/// what no reader wants is dropped, and the exit code stays what it would have been.
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write;
        let _ = writeln!(std::io::stdout().lock(), $($arg)*);
    }};
}

const EXIT_NOT_HELD: i32 = 1;
const EXIT_USAGE: i32 = 64; // EX_USAGE
const EXIT_UNAVAILABLE: i32 = 69; // EX_UNAVAILABLE
/// Busy: EX_TEMPFAIL ("try again later"), which is what it means. `-E` changes it.
const EXIT_BUSY: i32 = 75;
/// Lease lost while CMD ran. Outside sysexits' 64..=78 (76 is EX_PROTOCOL, which this
/// used to be) and below the shell's 126..; `--lost-exit-code` changes it.
const EXIT_LOST: i32 = 79;
const EXIT_CANNOT_EXEC: i32 = 126;
const EXIT_NOT_FOUND: i32 = 127;

const DEFAULT_URL: &str = "redis://127.0.0.1:6379";

const EXIT_HELP: &str = "\
Exit codes:
  0    success (run, elect: CMD exited 0)
  n    run, elect: CMD's own exit code; 128+N when CMD died of signal N
  1    release/extend: not held by this token; info: the lock is free;
       observe: --for passed before --count changes
  64   usage error (EX_USAGE), also a --ttl or --hold longer than the server's
       lock.max-ttl (refused before CMD runs)
  69   server unreachable or not answering in time, TLS or authentication failure,
       --nodes without a majority that answers, a grant its replicas did not
       confirm (given back), or an error reply such as WRONGMODE / LIMITMISMATCH
       (EX_UNAVAILABLE)
  75   busy: not acquired (elect: not elected) within --wait (EX_TEMPFAIL);
       -E/--conflict-exit-code changes it
  79   run, elect: the lease was lost while CMD ran; --lost-exit-code changes it
  126  CMD is not executable     127  CMD not found
  128+N  elect: signal N arrived while campaigning (CMD was not started)

Environment:
  REDIS_LOCK_URL, REDIS_URL            server URL when --url is not given (in this order)
  SSL_CERT_FILE                        CA certificates to trust when --cacert is not given
  REDIS_LOCK_PASSWORD, REDISCLI_AUTH   password (kept out of the URL, where ps shows it)
  REDIS_LOCK_USER                      ACL user name (--user)
  REDIS_LOCK_REPLICAS                  replicas every grant must reach (--replicas)
  REDIS_LOCK_TOKEN                     release/extend: the token when none is given

Durations: 500ms, 10s, 1.5 (seconds), 2m, 1h.";

// Kept under 80 columns a line: clap wraps longer lines at the terminal's width, which
// would break the examples apart (a test renders this at 80 columns).
const RUN_HELP: &str = "\
Examples:
  redis-lock run daily-report -- /usr/local/bin/daily-report
  redis-lock run -w 10s deploy -c 'make deploy && make smoke-test'
  redis-lock run job --ttl 5s -- sh -c 'echo fence $REDIS_LOCK_FENCE'
  redis-lock run --shared -w 1m catalog -- ./read-catalog
  redis-lock run --limit 4 -w 10m exports -- ./export
  redis-lock run -w 1m acct:17 --also acct:42 -- ./transfer 17 42

Once a day on every server, run by one of them (a crontab):
  REDIS_LOCK_URL=redis://lock-host:6379
  0 3 * * * redis-lock run -q --hold 1h report -- /usr/local/bin/report

CMD gets REDIS_LOCK_NAME, REDIS_LOCK_TOKEN and REDIS_LOCK_FENCE (empty when
there is no fence) in its environment and runs in a process group of its own.
The lease is renewed every third of --ttl; a failed renewal is tried again.
If the lease is lost (a renewal answered 0, or none succeeded until --margin
before the lease can end, or --max-hold was reached), CMD's group gets
SIGTERM, then SIGKILL after --grace or when the lease can end, whichever is
first, and redis-lock exits 79. SIGTERM, SIGINT and SIGHUP sent to redis-lock
are passed to CMD's group (SIGKILL after --grace). If redis-lock itself dies
(kill -9), CMD's group is killed with it.

With --hold the lock stays taken after CMD succeeds (exit 0) until --hold
after it was taken, so that servers whose clocks or cron runs are a little
late find it busy (once per period); after a failed CMD it is released, so
that another server can run the job (--hold-on-failure keeps it anyway).

Several locks (--also NAME, repeated): all are taken in one step or none
(LOCK.ACQUIREALL; with -w it waits in every queue at once), in one session
whose one keepalive every third of --ttl renews them all, and they are
released together when CMD ends. If redis-lock dies (kill -9), the server
releases them all when the session's --ttl runs out, or --bind GRACE after
its connection closed. CMD also gets REDIS_LOCK_FENCES: the fences in the
order of the names. --bind alone takes a single lock in a session too.";

const ELECT_HELP: &str = "\
Examples:
  redis-lock elect scheduler --value \"$(hostname)\" -- ./scheduler
  redis-lock elect -t 5s -w 1m primary -c 'exec ./serve --primary'

Candidates wait in NAME's FIFO queue: the first to campaign leads, the next
one is elected the moment the leader resigns (CMD ended) or its lease ends
(it crashed: within --ttl). CMD runs only while this process leads, with
REDIS_LOCK_NAME, REDIS_LOCK_VALUE, REDIS_LOCK_TERM (the fence, which grows
from one leader to the next), REDIS_LOCK_FENCE (the same) and
REDIS_LOCK_TOKEN in its environment. Losing the lease works as in run:
SIGTERM to CMD's group, SIGKILL after --grace, exit 79. A leader learns of
a lost lease only when a renewal fails: guard its writes with
LOCK.IFHELD NAME $REDIS_LOCK_TOKEN ... or pass the term as a fence.";

const OBSERVE_HELP: &str = "\
Output, one line per change (the first: who leads when observe starts):
  leader TERM VALUE       a leader, or a new value it proclaimed
  none                    nobody leads
With --json: {\"name\":..,\"leader\":true,\"value\":..,\"term\":\"..\"} (the term
as a decimal string) or {\"name\":..,\"leader\":false}.

Each line comes from one LOCK.WATCH that waits on the server for the change
(no polling); changes closer together than a round trip may show as one.
Stops after --count lines, after --for (exit 1 if --count was not reached),
or at SIGINT/SIGTERM/SIGHUP (exit 0). Reconnects by itself.";

/// Distributed locks from the shell, on the redis-lock module (flock(1) across machines).
#[derive(Parser, Debug)]
#[command(name = "redis-lock", version, after_help = EXIT_HELP, propagate_version = true)]
struct Cli {
    #[command(flatten)]
    global: Global,
    #[command(subcommand)]
    cmd: Cmd,
}

/// Options every subcommand takes, anywhere on the command line.
#[derive(ClapArgs, Debug)]
struct Global {
    /// Server: redis://[user@]host:port[/db], or rediss://... for TLS (rediss://...#insecure
    /// skips the certificate check). A Redis Cluster node works too: commands are routed by
    /// key. Default: $REDIS_LOCK_URL, then $REDIS_URL, then redis://127.0.0.1:6379
    #[arg(long, global = true, value_name = "URL")]
    url: Option<String>,
    /// Redlock over these independent servers instead of --url
    #[arg(long, global = true, value_name = "URL,URL,...", value_delimiter = ',')]
    nodes: Vec<String>,
    /// ACL user; the password comes from $REDIS_LOCK_PASSWORD or $REDISCLI_AUTH
    #[arg(long, global = true, value_name = "USER", env = "REDIS_LOCK_USER")]
    user: Option<String>,
    /// Primary of a Sentinel-watched service instead of --url: the Sentinels (with
    /// --master; or --url redis+sentinel://HOST:PORT[,HOST:PORT...]/MASTER)
    #[arg(long, global = true, value_name = "HOST:PORT,...", requires = "master")]
    sentinel: Option<String>,
    /// The service name the Sentinels watch (with --sentinel)
    #[arg(long, global = true, value_name = "NAME", requires = "sentinel")]
    master: Option<String>,
    /// Use TLS with a redis:// URL (as rediss://)
    #[arg(long, global = true)]
    tls: bool,
    /// PEM file of the CA certificate(s) to trust for TLS (default: the system's, or
    /// $SSL_CERT_FILE)
    #[arg(long, global = true, value_name = "FILE")]
    cacert: Option<PathBuf>,
    /// PEM file of a client certificate for TLS (with --key): a server with
    /// tls-auth-clients yes, Redis's default, requires one
    #[arg(long, global = true, value_name = "FILE", requires = "key")]
    cert: Option<PathBuf>,
    /// PEM file of the client certificate's private key (with --cert)
    #[arg(long, global = true, value_name = "FILE", requires = "cert")]
    key: Option<PathBuf>,
    /// Limit for one network call (connecting included)
    #[arg(long, global = true, value_name = "DURATION", default_value = "2s", value_parser = parse_duration)]
    timeout: Duration,
    /// Replicas every grant must reach before it counts (WAIT); fewer connected is an
    /// error. Default: the server's min-replicas-to-write, else every replica online
    #[arg(
        long,
        global = true,
        value_name = "N",
        env = "REDIS_LOCK_REPLICAS",
        conflicts_with = "no_confirm"
    )]
    replicas: Option<u32>,
    /// Return grants without confirming them on the replicas (a failover right after a
    /// grant may then lose it)
    #[arg(long, global = true)]
    no_confirm: bool,
    /// How long a grant may wait for its replicas' confirmation
    #[arg(long, global = true, value_name = "DURATION", default_value = "1s", value_parser = parse_duration)]
    confirm_timeout: Duration,
    /// Print errors only
    #[arg(short, long, global = true)]
    quiet: bool,
    /// Print debug lines on stderr
    #[arg(short, long, global = true, conflicts_with = "quiet")]
    verbose: bool,
}

/// How to take the lock (run and acquire).
#[derive(ClapArgs, Debug, Clone)]
struct LockArgs {
    /// Lease length
    #[arg(short = 't', long, value_name = "DURATION", default_value = "30s", value_parser = parse_duration)]
    ttl: Duration,
    /// Wait up to DURATION for a busy lock (the module's FIFO queue; retries for --nodes)
    #[arg(short = 'w', long, value_name = "DURATION", value_parser = parse_duration, conflicts_with = "nonblock")]
    wait: Option<Duration>,
    /// Fail at once when the lock is busy (the default)
    #[arg(short = 'n', long)]
    nonblock: bool,
    /// Label shown by LOCK.INFO [default: <hostname>:<pid>]
    #[arg(long, value_name = "LABEL")]
    owner: Option<String>,
    /// Take a shared (reader) place, like flock -s: any number of --shared holders at
    /// once; a holder without it is the writer and waits for all of them
    #[arg(short = 's', long, conflicts_with = "limit")]
    shared: bool,
    /// Take one of N permits of a counted lock (a semaphore, like consul lock -n N): up
    /// to N holders at once; every holder of NAME must give the same N
    #[arg(long, value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_LIMIT)))]
    limit: Option<u32>,
    /// Exit code when the lock is busy
    #[arg(short = 'E', long = "conflict-exit-code", value_name = "N", default_value_t = EXIT_BUSY,
          value_parser = clap::value_parser!(i32).range(0..=255))]
    busy_code: i32,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Take NAME, run CMD while renewing the lease, release when CMD exits, exit with
    /// CMD's exit code (busy: exit 75 without running CMD)
    #[command(after_help = RUN_HELP)]
    Run(RunArgs),
    /// Take NAME and print REDIS_LOCK_TOKEN=... and REDIS_LOCK_FENCE=... (for eval in a
    /// shell), or JSON with --json; busy: exit 75
    Acquire(AcquireArgs),
    /// Release NAME held by TOKEN; exit 1 if TOKEN did not hold it
    Release(TokenArgs),
    /// Set the lease of NAME held by TOKEN to --ttl from now; exit 1 if not held by TOKEN
    Extend(ExtendArgs),
    /// Show LOCK.INFO of NAME; exit 1 if the lock is free
    Info(InfoArgs),
    /// Campaign for leadership of NAME, run CMD while leader, resign when CMD exits;
    /// exit with CMD's exit code (lost leadership: 79)
    #[command(after_help = ELECT_HELP, mut_args = leadership_help)]
    Elect(ElectArgs),
    /// Print who leads NAME, then one line per change (a new leader, a new value, no
    /// leader), until interrupted, --count lines or --for
    #[command(after_help = OBSERVE_HELP)]
    Observe(ObserveArgs),
    /// Serve the module's INFO lock figures and per-lock waiting figures to Prometheus
    /// (GET /metrics on --listen), or print them once with --once
    Metrics(metrics::MetricsArgs),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell)
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
}

#[derive(ClapArgs, Debug)]
struct RunArgs {
    /// Lock name (the Redis key)
    name: String,
    #[command(flatten)]
    lock: LockArgs,
    /// Cap on the total hold time: renewal stops there and the lease runs out
    #[arg(long, value_name = "DURATION", default_value = "24h", value_parser = parse_duration)]
    max_hold: Duration,
    /// Once per period: when CMD succeeds (exit 0), keep the lock until DURATION after
    /// it was taken (instead of releasing it), so that the same job started a little
    /// later elsewhere finds it busy; at most the server's lock.max-ttl
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    hold: Option<Duration>,
    /// With --hold: keep the lock also when CMD failed (no other server runs the job
    /// in that period)
    #[arg(long, requires = "hold")]
    hold_on_failure: bool,
    /// How long before the lease can end CMD gets SIGTERM when no renewal succeeded
    /// (the server does not answer) [default: a third of --ttl]
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    margin: Option<Duration>,
    /// Another lock to take with NAME (repeat it for more): all or none, in one
    /// session, released together (one server only)
    #[arg(long, value_name = "NAME")]
    also: Vec<String>,
    /// Bind the session to redis-lock's connection: if redis-lock dies, the server
    /// releases every lock GRACE after the connection closed instead of when --ttl
    /// runs out (takes the lock(s) in a session)
    #[arg(long, value_name = "GRACE", value_parser = parse_duration)]
    bind: Option<Duration>,
    #[command(flatten)]
    child: ChildArgs,
}

/// The child process of `run` and `elect` (whose help says "leadership" where this says
/// "the lease": [`leadership_help`]).
#[derive(ClapArgs, Debug)]
struct ChildArgs {
    /// Time between SIGTERM and SIGKILL when the lease is lost
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_duration)]
    grace: Duration,
    /// Exit code when the lease is lost while CMD runs
    #[arg(long = "lost-exit-code", value_name = "N", default_value_t = EXIT_LOST,
          value_parser = clap::value_parser!(i32).range(0..=255))]
    lost_code: i32,
    /// Run this string with /bin/sh -c instead of CMD
    #[arg(
        short = 'c',
        long = "command",
        value_name = "SHELL_COMMAND",
        conflicts_with = "cmd"
    )]
    shell: Option<OsString>,
    /// The command and its arguments (after --, or after NAME)
    #[arg(
        value_name = "CMD",
        trailing_var_arg = true,
        required_unless_present = "shell"
    )]
    cmd: Vec<OsString>,
}

/// `elect`'s help for the [`ChildArgs`] that speak of the lease.
fn leadership_help(a: clap::Arg) -> clap::Arg {
    match a.get_id().as_str() {
        "grace" => a.help("Time between SIGTERM and SIGKILL when leadership is lost"),
        "lost_code" => a.help("Exit code when leadership is lost while CMD runs"),
        _ => a,
    }
}

#[derive(ClapArgs, Debug)]
struct ElectArgs {
    /// Election name (the lock's Redis key)
    name: String,
    /// The value this candidate publishes while it leads (its OWNER label)
    /// [default: <hostname>:<pid>]
    #[arg(long, value_name = "VALUE")]
    value: Option<String>,
    /// Lease length: how long a crashed leader keeps the others waiting
    #[arg(short = 't', long, value_name = "DURATION", default_value = "30s", value_parser = parse_duration)]
    ttl: Duration,
    /// Give up campaigning after DURATION (exit 75) [default: wait until elected]
    #[arg(short = 'w', long, value_name = "DURATION", value_parser = parse_duration)]
    wait: Option<Duration>,
    /// Exit code when not elected within --wait
    #[arg(short = 'E', long = "conflict-exit-code", value_name = "N", default_value_t = EXIT_BUSY,
          value_parser = clap::value_parser!(i32).range(0..=255))]
    busy_code: i32,
    #[command(flatten)]
    child: ChildArgs,
}

#[derive(ClapArgs, Debug)]
struct ObserveArgs {
    /// Election name (the lock's Redis key)
    name: String,
    /// Print each change as JSON (the term as a decimal string)
    #[arg(long)]
    json: bool,
    /// Stop after N lines (the first one included)
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    count: Option<u64>,
    /// Stop after DURATION (--timeout is the limit of one network call)
    #[arg(long = "for", visible_alias = "duration", value_name = "DURATION", value_parser = parse_duration)]
    for_: Option<Duration>,
    /// Longest wait of one LOCK.WATCH on the server
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_duration)]
    block: Duration,
}

#[derive(ClapArgs, Debug)]
struct AcquireArgs {
    /// Lock name (the Redis key)
    name: String,
    #[command(flatten)]
    lock: LockArgs,
    /// Hold the lock with this token instead of a random one
    #[arg(long, value_name = "TOKEN")]
    token: Option<String>,
    /// Print {"name", "token", "fence"} as JSON (the fence as a decimal string)
    #[arg(long)]
    json: bool,
}

#[derive(ClapArgs, Debug)]
struct TokenArgs {
    /// Lock name (the Redis key)
    name: String,
    /// The holder's token
    #[arg(env = "REDIS_LOCK_TOKEN", hide_env_values = true)]
    token: String,
}

#[derive(ClapArgs, Debug)]
struct ExtendArgs {
    /// Lock name (the Redis key)
    name: String,
    /// The holder's token
    #[arg(env = "REDIS_LOCK_TOKEN", hide_env_values = true)]
    token: String,
    /// New lease, from now
    #[arg(short = 't', long, value_name = "DURATION", default_value = "30s", value_parser = parse_duration)]
    ttl: Duration,
}

#[derive(ClapArgs, Debug)]
struct InfoArgs {
    /// Lock name (the Redis key)
    name: String,
    /// Print the fields as JSON (the fence as a decimal string)
    #[arg(long)]
    json: bool,
}

/// `500ms`, `10s`, `1.5` (seconds), `2m`, `1h`.
fn parse_duration(v: &str) -> Result<Duration, String> {
    let v = v.trim();
    let split = v
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(v.len());
    let (num, unit) = v.split_at(split);
    let n: f64 = num
        .parse()
        .map_err(|_| format!("{v:?} is not a duration (e.g. 500ms, 10s, 1.5, 2m, 1h)"))?;
    let scale = match unit.trim() {
        "ms" => 0.001,
        "" | "s" | "sec" => 1.0,
        "m" | "min" => 60.0,
        "h" => 3600.0,
        other => return Err(format!("unknown unit {other:?} in {v:?} (ms, s, m or h)")),
    };
    let secs = n * scale;
    if !secs.is_finite() || !(0.0..=315_360_000.0).contains(&secs) {
        return Err(format!("{v:?} is out of range"));
    }
    if unit.is_empty() && n >= 1000.0 {
        // Until 0.1 the options took milliseconds: say what a bare number means now.
        eprintln!(
            "redis-lock: note: a bare number is seconds ({v} s); write {v}ms for milliseconds"
        );
    }
    Ok(Duration::from_secs_f64(secs))
}

/// `url` with the user and password set (from the environment, so that `ps` does not
/// show them).
fn with_credentials(
    url: &str,
    user: Option<&str>,
    password: Option<&str>,
) -> Result<String, String> {
    if user.is_none() && password.is_none() {
        return Ok(url.to_string());
    }
    if let Some((scheme, rest)) = url.split_once("+sentinel://") {
        // HOST:PORT,HOST:PORT is no URL authority the url crate takes: by hand.
        let authority = rest.split('/').next().unwrap_or_default();
        if authority.contains('@') {
            return Ok(url.to_string()); // credentials in the URL win
        }
        let user = user.map(percent_encode).unwrap_or_default();
        let pw = password.map(|p| format!(":{}", percent_encode(p)));
        return Ok(format!(
            "{scheme}+sentinel://{user}{}@{rest}",
            pw.unwrap_or_default()
        ));
    }
    let shown = redis_lock_client::redact_url(url);
    let mut u = url::Url::parse(url).map_err(|_| not_a_url(url))?;
    if let Some(user) = user {
        u.set_username(user)
            .map_err(|_| format!("{shown}: cannot carry a user name"))?;
    }
    if let Some(pw) = password {
        if u.password().is_none() {
            u.set_password(Some(pw))
                .map_err(|_| format!("{shown}: cannot carry a password"))?;
        }
    }
    Ok(u.to_string())
}

/// Every byte but the unreserved ones (`A-Z a-z 0-9 - . _ ~`) as `%XX`.
fn percent_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                char::from(b).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// `url` with TLS: `redis://` as `rediss://` (`--tls`).
fn with_tls(url: &str) -> String {
    for (plain, tls) in [
        ("redis://", "rediss://"),
        ("redis+sentinel://", "rediss+sentinel://"),
    ] {
        if let Some(rest) = url.strip_prefix(plain) {
            return format!("{tls}{rest}");
        }
    }
    url.to_string()
}

/// The usage error for a server address that is not a URL. The value is not echoed
/// when it might hold a password.
fn not_a_url(url: &str) -> String {
    let shown = if url.contains('@') {
        "the server address given (not shown: it may hold a password)".to_string()
    } else {
        format!("{url:?}")
    };
    let example = if url.contains("://") || url.contains('@') {
        "redis://HOST:PORT".to_string()
    } else {
        format!("redis://{url}")
    };
    format!(
        "{shown} is not a server URL: write {example} (rediss://... for TLS, \
         unix:///path for a socket)"
    )
}

/// A usage error unless `url` is a URL the client can connect to.
fn check_url(url: &str) -> Result<(), String> {
    if url.starts_with("redis+sentinel://") || url.starts_with("rediss+sentinel://") {
        return Ok(()); // the client checks it (a usage error too)
    }
    match redis::Client::open(url) {
        Ok(_) => Ok(()),
        Err(_) => Err(not_a_url(url)),
    }
}

fn env_nonempty(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

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
// The settings a subcommand runs with, resolved from the command line and environment

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sub {
    Run,
    Acquire,
    Release,
    Extend,
    Info,
    Elect,
    Observe,
    Metrics,
}

#[derive(Debug)]
struct Args {
    sub: Sub,
    url: String,
    nodes: Option<Vec<String>>,
    /// TLS certificate files: the CA, the client certificate and its key.
    cacert: Option<PathBuf>,
    cert: Option<(PathBuf, PathBuf)>,
    ttl: Duration,
    wait: Option<Duration>,
    owner: Option<String>,
    mode: LockMode,
    token: Option<String>,
    max_hold: Duration,
    hold: Option<Duration>,
    hold_on_failure: bool,
    margin: Option<Duration>,
    /// run: the other locks taken with `name` (in one session).
    also: Vec<String>,
    /// run: the session's bind grace.
    bind: Option<Duration>,
    grace: Duration,
    timeout: Duration,
    confirm: Confirm,
    confirm_timeout: Duration,
    verbosity: log::LevelFilter,
    name: String,
    rest: Vec<OsString>,
    busy_code: i32,
    lost_code: i32,
    json: bool,
    /// observe: stop after this many lines / after this long; the WATCH bound.
    count: Option<u64>,
    observe_for: Option<Duration>,
    block: Duration,
    metrics: Option<metrics::MetricsArgs>,
}

impl Args {
    /// run takes its lock(s) in a session: several names, or --bind.
    fn in_session(&self) -> bool {
        !self.also.is_empty() || self.bind.is_some()
    }

    /// The lock names of a run: NAME, then each --also.
    fn names(&self) -> Vec<&str> {
        std::iter::once(self.name.as_str())
            .chain(self.also.iter().map(String::as_str))
            .collect()
    }

    /// The names for messages: `a`, or `a, b and c`.
    fn shown_names(&self) -> String {
        match self.names().as_slice() {
            [one] => one.to_string(),
            [init @ .., last] => format!("{} and {last}", init.join(", ")),
            [] => String::new(),
        }
    }
}

#[derive(Debug)]
enum Parsed {
    Args(Box<Args>),
    Completions(clap_complete::Shell),
}

fn resolve(cli: Cli) -> Result<Parsed, String> {
    let g = cli.global;
    let password = env_nonempty("REDIS_LOCK_PASSWORD").or_else(|| env_nonempty("REDISCLI_AUTH"));
    let nodes: Vec<String> = g
        .nodes
        .iter()
        .map(|n| n.trim())
        .filter(|n| !n.is_empty())
        .map(|n| {
            check_url(n)?;
            with_credentials(n, g.user.as_deref(), password.as_deref())
        })
        .collect::<Result<_, _>>()?;
    if !g.nodes.is_empty() && nodes.is_empty() {
        return Err("--nodes needs at least one URL".into());
    }
    let given = [g.url.is_some(), !nodes.is_empty(), g.sentinel.is_some()];
    if given.iter().filter(|&&x| x).count() > 1 {
        return Err("give one of --url, --nodes and --sentinel".into());
    }
    let sentinel = g
        .sentinel
        .zip(g.master)
        .map(|(hosts, master)| format!("redis+sentinel://{hosts}/{master}"));
    let url = g
        .url
        .or(sentinel)
        .or_else(|| env_nonempty("REDIS_LOCK_URL"))
        .or_else(|| env_nonempty("REDIS_URL"))
        .unwrap_or_else(|| DEFAULT_URL.into());
    let url = if g.tls { with_tls(&url) } else { url };
    let nodes: Vec<String> = match g.tls {
        true => nodes.iter().map(|n| with_tls(n)).collect(),
        false => nodes,
    };
    check_url(&url)?;
    let url = with_credentials(&url, g.user.as_deref(), password.as_deref())?;
    if g.timeout.is_zero() || g.confirm_timeout.is_zero() {
        return Err("--timeout and --confirm-timeout must be positive".into());
    }
    let mut a = Args {
        sub: Sub::Info,
        url,
        nodes: (!nodes.is_empty()).then_some(nodes),
        cacert: g.cacert,
        cert: g.cert.zip(g.key),
        ttl: Duration::from_secs(30),
        wait: None,
        owner: None,
        mode: LockMode::Exclusive,
        token: None,
        max_hold: Duration::from_secs(86_400),
        hold: None,
        hold_on_failure: false,
        margin: None,
        also: Vec::new(),
        bind: None,
        grace: Duration::from_secs(10),
        timeout: g.timeout,
        confirm: match (g.no_confirm, g.replicas) {
            (true, _) => Confirm::Off,
            (false, Some(n)) => Confirm::Replicas(n),
            (false, None) => Confirm::Auto,
        },
        confirm_timeout: g.confirm_timeout,
        verbosity: if g.quiet {
            log::LevelFilter::Error
        } else if g.verbose {
            log::LevelFilter::Debug
        } else {
            log::LevelFilter::Info
        },
        name: String::new(),
        rest: Vec::new(),
        busy_code: EXIT_BUSY,
        lost_code: EXIT_LOST,
        json: false,
        count: None,
        observe_for: None,
        block: Duration::from_secs(10),
        metrics: None,
    };
    let lock = |a: &mut Args, l: LockArgs| {
        a.ttl = l.ttl;
        a.wait = if l.nonblock {
            None
        } else {
            l.wait.filter(|w| !w.is_zero())
        };
        a.owner = l.owner;
        a.busy_code = l.busy_code;
        a.mode = match (l.shared, l.limit) {
            (_, Some(n)) => LockMode::Counted(n),
            (true, None) => LockMode::Shared,
            (false, None) => LockMode::Exclusive,
        };
    };
    let child = |a: &mut Args, c: ChildArgs, sub: &str| {
        a.grace = c.grace;
        a.lost_code = c.lost_code;
        a.rest = match c.shell {
            Some(s) => vec!["/bin/sh".into(), "-c".into(), s],
            None => c.cmd,
        };
        if a.rest.is_empty() {
            return Err(format!(
                "{sub} needs a command: redis-lock {sub} NAME -- CMD [ARGS...]"
            ));
        }
        Ok(())
    };
    (a.sub, a.name) = match cli.cmd {
        Cmd::Run(r) => {
            lock(&mut a, r.lock);
            a.max_hold = r.max_hold;
            a.hold = r.hold;
            a.hold_on_failure = r.hold_on_failure;
            a.margin = r.margin;
            a.also = r.also;
            a.bind = r.bind;
            child(&mut a, r.child, "run")?;
            (Sub::Run, r.name)
        }
        Cmd::Acquire(q) => {
            lock(&mut a, q.lock);
            a.token = q.token;
            a.json = q.json;
            (Sub::Acquire, q.name)
        }
        Cmd::Release(t) => {
            a.token = Some(t.token);
            (Sub::Release, t.name)
        }
        Cmd::Extend(e) => {
            a.token = Some(e.token);
            a.ttl = e.ttl;
            (Sub::Extend, e.name)
        }
        Cmd::Info(i) => {
            a.json = i.json;
            (Sub::Info, i.name)
        }
        Cmd::Elect(e) => {
            a.ttl = e.ttl;
            a.wait = e.wait.filter(|w| !w.is_zero());
            a.owner = e.value;
            a.busy_code = e.busy_code;
            child(&mut a, e.child, "elect")?;
            (Sub::Elect, e.name)
        }
        Cmd::Observe(o) => {
            a.json = o.json;
            a.count = o.count;
            a.observe_for = o.for_;
            if o.block < Duration::from_millis(1) {
                return Err("--block must be at least 1ms".into());
            }
            a.block = o.block;
            (Sub::Observe, o.name)
        }
        Cmd::Metrics(m) => {
            a.metrics = Some(m);
            (Sub::Metrics, String::new())
        }
        Cmd::Completions { shell } => return Ok(Parsed::Completions(shell)),
    };
    if a.ttl < Duration::from_millis(1)
        || a.max_hold < Duration::from_millis(1)
        || a.hold.is_some_and(|h| h < Duration::from_millis(1))
    {
        return Err("--ttl, --max-hold and --hold must be at least 1ms".into());
    }
    if a.margin.is_some_and(|m| m + a.ttl / 3 >= a.ttl) {
        return Err(
            "--margin must be shorter than two thirds of --ttl (the lease is renewed every \
             third of it)"
                .into(),
        );
    }
    if a.token.as_deref() == Some("") {
        return Err("the token is empty".into());
    }
    if matches!(a.sub, Sub::Elect | Sub::Observe) {
        if a.nodes.is_some() {
            return Err(
                "elect and observe need one server (--url): an election lives on the \
                        lock's server, and --nodes is a Redlock quorum"
                    .into(),
            );
        }
        if a.owner
            .as_deref()
            .is_some_and(|v| v.is_empty() || v.len() > 256)
        {
            return Err("--value must be 1 to 256 bytes long".into());
        }
    }
    if a.in_session() {
        if a.nodes.is_some() {
            return Err(
                "--also and --bind need one server (--url): the locks are taken in a \
                 session, which lives on one server"
                    .into(),
            );
        }
        if a.hold.is_some() {
            return Err("--hold takes one lock without --also or --bind".into());
        }
        let names = a.names();
        if names.len() > MAX_KEYS {
            return Err(format!("at most {MAX_KEYS} locks in one run"));
        }
        if let Some(n) = names
            .iter()
            .enumerate()
            .find_map(|(i, n)| names[..i].contains(n).then_some(n))
        {
            return Err(format!("{n} is named twice"));
        }
    }
    if let (LockMode::Counted(_), Some(_)) = (a.mode, &a.nodes) {
        return Err(
            "--limit cannot be used with --nodes: over a Redlock quorum a counted \
                    lock could admit more holders than its limit (each node grants its own \
                    permits); use --url"
                .into(),
        );
    }
    Ok(Parsed::Args(Box::new(a)))
}

/// Parses argv; `Err((exit code, text))` for help, version and usage errors.
fn parse(argv: Vec<OsString>) -> Result<Parsed, (i32, String)> {
    match Cli::try_parse_from(argv) {
        Ok(cli) => resolve(cli).map_err(|e| {
            (
                EXIT_USAGE,
                format!("redis-lock: {e}\nTry 'redis-lock --help'.\n"),
            )
        }),
        Err(e) => {
            let code = if e.use_stderr() { EXIT_USAGE } else { 0 };
            Err((code, e.render().to_string()))
        }
    }
}

// ------------------------------------------------------------------------------------
// One server or a Redlock quorum

enum Locker {
    Single(LockClient),
    Quorum(Redlock),
}

impl Locker {
    fn busy_message(&self, name: &str, mode: LockMode) -> String {
        match self {
            Locker::Single(_) => match mode {
                LockMode::Exclusive => format!("{name} is held elsewhere"),
                LockMode::Shared => {
                    format!("{name} is held elsewhere exclusively (or a writer waits for it)")
                }
                LockMode::Counted(n) => format!("{name}: all {n} permits are taken"),
            },
            Locker::Quorum(q) => format!(
                "{name}: no majority ({} of {} nodes) granted it (held elsewhere, or nodes down)",
                q.quorum(),
                q.nodes()
            ),
        }
    }

    /// The client for the servers `a` names; `Err((exit code, message))`.
    async fn new(a: &Args) -> Result<Locker, (i32, String)> {
        let cert = a.cert.as_ref();
        let tls = match (&a.cacert, cert) {
            (None, None) => None,
            _ => Some(
                Tls::from_files(a.cacert.as_ref(), cert.map(|c| &c.0), cert.map(|c| &c.1))
                    .map_err(|e| (EXIT_USAGE, e.to_string()))?,
            ),
        };
        // A URL (or an option) the client cannot use is a usage error; the rest is the
        // servers'.
        let code = |e: Error| match e {
            Error::Invalid(_) => (EXIT_USAGE, e.to_string()),
            e => (EXIT_UNAVAILABLE, e.to_string()),
        };
        let client = ClientOptions {
            connect_timeout: a.timeout,
            io_timeout: a.timeout,
            cluster: None,
            confirm: a.confirm,
            confirm_timeout: a.confirm_timeout,
            tls,
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
                    .map_err(code)
            }
            // The errors name the server as host:port: the URL may hold a password.
            None => LockClient::connect_with(&a.url, client)
                .await
                .map(Locker::Single)
                .map_err(code),
        }
    }

    async fn acquire(&self, name: &str, o: &AcquireOptions) -> Result<Option<LockGuard>, Error> {
        match self {
            Locker::Single(c) => c.acquire_with(name, o).await,
            Locker::Quorum(q) => q.acquire_with(name, o).await,
        }
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
    o.mode = a.mode;
    // The hold's length is checked against the server's limit before anything is taken
    // (run decides itself when CMD ends whether to keep the lock for it).
    o.hold = a.hold;
    if renew {
        o.renew = Some(Renewal {
            margin: a.margin,
            ..Renewal::capped(a.max_hold)
        });
    }
    o
}

/// An acquisition's error: logged (also under -q), as an exit code. A lease or hold
/// above the server's `lock.max-ttl` is a usage error naming the option.
fn acquire_failed(a: &Args, e: &Error) -> i32 {
    if e.is_lease_too_long() {
        let (option, value) = match a.hold {
            Some(h) if h > a.ttl => ("--hold", h),
            _ => ("--ttl", a.ttl),
        };
        log::error!(
            "{option} {} is longer than the server allows: {e}; not running the command \
             (raise lock.max-ttl, or ask for less)",
            humantime(value)
        );
        return EXIT_USAGE;
    }
    log::error!("{e}");
    EXIT_UNAVAILABLE
}

/// A duration as the options take it back (`144h`, `90s`, `1500ms`).
fn humantime(d: Duration) -> String {
    let ms = d.as_millis();
    match ms {
        _ if ms.is_multiple_of(3_600_000) => format!("{}h", ms / 3_600_000),
        _ if ms.is_multiple_of(60_000) => format!("{}m", ms / 60_000),
        _ if ms.is_multiple_of(1_000) => format!("{}s", ms / 1_000),
        _ => format!("{ms}ms"),
    }
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
            let fence = fence.map(|f| f.to_string());
            if a.json {
                let v = serde_json::json!({ "name": a.name, "token": token, "fence": fence });
                out!("{v}");
            } else {
                out!("REDIS_LOCK_TOKEN={}", shell_quote(&token));
                out!("REDIS_LOCK_FENCE={}", fence.unwrap_or_default());
            }
            0
        }
        Ok(None) => {
            log::info!("{}", locker.busy_message(&a.name, a.mode));
            a.busy_code
        }
        Err(e) => acquire_failed(a, &e),
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
        if k == "holder-list" {
            // One block per holder instead of the one-line rendering.
            out!("{indent}{k}:");
            for h in &info.holder_list {
                let mut dash = "- ";
                for (hk, hv) in &h.fields {
                    out!("{indent}  {dash}{hk}: {}", hv.as_deref().unwrap_or("(nil)"));
                    dash = "  ";
                }
            }
            continue;
        }
        out!("{indent}{k}: {}", v.as_deref().unwrap_or("(nil)"));
    }
}

/// Fields as a JSON object: integers as numbers, except fences, which are decimal
/// strings (they may exceed 2^53, where JSON readers such as JavaScript and jq round
/// numbers).
fn fields_json(fields: &[(String, Option<String>)]) -> serde_json::Map<String, serde_json::Value> {
    let mut m = serde_json::Map::new();
    for (k, v) in fields {
        let value = match v {
            None => serde_json::Value::Null,
            Some(s) if k != "fence" => s
                .parse::<i64>()
                .map(serde_json::Value::from)
                .unwrap_or_else(|_| s.clone().into()),
            Some(s) => s.clone().into(),
        };
        m.insert(k.clone(), value);
    }
    m
}

/// LOCK.INFO as a JSON object (see `fields_json`), the holder list as an array of
/// objects.
fn info_json(info: Option<&redis_lock_client::LockInfo>) -> serde_json::Value {
    let mut m = serde_json::Map::new();
    m.insert("held".into(), info.is_some().into());
    if let Some(info) = info {
        m.extend(fields_json(&info.fields));
        if m.contains_key("holder-list") {
            let holders = info
                .holder_list
                .iter()
                .map(|h| serde_json::Value::Object(fields_json(&h.fields)))
                .collect();
            m.insert("holder-list".into(), serde_json::Value::Array(holders));
        }
    }
    serde_json::Value::Object(m)
}

async fn cmd_info(a: &Args, locker: &Locker) -> i32 {
    match locker {
        Locker::Single(c) => match c.info(&a.name).await {
            Ok(info) => {
                if a.json {
                    let mut v = info_json(info.as_ref());
                    v["name"] = a.name.clone().into();
                    out!("{v}");
                } else if let Some(info) = &info {
                    print_info(info, "");
                } else {
                    out!("free");
                }
                if info.is_some() {
                    0
                } else {
                    EXIT_NOT_HELD
                }
            }
            Err(e) => {
                log::error!("{e}");
                EXIT_UNAVAILABLE
            }
        },
        Locker::Quorum(q) => {
            let mut held = 0;
            let mut nodes = Vec::new();
            for (url, r) in q.info(&a.name).await {
                match r {
                    Ok(info) => {
                        held += usize::from(info.is_some());
                        if a.json {
                            let mut v = info_json(info.as_ref());
                            v["url"] = url.into();
                            nodes.push(v);
                        } else {
                            out!("{url}:");
                            match &info {
                                Some(info) => print_info(info, "  "),
                                None => out!("  free"),
                            }
                        }
                    }
                    Err(e) if a.json => {
                        nodes.push(serde_json::json!({ "url": url, "error": e.to_string() }))
                    }
                    Err(e) => out!("{url}:\n  error: {e}"),
                }
            }
            if a.json {
                out!("{}", serde_json::json!({ "name": a.name, "nodes": nodes }));
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
    match guard.release_now().await {
        Ok(true) => log::debug!("released {name}"),
        Ok(false) => log::debug!("{name} was no longer held at release"),
        Err(e) => log::warn!("release of {name} failed: {e}"),
    }
}

/// The end of a run whose CMD ran (exit `code`): release, or with --hold keep the lock
/// until the hold ends: after a success, or with --hold-on-failure.
async fn finish_run(guard: LockGuard, a: &Args, code: i32) {
    let hold = match a.hold {
        Some(h) if code == 0 || a.hold_on_failure => h,
        Some(_) => {
            log::info!(
                "the command failed (exit {code}): {} is released, not held, so that \
                 another run can do the job",
                a.name
            );
            return release_quietly(guard, &a.name).await;
        }
        None => return release_quietly(guard, &a.name).await,
    };
    match guard.release_after(hold).await {
        Ok(true) => log::debug!("{} stays taken until --hold ends", a.name),
        Ok(false) => log::debug!("{} was no longer held when CMD ended", a.name),
        Err(e) => log::warn!("keeping {} for --hold failed: {e}", a.name),
    }
}

/// What `run` and `elect` hold while CMD runs: one lock's guard, or a session and the
/// guards of its locks (in the order of the names).
enum Held {
    Lock(LockGuard),
    Session(Session, Vec<LockGuard>),
}

impl Held {
    fn first(&self) -> &LockGuard {
        match self {
            Held::Lock(g) => g,
            Held::Session(_, guards) => &guards[0],
        }
    }

    /// The loss signal: the lock's, or the session's.
    fn lost(
        &self,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Option<LossReason>> + Send>> {
        match self {
            Held::Lock(g) => Box::pin(g.lost()),
            Held::Session(s, _) => Box::pin(s.lost()),
        }
    }

    fn valid_until(&self) -> Option<std::time::Instant> {
        match self {
            Held::Lock(g) => g.valid_until(),
            Held::Session(s, _) => s.valid_until(),
        }
    }

    /// Releases now: the lock, or every lock of the session at once (its close).
    async fn release(self, a: &Args) {
        match self {
            Held::Lock(g) => release_quietly(g, &a.name).await,
            Held::Session(s, guards) => {
                match s.close().await {
                    Ok(n) => log::debug!("released {} ({n} lock(s))", a.shown_names()),
                    Err(e) => log::warn!(
                        "release of {} failed: {e}; the session ends with its lease",
                        a.shown_names()
                    ),
                }
                drop(guards);
            }
        }
    }
}

/// `run` in a session: every name (NAME and each --also) taken in one step
/// (LOCK.ACQUIREALL), one keepalive for all, released together by the session's close.
async fn cmd_run_session(a: &Args, locker: &Locker) -> i32 {
    let Locker::Single(client) = locker else {
        log::error!("--also and --bind need one server (--url)");
        return EXIT_USAGE;
    };
    let o = acquire_options(a, false);
    let mut so = SessionOptions::new(a.ttl).max_hold(a.max_hold);
    so.owner = o.owner.clone();
    so.bind = a.bind;
    so.margin = a.margin;
    let session = match client.session(&so).await {
        Ok(s) => s,
        Err(e) => return acquire_failed(a, &e),
    };
    let mut lo = SessionLockOptions::new().mode(a.mode);
    lo.wait = a.wait;
    let guards = match session.acquire_all(&a.names(), &lo).await {
        Ok(Some(g)) => g,
        Ok(None) => {
            let _ = session.close().await;
            let what = match a.also.len() {
                0 => locker.busy_message(&a.name, a.mode),
                _ => format!(
                    "{}: at least one is held elsewhere (none was taken)",
                    a.shown_names()
                ),
            };
            log::info!("{what}; not running the command");
            return a.busy_code;
        }
        Err(e) => {
            let _ = session.close().await;
            return acquire_failed(a, &e);
        }
    };
    let fences: Vec<String> = guards
        .iter()
        .map(|g| g.fence().map_or(String::new(), |f| f.to_string()))
        .collect();
    log::debug!("acquired {} (fences {})", a.shown_names(), fences.join(" "));
    let env = [("REDIS_LOCK_FENCES", fences.join(" "))];
    supervise(Held::Session(session, guards), a, &env).await
}

async fn cmd_run(a: &Args, locker: &Locker) -> i32 {
    if a.in_session() {
        return cmd_run_session(a, locker).await;
    }
    let guard = match locker.acquire(&a.name, &acquire_options(a, true)).await {
        Ok(Some(g)) => g,
        Ok(None) => {
            log::info!(
                "{}; not running the command",
                locker.busy_message(&a.name, a.mode)
            );
            return a.busy_code;
        }
        Err(e) => return acquire_failed(a, &e),
    };
    log::debug!(
        "acquired {} (fence {})",
        a.name,
        guard.fence().map_or("none".to_string(), |f| f.to_string())
    );
    supervise(Held::Lock(guard), a, &[]).await
}

/// How CMD's run ends when it exits by itself: `run` releases (or keeps the lock for
/// --hold), `elect` resigns, a session is closed.
async fn finish(held: Held, a: &Args, code: i32) {
    match held {
        Held::Lock(guard) if a.sub != Sub::Elect => finish_run(guard, a, code).await,
        other => other.release(a).await,
    }
}

/// Runs CMD while `guard` holds the lock (the lease renewed by the guard): CMD's exit
/// code when it ends by itself, --lost-exit-code when the lease is lost first (CMD's
/// group gets SIGTERM, then SIGKILL after --grace). `env` is added to CMD's
/// environment.
async fn supervise(held: Held, a: &Args, env: &[(&str, String)]) -> i32 {
    // Before CMD starts: from then on a signal to redis-lock is CMD's.
    let (Ok(mut term), Ok(mut int), Ok(mut hup)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
        signal(SignalKind::hangup()),
    ) else {
        log::error!("cannot install signal handlers");
        held.release(a).await;
        return EXIT_UNAVAILABLE;
    };
    let guard = held.first();
    let mut cmd = tokio::process::Command::new(&a.rest[0]);
    cmd.args(&a.rest[1..])
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .env("REDIS_LOCK_NAME", &a.name)
        .env("REDIS_LOCK_TOKEN", guard.token())
        .env(
            "REDIS_LOCK_FENCE",
            guard.fence().map(|f| f.to_string()).unwrap_or_default(),
        );
    // A group of its own, so that signals reach the whole job (a shell script and its
    // children), killed by the kernel if redis-lock dies.
    child::own_group_dying_with_us(&mut cmd);
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            log::error!("cannot run {:?}: {e}", a.rest[0]);
            held.release(a).await;
            return if e.kind() == std::io::ErrorKind::NotFound {
                EXIT_NOT_FOUND
            } else {
                EXIT_CANNOT_EXEC
            };
        }
    };
    let pgid = child.id().and_then(|p| i32::try_from(p).ok()).unwrap_or(0);
    // The rest of the group (what CMD starts) goes too if redis-lock dies.
    let watcher = match child::Watcher::start(pgid) {
        Ok(w) => Some(w),
        Err(e) => {
            log::warn!(
                "cannot start the watcher of the command's process group ({e}): if \
                 redis-lock is killed, what the command started may outlive it"
            );
            None
        }
    };
    let mut lost = held.lost();
    // When a signal passed on to CMD's group is followed by SIGKILL.
    let mut kill_at: Option<tokio::time::Instant> = None;
    let code = loop {
        tokio::select! {
            status = child.wait() => {
                let code = match status {
                    Ok(s) => exit_code(s),
                    Err(e) => {
                        log::error!("waiting for the command failed: {e}");
                        EXIT_UNAVAILABLE
                    }
                };
                finish(held, a, code).await;
                break code;
            }
            reason = &mut lost => {
                // SIGKILL after --grace, but never after the lease can end: the next
                // holder may start then. (A lock taken away already has no such time.)
                let mut kill = tokio::time::Instant::now() + a.grace;
                if let (Some(r), Some(end)) = (&reason, held.valid_until()) {
                    if *r != LossReason::NotHeld {
                        kill = kill.min(end.into());
                    }
                }
                let reason = reason.map_or_else(|| "released".to_string(), |r| r.to_string());
                let left = kill.saturating_duration_since(tokio::time::Instant::now());
                log::warn!(
                    "lease on {} lost ({reason}); sending SIGTERM to the command (SIGKILL \
                     in {} ms)",
                    a.shown_names(),
                    left.as_millis()
                );
                signal_group(pgid, libc::SIGTERM);
                if tokio::time::timeout_at(kill, child.wait()).await.is_err() {
                    log::warn!("the command did not exit after SIGTERM; sending SIGKILL");
                    signal_group(pgid, libc::SIGKILL);
                    let _ = child.wait().await;
                }
                held.release(a).await;
                break a.lost_code;
            }
            _ = term.recv() => pass_on(pgid, libc::SIGTERM, &mut kill_at, a.grace),
            _ = int.recv() => pass_on(pgid, libc::SIGINT, &mut kill_at, a.grace),
            _ = hup.recv() => pass_on(pgid, libc::SIGHUP, &mut kill_at, a.grace),
            _ = async { tokio::time::sleep_until(kill_at.unwrap_or_else(tokio::time::Instant::now)).await },
                if kill_at.is_some() =>
            {
                log::warn!(
                    "the command did not exit within {} ms of the signal; sending SIGKILL",
                    a.grace.as_millis()
                );
                signal_group(pgid, libc::SIGKILL);
                kill_at = None;
            }
        }
    };
    if let Some(w) = watcher {
        w.done();
    }
    code
}

/// A signal to redis-lock, passed on to CMD's group; SIGKILL follows after `grace`.
fn pass_on(pgid: i32, sig: i32, kill_at: &mut Option<tokio::time::Instant>, grace: Duration) {
    signal_group(pgid, sig);
    kill_at.get_or_insert_with(|| tokio::time::Instant::now() + grace);
}

/// The signal an `elect` got while campaigning, as its exit code (128 + N).
async fn any_signal() -> i32 {
    let (Ok(mut term), Ok(mut int), Ok(mut hup)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
        signal(SignalKind::hangup()),
    ) else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => 128 + libc::SIGTERM,
        _ = int.recv() => 128 + libc::SIGINT,
        _ = hup.recv() => 128 + libc::SIGHUP,
    }
}

async fn cmd_elect(a: &Args, locks: &LockClient) -> i32 {
    let value = a
        .owner
        .clone()
        .unwrap_or_else(|| format!("{}:{}", hostname(), std::process::id()));
    let token = uuid_token();
    let mut opts = CampaignOptions::default().ttl(a.ttl).token(token.clone());
    opts.wait = a.wait;
    // Signal handlers first: a signal while waiting cancels the campaign cleanly (the
    // candidate leaves the queue, a grant that raced it is released).
    let signals = any_signal();
    tokio::pin!(signals);
    let outcome = tokio::select! {
        r = locks.campaign(&a.name, &value, &opts) => r,
        code = &mut signals => {
            let _ = locks.release(&a.name, &token).await;
            log::info!("{}: campaign cancelled by a signal", a.name);
            return code;
        }
    };
    let leadership = match outcome {
        Ok(Some(l)) => l,
        Ok(None) => {
            log::info!(
                "{}: not elected within --wait; not running the command",
                a.name
            );
            return a.busy_code;
        }
        Err(e) => {
            log::error!("{e}");
            return EXIT_UNAVAILABLE;
        }
    };
    let term = leadership.term().to_string();
    log::debug!("{}: elected as {value:?} (term {term})", a.name);
    let env = [("REDIS_LOCK_VALUE", value), ("REDIS_LOCK_TERM", term)];
    supervise(Held::Lock(leadership.into_guard()), a, &env).await
}

/// A random token for a campaign the CLI may have to give up (the library makes the
/// same kind).
fn uuid_token() -> String {
    uuid::Uuid::new_v4().to_string()
}

/// One observed state as the line `observe` prints.
fn observe_line(name: &str, leader: Option<&Leader>, json: bool) -> String {
    match (leader, json) {
        (Some(l), false) => format!("leader {} {}", l.term, l.value),
        (None, false) => "none".into(),
        (Some(l), true) => serde_json::json!({
            "name": name,
            "leader": true,
            "value": l.value,
            "term": l.term.to_string(),
        })
        .to_string(),
        (None, true) => serde_json::json!({ "name": name, "leader": false }).to_string(),
    }
}

async fn cmd_observe(a: &Args, locks: &LockClient) -> i32 {
    let mut observer = locks.observe(&a.name, ObserveOptions { block: a.block });
    let deadline = a.observe_for.map(|d| tokio::time::Instant::now() + d);
    let until = async {
        match deadline {
            Some(d) => tokio::time::sleep_until(d).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(until);
    let signals = any_signal();
    tokio::pin!(signals);
    let mut printed = 0u64;
    loop {
        let item = tokio::select! {
            item = observer.next() => item,
            _ = &mut until => {
                return if a.count.is_some() { EXIT_NOT_HELD } else { 0 };
            }
            _ = &mut signals => return 0,
        };
        match item {
            Some(Ok(leader)) => {
                let line = observe_line(&a.name, leader.as_ref(), a.json);
                use std::io::Write;
                let mut out = std::io::stdout().lock();
                if writeln!(out, "{line}").and_then(|_| out.flush()).is_err() {
                    return 0; // the reader has gone (observe | head -1)
                }
                printed += 1;
                if a.count.is_some_and(|n| printed >= n) {
                    return 0;
                }
            }
            Some(Err(e)) => {
                log::error!("{e}");
                return EXIT_UNAVAILABLE;
            }
            None => return EXIT_UNAVAILABLE,
        }
    }
}

async fn main_async(a: Args) -> i32 {
    let locker = match Locker::new(&a).await {
        Ok(l) => l,
        Err((code, e)) => {
            log::error!("{e}");
            return code;
        }
    };
    match a.sub {
        Sub::Run => cmd_run(&a, &locker).await,
        Sub::Acquire => cmd_acquire(&a, &locker).await,
        Sub::Release | Sub::Extend => cmd_release_extend(&a, &locker).await,
        Sub::Info => cmd_info(&a, &locker).await,
        Sub::Metrics => metrics::run(&a, &locker).await,
        Sub::Elect | Sub::Observe => {
            let Locker::Single(c) = &locker else {
                log::error!("elect and observe need one server (--url)");
                return EXIT_USAGE;
            };
            if a.sub == Sub::Elect {
                cmd_elect(&a, c).await
            } else {
                cmd_observe(&a, c).await
            }
        }
    }
}

fn main() {
    let _ = log::set_logger(&LOGGER);
    log::set_max_level(log::LevelFilter::Info);
    let args = match parse(std::env::args_os().collect()) {
        Ok(Parsed::Args(a)) => a,
        Ok(Parsed::Completions(shell)) => {
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "redis-lock", &mut script);
            use std::io::Write;
            let _ = std::io::stdout().write_all(&script);
            std::process::exit(0);
        }
        Err((code, text)) => {
            if code == 0 {
                use std::io::Write;
                let _ = std::io::stdout().write_all(text.as_bytes());
            } else {
                eprint!("{text}");
            }
            std::process::exit(code);
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

    fn p(args: &[&str]) -> Result<Parsed, (i32, String)> {
        let mut v = vec![OsString::from("redis-lock")];
        v.extend(args.iter().map(OsString::from));
        parse(v)
    }

    fn args(a: &[&str]) -> Args {
        match p(a) {
            Ok(Parsed::Args(a)) => *a,
            Ok(other) => panic!("{other:?}"),
            Err((_, e)) => panic!("{e}"),
        }
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn options_anywhere() {
        for argv in [
            &["run", "job", "--ttl", "5s", "--", "sh", "-c", "exit 3"][..],
            &["run", "--ttl", "5s", "job", "--", "sh", "-c", "exit 3"],
            &["run", "job", "-t", "5", "sh", "-c", "exit 3"],
        ] {
            let a = args(argv);
            assert_eq!(a.sub, Sub::Run);
            assert_eq!(a.name, "job");
            assert_eq!(a.ttl, ms(5000));
            assert_eq!(a.rest, vec!["sh", "-c", "exit 3"], "{argv:?}");
        }
        let a = args(&["run", "job", "--url", "redis://h:1", "-q", "--", "true"]);
        assert_eq!(a.url, "redis://h:1");
        assert_eq!(a.verbosity, log::LevelFilter::Error);
        let a = args(&["--url", "redis://h:2", "info", "k", "--json"]);
        assert_eq!(
            (a.url.as_str(), a.json, a.sub),
            ("redis://h:2", true, Sub::Info)
        );
    }

    #[test]
    fn flock_forms() {
        let a = args(&["run", "-n", "job", "-c", "make deploy"]);
        assert_eq!(a.wait, None);
        assert_eq!(a.rest, vec!["/bin/sh", "-c", "make deploy"]);
        assert_eq!(args(&["run", "-w", "10s", "j", "x"]).wait, Some(ms(10_000)));
        assert_eq!(args(&["run", "-w", "500ms", "j", "x"]).wait, Some(ms(500)));
        assert_eq!(
            args(&["run", "--wait", "1.5", "j", "x"]).wait,
            Some(ms(1500))
        );
        assert_eq!(args(&["run", "--wait=0", "j", "x"]).wait, None);
        assert_eq!(args(&["run", "-E", "3", "j", "x"]).busy_code, 3);
        assert_eq!(args(&["run", "j", "x"]).busy_code, 75);
        assert_eq!(args(&["run", "j", "x"]).lost_code, 79);
        assert_eq!(
            args(&["run", "--lost-exit-code", "76", "j", "x"]).lost_code,
            76
        );
        assert!(p(&["run", "-n", "-w", "1s", "j", "x"]).is_err());
        assert!(p(&["run", "j", "-c", "x", "--", "y"]).is_err());
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_duration("0.25s"), Ok(ms(250)));
        assert!(parse_duration("10 parsecs").is_err());
        assert!(parse_duration("-1").is_err());
        assert!(parse_duration("").is_err());
        assert!(parse_duration("1e999").is_err());
    }

    #[test]
    fn rejects_bad_usage() {
        assert_eq!(p(&[]).err().map(|e| e.0), Some(EXIT_USAGE));
        assert!(p(&["run", "job"]).is_err());
        assert!(p(&["run", "--ttl", "abc", "job", "--", "x"]).is_err());
        assert!(p(&["run", "--ttl", "0", "job", "--", "x"]).is_err());
        assert!(p(&["run", "--url", "u", "--nodes", "a", "job", "--", "x"]).is_err());
        assert!(p(&["frob", "job"]).is_err());
        assert!(p(&["info", "job", "extra"]).is_err());
        assert!(p(&["acquire", "--bogus", "job"]).is_err());
        assert_eq!(p(&["--help"]).err().map(|e| e.0), Some(0));
        let (code, help) = p(&["run", "--help"]).err().unwrap_or_default();
        assert_eq!(code, 0);
        assert!(
            help.contains("--max-hold") && help.contains("REDIS_LOCK_FENCE"),
            "{help}"
        );
    }

    #[test]
    fn shared_and_limit() {
        assert_eq!(args(&["run", "j", "x"]).mode, LockMode::Exclusive);
        assert_eq!(args(&["run", "--shared", "j", "x"]).mode, LockMode::Shared);
        assert_eq!(
            args(&["run", "-s", "-w", "1s", "j", "x"]).mode,
            LockMode::Shared
        );
        assert_eq!(args(&["acquire", "j", "-s"]).mode, LockMode::Shared);
        assert_eq!(
            args(&["run", "j", "--limit", "3", "--", "x"]).mode,
            LockMode::Counted(3)
        );
        assert_eq!(
            args(&["acquire", "--limit=2", "j"]).mode,
            LockMode::Counted(2)
        );
        assert!(p(&["run", "--shared", "--limit", "2", "j", "x"]).is_err());
        assert!(p(&["run", "--limit", "0", "j", "x"]).is_err());
        assert!(p(&["run", "--limit", "1000001", "j", "x"]).is_err());
        assert!(p(&["run", "--limit", "-1", "j", "x"]).is_err());
        assert!(p(&["release", "--shared", "j", "t"]).is_err());
        // Redlock: shared is fine, a counted lock is a usage error.
        assert_eq!(
            args(&[
                "run",
                "-s",
                "--nodes",
                "redis://a,redis://b,redis://c",
                "j",
                "x"
            ])
            .mode,
            LockMode::Shared
        );
        let e = p(&[
            "run",
            "--limit",
            "2",
            "--nodes",
            "redis://a,redis://b",
            "j",
            "x",
        ]);
        assert!(
            matches!(e, Err((EXIT_USAGE, ref t)) if t.contains("--limit")),
            "{e:?}"
        );
    }

    #[test]
    fn info_json_has_the_holders_with_string_fences() {
        let info = redis_lock_client::LockInfo {
            fields: vec![
                ("mode".into(), Some("shared".into())),
                ("holders".into(), Some("1".into())),
                ("holder-list".into(), Some("[...]".into())),
            ],
            holder_list: vec![redis_lock_client::HolderInfo {
                fence: 1_839_191_190_761_476,
                fields: vec![
                    ("fence".into(), Some("1839191190761476".into())),
                    ("owner".into(), None),
                    ("ttl".into(), Some("59000".into())),
                ],
                ..Default::default()
            }],
            ..Default::default()
        };
        let v = info_json(Some(&info));
        assert_eq!(
            v.to_string(),
            r#"{"held":true,"holder-list":[{"fence":"1839191190761476","owner":null,"ttl":59000}],"holders":1,"mode":"shared"}"#
        );
        assert_eq!(info_json(None).to_string(), r#"{"held":false}"#);
    }

    #[test]
    fn urls_are_checked_without_echoing_passwords() {
        let e = p(&["--url", "127.0.0.1:6379", "info", "k"]);
        assert!(
            matches!(e, Err((EXIT_USAGE, ref t)) if t.contains("write redis://127.0.0.1:6379")),
            "{e:?}"
        );
        let e = p(&["--url", ":hunter2@10.0.0.1:6379", "info", "k"]);
        assert!(
            matches!(e, Err((EXIT_USAGE, ref t)) if !t.contains("hunter2")),
            "{e:?}"
        );
        let e = p(&["--nodes", "redis://a:1,b:2", "info", "k"]);
        assert!(matches!(e, Err((EXIT_USAGE, _))), "{e:?}");
        assert!(p(&["--url", "rediss://h:1/#insecure", "info", "k"]).is_ok());
        assert!(p(&["--url", "unix:///run/redis.sock", "info", "k"]).is_ok());
    }

    #[test]
    fn hold_and_confirmation() {
        let a = args(&["run", "--hold", "1h", "j", "x"]);
        assert_eq!(a.hold, Some(Duration::from_secs(3600)));
        assert_eq!(args(&["run", "j", "x"]).hold, None);
        assert!(p(&["run", "--hold", "0", "j", "x"]).is_err());
        assert!(p(&["acquire", "--hold", "1h", "j"]).is_err(), "run only");
        assert_eq!(args(&["run", "j", "x"]).confirm, Confirm::Auto);
        assert_eq!(
            args(&["run", "--no-confirm", "j", "x"]).confirm,
            Confirm::Off
        );
        assert_eq!(
            args(&["--replicas", "2", "run", "j", "x"]).confirm,
            Confirm::Replicas(2)
        );
        assert!(p(&["run", "--replicas", "1", "--no-confirm", "j", "x"]).is_err());
        let a = args(&["run", "--confirm-timeout", "250ms", "j", "x"]);
        assert_eq!(a.confirm_timeout, ms(250));
        assert!(p(&["run", "--confirm-timeout", "0", "j", "x"]).is_err());
    }

    #[test]
    fn tls_sentinel_margin_and_hold_on_failure() {
        let a = args(&["--tls", "--url", "redis://h:1", "info", "k"]);
        assert_eq!(a.url, "rediss://h:1");
        let a = args(&["info", "--tls", "--nodes", "redis://a:1,rediss://b:2", "k"]);
        assert_eq!(a.nodes.unwrap(), vec!["rediss://a:1", "rediss://b:2"]);
        let a = args(&["info", "--cert", "c.pem", "--key", "k.pem", "k"]);
        assert_eq!(a.cert, Some(("c.pem".into(), "k.pem".into())));
        assert!(
            p(&["info", "--cert", "c.pem", "k"]).is_err(),
            "--cert needs --key"
        );
        assert!(
            p(&["info", "--key", "k.pem", "k"]).is_err(),
            "--key needs --cert"
        );
        let a = args(&[
            "run",
            "--sentinel",
            "s1:26379,s2:26380",
            "--master",
            "m",
            "j",
            "x",
        ]);
        assert_eq!(a.url, "redis+sentinel://s1:26379,s2:26380/m");
        assert!(
            p(&["run", "--sentinel", "s1:26379", "j", "x"]).is_err(),
            "needs --master"
        );
        assert!(p(&[
            "run",
            "--sentinel",
            "s:1",
            "--master",
            "m",
            "--url",
            "redis://h:1",
            "j",
            "x"
        ])
        .is_err());
        let a = args(&["--tls", "--sentinel", "s:1", "--master", "m", "info", "k"]);
        assert_eq!(a.url, "rediss+sentinel://s:1/m");
        assert_eq!(
            with_credentials("redis+sentinel://s:1,t:2/m", Some("app"), Some("p@ss w")).unwrap(),
            "redis+sentinel://app:p%40ss%20w@s:1,t:2/m"
        );
        assert!(p(&["--url", "redis+sentinel://s:1/m", "info", "k"]).is_ok());

        assert_eq!(args(&["run", "j", "x"]).margin, None);
        assert_eq!(
            args(&["run", "--margin", "2s", "j", "x"]).margin,
            Some(ms(2000))
        );
        assert!(p(&["run", "--ttl", "3s", "--margin", "2s", "j", "x"]).is_err());
        assert!(!args(&["run", "--hold", "1h", "j", "x"]).hold_on_failure);
        assert!(args(&["run", "--hold", "1h", "--hold-on-failure", "j", "x"]).hold_on_failure);
        assert!(
            p(&["run", "--hold-on-failure", "j", "x"]).is_err(),
            "needs --hold"
        );
        assert_eq!(humantime(Duration::from_secs(144 * 3600)), "144h");
        assert_eq!(humantime(ms(90_000)), "90s");
        assert_eq!(humantime(ms(1500)), "1500ms");
        assert_eq!(humantime(ms(120_000)), "2m");
    }

    #[test]
    fn run_help_fits_80_columns() {
        for line in RUN_HELP.lines() {
            assert!(line.chars().count() <= 78, "{line:?}");
        }
        assert!(RUN_HELP.contains("--hold 1h"));
    }

    #[test]
    fn elect_and_observe() {
        let a = args(&["elect", "leader", "--value", "node-a", "--", "sleep", "1"]);
        assert_eq!(a.sub, Sub::Elect);
        assert_eq!(a.owner.as_deref(), Some("node-a"));
        assert_eq!((a.wait, a.ttl), (None, Duration::from_secs(30)));
        assert_eq!(a.rest, vec!["sleep", "1"]);
        let a = args(&["elect", "-t", "5s", "-w", "1m", "j", "-c", "exit 3"]);
        assert_eq!(a.ttl, ms(5000));
        assert_eq!(a.wait, Some(Duration::from_secs(60)));
        assert_eq!(a.rest, vec!["/bin/sh", "-c", "exit 3"]);
        assert_eq!(a.owner, None);
        assert!(p(&["elect", "j"]).is_err(), "needs a command");
        assert!(p(&["elect", "--value", "", "j", "x"]).is_err());
        assert!(p(&["elect", "--nodes", "redis://a,redis://b", "j", "x"]).is_err());
        assert!(p(&["elect", "--shared", "j", "x"]).is_err());
        let a = args(&["observe", "j", "--json", "--count", "3", "--for", "20s"]);
        assert_eq!(a.sub, Sub::Observe);
        assert!(a.json);
        assert_eq!(a.count, Some(3));
        assert_eq!(a.observe_for, Some(Duration::from_secs(20)));
        assert_eq!(a.block, Duration::from_secs(10));
        let a = args(&["observe", "j", "--duration", "1s", "--timeout", "3s"]);
        assert_eq!((a.observe_for, a.timeout), (Some(ms(1000)), ms(3000)));
        assert!(p(&["observe", "j", "--count", "0"]).is_err());
        let l = Leader {
            value: "node a".into(),
            term: 1_839_275_968_752_640,
        };
        assert_eq!(
            observe_line("j", Some(&l), false),
            "leader 1839275968752640 node a"
        );
        assert_eq!(observe_line("j", None, false), "none");
        assert_eq!(
            observe_line("j", Some(&l), true),
            r#"{"leader":true,"name":"j","term":"1839275968752640","value":"node a"}"#
        );
        assert_eq!(
            observe_line("j", None, true),
            r#"{"leader":false,"name":"j"}"#
        );
        for help in [ELECT_HELP, OBSERVE_HELP] {
            for line in help.lines() {
                assert!(line.chars().count() <= 78, "{line:?}");
            }
        }
        assert_eq!(uuid_token().len(), 36);
        assert_ne!(uuid_token(), uuid_token());
    }

    #[test]
    fn several_names_and_bind() {
        let a = args(&[
            "run", "a", "--also", "b", "--also", "c", "-w", "1m", "--", "x",
        ]);
        assert!(a.in_session());
        assert_eq!(a.names(), ["a", "b", "c"]);
        assert_eq!(a.shown_names(), "a, b and c");
        assert_eq!(a.rest, vec!["x"]);
        assert_eq!(a.bind, None);
        let a = args(&["run", "--bind", "0", "a", "x"]);
        assert!(a.in_session());
        assert_eq!(a.bind, Some(Duration::ZERO));
        assert!(!args(&["run", "a", "x"]).in_session());
        for bad in [
            &["run", "a", "--also", "a", "x"][..],
            &[
                "run",
                "--nodes",
                "redis://h:1,redis://h:2",
                "a",
                "--also",
                "b",
                "x",
            ],
            &["run", "--hold", "1h", "a", "--also", "b", "x"],
            &["acquire", "a", "--also", "b"],
        ] {
            assert!(matches!(p(bad), Err((EXIT_USAGE, _))), "{bad:?}");
        }
    }

    #[test]
    fn nodes_and_token() {
        let a = args(&["run", "--nodes", "redis://a,redis://b,,", "job", "true"]);
        assert_eq!(a.nodes.unwrap(), vec!["redis://a", "redis://b"]);
        let a = args(&["release", "job", "tok-1"]);
        assert_eq!(a.token.as_deref(), Some("tok-1"));
    }

    #[test]
    fn credentials_go_into_the_url() {
        assert_eq!(
            with_credentials("redis://h:1/2", Some("app"), Some("p@ss w")).unwrap(),
            "redis://app:p%40ss%20w@h:1/2"
        );
        assert_eq!(
            with_credentials("rediss://:inurl@h:1", None, Some("env")).unwrap(),
            "rediss://:inurl@h:1",
            "a password in the URL wins"
        );
        assert_eq!(
            with_credentials("redis://h:1", None, None).unwrap(),
            "redis://h:1"
        );
    }

    #[test]
    fn quotes_for_the_shell() {
        assert_eq!(shell_quote("a'b"), "'a'\\''b'");
        assert_eq!(shell_quote("plain"), "'plain'");
    }
}
