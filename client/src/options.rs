//! Options for connecting and for taking a lock.

use std::time::Duration;

use crate::error::{Error, Result};
use crate::redacted;

/// How a [`LockClient`](crate::LockClient) or [`Redlock`](crate::Redlock) talks to its
/// servers.
///
/// Every call is bounded (docs/CLIENT.md, "Time limits"): opening a connection by
/// `connect_timeout`; a command by `io_timeout`, connecting included; a `BLOCK` wait by
/// the wait plus `connect_timeout` plus `io_timeout`; the confirmation of a grant by
/// `confirm_timeout` plus `io_timeout`.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// Limit for opening a TCP connection (and the RESP and TLS handshakes).
    pub connect_timeout: Duration,
    /// Limit for one command's round trip (a `BLOCK` wait is added on top of it).
    pub io_timeout: Duration,
    /// `Some(true)`: the URL is a Redis Cluster node, route by key; `Some(false)`: a
    /// standalone server; `None` (default): ask the server (`INFO cluster`) on connect.
    /// Only [`LockClient`](crate::LockClient) uses it; Redlock nodes are standalone.
    pub cluster: Option<bool>,
    /// Whether and on how many replicas a grant is confirmed before it is returned
    /// (default [`Confirm::Auto`]).
    pub confirm: Confirm,
    /// How long a grant may wait for its replicas (`WAIT n <ms>`); default 1 s.
    pub confirm_timeout: Duration,
    /// Certificates for TLS (`rediss://` URLs): the CA to trust, a client certificate.
    /// `None`: the system's CAs (and `SSL_CERT_FILE`), no client certificate.
    pub tls: Option<Tls>,
}

/// Certificates for TLS, PEM encoded. A server set up as Redis ships it
/// (`tls-auth-clients yes`) wants a client certificate signed by its CA. (`Debug` shows
/// which are set, never a key.)
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Tls {
    /// The CA certificate(s) to trust instead of the system's.
    pub ca_cert: Option<Vec<u8>>,
    /// A client certificate (chain) and its private key.
    pub client_cert: Option<(Vec<u8>, Vec<u8>)>,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls")
            .field("ca_cert", &self.ca_cert.as_ref().map(|_| "<set>"))
            .field("client_cert", &self.client_cert.as_ref().map(|_| "<set>"))
            .finish()
    }
}

impl Tls {
    /// Reads the PEM files: the CA to trust (`None`: the system's), a client
    /// certificate and its key (both or neither).
    pub fn from_files<P: AsRef<std::path::Path>>(
        ca_cert: Option<P>,
        client_cert: Option<P>,
        client_key: Option<P>,
    ) -> Result<Tls> {
        let read = |what: &str, p: &P| {
            std::fs::read(p.as_ref())
                .map_err(|e| Error::Invalid(format!("{what} {}: {e}", p.as_ref().display())))
        };
        let client_cert = match (&client_cert, &client_key) {
            (Some(c), Some(k)) => Some((read("client certificate", c)?, read("client key", k)?)),
            (None, None) => None,
            _ => {
                return Err(Error::Invalid(
                    "a client certificate needs its key, and a key its certificate".into(),
                ))
            }
        };
        Ok(Tls {
            ca_cert: ca_cert
                .as_ref()
                .map(|p| read("CA certificate", p))
                .transpose()?,
            client_cert,
        })
    }

    /// The `redis` crate's form.
    pub(crate) fn certificates(&self) -> redis::TlsCertificates {
        redis::TlsCertificates {
            client_tls: self
                .client_cert
                .as_ref()
                .map(|(cert, key)| redis::ClientTlsConfig {
                    client_cert: cert.clone(),
                    client_key: key.clone(),
                }),
            root_cert: self.ca_cert.clone(),
        }
    }
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            connect_timeout: Duration::from_secs(2),
            io_timeout: Duration::from_secs(2),
            cluster: None,
            confirm: Confirm::Auto,
            confirm_timeout: Duration::from_secs(1),
            tls: None,
        }
    }
}

/// Confirmation of grants on the server's replicas, so that a grant survives a failover.
///
/// After every grant (and every hand-off a waiting acquire receives) the client sends
/// `WAIT n <confirm_timeout>` on the connection that carried it. If fewer than `n`
/// replicas acknowledge in time, or fewer than `n` are connected where the deployment
/// expects `n`, it gives the grant back (`LOCK.RELEASE`) and returns
/// [`Error::Unconfirmed`]: never a grant that a failover could lose without a word.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Confirm {
    /// `n` = the server's `min-replicas-to-write` when it is set and readable (the
    /// deployment expects that many), else the replicas online now (those `ROLE` lists,
    /// or `state=online` in `INFO replication` for a user without `ROLE`; cached for a
    /// second). A replica in its full sync is not counted: it receives the grant with
    /// its sync, but the grant is returned before, and a failover before the sync ends
    /// can lose it; `Replicas(n)` closes that window. No replica: nothing to confirm.
    /// Needs `ROLE` (or `INFO`) and `WAIT` in the user's ACL.
    #[default]
    Auto,
    /// The deployment has `n` replicas: every grant must reach all `n`; fewer online is
    /// an error. Needs `WAIT` only (and `ROLE` or `INFO` to refuse at once when too few
    /// are online). `Replicas(0)` confirms nothing and sends nothing.
    Replicas(u32),
    /// Grants are returned unconfirmed (a failover right after a grant may lose it).
    Off,
}

/// Automatic renewal of a held lock (`LOCK.EXTEND`) while the guard lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Renewal {
    /// Hard cap on the total hold time, counted from the acquisition: the last renewal
    /// only extends up to it, so the lease ends by then at the latest and the loss signal
    /// fires with [`LossReason::CapReached`](crate::LossReason::CapReached).
    pub max_hold: Duration,
    /// Time between renewals; `None` = a third of the TTL.
    pub interval: Option<Duration>,
    /// How long before the lease can end the loss signal comes when no renewal has
    /// succeeded (the server does not answer, a connection is refused; failed renewals
    /// are tried again until then), and before the cap; `None` = a third of the TTL.
    /// The work has that long to stop before the next holder can get the lock.
    pub margin: Option<Duration>,
}

impl Renewal {
    /// Renew every third of the TTL, for at most `max_hold` in total; the loss signal a
    /// third of the TTL before the lease can end.
    pub fn capped(max_hold: Duration) -> Self {
        Renewal {
            max_hold,
            interval: None,
            margin: None,
        }
    }
}

/// The kind of lock to take, chosen by the first acquire of a free key (see
/// docs/commands.md, "The lock state").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum LockMode {
    /// One holder (no option on `LOCK.ACQUIRE`). On a key with shared holders this is
    /// the writer: it needs the key to have no holder at all.
    #[default]
    Exclusive,
    /// A reader of a read-write lock (`SHARED`): any number of shared holders at once,
    /// excluded by an exclusive holder. A writer queued with `BLOCK` keeps later readers
    /// out, so writers do not starve.
    Shared,
    /// One permit of a semaphore with this many (`LIMIT n`, 1 ..= 1000000). Every
    /// acquire of the key must give the same `n` (else the server answers
    /// `LIMITMISMATCH`).
    Counted(u32),
}

/// The largest `LIMIT` the module accepts.
pub const MAX_LIMIT: u32 = 1_000_000;

impl LockMode {
    /// `exclusive`, `shared` or `counted`, as `LOCK.INFO` names it.
    pub fn name(&self) -> &'static str {
        match self {
            LockMode::Exclusive => "exclusive",
            LockMode::Shared => "shared",
            LockMode::Counted(_) => "counted",
        }
    }
}

impl std::fmt::Display for LockMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LockMode::Counted(n) => write!(f, "counted (LIMIT {n})"),
            other => f.write_str(other.name()),
        }
    }
}

/// Everything an acquisition can be told. Build with [`AcquireOptions::new`] and the
/// chained setters. (`Debug` does not show the token.)
#[derive(Clone, PartialEq, Eq)]
pub struct AcquireOptions {
    /// Lease length (`PX`).
    pub ttl: Duration,
    /// `None`: fail at once when the lock is held; `Some(d)`: wait up to `d` (the module's
    /// FIFO `BLOCK` on one server, retries with jitter for Redlock).
    pub wait: Option<Duration>,
    /// Label shown by `LOCK.INFO` (`OWNER`).
    pub owner: Option<String>,
    /// The token to hold the lock with; default a fresh random UUID v4. The client always
    /// sends its own token so that it can release a grant whose reply was lost.
    pub token: Option<String>,
    /// Keep the lease alive while the guard lives.
    pub renew: Option<Renewal>,
    /// Exclusive (default), shared, or one permit of a counted lock.
    pub mode: LockMode,
    /// Once per period: [`LockGuard::release`](crate::LockGuard::release) and dropping
    /// the guard keep the lock until this long after the acquisition (the lease is set
    /// to what is left of it), so that the work runs once per period across machines.
    /// See [`LockGuard::release_after`](crate::LockGuard::release_after). A hold longer
    /// than the server's `lock.max-ttl` is refused before anything is acquired
    /// ([`Error::is_lease_too_long`](crate::Error::is_lease_too_long)).
    pub hold: Option<Duration>,
}

debug_shows!(AcquireOptions {
    ttl,
    wait,
    owner,
    token: redacted(token),
    renew,
    mode,
    hold
});

impl AcquireOptions {
    pub fn new(ttl: Duration) -> Self {
        AcquireOptions {
            ttl,
            wait: None,
            owner: None,
            token: None,
            renew: None,
            mode: LockMode::Exclusive,
            hold: None,
        }
    }

    setters! {
        /// Once per period: keep the lock until `hold` after the acquisition even when
        /// the guard is released or dropped earlier (see
        /// [`AcquireOptions::hold`](Self#structfield.hold)).
        fn hold(hold: Duration) => hold = Some(hold);
        /// Take a shared (reader) place in a read-write lock (`SHARED`).
        fn shared() => mode = LockMode::Shared;
        /// Take one of `permits` permits of a counted lock, a semaphore (`LIMIT n`).
        fn limit(permits: u32) => mode = LockMode::Counted(permits);
        fn mode(mode: LockMode) => mode = mode;
        fn wait(wait: Duration) => wait = Some(wait);
        fn owner(owner: impl Into<String>) => owner = Some(owner.into());
        fn token(token: impl Into<String>) => token = Some(token.into());
        /// Renew every third of the TTL, for at most `max_hold` in total.
        fn auto_renew(max_hold: Duration) => renew = Some(Renewal::capped(max_hold));
        fn renewal(renewal: Renewal) => renew = Some(renewal);
    }

    /// Checks the limits the module enforces, so that mistakes fail before any I/O.
    pub(crate) fn validate(&self) -> Result<()> {
        check_ttl(self.ttl)?;
        if let Some(t) = &self.token {
            check_label("token", t)?;
        }
        if let Some(o) = &self.owner {
            check_label("owner", o)?;
        }
        if let LockMode::Counted(n) = self.mode {
            if !(1..=MAX_LIMIT).contains(&n) {
                return Err(Error::Invalid(format!(
                    "the limit of a counted lock must be 1 to {MAX_LIMIT} (got {n})"
                )));
            }
        }
        if let Some(h) = self.hold {
            check_ttl(h).map_err(|_| Error::Invalid("hold must be at least 1 ms".into()))?;
        }
        if let Some(r) = &self.renew {
            if r.max_hold.is_zero() {
                return Err(Error::Invalid("max_hold must be positive".into()));
            }
            if r.interval.is_some_and(|i| i.is_zero() || i >= self.ttl) {
                return Err(Error::Invalid(
                    "the renewal interval must be positive and shorter than the TTL".into(),
                ));
            }
            let (interval, margin) = (self.renew_interval(), self.loss_margin());
            if interval.is_some_and(|i| i + margin >= self.ttl) {
                return Err(Error::Invalid(format!(
                    "the margin ({margin:?}) leaves no time for a renewal: margin and \
                     renewal interval ({interval:?}) must add up to less than the TTL"
                )));
            }
        }
        Ok(())
    }

    /// How long before the lease can end the loss signal of a renewed lease comes (a
    /// third of the TTL unless set); zero without renewal (at the deadline).
    pub(crate) fn loss_margin(&self) -> Duration {
        match self.renew {
            Some(r) => r.margin.unwrap_or(self.ttl / 3),
            None => Duration::ZERO,
        }
    }

    /// The renewal interval in force (a third of the TTL unless set).
    pub(crate) fn renew_interval(&self) -> Option<Duration> {
        self.renew.map(|r| {
            r.interval
                .unwrap_or(self.ttl / 3)
                .max(Duration::from_millis(1))
        })
    }
}

pub(crate) fn check_ttl(ttl: Duration) -> Result<u64> {
    let ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
    if ms == 0 || ms > i64::MAX as u64 / 2 {
        return Err(Error::Invalid(format!(
            "TTL must be at least 1 ms (got {ttl:?})"
        )));
    }
    Ok(ms)
}

fn check_label(what: &str, v: &str) -> Result<()> {
    if v.is_empty() || v.len() > 256 {
        return Err(Error::Invalid(format!(
            "{what} must be 1 to 256 bytes long"
        )));
    }
    Ok(())
}

/// Clock drift allowance of the Redlock algorithm: 1 % of the TTL plus 2 ms. The client
/// subtracts it from every lease it computes, also on a single server.
pub fn drift(ttl: Duration) -> Duration {
    ttl / 100 + Duration::from_millis(2)
}

/// Whole milliseconds, at least 1 (for `PX`).
pub(crate) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drift_follows_the_redlock_formula() {
        assert_eq!(drift(Duration::from_secs(10)), Duration::from_millis(102));
        assert_eq!(drift(Duration::from_millis(300)), Duration::from_millis(5));
    }

    #[test]
    fn validate_rejects_bad_input() {
        assert!(AcquireOptions::new(Duration::ZERO).validate().is_err());
        assert!(AcquireOptions::new(Duration::from_millis(1))
            .validate()
            .is_ok());
        assert!(AcquireOptions::new(Duration::from_secs(1))
            .token("")
            .validate()
            .is_err());
        assert!(AcquireOptions::new(Duration::from_secs(1))
            .owner("x".repeat(257))
            .validate()
            .is_err());
        assert!(AcquireOptions::new(Duration::from_secs(1))
            .auto_renew(Duration::ZERO)
            .validate()
            .is_err());
        let r = Renewal {
            max_hold: Duration::from_secs(5),
            interval: Some(Duration::from_secs(1)),
            margin: None,
        };
        assert!(AcquireOptions::new(Duration::from_secs(1))
            .renewal(r)
            .validate()
            .is_err());
        // The margin must leave time for a renewal: 500 ms + 333 ms < 1 s, 700 + 333 not.
        let margin = |ms| {
            AcquireOptions::new(Duration::from_secs(1)).renewal(Renewal {
                margin: Some(Duration::from_millis(ms)),
                ..Renewal::capped(Duration::from_secs(5))
            })
        };
        assert!(margin(500).validate().is_ok());
        assert!(margin(700).validate().is_err());
        assert_eq!(margin(500).loss_margin(), Duration::from_millis(500));
        let default =
            AcquireOptions::new(Duration::from_secs(3)).auto_renew(Duration::from_secs(9));
        assert_eq!(
            default.loss_margin(),
            Duration::from_secs(1),
            "a third of the TTL"
        );
        assert_eq!(
            AcquireOptions::new(Duration::from_secs(3)).loss_margin(),
            Duration::ZERO
        );
        let o = AcquireOptions::new(Duration::from_secs(1));
        assert!(o.clone().limit(0).validate().is_err());
        assert!(o.clone().limit(MAX_LIMIT + 1).validate().is_err());
        assert!(o.clone().limit(MAX_LIMIT).validate().is_ok());
        assert_eq!(o.clone().shared().mode, LockMode::Shared);
        assert_eq!(o.clone().limit(3).mode, LockMode::Counted(3));
        assert_eq!(
            o.clone().limit(3).shared().mode,
            LockMode::Shared,
            "the last setter wins"
        );
        assert!(o.clone().hold(Duration::ZERO).validate().is_err());
        assert!(o.hold(Duration::from_secs(3600)).validate().is_ok());
    }

    #[test]
    fn debug_does_not_show_the_token() {
        let o = AcquireOptions::new(Duration::from_secs(1)).token("s3cret-token-0123456789");
        let d = format!("{o:?}");
        assert!(!d.contains("s3cret"), "{d}");
        assert!(d.contains("token: Some(\"<set>\")"), "{d}");
    }

    #[test]
    fn default_interval_is_a_third_of_the_ttl() {
        let o = AcquireOptions::new(Duration::from_millis(300)).auto_renew(Duration::from_secs(1));
        assert_eq!(o.renew_interval(), Some(Duration::from_millis(100)));
        assert_eq!(
            AcquireOptions::new(Duration::from_millis(300)).renew_interval(),
            None
        );
    }
}
