//! Model checking of the real engine. Random sequences of acquire (exclusive, shared,
//! counted; blocking or not; inside MULTI; clients sharing a token) / release / extend /
//! force-release / key deletion / disconnect / write pauses / time passing / steps of
//! the wall clock run against the engine over an in-memory keyspace, and after every
//! step a small reference model checks:
//!
//! - never an exclusive holder beside any other holder, never more than n holders of a
//!   counted key, never two holders with one token (the model's own view of the grants);
//! - the engine's stored holders are exactly the model's live grants, and each lease
//!   ends when its length has passed on the monotonic clock, whatever the wall clock did;
//! - strict FIFO: a waiter is granted only when everyone queued before it on that key
//!   was answered; no barging; a free key never keeps a grantable waiter queued while
//!   writes are allowed;
//! - fences strictly increase;
//! - every waiter is answered exactly once (or left by disconnecting), and at the end
//!   every waiter has been answered;
//! - every value passes the validity rule and comes back equal from its RDB encoding;
//! - a replica fed with the encoded replication stream holds the same keyspace;
//! - watchers (LOCK.WATCH, with and without FENCE and OWNER, with BLOCK limits, in
//!   MULTI) are answered only once their wait is over or their time is up, each with who
//!   holds the key at that moment; none stays blocked once its wait is over, and none
//!   past its BLOCK time; a relabel (EXTEND ... OWNER) keeps the fence;
//! - sessions (LOCK.SESSION OPEN / KEEPALIVE / CLOSE, LOCK.ACQUIRE ... SESSION, blocking
//!   or not): a grant in a session has the session's lease, a keepalive moves every one of
//!   them, the end of the session (its TTL, CLOSE) ends every one of them and serves their
//!   waiters in order, a waiter of a session that ended is refused (NOSESSION), and a
//!   session lock is never extended on its own; the replica gets the same sessions;
//! - all-or-nothing acquires of two keys (LOCK.ACQUIREALL, blocking or not, by clients
//!   11..14 on keys 0..3): granted on both keys in one step or on none, never past anyone
//!   queued before on either key (FIFO per key, no barging), and never stuck: a request
//!   first in line on both keys that both admit is granted (no deadlock, whatever order
//!   the clients name the keys in).

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};

use proptest::prelude::*;

use super::*;
use crate::lock::codec::{self, repl, Fields, Policy};
use crate::lock::value::{self, Mode};

const WALL0: i64 = 1_800_000_000_000;

// ---- an in-memory keyspace ---------------------------------------------------------------

/// One command of the replication stream: key, arguments, command name.
type Sent = (Box<[u8]>, Vec<Vec<u8>>, String);

#[derive(Default)]
struct World {
    /// Monotonic ms.
    now: i64,
    /// Wall clock minus monotonic clock, ms (a step moves it).
    wall_offset: i64,
    keys: HashMap<Box<[u8]>, LockValue>,
    paused: bool,
    repl: Vec<Sent>,
    tokens: u64,
}

impl World {
    fn clock(&self) -> Clock {
        Clock {
            mono: self.now * 1000,
            wall: self.now + self.wall_offset,
        }
    }
}

struct MemKey<'a> {
    w: &'a mut World,
    name: Box<[u8]>,
}

impl Keyspace for MemKey<'_> {
    fn db(&self) -> i32 {
        0
    }
    fn name(&self) -> &[u8] {
        &self.name
    }
    fn clock(&self) -> Clock {
        self.w.clock()
    }
    fn read(&mut self) -> Result<Slot<'_>, LockError> {
        Ok(match self.w.keys.get_mut(&self.name) {
            None => Slot::Free,
            Some(v) => Slot::Lock(v),
        })
    }
    fn put(&mut self, v: LockValue) -> Result<(), LockError> {
        assert!(!self.w.paused, "the engine wrote while writes were paused");
        assert!(!self.w.keys.contains_key(&self.name), "put over a value");
        self.w.keys.insert(self.name.clone(), v);
        Ok(())
    }
    fn remove(&mut self) {
        assert!(
            !self.w.paused,
            "the engine deleted while writes were paused"
        );
        self.w.keys.remove(&self.name);
    }
    fn classic_matches(&mut self, _token: &[u8]) -> bool {
        false
    }
    fn set_classic_expiry(&mut self, _at: i64) {}
    fn replicate(&mut self, c: Change<'_>) {
        let clock = self.w.clock();
        let name = self.name.clone();
        repl::encode(&c, clock, &mut |cmd, args| {
            let cmd = cmd.to_string_lossy().into_owned();
            let args = args.iter().map(|a| a.to_vec()).collect();
            self.w.repl.push((name.clone(), args, cmd));
        });
    }
    fn changed(&mut self, _ev: Event) {}
    fn gate(&mut self) -> Gate {
        if self.w.paused {
            Gate::Later
        } else {
            Gate::Now
        }
    }
    fn new_token(&mut self) -> [u8; 36] {
        self.w.tokens += 1;
        let mut t = [b'g'; 36];
        t[..8].copy_from_slice(&self.w.tokens.to_be_bytes());
        t
    }
    fn waits_on_classic(&mut self) {}
}

struct MemStore<'a> {
    w: &'a mut World,
}

impl Store for MemStore<'_> {
    type Key<'k>
        = MemKey<'k>
    where
        Self: 'k;
    fn open(&mut self, db: i32, name: &[u8]) -> Option<Self::Key<'_>> {
        (db == 0).then(|| MemKey {
            w: self.w,
            name: name.into(),
        })
    }
    fn clock(&self) -> Clock {
        self.w.clock()
    }
    fn replicate_session(&mut self, c: &crate::lock::codec::repl::SessionChange<'_>) {
        let clock = self.w.clock();
        repl::encode_session(c, clock, &mut |cmd, args| {
            let cmd = cmd.to_string_lossy().into_owned();
            let args = args.iter().map(|a| a.to_vec()).collect();
            self.w.repl.push((Box::default(), args, cmd));
        });
    }
}

// ---- an in-memory scheduler -----------------------------------------------------------------

#[derive(Default)]
struct MemSched {
    answers: Vec<(WaiterId, Answer)>,
    /// The id the next `block` hands out, if blocking is allowed.
    next_block: Option<WaiterId>,
    wake: Option<i64>,
}

impl Sched for MemSched {
    type Waiter = WaiterId;
    fn block(&mut self) -> Option<(WaiterId, WaiterId)> {
        self.next_block.take().map(|id| (id, id))
    }
    fn answer(&mut self, w: WaiterId, a: Answer) {
        self.answers.push((w, a));
    }
    fn wake_at(&mut self, at: i64) {
        self.wake = Some(self.wake.map_or(at, |w| w.min(at)));
    }
}

// ---- the reference model --------------------------------------------------------------------

#[derive(Debug, Clone, PartialEq)]
struct Grant {
    token: Vec<u8>,
    mode: Mode,
    fence: u64,
    /// Monotonic ms.
    deadline: i64,
    /// ms the key stays closed after this lease ends without a release.
    lock_delay: i64,
    owner: Option<Vec<u8>>,
    /// The client whose session it belongs to.
    session: Option<u8>,
}

/// A watcher, as the model sees it.
#[derive(Debug, Clone)]
struct Watching {
    key: u8,
    client: u8,
    /// None: waits until the key is held; Some((fence, label)): until that fence no longer
    /// holds it (or, with a label, is labelled otherwise).
    gone: Option<(u64, Option<Vec<u8>>)>,
    /// Monotonic ms (None: no limit).
    deadline: Option<i64>,
}

#[derive(Debug, Clone)]
struct Waiting {
    key: u8,
    client: u8,
    token: Vec<u8>,
    mode: Mode,
    /// The lease it asked for (ms).
    ttl: i64,
    lock_delay: i64,
    owner: Option<Vec<u8>>,
    /// Monotonic ms of its BLOCK time (None: no limit).
    deadline: Option<i64>,
    session: Option<u8>,
}

#[derive(Default)]
struct Model {
    watchers: HashMap<WaiterId, Watching>,
    watch_blocked: HashMap<u8, WaiterId>,
    holders: HashMap<u8, Vec<Grant>>,
    queues: HashMap<u8, VecDeque<WaiterId>>,
    waiting: HashMap<WaiterId, Waiting>,
    answered: HashSet<WaiterId>,
    gone: HashSet<WaiterId>,
    blocked: HashMap<u8, WaiterId>,
    last_fence: u64,
    /// Per key: nothing is granted before this instant (a lock-delay left by a lease
    /// that ended without a release).
    delays: HashMap<u8, i64>,
    /// The open sessions (0..3, see `session_of`): their deadline (ms).
    sessions: HashMap<u8, i64>,
    /// Waiters for two keys at once (their id is in the queue of each).
    multi: HashMap<WaiterId, Multi>,
}

/// A LOCK.ACQUIREALL waiter, as the model sees it.
#[derive(Debug, Clone)]
struct Multi {
    keys: Vec<(u8, Mode)>,
    client: u8,
    token: Vec<u8>,
    ttl: i64,
    deadline: Option<i64>,
}

/// The session a client works in (clients 0..6; two clients share each of sessions 0..3,
/// as two workers of one job).
fn session_of(client: u8) -> u8 {
    client % 3
}

/// The id of session `s`.
fn session_id(s: u8) -> Vec<u8> {
    format!("session-number-{s}-of-the-model").into_bytes()
}

/// Clients 0..8; clients 6 and 7 share one token (as two connections of one service).
fn token(client: u8) -> Vec<u8> {
    let c = if (6..8).contains(&client) { 6 } else { client };
    format!("token-of-client-{c}").into_bytes()
}

fn key_name(key: u8) -> Box<[u8]> {
    vec![b'k', key].into()
}

fn fits(holders: &[Grant], want: Mode) -> bool {
    if holders.is_empty() {
        return true;
    }
    match want {
        Mode::Exclusive => false,
        Mode::Shared => holders.iter().all(|h| h.mode == Mode::Shared),
        Mode::Counted(n) => holders.len() < n as usize,
    }
}

impl Model {
    /// The family a new acquire of `key` must match. With writes allowed the key's queue
    /// is served first, and waiters whose BLOCK time ran out (in a stall) leave first.
    fn family(&mut self, key: u8, now: i64, serve: bool) -> Option<value::Family> {
        if let Some(g) = self.live(key, now).first() {
            return Some(g.mode.family());
        }
        let (waiting, multi) = (&self.waiting, &self.multi);
        let head = self.queues.get(&key)?.iter().find(|id| {
            multi.contains_key(id) || !serve || waiting[*id].deadline.is_none_or(|d| now < d)
        })?;
        match multi.get(head) {
            // Multi requests are on keys 0..3 only: read-write locks.
            Some(_) => Some(value::Family::ReadWrite),
            None => Some(waiting[head].mode.family()),
        }
    }

    /// Whether multi waiter `id` is first in line on each of its keys and each admits it.
    fn multi_grantable(&mut self, id: WaiterId, now: i64) -> bool {
        let m = self.multi[&id].clone();
        m.keys.iter().all(|(k, mode)| {
            let first = self.queues.get(k).and_then(|q| q.front()) == Some(&id);
            first && !self.delayed(*k, now) && fits(self.live(*k, now), *mode)
        })
    }

    /// A multi waiter's answer: granted on every key at once (first in line on each), or
    /// nil / an error, leaving every queue.
    fn multi_answer(&mut self, id: WaiterId, a: &Answer, now: i64) {
        assert!(
            !self.gone.contains(&id),
            "multi waiter {id} answered after it left"
        );
        assert!(self.answered.insert(id), "multi waiter {id} answered twice");
        let m = self.multi[&id].clone();
        if let Answer::GrantedAll { fences, token, .. } = a {
            assert_eq!(token, &m.token);
            assert!(
                m.deadline.is_none_or(|d| now < d),
                "multi waiter {id} granted past its BLOCK time"
            );
            assert!(
                self.multi_grantable(id, now),
                "multi waiter {id} ({m:?}) granted when not first on every key or not admitted"
            );
            assert_eq!(fences.len(), m.keys.len());
            for ((k, mode), f) in m.keys.iter().zip(fences) {
                self.queues.entry(*k).or_default().retain(|x| *x != id);
                let g = Grant {
                    token: m.token.clone(),
                    mode: *mode,
                    fence: *f,
                    deadline: now + m.ttl,
                    lock_delay: 0,
                    owner: None,
                    session: None,
                };
                self.record_grant(*k, g, now);
            }
        } else {
            for (k, _) in &m.keys {
                self.queues.entry(*k).or_default().retain(|x| *x != id);
            }
        }
        self.blocked.remove(&m.client);
    }

    fn live(&mut self, key: u8, now: i64) -> &mut Vec<Grant> {
        let hs = self.holders.entry(key).or_default();
        let delay = hs
            .iter()
            .filter(|h| now >= h.deadline && h.lock_delay > 0)
            .map(|h| h.deadline + h.lock_delay)
            .max();
        if let Some(t) = delay {
            let d = self.delays.entry(key).or_insert(t);
            *d = (*d).max(t);
        }
        hs.retain(|h| now < h.deadline);
        hs
    }

    /// Whether a lock-delay keeps `key` closed at `now`.
    fn delayed(&mut self, key: u8, now: i64) -> bool {
        self.live(key, now);
        self.delays.get(&key).is_some_and(|t| now < *t)
    }

    fn holder_of(&mut self, key: u8, tok: &[u8], now: i64) -> Option<Grant> {
        self.live(key, now).iter().find(|g| g.token == tok).cloned()
    }

    /// Whether `client`'s session is open at `now` (one whose lease ran out is gone).
    fn session_open(&mut self, client: u8, now: i64) -> Option<i64> {
        match self.sessions.get(&client) {
            Some(d) if now < *d => Some(*d),
            Some(_) => {
                self.sessions.remove(&client);
                None
            }
            None => None,
        }
    }

    /// Every live grant of `client`'s session now ends at `deadline` (one whose lease
    /// is over stays over).
    fn renew_session(&mut self, client: u8, deadline: i64, now: i64) {
        for hs in self.holders.values_mut() {
            for g in hs
                .iter_mut()
                .filter(|g| g.session == Some(client) && now < g.deadline)
            {
                g.deadline = deadline;
            }
        }
    }

    /// A new grant the engine made: must not break exclusion.
    fn record_grant(&mut self, key: u8, g: Grant, now: i64) {
        assert!(
            g.fence > self.last_fence,
            "fence {} after {}",
            g.fence,
            self.last_fence
        );
        self.last_fence = g.fence;
        assert!(
            !self.delayed(key, now),
            "grant {g:?} on key {key} during its lock-delay"
        );
        let hs = self.live(key, now);
        assert!(fits(hs, g.mode), "grant {g:?} on key {key} beside {hs:?}");
        assert!(
            !hs.iter().any(|h| h.token == g.token),
            "two holders with one token"
        );
        hs.push(g);
    }

    /// Whether a watcher's wait is over at `now`.
    fn watch_met(&mut self, w: &Watching, now: i64) -> bool {
        let hs = self.live(w.key, now);
        match &w.gone {
            None => !hs.is_empty(),
            Some((fence, label)) => match hs.iter().find(|g| g.fence == *fence) {
                Some(g) => label.as_ref().is_some_and(|l| g.owner.as_ref() != Some(l)),
                None => true,
            },
        }
    }

    /// Who holds the key, as LOCK.WATCH answers it (from the model's own grants).
    fn summary(&mut self, key: u8, now: i64) -> Reply<'static> {
        let mut hs = self.live(key, now).clone();
        if hs.is_empty() {
            return Reply::Nil;
        }
        hs.sort_by_key(|g| g.fence);
        let label =
            |o: &Option<Vec<u8>>| o.clone().map_or(Reply::Nil, |o| Reply::Bulk(Bytes::Own(o)));
        let mode = hs[0].mode;
        let mut m: Vec<(&'static str, Reply<'static>)> = vec![
            ("state", Reply::text("held")),
            ("kind", Reply::text("module")),
            ("mode", Reply::text(mode.name())),
        ];
        if mode == Mode::Exclusive {
            m.push(("fence", Reply::Int(hs[0].fence as i64)));
            m.push(("owner", label(&hs[0].owner)));
        }
        m.push(("holders", Reply::Int(hs.len() as i64)));
        let list = hs
            .iter()
            .take(watch::SUMMARY_HOLDERS)
            .map(|g| {
                Reply::Map(vec![
                    ("fence", Reply::Int(g.fence as i64)),
                    ("owner", label(&g.owner)),
                ])
            })
            .collect();
        m.push(("holder-list", Reply::Array(list)));
        Reply::Map(m).into_static()
    }

    /// A watcher's answer: once, only when its wait is over or its time is up, with the
    /// key as it is.
    fn watch_answer(&mut self, id: WaiterId, a: &Answer, now: i64) {
        assert!(
            !self.gone.contains(&id),
            "watcher {id} answered after it left"
        );
        assert!(self.answered.insert(id), "watcher {id} answered twice");
        let w = self.watchers[&id].clone();
        let Answer::State(r) = a else {
            panic!("watcher {id} answered {a:?}");
        };
        let timed_out = w.deadline.is_some_and(|d| now >= d);
        assert!(
            timed_out || self.watch_met(&w, now),
            "watcher {id} ({w:?}) answered before its wait was over: {r:?}"
        );
        let want = self.summary(w.key, now);
        assert_eq!(r.clone().into_static(), want, "watcher {id} told {r:?}");
        self.watch_blocked.remove(&w.client);
    }

    fn answer(&mut self, id: WaiterId, a: &Answer, now: i64) {
        if self.watchers.contains_key(&id) {
            return self.watch_answer(id, a, now);
        }
        if self.multi.contains_key(&id) {
            return self.multi_answer(id, a, now);
        }
        assert!(
            !self.gone.contains(&id),
            "waiter {id} answered after it left"
        );
        assert!(self.answered.insert(id), "waiter {id} answered twice");
        let w = self
            .waiting
            .get(&id)
            .cloned()
            .expect("answer to an unknown waiter");
        let q = self.queues.entry(w.key).or_default();
        let at = q
            .iter()
            .position(|x| *x == id)
            .expect("answer to a waiter not queued");
        if let Answer::Granted { fence, token, .. } = a {
            assert_eq!(at, 0, "waiter {id} granted ahead of {:?} (FIFO)", q);
            assert!(
                w.deadline.is_none_or(|d| now < d),
                "waiter {id} granted at {now}, when its BLOCK time was over ({w:?})"
            );
            assert_eq!(token, &w.token);
            q.remove(at);
            let deadline = match w.session {
                Some(c) => self
                    .session_open(c, now)
                    .unwrap_or_else(|| panic!("waiter {id} granted in a session that ended")),
                None => now + w.ttl,
            };
            match self.holder_of(w.key, &w.token, now) {
                // A waiter whose token holds the key gets that holder's grant, renewed.
                Some(g) => {
                    assert_eq!(*fence, g.fence, "a same-token hand-off keeps the fence");
                    assert_eq!(g.mode, w.mode);
                    if let Some(h) = self
                        .live(w.key, now)
                        .iter_mut()
                        .find(|h| h.token == w.token)
                    {
                        h.deadline = deadline;
                    }
                }
                None => {
                    let g = Grant {
                        token: w.token.clone(),
                        mode: w.mode,
                        fence: *fence,
                        deadline,
                        lock_delay: w.lock_delay,
                        owner: w.owner.clone(),
                        session: w.session,
                    };
                    self.record_grant(w.key, g, now);
                }
            }
        } else {
            q.remove(at);
            if let (Answer::Failed(LockError::NoSession), Some(c)) = (a, w.session) {
                assert!(
                    self.session_open(c, now).is_none(),
                    "waiter {id} refused NOSESSION with its session open"
                );
            }
        }
        self.blocked.remove(&w.client);
    }
}

// ---- operations -----------------------------------------------------------------------------

#[derive(Debug, Clone)]
enum Op {
    Acquire {
        key: u8,
        client: u8,
        shared: bool,
        ttl: u16,
        block: Option<u16>,
        wrong_limit: bool,
        in_multi: bool,
        delay: bool,
        /// In the client's session (clients 0..6).
        session: bool,
    },
    /// LOCK.ACQUIREALL of keys `a` and `b` (distinct, 0..3) by client 11..14, each shared or
    /// exclusive; RELEASEALL of the keys it holds when `release`.
    Multi {
        client: u8,
        a: u8,
        b: u8,
        shared: (bool, bool),
        ttl: u16,
        block: Option<u16>,
        release: bool,
    },
    /// LOCK.SESSION OPEN (or, when open, a renew) / KEEPALIVE / CLOSE by client 0..6.
    Session {
        client: u8,
        what: u8,
        ttl: u16,
    },
    Release {
        key: u8,
        client: u8,
    },
    Extend {
        key: u8,
        client: u8,
        ttl: u16,
        /// OWNER: relabel the holder ("L0".."L2").
        label: Option<u8>,
    },
    /// LOCK.WATCH by clients 8..11: `fence` 0 none, 1 the first holder's, 2 that with its
    /// label as OWNER, 3 an old fence.
    Watch {
        key: u8,
        client: u8,
        fence: u8,
        block: Option<u16>,
        in_multi: bool,
    },
    Force {
        key: u8,
        one: bool,
    },
    Del {
        key: u8,
    },
    Disconnect {
        client: u8,
    },
    Pause(bool),
    Tick(u16),
    /// Time passes while the server is busy (a long command, DEBUG SLEEP): the next
    /// command runs before the timers that came due meanwhile.
    Stall(u16),
    /// The wall clock steps (seconds, either way); leases must not notice.
    WallStep(i16),
}

const KEYS: u8 = 4;
/// The lock-delay some grants ask for (ms).
const LOCK_DELAY: u32 = 25;
/// Key 3 is a semaphore with this many permits; keys 0..3 are read-write locks.
const LIMIT: u32 = 2;

fn mode_for(key: u8, shared: bool, wrong_limit: bool) -> Mode {
    match (key, shared) {
        (3, _) if wrong_limit => Mode::Counted(LIMIT + 1),
        (3, _) => Mode::Counted(LIMIT),
        (_, true) => Mode::Shared,
        _ => Mode::Exclusive,
    }
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..KEYS, 0u8..8, any::<bool>(), 1u16..60, prop::option::of(0u16..80),
              prop::bool::weighted(0.05), prop::bool::weighted(0.1), prop::bool::weighted(0.2),
              prop::bool::weighted(0.5))
            .prop_map(|(key, client, shared, ttl, block, wrong_limit, in_multi, delay, session)| Op::Acquire {
                key, client, shared, ttl, block, wrong_limit, in_multi, delay, session: session && client < 6
            }),
        4 => (0u8..6, 0u8..3, 1u16..80).prop_map(|(client, what, ttl)| Op::Session { client, what, ttl }),
        3 => (11u8..14, 0u8..3, 1u8..3, any::<(bool, bool)>(), 1u16..60,
              prop::option::of(0u16..80), prop::bool::weighted(0.3))
            .prop_map(|(client, a, step, shared, ttl, block, release)| Op::Multi {
                client, a, b: (a + step) % 3, shared, ttl, block, release
            }),
        3 => (0..KEYS, 0u8..8).prop_map(|(key, client)| Op::Release { key, client }),
        1 => (0..KEYS, 0u8..8, 1u16..60, prop::option::weighted(0.3, 0u8..3))
            .prop_map(|(key, client, ttl, label)| Op::Extend { key, client, ttl, label }),
        3 => (0..KEYS, 8u8..11, 0u8..4, prop::option::of(1u16..80), prop::bool::weighted(0.1))
            .prop_map(|(key, client, fence, block, in_multi)| Op::Watch { key, client, fence, block, in_multi }),
        1 => (0..KEYS, any::<bool>()).prop_map(|(key, one)| Op::Force { key, one }),
        1 => (0..KEYS).prop_map(|key| Op::Del { key }),
        1 => (0u8..14).prop_map(|client| Op::Disconnect { client }),
        1 => any::<bool>().prop_map(Op::Pause),
        4 => (0u16..40).prop_map(Op::Tick),
        1 => (1u16..120).prop_map(Op::Stall),
        1 => (-600i16..600).prop_map(Op::WallStep),
    ]
}

// ---- the harness ----------------------------------------------------------------------------

struct Harness {
    w: World,
    e: Engine<WaiterId>,
    s: MemSched,
    m: Model,
    next_waiter: WaiterId,
    /// A replica fed with everything the primary replicated.
    replica: World,
    replica_engine: Engine<WaiterId>,
}

impl Harness {
    fn new(start: i64) -> Harness {
        let mut e = Engine::new();
        let w = World {
            now: start,
            wall_offset: WALL0,
            ..World::default()
        };
        e.fence.start(w.clock().wall);
        Harness {
            replica: World {
                now: start,
                wall_offset: WALL0 - 777,
                ..World::default()
            },
            w,
            e,
            s: MemSched::default(),
            m: Model::default(),
            next_waiter: 0,
            replica_engine: Engine::new(),
        }
    }

    fn cmd(&mut self, key: u8, c: Command<'_>) -> Option<Reply<'static>> {
        let mut ks = MemKey {
            w: &mut self.w,
            name: key_name(key),
        };
        match self.e.handle(c, &mut ks, &mut self.s) {
            Outcome::Reply(r) => Some(match r {
                Reply::Grant(t, f) => Reply::Grant(Bytes::Own(t.into_owned()), f),
                Reply::Int(i) => Reply::Int(i),
                Reply::Nil => Reply::Nil,
                Reply::Error(e) => Reply::Error(e),
                Reply::Map(m) => Reply::Map(m).into_static(),
                other => panic!("unexpected reply {other:?}"),
            }),
            Outcome::Blocked => None,
        }
    }

    /// Takes the answers the engine gave and checks them.
    fn settle(&mut self) {
        let now = self.w.now;
        for (id, a) in std::mem::take(&mut self.s.answers) {
            self.m.answer(id, &a, now);
        }
    }

    /// Lets the engine do what is due (the shell's timer and cron).
    fn run_timers(&mut self) {
        for _ in 0..50 {
            let due = self.e.next_due().is_some_and(|t| t <= self.w.now * 1000);
            if !due {
                break;
            }
            let mut store = MemStore { w: &mut self.w };
            self.e.tick(&mut store, &mut self.s);
            self.settle();
        }
    }

    fn held_by(&mut self, key: u8, client: u8) -> bool {
        let now = self.w.now;
        self.m.holder_of(key, &token(client), now).is_some()
    }

    #[allow(clippy::too_many_arguments)]
    fn acquire(
        &mut self,
        key: u8,
        client: u8,
        mode: Mode,
        ttl: u16,
        block: Option<u16>,
        in_multi: bool,
        delay: bool,
        session: bool,
    ) {
        let now = self.w.now;
        let tok = token(client);
        let sid = session_id(session_of(client));
        let in_session = session.then_some(session_of(client));
        let session_deadline = self.m.session_open(session_of(client), now);
        if session && session_deadline.is_none() {
            let req = self.acquire_req(client, mode, ttl, block, delay, &tok, Some(&sid), None);
            let r = self.cmd(key, Command::Acquire(req));
            assert_eq!(
                r,
                Some(Reply::Error(LockError::NoSession)),
                "acquire in a closed session"
            );
            return self.settle();
        }
        let held_before = self.m.holder_of(key, &tok, now);
        if let Some(g) = held_before.as_ref().filter(|g| g.session != in_session) {
            let req = self.acquire_req(
                client,
                mode,
                ttl,
                block,
                delay,
                &tok,
                session.then_some(&sid[..]),
                None,
            );
            let r = self.cmd(key, Command::Acquire(req));
            assert_eq!(
                r,
                Some(Reply::Error(LockError::InSession)),
                "a retry of {g:?} naming another session"
            );
            return self.settle();
        }
        let queued_before = !self.m.queues.get(&key).is_none_or(VecDeque::is_empty);
        let family = self.m.family(key, now, !self.w.paused);
        let expect_err = match &held_before {
            Some(g) => g.mode != mode,
            None => family.is_some_and(|f| value::check_family(f, mode).is_err()),
        };
        self.next_waiter += 1;
        let id = self.next_waiter;
        self.s.next_block = (!in_multi).then_some(id);
        let label = (client % 2 == 1).then(|| format!("c{client}").into_bytes());
        let req = self.acquire_req(
            client,
            mode,
            ttl,
            block,
            delay,
            &tok,
            session.then_some(&sid[..]),
            label.as_deref(),
        );
        let r = self.cmd(key, Command::Acquire(req));
        self.s.next_block = None;
        // Waiters served first (a deferred hand-off) are answered before the caller. One
        // with this token (after a stall) makes this acquire a renew of its grant.
        self.settle();
        let held = held_before
            .clone()
            .or_else(|| self.m.holder_of(key, &tok, now));
        let expect_err = match (&held_before, &held) {
            (None, Some(g)) => g.mode != mode,
            _ => expect_err,
        };
        match r {
            Some(Reply::Error(LockError::WrongMode | LockError::LimitMismatch(_))) => {
                assert!(expect_err, "unexpected error for {mode:?} on key {key}");
            }
            Some(Reply::Grant(t, fence)) => {
                assert!(!expect_err, "{mode:?} on key {key} should be refused");
                assert_eq!(t.as_slice(), &tok[..]);
                let deadline = session_deadline
                    .filter(|_| session)
                    .unwrap_or(now + i64::from(ttl));
                if let Some(g) = held {
                    assert_eq!(fence, g.fence, "a renew keeps its fence");
                    if let Some(h) = self.m.live(key, now).iter_mut().find(|h| h.token == tok) {
                        h.deadline = deadline;
                    }
                } else {
                    let still = !self.m.queues.get(&key).is_none_or(VecDeque::is_empty);
                    assert!(
                        !(queued_before && still),
                        "barging: client {client} got key {key}"
                    );
                    self.m.record_grant(
                        key,
                        Grant {
                            token: tok,
                            mode,
                            fence,
                            deadline,
                            lock_delay: if delay { i64::from(LOCK_DELAY) } else { 0 },
                            owner: label,
                            session: in_session,
                        },
                        now,
                    );
                }
            }
            Some(Reply::Nil) => {
                assert!(!expect_err, "{mode:?} on key {key} should be refused");
                assert!(held_before.is_none(), "the holder's own renew was refused");
            }
            None => {
                assert!(
                    !expect_err && !in_multi && block.is_some(),
                    "blocked when it may not"
                );
                let ttl = i64::from(ttl);
                self.m.waiting.insert(
                    id,
                    Waiting {
                        key,
                        client,
                        token: tok,
                        mode,
                        ttl,
                        lock_delay: if delay { i64::from(LOCK_DELAY) } else { 0 },
                        owner: label,
                        deadline: block.filter(|b| *b > 0).map(|b| now + i64::from(b)),
                        session: in_session,
                    },
                );
                self.m.queues.entry(key).or_default().push_back(id);
                self.m.blocked.insert(client, id);
            }
            Some(other) => panic!("acquire answered {other:?}"),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn acquire_req<'t>(
        &self,
        client: u8,
        mode: Mode,
        ttl: u16,
        block: Option<u16>,
        delay: bool,
        tok: &'t [u8],
        session: Option<&[u8]>,
        label: Option<&'t [u8]>,
    ) -> AcquireReq<'t> {
        AcquireReq {
            mode,
            ttl: u64::from(ttl),
            token: Some(tok),
            owner: label,
            block: block.map(u64::from),
            min_fence: 0,
            lock_delay: if delay { LOCK_DELAY } else { 0 },
            client_id: u64::from(client),
            addr: Addr::None,
            session: session.map(value::digest),
        }
    }

    /// LOCK.SESSION OPEN (`what` 0), KEEPALIVE (1) or CLOSE (2) of `client`'s session.
    fn session(&mut self, client: u8, what: u8, ttl: u16) {
        let now = self.w.now;
        let client = session_of(client);
        let d = value::digest(&session_id(client));
        let open = self.m.session_open(client, now).is_some();
        let deadline = now + i64::from(ttl);
        let mut store = MemStore { w: &mut self.w };
        match what {
            0 => {
                let req = OpenReq {
                    digest: d,
                    ttl: u64::from(ttl),
                    bind: None,
                    owner: None,
                };
                let new = self.e.session_open(&mut store, &mut self.s, req);
                self.settle();
                assert_eq!(new, !open, "OPEN of client {client}'s session");
                self.m.sessions.insert(client, deadline);
                self.m.renew_session(client, deadline, now);
            }
            1 => {
                let ok = self.e.session_keepalive(
                    &mut store,
                    &d,
                    Some(u64::from(ttl)),
                    Some(u64::from(client)),
                );
                assert_eq!(ok, open, "KEEPALIVE of client {client}'s session");
                if ok {
                    self.m.sessions.insert(client, deadline);
                    self.m.renew_session(client, deadline, now);
                }
            }
            _ => {
                let n = self.e.session_close(&mut store, &mut self.s, &d);
                let mine = |g: &Grant| g.session == Some(client);
                let held: u64 = (0..KEYS)
                    .map(|k| self.m.live(k, now).iter().filter(|g| mine(g)).count() as u64)
                    .sum();
                assert_eq!(
                    n,
                    open.then_some(held),
                    "CLOSE of client {client}'s session"
                );
                for k in 0..KEYS {
                    self.m.live(k, now).retain(|g| !mine(g));
                }
                self.m.sessions.remove(&client);
                self.settle();
            }
        }
    }

    /// LOCK.ACQUIREALL of two keys (or, with `release`, LOCK.RELEASEALL of what the
    /// client holds).
    fn multi(
        &mut self,
        client: u8,
        (a, b): (u8, u8),
        shared: (bool, bool),
        ttl: u16,
        block: Option<u16>,
        release: bool,
    ) {
        let now = self.w.now;
        let tok = token(client);
        let held: Vec<u8> = (0..KEYS)
            .filter(|k| self.m.holder_of(*k, &tok, now).is_some())
            .collect();
        if release || !held.is_empty() {
            for k in held {
                let r = self.cmd(k, Command::Release(&tok));
                assert_eq!(r, Some(Reply::Int(1)), "release of key {k} by {client}");
                self.m.live(k, now).retain(|g| g.token != tok);
                self.settle();
            }
            return;
        }
        let mode = |s: bool| if s { Mode::Shared } else { Mode::Exclusive };
        let keys = vec![(a, mode(shared.0)), (b, mode(shared.1))];
        // Grantable now: every key without a queue, admitting the mode (after what the
        // engine serves and reaps first).
        self.next_waiter += 1;
        let id = self.next_waiter;
        self.s.next_block = Some(id);
        let names: Vec<Box<[u8]>> = keys.iter().map(|(k, _)| key_name(*k)).collect();
        let req = AcquireAllReq {
            keys: names
                .iter()
                .zip(&keys)
                .map(|(n, (_, m))| (&n[..], *m))
                .collect(),
            db: 0,
            ttl: u64::from(ttl),
            token: Some(&tok),
            owner: None,
            block: block.map(u64::from),
            min_fence: 0,
            lock_delay: 0,
            client_id: u64::from(client),
            addr: Addr::None,
            session: None,
        };
        let mut store = MemStore { w: &mut self.w };
        let r = self.e.acquire_all(&mut store, &mut self.s, req);
        self.s.next_block = None;
        self.settle();
        let mut grantable = true;
        for (k, m) in &keys {
            let queued = !self.m.queues.get(k).is_none_or(VecDeque::is_empty);
            let closed = self.m.delayed(*k, now);
            grantable &= !queued && !closed && fits(self.m.live(*k, now), *m);
        }
        match r {
            Ok(Some(Reply::Array(parts))) => {
                assert!(grantable, "ACQUIREALL {keys:?} granted, not grantable");
                let fences: Vec<u64> = match parts.as_slice() {
                    [Reply::Bulk(t), Reply::Array(fs)] => {
                        assert_eq!(t.as_slice(), &tok[..]);
                        fs.iter()
                            .map(|f| match f {
                                Reply::Int(i) => *i as u64,
                                other => panic!("fence {other:?}"),
                            })
                            .collect()
                    }
                    other => panic!("ACQUIREALL replied {other:?}"),
                };
                for ((k, m), f) in keys.iter().zip(fences) {
                    let g = Grant {
                        token: tok.clone(),
                        mode: *m,
                        fence: f,
                        deadline: now + i64::from(ttl),
                        lock_delay: 0,
                        owner: None,
                        session: None,
                    };
                    self.m.record_grant(*k, g, now);
                }
            }
            Ok(Some(Reply::Nil)) => {
                assert!(!grantable, "ACQUIREALL {keys:?} refused when grantable");
            }
            Ok(None) => {
                assert!(
                    !grantable && block.is_some(),
                    "ACQUIREALL blocked when it may not"
                );
                for (k, _) in &keys {
                    self.m.queues.entry(*k).or_default().push_back(id);
                }
                self.m.multi.insert(
                    id,
                    Multi {
                        keys,
                        client,
                        token: tok,
                        ttl: i64::from(ttl),
                        deadline: block.filter(|b| *b > 0).map(|b| now + i64::from(b)),
                    },
                );
                self.m.blocked.insert(client, id);
            }
            other => panic!("ACQUIREALL answered {other:?}"),
        }
    }

    fn watch(&mut self, key: u8, client: u8, fence: u8, block: Option<u16>, in_multi: bool) {
        let now = self.w.now;
        let mut hs = self.m.live(key, now).clone();
        hs.sort_by_key(|g| g.fence);
        let first = hs.first().cloned();
        let gone = match (fence, &first) {
            (0, _) => None,
            (1, Some(g)) => Some((g.fence, None)),
            (2, Some(g)) => Some((g.fence, Some(g.owner.clone().unwrap_or(b"none".to_vec())))),
            _ => Some((self.m.last_fence.saturating_sub(1).max(1), None)),
        };
        self.next_waiter += 1;
        let id = self.next_waiter;
        self.s.next_block = (!in_multi).then_some(id);
        let want = match &gone {
            None => Want::Held,
            Some((f, l)) => Want::Gone {
                fence: *f,
                owner: l.clone().map(Into::into),
            },
        };
        let req = WatchReq {
            want,
            block: block.map(u64::from),
        };
        let w = Watching {
            key,
            client,
            gone,
            deadline: block.map(|b| now + i64::from(b)),
        };
        let met = self.m.watch_met(&w, now);
        let r = self.cmd(key, Command::Watch(req));
        self.s.next_block = None;
        self.settle();
        match r {
            Some(r) => {
                assert!(met || in_multi, "watch of {w:?} answered at once: {r:?}");
                let want = self.m.summary(key, now);
                assert_eq!(r.into_static(), want, "watch of key {key} at once");
            }
            None => {
                assert!(!met && !in_multi, "watch of {w:?} blocked when it may not");
                self.m.watchers.insert(id, w);
                self.m.watch_blocked.insert(client, id);
            }
        }
    }

    fn apply(&mut self, op: Op) {
        let now = self.w.now;
        let write_command = matches!(
            op,
            Op::Acquire { .. }
                | Op::Session { .. }
                | Op::Multi { .. }
                | Op::Release { .. }
                | Op::Extend { .. }
                | Op::Force { .. }
                | Op::Del { .. }
        );
        if self.w.paused && write_command {
            // CLIENT PAUSE WRITE holds write commands back; only timers and events run.
            return self.after();
        }
        let blocked = |m: &Model, c: u8| m.blocked.contains_key(&c);
        match op {
            Op::Acquire {
                key,
                client,
                shared,
                ttl,
                block,
                wrong_limit,
                in_multi,
                delay,
                session,
            } if !blocked(&self.m, client) => {
                let mode = mode_for(key, shared, wrong_limit);
                self.acquire(key, client, mode, ttl, block, in_multi, delay, session);
            }
            // From another connection of the client (its own may be blocked in a wait).
            Op::Session { client, what, ttl } => self.session(client, what, ttl),
            Op::Multi {
                client,
                a,
                b,
                shared,
                ttl,
                block,
                release,
            } if !blocked(&self.m, client) => {
                self.multi(client, (a, b), shared, ttl, block, release);
            }
            Op::Release { key, client } if !blocked(&self.m, client) => {
                let expected = self.held_by(key, client);
                let r = self.cmd(key, Command::Release(&token(client)));
                assert_eq!(
                    r,
                    Some(Reply::bool(expected)),
                    "release of key {key} by {client}"
                );
                if expected {
                    let t = token(client);
                    self.m.live(key, now).retain(|g| g.token != t);
                }
                self.settle();
            }
            Op::Extend {
                key,
                client,
                ttl,
                label,
            } if !blocked(&self.m, client) => {
                let expected = self.held_by(key, client);
                let t = token(client);
                let label = label.map(|l| format!("L{l}").into_bytes());
                let fence_before = self.m.holder_of(key, &t, now).map(|g| g.fence);
                if self
                    .m
                    .holder_of(key, &t, now)
                    .is_some_and(|g| g.session.is_some())
                {
                    let r = self.cmd(
                        key,
                        Command::Extend {
                            token: &t,
                            ttl: u64::from(ttl),
                            owner: label.as_deref(),
                        },
                    );
                    assert_eq!(r, Some(Reply::Error(LockError::InSession)));
                    return self.after();
                }
                let r = self.cmd(
                    key,
                    Command::Extend {
                        token: &t,
                        ttl: u64::from(ttl),
                        owner: label.as_deref(),
                    },
                );
                assert_eq!(
                    r,
                    Some(Reply::bool(expected)),
                    "extend of key {key} by {client}"
                );
                if let Some(g) = self.m.live(key, now).iter_mut().find(|g| g.token == t) {
                    g.deadline = now + i64::from(ttl);
                    if label.is_some() {
                        g.owner = label;
                    }
                }
                if let Some(f) = fence_before {
                    let h = self.w.keys[&key_name(key)].find_fence(f).cloned();
                    let want = self.m.holder_of(key, &t, now).and_then(|g| g.owner);
                    assert_eq!(
                        h.and_then(|h| h.owner().map(<[u8]>::to_vec)),
                        want,
                        "a relabel keeps the fence and sets the label"
                    );
                }
                self.settle();
            }
            Op::Watch {
                key,
                client,
                fence,
                block,
                in_multi,
            } if !self.m.watch_blocked.contains_key(&client) => {
                self.watch(key, client, fence, block, in_multi);
            }
            Op::Force { key, one } => {
                let target = one
                    .then(|| self.m.live(key, now).first().map(|g| g.fence))
                    .flatten();
                let held = !self.m.live(key, now).is_empty();
                // FORCERELEASE of every holder also ends a running lock-delay.
                let delayed = !one && self.m.delayed(key, now);
                let expected = (held && (!one || target.is_some())) || delayed;
                let fence = one.then(|| target.unwrap_or(1));
                let r = self.cmd(key, Command::ForceRelease(fence));
                assert_eq!(r, Some(Reply::bool(expected)), "force release of key {key}");
                match fence {
                    Some(f) => self.m.live(key, now).retain(|g| g.fence != f),
                    None => {
                        self.m.live(key, now).clear();
                        self.m.delays.remove(&key);
                    }
                }
                self.settle();
            }
            Op::Del { key } => {
                if let Some(v) = self.w.keys.remove(&key_name(key)) {
                    // The data type's unlink callback tells the engine.
                    self.e.unlinked(0, &key_name(key), &v, false, now * 1000);
                    let (name, args, cmd) = (key_name(key), Vec::new(), "DEL".to_string());
                    self.w.repl.push((name, args, cmd));
                }
                self.m.holders.remove(&key);
                self.m.delays.remove(&key);
            }
            Op::Disconnect { client } if (8..11).contains(&client) => {
                if let Some(id) = self.m.watch_blocked.remove(&client) {
                    assert!(
                        self.e.abandon(id, now * 1000).is_some(),
                        "watcher {id} lost"
                    );
                    self.m.gone.insert(id);
                }
            }
            Op::Disconnect { client } => {
                if let Some(id) = self.m.blocked.remove(&client) {
                    if self.e.abandon(id, now * 1000).is_some() {
                        self.m.gone.insert(id);
                        let keys: Vec<u8> = match self.m.multi.get(&id) {
                            Some(m) => m.keys.iter().map(|(k, _)| *k).collect(),
                            None => vec![self.m.waiting[&id].key],
                        };
                        for k in keys {
                            self.m.queues.entry(k).or_default().retain(|x| *x != id);
                        }
                    }
                }
            }
            Op::Pause(on) => self.w.paused = on,
            Op::Tick(ms) => self.w.now += i64::from(ms),
            Op::Stall(ms) => {
                self.w.now += i64::from(ms);
                return;
            }
            Op::WallStep(s) => self.w.wall_offset += i64::from(s) * 1000,
            _ => {}
        }
        self.after();
    }

    fn after(&mut self) {
        self.run_timers();
        self.check();
    }

    /// The engine's stored state and queues against the model.
    fn check(&mut self) {
        let now = self.w.now;
        let clock = self.w.clock();
        // A session's end answers its waiters at once (NOSESSION), whatever their place
        // in line: none waits in a session that ended (with writes allowed).
        if !self.w.paused {
            for (id, w) in self.m.waiting.clone() {
                let (Some(c), false) = (w.session, self.m.answered.contains(&id)) else {
                    continue;
                };
                if self.m.gone.contains(&id) {
                    continue;
                }
                assert!(
                    self.m.session_open(c, now).is_some(),
                    "waiter {id} ({w:?}) still queued in client {c}'s ended session"
                );
            }
        }
        for key in 0..KEYS {
            let model: HashSet<u64> = self.m.live(key, now).iter().map(|g| g.fence).collect();
            let stored: HashSet<u64> = match self.w.keys.get(&key_name(key)) {
                Some(v) => v
                    .iter()
                    .filter(|h| h.live(now * 1000))
                    .map(|h| h.fence)
                    .collect(),
                None => HashSet::new(),
            };
            assert_eq!(stored, model, "holders of key {key} at {now}");
            for g in self.m.live(key, now).clone() {
                let h = self.w.keys[&key_name(key)].find_fence(g.fence).cloned();
                assert_eq!(
                    h.map(|h| h.deadline),
                    Some(g.deadline * 1000),
                    "lease of {g:?}"
                );
            }
            let want: Vec<WaiterId> = self
                .m
                .queues
                .get(&key)
                .map_or(Vec::new(), |q| q.iter().copied().collect());
            let have: Vec<WaiterId> = self
                .e
                .queue(0, &key_name(key))
                .map_or(Vec::new(), |q| q.waiters.iter().map(|w| w.id).collect());
            assert_eq!(have, want, "queue of key {key}");
            // Liveness: with writes allowed, the head of a queue is never grantable.
            if let (false, Some(head)) = (self.w.paused, want.first()) {
                if self.m.multi.contains_key(head) {
                    // A multi waiter waits for its other key too; never when it could
                    // have both (no deadlock: it would have been granted).
                    let stuck = self.m.multi_grantable(*head, now)
                        && !self.m.answered.contains(head)
                        && !self.m.gone.contains(head);
                    let retry = self
                        .e
                        .next_due()
                        .is_some_and(|t| t <= now * 1000 + super::RETRY_US);
                    assert!(
                        !stuck || retry,
                        "multi waiter {head} could have both keys and waits"
                    );
                    continue;
                }
                let w = self.m.waiting[head].clone();
                let hs = self.m.live(key, now).clone();
                let mine = hs.iter().any(|h| h.token == w.token);
                let closed = self.m.delayed(key, now);
                // A service put off while writes were paused is retried RETRY_US later.
                let retry = self
                    .e
                    .queue(0, &key_name(key))
                    .and_then(|q| q.serve_at)
                    .is_some_and(|t| t <= now * 1000 + super::RETRY_US);
                assert!(
                    closed || retry || !mine && !fits(&hs, w.mode),
                    "waiter {head} ({:?}) starves on key {key} beside {hs:?}",
                    w.mode
                );
            }
        }
        for (id, w) in self.m.watchers.clone() {
            if self.m.answered.contains(&id) || self.m.gone.contains(&id) {
                continue;
            }
            assert!(
                !self.m.watch_met(&w, now),
                "watcher {id} ({w:?}) still waits though its wait is over"
            );
            assert!(
                w.deadline.is_none_or(|d| now < d),
                "watcher {id} ({w:?}) still waits past its BLOCK time"
            );
        }
        assert_eq!(
            self.e.watching(),
            self.m.watch_blocked.len(),
            "watchers the engine keeps"
        );
        for (name, v) in &self.w.keys {
            check_codec(name, v, clock);
        }
        self.check_replica();
    }

    /// Applies the encoded stream to the replica (in its own clock) and compares.
    fn check_replica(&mut self) {
        for (name, args, cmd) in std::mem::take(&mut self.w.repl) {
            self.replica.now = self.w.now;
            let mut ks = MemKey {
                w: &mut self.replica,
                name: name.clone(),
            };
            if cmd == "DEL" {
                ks.w.keys.remove(&name);
                continue;
            }
            if cmd == "LOCK.SREPL" {
                let slices: Vec<&[u8]> = args.iter().map(|a| a.as_slice()).collect();
                let c = repl::decode_session(&slices, ks.w.clock()).expect("decodes");
                let mut store = MemStore {
                    w: &mut self.replica,
                };
                self.replica_engine
                    .session_apply(&mut store, &mut MemSched::default(), c);
                continue;
            }
            assert_eq!(cmd, "LOCK.REPL");
            let slices: Vec<&[u8]> = args.iter().map(|a| a.as_slice()).collect();
            let rc = repl::decode(&slices, ks.w.clock()).expect("the replica decodes the stream");
            let mut s = MemSched::default();
            let out = self.replica_engine.handle(
                Command::Apply {
                    cmd: rc,
                    ceiling: u64::MAX,
                },
                &mut ks,
                &mut s,
            );
            assert!(matches!(out, Outcome::Reply(Reply::Ok)), "{out:?}");
        }
        let now = self.w.now * 1000;
        let live = |w: &World| -> BTreeMap<Box<[u8]>, Vec<(u64, i64)>> {
            w.keys
                .iter()
                .filter_map(|(k, v)| {
                    let hs: Vec<(u64, i64)> = v
                        .iter()
                        .filter(|h| h.live(now))
                        .map(|h| (h.fence, h.deadline))
                        .collect();
                    (!hs.is_empty()).then(|| (k.clone(), hs))
                })
                .collect()
        };
        assert_eq!(live(&self.replica), live(&self.w), "replica differs");
        assert!(self.replica_engine.fence.last() <= self.e.fence.last());
    }

    /// Time runs on with writes allowed until nothing is left to do: every waiter must
    /// have been answered (or have left).
    fn drain(&mut self) {
        self.w.paused = false;
        for _ in 0..200 {
            self.w.now += 20;
            self.run_timers();
            self.check();
        }
        for id in self.m.waiting.keys().chain(self.m.multi.keys()) {
            assert!(
                self.m.answered.contains(id) || self.m.gone.contains(id),
                "waiter {id} never answered"
            );
        }
        // Watchers of a key nobody takes any more wait on (checked above: their wait is
        // not over); they leave.
        for (_, id) in std::mem::take(&mut self.m.watch_blocked) {
            assert!(self.e.abandon(id, self.w.now * 1000).is_some());
        }
        assert_eq!(self.e.watching(), 0);
        assert!(self.e.next_due().is_none_or(|t| t > self.w.now * 1000));
        assert_eq!(
            self.e.tracked(),
            0,
            "leases left in the index after every lock ended"
        );
    }
}

/// Every value passes the validity rule and comes back equal from its RDB encoding.
fn check_codec(name: &[u8], v: &LockValue, clock: Clock) {
    let strict = Policy {
        ceiling: u64::MAX,
        repair: false,
    };
    let holders: Vec<value::Holder> = v.iter().cloned().collect();
    if v.is_empty() {
        // Only a running lock-delay keeps an emptied key (until the engine reaps it).
        assert!(
            v.delay_until().is_some(),
            "key {name:?}: empty without a lock-delay"
        );
        if !v.delaying(clock.mono) {
            return;
        }
    } else {
        assert!(
            value::build(v.mode(), holders, u64::MAX, false).is_ok(),
            "key {name:?}: the rule refuses {v:?}"
        );
    }
    let mut f = Fields::default();
    codec::encode(v, &mut f, clock);
    let back = codec::decode(&mut f.reader(), codec::ENCODING, clock, strict).expect("decodes");
    // A lock-delay that ended (while writes were paused, say) is not carried.
    let mut want = v.clone();
    want.clear_ended_delay(clock.mono);
    assert_eq!(back.value, want, "key {name:?} did not round-trip");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]
    #[test]
    fn the_engine_keeps_every_promise(
        ops in proptest::collection::vec(op(), 1..250),
        start in 1_000_000i64..4_000_000_000,
    ) {
        let mut h = Harness::new(start);
        for o in ops {
            h.apply(o);
        }
        h.drain();
    }
}

/// Sequences the random walk reaches too rarely, run every time: two workers of one
/// session, the second waiting for the first's lock, then the session closes (the review
/// of issue 30 found CLOSE granting it inside the closing session) or lapses (its waiter
/// must be answered at once, not at its turn).
#[test]
fn a_sessions_end_never_grants_its_own_waiters() {
    for end in [
        Op::Session {
            client: 0,
            what: 2,
            ttl: 1,
        },
        Op::Tick(40),
    ] {
        let mut h = Harness::new(1_000_000);
        let acquire = |client: u8, block: Option<u16>| Op::Acquire {
            key: 0,
            client,
            shared: false,
            ttl: 50,
            block,
            wrong_limit: false,
            in_multi: false,
            delay: false,
            session: true,
        };
        h.apply(Op::Session {
            client: 0,
            what: 0,
            ttl: 30,
        });
        h.apply(acquire(0, None));
        h.apply(acquire(3, Some(0)));
        assert_eq!(h.m.queues[&0].len(), 1, "client 3 waits behind client 0");
        h.apply(end);
        h.drain();
    }
}

/// A lock of a session leaves with its slot (MIGRATE: the server unlinks the value it
/// serialized in the same command): the session is no longer kept alive here. Its
/// keepalive answers false and renews nothing, the mark goes to the replicas, an OPEN of
/// its id is a new session without the other lock, and that lock ends with the lease it
/// had, never sooner.
#[test]
fn a_session_that_lost_a_lock_to_a_move_is_not_kept_alive_here() {
    let start = 1_000_000;
    let mut h = Harness::new(start);
    let sid = session_id(0);
    let d = value::digest(&sid);
    let req = OpenReq {
        digest: d,
        ttl: 1000,
        bind: None,
        owner: None,
    };
    let mut store = MemStore { w: &mut h.w };
    assert!(h.e.session_open(&mut store, &mut h.s, req.clone()));
    for key in [0, 1] {
        let tok = format!("a-token-of-the-session-{key}").into_bytes();
        let r = h.acquire_req(0, Mode::Exclusive, 0, None, false, &tok, Some(&sid), None);
        let got = h.cmd(key, Command::Acquire(r));
        assert!(matches!(got, Some(Reply::Grant(..))), "{got:?}");
    }
    let deadline = (start + 1000) * 1000;
    let lease = |h: &Harness| {
        h.w.keys
            .get(&key_name(1))
            .map(|v| v.iter().next().unwrap().deadline)
    };
    h.w.now += 100;
    let moved = h.w.keys.remove(&key_name(0)).unwrap();
    h.e.unlinked(0, &key_name(0), &moved, true, h.w.now * 1000);
    h.run_timers();
    let marks =
        h.w.repl
            .iter()
            .filter(|(_, a, c)| c == "LOCK.SREPL" && a[0].starts_with(b"MOVED;"));
    assert_eq!(marks.count(), 1, "the mark replicated once");
    let mut store = MemStore { w: &mut h.w };
    assert!(!h.e.session_keepalive(&mut store, &d, Some(60_000), None));
    assert_eq!(h.e.sessions(), 0, "not counted as open");
    assert_eq!(lease(&h), Some(deadline), "not renewed");
    // An OPEN: a new session; the old lock is not its own.
    let mut store = MemStore { w: &mut h.w };
    assert!(h.e.session_open(&mut store, &mut h.s, req));
    let mut store = MemStore { w: &mut h.w };
    assert!(h.e.session_keepalive(&mut store, &d, Some(60_000), None));
    assert_eq!(lease(&h), Some(deadline), "not renewed by the new session");
    h.w.now = start + 999;
    h.run_timers();
    assert_eq!(lease(&h), Some(deadline), "held to its lease");
    h.w.now = start + 1001;
    h.run_timers();
    assert_eq!(lease(&h), None, "ended with its lease");
}
