//! Leader election on a lock, with the semantics of etcd's election API (Campaign,
//! Proclaim, Resign, Leader, Observe):
//!
//! - [`LockClient::campaign`] waits in the lock's FIFO queue (`LOCK.ACQUIRE key BLOCK ...
//!   OWNER value`) and returns a [`Leadership`] whose [`term`](Leadership::term) is the
//!   grant's fence. The lease is renewed while the leadership lives; its loss is the
//!   guard's loss signal ([`Leadership::lost`]).
//! - [`Leadership::proclaim`] publishes a new value keeping the term
//!   (`LOCK.EXTEND key token PX ttl OWNER value`); [`Leadership::resign`] releases, and
//!   the server hands the lock to the next candidate at once.
//! - [`LockClient::leader`] says who leads now, in one round trip (`LOCK.INFO key COUNT
//!   1`).
//! - [`LockClient::observe`] yields every change (a new leader, a new value, no leader)
//!   from `LOCK.WATCH`, without polling, on a connection of its own.
//!
//! A leader learns that its lease ended only when a renewal fails or is refused: between
//! that moment and the next renewal it may still believe it leads. Writes a leader makes
//! to the lock's server should therefore be guarded ([`Leadership::if_held`]); writes
//! elsewhere should carry the term as a fence. docs/election.md has the whole story.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::Value;

use crate::error::{Error, Result};
use crate::lease::{LeaseWatch, LockGuard, LossReason};
use crate::node::{new_token, Call, Dedicated, Node};
use crate::options::{AcquireOptions, Renewal};
use crate::redacted;
use crate::single::LockClient;

/// "No limit": a wait and a renewal cap this long are never reached.
const FOREVER: Duration = Duration::from_secs(10 * 365 * 86_400);
/// First pause before an observer reconnects; it doubles up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(50);
const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// Who leads: the value the leader campaigned with (or proclaimed since), and its term
/// (the fence of its grant: terms strictly increase from one leader to the next).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leader {
    /// The leader's value (its `OWNER` label; empty for a holder that took the key
    /// without a label).
    pub value: String,
    /// The fence of the leader's grant.
    pub term: u64,
}

/// How to campaign (see [`LockClient::campaign`]).
#[derive(Clone, PartialEq, Eq)]
pub struct CampaignOptions {
    /// The leader's lease, renewed every third of it while the leadership lives; also
    /// how long a crashed leader keeps the others waiting. Default 30 s.
    pub ttl: Duration,
    /// How long to wait in the queue; `None` (default): until elected.
    pub wait: Option<Duration>,
    /// The token to hold the lock with; default a fresh random one. With your own
    /// token you can release a leadership whose campaign you gave up on
    /// ([`LockClient::release`]).
    pub token: Option<String>,
}

debug_shows!(CampaignOptions {
    ttl,
    wait,
    token: redacted(token)
});

impl Default for CampaignOptions {
    fn default() -> Self {
        CampaignOptions {
            ttl: Duration::from_secs(30),
            wait: None,
            token: None,
        }
    }
}

impl CampaignOptions {
    setters! {
        fn ttl(ttl: Duration) => ttl = ttl;
        fn wait(wait: Duration) => wait = Some(wait);
        fn token(token: impl Into<String>) => token = Some(token.into());
    }
}

/// How to observe (see [`LockClient::observe`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ObserveOptions {
    /// The longest one `LOCK.WATCH` waits on the server (`BLOCK`) before it answers
    /// anyway; each answer without a change costs one more call. It also bounds how long
    /// a dead connection goes unnoticed. Default 10 s.
    pub block: Duration,
}

impl Default for ObserveOptions {
    fn default() -> Self {
        ObserveOptions {
            block: Duration::from_secs(10),
        }
    }
}

/// A won election: the guard of the leader's lock, renewed until it is resigned, dropped
/// or lost. Dropping it resigns (in a spawned task, best effort).
#[derive(Debug)]
pub struct Leadership {
    guard: LockGuard,
    value: String,
}

impl Leadership {
    /// The election's key.
    pub fn key(&self) -> &str {
        self.guard.name()
    }

    /// The value published now (the campaign's, or the last proclaimed one).
    pub fn value(&self) -> &str {
        &self.value
    }

    /// This leadership's term: the fence of its grant. Pass it along with writes to
    /// stores outside Redis, which should refuse a write with a lower term than one they
    /// have seen.
    pub fn term(&self) -> u64 {
        self.guard.fence().unwrap_or(0)
    }

    /// True while the lease holds, as far as this client knows (see
    /// [`LockGuard::is_held`]).
    pub fn is_leader(&self) -> bool {
        self.guard.is_held()
    }

    /// The loss signal: resolves with the reason when the leadership is lost (a renewal
    /// refused or failed, the lease ran out), `None` when it is resigned first.
    pub fn lost(&self) -> impl Future<Output = Option<LossReason>> + Send + 'static {
        self.guard.lost()
    }

    /// A cloneable handle on the lease status.
    pub fn watch(&self) -> LeaseWatch {
        self.guard.watch()
    }

    /// The lock guard underneath (its token, fence, status).
    pub fn guard(&self) -> &LockGuard {
        &self.guard
    }

    /// The lock guard underneath, by value (its release resigns).
    pub fn into_guard(self) -> LockGuard {
        self.guard
    }

    /// Publishes `value` in place of the current one, keeping the term:
    /// `LOCK.EXTEND key token PX ttl OWNER value` (the lease is renewed too). Observers
    /// see the change. [`Error::NotHeld`] when the leadership was lost (nothing is
    /// published; the loss signal fires if it had not yet).
    pub async fn proclaim(&mut self, value: impl Into<String>) -> Result<()> {
        let value = value.into();
        check_value(&value)?;
        if self.guard.extend_labelled(self.guard.ttl(), &value).await? {
            self.value = value;
            return Ok(());
        }
        Err(Error::NotHeld {
            node: self.node_label(),
            key: self.key().to_string(),
            what: "leadership lost; the value was not published",
        })
    }

    /// A write guarded by the leadership: see [`LockGuard::if_held`].
    pub async fn if_held<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> Result<T> {
        self.guard.if_held(cmd).await
    }

    /// Gives the leadership up at once: `LOCK.RELEASE`; the server hands the lock to the
    /// next candidate in the same step. `Ok(true)`: it was still held.
    pub async fn resign(self) -> Result<bool> {
        self.guard.release_now().await
    }

    fn node_label(&self) -> String {
        self.guard
            .node()
            .map(|n| n.label.clone())
            .unwrap_or_default()
    }
}

fn check_value(value: &str) -> Result<()> {
    if value.is_empty() || value.len() > 256 {
        return Err(Error::Invalid(
            "an election value must be 1 to 256 bytes long".into(),
        ));
    }
    Ok(())
}

/// Releases a campaign's token if the campaign is dropped before it finished (a
/// cancelled wait): the waiting connection closes, so the server drops the waiter; a
/// grant whose reply was already on its way is released here (twice, the second time a
/// moment later, for a grant made while the server had not yet seen the connection
/// close).
struct GiveBack {
    node: Arc<Node>,
    key: String,
    token: String,
    armed: bool,
}

impl Drop for GiveBack {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let (node, key, token) = (
            self.node.clone(),
            std::mem::take(&mut self.key),
            std::mem::take(&mut self.token),
        );
        if let Ok(h) = tokio::runtime::Handle::try_current() {
            h.spawn(async move {
                let limit = node.opts.io_timeout;
                if let Ok(true) = node.release(&key, &token, limit).await {
                    log::debug!("{key}: a grant to a cancelled campaign was released");
                    return;
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
                if let Ok(true) = node.release(&key, &token, limit).await {
                    log::debug!("{key}: a grant to a cancelled campaign was released");
                }
            });
        }
    }
}

/// A holder as `LOCK.WATCH` / `LOCK.INFO` show it: its fence and its label as sent.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Seen {
    term: u64,
    label: Option<Vec<u8>>,
}

impl Seen {
    fn leader(&self) -> Leader {
        Leader {
            value: self
                .label
                .as_deref()
                .map(|b| String::from_utf8_lossy(b).into_owned())
                .unwrap_or_default(),
            term: self.term,
        }
    }
}

fn as_bytes(v: &Value) -> Option<Vec<u8>> {
    match v {
        Value::BulkString(b) => Some(b.clone()),
        Value::SimpleString(s) => Some(s.clone().into_bytes()),
        Value::VerbatimString { text, .. } => Some(text.clone().into_bytes()),
        _ => None,
    }
}

fn as_u64(v: &Value) -> Option<u64> {
    match v {
        Value::Int(i) => u64::try_from(*i).ok(),
        other => std::str::from_utf8(&as_bytes(other)?).ok()?.parse().ok(),
    }
}

fn pairs(v: &Value) -> Option<Vec<(&Value, &Value)>> {
    match v {
        Value::Array(items) if items.len() % 2 == 0 => {
            Some(items.chunks_exact(2).map(|c| (&c[0], &c[1])).collect())
        }
        Value::Map(m) => Some(m.iter().map(|(k, v)| (k, v)).collect()),
        _ => None,
    }
}

/// The leader in a `LOCK.WATCH` summary or a `LOCK.INFO` reply: `None` when nobody
/// holds the key (nil, or a lock-delay running); the exclusive holder's fence and label,
/// else (a shared or counted key) the first holder's.
fn parse_holder(v: &Value, key: &str) -> Result<Option<Seen>> {
    if matches!(v, Value::Nil) {
        return Ok(None);
    }
    let bad = || Error::Protocol(format!("LOCK.WATCH / LOCK.INFO answered {v:?}"));
    let fields = pairs(v).ok_or_else(bad)?;
    let mut fence = None;
    let mut label = None;
    let mut first = None;
    for (k, val) in fields {
        match as_bytes(k).as_deref() {
            Some(b"state") if as_bytes(val).as_deref() != Some(b"held") => return Ok(None),
            Some(b"kind") if as_bytes(val).as_deref() == Some(b"string") => {
                return Err(Error::Invalid(format!(
                    "{key} holds a classic SET NX lock (a string), not an election"
                )))
            }
            Some(b"fence") => fence = as_u64(val),
            Some(b"owner") => label = as_bytes(val),
            Some(b"holder-list") => {
                if let Value::Array(items) = val {
                    first = items.first().and_then(pairs).map(|h| {
                        let mut s = (None, None);
                        for (hk, hv) in h {
                            match as_bytes(hk).as_deref() {
                                Some(b"fence") => s.0 = as_u64(hv),
                                Some(b"owner") => s.1 = as_bytes(hv),
                                _ => {}
                            }
                        }
                        s
                    });
                }
            }
            _ => {}
        }
    }
    if fence.is_none() {
        if let Some((f, l)) = first {
            fence = f;
            label = l;
        }
    }
    match fence {
        Some(term) => Ok(Some(Seen { term, label })),
        None => Ok(None),
    }
}

/// Errors after which an observer reconnects and reads the state again.
fn transient(e: &Error) -> bool {
    match e {
        Error::Timeout { .. } => true,
        Error::Redis { error, .. } => {
            e.is_connection_error()
                || error.is_timeout()
                || matches!(
                    error.code(),
                    Some(
                        "TRYAGAIN"
                            | "LOCKMOVED"
                            | "UNBLOCKED"
                            | "LOADING"
                            | "MASTERDOWN"
                            | "CLUSTERDOWN"
                            | "BUSY"
                            | "MAXWAITERS"
                            | "MOVED"
                            | "ASK"
                    )
                )
        }
        _ => false,
    }
}

impl LockClient {
    /// Campaigns for leadership of `key` with `value` (1..256 bytes): waits in the
    /// lock's FIFO queue until the lock is handed to this candidate (or `opts.wait`
    /// passes: `Ok(None)`), then returns the [`Leadership`], renewed every third of
    /// `opts.ttl`. Candidates are elected in the order they started campaigning. The
    /// grant is confirmed on the server's replicas like any other
    /// ([`Confirm`](crate::Confirm)). Dropping the returned future cancels the campaign
    /// (the candidate leaves the queue; a grant that raced the cancellation is
    /// released). Needs the module ([`Error::ModuleMissing`] otherwise).
    pub async fn campaign(
        &self,
        key: &str,
        value: &str,
        opts: &CampaignOptions,
    ) -> Result<Option<Leadership>> {
        check_value(value)?;
        let token = opts.token.clone().unwrap_or_else(new_token);
        let mut o = AcquireOptions::new(opts.ttl)
            .owner(value)
            .token(token.clone())
            .renewal(Renewal::capped(FOREVER));
        o.wait = Some(opts.wait.unwrap_or(FOREVER));
        o.validate()?;
        let mut give_back = GiveBack {
            node: self.node.clone(),
            key: key.to_string(),
            token,
            armed: true,
        };
        let outcome = self.take(key, &o).await;
        give_back.armed = false;
        let Some(guard) = outcome? else {
            return Ok(None);
        };
        if guard.fence().is_none() {
            // The classic SET NX fallback: no fence, no label, nothing to observe.
            let _ = guard.release_now().await;
            return Err(self.node.missing("Leader election"));
        }
        Ok(Some(Leadership {
            guard,
            value: value.to_string(),
        }))
    }

    /// Who leads `key` now: `None` when nobody does. One round trip: `LOCK.INFO key
    /// COUNT 1`, which answers at once whether or not the key is held (a `LOCK.WATCH`
    /// with a short `BLOCK` would wait that long when nobody leads, and take a watcher's
    /// place meanwhile).
    pub async fn leader(&self, key: &str) -> Result<Option<Leader>> {
        let mut cmd = redis::cmd("LOCK.INFO");
        cmd.arg(key).arg("COUNT").arg(1);
        let v: Value = self
            .node
            .module_only(Call::idempotent(
                "LOCK.INFO",
                &cmd,
                self.node.opts.io_timeout,
            ))
            .await?;
        Ok(parse_holder(&v, key)?.map(|s| s.leader()))
    }

    /// Observes the election of `key`: an [`Observer`] whose
    /// [`next`](Observer::next) yields who leads when it starts, then every change (a
    /// new leader, a new value proclaimed, no leader), each from one `LOCK.WATCH` that
    /// waits on the server for it (no polling). Changes that follow one another faster
    /// than a round trip may be seen as one (the latest state is always seen).
    pub fn observe(&self, key: &str, opts: ObserveOptions) -> Observer {
        Observer {
            node: self.node.clone(),
            key: key.to_string(),
            block: opts.block.max(Duration::from_millis(1)),
            conn: None,
            last: None,
            backoff: FIRST_BACKOFF,
            done: false,
        }
    }
}

/// The changes of an election (see [`LockClient::observe`]), read on a connection of its
/// own. It survives time-outs, reconnects (a server restart, a failover), `TRYAGAIN` and
/// `LOCKMOVED`: it reads the state again and goes on. Dropping it (or the stream of
/// [`into_stream`](Self::into_stream)) closes its connection.
pub struct Observer {
    node: Arc<Node>,
    key: String,
    block: Duration,
    conn: Option<Dedicated>,
    /// `None` before the first answer; then who was seen last.
    last: Option<Option<Seen>>,
    backoff: Duration,
    done: bool,
}

impl std::fmt::Debug for Observer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Observer")
            .field("key", &self.key)
            .field("block", &self.block)
            .field("connected", &self.conn.is_some())
            .finish_non_exhaustive()
    }
}

impl Observer {
    /// The next state: `Some(Ok(Some(leader)))`, `Some(Ok(None))` when nobody leads, or
    /// `Some(Err(e))` for an error it cannot get past (`WRONGTYPE`, `NOPERM`, the
    /// module missing, a key that is not an election), after which it ends (`None`).
    /// The first call answers at once with who leads now.
    pub async fn next(&mut self) -> Option<Result<Option<Leader>>> {
        if self.done {
            return None;
        }
        match self.step().await {
            Ok(s) => Some(Ok(s)),
            Err(e) => {
                self.done = true;
                self.conn = None;
                Some(Err(e))
            }
        }
    }

    /// The observer as a `futures` stream (the items of [`next`](Self::next)).
    pub fn into_stream(self) -> impl futures_util::Stream<Item = Result<Option<Leader>>> {
        futures_util::stream::unfold(self, |mut o| async move {
            let item = o.next().await?;
            Some((item, o))
        })
    }

    fn command(&self) -> redis::Cmd {
        let block = crate::options::millis(self.block);
        match &self.last {
            None => {
                let mut c = redis::cmd("LOCK.INFO");
                c.arg(&self.key).arg("COUNT").arg(1);
                c
            }
            Some(None) => {
                let mut c = redis::cmd("LOCK.WATCH");
                c.arg(&self.key).arg("BLOCK").arg(block);
                c
            }
            Some(Some(seen)) => {
                let mut c = redis::cmd("LOCK.WATCH");
                c.arg(&self.key).arg("FENCE").arg(seen.term);
                if let Some(l) = seen.label.as_deref().filter(|l| !l.is_empty()) {
                    c.arg("OWNER").arg(l);
                }
                c.arg("BLOCK").arg(block);
                c
            }
        }
    }

    async fn pause(&mut self) {
        tokio::time::sleep(self.backoff).await;
        self.backoff = (self.backoff * 2).min(MAX_BACKOFF);
    }

    async fn step(&mut self) -> Result<Option<Leader>> {
        let io = self.node.opts.io_timeout;
        loop {
            let cmd = self.command();
            let conn = match &mut self.conn {
                Some(c) => c,
                None => match self.node.dedicated(self.block + io).await {
                    Ok(c) => self.conn.insert(c),
                    Err(e) if transient(&e) => {
                        log::debug!("observe {}: {e}; connecting again", self.key);
                        self.pause().await;
                        continue;
                    }
                    Err(e) => return Err(e),
                },
            };
            let started = Instant::now();
            let limit = self.block + io + self.node.opts.connect_timeout;
            let reply = match tokio::time::timeout(limit, conn.query::<Value>(&cmd)).await {
                Ok(r) => r,
                Err(_) => Err(Error::Timeout {
                    node: self.node.label.clone(),
                    what: "LOCK.WATCH",
                    after: limit,
                    hint: None,
                }),
            };
            let v = match reply {
                Ok(v) => v,
                Err(e) if e.is_unknown_command() => {
                    return Err(self.node.missing("Observing an election (LOCK.WATCH)"))
                }
                Err(e) if transient(&e) => {
                    log::debug!("observe {}: {e}; reading the state again", self.key);
                    self.conn = None;
                    self.pause().await;
                    continue;
                }
                Err(e) => return Err(e),
            };
            let seen = parse_holder(&v, &self.key)?;
            let first = self.last.is_none();
            if self.last.as_ref() != Some(&seen) {
                self.backoff = FIRST_BACKOFF;
                let leader = seen.as_ref().map(Seen::leader);
                self.last = Some(seen);
                return Ok(leader);
            }
            if !first && started.elapsed() < self.block / 2 {
                // Answered early with nothing new (a label this client cannot repeat
                // byte for byte, say): do not spin.
                self.pause().await;
            } else {
                self.backoff = FIRST_BACKOFF;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn summaries_resp2_and_resp3() {
        let holder = vec![
            bulk("fence"),
            Value::Int(1_839_275_466_401_798),
            bulk("owner"),
            bulk("node-a:8080"),
        ];
        let flat = Value::Array(vec![
            bulk("state"),
            bulk("held"),
            bulk("kind"),
            bulk("module"),
            bulk("mode"),
            bulk("exclusive"),
            bulk("fence"),
            Value::Int(1_839_275_466_401_798),
            bulk("owner"),
            bulk("node-a:8080"),
            bulk("holders"),
            Value::Int(1),
            bulk("holder-list"),
            Value::Array(vec![Value::Array(holder.clone())]),
        ]);
        let want = Seen {
            term: 1_839_275_466_401_798,
            label: Some(b"node-a:8080".to_vec()),
        };
        assert_eq!(parse_holder(&flat, "k").unwrap(), Some(want.clone()));
        let map = Value::Map(vec![
            (bulk("state"), bulk("held")),
            (bulk("mode"), bulk("shared")),
            (bulk("holders"), Value::Int(2)),
            (
                bulk("holder-list"),
                Value::Array(vec![Value::Map(vec![
                    (bulk("fence"), Value::Int(1_839_275_466_401_798)),
                    (bulk("owner"), bulk("node-a:8080")),
                ])]),
            ),
        ]);
        assert_eq!(parse_holder(&map, "k").unwrap(), Some(want.clone()));
        assert_eq!(
            want.leader(),
            Leader {
                value: "node-a:8080".into(),
                term: 1_839_275_466_401_798
            }
        );
        assert_eq!(parse_holder(&Value::Nil, "k").unwrap(), None);
        let delayed = Value::Array(vec![
            bulk("state"),
            bulk("delayed"),
            bulk("holders"),
            Value::Int(0),
        ]);
        assert_eq!(parse_holder(&delayed, "k").unwrap(), None);
        let string = Value::Array(vec![
            bulk("state"),
            bulk("held"),
            bulk("kind"),
            bulk("string"),
        ]);
        assert!(parse_holder(&string, "k").is_err());
        assert!(parse_holder(&Value::Int(3), "k").is_err());
        let unlabelled = Value::Array(vec![
            bulk("state"),
            bulk("held"),
            bulk("fence"),
            Value::Int(7),
            bulk("owner"),
            Value::Nil,
        ]);
        assert_eq!(
            parse_holder(&unlabelled, "k").unwrap().map(|s| s.leader()),
            Some(Leader {
                value: String::new(),
                term: 7
            })
        );
    }

    #[test]
    fn values_are_checked_and_tokens_not_shown() {
        assert!(check_value("").is_err());
        assert!(check_value(&"x".repeat(257)).is_err());
        assert!(check_value("node-a").is_ok());
        let o = CampaignOptions::default().token("s3cret-token-0123456789");
        assert!(!format!("{o:?}").contains("s3cret"));
        assert_eq!(o.ttl, Duration::from_secs(30));
        assert_eq!(o.wait, None);
    }
}
