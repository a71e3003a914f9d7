//! One lock server (or one Redis Cluster): the module's commands with a time limit on
//! every call, a connection that is remade after a connection error, confirmation of
//! grants on the server's replicas (`WAIT`), and the classic `SET NX PX` + Lua recipe
//! where the module is not loaded.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::time::{Duration, Instant};

use redis::cluster_routing::Slot;
use redis::{Cmd, FromRedisValue, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::Mutex;
use tokio::time::timeout;

use crate::error::{Error, Result, MODULE_HELP};
use crate::info::LockInfo;
use crate::options::{millis, ClientOptions, Confirm, LockMode};
use crate::target::{Conn, Reached, Target};

/// Owner-checked delete: the classic release of a `SET NX PX` lock.
const RELEASE_LUA: &str = "if redis.call('GET', KEYS[1]) == ARGV[1] then \
     return redis.call('DEL', KEYS[1]) else return 0 end";
/// Owner-checked `PEXPIRE`: the classic extend.
const EXTEND_LUA: &str = "if redis.call('GET', KEYS[1]) == ARGV[1] then \
     return redis.call('PEXPIRE', KEYS[1], ARGV[2]) else return 0 end";

const MODULE_UNKNOWN: u8 = 0;
const MODULE_LOADED: u8 = 1;
const MODULE_MISSING: u8 = 2;

/// How long what `INFO replication` said about a server's replicas is reused.
const REPLICAS_CACHED: Duration = Duration::from_secs(1);

/// One `LOCK.ACQUIRE` as a node sends it (the wait and `MINFENCE` aside).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Acquire<'a> {
    pub key: &'a str,
    pub token: &'a str,
    pub ttl_ms: u64,
    pub owner: Option<&'a str>,
    pub mode: LockMode,
    /// `SESSION id` instead of `PX ttl_ms`: the grant has the session's lease.
    pub session: Option<&'a str>,
}

/// A lock granted by one node. `fence` is `None` where the module is not loaded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Grant {
    pub fence: Option<u64>,
}

/// How long the confirmation of a grant may take: `wait` is what the server's `WAIT`
/// is given, `limit` bounds the whole step on the client (the replica count included).
#[derive(Debug, Clone, Copy)]
pub(crate) struct ConfirmBudget {
    pub wait: Duration,
    pub limit: Duration,
}

/// The shared (multiplexed) connection and a generation number, so that a failed call
/// only drops the connection it used, not a newer one.
struct Shared {
    generation: u64,
    conn: Option<Conn>,
}

/// A connection for commands that must share it (a grant and its `WAIT`).
struct Session {
    /// `Some(generation)` for the shared connection, `None` for one of its own.
    generation: Option<u64>,
    conn: Conn,
    /// Opened by this call (a failure on it is not a stale connection's).
    fresh: bool,
}

/// A connection of its own to the server (or cluster) of a node, for a command that
/// blocks it (see [`Node::dedicated`]).
pub(crate) struct Dedicated {
    conn: Conn,
    label: String,
}

impl Dedicated {
    /// One command; errors name the server as `host:port`, as every other call's do.
    pub async fn query<T: FromRedisValue>(&mut self, cmd: &Cmd) -> Result<T> {
        self.conn
            .query(cmd)
            .await
            .map_err(|e| Error::redis(&self.label, e))
    }
}

/// What `ROLE` (or `INFO replication`) and `CONFIG GET min-replicas-to-write` said.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Replicas {
    /// Replicas online: their sync is done (`ROLE` lists only those; `INFO
    /// replication` says `state=online`).
    online: u32,
    /// `min-replicas-to-write` (0: not set, or not readable).
    min_to_write: u32,
}

pub(crate) struct Node {
    /// `host:port` (or the socket path): for log lines and error messages. Never the
    /// URL, which may hold a user and a password.
    pub label: String,
    /// The URL without its credentials (for `info` over Redlock nodes).
    pub shown_url: String,
    /// `(host, port)` of a `rediss://` URL, for the diagnosis of a failed handshake.
    tls: Option<(String, u16)>,
    target: Target,
    shared: Mutex<Shared>,
    module: AtomicU8,
    fallback_noted: AtomicBool,
    /// Per slot on a cluster (`None` on a standalone server).
    replicas: std::sync::Mutex<HashMap<Option<Slot>, (Instant, Replicas)>>,
    /// When `CONFIG GET` was last refused to this user (not asked again for a while:
    /// each refusal is an `ACL LOG` entry).
    config_refused: std::sync::Mutex<Option<Instant>>,
    pub opts: ClientOptions,
}

/// How long a refused `CONFIG GET` is not asked again.
const CONFIG_REFUSED_FOR: Duration = Duration::from_secs(60);

/// A random duration in `[base - spread, base + spread]` (for retry jitter).
pub(crate) fn jitter(base: Duration, spread: Duration) -> Duration {
    let r = uuid::Uuid::new_v4().as_u128() as u64;
    let spread_ms = u64::try_from(spread.as_millis()).unwrap_or(0);
    let offset = if spread_ms == 0 {
        0
    } else {
        r % (2 * spread_ms + 1)
    };
    (base + Duration::from_millis(offset)).saturating_sub(spread)
}

/// A fresh random token (UUID v4 text, 36 bytes).
pub(crate) fn new_token() -> String {
    uuid::Uuid::new_v4().to_string()
}

fn remaining(deadline: Instant) -> Duration {
    deadline.saturating_duration_since(Instant::now())
}

/// `head key credential` followed by the arguments of `cmd` (`LOCK.IFHELD key token
/// SET k v`). A command without arguments, or with a cursor argument, is
/// [`Error::Invalid`] (checked before any I/O).
pub(crate) fn guarded_cmd(head: &str, key: &str, credential: &[u8], cmd: &Cmd) -> Result<Cmd> {
    if cmd.args_iter().len() == 0 {
        return Err(Error::Invalid(format!(
            "{head} needs a command to run (e.g. redis::cmd(\"SET\").arg(\"k\").arg(\"v\"))"
        )));
    }
    let mut c = redis::cmd(head);
    c.arg(key).arg(credential);
    for a in cmd.args_iter() {
        match a {
            redis::Arg::Simple(b) => {
                c.arg(b);
            }
            _ => {
                return Err(Error::Invalid(format!(
                    "{head} cannot wrap a command with a cursor argument"
                )))
            }
        }
    }
    Ok(c)
}

/// `ROLE` of a primary: `["master", offset, [[ip, port, offset], ...]]`, whose list has
/// the replicas online only (a replica in its full sync is not in it). `None` for
/// another shape (a replica, a sentinel).
fn role_replicas(v: &Value) -> Option<u32> {
    let Value::Array(items) = v else { return None };
    let role = match items.first()? {
        Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        Value::SimpleString(s) => s.clone(),
        _ => return None,
    };
    match (role.as_str(), items.get(2)?) {
        ("master", Value::Array(replicas)) => u32::try_from(replicas.len()).ok(),
        _ => None,
    }
}

/// `INFO replication`: how many replicas are online.
fn online_replicas(info: &str) -> u32 {
    let online = info
        .lines()
        .filter(|l| l.starts_with("slave") && l.contains(':') && l.contains("state=online"))
        .count();
    u32::try_from(online).unwrap_or(u32::MAX)
}

/// The value of a `CONFIG GET name` reply (RESP2 pair or RESP3 map).
fn config_value(v: &Value) -> Option<u32> {
    let text = |v: &Value| match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        Value::Int(i) => Some(i.to_string()),
        _ => None,
    };
    match v {
        Value::Array(items) if items.len() == 2 => text(&items[1])?.parse().ok(),
        Value::Map(m) if m.len() == 1 => text(&m[0].1)?.parse().ok(),
        _ => None,
    }
}

/// One command to send through [`Node::run`]: its name in errors, the command, the time
/// it may take (connecting included), and whether it may be sent twice.
#[derive(Clone, Copy)]
pub struct Call<'a> {
    pub what: &'static str,
    pub cmd: &'a Cmd,
    pub limit: Duration,
    pub retry: bool,
}

impl<'a> Call<'a> {
    /// For a command that may be sent twice (`retry`).
    pub fn idempotent(what: &'static str, cmd: &'a Cmd, limit: Duration) -> Self {
        Call {
            what,
            cmd,
            limit,
            retry: true,
        }
    }

    /// For a command that may not run twice.
    pub fn once(what: &'static str, cmd: &'a Cmd, limit: Duration) -> Self {
        Call {
            what,
            cmd,
            limit,
            retry: false,
        }
    }
}

impl Node {
    /// A node for `url`; `cluster` routes commands by key across a Redis Cluster.
    /// Nothing is connected yet.
    pub fn new(url: &str, opts: ClientOptions, cluster: bool) -> Result<Node> {
        let reached = Reached::from_url(url, &opts, cluster)?;
        Ok(Self::with(reached, crate::target::redact_url(url), opts))
    }

    /// A node for an application's own client (one server).
    pub fn from_client(client: redis::Client, opts: ClientOptions) -> Node {
        let reached = Reached::from_client(client);
        let shown = reached.label.clone();
        Self::with(reached, shown, opts)
    }

    fn with(reached: Reached, shown_url: String, opts: ClientOptions) -> Node {
        Node {
            label: reached.label,
            shown_url,
            tls: reached.tls_addr,
            target: reached.target,
            shared: Mutex::new(Shared {
                generation: 0,
                conn: None,
            }),
            module: AtomicU8::new(MODULE_UNKNOWN),
            fallback_noted: AtomicBool::new(false),
            replicas: std::sync::Mutex::new(HashMap::new()),
            config_refused: std::sync::Mutex::new(None),
            opts,
        }
    }

    /// Asks the server whether it runs in cluster mode (`INFO cluster`), within the
    /// connect timeout plus the I/O timeout.
    pub async fn detect_cluster(url: &str, opts: &ClientOptions) -> Result<bool> {
        let probe = Node::new(
            url,
            ClientOptions {
                confirm: Confirm::Off,
                ..opts.clone()
            },
            false,
        )?;
        if probe.target.is_sentinel() {
            return Ok(false); // Sentinel watches standalone servers
        }
        let mut cmd = redis::cmd("INFO");
        cmd.arg("cluster");
        let limit = opts.connect_timeout + opts.io_timeout;
        match probe
            .run::<String>(Call::once("INFO cluster", &cmd, limit))
            .await
        {
            Ok(info) => Ok(info.lines().any(|l| l.trim() == "cluster_enabled:1")),
            // A user that may only lock: nothing else needs INFO.
            Err(e) if e.server_code() == Some("NOPERM") => {
                log::debug!(
                    "{}: INFO cluster is not allowed to this user ({e}); taken for a \
                     standalone server (ClientOptions::cluster says otherwise)",
                    probe.label
                );
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }

    pub fn module_missing(&self) -> bool {
        self.module.load(Ordering::Relaxed) == MODULE_MISSING
    }

    /// [`Error::ModuleMissing`] on this node: `needs` is what the module was needed for.
    pub(crate) fn missing(&self, needs: impl Into<String>) -> Error {
        Error::ModuleMissing {
            node: self.label.clone(),
            needs: needs.into(),
        }
    }

    fn note_module(&self, loaded: bool) {
        let state = if loaded {
            MODULE_LOADED
        } else {
            MODULE_MISSING
        };
        self.module.store(state, Ordering::Relaxed);
    }

    /// Says once that this node uses the classic recipe (at its first use, so that a
    /// shared or counted acquire, which is refused instead, does not announce it).
    fn note_fallback(&self) {
        if !self.fallback_noted.swap(true, Ordering::Relaxed) {
            log::warn!(
                "the redis-lock module is not loaded on {}; {MODULE_HELP}. Falling back to \
                 SET NX PX + Lua on this server, which gives no fencing token",
                self.label
            );
        }
    }

    fn timeout_error(&self, what: &'static str, after: Duration) -> Error {
        Error::Timeout {
            node: self.label.clone(),
            what,
            after,
            hint: None,
        }
    }

    /// For a `rediss://` connection that got no handshake reply: asks the port in plain
    /// text whether it is a server without TLS, and says so.
    async fn tls_hint(&self) -> Option<String> {
        let (host, port) = self.tls.as_ref()?;
        let plain = timeout(Duration::from_millis(500), async {
            let mut s = tokio::net::TcpStream::connect((host.as_str(), *port)).await?;
            s.write_all(b"PING\r\n").await?;
            let mut buf = [0u8; 64];
            let n = s.read(&mut buf).await?;
            Ok::<_, std::io::Error>(n > 0 && matches!(buf[0], b'+' | b'-'))
        })
        .await;
        Some(if matches!(plain, Ok(Ok(true))) {
            "this port answers plain RESP: it looks like a TLS handshake against a server \
             without TLS; use redis:// (or the server's tls-port)"
                .into()
        } else {
            "no reply to the TLS handshake; if this server does not use TLS, use redis:// \
             (a TLS handshake against a non-TLS server looks like this)"
                .into()
        })
    }

    /// Opens a connection of its own within `connect`; `response` limits each reply on
    /// it (`None`: no limit of its own, the caller bounds every call).
    async fn open(&self, connect: Duration, response: Option<Duration>) -> Result<Conn> {
        match timeout(connect, self.target.open(connect, response)).await {
            Ok(Ok(c)) => Ok(c),
            Ok(Err(e)) if !e.is_timeout() => Err(self.connect_error(e)),
            _ => Err(Error::Timeout {
                node: self.label.clone(),
                what: "connect",
                after: connect,
                hint: self.tls_hint().await,
            }),
        }
    }

    /// A failed connection attempt; over TLS without a client certificate, a connection
    /// the server closed is most likely its demand for one (Redis's `tls-auth-clients
    /// yes`, its default): the message says so.
    fn connect_error(&self, e: redis::RedisError) -> Error {
        let no_client_cert = self
            .opts
            .tls
            .as_ref()
            .is_none_or(|t| t.client_cert.is_none());
        // rustls says `received fatal alert: CertificateRequired` (TLS 1.3), or the
        // connection just ends.
        let refused = e.to_string().contains("CertificateRequired") || e.is_connection_dropped();
        if self.tls.is_some() && no_client_cert && refused {
            return Error::Tls {
                node: self.label.clone(),
                detail: format!(
                    "the server refused the TLS connection ({}): it requires a client \
                     certificate (tls-auth-clients yes, Redis's default); give one (--cert \
                     and --key, or ClientOptions::tls)",
                    crate::error::scrub(&e.to_string())
                ),
            };
        }
        Error::redis(&self.label, e)
    }

    /// The shared connection, made on first use or after a connection error.
    async fn session(&self, connect: Duration) -> Result<Session> {
        let mut s = self.shared.lock().await;
        if let Some(c) = &s.conn {
            return Ok(Session {
                generation: Some(s.generation),
                conn: c.clone(),
                fresh: false,
            });
        }
        let c = self.open(connect, None).await?;
        s.generation += 1;
        s.conn = Some(c.clone());
        Ok(Session {
            generation: Some(s.generation),
            conn: c,
            fresh: true,
        })
    }

    async fn drop_conn(&self, generation: u64) {
        let mut s = self.shared.lock().await;
        if s.generation == generation {
            s.conn = None;
        }
    }

    /// One command on a session; a connection error drops the shared connection (the
    /// next call makes a fresh one).
    async fn query<T: FromRedisValue>(
        &self,
        s: &mut Session,
        cmd: &Cmd,
        at: Option<&str>,
    ) -> Result<T> {
        let r = match at {
            Some(key) => s.conn.query_at(cmd, key).await,
            None => s.conn.query(cmd).await,
        };
        let r = r.map_err(|e| Error::redis(&self.label, e));
        if let (Err(e), Some(generation)) = (&r, s.generation) {
            if e.is_connection_error() || self.demoted(e) {
                self.drop_conn(generation).await;
            }
        }
        r
    }

    /// True for `READONLY` from the primary a Sentinel named: it was demoted by a
    /// failover. Nothing ran, so any command may be sent again, on a connection to the
    /// primary the Sentinel names now.
    fn demoted(&self, e: &Error) -> bool {
        self.target.is_sentinel() && e.server_code() == Some("READONLY")
    }

    /// Runs one command on the shared connection within its `limit` (connecting included).
    /// With `retry`, for commands that may be sent twice (an acquire with our token is
    /// an idempotent renew, an extend sets the same lease): a connection error on a
    /// connection made earlier (a server restarted since, an idle connection closed) is
    /// retried once on a fresh connection, within the same limit. Any command is sent
    /// again after a Sentinel failover demoted its server (`READONLY`: nothing ran).
    pub(crate) async fn run<T: FromRedisValue>(&self, call: Call<'_>) -> Result<T> {
        let Call {
            what,
            cmd,
            limit,
            retry,
        } = call;
        let connect = self.opts.connect_timeout.min(limit);
        let outcome = timeout(limit, async {
            let mut first = true;
            loop {
                let mut s = self.session(connect).await?;
                match self.query::<T>(&mut s, cmd, None).await {
                    Err(e)
                        if first
                            && !s.fresh
                            && (retry && e.is_connection_error() || self.demoted(&e)) =>
                    {
                        log::debug!(
                            "{}: {what} failed ({e}); retrying on a new connection",
                            self.label
                        );
                        first = false;
                    }
                    r => return r,
                }
            }
        })
        .await;
        match outcome {
            Ok(r) => r,
            Err(_) => Err(self.timeout_error(what, limit)),
        }
    }

    /// What a module command's reply means: `Ok(Some(reply))`; `Ok(None)` when the server
    /// does not know the command (noted: this node falls back to the classic recipe from
    /// now on); other errors as they are.
    fn module_reply<T>(&self, reply: Result<T>) -> Result<Option<T>> {
        match reply {
            Ok(v) => {
                self.note_module(true);
                Ok(Some(v))
            }
            Err(e) if e.is_unknown_command() => {
                self.note_module(false);
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// Runs a module command on the shared connection (see `module_reply`); `Ok(None)`
    /// at once where the module is known to be missing.
    async fn module_run<T: FromRedisValue>(&self, call: Call<'_>) -> Result<Option<T>> {
        if self.module_missing() {
            return Ok(None);
        }
        self.module_reply(self.run(call).await)
    }

    fn acquire_cmd(req: &Acquire<'_>, min_fence: Option<u64>, block: Option<u64>) -> Cmd {
        let mut c = redis::cmd("LOCK.ACQUIRE");
        c.arg(req.key);
        match req.mode {
            LockMode::Exclusive => {}
            LockMode::Shared => {
                c.arg("SHARED");
            }
            LockMode::Counted(n) => {
                c.arg("LIMIT").arg(n);
            }
        }
        match req.session {
            Some(id) => c.arg("SESSION").arg(id),
            None => c.arg("PX").arg(req.ttl_ms),
        };
        c.arg("TOKEN").arg(req.token);
        if let Some(o) = req.owner {
            c.arg("OWNER").arg(o);
        }
        if let Some(f) = min_fence {
            c.arg("MINFENCE").arg(f);
        }
        if let Some(b) = block {
            c.arg("BLOCK").arg(b);
        }
        c
    }

    /// A grant `[token, fence]`, or nil. Never puts the token into an error.
    fn parse_grant(v: Value, token: &str) -> Result<Option<Grant>> {
        match v {
            Value::Nil => Ok(None),
            Value::Array(items) if items.len() == 2 => {
                let t = match &items[0] {
                    Value::BulkString(b) => b.as_slice(),
                    Value::SimpleString(s) => s.as_bytes(),
                    _ => {
                        return Err(Error::Protocol(
                            "LOCK.ACQUIRE answered a token that is not a string".into(),
                        ))
                    }
                };
                if t != token.as_bytes() {
                    return Err(Error::Protocol(
                        "LOCK.ACQUIRE granted a token other than the one sent".into(),
                    ));
                }
                match items[1] {
                    Value::Int(f) if f > 0 => Ok(Some(Grant {
                        fence: Some(f as u64),
                    })),
                    _ => Err(Error::Protocol(
                        "LOCK.ACQUIRE answered a fence that is not a positive integer".into(),
                    )),
                }
            }
            _ => Err(Error::Protocol(
                "LOCK.ACQUIRE answered neither [token, fence] nor nil".into(),
            )),
        }
    }

    /// The `SET NX PX` fallback holds one token per key: it cannot be a read-write lock
    /// or a semaphore, and silently taking an exclusive lock instead would be a surprise.
    fn classic_supports(&self, req: &Acquire<'_>) -> Result<()> {
        if req.session.is_some() {
            return Err(self.missing("A lock in a session"));
        }
        match req.mode {
            LockMode::Exclusive => Ok(()),
            LockMode::Shared => Err(self.missing("A shared lock")),
            LockMode::Counted(n) => Err(self.missing(format!("A counted lock (LIMIT {n})"))),
        }
    }

    fn classic_set_cmd(req: &Acquire<'_>) -> Cmd {
        let mut cmd = redis::cmd("SET");
        cmd.arg(req.key)
            .arg(req.token)
            .arg("NX")
            .arg("PX")
            .arg(req.ttl_ms);
        cmd
    }

    /// One acquisition on `s`: the module's command, or the classic recipe where the
    /// module is missing (with `renew`, the owner-checked `PEXPIRE`).
    async fn acquire_on(
        &self,
        s: &mut Session,
        req: &Acquire<'_>,
        min_fence: Option<u64>,
    ) -> Result<Option<Grant>> {
        if !self.module_missing() {
            let cmd = Self::acquire_cmd(req, min_fence, None);
            let reply = self.query::<Value>(s, &cmd, None).await;
            if let Some(v) = self.module_reply(reply)? {
                return Self::parse_grant(v, req.token);
            }
        }
        self.classic_supports(req)?;
        self.note_fallback();
        if min_fence.is_some() {
            let (_, cmd) = Self::classic_extend_cmd(req.key, req.token, req.ttl_ms);
            let n: i64 = self.query(s, &cmd, None).await?;
            return Ok((n == 1).then_some(Grant { fence: None }));
        }
        let v: Value = self.query(s, &Self::classic_set_cmd(req), None).await?;
        Ok(match v {
            Value::Nil => None,
            _ => Some(Grant { fence: None }),
        })
    }

    /// One non-blocking acquisition within `limit`, then (for a grant) its confirmation
    /// on the replicas within `budget`. With `min_fence` it is the idempotent renew of
    /// quorum fencing (`MINFENCE`); on a node without the module that is an
    /// owner-checked `PEXPIRE`.
    pub async fn try_acquire(
        &self,
        req: &Acquire<'_>,
        min_fence: Option<u64>,
        limit: Duration,
        budget: ConfirmBudget,
    ) -> Result<Option<Grant>> {
        let connect = self.opts.connect_timeout.min(limit);
        let outcome = timeout(limit, async {
            let mut first = true;
            loop {
                let mut s = self.session(connect).await?;
                match self.acquire_on(&mut s, req, min_fence).await {
                    // Sent again with the same token it is an idempotent renew.
                    Err(e)
                        if first && !s.fresh && (e.is_connection_error() || self.demoted(&e)) =>
                    {
                        log::debug!(
                            "{}: acquire failed ({e}); retrying on a new connection",
                            self.label
                        );
                        first = false;
                    }
                    r => return r.map(|g| (s, g)),
                }
            }
        })
        .await;
        let (mut s, grant) = match outcome {
            Ok(r) => r?,
            Err(_) => return Err(self.timeout_error("LOCK.ACQUIRE", limit)),
        };
        if let Some(g) = grant {
            let undo = self.release_cmd(req.key, req.token);
            self.confirm(&mut s, req.key, budget, Some(undo)).await?;
            return Ok(Some(g));
        }
        Ok(None)
    }

    /// Waits up to `wait` for the lock: the module's FIFO `BLOCK` on a connection of its
    /// own (a blocked command holds up its whole connection), or polling with jitter
    /// where the module is missing. The time limit is `wait` plus the connect and I/O
    /// timeouts; a hand-off received is confirmed on that connection (`WAIT` after the
    /// reply counts the grant the server made for this client).
    pub async fn acquire_blocking(
        &self,
        req: &Acquire<'_>,
        wait: Duration,
        budget: ConfirmBudget,
    ) -> Result<Option<Grant>> {
        let deadline = Instant::now() + wait;
        if !self.module_missing() {
            let block_ms = millis(wait);
            let limit = wait + self.opts.io_timeout + self.opts.connect_timeout;
            let cmd = Self::acquire_cmd(req, None, Some(block_ms));
            let response = wait.max(budget.limit) + self.opts.io_timeout;
            let outcome = timeout(limit, async {
                let conn = self.open(self.opts.connect_timeout, Some(response)).await?;
                let mut s = Session {
                    generation: None,
                    conn,
                    fresh: true,
                };
                let v = self.query::<Value>(&mut s, &cmd, None).await;
                Ok((s, v))
            })
            .await
            .unwrap_or_else(|_| Err(self.timeout_error("LOCK.ACQUIRE BLOCK", limit)));
            let (mut s, reply) = match outcome {
                Ok(x) => x,
                Err(e) => return Err(e),
            };
            if let Some(v) = self.module_reply(reply)? {
                let grant = Self::parse_grant(v, req.token)?;
                if grant.is_some() {
                    let undo = self.release_cmd(req.key, req.token);
                    self.confirm(&mut s, req.key, budget, Some(undo)).await?;
                }
                return Ok(grant);
            }
        }
        self.classic_supports(req)?;
        loop {
            let limit = self.opts.io_timeout;
            if let Some(g) = self.try_acquire(req, None, limit, budget).await? {
                return Ok(Some(g));
            }
            let pause = jitter(Duration::from_millis(50), Duration::from_millis(30));
            if Instant::now() + pause >= deadline {
                return Ok(None);
            }
            tokio::time::sleep(pause).await;
        }
    }

    /// A grant command built by the caller (`LOCK.ACQUIREALL ...`): sent on the shared
    /// connection (once more on a fresh one after a connection error: the caller's token
    /// makes it an idempotent retry), or with `wait` (a `BLOCK` in `cmd`) on a connection
    /// of its own, within the same limits as [`try_acquire`](Self::try_acquire) and
    /// [`acquire_blocking`](Self::acquire_blocking). A grant (any reply but nil) is
    /// confirmed on the replicas of `key`'s server within `budget`; if it is not, `undo`
    /// (its release) is sent and the error returned. Needs the module.
    pub(crate) async fn grant(
        &self,
        what: &'static str,
        cmd: &Cmd,
        key: &str,
        undo: Cmd,
        wait: Option<Duration>,
        budget: ConfirmBudget,
    ) -> Result<Value> {
        let connect = self.opts.connect_timeout;
        let outcome = match wait {
            None => {
                let limit = self.opts.io_timeout;
                timeout(limit, async {
                    let mut first = true;
                    loop {
                        let mut s = self.session(connect.min(limit)).await?;
                        match self.query::<Value>(&mut s, cmd, None).await {
                            Err(e)
                                if first
                                    && !s.fresh
                                    && (e.is_connection_error() || self.demoted(&e)) =>
                            {
                                first = false;
                            }
                            r => return r.map(|v| (s, v)),
                        }
                    }
                })
                .await
                .unwrap_or_else(|_| Err(self.timeout_error(what, limit)))
            }
            Some(w) => {
                let limit = w + self.opts.io_timeout + connect;
                let response = w.max(budget.limit) + self.opts.io_timeout;
                timeout(limit, async {
                    let conn = self.open(connect, Some(response)).await?;
                    let mut s = Session {
                        generation: None,
                        conn,
                        fresh: true,
                    };
                    let v = self.query::<Value>(&mut s, cmd, None).await?;
                    Ok((s, v))
                })
                .await
                .unwrap_or_else(|_| Err(self.timeout_error(what, limit)))
            }
        };
        let (mut s, reply) = match outcome {
            Err(e) if e.is_unknown_command() => return Err(self.missing(what)),
            r => r?,
        };
        if !matches!(reply, Value::Nil) {
            self.confirm(&mut s, key, budget, Some(undo)).await?;
        }
        Ok(reply)
    }

    /// What `INFO replication` says of the replicas of the server that holds `key`,
    /// reused for a second unless `fresh`.
    async fn replicas(&self, s: &mut Session, key: &str, fresh: bool) -> Result<Replicas> {
        let slot = self.target.is_cluster().then(|| Slot::for_key(key));
        if !fresh {
            let cache = self.replicas.lock().unwrap_or_else(|p| p.into_inner());
            if let Some((at, r)) = cache.get(&slot) {
                if at.elapsed() < REPLICAS_CACHED {
                    return Ok(*r);
                }
            }
        }
        let ask_config = self
            .config_refused
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_none_or(|at| at.elapsed() >= CONFIG_REFUSED_FOR);
        let mut config = redis::cmd("CONFIG");
        config.arg("GET").arg("min-replicas-to-write");
        let mut other = Session {
            generation: s.generation,
            conn: s.conn.clone(),
            fresh: s.fresh,
        };
        let config = async {
            match ask_config {
                true => Some(self.query::<Value>(&mut other, &config, Some(key)).await),
                false => None,
            }
        };
        let role = redis::cmd("ROLE");
        let (role, config) = futures_util::join!(self.query::<Value>(s, &role, Some(key)), config);
        let online = match role {
            Ok(v) => role_replicas(&v).ok_or_else(|| {
                Error::Protocol(format!("{}: ROLE did not answer as a primary", self.label))
            })?,
            // A user allowed INFO but not ROLE.
            Err(e) if e.server_code() == Some("NOPERM") => {
                let mut info = redis::cmd("INFO");
                info.arg("replication");
                match self.query::<String>(s, &info, Some(key)).await {
                    Ok(text) => online_replicas(&text),
                    Err(_) => return Err(e),
                }
            }
            Err(e) => return Err(e),
        };
        let min_to_write = match config {
            Some(Ok(v)) => config_value(&v).unwrap_or(0),
            Some(Err(e)) => {
                // CONFIG may be denied to this user or renamed; the server enforces the
                // setting itself (NOREPLICAS) anyway, and every replica online is never
                // fewer than it asks for.
                log::debug!("{}: CONFIG GET min-replicas-to-write: {e}", self.label);
                if e.server_code() == Some("NOPERM") {
                    *self
                        .config_refused
                        .lock()
                        .unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
                }
                0
            }
            None => 0,
        };
        let r = Replicas {
            online,
            min_to_write,
        };
        let mut cache = self.replicas.lock().unwrap_or_else(|p| p.into_inner());
        cache.insert(slot, (Instant::now(), r));
        Ok(r)
    }

    /// Confirms a write on `key` (a grant, a hand-off, a renew) on the replicas, as
    /// [`Confirm`] says, within `budget`. On failure, `give_back` (the release of the
    /// grant) is sent on the same connection before the error is returned.
    async fn confirm(
        &self,
        s: &mut Session,
        key: &str,
        budget: ConfirmBudget,
        give_back: Option<Cmd>,
    ) -> Result<()> {
        if self.opts.confirm == Confirm::Off || self.opts.confirm == Confirm::Replicas(0) {
            return Ok(());
        }
        let outcome = timeout(budget.limit, self.confirm_steps(s, key, budget.wait)).await;
        let (failure, answered) = match outcome {
            Ok(Ok(())) => return Ok(()),
            Ok(Err(e)) => (e, true),
            Err(_) => (
                self.timeout_error("WAIT (the confirmation of a grant)", budget.limit),
                false,
            ),
        };
        if let Some(cmd) = give_back {
            let release = self.give_back(s, key, cmd);
            if answered {
                // The connection is free: the grant is gone when the error is returned.
                release.await;
            } else if let Ok(h) = tokio::runtime::Handle::try_current() {
                // Queued behind the WAIT that has not answered: it runs when that ends.
                h.spawn(release);
            }
        }
        Err(failure)
    }

    async fn confirm_steps(&self, s: &mut Session, key: &str, wait: Duration) -> Result<()> {
        let known = match self.replicas(s, key, false).await {
            Ok(r) => Some(r),
            Err(e) => match self.opts.confirm {
                // The count is given: WAIT for it even if INFO is not allowed.
                Confirm::Replicas(_) => {
                    log::debug!("{}: ROLE: {e}", self.label);
                    None
                }
                _ => {
                    return Err(Error::Invalid(format!(
                        "{}: cannot learn how many replicas should confirm a grant ({e}); \
                         allow this user ROLE (+role) and WAIT (+wait), give the number \
                         (Confirm::Replicas(n), --replicas N) or turn confirmation off \
                         (Confirm::Off, --no-confirm)",
                        self.label
                    )))
                }
            },
        };
        let (needed, expected) = match (self.opts.confirm, known) {
            (Confirm::Replicas(n), _) => (n, true),
            (_, Some(r)) if r.min_to_write > 0 => (r.min_to_write, true),
            (_, Some(r)) => (r.online, false),
            (_, None) => (0, false),
        };
        if needed == 0 {
            log::debug!("{}: no replica online: nothing to confirm", self.label);
            return Ok(());
        }
        let mut online = known.map(|r| r.online);
        if expected && online.is_some_and(|o| o < needed) {
            // The cached count may be a second old: ask again before refusing.
            online = Some(self.replicas(s, key, true).await?.online);
            if online.is_some_and(|o| o < needed) {
                return Err(Error::Unconfirmed {
                    node: self.label.clone(),
                    confirmed: 0,
                    needed,
                    connected: online,
                    after: Duration::ZERO,
                });
            }
        }
        let mut cmd = redis::cmd("WAIT");
        cmd.arg(needed).arg(millis(wait));
        let acked: i64 = self.query(s, &cmd, Some(key)).await?;
        let confirmed = u32::try_from(acked.max(0)).unwrap_or(u32::MAX);
        if confirmed >= needed {
            log::debug!("{}: {key}: confirmed by {confirmed} replica(s)", self.label);
            return Ok(());
        }
        Err(Error::Unconfirmed {
            node: self.label.clone(),
            confirmed,
            needed,
            connected: online,
            after: wait,
        })
    }

    /// The owner-checked release of `token`'s grant on `key` (the module's, or the
    /// classic Lua where the module is missing).
    fn release_cmd(&self, key: &str, token: &str) -> Cmd {
        if self.module_missing() {
            let mut c = redis::cmd("EVAL");
            c.arg(RELEASE_LUA).arg(1).arg(key).arg(token);
            c
        } else {
            let mut c = redis::cmd("LOCK.RELEASE");
            c.arg(key).arg(token);
            c
        }
    }

    /// Sends `cmd`, the release of a grant on `key`, over `s` (so that it runs after
    /// anything still running on that connection), bounded by the I/O timeout.
    fn give_back(
        &self,
        s: &Session,
        key: &str,
        cmd: Cmd,
    ) -> impl std::future::Future<Output = ()> + Send + 'static {
        let mut conn = s.conn.clone();
        let (label, limit) = (self.label.clone(), self.opts.io_timeout);
        let key = key.to_string();
        async move {
            match timeout(limit, conn.query_at::<i64>(&cmd, &key)).await {
                Ok(Ok(n)) => log::debug!("{label}: unconfirmed grant of {key:?} given back ({n})"),
                Ok(Err(e)) => log::warn!(
                    "{label}: the unconfirmed grant of {key:?} could not be given back ({}); \
                     it ends with its lease",
                    crate::error::scrub(&e.to_string())
                ),
                Err(_) => log::warn!(
                    "{label}: the unconfirmed grant of {key:?} could not be given back in \
                     time; it ends with its lease"
                ),
            }
        }
    }

    /// Owner-checked release. `true` when this token held the lock.
    pub async fn release(&self, key: &str, token: &str, limit: Duration) -> Result<bool> {
        let mut cmd = redis::cmd("LOCK.RELEASE");
        cmd.arg(key).arg(token);
        let mut classic = redis::cmd("EVAL");
        classic.arg(RELEASE_LUA).arg(1).arg(key).arg(token);
        // Sent again after a connection error on an older connection (a server that
        // restarted, a Sentinel failover that killed the connection): the lock is free
        // either way, though a release that had reached the server answers 0 the second
        // time ("not held"). Not sending it again would leave the lock to its lease.
        self.owner_checked(
            ("LOCK.RELEASE", cmd),
            ("EVAL compare-and-delete", classic),
            limit,
            true,
        )
        .await
    }

    /// Owner-checked extend to `ttl_ms` from now. `true` when this token held the lock.
    /// With `confirm`, the new lease is then confirmed on the replicas (the hold of a
    /// once-per-period lock, which must survive a failover as a grant does); a failed
    /// confirmation keeps the lock and is returned as the error.
    pub async fn extend(
        &self,
        key: &str,
        token: &str,
        ttl_ms: u64,
        limit: Duration,
        confirm: bool,
    ) -> Result<bool> {
        let mut cmd = redis::cmd("LOCK.EXTEND");
        cmd.arg(key).arg(token).arg("PX").arg(ttl_ms);
        let classic = Self::classic_extend_cmd(key, token, ttl_ms);
        if !confirm {
            return self
                .owner_checked(("LOCK.EXTEND", cmd), classic, limit, true)
                .await;
        }
        let (_, classic) = classic;
        let connect = self.opts.connect_timeout.min(limit);
        let outcome = timeout(limit, async {
            let mut s = self.session(connect).await?;
            let module = if self.module_missing() {
                None
            } else {
                self.module_reply(self.query(&mut s, &cmd, None).await)?
            };
            let n: i64 = match module {
                Some(n) => n,
                None => {
                    self.note_fallback();
                    self.query(&mut s, &classic, None).await?
                }
            };
            Ok::<_, Error>((s, n == 1))
        })
        .await;
        let (mut s, held) = match outcome {
            Ok(r) => r?,
            Err(_) => return Err(self.timeout_error("LOCK.EXTEND", limit)),
        };
        if held {
            let budget = ConfirmBudget {
                wait: self.opts.confirm_timeout,
                limit: self.opts.confirm_timeout + self.opts.io_timeout,
            };
            self.confirm(&mut s, key, budget, None).await?;
        }
        Ok(held)
    }

    /// The classic extend: an owner-checked `PEXPIRE` in Lua.
    fn classic_extend_cmd(key: &str, token: &str, ttl_ms: u64) -> (&'static str, Cmd) {
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(EXTEND_LUA).arg(1).arg(key).arg(token).arg(ttl_ms);
        ("EVAL owner-checked PEXPIRE", cmd)
    }

    /// An owner-checked command that answers `1` or `0`: the module's, or where the
    /// module is missing its classic Lua twin (in what is left of `limit`). `true` when
    /// this token held the lock.
    async fn owner_checked(
        &self,
        (what, cmd): (&'static str, Cmd),
        (classic_what, classic): (&'static str, Cmd),
        limit: Duration,
        retry: bool,
    ) -> Result<bool> {
        let deadline = Instant::now() + limit;
        let module = Call {
            what,
            cmd: &cmd,
            limit,
            retry,
        };
        let n = match self.module_run::<i64>(module).await? {
            Some(n) => n,
            None => {
                self.note_fallback();
                self.run(Call {
                    what: classic_what,
                    cmd: &classic,
                    limit: remaining(deadline),
                    retry,
                })
                .await?
            }
        };
        Ok(n == 1)
    }

    /// A command the module alone has (`LOCK.WATCH`, `LOCK.IFHELD`, ...): its reply, or
    /// [`Error::ModuleMissing`] where the server does not know it.
    pub async fn module_only<T: FromRedisValue>(&self, call: Call<'_>) -> Result<T> {
        self.module_run::<T>(call)
            .await?
            .ok_or_else(|| self.missing(call.what))
    }

    /// Whether the server takes a lease of `len` on `key` at all (a hold longer than
    /// its `lock.max-ttl` is refused before the work): `LOCK.EXTEND` with a token nobody
    /// holds, whose arguments the module checks before the key (`0`, nothing changes).
    /// The refusal is the error; a server without the module takes any length.
    pub async fn check_lease(&self, key: &str, len: Duration) -> Result<()> {
        let mut cmd = redis::cmd("LOCK.EXTEND");
        cmd.arg(key).arg(new_token()).arg("PX").arg(millis(len));
        let call = Call::idempotent(
            "LOCK.EXTEND (the length of the hold)",
            &cmd,
            self.opts.io_timeout,
        );
        self.module_run::<i64>(call).await.map(|_| ())
    }

    /// `LOCK.EXTEND key token PX ttl OWNER owner`: a new lease and a new label, the
    /// fence kept. `true` when this token held the lock. Needs the module.
    pub async fn extend_owner(
        &self,
        key: &str,
        token: &str,
        ttl_ms: u64,
        owner: &str,
        limit: Duration,
    ) -> Result<bool> {
        let mut cmd = redis::cmd("LOCK.EXTEND");
        cmd.arg(key)
            .arg(token)
            .arg("PX")
            .arg(ttl_ms)
            .arg("OWNER")
            .arg(owner);
        // Sent twice it sets the same lease and label: safe to retry.
        let n: i64 = self
            .module_only(Call::idempotent("LOCK.EXTEND ... OWNER", &cmd, limit))
            .await?;
        Ok(n == 1)
    }

    /// `LOCK.IFHELD key token ...` / `LOCK.IFFENCE key fence ...` (built by
    /// [`guarded_cmd`]): the wrapped command's reply; `NOTHELD` as [`Error::NotHeld`].
    /// Sent once: the wrapped command may not be idempotent.
    pub async fn guarded<T: FromRedisValue>(
        &self,
        what: &'static str,
        cmd: &Cmd,
        key: &str,
    ) -> Result<T> {
        match self
            .module_only::<T>(Call::once(what, cmd, self.opts.io_timeout))
            .await
        {
            Err(e) if e.is_notheld_reply() => Err(Error::NotHeld {
                node: self.label.clone(),
                key: key.to_string(),
                what: "the guarded command did not run",
            }),
            r => r,
        }
    }

    /// `LOCK.CHECK key fence`: is `fence` a current holder's?
    pub async fn check(&self, key: &str, fence: u64) -> Result<bool> {
        let mut cmd = redis::cmd("LOCK.CHECK");
        cmd.arg(key).arg(fence);
        let n: i64 = self
            .module_only(Call::idempotent("LOCK.CHECK", &cmd, self.opts.io_timeout))
            .await?;
        Ok(n == 1)
    }

    /// A connection of its own (for a command that blocks, such as `LOCK.WATCH`), each
    /// reply on it limited to `response`, connected within the connect timeout.
    pub async fn dedicated(&self, response: Duration) -> Result<Dedicated> {
        let conn = self.open(self.opts.connect_timeout, Some(response)).await?;
        Ok(Dedicated {
            conn,
            label: self.label.clone(),
        })
    }

    /// `LOCK.INFO`; without the module, what `PTTL` tells of a string lock.
    pub async fn info(&self, key: &str) -> Result<Option<LockInfo>> {
        let limit = self.opts.io_timeout;
        let mut cmd = redis::cmd("LOCK.INFO");
        cmd.arg(key);
        if let Some(v) = self
            .module_run::<Value>(Call::idempotent("LOCK.INFO", &cmd, limit))
            .await?
        {
            return LockInfo::from_value(&v);
        }
        self.note_fallback();
        let mut cmd = redis::cmd("PTTL");
        cmd.arg(key);
        let ttl: i64 = self.run(Call::idempotent("PTTL", &cmd, limit)).await?;
        if ttl == -2 {
            return Ok(None);
        }
        Ok(Some(LockInfo {
            kind: "string".into(),
            ttl_ms: ttl,
            fields: vec![
                ("state".into(), Some("held".into())),
                ("kind".into(), Some("string".into())),
                ("ttl".into(), Some(ttl.to_string())),
            ],
            ..LockInfo::default()
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_labels_show_no_credentials() {
        let n = Node::new(
            "redis://:hunter2@127.0.0.1:1/",
            ClientOptions::default(),
            false,
        )
        .unwrap();
        assert_eq!(n.label, "127.0.0.1:1");
        assert!(!n.shown_url.contains("hunter2"));
        let e = Node::new("hunter2@127.0.0.1:1", ClientOptions::default(), false)
            .err()
            .unwrap()
            .to_string();
        assert!(
            !e.contains("hunter2") && e.contains("write redis://HOST:PORT"),
            "{e}"
        );
    }

    #[test]
    fn replica_counts_from_info_and_config() {
        let info = "# Replication\r\nrole:master\r\nconnected_slaves:2\r\n\
                    slave0:ip=127.0.0.1,port=7001,state=online,offset=42,lag=0\r\n\
                    slave1:ip=127.0.0.1,port=7002,state=wait_bgsave,offset=0,lag=0\r\n\
                    master_failover_state:no-failover\r\nslave_read_only:1\r\n";
        assert_eq!(online_replicas(info), 1);
        let bulk = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        let replica = |port: &str| Value::Array(vec![bulk("127.0.0.1"), bulk(port), bulk("42")]);
        let role = |name: &str, replicas: Vec<Value>| {
            Value::Array(vec![bulk(name), Value::Int(42), Value::Array(replicas)])
        };
        assert_eq!(
            role_replicas(&role("master", vec![replica("7001")])),
            Some(1)
        );
        assert_eq!(role_replicas(&role("master", vec![])), Some(0));
        assert_eq!(role_replicas(&role("slave", vec![])), None);
        assert_eq!(role_replicas(&Value::Nil), None);
        assert_eq!(online_replicas("role:master\r\nconnected_slaves:0\r\n"), 0);
        let pair = Value::Array(vec![
            Value::BulkString(b"min-replicas-to-write".to_vec()),
            Value::BulkString(b"2".to_vec()),
        ]);
        assert_eq!(config_value(&pair), Some(2));
        let map = Value::Map(vec![(
            Value::BulkString(b"min-replicas-to-write".to_vec()),
            Value::BulkString(b"0".to_vec()),
        )]);
        assert_eq!(config_value(&map), Some(0));
        assert_eq!(config_value(&Value::Array(vec![])), None);
    }
}
