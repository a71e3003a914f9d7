//! Locks on one server (or one Redis Cluster, routed by key).

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::info::LockInfo;
use crate::lease::{release_until, settle, Backend, LockGuard};
use crate::node::{new_token, Acquire, ConfirmBudget, Node};
use crate::options::{check_ttl, drift, AcquireOptions, ClientOptions};

/// A client for locks on one Redis / Valkey server with the module loaded, or on a Redis
/// Cluster (detected on connect, or forced with [`ClientOptions::cluster`]). Cheap to
/// clone; clones share the connection.
///
/// ```no_run
/// # async fn demo() -> redis_lock_client::Result<()> {
/// use std::time::Duration;
/// use redis_lock_client::{AcquireOptions, LockClient};
///
/// let locks = LockClient::connect("redis://127.0.0.1:6379").await?;
/// let opts = AcquireOptions::new(Duration::from_secs(10))
///     .wait(Duration::from_secs(5))
///     .owner("worker-1")
///     .auto_renew(Duration::from_secs(600));
/// if let Some(guard) = locks.acquire_with("lock:product:9001", &opts).await? {
///     let lost = guard.lost();
///     tokio::select! {
///         _ = async { /* the work, writing with guard.fence() */ } => {}
///         reason = lost => eprintln!("lease lost: {reason:?}, stopping"),
///     }
///     guard.release().await?;
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct LockClient {
    pub(crate) node: Arc<Node>,
    cluster: bool,
}

impl LockClient {
    /// Connects with default options (2 s connect and I/O timeouts, cluster detection,
    /// grants confirmed on the replicas: [`Confirm::Auto`](crate::Confirm)).
    pub async fn connect(url: &str) -> Result<LockClient> {
        Self::connect_with(url, ClientOptions::default()).await
    }

    /// Connects (and, unless told, asks the server whether it is a cluster node), within
    /// `connect_timeout` + `io_timeout`. A URL that does not parse is
    /// [`Error::Invalid`] (without the URL, which may hold a password).
    pub async fn connect_with(url: &str, opts: ClientOptions) -> Result<LockClient> {
        let cluster = match opts.cluster {
            Some(c) => c,
            None => Node::detect_cluster(url, &opts).await?,
        };
        Ok(LockClient {
            node: Arc::new(Node::new(url, opts, cluster)?),
            cluster,
        })
    }

    /// A client over an application's own `redis::Client` (one server), used as the
    /// application configured it: its address, TLS, credentials, database and protocol.
    /// Nothing is connected yet. `opts.cluster` and `opts.tls` do not apply (the
    /// client has its own); for a Redis Cluster, connect with a node's URL instead.
    pub fn from_client(client: redis::Client, opts: ClientOptions) -> LockClient {
        LockClient {
            node: Arc::new(Node::from_client(client, opts)),
            cluster: false,
        }
    }

    /// True when commands are routed across a Redis Cluster.
    pub fn is_cluster(&self) -> bool {
        self.cluster
    }

    acquire_methods! {
        /// Takes `name` for `ttl`, waiting up to `wait` (`None`: do not wait). `Ok(None)`:
        /// held by someone else (for the whole wait). No auto-renewal; see
        /// [`acquire_with`](Self::acquire_with).
        acquire;
        /// Takes `name` as `opts` says: exclusive, shared ([`AcquireOptions::shared`]) or one
        /// permit of a counted lock ([`AcquireOptions::limit`]). Waiting uses the module's
        /// FIFO queue (`BLOCK`). Renewal and the loss signal work the same for every mode:
        /// they act on this guard's own holder (its token). A mode the key does not have
        /// (`WRONGMODE`) or another limit (`LIMITMISMATCH`) is an [`Error::Redis`] with that
        /// code ([`Error::server_code`]), never a wait. Without the module only exclusive
        /// locks can be taken (the `SET NX PX` fallback): other modes are [`Error::Invalid`].
        acquire_with;
    }

    pub(crate) async fn take(
        &self,
        name: &str,
        opts: &AcquireOptions,
    ) -> Result<Option<LockGuard>> {
        let node = &self.node;
        if let Some(hold) = opts.hold {
            node.check_lease(name, hold).await?;
        }
        let token = opts.token.clone().unwrap_or_else(new_token);
        let ttl = opts.ttl;
        let ttl_ms = check_ttl(ttl)?;
        let req = Acquire {
            key: name,
            token: &token,
            ttl_ms,
            owner: opts.owner.as_deref(),
            mode: opts.mode,
            session: None,
        };
        let wait = opts.wait.filter(|w| !w.is_zero());
        let start = Instant::now();
        let budget = ConfirmBudget {
            wait: node.opts.confirm_timeout,
            limit: node.opts.confirm_timeout + node.opts.io_timeout,
        };
        let outcome = match wait {
            None => {
                node.try_acquire(&req, None, node.opts.io_timeout, budget)
                    .await
            }
            Some(w) => node.acquire_blocking(&req, w, budget).await,
        };
        let grant = match outcome {
            Ok(Some(g)) => g,
            Ok(None) => return Ok(None),
            Err(e) => {
                if matches!(e, Error::Timeout { .. }) {
                    // The grant may have happened with its reply lost: we know the
                    // token, so give it back.
                    self.release_in_background(name, &token);
                }
                return Err(e);
            }
        };
        let got_at = Instant::now();
        // The server granted after `start`, so `start + ttl - drift` is a safe deadline.
        // After a long BLOCK wait most of it may be gone: anchor the lease anew.
        let mut valid_until = start + ttl.saturating_sub(drift(ttl));
        if valid_until.saturating_duration_since(got_at) < ttl / 2 {
            let t = Instant::now();
            match node
                .extend(name, &token, ttl_ms, node.opts.io_timeout, false)
                .await
            {
                Ok(true) => valid_until = t + ttl.saturating_sub(drift(ttl)),
                // The lease ran out while the grant was confirmed: not "held elsewhere"
                // (nobody else may hold it), and not a grant.
                Ok(false) => {
                    return Err(Error::NotHeld {
                        node: node.label.clone(),
                        key: name.to_string(),
                        what: "the lease ran out before the grant was confirmed on the \
                               replicas; give it a longer TTL",
                    })
                }
                Err(e) => {
                    self.release_in_background(name, &token);
                    return Err(e);
                }
            }
        }
        let acquired_at = if wait.is_some() { got_at } else { start };
        Ok(Some(LockGuard::start(
            Backend::Single(self.node.clone()),
            name,
            opts,
            token,
            grant.fence,
            acquired_at,
            valid_until,
        )))
    }

    fn release_in_background(&self, name: &str, token: &str) {
        let node = self.node.clone();
        let (name, token) = (name.to_string(), token.to_string());
        tokio::spawn(async move {
            let _ = node.release(&name, &token, node.opts.io_timeout).await;
        });
    }

    /// Releases a lock held by `token` (e.g. one taken by another process or the CLI).
    /// A transient failure (a dead connection, a Sentinel failover still settling) is
    /// tried again for up to 5 s, as a guard's release is.
    pub async fn release(&self, name: &str, token: &str) -> Result<bool> {
        let (node, until) = (&self.node, release_until(None));
        settle(name, until, node.opts.io_timeout, |limit| {
            node.release(name, token, limit)
        })
        .await
    }

    /// Extends a lock held by `token` to `ttl` from now.
    pub async fn extend(&self, name: &str, token: &str, ttl: Duration) -> Result<bool> {
        let ms = check_ttl(ttl)?;
        self.node
            .extend(name, token, ms, self.node.opts.io_timeout, false)
            .await
    }

    /// A guarded command for code that was handed only a fence (a worker the holder
    /// delegates to): runs `cmd` only while the holder with fence `fence` holds `name`,
    /// in one atomic step (`LOCK.IFFENCE name fence cmd ...`), and returns its reply;
    /// [`Error::NotHeld`] (nothing ran) otherwise. A fence is not a secret: this refuses
    /// stale writes, it does not authorize them (that is the ACL's job). Sent once.
    pub async fn if_fence<T: redis::FromRedisValue>(
        &self,
        name: &str,
        fence: u64,
        cmd: &redis::Cmd,
    ) -> Result<T> {
        let c = crate::node::guarded_cmd("LOCK.IFFENCE", name, fence.to_string().as_bytes(), cmd)?;
        self.node.guarded("LOCK.IFFENCE", &c, name).await
    }

    /// `LOCK.CHECK name fence`: `true` if `fence` is the fence of a current holder of
    /// `name` (Chubby's sequencer check). A check and a separate write are still a
    /// race: [`if_fence`](Self::if_fence) does both in one step.
    pub async fn check(&self, name: &str, fence: u64) -> Result<bool> {
        self.node.check(name, fence).await
    }

    /// `LOCK.INFO name`: `None` when free.
    pub async fn info(&self, name: &str) -> Result<Option<LockInfo>> {
        self.node.info(name).await
    }

    /// True once an `unknown command` reply made the client fall back to `SET NX PX` +
    /// Lua (the module is not loaded on the server; no fencing tokens).
    pub fn module_missing(&self) -> bool {
        self.node.module_missing()
    }
}
