//! Sessions: one lease for any number of locks, as etcd, ZooKeeper and Consul have them
//! (`LOCK.SESSION`, docs/commands.md).
//!
//! Every lock taken in a session (`LOCK.ACQUIRE ... SESSION id`, `LOCK.ACQUIREALL ...
//! SESSION id`) has the session's lease: one task sends one `LOCK.SESSION KEEPALIVE`
//! every third of the TTL, however many locks the session holds (the lease task of
//! [`LockGuard`]s, run over the keepalive), and when the session ends (closed, its lease
//! run out, or, bound to its connection, the process gone) every lock it holds is
//! released in one step. One server only (or the primary a Sentinel names): a session
//! lives on the server it was opened on, and a cluster client is refused.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::{Cmd, Value};
use tokio::sync::{watch, Mutex};
use tokio::task::JoinHandle;
use tokio::time::timeout;

use crate::error::{Error, Result};
use crate::info::SessionInfo;
use crate::lease::{
    mark_lost, mark_renewed, release_until, settle, spawn_keepalive, LeaseStatus, LeaseWatch,
    LockGuard, LossReason, Plan,
};
use crate::node::{new_token, Acquire, ConfirmBudget, Dedicated, Node};
use crate::options::{check_ttl, drift, millis, LockMode, MAX_LIMIT};
use crate::redacted;
use crate::single::LockClient;

/// The most keys one `LOCK.ACQUIREALL` takes.
pub const MAX_KEYS: usize = 100;

/// How a [`Session`] is opened ([`LockClient::session`]). (`Debug` shows everything:
/// there is no secret here; the session's id is made by the client.)
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionOptions {
    /// The session's lease: every lock taken in it lives as long as the session; the
    /// keepalive renews it every third of it (unless [`interval`](Self::interval) says).
    pub ttl: Duration,
    /// Bind the session to its connection: it ends `bind` after that connection closes
    /// (the process died) unless a keepalive comes first, instead of at the end of its
    /// lease. `Some(Duration::ZERO)`: at once. Default: not bound.
    pub bind: Option<Duration>,
    /// Label shown by `LOCK.SESSION INFO`, and the default `OWNER` of its locks.
    pub owner: Option<String>,
    /// Time between keepalives; `None` = a third of the TTL.
    pub interval: Option<Duration>,
    /// How long before the lease can end the loss signal comes when no keepalive has
    /// succeeded (failed ones are tried again until then); `None` = a third of the TTL.
    pub margin: Option<Duration>,
    /// Cap on the session's life, counted from its opening: the last keepalive only
    /// reaches it, and the loss signal then fires with
    /// [`LossReason::CapReached`]. `None`: no cap.
    pub max_hold: Option<Duration>,
}

impl SessionOptions {
    pub fn new(ttl: Duration) -> Self {
        SessionOptions {
            ttl,
            bind: None,
            owner: None,
            interval: None,
            margin: None,
            max_hold: None,
        }
    }

    setters! {
        /// Bound to its connection, ending `grace` after it closes.
        fn bind(grace: Duration) => bind = Some(grace);
        fn owner(owner: impl Into<String>) => owner = Some(owner.into());
        fn interval(interval: Duration) => interval = Some(interval);
        fn margin(margin: Duration) => margin = Some(margin);
        fn max_hold(max_hold: Duration) => max_hold = Some(max_hold);
    }

    fn interval_in_force(&self) -> Duration {
        self.interval
            .unwrap_or(self.ttl / 3)
            .max(Duration::from_millis(1))
    }

    fn margin_in_force(&self) -> Duration {
        self.margin.unwrap_or(self.ttl / 3)
    }

    fn validate(&self) -> Result<()> {
        check_ttl(self.ttl)?;
        if let Some(o) = &self.owner {
            if o.is_empty() || o.len() > 256 {
                return Err(Error::Invalid("owner must be 1 to 256 bytes long".into()));
            }
        }
        if self.max_hold.is_some_and(|h| h.is_zero()) {
            return Err(Error::Invalid("max_hold must be positive".into()));
        }
        if self.interval.is_some_and(|i| i.is_zero() || i >= self.ttl) {
            return Err(Error::Invalid(
                "the keepalive interval must be positive and shorter than the TTL".into(),
            ));
        }
        let (interval, margin) = (self.interval_in_force(), self.margin_in_force());
        if interval + margin >= self.ttl {
            return Err(Error::Invalid(format!(
                "the margin ({margin:?}) leaves no time for a keepalive: margin and \
                 keepalive interval ({interval:?}) must add up to less than the TTL"
            )));
        }
        Ok(())
    }
}

/// How a lock is taken in a session: its mode, how long to wait, its label and token.
/// (`Debug` does not show the token.)
#[derive(Clone, Default, PartialEq, Eq)]
pub struct SessionLockOptions {
    /// Exclusive (default), shared, or one permit of a counted lock.
    pub mode: LockMode,
    /// `None`: one try; `Some(d)`: wait up to `d` in the key's FIFO queue (`BLOCK`).
    pub wait: Option<Duration>,
    /// Label shown by `LOCK.INFO` (default: the session's owner).
    pub owner: Option<String>,
    /// The token to hold the lock with; default a fresh random UUID v4.
    pub token: Option<String>,
}

debug_shows!(SessionLockOptions {
    mode,
    wait,
    owner,
    token: redacted(token)
});

impl SessionLockOptions {
    pub fn new() -> Self {
        Self::default()
    }

    setters! {
        /// A shared (reader) place in a read-write lock (`SHARED`).
        fn shared() => mode = LockMode::Shared;
        /// One of `permits` permits of a counted lock (`LIMIT n`).
        fn limit(permits: u32) => mode = LockMode::Counted(permits);
        fn mode(mode: LockMode) => mode = mode;
        fn wait(wait: Duration) => wait = Some(wait);
        fn owner(owner: impl Into<String>) => owner = Some(owner.into());
        fn token(token: impl Into<String>) => token = Some(token.into());
    }

    fn validate(&self) -> Result<()> {
        let mut probe = crate::options::AcquireOptions::new(Duration::from_secs(1));
        probe.owner = self.owner.clone();
        probe.token = self.token.clone();
        probe.mode = self.mode;
        probe.validate()
    }
}

/// The session on its server: its id, and the connection its keepalives go over (a
/// bound session is bound to it). One command at a time on it.
pub(crate) struct Keeper {
    node: Arc<Node>,
    /// The session's id: a secret, like a token (whoever has it can keep the session
    /// alive or close it).
    id: String,
    /// `BIND` grace, ms.
    bind: Option<u64>,
    owner: Option<String>,
    conn: Mutex<Option<Dedicated>>,
}

/// One reply of a `LOCK.SESSION` command, and what was sent.
struct Sent {
    reply: Value,
    /// An `OPEN` (on a new connection of a bound session) rather than a `KEEPALIVE`.
    opened: bool,
    at: Instant,
}

impl Keeper {
    fn open_cmd(&self, ttl: Duration) -> Cmd {
        let mut c = redis::cmd("LOCK.SESSION");
        c.arg("OPEN").arg(&self.id).arg("PX").arg(millis(ttl));
        if let Some(g) = self.bind {
            c.arg("BIND").arg(g);
        }
        if let Some(o) = &self.owner {
            c.arg("OWNER").arg(o);
        }
        c
    }

    fn sub_cmd(&self, sub: &str) -> Cmd {
        let mut c = redis::cmd("LOCK.SESSION");
        c.arg(sub).arg(&self.id);
        c
    }

    pub(crate) fn io_timeout(&self) -> Duration {
        self.node.opts.io_timeout
    }

    /// One command on the session's connection (made if there is none: `build` is told
    /// whether it is new and gives the command and whether it is an `OPEN`), within
    /// `limit`, connecting included. A connection that was open and turns out closed (a
    /// server restart, an idle timeout) is replaced once; one that does not answer in
    /// time is dropped.
    async fn call(
        &self,
        what: &'static str,
        limit: Duration,
        build: impl Fn(bool) -> (Cmd, bool),
    ) -> Result<Sent> {
        let deadline = Instant::now() + limit;
        let mut slot = self.conn.lock().await;
        let mut first = true;
        loop {
            let existing = slot.take();
            let fresh = existing.is_none();
            let (cmd, opened) = build(fresh);
            let at = Instant::now();
            let left = deadline.saturating_duration_since(at);
            let outcome = timeout(left, async {
                let mut conn = match existing {
                    Some(c) => c,
                    None => self.node.dedicated(self.node.opts.io_timeout).await?,
                };
                let r = conn.query::<Value>(&cmd).await;
                Ok::<_, Error>((conn, r))
            })
            .await;
            let (conn, reply) = match outcome {
                Err(_) => {
                    return Err(Error::Timeout {
                        node: self.node.label.clone(),
                        what,
                        after: limit,
                        hint: None,
                    })
                }
                Ok(r) => r?,
            };
            match reply {
                Ok(reply) => {
                    *slot = Some(conn);
                    return Ok(Sent { reply, opened, at });
                }
                Err(e) if e.is_connection_error() => {
                    if first && !fresh {
                        log::debug!(
                            "{}: {what} failed ({e}); again on a new connection",
                            self.node.label
                        );
                        first = false;
                        continue;
                    }
                    return Err(e);
                }
                Err(e) => {
                    *slot = Some(conn);
                    if e.is_unknown_command() {
                        return Err(self.node.missing("A session"));
                    }
                    return Err(e.or_no_session());
                }
            }
        }
    }

    /// `OPEN`: `true` when the session is new on the server.
    async fn open(&self, ttl: Duration) -> Result<bool> {
        let sent = self
            .call("LOCK.SESSION OPEN", self.io_timeout(), |_| {
                (self.open_cmd(ttl), true)
            })
            .await?;
        Ok(int(&sent.reply, "LOCK.SESSION OPEN")? == 1)
    }

    /// A keepalive of `ttl` from now: `Some(deadline)` (this client's conservative
    /// view of the new lease end), or `None` when the session is not open on the server
    /// any more. On a new connection a bound session is opened again instead (`OPEN`
    /// renews it and binds it to this connection; a `KEEPALIVE` rebinds only a session
    /// whose connection the server saw close, and a restarted server keeps no binding);
    /// when that finds no session, the empty one it made is closed.
    pub(crate) async fn keepalive(
        &self,
        ttl: Duration,
        limit: Duration,
    ) -> Result<Option<Instant>> {
        let sent = self
            .call("LOCK.SESSION KEEPALIVE", limit, |fresh| {
                if fresh && self.bind.is_some() {
                    (self.open_cmd(ttl), true)
                } else {
                    let mut c = self.sub_cmd("KEEPALIVE");
                    c.arg("PX").arg(millis(ttl));
                    (c, false)
                }
            })
            .await?;
        let n = int(&sent.reply, "LOCK.SESSION KEEPALIVE")?;
        // KEEPALIVE: 1 renewed, 0 not open. OPEN: 0 it was open (renewed), 1 it was not.
        if n == i64::from(!sent.opened) {
            return Ok(Some(sent.at + ttl.saturating_sub(drift(ttl))));
        }
        if sent.opened {
            let _ = self.close(self.io_timeout()).await;
        }
        Ok(None)
    }

    /// `CLOSE` within `limit`: how many locks it released, `None` when it was not open.
    pub(crate) async fn close(&self, limit: Duration) -> Result<Option<u64>> {
        let sent = self
            .call("LOCK.SESSION CLOSE", limit, |_| {
                (self.sub_cmd("CLOSE"), false)
            })
            .await?;
        *self.conn.lock().await = None;
        match sent.reply {
            Value::Nil => Ok(None),
            ref v => Ok(Some(
                u64::try_from(int(v, "LOCK.SESSION CLOSE")?).unwrap_or(0),
            )),
        }
    }

    /// `CLOSE`, tried again after a transient failure until `until` (the one retry of
    /// releases, [`settle`]).
    async fn close_until(&self, until: Instant) -> Result<Option<u64>> {
        settle("session", until, self.io_timeout(), |limit| {
            self.close(limit)
        })
        .await
    }

    async fn info(&self) -> Result<Option<SessionInfo>> {
        let sent = self
            .call("LOCK.SESSION INFO", self.io_timeout(), |_| {
                (self.sub_cmd("INFO"), false)
            })
            .await?;
        SessionInfo::from_value(&sent.reply)
    }
}

fn int(v: &Value, what: &str) -> Result<i64> {
    match v {
        Value::Int(n) => Ok(*n),
        other => Err(Error::Protocol(format!(
            "{what} answered {other:?}, not an integer"
        ))),
    }
}

/// A session: one lease for any number of locks ([`LockClient::session`]).
///
/// Every lock taken in it has the session's lease: one background task keeps the
/// session alive (`LOCK.SESSION KEEPALIVE` every third of the TTL, renewing every lock
/// at once), and its loss signal ([`lost`](Self::lost)) fires, in every lock's guard
/// too, as soon as a keepalive is answered `0` (the session ended on the server: closed
/// from elsewhere, its lease ran out, a restart without it), fails with an error reply,
/// or none succeeded until the margin before the lease can end. An acquire answered
/// `NOSESSION` is [`Error::NoSession`] and fires it too.
///
/// [`close`](Self::close) releases every lock of the session in one step; dropping the
/// session does it in a spawned task (best effort). A session lives on one server:
/// sessions of a Redis Cluster client are refused (in a cluster a session lives on
/// each node it has locks on, see docs/commands.md).
///
/// ```no_run
/// # async fn demo() -> redis_lock_client::Result<()> {
/// use std::time::Duration;
/// use redis_lock_client::{LockClient, SessionLockOptions, SessionOptions};
///
/// let locks = LockClient::connect("redis://127.0.0.1:6379").await?;
/// let session = locks
///     .session(&SessionOptions::new(Duration::from_secs(30)).bind(Duration::from_secs(5)))
///     .await?;
/// let wait = SessionLockOptions::new().wait(Duration::from_secs(10));
/// if let Some(accounts) = session.acquire_all(&["acct:17", "acct:42"], &wait).await? {
///     let lost = session.lost();
///     tokio::select! {
///         _ = async { /* the work, with accounts[0].fence(), accounts[1].fence() */ } => {}
///         reason = lost => eprintln!("session lost: {reason:?}, stopping"),
///     }
/// }
/// session.close().await?; // every lock of the session released at once
/// # Ok(()) }
/// ```
pub struct Session {
    keeper: Arc<Keeper>,
    ttl: Duration,
    status: Arc<watch::Sender<LeaseStatus>>,
    task: Option<JoinHandle<()>>,
    done: bool,
}

debug_shows!(
    Session {
        ttl,
        status: now(status)
    }..
);

fn now(status: &Arc<watch::Sender<LeaseStatus>>) -> LeaseStatus {
    status.borrow().clone()
}

impl LockClient {
    /// Opens a session on the server (`LOCK.SESSION OPEN`, with a random 32-hex-digit
    /// id) and starts its keepalive. A Redis Cluster client is [`Error::Invalid`]; a
    /// server without the module is [`Error::ModuleMissing`].
    pub async fn session(&self, opts: &SessionOptions) -> Result<Session> {
        opts.validate()?;
        if self.is_cluster() {
            return Err(Error::Invalid(
                "sessions need one server (or a Sentinel's primary): in a cluster a \
                 session lives on each node it has locks on, which this client does not \
                 manage"
                    .into(),
            ));
        }
        let keeper = Arc::new(Keeper {
            node: self.node.clone(),
            id: uuid::Uuid::new_v4().simple().to_string(),
            bind: opts.bind.map(millis_or_zero),
            owner: opts.owner.clone(),
            conn: Mutex::new(None),
        });
        let start = Instant::now();
        keeper.open(opts.ttl).await?;
        let valid_until = start + opts.ttl.saturating_sub(drift(opts.ttl));
        let (tx, _) = watch::channel(LeaseStatus::Held { valid_until });
        let status = Arc::new(tx);
        let plan = Plan::new(
            opts.interval_in_force(),
            opts.margin_in_force(),
            opts.max_hold.map(|h| start + h),
        );
        let task = spawn_keepalive(keeper.clone(), opts.ttl, plan, status.clone());
        Ok(Session {
            keeper,
            ttl: opts.ttl,
            status,
            task: Some(task),
            done: false,
        })
    }
}

/// Whole milliseconds, zero allowed (a `BIND` grace).
fn millis_or_zero(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// `LOCK.ACQUIREALL` mode words.
fn mode_word(m: LockMode) -> String {
    match m {
        LockMode::Exclusive => "EXCLUSIVE".into(),
        LockMode::Shared => "SHARED".into(),
        LockMode::Counted(n) => format!("LIMIT={n}"),
    }
}

impl Session {
    /// The session's id: a secret, like a lock's token (whoever has it can keep the
    /// session alive or close it with `LOCK.SESSION`).
    pub fn id(&self) -> &str {
        &self.keeper.id
    }

    /// The session's lease.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    pub fn status(&self) -> LeaseStatus {
        self.status.borrow().clone()
    }

    /// True while the status is `Held` and its deadline has not passed.
    pub fn is_held(&self) -> bool {
        self.status.borrow().is_held()
    }

    /// The last known lease deadline (held or lost); `None` once closed.
    pub fn valid_until(&self) -> Option<Instant> {
        self.status.borrow().valid_until()
    }

    /// A handle on the session's status.
    pub fn watch(&self) -> LeaseWatch {
        LeaseWatch::new(self.status.subscribe())
    }

    /// The loss signal: resolves with the reason as soon as the session is lost (`None`
    /// once it is closed). [`LossReason::NotHeld`] means the server said the session is
    /// not open there any more (its locks are gone).
    pub fn lost(&self) -> impl Future<Output = Option<LossReason>> + Send + 'static {
        let mut w = self.watch();
        async move { w.lost().await }
    }

    /// Takes `name` exclusively in the session, waiting up to `wait` (`None`: one try).
    pub async fn acquire(&self, name: &str, wait: Option<Duration>) -> Result<Option<LockGuard>> {
        let opts = SessionLockOptions {
            wait,
            ..SessionLockOptions::default()
        };
        self.acquire_with(name, &opts).await
    }

    /// One try at `name` in the session, as `opts` says (its `wait` is ignored).
    pub async fn try_acquire(
        &self,
        name: &str,
        opts: &SessionLockOptions,
    ) -> Result<Option<LockGuard>> {
        let opts = SessionLockOptions {
            wait: None,
            ..opts.clone()
        };
        self.acquire_with(name, &opts).await
    }

    /// Takes `name` in the session (`LOCK.ACQUIRE name ... SESSION id`): exclusive,
    /// shared or one permit of a counted lock, waiting in the key's FIFO queue up to
    /// `opts.wait`. `Ok(None)`: held elsewhere (for the whole wait). The guard has the
    /// session's lease: its status and loss signal are the session's, `release()` gives
    /// the lock back, `extend()` and holds are [`Error::Invalid`]. The grant is
    /// confirmed on the replicas as any grant ([`Confirm`](crate::Confirm)).
    /// [`Error::NoSession`] when the session has ended (the loss signal fires).
    pub async fn acquire_with(
        &self,
        name: &str,
        opts: &SessionLockOptions,
    ) -> Result<Option<LockGuard>> {
        opts.validate()?;
        self.check_usable()?;
        let node = &self.keeper.node;
        let token = opts.token.clone().unwrap_or_else(new_token);
        let owner = opts.owner.as_deref().or(self.keeper.owner.as_deref());
        let req = Acquire {
            key: name,
            token: &token,
            ttl_ms: millis(self.ttl),
            owner,
            mode: opts.mode,
            session: Some(&self.keeper.id),
        };
        let budget = self.budget();
        let outcome = match opts.wait.filter(|w| !w.is_zero()) {
            None => {
                node.try_acquire(&req, None, node.opts.io_timeout, budget)
                    .await
            }
            Some(w) => node.acquire_blocking(&req, w, budget).await,
        };
        match outcome.map_err(|e| self.failed(e, || release_cmd(name, &token))) {
            Ok(Some(grant)) => Ok(Some(self.guard(name, opts.mode, token, grant.fence))),
            Ok(None) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Takes every key of `keys` in the session, all or none (`LOCK.ACQUIREALL`), each
    /// in `opts.mode`; see [`acquire_all_modes`](Self::acquire_all_modes).
    pub async fn acquire_all(
        &self,
        keys: &[&str],
        opts: &SessionLockOptions,
    ) -> Result<Option<Vec<LockGuard>>> {
        let keyed: Vec<(&str, LockMode)> = keys.iter().map(|k| (*k, opts.mode)).collect();
        self.acquire_all_modes(&keyed, opts).await
    }

    /// Takes up to 100 keys in the session, each in its own mode, all or none
    /// (`LOCK.ACQUIREALL numkeys key ... MODES ... SESSION id`): one guard per key, in
    /// the order given, with one token and a fence each; `Ok(None)` when some key
    /// cannot be had (for the whole `opts.wait`: the request waits in every key's FIFO
    /// queue at once, without deadlock), and then nothing was taken. `opts.mode` is not
    /// used. The guards are those of [`acquire_with`](Self::acquire_with).
    pub async fn acquire_all_modes(
        &self,
        keys: &[(&str, LockMode)],
        opts: &SessionLockOptions,
    ) -> Result<Option<Vec<LockGuard>>> {
        opts.validate()?;
        if keys.is_empty() || keys.len() > MAX_KEYS {
            return Err(Error::Invalid(format!(
                "acquire_all takes 1 to {MAX_KEYS} keys (got {})",
                keys.len()
            )));
        }
        let mut seen = std::collections::HashSet::new();
        if let Some((k, _)) = keys.iter().find(|(k, _)| !seen.insert(*k)) {
            return Err(Error::Invalid(format!("the key {k:?} is given twice")));
        }
        for (_, m) in keys {
            if let LockMode::Counted(n) = m {
                if !(1..=MAX_LIMIT).contains(n) {
                    return Err(Error::Invalid(format!(
                        "the limit of a counted lock must be 1 to {MAX_LIMIT} (got {n})"
                    )));
                }
            }
        }
        self.check_usable()?;
        let token = opts.token.clone().unwrap_or_else(new_token);
        let wait = opts.wait.filter(|w| !w.is_zero());
        let mut cmd = redis::cmd("LOCK.ACQUIREALL");
        cmd.arg(keys.len());
        for (k, _) in keys {
            cmd.arg(*k);
        }
        if keys.iter().any(|(_, m)| *m != LockMode::Exclusive) {
            cmd.arg("MODES");
            for (_, m) in keys {
                cmd.arg(mode_word(*m));
            }
        }
        cmd.arg("SESSION")
            .arg(&self.keeper.id)
            .arg("TOKEN")
            .arg(&token);
        if let Some(o) = opts.owner.as_deref().or(self.keeper.owner.as_deref()) {
            cmd.arg("OWNER").arg(o);
        }
        if let Some(w) = wait {
            cmd.arg("BLOCK").arg(millis(w));
        }
        let names: Vec<&str> = keys.iter().map(|(k, _)| *k).collect();
        let undo = || release_all_cmd(&names, &token);
        let what = if wait.is_some() {
            "LOCK.ACQUIREALL BLOCK"
        } else {
            "LOCK.ACQUIREALL"
        };
        let node = &self.keeper.node;
        let reply = node
            .grant(what, &cmd, names[0], undo(), wait, self.budget())
            .await
            .map_err(|e| self.failed(e, undo))?;
        let Some(fences) = parse_all(reply, &token, keys.len())? else {
            return Ok(None);
        };
        Ok(Some(
            keys.iter()
                .zip(fences)
                .map(|((k, m), f)| self.guard(k, *m, token.clone(), Some(f)))
                .collect(),
        ))
    }

    /// A keepalive now (the background one goes on as before): `Ok(true)` renewed;
    /// `Ok(false)` the session is not open on the server any more (the loss signal
    /// fires with [`LossReason::NotHeld`]).
    pub async fn keepalive(&self) -> Result<bool> {
        if !matches!(*self.status.borrow(), LeaseStatus::Held { .. }) {
            return Ok(false);
        }
        match self
            .keeper
            .keepalive(self.ttl, self.keeper.io_timeout())
            .await?
        {
            Some(d) => {
                mark_renewed(&self.status, d);
                Ok(true)
            }
            None => {
                mark_lost(&self.status, LossReason::NotHeld);
                Ok(false)
            }
        }
    }

    /// `LOCK.SESSION INFO`: its lease, binding and locks on the server; `None` when it is
    /// not open there any more.
    pub async fn info(&self) -> Result<Option<SessionInfo>> {
        self.keeper.info().await
    }

    /// Ends the session: `LOCK.SESSION CLOSE` releases every lock of it at once (their
    /// waiters served), and the keepalive stops. The number of locks released (0 when
    /// the session had already ended on the server). The guards of its locks turn
    /// `Released`. If the server cannot be reached the error is returned, and the
    /// session ends there with its lease (or its bind grace).
    pub async fn close(mut self) -> Result<u64> {
        let until = release_until(self.valid_until());
        self.stop();
        self.done = true;
        Ok(self.keeper.close_until(until).await?.unwrap_or(0))
    }

    fn stop(&mut self) {
        if let Some(t) = self.task.take() {
            t.abort();
        }
        self.status.send_replace(LeaseStatus::Released);
    }

    fn check_usable(&self) -> Result<()> {
        match &*self.status.borrow() {
            LeaseStatus::Held { .. } => Ok(()),
            _ => Err(Error::NoSession {
                node: self.keeper.node.label.clone(),
            }),
        }
    }

    fn budget(&self) -> ConfirmBudget {
        let o = &self.keeper.node.opts;
        ConfirmBudget {
            wait: o.confirm_timeout,
            limit: o.confirm_timeout + o.io_timeout,
        }
    }

    /// An acquire's error: `NOSESSION` ends the session here (the loss signal fires); a
    /// call that timed out may have been granted with its reply lost, so `undo` (the
    /// release of what it asked for) is sent in the background.
    fn failed(&self, e: Error, undo: impl FnOnce() -> Cmd) -> Error {
        let e = e.or_no_session();
        if e.is_no_session() {
            mark_lost(&self.status, LossReason::NotHeld);
        } else if matches!(e, Error::Timeout { .. }) {
            let (node, cmd) = (self.keeper.node.clone(), undo());
            tokio::spawn(async move {
                let call = crate::node::Call::once("release", &cmd, node.opts.io_timeout);
                let _ = node.run::<Value>(call).await;
            });
        }
        e
    }

    fn guard(&self, name: &str, mode: LockMode, token: String, fence: Option<u64>) -> LockGuard {
        LockGuard::in_session(
            self.keeper.node.clone(),
            name,
            mode,
            token,
            fence,
            self.ttl,
            &self.status,
        )
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let until = release_until(self.valid_until());
        self.stop();
        let keeper = self.keeper.clone();
        match tokio::runtime::Handle::try_current() {
            Ok(h) => {
                h.spawn(async move {
                    if let Err(e) = keeper.close_until(until).await {
                        log::warn!("close of a session on drop failed: {e}");
                    }
                });
            }
            Err(_) => log::warn!(
                "session dropped outside a tokio runtime: not closed, it ends with its lease"
            ),
        }
    }
}

fn release_cmd(key: &str, token: &str) -> Cmd {
    let mut c = redis::cmd("LOCK.RELEASE");
    c.arg(key).arg(token);
    c
}

fn release_all_cmd(keys: &[&str], token: &str) -> Cmd {
    let mut c = redis::cmd("LOCK.RELEASEALL");
    c.arg(keys.len());
    for k in keys {
        c.arg(*k);
    }
    c.arg(token);
    c
}

/// `[token, [fence, ...]]` or nil. Never puts the token into an error.
fn parse_all(v: Value, token: &str, n: usize) -> Result<Option<Vec<u64>>> {
    let bad = |what: &str| Error::Protocol(format!("LOCK.ACQUIREALL answered {what}"));
    let items = match v {
        Value::Nil => return Ok(None),
        Value::Array(items) if items.len() == 2 => items,
        _ => return Err(bad("neither [token, [fence, ...]] nor nil")),
    };
    let t = match &items[0] {
        Value::BulkString(b) => b.as_slice(),
        Value::SimpleString(s) => s.as_bytes(),
        _ => return Err(bad("a token that is not a string")),
    };
    if t != token.as_bytes() {
        return Err(bad("a token other than the one sent"));
    }
    let Value::Array(fences) = &items[1] else {
        return Err(bad("no list of fences"));
    };
    if fences.len() != n {
        return Err(bad("another number of fences than keys"));
    }
    fences
        .iter()
        .map(|f| match f {
            Value::Int(f) if *f > 0 => Ok(*f as u64),
            _ => Err(bad("a fence that is not a positive integer")),
        })
        .collect::<Result<Vec<u64>>>()
        .map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_are_checked() {
        let o = SessionOptions::new(Duration::from_secs(3));
        assert!(o.validate().is_ok());
        assert_eq!(o.interval_in_force(), Duration::from_secs(1));
        assert!(SessionOptions::new(Duration::ZERO).validate().is_err());
        assert!(o.clone().margin(Duration::from_secs(2)).validate().is_err());
        assert!(o
            .clone()
            .interval(Duration::from_secs(3))
            .validate()
            .is_err());
        assert!(o.clone().max_hold(Duration::ZERO).validate().is_err());
        assert!(o.clone().owner("").validate().is_err());
        assert!(o.bind(Duration::ZERO).validate().is_ok());
        let l = SessionLockOptions::new().token("s3cret-token-0123456789");
        assert!(!format!("{l:?}").contains("s3cret"));
        assert!(SessionLockOptions::new().limit(0).validate().is_err());
        assert_eq!(mode_word(LockMode::Counted(3)), "LIMIT=3");
    }

    #[test]
    fn acquireall_replies() {
        let bulk = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        let ok = Value::Array(vec![
            bulk("tok"),
            Value::Array(vec![Value::Int(5), Value::Int(6)]),
        ]);
        assert_eq!(parse_all(ok.clone(), "tok", 2).unwrap(), Some(vec![5, 6]));
        assert!(parse_all(ok.clone(), "other", 2).is_err());
        assert!(parse_all(ok, "tok", 3).is_err());
        assert_eq!(parse_all(Value::Nil, "tok", 2).unwrap(), None);
        assert!(parse_all(Value::Int(1), "tok", 1).is_err());
    }
}
