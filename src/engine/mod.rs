//! The lock engine: it decides whole commands. [`Engine::handle`] takes a parsed command
//! and answers with a reply, or blocks the caller in a FIFO queue; [`Engine::tick`] does
//! what falls due on the monotonic clock (a lease ending, a BLOCK deadline, a hand-off that
//! waited for the server to allow writes). Pure Rust: it reaches the server only through
//! three small traits, [`Keyspace`] (one open lock key, with replication and events),
//! [`Sched`] (blocking and answering clients, asking to be woken) and [`Store`] (opening
//! keys for the work it does on its own). The module shell implements them over the Redis
//! module API; the model test implements them in memory.
//!
//! One place makes a grant ([`Engine::grant`]), one hands a lock over ([`Engine::serve`],
//! which writes only when the keyspace says it may, [`Gate`]), one removes holders
//! (`remove_holders`). Every change is stored first, then replicated.

mod commands;
mod info;
mod leases;
mod multi;
mod queue;
mod sessions;
mod timeline;
mod tokens;
mod watch;

#[cfg(test)]
mod model;

use std::collections::{BTreeSet, HashMap};

use crate::error::LockError;
use crate::lock::codec::repl::Change;
use crate::lock::codec::Clock;
use crate::lock::fence::FenceClock;
use crate::lock::value::{Addr, Digest, LockValue, Mode};

pub use crate::reply::{Bytes, Reply};
pub use commands::{AcquireReq, Command, Outcome};
pub use multi::{grant_reply, AcquireAllReq, MAX_KEYS};
pub use queue::{Answer, Wait};
pub use sessions::{OpenReq, SessionApply};
pub use timeline::Task;
pub use watch::{Want, WatchReq};

/// A queue's identity: the db and the key name.
pub type QueueKey = (i32, Box<[u8]>);

/// Every key of per-db maps (queues, watch lists) in `db`, or in every db.
fn keys_in<V>(dbs: &HashMap<i32, HashMap<Box<[u8]>, V>>, db: Option<i32>) -> Vec<QueueKey> {
    dbs.iter()
        .filter(|(d, _)| db.is_none_or(|x| x == **d))
        .flat_map(|(d, m)| m.keys().map(move |k| (*d, k.clone())))
        .collect()
}
/// FxHash over 8-byte words from `seed`: a few instructions per word, for the engine's own
/// tables (keys and tokens a client picks: no table depends on it for more than speed).
pub(crate) fn word_hash(seed: u64, bytes: &[u8]) -> u64 {
    let mix = |h: u64, w: u64| (h.rotate_left(5) ^ w).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    let mut h = mix(0, seed);
    let mut words = bytes.chunks_exact(8);
    for w in &mut words {
        let mut b = [0u8; 8];
        b.copy_from_slice(w);
        h = mix(h, u64::from_le_bytes(b));
    }
    let rest = words.remainder();
    if !rest.is_empty() {
        let mut b = [0u8; 8];
        b[..rest.len()].copy_from_slice(rest);
        h = mix(h, u64::from_le_bytes(b));
    }
    h
}

/// Identifies a waiter while it is queued (the shell uses its blocked-client handle).
pub type WaiterId = usize;

/// What a lock key holds, as the engine sees it.
#[derive(Debug)]
pub enum Slot<'a> {
    Free,
    Lock(&'a mut LockValue),
    /// A classic `SET key token NX PX` lock and its key's expiry, unix ms (None: none).
    Classic(Option<i64>),
}

/// Whether the engine may write this key on its own now (hand-off, reaping, revoking).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gate {
    Now,
    /// Writes are paused, the server is loading: try again soon.
    Later,
    /// A cluster node that does not serve this key (any more): the waiters must retry
    /// where the cluster sends them.
    NotHere,
    /// A replica never grants.
    Replica,
}

/// A real change of a key: a keyspace notification (class `g`, or `x` for an expiry) and
/// a modification signal (WATCH, client-side caching). Commands that change nothing
/// emit none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    Acquire,
    Release,
    Extend,
    Handoff,
    ForceRelease,
    /// A lease ended and the engine removed the key.
    Expired,
    /// A replicated change was applied.
    Applied,
}

/// One open lock key, and what goes with writing it.
pub trait Keyspace {
    fn db(&self) -> i32;
    fn name(&self) -> &[u8];
    /// The clocks, read once when the key was opened.
    fn clock(&self) -> Clock;
    /// What the key holds; `Err(WrongType)` for another type.
    fn read(&mut self) -> Result<Slot<'_>, LockError>;
    /// Stores a new value (the key must be empty: the engine removes first).
    fn put(&mut self, v: LockValue) -> Result<(), LockError>;
    /// Deletes the key.
    fn remove(&mut self);
    /// Whether a classic string lock's value equals `token`.
    fn classic_matches(&mut self, token: &[u8]) -> bool;
    /// Sets a classic string lock's expiry (unix ms).
    fn set_classic_expiry(&mut self, at: i64);
    /// Sends a change to replicas and the AOF (after it was stored).
    fn replicate(&mut self, c: Change<'_>);
    fn changed(&mut self, ev: Event);
    fn gate(&mut self) -> Gate;
    /// A fresh random token (UUID v4 text).
    fn new_token(&mut self) -> [u8; 36];
    /// A client starts waiting for this classic string lock (the shell may need to
    /// listen for what happens to it).
    fn waits_on_classic(&mut self);
    /// Whether a Valkey atomic slot migration streams this key's slot to another node
    /// now: the stream carries only keyed commands, so a change replicas learn keyless
    /// (a session's keepalive) must be sent for this key too.
    fn exported(&self) -> bool {
        false
    }
}

/// Blocked clients and wake-ups, as the shell provides them.
pub trait Sched {
    /// The shell's handle of a blocked client.
    type Waiter;
    /// Blocks the client of the running command; None where it cannot block (MULTI, a
    /// script, the replication stream).
    fn block(&mut self) -> Option<(WaiterId, Self::Waiter)>;
    fn answer(&mut self, w: Self::Waiter, a: Answer);
    /// Asks for [`Engine::tick`] no later than `at` (monotonic µs).
    fn wake_at(&mut self, at: i64);
}

/// Opens keys for the work the engine does on its own.
pub trait Store {
    type Key<'a>: Keyspace
    where
        Self: 'a;
    /// Opens `name` in `db` for writing (None: no such db).
    fn open(&mut self, db: i32, name: &[u8]) -> Option<Self::Key<'_>>;
    fn clock(&self) -> Clock;
    /// Sends a change of a session (no key of its own) to replicas and the AOF.
    fn replicate_session(&mut self, c: &crate::lock::codec::repl::SessionChange<'_>);
}

/// Counters for `INFO lock`; the engine counts its own events.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Stats {
    pub acquired: u64,
    pub renewed: u64,
    pub contended: u64,
    pub released: u64,
    pub extended: u64,
    pub expired: u64,
    pub handed_off: u64,
    pub wait_timeouts: u64,
    pub force_released: u64,
    /// Lock keys that left the keyspace by the server's hand (DEL, RENAME, ...).
    pub removed: u64,
    /// Lock keys the server evicted (maxmemory).
    pub evicted: u64,
    pub sessions_opened: u64,
    /// Sessions that ended with their lease (TTL, or their bound connection gone).
    pub sessions_expired: u64,
    pub sessions_closed: u64,
    pub session_keepalives: u64,
    /// Sessions that lost a lock to a slot move here (no longer kept alive here).
    pub sessions_moved: u64,
    /// Evicted locks the module put back (grants refused for the eviction policy).
    pub restored: u64,
    /// Values a loader repaired (a holder dropped by the validity rule).
    pub repaired: u64,
    /// Acquires refused because the eviction policy could evict the lock.
    pub refused_eviction: u64,
    /// µs spent in wait queues by the waits that ended (granted, timed out, gone).
    pub waited_us: u64,
}

/// Settings the engine decides with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    pub max_waiters: u64,
    /// The server's eviction policy can evict a held lock (named here) and the operator
    /// has not allowed it: no new grant or wait, only renewals (`lock.allow-eviction`).
    pub refuse_grants: Option<&'static str>,
}

/// `W`: the shell's handle of a blocked client.
pub struct Engine<W> {
    pub fence: FenceClock,
    pub stats: Stats,
    pub settings: Settings,
    queues: HashMap<i32, queue::DbQueues<W>>,
    by_id: HashMap<WaiterId, QueueKey>,
    /// Clients in LOCK.WATCH, by key, and the key each one watches.
    watches: HashMap<i32, watch::DbWatches<W>>,
    watch_ids: HashMap<WaiterId, QueueKey>,
    /// Work due at a monotonic instant.
    agenda: BTreeSet<(i64, Task)>,
    /// Every lock key by the end of its earliest lease: what the engine reaps, and when
    /// it serves the key's waiters.
    leases: leases::Leases,
    /// A replica does not end leases (its primary does); set when the gate says so,
    /// cleared at promotion.
    leases_paused: bool,
    /// The monotonic clock as of the latest command or tick.
    now: i64,
    tokens: tokens::TokenCache,
    /// Held locks the server evicted while grants are refused for the eviction policy:
    /// put back before anything else happens to their keys (see `restore_pending`).
    restoring: HashMap<QueueKey, LockValue>,
    sessions: sessions::Sessions,
    /// Clients waiting for several keys at once, by their id (their places in the
    /// queues are parts without a client).
    multi: HashMap<WaiterId, multi::MultiWait<W>>,
}

impl<W> Default for Engine<W> {
    fn default() -> Self {
        Engine::new()
    }
}

/// A copy of a key's name, on the stack up to 64 bytes (the engine keeps one while it
/// changes the key; most names fit, so no allocation).
pub(crate) struct Name {
    inline: [u8; 64],
    len: usize,
    heap: Option<Box<[u8]>>,
}

impl Name {
    pub(crate) fn of(b: &[u8]) -> Name {
        let mut n = Name {
            inline: [0; 64],
            len: b.len(),
            heap: None,
        };
        match n.inline.get_mut(..b.len()) {
            Some(dst) => dst.copy_from_slice(b),
            None => n.heap = Some(b.into()),
        }
        n
    }
}

impl std::ops::Deref for Name {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match &self.heap {
            Some(h) => h,
            None => &self.inline[..self.len],
        }
    }
}

/// How soon a write that waited for the gate (paused writes, loading) is tried again.
pub const RETRY_US: i64 = 10_000;

fn mismatch(m: crate::lock::value::Mismatch) -> LockError {
    match m {
        crate::lock::value::Mismatch::Mode => LockError::WrongMode,
        crate::lock::value::Mismatch::Limit(n) => LockError::LimitMismatch(n),
    }
}

/// Who is removed by `remove_holders`.
#[derive(Debug, Clone, Copy)]
enum Which<'a> {
    Token(&'a [u8]),
    Fence(u64),
    Digest(&'a Digest),
    All,
}

/// A grant to make: everything but the fence.
#[derive(Clone, Copy)]
struct NewHolder<'a> {
    mode: Mode,
    digest: Digest,
    ttl: u64,
    min_fence: u64,
    owner: Option<&'a [u8]>,
    lock_delay: u32,
    client_id: u64,
    addr: &'a Addr,
    /// The session it belongs to (its lease is the session's).
    session: Option<Digest>,
}

impl<W> Engine<W> {
    pub fn new() -> Self {
        Engine {
            fence: FenceClock::new(),
            stats: Stats::default(),
            settings: Settings {
                max_waiters: 10_000,
                refuse_grants: None,
            },
            queues: HashMap::new(),
            by_id: HashMap::new(),
            watches: HashMap::new(),
            watch_ids: HashMap::new(),
            agenda: BTreeSet::new(),
            leases: leases::Leases::default(),
            leases_paused: false,
            now: 0,
            tokens: tokens::TokenCache::default(),
            restoring: HashMap::new(),
            sessions: sessions::Sessions::default(),
            multi: HashMap::new(),
        }
    }

    /// Clients waiting now.
    pub fn waiting(&self) -> usize {
        self.by_id.len()
    }

    /// Lock keys the engine tracks leases of.
    pub fn tracked(&self) -> usize {
        self.leases.len()
    }

    // ---- the lease index -----------------------------------------------------------------

    /// Keeps the lease index in step with a change of one key's value: `before` and
    /// `after` are its earliest lease end before and after (None: no value). A later end
    /// keeps the earlier entry (the sweep files the key again when it finds the lease
    /// running), so lengthening a lease costs nothing here.
    /// The checks are inlined: an extend (a later end) costs no call.
    #[inline]
    fn reindex(&mut self, db: i32, name: &[u8], before: Option<i64>, after: Option<i64>) {
        let unchanged = match (before, after) {
            (Some(b), Some(a)) => a >= b,
            (b, a) => b == a,
        };
        if !unchanged {
            self.refile(db, name, before, after);
        }
    }

    fn refile(&mut self, db: i32, name: &[u8], before: Option<i64>, after: Option<i64>) {
        if let Some(b) = before {
            self.leases.remove(b, db, name);
        }
        if let Some(a) = after {
            self.leases.insert(a, db, name, self.now);
        }
    }

    /// A lock value came into the keyspace without the engine (loaded from an RDB file
    /// or a RESTORE payload): track its leases.
    pub fn loaded(&mut self, db: i32, name: &[u8], v: &LockValue, now: i64) {
        self.now = self.now.max(now);
        let at = v.next_lease_end().unwrap_or(now);
        self.leases.insert(at, db, name, self.now);
        self.note(db, name, self.now);
        self.sessions_seen(db, name, v);
    }

    // ---- the grant --------------------------------------------------------------------------

    /// The one place that makes a grant: a fresh fence, the holder stored (a new value
    /// or one more holder of a shared/counted lock), then replicated.
    fn grant(&mut self, ks: &mut impl Keyspace, g: NewHolder<'_>) -> Result<u64, LockError> {
        let clock = ks.clock();
        let deadline = match self.session_lease(g.session.as_ref())? {
            Some(d) => d,
            None => clock.after_ms(i64::try_from(g.ttl).unwrap_or(i64::MAX)),
        };
        let fence = self.fence.next(clock.wall, g.min_fence)?;
        let holder = crate::lock::value::Holder::new(
            g.digest,
            fence,
            deadline,
            clock.wall,
            g.client_id,
            g.addr.clone(),
            g.owner.map(Into::into),
        )
        .with_lock_delay(g.lock_delay)
        .with_session(g.session);
        let db = ks.db();
        let sent = holder.clone();
        match ks.read()? {
            Slot::Free => {
                ks.put(LockValue::new(g.mode, holder))?;
                self.reindex(db, ks.name(), None, Some(deadline));
            }
            Slot::Lock(v) if v.mode() == g.mode && g.mode != Mode::Exclusive => {
                let before = v.next_lease_end();
                v.insert(holder, crate::lock::fence::MAX_FENCE)
                    .map_err(|_| LockError::Internal("lock.acquire"))?;
                let after = v.next_lease_end();
                self.reindex(db, &Name::of(ks.name()), before, after);
            }
            _ => return Err(LockError::Internal("lock.acquire")),
        }
        ks.replicate(Change::Add {
            mode: g.mode,
            holder: &sent,
            floor: 0,
        });
        if let Some(s) = &g.session {
            self.session_holds(s, db, ks.name());
        }
        self.stats.acquired += 1;
        Ok(fence)
    }

    /// The holder `digest` names gets a new lease of `ttl` ms (a same-token retry, or a
    /// same-token waiter reaching the head of the queue); a holder in a session, its
    /// session's lease (the retry must name that session). MINFENCE only lifts the
    /// counter. Returns its fence, or WRONGMODE when it holds in another mode.
    fn renew(
        &mut self,
        ks: &mut impl Keyspace,
        digest: &Digest,
        mode: Mode,
        ttl: u64,
        min_fence: u64,
        session: Option<&Digest>,
    ) -> Result<Option<u64>, LockError> {
        let clock = ks.clock();
        let deadline = match self.session_lease(session)? {
            Some(d) => d,
            None => clock.after_ms(i64::try_from(ttl).unwrap_or(i64::MAX)),
        };
        let (db, name) = (ks.db(), Name::of(ks.name()));
        let Slot::Lock(v) = ks.read()? else {
            return Ok(None);
        };
        let Some((fence, held_in)) = v.find(digest).map(|h| (h.fence, h.session().copied())) else {
            return Ok(None);
        };
        if held_in.as_ref() != session {
            return Err(LockError::InSession);
        }
        if v.mode() != mode {
            return Err(match (v.mode(), mode) {
                (Mode::Counted(n), Mode::Counted(_)) => LockError::LimitMismatch(n),
                _ => LockError::WrongMode,
            });
        }
        let before = v.next_lease_end();
        v.set_deadline(fence, deadline);
        let after = v.next_lease_end();
        self.reindex(db, &name, before, after);
        let floor = if min_fence > 0 {
            self.fence.observe(min_fence);
            Some(self.fence.last()).filter(|f| *f > fence).unwrap_or(0)
        } else {
            0
        };
        ks.replicate(Change::Renew {
            fence,
            deadline,
            floor,
        });
        Ok(Some(fence))
    }

    /// Removes holders whose lease is over, as an expiry would: replicated, counted,
    /// notified. A holder with a lock-delay leaves it running behind it (the key stays,
    /// empty, until the delay ends); the key is deleted when nothing is left.
    fn reap(&mut self, ks: &mut impl Keyspace) -> Result<(), LockError> {
        let now = ks.clock().mono;
        if !matches!(ks.read()?, Slot::Lock(_)) {
            return Ok(());
        }
        let (db, name) = (ks.db(), Name::of(ks.name()));
        let Slot::Lock(v) = ks.read()? else {
            return Ok(());
        };
        let ended = v.ended(now);
        let delay_running = v.delaying(now);
        if ended.is_empty() && (!v.is_empty() || delay_running) {
            let before = v.next_lease_end();
            if !v.is_empty() && v.clear_ended_delay(now) {
                let after = v.next_lease_end();
                self.reindex(db, &name, before, after);
            }
            return Ok(());
        }
        let sessions: Vec<Digest> = match self.sessions.is_empty() {
            true => Vec::new(),
            false => (ended.iter())
                .filter_map(|f| v.find_fence(*f).and_then(|h| h.session()).copied())
                .collect(),
        };
        let before = v.next_lease_end();
        let mode = v.mode();
        let left_behind = ended
            .iter()
            .filter_map(|f| v.find_fence(*f).and_then(|h| h.delay_end()))
            .chain(v.delay_until())
            .max()
            .filter(|t| *t > now);
        let whole = mode == Mode::Exclusive || ended.len() == v.len();
        if !(whole && mode == Mode::Exclusive) {
            for f in &ended {
                v.remove_fence(*f);
            }
            if let Some(t) = left_behind {
                v.set_delay(t);
            }
        }
        let after = if whole {
            left_behind
        } else {
            v.next_lease_end()
        };
        self.stats.expired += ended.len() as u64;
        self.reindex(db, &name, before, after);
        match (whole, left_behind) {
            (true, None) => {
                ks.remove();
                ks.replicate(Change::Delete);
            }
            (true, Some(t)) if mode == Mode::Exclusive => {
                ks.remove();
                ks.put(LockValue::delayed(mode, t))?;
                ks.replicate(Change::Delay { until: t });
            }
            _ => {
                for fence in &ended {
                    ks.replicate(Change::Drop { fence: *fence });
                }
                if let Some(t) = left_behind {
                    ks.replicate(Change::Delay { until: t });
                }
            }
        }
        if !ended.is_empty() {
            ks.changed(Event::Expired);
        }
        self.sessions_left(ks, &sessions);
        // The key's waiters are served at the next tick: the command that found the
        // leases over (before their timer, after a stall) may not hand the lock over.
        if self.has_waiters(db, &name) {
            self.serve_by(db, &name, now);
        }
        Ok(())
    }

    /// Removes one holder (by token, fence or digest) or every holder; true if one was.
    fn remove_holders(
        &mut self,
        ks: &mut impl Keyspace,
        which: Which<'_>,
    ) -> Result<bool, LockError> {
        self.reap(ks)?;
        let (db, name) = (ks.db(), Name::of(ks.name()));
        let now = ks.clock().mono;
        let token_digest = match which {
            Which::Token(t) => self.tokens.digest(t),
            _ => [0; 16],
        };
        let mut sessions: Vec<Digest> = Vec::new();
        let left = match ks.read()? {
            Slot::Free => return Ok(false),
            Slot::Classic(_) => match which {
                Which::Token(t) if ks.classic_matches(t) => None,
                Which::All => None,
                _ => return Ok(false),
            },
            Slot::Lock(v) => {
                let fence = match which {
                    Which::Token(_) => v.find(&token_digest).map(|h| h.fence),
                    Which::Digest(d) => v.find(d).map(|h| h.fence),
                    Which::Fence(f) => v.find_fence(f).map(|h| h.fence),
                    Which::All => None,
                };
                if !self.sessions.is_empty() {
                    sessions = (v.iter())
                        .filter(|h| matches!(which, Which::All) || Some(h.fence) == fence)
                        .filter_map(|h| h.session().copied())
                        .collect();
                }
                let before = v.next_lease_end();
                match (which, fence) {
                    (Which::All, _) => {
                        self.reindex(db, &name, before, None);
                        None
                    }
                    (_, None) => return Ok(false),
                    // The last holder goes; a lock-delay another one left still runs.
                    (_, Some(_)) if v.len() == 1 && !v.delaying(now) => {
                        self.reindex(db, &name, before, None);
                        None
                    }
                    (_, Some(f)) => {
                        v.remove_fence(f);
                        let after = v.next_lease_end();
                        self.reindex(db, &name, before, after);
                        Some(f)
                    }
                }
            }
        };
        match left {
            None => {
                ks.remove();
                ks.replicate(Change::Delete);
            }
            Some(fence) => ks.replicate(Change::Drop { fence }),
        }
        self.sessions_left(ks, &sessions);
        Ok(true)
    }

    /// Removes holders, then (when one was removed) notifies, counts and hands over: the
    /// one place a release, a revocation and a forced release end.
    fn release_and_serve<S: Sched<Waiter = W>>(
        &mut self,
        ks: &mut impl Keyspace,
        sched: &mut S,
        which: Which<'_>,
        forced: bool,
    ) -> Result<bool, LockError> {
        let removed = self.remove_holders(ks, which)?;
        if removed {
            if forced {
                ks.changed(Event::ForceRelease);
                self.stats.force_released += 1;
            } else {
                ks.changed(Event::Release);
                self.stats.released += 1;
            }
            self.serve(ks, sched);
        }
        Ok(removed)
    }
}
