//! The guard of a held lock: its lease, the renewal task, and the loss signal.
//!
//! Every guard runs one small task that knows the lease deadline (as this client
//! computes it: the send time of the last successful acquire or extend, plus the TTL,
//! minus the drift allowance). With auto-renewal it extends the lease every third of
//! the TTL, never past the hold cap. The task turns the guard's status into
//! [`LeaseStatus::Lost`] as soon as a renewal is refused (`0`), fails, or the deadline
//! passes without one, and the loss signal ([`LockGuard::lost`]) fires.
//!
//! A [`Session`](crate::Session) runs the same task over its keepalive
//! (`LOCK.SESSION KEEPALIVE`) instead of a lock's `LOCK.EXTEND`; the guards of its locks
//! run none of their own: they follow the session's status.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::sleep_until;

use crate::error::{Error, Result};
use crate::node::Node;
use crate::options::{drift, millis, AcquireOptions, LockMode};
use crate::redlock::Quorum;
use crate::session::Keeper;

/// Why a lease ended while the guard still lived.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LossReason {
    /// A renewal was answered `0`: the lock is not held by this token any more (it
    /// expired, or an administrator ran LOCK.FORCERELEASE). For Redlock: fewer than a
    /// majority of nodes confirmed the renewal within the validity time.
    NotHeld,
    /// The lease was about to end without a successful renewal: the server did not
    /// answer in time (the signal comes the renewal's margin before the lease can end,
    /// [`Renewal::margin`](crate::Renewal)), or no renewal was configured (at the
    /// deadline).
    Expired,
    /// Automatic renewal stopped at the hold cap ([`Renewal::max_hold`](crate::Renewal));
    /// the signal comes the margin before the lease ends there.
    CapReached,
    /// A renewal failed: an error reply (at once), or a connection refused or reset on
    /// every try until the margin before the lease can end.
    Failed(String),
}

impl std::fmt::Display for LossReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LossReason::NotHeld => write!(f, "the lock is no longer held by this token"),
            LossReason::Expired => write!(
                f,
                "no renewal succeeded and the lease is about to end (or ended)"
            ),
            LossReason::CapReached => write!(f, "the hold cap was reached"),
            LossReason::Failed(e) => write!(f, "renewal failed: {e}"),
        }
    }
}

/// Where a lease stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseStatus {
    /// Held until `valid_until` (this client's conservative estimate) unless renewed.
    Held { valid_until: Instant },
    /// Lost; `valid_until` is the last deadline that was known to hold (it may still lie
    /// ahead after a failed renewal, but nothing promises that the lock survives).
    Lost {
        reason: LossReason,
        valid_until: Instant,
    },
    /// Released by this client (explicitly or on drop).
    Released,
}

impl LeaseStatus {
    /// True while `Held` and its deadline has not passed.
    pub fn is_held(&self) -> bool {
        matches!(*self, LeaseStatus::Held { valid_until } if Instant::now() < valid_until)
    }

    /// The last known lease deadline (held or lost); `None` once released.
    pub fn valid_until(&self) -> Option<Instant> {
        match *self {
            LeaseStatus::Held { valid_until } | LeaseStatus::Lost { valid_until, .. } => {
                Some(valid_until)
            }
            LeaseStatus::Released => None,
        }
    }
}

/// A cheap, cloneable handle on a guard's status, usable after the guard moved.
#[derive(Debug, Clone)]
pub struct LeaseWatch {
    rx: watch::Receiver<LeaseStatus>,
}

impl LeaseWatch {
    pub(crate) fn new(rx: watch::Receiver<LeaseStatus>) -> LeaseWatch {
        LeaseWatch { rx }
    }

    /// The current status.
    pub fn status(&self) -> LeaseStatus {
        self.rx.borrow().clone()
    }

    /// Resolves with the reason as soon as the lease is lost, or with `None` once the
    /// lock was released by this client (no loss).
    pub async fn lost(&mut self) -> Option<LossReason> {
        loop {
            match &*self.rx.borrow_and_update() {
                LeaseStatus::Lost { reason, .. } => return Some(reason.clone()),
                LeaseStatus::Released => return None,
                LeaseStatus::Held { .. } => {}
            }
            if self.rx.changed().await.is_err() {
                // Guard and task are gone: the guard was dropped, which releases.
                return match &*self.rx.borrow() {
                    LeaseStatus::Lost { reason, .. } => Some(reason.clone()),
                    _ => None,
                };
            }
        }
    }
}

/// Where a guard's lock lives: one server (or cluster), or a Redlock quorum; or the
/// lease a session's task renews (`LOCK.SESSION KEEPALIVE`: no key, no token).
#[derive(Clone)]
pub(crate) enum Backend {
    Single(Arc<Node>),
    Quorum(Arc<Quorum>),
    Session(Arc<Keeper>),
}

impl Backend {
    /// Extends to `ttl` from now. `Ok(Some(deadline))`: extended, the new conservative
    /// deadline; `Ok(None)`: not held by this token (Redlock: no majority in time).
    pub async fn extend(
        &self,
        key: &str,
        token: &str,
        ttl: Duration,
        limit: Duration,
    ) -> Result<Option<Instant>> {
        match self {
            Backend::Single(node) => {
                // Node::extend retries once on a fresh connection itself: an idle
                // connection closed by the server or a proxy is not a lost lease.
                let start = Instant::now();
                Ok(node
                    .extend(key, token, millis(ttl), limit, false)
                    .await?
                    .then(|| start + ttl.saturating_sub(drift(ttl))))
            }
            Backend::Quorum(q) => q.extend(key, token, ttl).await,
            Backend::Session(k) => k.keepalive(ttl, limit).await,
        }
    }

    /// One release within `limit`. `Ok(false)`: not held by this token (Redlock: not
    /// released on a majority).
    async fn release(&self, key: &str, token: &str, limit: Duration) -> Result<bool> {
        match self {
            Backend::Single(node) => node.release(key, token, limit).await,
            Backend::Quorum(q) => Ok(q.release(key, token).await >= q.quorum()),
            Backend::Session(k) => Ok(k.close(limit).await?.is_some()),
        }
    }

    /// Sets the lease to `left` from now and confirms it on the replicas (the end of a
    /// once-per-period hold), within `limit`. `Ok(false)`: not held by this token any
    /// more.
    async fn keep(&self, key: &str, token: &str, left: Duration, limit: Duration) -> Result<bool> {
        match self {
            Backend::Single(node) => node.extend(key, token, millis(left), limit, true).await,
            Backend::Quorum(q) => Ok(q.keep(key, token, left).await?.is_some()),
            Backend::Session(_) => Err(in_session("a hold")),
        }
    }

    /// The end of a guard: with `hold`, keep the lock until `hold` after `acquired_at`
    /// (release it when that has passed); without, release it. Tried again after a
    /// transient failure until `until` ([`settle`]).
    async fn finish(
        &self,
        key: &str,
        token: &str,
        acquired_at: Instant,
        hold: Option<Duration>,
        until: Instant,
    ) -> Result<bool> {
        settle(key, until, self.io_timeout(), |limit| async move {
            let left = hold.map(|h| (acquired_at + h).saturating_duration_since(Instant::now()));
            match left {
                Some(left) if left >= Duration::from_millis(1) => {
                    let kept = self.keep(key, token, left, limit).await?;
                    if kept {
                        log::debug!(
                            "{key}: kept for the rest of its hold ({} ms)",
                            left.as_millis()
                        );
                    }
                    Ok(kept)
                }
                _ => self.release(key, token, limit).await,
            }
        })
        .await
    }

    fn io_timeout(&self) -> Duration {
        match self {
            Backend::Single(node) => node.opts.io_timeout,
            Backend::Quorum(q) => q.io_timeout(),
            Backend::Session(k) => k.io_timeout(),
        }
    }
}

/// A held lock. Dropping it stops renewal and releases the lock in a spawned task (best
/// effort); [`release`](Self::release) does it and reports the outcome.
pub struct LockGuard {
    backend: Backend,
    name: String,
    token: String,
    fence: Option<u64>,
    mode: LockMode,
    ttl: Duration,
    acquired_at: Instant,
    /// Once per period: keep the lock until this long after `acquired_at`.
    hold: Option<Duration>,
    status: Arc<watch::Sender<LeaseStatus>>,
    task: Option<JoinHandle<()>>,
    done: bool,
    /// Taken in a session: its lease is the session's (no extend, no hold).
    in_session: bool,
}

/// What a lock of a session refuses: its lease is the session's.
fn in_session(what: &str) -> Error {
    Error::Invalid(format!(
        "the lock was taken in a session: its lease is the session's (Session::keepalive \
         renews every lock of it); {what} is refused"
    ))
}

debug_shows!(
    LockGuard {
        name,
        fence,
        mode,
        ttl,
        status: now(status)
    }..
);

/// Where the lease stands now (for `Debug`).
fn now(status: &Arc<watch::Sender<LeaseStatus>>) -> LeaseStatus {
    status.borrow().clone()
}

impl LockGuard {
    /// Starts the lease task for a lock taken as `opts` says (its mode, TTL and
    /// renewal). `acquired_at` is when the acquisition started (the cap counts from
    /// there), `valid_until` the lease deadline it established.
    pub(crate) fn start(
        backend: Backend,
        name: &str,
        opts: &AcquireOptions,
        token: String,
        fence: Option<u64>,
        acquired_at: Instant,
        valid_until: Instant,
    ) -> LockGuard {
        let (name, mode, ttl) = (name.to_string(), opts.mode, opts.ttl);
        let (tx, _) = watch::channel(LeaseStatus::Held { valid_until });
        let status = Arc::new(tx);
        let plan = opts
            .renew
            .zip(opts.renew_interval())
            .map(|(r, interval)| Plan {
                interval,
                cap_at: Some(acquired_at + r.max_hold),
                margin: opts.loss_margin(),
            });
        let task = tokio::spawn(lease_task(
            backend.clone(),
            name.clone(),
            token.clone(),
            ttl,
            plan,
            status.clone(),
        ));
        LockGuard {
            backend,
            name,
            token,
            fence,
            mode,
            ttl,
            acquired_at,
            hold: opts.hold,
            status,
            task: Some(task),
            done: false,
            in_session: false,
        }
    }

    /// The guard of a lock granted in a session whose status is `session`: no lease
    /// task of its own; a small task copies the session's status (its renewed
    /// deadline, its loss, its close) into the guard's.
    pub(crate) fn in_session(
        node: Arc<Node>,
        name: &str,
        mode: LockMode,
        token: String,
        fence: Option<u64>,
        ttl: Duration,
        session: &watch::Sender<LeaseStatus>,
    ) -> LockGuard {
        let (tx, _) = watch::channel(session.borrow().clone());
        let status = Arc::new(tx);
        let task = tokio::spawn(follow(session.subscribe(), status.clone()));
        LockGuard {
            backend: Backend::Single(node),
            name: name.to_string(),
            token,
            fence,
            mode,
            ttl,
            acquired_at: Instant::now(),
            hold: None,
            status,
            task: Some(task),
            done: false,
            in_session: true,
        }
    }

    /// The lock's name (its key).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The secret token that holds the lock (needed to release or extend it elsewhere).
    pub fn token(&self) -> &str {
        &self.token
    }

    /// The fencing token: pass it to the store you write to, which rejects writes with a
    /// fence lower than the highest it has seen. `None` where the module is not loaded
    /// (the classic fallback), or for Redlock without a majority of module nodes.
    pub fn fence(&self) -> Option<u64> {
        self.fence
    }

    /// The kind of lock held: exclusive, a shared holder, or one permit of a counted
    /// lock. Each holder of a shared or counted lock has its own guard, token, fence and
    /// lease.
    pub fn mode(&self) -> LockMode {
        self.mode
    }

    /// The lease length asked for.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// When the acquisition started.
    pub fn acquired_at(&self) -> Instant {
        self.acquired_at
    }

    pub fn status(&self) -> LeaseStatus {
        self.status.borrow().clone()
    }

    /// True while the status is `Held` and its deadline has not passed.
    pub fn is_held(&self) -> bool {
        self.status.borrow().is_held()
    }

    /// The last known lease deadline (held or not).
    pub fn valid_until(&self) -> Option<Instant> {
        self.status.borrow().valid_until()
    }

    /// A handle on the status that outlives borrows of the guard.
    pub fn watch(&self) -> LeaseWatch {
        LeaseWatch {
            rx: self.status.subscribe(),
        }
    }

    /// The loss signal: resolves with the reason as soon as the lease is lost (`None`
    /// if the guard is released first). `'static`, so it fits in `tokio::select!` next
    /// to the work it guards.
    pub fn lost(&self) -> impl Future<Output = Option<LossReason>> + Send + 'static {
        let mut w = self.watch();
        async move { w.lost().await }
    }

    /// Extends the lease to `ttl` from now by hand (not bounded by the renewal cap).
    /// `Ok(false)`: not held any more (the status turns `Lost(NotHeld)`).
    pub async fn extend(&self, ttl: Duration) -> Result<bool> {
        crate::options::check_ttl(ttl)?;
        if self.in_session {
            return Err(in_session("extend"));
        }
        if !matches!(*self.status.borrow(), LeaseStatus::Held { .. }) {
            return Ok(false);
        }
        let limit = self.backend.io_timeout();
        match self
            .backend
            .extend(&self.name, &self.token, ttl, limit)
            .await?
        {
            Some(d) => {
                self.status.send_if_modified(|s| match s {
                    LeaseStatus::Held { valid_until } => {
                        *valid_until = d;
                        true
                    }
                    _ => false,
                });
                Ok(true)
            }
            None => {
                mark_lost(&self.status, LossReason::NotHeld);
                Ok(false)
            }
        }
    }

    /// A guarded command: runs `cmd` only while this guard's token holds the lock, in
    /// one atomic step on the server (`LOCK.IFHELD name token cmd ...`), and returns its
    /// reply. When the token does not hold the lock any more (the lease ended, it was
    /// released or force-released) nothing runs, the status turns
    /// `Lost(NotHeld)` (the loss signal fires) and the error is [`Error::NotHeld`].
    /// A write that carries no risk of landing after the next holder's: use it for the
    /// data the lock protects when that data lives on the lock's server (in a cluster,
    /// in the lock key's slot: `lock:{order:7}` and `stock:{order:7}`).
    ///
    /// The command is sent once (it may not be idempotent). Its own errors
    /// (`WRONGTYPE`, ...) come back as [`Error::Redis`]; blocking commands, transactions
    /// and scripts are refused by the server. Only for a lock on one server (or
    /// cluster): a Redlock guard is [`Error::Invalid`].
    ///
    /// ```no_run
    /// # async fn demo(guard: &redis_lock_client::LockGuard) -> redis_lock_client::Result<()> {
    /// let left: i64 = guard
    ///     .if_held(redis::cmd("DECRBY").arg("stock:9001").arg(1))
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub async fn if_held<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> Result<T> {
        let Backend::Single(node) = &self.backend else {
            return Err(Error::Invalid(
                "guarded commands need a lock on one server (LockClient), not a Redlock quorum"
                    .into(),
            ));
        };
        let c = crate::node::guarded_cmd("LOCK.IFHELD", &self.name, self.token.as_bytes(), cmd)?;
        match node.guarded::<T>("LOCK.IFHELD", &c, &self.name).await {
            Err(e) if e.is_not_held() => {
                mark_lost(&self.status, LossReason::NotHeld);
                Err(e)
            }
            r => r,
        }
    }

    /// `LOCK.CHECK name fence` with this guard's fence: `true` while the server counts
    /// this grant as a holder. A check followed by a separate write is still a race;
    /// [`if_held`](Self::if_held) checks and writes in one step.
    pub async fn check(&self) -> Result<bool> {
        let (Backend::Single(node), Some(fence)) = (&self.backend, self.fence) else {
            return Err(Error::Invalid(
                "LOCK.CHECK needs a module lock on one server (LockClient) with a fence".into(),
            ));
        };
        node.check(&self.name, fence).await
    }

    /// `LOCK.EXTEND name token PX ttl OWNER owner` (a leader's proclaim): the lease to
    /// `ttl` from now and a new label, the fence kept. `Ok(false)`, without I/O, when
    /// the guard is no longer `Held`; a `0` from the server turns it `Lost(NotHeld)`.
    pub(crate) async fn extend_labelled(&self, ttl: Duration, owner: &str) -> Result<bool> {
        let Backend::Single(node) = &self.backend else {
            return Err(Error::Invalid(
                "a new label needs a lock on one server (LockClient)".into(),
            ));
        };
        if self.in_session {
            return Err(in_session("a new label"));
        }
        if !matches!(*self.status.borrow(), LeaseStatus::Held { .. }) {
            return Ok(false);
        }
        let start = Instant::now();
        if node
            .extend_owner(
                &self.name,
                &self.token,
                millis(ttl),
                owner,
                node.opts.io_timeout,
            )
            .await?
        {
            let d = start + ttl.saturating_sub(drift(ttl));
            mark_renewed(&self.status, d);
            Ok(true)
        } else {
            mark_lost(&self.status, LossReason::NotHeld);
            Ok(false)
        }
    }

    /// The server of a lock on one server (`None` for Redlock).
    pub(crate) fn node(&self) -> Option<&Arc<Node>> {
        match &self.backend {
            Backend::Single(n) => Some(n),
            Backend::Quorum(_) | Backend::Session(_) => None,
        }
    }

    /// Stops renewal and releases the lock. `Ok(true)`: it was still held (Redlock: by
    /// a majority of nodes) and is now free. With [`AcquireOptions::hold`] it does what
    /// [`release_after`](Self::release_after) does with that hold.
    pub async fn release(self) -> Result<bool> {
        let hold = self.hold;
        self.finish(hold).await
    }

    /// Stops renewal and gives the lock up: released, or with `hold` kept until the hold
    /// ends; a transient failure is tried again within what is left of the lease
    /// ([`release_until`]).
    async fn finish(mut self, hold: Option<Duration>) -> Result<bool> {
        let until = release_until(self.valid_until());
        self.stop();
        self.done = true;
        self.backend
            .finish(&self.name, &self.token, self.acquired_at, hold, until)
            .await
    }

    /// Once per period: stops renewal and keeps the lock until `hold` after the
    /// acquisition. The lease is set to what is left of `hold` (`LOCK.EXTEND`, confirmed
    /// on the replicas like a grant), so that a job that took the lock at the start of
    /// its period is not run again in that period by another machine whose clock or
    /// scheduler is a little late; nobody needs to release it. When `hold` has already
    /// passed the lock is released. `Ok(true)`: it was still held (and is now kept, or
    /// free); `Ok(false)`: it was not held by this guard any more.
    pub async fn release_after(self, hold: Duration) -> Result<bool> {
        crate::options::check_ttl(hold)?;
        if self.in_session {
            return Err(in_session("a hold"));
        }
        self.finish(Some(hold)).await
    }

    /// Releases the lock now, whatever [`AcquireOptions::hold`] says (e.g. when the
    /// work could not even start).
    pub async fn release_now(self) -> Result<bool> {
        self.finish(None).await
    }

    /// The once-per-period hold (see [`AcquireOptions::hold`]).
    pub fn hold(&self) -> Option<Duration> {
        self.hold
    }

    /// Stops watching and renewing, and keeps the lock: it stays held until its lease
    /// ends or someone releases it with the token (what `redis-lock acquire` does).
    /// Returns the token and the fence.
    pub fn detach(mut self) -> (String, Option<u64>) {
        if let Some(t) = self.task.take() {
            t.abort();
        }
        self.done = true;
        (std::mem::take(&mut self.token), self.fence)
    }

    fn stop(&mut self) {
        if let Some(t) = self.task.take() {
            t.abort();
        }
        self.status.send_replace(LeaseStatus::Released);
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        // Released already: by its session's close (nothing left to give back).
        if self.done || matches!(*self.status.borrow(), LeaseStatus::Released) {
            return;
        }
        let until = release_until(self.valid_until());
        self.stop();
        let backend = self.backend.clone();
        let name = std::mem::take(&mut self.name);
        let token = std::mem::take(&mut self.token);
        let (acquired_at, hold) = (self.acquired_at, self.hold);
        match tokio::runtime::Handle::try_current() {
            Ok(h) => {
                h.spawn(async move {
                    let end = backend.finish(&name, &token, acquired_at, hold, until);
                    if let Err(e) = end.await {
                        log::warn!("release of {name:?} on drop failed: {e}");
                    }
                });
            }
            Err(_) => log::warn!(
                "lock {name:?} dropped outside a tokio runtime: not released, its lease ends by itself"
            ),
        }
    }
}

/// A renewal came back: `Held` until `d`, if that is later than what was known.
pub(crate) fn mark_renewed(status: &watch::Sender<LeaseStatus>, d: Instant) {
    status.send_if_modified(|s| match s {
        LeaseStatus::Held { valid_until } if d > *valid_until => {
            *valid_until = d;
            true
        }
        _ => false,
    });
}

pub(crate) fn mark_lost(status: &watch::Sender<LeaseStatus>, reason: LossReason) {
    status.send_if_modified(|s| match s {
        LeaseStatus::Held { valid_until } => {
            *s = LeaseStatus::Lost {
                reason,
                valid_until: *valid_until,
            };
            true
        }
        _ => false,
    });
}

fn current_deadline(status: &watch::Sender<LeaseStatus>) -> Option<Instant> {
    match *status.borrow() {
        LeaseStatus::Held { valid_until } => Some(valid_until),
        _ => None,
    }
}

/// What the lease task needs to renew.
pub(crate) struct Plan {
    interval: Duration,
    /// No renewal reaches past this (`None`: no cap).
    cap_at: Option<Instant>,
    /// The loss signal fires this long before the lease can end when it was not renewed.
    margin: Duration,
}

impl Plan {
    pub(crate) fn new(interval: Duration, margin: Duration, cap_at: Option<Instant>) -> Plan {
        Plan {
            interval,
            cap_at,
            margin,
        }
    }

    /// The lease a renewal at `at` may ask for: `ttl`, or less up to the cap.
    fn ttl_at(&self, ttl: Duration, at: Instant) -> Duration {
        match self.cap_at {
            Some(cap) => ttl.min(cap.saturating_duration_since(at)),
            None => ttl,
        }
    }

    /// The pause before another try after a failed renewal.
    fn retry_pause(&self) -> Duration {
        (self.interval / 4).clamp(Duration::from_millis(10), Duration::from_millis(500))
    }
}

/// A failed renewal or release that may succeed when tried again: no answer in time, a
/// connection refused or reset (a server restarting, a Sentinel failover), too few
/// Redlock nodes, Sentinels that name no usable primary yet (mid-failover: the old one
/// is down, the replica not yet promoted). Not a wrong user or password, nor any
/// error reply (`NOPERM`, `WRONGTYPE`, ...): trying again gets the same answer.
fn retryable(e: &Error) -> bool {
    let auth = matches!(e, Error::Redis { error, .. }
        if error.kind() == redis::ErrorKind::AuthenticationFailed);
    matches!(e, Error::Timeout { .. } | Error::NoQuorum { .. })
        || (e.is_connection_error() && !auth)
        || e.is_failover_pending()
}

/// How long a release (a hold's keep, a session's close) that met a transient failure
/// is tried again at most, within what is left of the lease.
pub(crate) const RELEASE_RETRY_FOR: Duration = Duration::from_secs(5);

/// Until when a release of a lease valid until `valid_until` (`None`: not known, a
/// release by token) is tried again: [`RELEASE_RETRY_FOR`] from now, or the lease's
/// end if that comes first (the server frees the lock by itself then).
pub(crate) fn release_until(valid_until: Option<Instant>) -> Instant {
    let now = Instant::now();
    let left = valid_until.map_or(RELEASE_RETRY_FOR, |v| v.saturating_duration_since(now));
    now + left.min(RELEASE_RETRY_FOR)
}

/// The one retry of releases (a guard's release, release_now, release_after and drop,
/// a release by token, a session's close): runs `attempt` (given the time it may take:
/// the I/O timeout `limit`, less near `until`); after a [retryable] failure (a dead
/// connection, a Sentinel failover still settling) it is run again, after 50 ms, then
/// twice as long each time up to 500 ms, while the next try starts before `until`. The
/// first try always runs. Each try goes through the node's own reconnection (a
/// connection that failed is remade, the primary asked of the Sentinels anew); any
/// other outcome is returned at once. `what` names it in the log.
pub(crate) async fn settle<T, F, Fut>(
    what: &str,
    until: Instant,
    limit: Duration,
    mut attempt: F,
) -> Result<T>
where
    F: FnMut(Duration) -> Fut,
    Fut: Future<Output = Result<T>>,
{
    let mut pause = Duration::from_millis(50);
    let mut left = limit;
    loop {
        let e = match attempt(left).await {
            Err(e) if retryable(&e) => e,
            r => return r,
        };
        if Instant::now() + pause >= until {
            return Err(e);
        }
        log::debug!(
            "{what}: release failed ({e}); trying again in {} ms",
            pause.as_millis()
        );
        tokio::time::sleep(pause).await;
        left = limit.min(until.saturating_duration_since(Instant::now()));
        pause = (pause * 2).min(Duration::from_millis(500));
    }
}

/// The task of a session: [`lease_task`] over its keepalive.
pub(crate) fn spawn_keepalive(
    keeper: Arc<Keeper>,
    ttl: Duration,
    plan: Plan,
    status: Arc<watch::Sender<LeaseStatus>>,
) -> JoinHandle<()> {
    let backend = Backend::Session(keeper);
    tokio::spawn(lease_task(
        backend,
        "session".into(),
        String::new(),
        ttl,
        Some(plan),
        status,
    ))
}

/// The task of a session's lock: the session's status, copied into the lock's until
/// either is no longer `Held` (the lock released by hand stops it too).
async fn follow(
    mut session: watch::Receiver<LeaseStatus>,
    status: Arc<watch::Sender<LeaseStatus>>,
) {
    let mut own = status.subscribe();
    loop {
        let now = session.borrow_and_update().clone();
        let go_on = matches!(now, LeaseStatus::Held { .. });
        let copied = status.send_if_modified(|s| match s {
            LeaseStatus::Held { .. } => {
                *s = now;
                true
            }
            _ => false,
        });
        if !go_on || !copied {
            return;
        }
        own.borrow_and_update();
        tokio::select! {
            changed = session.changed() => {
                if changed.is_err() {
                    // The session (and its task) are gone without a word: dropped.
                    status.send_if_modified(|s| match s {
                        LeaseStatus::Held { .. } => {
                            *s = LeaseStatus::Released;
                            true
                        }
                        _ => false,
                    });
                    return;
                }
            }
            _ = own.changed() => {
                if !matches!(*own.borrow(), LeaseStatus::Held { .. }) {
                    return;
                }
            }
        }
    }
}

async fn lease_task(
    backend: Backend,
    name: String,
    token: String,
    ttl: Duration,
    plan: Option<Plan>,
    status: Arc<watch::Sender<LeaseStatus>>,
) {
    let mut rx = status.subscribe();
    let margin = plan.as_ref().map_or(Duration::ZERO, |p| p.margin);
    // When the next renewal is due (pushed back after each success, brought forward to
    // a short pause after a failure that may pass).
    let mut due = plan.as_ref().map(|p| Instant::now() + p.interval);
    // True once renewal reached the cap: the lease then runs out, as CapReached.
    let mut capped = false;
    // The last renewal that failed (while retrying): the reason if none succeeds.
    let mut failure: Option<String> = None;
    loop {
        rx.borrow_and_update();
        let Some(deadline) = current_deadline(&status) else {
            return;
        };
        let now = Instant::now();
        // The loss signal comes `margin` before the lease can end.
        let lose_at = deadline.checked_sub(margin).unwrap_or(now);
        if now >= lose_at {
            let reason = match (capped, failure.take()) {
                (true, _) => LossReason::CapReached,
                (false, Some(e)) => LossReason::Failed(e),
                (false, None) => LossReason::Expired,
            };
            mark_lost(&status, reason);
            return;
        }
        // When to wake: the next renewal if it would move the deadline, else the loss.
        let mut renew_at = None;
        // After a failure, a retry not due before the loss is not made (no busy loop).
        let retry_too_late = failure.is_some() && due.is_some_and(|d| d >= lose_at);
        if let (Some(p), false, Some(d), false) = (&plan, capped, due, retry_too_late) {
            // A lease that ends before the next renewal (a manual extend): renew now.
            let at = if d >= lose_at { now } else { d.max(now) };
            let ttl_then = p.ttl_at(ttl, at);
            let reach = at + ttl_then.saturating_sub(drift(ttl_then));
            if ttl_then >= Duration::from_millis(1) && reach > deadline {
                renew_at = Some(at);
            } else {
                capped = true;
            }
        }
        let wake = renew_at.unwrap_or(lose_at);
        tokio::select! {
            _ = sleep_until(wake.into()) => {}
            changed = rx.changed() => {
                if changed.is_err() {
                    return;
                }
                continue; // a manual extend or a release: re-read the status
            }
        }
        let (Some(p), Some(_)) = (&plan, renew_at) else {
            continue; // the loss time: the top of the loop declares the loss
        };
        let now = Instant::now();
        let Some(deadline) = current_deadline(&status) else {
            return;
        };
        let lose_at = deadline.checked_sub(margin).unwrap_or(now);
        if now >= lose_at {
            continue;
        }
        let ttl_now = p.ttl_at(ttl, now);
        if ttl_now < Duration::from_millis(1) {
            capped = true;
            continue;
        }
        // One attempt, bounded by the I/O timeout and the time left before the loss.
        let limit = backend.io_timeout().min(lose_at - now);
        match backend.extend(&name, &token, ttl_now, limit).await {
            Ok(Some(d)) => {
                mark_renewed(&status, d);
                log::debug!("{name}: lease renewed for {} ms", ttl_now.as_millis());
                failure = None;
                due = Some(now + p.interval);
                // The last stretch, up to the cap: no renewal after this one.
                capped = ttl_now < ttl;
            }
            Ok(None) => {
                mark_lost(&status, LossReason::NotHeld);
                return;
            }
            Err(e) if retryable(&e) => {
                log::debug!("{name}: renewal failed ({e}); trying again");
                failure = (!matches!(e, Error::Timeout { .. })).then(|| e.to_string());
                due = Some(Instant::now() + p.retry_pause());
            }
            Err(e) => {
                mark_lost(&status, LossReason::Failed(e.to_string()));
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn redis_error(e: redis::RedisError) -> Error {
        Error::redis("127.0.0.1:26379", e)
    }

    /// A renewal during a Sentinel failover (no primary named yet) is tried again; a
    /// refusal by the server is not.
    #[test]
    fn a_failover_in_progress_is_retried_and_a_refusal_is_not() {
        let pending = redis_error(redis::RedisError::from((
            redis::ErrorKind::MasterNameNotFoundBySentinel,
            "Master with given name not found in sentinel",
        )));
        assert!(retryable(&pending));
        assert!(pending.is_failover_pending());
        let refused = match redis::parse_redis_value(b"-ERR no such lock\r\n") {
            Ok(redis::Value::ServerError(e)) => redis_error(e.into()),
            other => panic!("{other:?}"),
        };
        assert!(!retryable(&refused));
        assert!(!refused.is_failover_pending());
        let auth = redis_error(redis::RedisError::from((
            redis::ErrorKind::AuthenticationFailed,
            "WRONGPASS",
        )));
        assert!(auth.is_connection_error() && !retryable(&auth));
    }

    /// `settle` tries again after a transient failure only, and gives up with the
    /// last error once the next try would start after its deadline.
    #[tokio::test]
    async fn settle_tries_again_after_transient_failures_only() {
        use std::sync::atomic::{AtomicU32, Ordering::Relaxed};
        let pending = || {
            redis_error(redis::RedisError::from((
                redis::ErrorKind::MasterNameNotFoundBySentinel,
                "Master with given name not found in sentinel",
            )))
        };
        let io = Duration::from_secs(2);
        let tries = AtomicU32::new(0);
        let count = || tries.fetch_add(1, Relaxed) + 1;
        // Not held (0): once.
        let until = Instant::now() + Duration::from_secs(5);
        let r = settle("k", until, io, |_| async { Ok::<_, Error>(count() > 1) }).await;
        assert!(!r.unwrap());
        assert_eq!(tries.load(Relaxed), 1);
        // Pending twice, then released.
        tries.store(0, Relaxed);
        let r = settle("k", until, io, |_| async {
            if count() < 3 {
                Err(pending())
            } else {
                Ok(true)
            }
        })
        .await;
        assert!(r.unwrap());
        assert_eq!(tries.load(Relaxed), 3);
        // Never settles: tried again until the deadline, then the error.
        tries.store(0, Relaxed);
        let until = Instant::now() + Duration::from_millis(400);
        let r: Result<bool> = settle("k", until, io, |limit| {
            assert!(limit <= io);
            count();
            async { Err(pending()) }
        })
        .await;
        assert!(r.unwrap_err().is_failover_pending());
        assert!(tries.load(Relaxed) >= 2);
        assert!(Instant::now() + Duration::from_millis(500) >= until);
        // An error reply: once, even with time left.
        tries.store(0, Relaxed);
        let until = Instant::now() + Duration::from_secs(5);
        let r: Result<bool> = settle("k", until, io, |_| {
            count();
            async { Err(Error::Invalid("no".into())) }
        })
        .await;
        assert!(matches!(r, Err(Error::Invalid(_))));
        assert_eq!(tries.load(Relaxed), 1);
    }
}
