//! One lock server (or one Redis Cluster): the module's commands with a time limit on
//! every call, a connection that is remade after a connection error, and the classic
//! `SET NX PX` + Lua recipe where the module is not loaded.

use std::sync::atomic::{AtomicU8, Ordering};
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::cluster_async::ClusterConnection;
use redis::{AsyncConnectionConfig, Cmd, FromRedisValue, RedisResult, Value};
use tokio::sync::Mutex;
use tokio::time::timeout;

use crate::error::{Error, Result};
use crate::info::LockInfo;
use crate::options::{ClientOptions, LockMode};

/// Owner-checked delete: the classic release of a `SET NX PX` lock.
const RELEASE_LUA: &str = "if redis.call('GET', KEYS[1]) == ARGV[1] then \
     return redis.call('DEL', KEYS[1]) else return 0 end";
/// Owner-checked `PEXPIRE`: the classic extend.
const EXTEND_LUA: &str = "if redis.call('GET', KEYS[1]) == ARGV[1] then \
     return redis.call('PEXPIRE', KEYS[1], ARGV[2]) else return 0 end";

const MODULE_UNKNOWN: u8 = 0;
const MODULE_LOADED: u8 = 1;
const MODULE_MISSING: u8 = 2;

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

#[derive(Clone)]
enum Conn {
    Plain(MultiplexedConnection),
    Cluster(ClusterConnection),
}

impl Conn {
    async fn query<T: FromRedisValue>(&mut self, cmd: &Cmd) -> RedisResult<T> {
        match self {
            Conn::Plain(c) => cmd.query_async(c).await,
            Conn::Cluster(c) => cmd.query_async(c).await,
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

pub(crate) struct Node {
    /// The URL, for log lines and error messages.
    pub label: String,
    target: Target,
    shared: Mutex<Shared>,
    module: AtomicU8,
    pub opts: ClientOptions,
}

fn cluster_client(url: &str, connect: Duration, response: Duration) -> Result<ClusterClient> {
    ClusterClientBuilder::new(vec![url.to_string()])
        .connection_timeout(connect)
        .response_timeout(response)
        .build()
        .map_err(Error::from)
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

/// A fresh random token (UUID v4 text).
pub(crate) fn new_token() -> String {
    uuid::Uuid::new_v4().to_string()
}

fn remaining(deadline: Instant) -> Duration {
    deadline.saturating_duration_since(Instant::now())
}

impl Node {
    /// A node for `url`; `cluster` routes commands by key across a Redis Cluster.
    /// Nothing is connected yet.
    pub fn new(url: &str, opts: ClientOptions, cluster: bool) -> Result<Node> {
        let target = if cluster {
            // Validate the URL now; connections are made on first use.
            cluster_client(url, opts.connect_timeout, opts.io_timeout)?;
            Target::Cluster(url.to_string())
        } else {
            Target::Plain(redis::Client::open(url)?)
        };
        Ok(Node {
            label: url.to_string(),
            target,
            shared: Mutex::new(Shared {
                generation: 0,
                conn: None,
            }),
            module: AtomicU8::new(MODULE_UNKNOWN),
            opts,
        })
    }

    /// Asks the server whether it runs in cluster mode (`INFO cluster`).
    pub async fn detect_cluster(url: &str, opts: &ClientOptions) -> Result<bool> {
        let client = redis::Client::open(url)?;
        let limit = opts.connect_timeout + opts.io_timeout;
        let info: String = timeout(limit, async {
            let mut c = client
                .get_multiplexed_async_connection_with_config(
                    &AsyncConnectionConfig::new().set_connection_timeout(opts.connect_timeout),
                )
                .await?;
            redis::cmd("INFO").arg("cluster").query_async(&mut c).await
        })
        .await
        .map_err(|_| Error::Timeout {
            what: "INFO cluster",
            after: limit,
        })??;
        Ok(info.lines().any(|l| l.trim() == "cluster_enabled:1"))
    }

    pub fn module_missing(&self) -> bool {
        self.module.load(Ordering::Relaxed) == MODULE_MISSING
    }

    fn note_module(&self, loaded: bool) {
        if loaded {
            self.module.store(MODULE_LOADED, Ordering::Relaxed);
        } else if self.module.swap(MODULE_MISSING, Ordering::Relaxed) != MODULE_MISSING {
            log::warn!(
                "{}: the redis-lock module is not loaded (LOCK.ACQUIRE is an unknown command); \
                 falling back to SET NX PX + Lua on this node, which gives no fencing token",
                self.label
            );
        }
    }

    async fn open(&self, connect: Duration, response: Option<Duration>) -> Result<Conn> {
        match &self.target {
            Target::Plain(client) => {
                let mut cfg = AsyncConnectionConfig::new().set_connection_timeout(connect);
                if let Some(r) = response {
                    cfg = cfg.set_response_timeout(r);
                }
                Ok(Conn::Plain(
                    client
                        .get_multiplexed_async_connection_with_config(&cfg)
                        .await?,
                ))
            }
            Target::Cluster(url) => {
                let client =
                    cluster_client(url, connect, response.unwrap_or(self.opts.io_timeout))?;
                Ok(Conn::Cluster(client.get_async_connection().await?))
            }
        }
    }

    /// The shared connection, made on first use or after a connection error.
    async fn shared(&self, connect: Duration) -> Result<(u64, Conn)> {
        let mut s = self.shared.lock().await;
        if let Some(c) = &s.conn {
            return Ok((s.generation, c.clone()));
        }
        let c = self.open(connect, None).await?;
        s.generation += 1;
        s.conn = Some(c.clone());
        Ok((s.generation, c))
    }

    async fn drop_conn(&self, generation: u64) {
        let mut s = self.shared.lock().await;
        if s.generation == generation {
            s.conn = None;
        }
    }

    /// Runs one command on the shared connection within `limit` (connecting included).
    async fn run<T: FromRedisValue>(
        &self,
        what: &'static str,
        cmd: &Cmd,
        limit: Duration,
    ) -> Result<T> {
        let connect = self.opts.connect_timeout.min(limit);
        let outcome = timeout(limit, async {
            let (generation, mut conn) = self.shared(connect).await?;
            let r = conn.query::<T>(cmd).await.map_err(Error::from);
            if let Err(e) = &r {
                if e.is_connection_error() {
                    self.drop_conn(generation).await;
                }
            }
            r
        })
        .await;
        match outcome {
            Ok(r) => r,
            Err(_) => Err(Error::Timeout { what, after: limit }),
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
    async fn module_run<T: FromRedisValue>(
        &self,
        what: &'static str,
        cmd: &Cmd,
        limit: Duration,
    ) -> Result<Option<T>> {
        if self.module_missing() {
            return Ok(None);
        }
        self.module_reply(self.run(what, cmd, limit).await)
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

    fn parse_grant(v: Value, token: &str) -> Result<Option<Grant>> {
        match v {
            Value::Nil => Ok(None),
            Value::Array(items) if items.len() == 2 => {
                let t = match &items[0] {
                    Value::BulkString(b) => b.as_slice(),
                    Value::SimpleString(s) => s.as_bytes(),
                    other => return Err(Error::Protocol(format!("LOCK.ACQUIRE token {other:?}"))),
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
                    ref other => Err(Error::Protocol(format!("LOCK.ACQUIRE fence {other:?}"))),
                }
            }
            other => Err(Error::Protocol(format!("LOCK.ACQUIRE reply {other:?}"))),
        }
    }

    /// The `SET NX PX` fallback holds one token per key: it cannot be a read-write lock
    /// or a semaphore, and silently taking an exclusive lock instead would be a surprise.
    fn classic_supports(&self, mode: LockMode) -> Result<()> {
        if mode == LockMode::Exclusive {
            return Ok(());
        }
        Err(Error::Invalid(format!(
            "{}: a {mode} lock needs the redis-lock module, which this server does not have \
             (LOCK.ACQUIRE is an unknown command); the SET NX PX fallback takes exclusive \
             locks only",
            self.label
        )))
    }

    /// One non-blocking acquisition. With `min_fence` it is the idempotent renew of
    /// quorum fencing (`MINFENCE`); on a node without the module that is an
    /// owner-checked `PEXPIRE`.
    pub async fn try_acquire(
        &self,
        req: &Acquire<'_>,
        min_fence: Option<u64>,
        limit: Duration,
    ) -> Result<Option<Grant>> {
        let deadline = Instant::now() + limit;
        let cmd = Self::acquire_cmd(req, min_fence, None);
        if let Some(v) = self.module_run("LOCK.ACQUIRE", &cmd, limit).await? {
            return Self::parse_grant(v, req.token);
        }
        self.classic_supports(req.mode)?;
        self.classic_acquire(req, min_fence.is_some(), remaining(deadline))
            .await
    }

    async fn classic_acquire(
        &self,
        req: &Acquire<'_>,
        renew: bool,
        limit: Duration,
    ) -> Result<Option<Grant>> {
        if renew {
            let (what, cmd) = Self::classic_extend_cmd(req.key, req.token, req.ttl_ms);
            let n: i64 = self.run(what, &cmd, limit).await?;
            return Ok((n == 1).then_some(Grant { fence: None }));
        }
        let mut cmd = redis::cmd("SET");
        cmd.arg(req.key)
            .arg(req.token)
            .arg("NX")
            .arg("PX")
            .arg(req.ttl_ms);
        let v: Value = self.run("SET NX PX", &cmd, limit).await?;
        Ok(match v {
            Value::Nil => None,
            _ => Some(Grant { fence: None }),
        })
    }

    /// Waits up to `wait` for the lock: the module's FIFO `BLOCK` on a connection of its
    /// own (a blocked command holds up its whole connection), or polling with jitter
    /// where the module is missing. The time limit is `wait` plus the I/O timeout.
    pub async fn acquire_blocking(
        &self,
        req: &Acquire<'_>,
        wait: Duration,
    ) -> Result<Option<Grant>> {
        let deadline = Instant::now() + wait;
        if !self.module_missing() {
            let block_ms = crate::options::millis(wait);
            let limit = wait + self.opts.io_timeout + self.opts.connect_timeout;
            let cmd = Self::acquire_cmd(req, None, Some(block_ms));
            let outcome = timeout(limit, async {
                let mut conn = self
                    .open(self.opts.connect_timeout, Some(wait + self.opts.io_timeout))
                    .await?;
                conn.query::<Value>(&cmd).await.map_err(Error::from)
            })
            .await
            .unwrap_or(Err(Error::Timeout {
                what: "LOCK.ACQUIRE BLOCK",
                after: limit,
            }));
            if let Some(v) = self.module_reply(outcome)? {
                return Self::parse_grant(v, req.token);
            }
        }
        self.classic_supports(req.mode)?;
        loop {
            let limit = self.opts.io_timeout;
            if let Some(g) = self.classic_acquire(req, false, limit).await? {
                return Ok(Some(g));
            }
            let pause = jitter(Duration::from_millis(50), Duration::from_millis(30));
            if Instant::now() + pause >= deadline {
                return Ok(None);
            }
            tokio::time::sleep(pause).await;
        }
    }

    /// Owner-checked release. `true` when this token held the lock.
    pub async fn release(&self, key: &str, token: &str, limit: Duration) -> Result<bool> {
        let mut cmd = redis::cmd("LOCK.RELEASE");
        cmd.arg(key).arg(token);
        let mut classic = redis::cmd("EVAL");
        classic.arg(RELEASE_LUA).arg(1).arg(key).arg(token);
        self.owner_checked(
            ("LOCK.RELEASE", cmd),
            ("EVAL compare-and-delete", classic),
            limit,
        )
        .await
    }

    /// Owner-checked extend to `ttl_ms` from now. `true` when this token held the lock.
    pub async fn extend(
        &self,
        key: &str,
        token: &str,
        ttl_ms: u64,
        limit: Duration,
    ) -> Result<bool> {
        let mut cmd = redis::cmd("LOCK.EXTEND");
        cmd.arg(key).arg(token).arg("PX").arg(ttl_ms);
        let classic = Self::classic_extend_cmd(key, token, ttl_ms);
        self.owner_checked(("LOCK.EXTEND", cmd), classic, limit)
            .await
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
    ) -> Result<bool> {
        let deadline = Instant::now() + limit;
        let n = match self.module_run::<i64>(what, &cmd, limit).await? {
            Some(n) => n,
            None => {
                self.run(classic_what, &classic, remaining(deadline))
                    .await?
            }
        };
        Ok(n == 1)
    }

    /// `LOCK.INFO`; without the module, what `TYPE` and `PTTL` tell of a string lock.
    pub async fn info(&self, key: &str) -> Result<Option<LockInfo>> {
        let limit = self.opts.io_timeout;
        let mut cmd = redis::cmd("LOCK.INFO");
        cmd.arg(key);
        if let Some(v) = self.module_run::<Value>("LOCK.INFO", &cmd, limit).await? {
            return LockInfo::from_value(&v);
        }
        let mut cmd = redis::cmd("PTTL");
        cmd.arg(key);
        let ttl: i64 = self.run("PTTL", &cmd, limit).await?;
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
