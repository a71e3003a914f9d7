//! One lock server (or one Redis Cluster): the module's commands with a time limit on
//! every call, a connection that is remade after a connection error, confirmation of
//! grants on the server's replicas (`WAIT`), and the classic `SET NX PX` + Lua recipe
//! where the module is not loaded.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{get_slot, Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::{AsyncConnectionConfig, Cmd, ConnectionAddr, FromRedisValue, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::Mutex;
use tokio::time::timeout;

use crate::error::{Error, Result, MODULE_HELP};
use crate::info::LockInfo;
use crate::options::{millis, ClientOptions, Confirm, LockMode};

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

#[derive(Clone)]
enum Conn {
    Plain(MultiplexedConnection),
    Cluster(ClusterConnection),
}

impl Conn {
    async fn query<T: FromRedisValue>(&mut self, cmd: &Cmd) -> redis::RedisResult<T> {
        match self {
            Conn::Plain(c) => cmd.query_async(c).await,
            Conn::Cluster(c) => cmd.query_async(c).await,
        }
    }

    /// A keyless command (`WAIT`, `INFO`, `CONFIG GET`) sent where `key` lives: on a
    /// cluster, to the master of its slot over the connection that carried the key's
    /// commands (which is what `WAIT` counts).
    async fn query_at<T: FromRedisValue>(&mut self, cmd: &Cmd, key: &str) -> redis::RedisResult<T> {
        match self {
            Conn::Plain(c) => cmd.query_async(c).await,
            Conn::Cluster(c) => {
                let route = Route::new(get_slot(key.as_bytes()), SlotAddr::Master);
                let v = c
                    .route_command(
                        cmd,
                        RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route)),
                    )
                    .await?;
                T::from_redis_value(&v)
            }
        }
    }
}

enum Target {
    Plain(redis::Client),
    Cluster(String),
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

/// What `INFO replication` (and `CONFIG GET min-replicas-to-write`) said.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Replicas {
    /// Replicas in state `online`.
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
    replicas: std::sync::Mutex<HashMap<Option<u16>, (Instant, Replicas)>>,
    pub opts: ClientOptions,
}

/// `url` without the user name and password (`redis://host:port/db`); `"<the URL>"`
/// when it does not parse (then it cannot be cleaned reliably).
pub fn redact_url(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut u) => {
            let _ = u.set_password(None);
            let _ = u.set_username("");
            u.to_string()
        }
        Err(_) => "<the URL>".into(),
    }
}

fn cluster_client(
    url: &str,
    connect: Duration,
    response: Duration,
) -> redis::RedisResult<ClusterClient> {
    ClusterClientBuilder::new(vec![url.to_string()])
        .connection_timeout(connect)
        .response_timeout(response)
        .build()
}

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
            redis::Arg::Cursor => {
                return Err(Error::Invalid(format!(
                    "{head} cannot wrap a command with a cursor argument"
                )))
            }
        }
    }
    Ok(c)
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
        // A URL that does not parse is never echoed: it may hold a password.
        let bad_url = |_: redis::RedisError| {
            Error::Invalid(format!(
                "{} is not a server URL; write redis://HOST:PORT, rediss://HOST:PORT for \
                 TLS, or unix:///path/to/socket",
                redact_url(url)
            ))
        };
        let client = redis::Client::open(url).map_err(bad_url)?;
        let addr = client.get_connection_info().addr.clone();
        let tls = match &addr {
            ConnectionAddr::TcpTls { host, port, .. } => Some((host.clone(), *port)),
            _ => None,
        };
        let target = if cluster {
            // Validate the URL now; connections are made on first use.
            cluster_client(url, opts.connect_timeout, opts.io_timeout).map_err(bad_url)?;
            Target::Cluster(url.to_string())
        } else {
            Target::Plain(client)
        };
        Ok(Node {
            label: addr.to_string(),
            shown_url: redact_url(url),
            tls,
            target,
            shared: Mutex::new(Shared {
                generation: 0,
                conn: None,
            }),
            module: AtomicU8::new(MODULE_UNKNOWN),
            fallback_noted: AtomicBool::new(false),
            replicas: std::sync::Mutex::new(HashMap::new()),
            opts,
        })
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
        let mut cmd = redis::cmd("INFO");
        cmd.arg("cluster");
        let info: String = probe
            .run(Call::once(
                "INFO cluster",
                &cmd,
                opts.connect_timeout + opts.io_timeout,
            ))
            .await?;
        Ok(info.lines().any(|l| l.trim() == "cluster_enabled:1"))
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
        let attempt = async {
            match &self.target {
                Target::Plain(client) => {
                    let mut cfg = AsyncConnectionConfig::new().set_connection_timeout(connect);
                    if let Some(r) = response {
                        cfg = cfg.set_response_timeout(r);
                    }
                    client
                        .get_multiplexed_async_connection_with_config(&cfg)
                        .await
                        .map(Conn::Plain)
                }
                Target::Cluster(url) => {
                    let client =
                        cluster_client(url, connect, response.unwrap_or(self.opts.io_timeout))?;
                    client.get_async_connection().await.map(Conn::Cluster)
                }
            }
        };
        match timeout(connect, attempt).await {
            Ok(Ok(c)) => Ok(c),
            Ok(Err(e)) if !e.is_timeout() => Err(Error::redis(&self.label, e)),
            _ => Err(Error::Timeout {
                node: self.label.clone(),
                what: "connect",
                after: connect,
                hint: self.tls_hint().await,
            }),
        }
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
            if e.is_connection_error() {
                self.drop_conn(generation).await;
            }
        }
        r
    }

    /// Runs one command on the shared connection within its `limit` (connecting included).
    /// With `retry`, for commands that may be sent twice (an acquire with our token is
    /// an idempotent renew, an extend sets the same lease): a connection error on a
    /// connection made earlier (a server restarted since, an idle connection closed) is
    /// retried once on a fresh connection, within the same limit.
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
                    Err(e) if retry && first && !s.fresh && e.is_connection_error() => {
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
        c.arg("PX").arg(req.ttl_ms).arg("TOKEN").arg(req.token);
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
    fn classic_supports(&self, mode: LockMode) -> Result<()> {
        match mode {
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
        self.classic_supports(req.mode)?;
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
                    Err(e) if first && !s.fresh && e.is_connection_error() => {
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
            self.confirm(&mut s, req.key, req.token, budget, true)
                .await?;
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
                    self.confirm(&mut s, req.key, req.token, budget, true)
                        .await?;
                }
                return Ok(grant);
            }
        }
        self.classic_supports(req.mode)?;
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

    /// What `INFO replication` says of the replicas of the server that holds `key`,
    /// reused for a second unless `fresh`.
    async fn replicas(&self, s: &mut Session, key: &str, fresh: bool) -> Result<Replicas> {
        let slot = matches!(self.target, Target::Cluster(_)).then(|| get_slot(key.as_bytes()));
        if !fresh {
            let cache = self.replicas.lock().unwrap_or_else(|p| p.into_inner());
            if let Some((at, r)) = cache.get(&slot) {
                if at.elapsed() < REPLICAS_CACHED {
                    return Ok(*r);
                }
            }
        }
        let mut info = redis::cmd("INFO");
        info.arg("replication");
        let mut config = redis::cmd("CONFIG");
        config.arg("GET").arg("min-replicas-to-write");
        let mut other = Session {
            generation: s.generation,
            conn: s.conn.clone(),
            fresh: s.fresh,
        };
        let (info, config) = futures_util::join!(
            self.query::<String>(s, &info, Some(key)),
            self.query::<Value>(&mut other, &config, Some(key))
        );
        let min_to_write = match config {
            Ok(v) => config_value(&v).unwrap_or(0),
            Err(e) => {
                // CONFIG may be denied to this user or renamed; the server enforces the
                // setting itself (NOREPLICAS) anyway.
                log::debug!("{}: CONFIG GET min-replicas-to-write: {e}", self.label);
                0
            }
        };
        let r = Replicas {
            online: online_replicas(&info?),
            min_to_write,
        };
        let mut cache = self.replicas.lock().unwrap_or_else(|p| p.into_inner());
        cache.insert(slot, (Instant::now(), r));
        Ok(r)
    }

    /// Confirms a write of `token` on `key` (a grant, a hand-off, a renew) on the
    /// replicas, as [`Confirm`] says, within `budget`. On failure, with `give_back`, the
    /// grant is released on the same connection before the error is returned.
    async fn confirm(
        &self,
        s: &mut Session,
        key: &str,
        token: &str,
        budget: ConfirmBudget,
        give_back: bool,
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
        if give_back {
            let release = self.give_back(s, key, token);
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
                    log::debug!("{}: INFO replication: {e}", self.label);
                    None
                }
                _ => {
                    return Err(Error::Invalid(format!(
                        "{}: cannot learn how many replicas should confirm a grant ({e}); \
                         give the number (Confirm::Replicas(n), --replicas N) or turn \
                         confirmation off (Confirm::Off, --no-confirm)",
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

    /// Releases `token`'s grant on `key` over `s` (so that it runs after anything still
    /// running on that connection), bounded by the I/O timeout.
    fn give_back(
        &self,
        s: &Session,
        key: &str,
        token: &str,
    ) -> impl std::future::Future<Output = ()> + Send + 'static {
        let mut conn = s.conn.clone();
        let cmd = if self.module_missing() {
            let mut c = redis::cmd("EVAL");
            c.arg(RELEASE_LUA).arg(1).arg(key).arg(token);
            c
        } else {
            let mut c = redis::cmd("LOCK.RELEASE");
            c.arg(key).arg(token);
            c
        };
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
        // Not retried: a release that reached the server before its connection broke
        // would answer 0 the second time, which would read as "not held".
        self.owner_checked(
            ("LOCK.RELEASE", cmd),
            ("EVAL compare-and-delete", classic),
            limit,
            false,
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
            self.confirm(&mut s, key, token, budget, false).await?;
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
    fn urls_lose_their_credentials() {
        assert_eq!(
            redact_url("redis://app:hunter2@10.0.0.1:6379/2"),
            "redis://10.0.0.1:6379/2"
        );
        assert_eq!(
            redact_url("rediss://:pw@h:1/#insecure"),
            "rediss://h:1/#insecure"
        );
        assert_eq!(redact_url("127.0.0.1:6379"), "<the URL>");
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
