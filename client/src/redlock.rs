//! Redlock: a lock held on a majority of N independent servers, with quorum fencing.
//!
//! Acquisition (one attempt):
//! 1. take the start time; send `LOCK.ACQUIRE key PX ttl TOKEN t` to every node at once,
//!    each with a short time limit;
//! 2. the attempt holds if a majority (N/2+1) granted and the validity
//!    `ttl - elapsed - drift` (drift = 1 % of ttl + 2 ms) is still positive;
//! 3. quorum fencing: F = the highest fence among the grants. Every granting node whose
//!    fence is lower gets `LOCK.ACQUIRE key PX <ttl left> TOKEN t MINFENCE F`, an
//!    idempotent renew that keeps that node's fence but raises its counter to >= F, so
//!    every later grant there exceeds F. The lock counts only if a majority of nodes is
//!    then known to have a counter >= F (round 2 succeeded or its fence was F already),
//!    still within the validity; its fence is F. Any later majority shares a node with
//!    that one, so any later quorum fence is > F;
//! 4. otherwise release on every node (also those that timed out: a late grant may
//!    still be applied) and retry after a random delay while the wait lasts. When
//!    fewer than a majority answered at all (granted or said "held"), the outcome is
//!    [`Error::NoQuorum`], not "held elsewhere".
//!
//! Extend and release go to every node the same way; an extension counts only if a
//! majority confirms it within the new validity.
//!
//! **Modes.** Exclusive and shared locks ([`AcquireOptions::shared`]) work over a
//! quorum; counted locks ([`AcquireOptions::limit`]) do not, and are refused:
//!
//! - *Shared is safe.* A writer holds a majority of nodes and a reader needs a majority
//!   too; any two majorities share a node, and that node refuses one of the two. Readers
//!   coexist on every node, so any number of them can hold majorities at once. (Redlock
//!   waits by retrying, not in the module's FIFO queue, so a stream of overlapping
//!   readers can keep a writer out; on one server the queue prevents that.)
//! - *Counted is not.* Each node grants its own `n` permits, and a holder needs only a
//!   majority of them. With N = 2k+1 nodes, holders that reach only some of the nodes
//!   (the partial failures Redlock is meant to survive) can spread over them so that
//!   each node's permits are all used while every holder has k+1 nodes: up to
//!   `floor(n·N / (k+1))` holders at once, which is more than `n` for every `n >= 2`
//!   and tends to `2n - 1` as N grows (e.g. 3 holders of a `LIMIT 2` on 3 or 5 nodes).
//!   A semaphore that admits more than `n` is no semaphore, so
//!   [`Redlock::acquire_with`] answers [`Error::Invalid`] for it. Use a counted lock on
//!   one server (with a replica) instead.
//!
//! An error that retrying cannot fix ([`Error::is_usage_error`]: `WRONGMODE`,
//! `LIMITMISMATCH`, a shared lock asked of a node without the module) from any node ends
//! the acquisition with that error, after releasing on every node.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::future::join_all;

use crate::error::{Error, Result};
use crate::info::LockInfo;
use crate::lease::{Backend, LockGuard};
use crate::node::{jitter, new_token, Acquire, ConfirmBudget, Node};
use crate::options::{check_ttl, drift, millis, AcquireOptions, ClientOptions, LockMode};

/// Redlock settings.
#[derive(Debug, Clone)]
pub struct RedlockOptions {
    /// Connect timeout (bounded by the per-node limit) and the limit for `info`.
    pub client: ClientOptions,
    /// Limit for one node's reply to an acquire, extend or release. `None`: a tenth of
    /// the TTL, at least 50 ms and at most 1 s. Keep it well below the TTL.
    pub node_timeout: Option<Duration>,
    /// Pause between attempts while waiting: `retry_delay` ± `retry_jitter`, random.
    pub retry_delay: Duration,
    pub retry_jitter: Duration,
}

impl Default for RedlockOptions {
    fn default() -> Self {
        RedlockOptions {
            client: ClientOptions {
                cluster: Some(false),
                ..ClientOptions::default()
            },
            node_timeout: None,
            retry_delay: Duration::from_millis(150),
            retry_jitter: Duration::from_millis(100),
        }
    }
}

/// The nodes and settings, shared by a [`Redlock`] and its guards.
pub(crate) struct Quorum {
    nodes: Vec<Arc<Node>>,
    opts: RedlockOptions,
}

/// One attempt's outcome when it holds.
struct Held {
    fence: Option<u64>,
    valid_until: Instant,
}

impl Quorum {
    pub fn quorum(&self) -> usize {
        self.nodes.len() / 2 + 1
    }

    pub fn io_timeout(&self) -> Duration {
        self.opts.client.io_timeout
    }

    fn node_timeout(&self, ttl: Duration) -> Duration {
        self.opts
            .node_timeout
            .unwrap_or_else(|| (ttl / 10).clamp(Duration::from_millis(50), Duration::from_secs(1)))
    }

    /// A node's confirmation may wait at most the confirm timeout, and never past the
    /// validity left; on the client it is bounded by that plus the node's limit.
    fn confirm_budget(&self, limit: Duration, left: Duration) -> ConfirmBudget {
        let wait = self.opts.client.confirm_timeout.min(left);
        ConfirmBudget {
            wait,
            limit: wait + limit,
        }
    }

    fn release_timeout(&self) -> Duration {
        self.opts.node_timeout.unwrap_or(Duration::from_millis(250))
    }

    /// Releases on every node; returns how many released a lock held by `token`.
    pub async fn release(&self, key: &str, token: &str) -> usize {
        let limit = self.release_timeout();
        let results = join_all(self.nodes.iter().map(|n| n.release(key, token, limit))).await;
        let mut released = 0;
        for (n, r) in self.nodes.iter().zip(results) {
            match r {
                Ok(true) => released += 1,
                Ok(false) => {}
                Err(e) => log::debug!("{}: release of {key:?} failed: {e}", n.label),
            }
        }
        released
    }

    /// Extends on every node. `Ok(Some(deadline))` when a majority confirmed within the
    /// new validity; `Ok(None)` when a majority answered but not enough still held it;
    /// `Err(NoQuorum)` when fewer than a majority answered at all.
    pub async fn extend(&self, key: &str, token: &str, ttl: Duration) -> Result<Option<Instant>> {
        self.extend_on_all(key, token, ttl, false).await
    }

    /// [`extend`](Self::extend) for the end of a once-per-period hold: each node's new
    /// lease counts only once that node's replicas confirmed it.
    pub async fn keep(&self, key: &str, token: &str, ttl: Duration) -> Result<Option<Instant>> {
        self.extend_on_all(key, token, ttl, true).await
    }

    async fn extend_on_all(
        &self,
        key: &str,
        token: &str,
        ttl: Duration,
        confirmed: bool,
    ) -> Result<Option<Instant>> {
        let start = Instant::now();
        let valid_until = start + ttl.saturating_sub(drift(ttl));
        let limit = self
            .node_timeout(ttl)
            .min(valid_until.saturating_duration_since(start));
        let ms = millis(ttl);
        let results = join_all(
            self.nodes
                .iter()
                .map(|n| n.extend(key, token, ms, limit, confirmed)),
        )
        .await;
        let (mut ok, mut answered, mut error) = (0, 0, String::new());
        for (n, r) in self.nodes.iter().zip(results) {
            match r {
                Ok(held) => {
                    answered += 1;
                    ok += usize::from(held);
                }
                Err(e) => {
                    log::debug!("{}: extend of {key:?} failed: {e}", n.label);
                    error = format!("{}: {e}", n.label);
                }
            }
        }
        if ok >= self.quorum() && Instant::now() < valid_until {
            return Ok(Some(valid_until));
        }
        if answered < self.quorum() {
            return Err(Error::NoQuorum {
                answered,
                needed: self.quorum(),
                error,
            });
        }
        Ok(None)
    }

    /// One acquisition attempt (steps 1-4 of the module docs, without the retry).
    /// `Err` only for an error retrying cannot fix (see [`Error::is_usage_error`]).
    async fn attempt(
        &self,
        key: &str,
        token: &str,
        ttl: Duration,
        owner: Option<&str>,
        mode: LockMode,
    ) -> Result<Option<Held>> {
        let start = Instant::now();
        let valid_until = start + ttl.saturating_sub(drift(ttl));
        let left = || valid_until.saturating_duration_since(Instant::now());
        let limit = self.node_timeout(ttl).min(left());
        let req = Acquire {
            key,
            token,
            ttl_ms: millis(ttl),
            owner,
            mode,
            session: None,
        };

        // Round 1: every node at once. A node's grant counts once its replicas confirmed
        // it (if it has any; see `Confirm`): a node that fails over keeps it.
        let budget = self.confirm_budget(limit, left());
        let results = join_all(
            self.nodes
                .iter()
                .map(|n| n.try_acquire(&req, None, limit, budget)),
        )
        .await;
        let mut granted: Vec<(usize, Option<u64>)> = Vec::new();
        let (mut busy, mut usage, mut failed) = (0, None, None);
        for (i, r) in results.into_iter().enumerate() {
            match r {
                Ok(Some(g)) => granted.push((i, g.fence)),
                Ok(None) => busy += 1,
                Err(e) if e.is_usage_error() => {
                    log::debug!("{}: acquire of {key:?} refused: {e}", self.nodes[i].label);
                    usage.get_or_insert(e);
                }
                Err(e) => {
                    log::debug!("{}: acquire of {key:?} failed: {e}", self.nodes[i].label);
                    failed.get_or_insert_with(|| e.to_string());
                }
            }
        }
        if let Some(e) = usage {
            self.release(key, token).await;
            return Err(e);
        }
        if granted.len() < self.quorum() || left().is_zero() {
            self.release(key, token).await;
            // Fewer than a majority could be asked at all: not "held elsewhere".
            let answered = granted.len() + busy;
            if let (true, Some(error)) = (answered < self.quorum(), failed) {
                return Err(Error::NoQuorum {
                    answered,
                    needed: self.quorum(),
                    error,
                });
            }
            return Ok(None);
        }

        // Round 2: quorum fencing.
        let Some(top) = granted.iter().filter_map(|g| g.1).max() else {
            // No node runs the module: a classic Redlock, without fences.
            return Ok(Some(Held {
                fence: None,
                valid_until,
            }));
        };
        // (node, has a counter >= top) for the nodes known to hold the lock.
        let mut confirmed: Vec<(usize, bool)> = Vec::new();
        let mut lift: Vec<usize> = Vec::new();
        for &(i, fence) in &granted {
            match fence {
                None => confirmed.push((i, false)),
                Some(f) if f == top => confirmed.push((i, true)),
                Some(_) => lift.push(i),
            }
        }
        if !lift.is_empty() {
            let node_lease = (start + ttl).saturating_duration_since(Instant::now());
            if node_lease < Duration::from_millis(1) || left().is_zero() {
                self.release(key, token).await;
                return Ok(None);
            }
            let limit = self.node_timeout(ttl).min(left());
            // The renew must name the same mode as the grant (else WRONGMODE).
            let renew = Acquire {
                ttl_ms: millis(node_lease),
                ..req
            };
            let budget = self.confirm_budget(limit, left());
            let results = join_all(
                lift.iter()
                    .map(|&i| self.nodes[i].try_acquire(&renew, Some(top), limit, budget)),
            )
            .await;
            for (&i, r) in lift.iter().zip(results) {
                match r {
                    Ok(Some(g)) => confirmed.push((i, g.fence.is_some())),
                    Ok(None) => {}
                    Err(e) => log::debug!(
                        "{}: MINFENCE renew of {key:?} failed: {e}",
                        self.nodes[i].label
                    ),
                }
            }
        }
        if confirmed.len() < self.quorum() || left().is_zero() {
            self.release(key, token).await;
            return Ok(None);
        }
        let fenced = confirmed.iter().filter(|c| c.1).count();
        let fence = if fenced >= self.quorum() {
            Some(top)
        } else {
            log::warn!(
                "{key}: only {fenced} of the {} nodes holding the lock run the module; \
                 a quorum fence needs {}: no fencing token for this grant",
                confirmed.len(),
                self.quorum()
            );
            None
        };
        Ok(Some(Held { fence, valid_until }))
    }
}

/// How many holders a counted lock of `n` permits could have at once over `nodes`
/// nodes, each holder needing a majority: every node's `n` permits used up, `quorum`
/// of them per holder.
fn over_admission(n: u32, nodes: usize) -> u64 {
    let quorum = nodes as u64 / 2 + 1;
    u64::from(n) * nodes as u64 / quorum
}

/// A Redlock client over N independent servers (not replicas of each other, not one
/// cluster). Connections are made on first use, so nodes may be down at start.
///
/// ```no_run
/// # async fn demo() -> redis_lock_client::Result<()> {
/// use std::time::Duration;
/// use redis_lock_client::Redlock;
///
/// let rl = Redlock::new(&[
///     "redis://10.0.0.1:6379", "redis://10.0.0.2:6379", "redis://10.0.0.3:6379",
/// ])?;
/// if let Some(guard) = rl.acquire("lock:report", Duration::from_secs(30), None).await? {
///     println!("fence {:?}", guard.fence()); // strictly increasing across grants
///     guard.release().await?;
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Redlock {
    q: Arc<Quorum>,
}

impl Redlock {
    /// Redlock over `urls` with default options.
    pub fn new<S: AsRef<str>>(urls: &[S]) -> Result<Redlock> {
        Self::with_options(urls, RedlockOptions::default())
    }

    pub fn with_options<S: AsRef<str>>(urls: &[S], opts: RedlockOptions) -> Result<Redlock> {
        if urls.is_empty() {
            return Err(Error::Invalid("Redlock needs at least one node".into()));
        }
        let nodes = urls
            .iter()
            .map(|u| Node::new(u.as_ref(), opts.client.clone(), false).map(Arc::new))
            .collect::<Result<Vec<_>>>()?;
        Ok(Redlock {
            q: Arc::new(Quorum { nodes, opts }),
        })
    }

    /// How many nodes make a majority (N/2+1).
    pub fn quorum(&self) -> usize {
        self.q.quorum()
    }

    pub fn nodes(&self) -> usize {
        self.q.nodes.len()
    }

    acquire_methods! {
        /// Takes `name` (exclusive) on a majority for `ttl`; with `wait`, retries with jitter
        /// until it passes. `Ok(None)`: held elsewhere (no majority granted, though a
        /// majority answered). [`Error::NoQuorum`]: fewer than a majority could be asked
        /// at all (down, stopped, a wrong password), on the last try.
        acquire;
        /// Takes `name` on a majority as `opts` says: exclusive or shared. A counted lock
        /// ([`AcquireOptions::limit`]) is refused with [`Error::Invalid`]: over a quorum it
        /// would admit up to `2n - 1` holders (see [the module docs](crate::redlock)).
        acquire_with;
    }

    async fn take(&self, name: &str, opts: &AcquireOptions) -> Result<Option<LockGuard>> {
        check_ttl(opts.ttl)?;
        if let LockMode::Counted(n) = opts.mode {
            return Err(Error::Invalid(format!(
                "Redlock cannot hold a counted lock (LIMIT {n}): each node grants its own \
                 {n} permits and a holder needs only a majority of nodes, so up to {} \
                 holders could hold it at once on these {} nodes; use a counted lock on \
                 one server",
                over_admission(n, self.q.nodes.len()),
                self.q.nodes.len()
            )));
        }
        if let Some(hold) = opts.hold {
            // A hold some node would refuse is refused before anything is taken.
            let checks = join_all(self.q.nodes.iter().map(|n| n.check_lease(name, hold))).await;
            if let Some(e) = checks
                .into_iter()
                .filter_map(|r| r.err())
                .find(|e| e.is_lease_too_long())
            {
                return Err(e);
            }
        }
        let token = opts.token.clone().unwrap_or_else(new_token);
        let wait_end = opts.wait.map(|w| Instant::now() + w);
        loop {
            let start = Instant::now();
            // The last attempt's outcome: busy, or too few nodes to ask (`NoQuorum`).
            let outcome = match self
                .q
                .attempt(name, &token, opts.ttl, opts.owner.as_deref(), opts.mode)
                .await
            {
                Ok(Some(h)) => {
                    return Ok(Some(LockGuard::start(
                        Backend::Quorum(self.q.clone()),
                        name,
                        opts,
                        token,
                        h.fence,
                        start,
                        h.valid_until,
                    )))
                }
                Ok(None) => Ok(None),
                Err(e @ Error::NoQuorum { .. }) => Err(e),
                Err(e) => return Err(e),
            };
            let Some(end) = wait_end else {
                return outcome;
            };
            let pause = jitter(self.q.opts.retry_delay, self.q.opts.retry_jitter);
            if Instant::now() + pause >= end {
                return outcome;
            }
            tokio::time::sleep(pause).await;
        }
    }

    /// Releases `token`'s lock on every node; returns how many nodes released it.
    pub async fn release(&self, name: &str, token: &str) -> usize {
        self.q.release(name, token).await
    }

    /// Extends `token`'s lock on every node; `Ok(true)` when a majority confirmed
    /// within the validity.
    pub async fn extend(&self, name: &str, token: &str, ttl: Duration) -> Result<bool> {
        check_ttl(ttl)?;
        Ok(self.q.extend(name, token, ttl).await?.is_some())
    }

    /// `LOCK.INFO` on every node, with the node's URL (without its user and password).
    pub async fn info(&self, name: &str) -> Vec<(String, Result<Option<LockInfo>>)> {
        let results = join_all(self.q.nodes.iter().map(|n| n.info(name))).await;
        self.q
            .nodes
            .iter()
            .map(|n| n.shown_url.clone())
            .zip(results)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::over_admission;

    #[test]
    fn a_counted_lock_over_a_quorum_admits_too_many() {
        // One permit is safe (any two majorities intersect)...
        for nodes in [1, 3, 5, 7, 9] {
            assert_eq!(over_admission(1, nodes), 1, "{nodes} nodes");
        }
        // ...more are not: LIMIT 2 on 3 or 5 nodes admits 3, on many nodes 2n - 1.
        assert_eq!(over_admission(2, 3), 3);
        assert_eq!(over_admission(2, 5), 3);
        assert_eq!(over_admission(3, 5), 5);
        assert_eq!(over_admission(10, 101), 19);
        for n in 2..50u32 {
            for nodes in (3..99).step_by(2) {
                let m = over_admission(n, nodes);
                assert!(
                    m > u64::from(n) && m < 2 * u64::from(n),
                    "n {n} nodes {nodes}: {m}"
                );
            }
        }
    }
}
