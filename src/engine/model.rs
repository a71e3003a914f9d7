//! Model checking of the real engine. Random sequences of acquire (exclusive, shared,
//! counted; blocking or not) / release / extend / renew / lease expiry / BLOCK timeout /
//! disconnect / force-release / key deletion / write pauses run against the engine over
//! an in-memory keyspace, and after every step a small reference model checks:
//!
//! - never an exclusive holder beside any other holder, never more than n holders of a
//!   counted key (the model's own view of the grants it saw, not the engine's state);
//! - the engine's stored holders are exactly the model's live grants;
//! - strict FIFO: a waiter is granted only when everyone queued before it on that key
//!   was answered; shared waiters at the head are granted together; no barging;
//! - a free key never keeps a grantable waiter queued while writes are allowed;
//! - fences strictly increase;
//! - every waiter is answered exactly once (or left by disconnecting), and at the end
//!   every waiter has been answered;
//! - a replica that applies what the primary replicated holds the same keyspace.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};

use proptest::prelude::*;

use super::value::{self, digest, Addr, LockValue, Mode};
use super::*;

// ---- an in-memory keyspace ---------------------------------------------------------------

#[derive(Debug, Clone, PartialEq)]
enum Stored {
    Lock(LockValue, Option<i64>),
    Classic(Vec<u8>, Option<i64>),
}

#[derive(Default)]
struct World {
    now: i64,
    keys: HashMap<Box<[u8]>, Stored>,
    paused: bool,
    repl: Vec<ReplOp>,
    tokens: u64,
}

/// An owned copy of a replicated change.
#[derive(Debug, Clone)]
enum ReplOp {
    Grant(Box<[u8]>, Mode, Holder, u64),
    Lease(Box<[u8]>, u64, i64, u64),
    Drop(Box<[u8]>, u64),
    Delete(Box<[u8]>),
    ExpireAt(Box<[u8]>, i64),
}

impl World {
    /// Redis's own expiry of the key.
    fn expire(&mut self, name: &[u8]) {
        let gone = match self.keys.get(name) {
            Some(Stored::Lock(_, Some(at)) | Stored::Classic(_, Some(at))) => self.now > *at,
            _ => false,
        };
        if gone && !self.paused {
            self.keys.remove(name);
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
    fn now(&self) -> i64 {
        self.w.now
    }
    fn read(&mut self) -> Result<Slot<'_>, LockError> {
        self.w.expire(&self.name);
        Ok(match self.w.keys.get_mut(&self.name) {
            None => Slot::Free,
            Some(Stored::Lock(v, _)) => Slot::Lock(v),
            Some(Stored::Classic(_, exp)) => Slot::Classic(*exp),
        })
    }
    fn put(&mut self, v: LockValue) {
        assert!(!self.w.paused, "the engine wrote while writes were paused");
        let at = v.deadline();
        self.w
            .keys
            .insert(self.name.clone(), Stored::Lock(v, Some(at)));
    }
    fn remove(&mut self) {
        assert!(
            !self.w.paused,
            "the engine deleted while writes were paused"
        );
        self.w.keys.remove(&self.name);
    }
    fn set_expiry(&mut self, at: i64) {
        match self.w.keys.get_mut(&self.name) {
            Some(Stored::Lock(_, e) | Stored::Classic(_, e)) => *e = Some(at),
            None => {}
        }
    }
    fn expiry(&mut self) -> Option<i64> {
        match self.w.keys.get(&self.name) {
            Some(Stored::Lock(_, e) | Stored::Classic(_, e)) => *e,
            None => None,
        }
    }
    fn classic_matches(&mut self, token: &[u8]) -> bool {
        matches!(self.w.keys.get(&self.name), Some(Stored::Classic(t, _)) if t == token)
    }
    fn replicate(&mut self, op: Repl<'_>) {
        let k = self.name.clone();
        self.w.repl.push(match op {
            Repl::Grant {
                mode,
                holder,
                floor,
            } => ReplOp::Grant(k, mode, holder.clone(), floor),
            Repl::Lease {
                fence,
                expires_at,
                floor,
            } => ReplOp::Lease(k, fence, expires_at, floor),
            Repl::Drop { fence } => ReplOp::Drop(k, fence),
            Repl::Delete => ReplOp::Delete(k),
            Repl::ExpireAt(at) => ReplOp::ExpireAt(k, at),
        });
    }
    fn notify(&mut self, _ev: Event) {}
    fn gate(&mut self) -> Gate {
        if self.w.paused {
            Gate::Later
        } else {
            Gate::Now
        }
    }
    fn new_token(&mut self) -> Vec<u8> {
        self.w.tokens += 1;
        format!("gen-{}", self.w.tokens).into_bytes()
    }
}

// ---- an in-memory scheduler -----------------------------------------------------------------

#[derive(Default)]
struct MemSched {
    answers: Vec<(WaiterId, Answer)>,
    next_timer: u64,
    timers: BTreeMap<u64, (QueueKey, i64)>,
    retry: bool,
}

impl Sched for MemSched {
    type Waiter = WaiterId;
    type Timer = u64;
    fn answer(&mut self, w: WaiterId, a: Answer) {
        self.answers.push((w, a));
    }
    fn arm(&mut self, key: &QueueKey, at: i64) -> u64 {
        self.next_timer += 1;
        self.timers.insert(self.next_timer, (key.clone(), at));
        self.next_timer
    }
    fn cancel(&mut self, t: u64) {
        self.timers.remove(&t);
    }
    fn retry_later(&mut self) {
        self.retry = true;
    }
}

// ---- the reference model --------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq)]
struct Grant {
    client: u8,
    mode: Mode,
    fence: u64,
    deadline: i64,
}

#[derive(Debug, Clone)]
struct Waiting {
    key: u8,
    client: u8,
    mode: Mode,
    block_until: Option<i64>,
}

#[derive(Default)]
struct Model {
    holders: HashMap<u8, Vec<Grant>>,
    queues: HashMap<u8, VecDeque<WaiterId>>,
    waiting: HashMap<WaiterId, Waiting>,
    answered: HashSet<WaiterId>,
    gone: HashSet<WaiterId>,
    blocked: HashMap<u8, WaiterId>,
    last_fence: u64,
}

fn token(client: u8) -> Vec<u8> {
    vec![b'c', client]
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
    /// The family a key has now: its live holders', else its waiters'.
    fn family(&mut self, key: u8, now: i64) -> Option<value::Family> {
        if let Some(g) = self.live(key, now).first() {
            return Some(g.mode.family());
        }
        let head = *self.queues.get(&key)?.front()?;
        Some(self.waiting[&head].mode.family())
    }

    fn live(&mut self, key: u8, now: i64) -> &mut Vec<Grant> {
        let hs = self.holders.entry(key).or_default();
        hs.retain(|h| now <= h.deadline);
        hs
    }

    /// A grant the engine made (to a waiter or directly): must not break exclusion.
    fn record_grant(&mut self, key: u8, g: Grant, now: i64) {
        assert!(
            g.fence > self.last_fence,
            "fence {} after {}",
            g.fence,
            self.last_fence
        );
        self.last_fence = g.fence;
        let hs = self.live(key, now);
        assert!(fits(hs, g.mode), "grant {g:?} on key {key} beside {hs:?}");
        if let Mode::Counted(n) = g.mode {
            assert!(hs.len() < n as usize, "more than {n} holders of key {key}");
        }
        hs.push(g);
    }

    fn answer(&mut self, id: WaiterId, a: &Answer, now: i64) {
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
        if let Answer::Granted { fence, .. } = a {
            assert_eq!(
                at,
                0,
                "waiter {id} granted ahead of {:?} (FIFO)",
                &q.as_slices()
            );
            let g = Grant {
                client: w.client,
                mode: w.mode,
                fence: *fence,
                deadline: now.saturating_add(TTL_OF_WAITERS),
            };
            q.remove(at);
            self.record_grant(w.key, g, now);
        } else {
            q.remove(at);
        }
        self.blocked.remove(&w.client);
    }
}

/// Waiters ask for this lease (the model needs to know a grant's deadline).
const TTL_OF_WAITERS: i64 = 30;

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
    },
    Release {
        key: u8,
        client: u8,
    },
    Extend {
        key: u8,
        client: u8,
        ttl: u16,
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
}

const KEYS: u8 = 4;
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
        6 => (0..KEYS, 0u8..8, any::<bool>(), 1u16..60, prop::option::of(0u16..80), prop::bool::weighted(0.05))
            .prop_map(|(key, client, shared, ttl, block, wrong_limit)| Op::Acquire {
                key, client, shared, ttl, block, wrong_limit
            }),
        3 => (0..KEYS, 0u8..8).prop_map(|(key, client)| Op::Release { key, client }),
        1 => (0..KEYS, 0u8..8, 1u16..60).prop_map(|(key, client, ttl)| Op::Extend { key, client, ttl }),
        1 => (0..KEYS, any::<bool>()).prop_map(|(key, one)| Op::Force { key, one }),
        1 => (0..KEYS).prop_map(|key| Op::Del { key }),
        1 => (0u8..8).prop_map(|client| Op::Disconnect { client }),
        1 => any::<bool>().prop_map(Op::Pause),
        4 => (0u16..40).prop_map(Op::Tick),
    ]
}

// ---- the harness ----------------------------------------------------------------------------

struct Harness {
    w: World,
    e: Engine<WaiterId, u64>,
    s: MemSched,
    m: Model,
    next_waiter: WaiterId,
    /// A replica fed with everything the primary replicated.
    replica: World,
    replica_engine: Engine<WaiterId, u64>,
}

impl Harness {
    fn new(start: i64) -> Harness {
        let mut e = Engine::new();
        e.fence.start(start);
        Harness {
            w: World {
                now: start,
                ..World::default()
            },
            e,
            s: MemSched::default(),
            m: Model::default(),
            next_waiter: 0,
            replica: World {
                now: start,
                ..World::default()
            },
            replica_engine: Engine::new(),
        }
    }

    fn key(&mut self, key: u8) -> MemKey<'_> {
        MemKey {
            w: &mut self.w,
            name: key_name(key),
        }
    }

    /// Runs `f` on the engine with `key` open in the primary's keyspace.
    fn on_key<R>(
        &mut self,
        key: u8,
        f: impl FnOnce(&mut Engine<WaiterId, u64>, &mut MemKey<'_>, &mut MemSched) -> R,
    ) -> R {
        let mut ks = MemKey {
            w: &mut self.w,
            name: key_name(key),
        };
        f(&mut self.e, &mut ks, &mut self.s)
    }

    /// Takes the answers the engine gave and checks them.
    fn settle(&mut self) {
        let now = self.w.now;
        for (id, a) in std::mem::take(&mut self.s.answers) {
            self.m.answer(id, &a, now);
        }
    }

    fn serve(&mut self, key: u8) {
        self.on_key(key, |e, ks, s| e.serve(ks, s));
        self.settle();
    }

    /// Fires every due timer: service timers, BLOCK deadlines, retries.
    fn run_timers(&mut self) {
        loop {
            let due: Vec<(u64, QueueKey)> = self
                .s
                .timers
                .iter()
                .filter(|(_, (_, at))| *at <= self.w.now)
                .map(|(id, (k, _))| (*id, k.clone()))
                .collect();
            let deadlines: Vec<WaiterId> = self
                .m
                .waiting
                .iter()
                .filter(|(id, w)| {
                    w.block_until.is_some_and(|t| t <= self.w.now)
                        && !self.m.answered.contains(id)
                        && !self.m.gone.contains(id)
                })
                .map(|(id, _)| *id)
                .collect();
            // Deferred hand-offs wait for the pause to end.
            let retry = self.s.retry && !self.w.paused;
            if retry {
                self.s.retry = false;
            }
            if due.is_empty() && deadlines.is_empty() && !retry {
                break;
            }
            for (id, k) in due {
                self.s.timers.remove(&id);
                self.e.timer_fired(&k);
                self.serve(k.1[1]);
            }
            for id in deadlines {
                if let Some(w) = self.e.abandon(&mut self.s, id, self.w.now) {
                    self.s.answers.push((w, Answer::Nil));
                }
                self.settle();
            }
            if retry {
                for (_, k) in self.e.take_deferred() {
                    self.serve(k[1]);
                }
            }
        }
    }

    fn holds(&mut self, key: u8, client: u8) -> bool {
        let now = self.w.now;
        self.m.live(key, now).iter().any(|g| g.client == client)
    }

    fn apply(&mut self, op: Op) {
        let now = self.w.now;
        let write_command = matches!(
            op,
            Op::Acquire { .. }
                | Op::Release { .. }
                | Op::Extend { .. }
                | Op::Force { .. }
                | Op::Del { .. }
        );
        if self.w.paused && write_command {
            // CLIENT PAUSE WRITE holds write commands back; only timers and events run.
            return self.after();
        }
        match op {
            Op::Acquire {
                key,
                client,
                shared,
                ttl,
                block,
                wrong_limit,
            } => {
                if self.m.blocked.contains_key(&client) {
                    return; // a blocked connection sends nothing
                }
                let mode = mode_for(key, shared, wrong_limit);
                let tok = token(client);
                let req = AcquireReq {
                    mode,
                    ttl: u64::from(ttl),
                    token: Some(&tok),
                    owner: None,
                    min_fence: 0,
                    client_id: u64::from(client),
                    addr: Addr::None,
                };
                let held_before = self
                    .m
                    .live(key, now)
                    .iter()
                    .find(|g| g.client == client)
                    .copied();
                let queued_before = !self.m.queues.get(&key).is_none_or(VecDeque::is_empty);
                let family = self.m.family(key, now);
                let expect_err = match held_before {
                    Some(g) => g.mode != mode,
                    None => family.is_some_and(|f| value::check_family(f, mode).is_err()),
                };
                let r = self.on_key(key, |e, ks, s| e.acquire(ks, s, &req));
                // Waiters served first (a deferred hand-off) are answered before the caller.
                self.settle();
                if let Err(LockError::WrongMode | LockError::LimitMismatch(_)) = r {
                    assert!(expect_err, "unexpected {r:?} for {mode:?} on key {key}");
                    return self.after();
                }
                assert!(
                    !expect_err,
                    "{mode:?} on key {key} should be refused, got {r:?}"
                );
                match r {
                    Ok(Acquired::Granted { token: t, fence }) => {
                        assert_eq!(t, tok);
                        if let Some(g) = held_before.filter(|g| g.mode == mode) {
                            assert_eq!(fence, g.fence, "a renew keeps its fence");
                            let hs = self.m.live(key, now);
                            if let Some(h) = hs.iter_mut().find(|h| h.client == client) {
                                h.deadline = now + i64::from(ttl);
                            }
                        } else {
                            let still_queued =
                                !self.m.queues.get(&key).is_none_or(VecDeque::is_empty);
                            assert!(
                                !(queued_before && still_queued),
                                "barging: client {client} got key {key} past its queue"
                            );
                            self.m.record_grant(
                                key,
                                Grant {
                                    client,
                                    mode,
                                    fence,
                                    deadline: now + i64::from(ttl),
                                },
                                now,
                            );
                        }
                    }
                    Ok(Acquired::Busy { serve_at }) => {
                        assert!(held_before.is_none(), "the holder's own renew was refused");
                        if let Some(b) = block {
                            self.next_waiter += 1;
                            let id = self.next_waiter;
                            let wait = Wait {
                                id,
                                mode,
                                token: tok.clone(),
                                digest: digest(&tok),
                                ttl: TTL_OF_WAITERS as u64,
                                min_fence: 0,
                                owner: None,
                                client_id: u64::from(client),
                                addr: Addr::None,
                                moved: false,
                                handle: id,
                            };
                            self.m.waiting.insert(
                                id,
                                Waiting {
                                    key,
                                    client,
                                    mode,
                                    block_until: (b > 0).then(|| now + i64::from(b)),
                                },
                            );
                            self.m.queues.entry(key).or_default().push_back(id);
                            self.m.blocked.insert(client, id);
                            self.e
                                .enqueue(&mut self.s, (0, key_name(key)), wait, serve_at);
                        }
                    }
                    Err(e) => panic!("acquire failed: {e}"),
                }
            }
            Op::Release { key, client } => {
                if self.m.blocked.contains_key(&client) {
                    return;
                }
                let expected = self.holds(key, client);
                let r = self
                    .on_key(key, |e, ks, s| e.release(ks, s, &token(client)))
                    .unwrap();
                assert_eq!(r, expected, "release of key {key} by {client}");
                if r {
                    self.m.live(key, now).retain(|g| g.client != client);
                }
                self.settle();
            }
            Op::Extend { key, client, ttl } => {
                if self.m.blocked.contains_key(&client) {
                    return;
                }
                let expected = self.holds(key, client);
                let r = self
                    .on_key(key, |e, ks, s| {
                        e.extend(ks, s, &token(client), u64::from(ttl))
                    })
                    .unwrap();
                assert_eq!(r, expected, "extend of key {key} by {client}");
                if let Some(g) = self
                    .m
                    .live(key, now)
                    .iter_mut()
                    .find(|g| g.client == client)
                {
                    g.deadline = now + i64::from(ttl);
                }
                self.settle();
            }
            Op::Force { key, one } => {
                let target = if one {
                    self.m.live(key, now).first().map(|g| g.fence)
                } else {
                    None
                };
                let expected = !self.m.live(key, now).is_empty() && (!one || target.is_some());
                let fence = if one { Some(target.unwrap_or(1)) } else { None };
                let r = self
                    .on_key(key, |e, ks, s| e.force_release(ks, s, fence))
                    .unwrap();
                assert_eq!(r, expected, "force release of key {key}");
                match fence {
                    Some(f) => self.m.live(key, now).retain(|g| g.fence != f),
                    None => self.m.live(key, now).clear(),
                }
                self.settle();
            }
            Op::Del { key } => {
                self.w.keys.remove(&key_name(key));
                self.m.holders.remove(&key);
                self.w.repl.push(ReplOp::Delete(key_name(key)));
                // The `del` event asks for the queue to be served.
                self.e.arm(&mut self.s, 0, &key_name(key), now);
            }
            Op::Disconnect { client } => {
                if let Some(id) = self.m.blocked.remove(&client) {
                    if self.e.abandon(&mut self.s, id, now).is_some() {
                        self.m.gone.insert(id);
                        let w = &self.m.waiting[&id];
                        let q = self.m.queues.entry(w.key).or_default();
                        q.retain(|x| *x != id);
                    }
                }
            }
            Op::Pause(on) => self.w.paused = on,
            Op::Tick(ms) => self.w.now += i64::from(ms),
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
        for key in 0..KEYS {
            let model: HashSet<u64> = self.m.live(key, now).iter().map(|g| g.fence).collect();
            let mut ks = self.key(key);
            let stored: HashSet<u64> = match ks.read() {
                Ok(Slot::Lock(v)) => v
                    .holders()
                    .iter()
                    .filter(|h| h.live(now))
                    .map(|h| h.fence)
                    .collect(),
                _ => HashSet::new(),
            };
            assert_eq!(stored, model, "holders of key {key} at {now}");
            // FIFO order of the queue as the engine keeps it.
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
            if !self.w.paused {
                if let Some(head) = want.first() {
                    let mode = self.m.waiting[head].mode;
                    let hs = self.m.live(key, now).clone();
                    assert!(
                        !fits(&hs, mode),
                        "waiter {head} ({mode:?}) starves on key {key} beside {hs:?}"
                    );
                }
            }
        }
        self.check_replica();
    }

    /// Applies what was replicated to the replica and compares keyspaces.
    fn check_replica(&mut self) {
        for op in std::mem::take(&mut self.w.repl) {
            let (name, r) = match &op {
                ReplOp::Grant(k, ..)
                | ReplOp::Lease(k, ..)
                | ReplOp::Drop(k, ..)
                | ReplOp::Delete(k)
                | ReplOp::ExpireAt(k, _) => (k.clone(), op.clone()),
            };
            self.replica.now = self.w.now;
            let mut ks = MemKey {
                w: &mut self.replica,
                name,
            };
            let res = match &r {
                ReplOp::Grant(_, mode, h, floor) => self.replica_engine.apply(
                    &mut ks,
                    Repl::Grant {
                        mode: *mode,
                        holder: h,
                        floor: *floor,
                    },
                ),
                ReplOp::Lease(_, fence, at, floor) => self.replica_engine.apply(
                    &mut ks,
                    Repl::Lease {
                        fence: *fence,
                        expires_at: *at,
                        floor: *floor,
                    },
                ),
                ReplOp::Drop(_, fence) => self
                    .replica_engine
                    .apply(&mut ks, Repl::Drop { fence: *fence }),
                ReplOp::Delete(_) => self.replica_engine.apply(&mut ks, Repl::Delete),
                ReplOp::ExpireAt(_, at) => self.replica_engine.apply(&mut ks, Repl::ExpireAt(*at)),
            };
            res.unwrap();
        }
        // Compare live content (a replica keeps expired keys until the primary's DEL).
        let now = self.w.now;
        let live = |w: &World| -> BTreeMap<Box<[u8]>, Vec<Holder>> {
            w.keys
                .iter()
                .filter_map(|(k, v)| match v {
                    Stored::Lock(v, _) => {
                        let hs: Vec<Holder> = v
                            .holders()
                            .iter()
                            .filter(|h| h.live(now))
                            .cloned()
                            .collect();
                        (!hs.is_empty()).then(|| (k.clone(), hs))
                    }
                    Stored::Classic(..) => None,
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
        for (id, _) in self.m.waiting.clone() {
            assert!(
                self.m.answered.contains(&id) || self.m.gone.contains(&id),
                "waiter {id} never answered"
            );
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]
    #[test]
    fn the_engine_keeps_every_promise(
        ops in proptest::collection::vec(op(), 1..250),
        start in 1_000_000i64..4_000_000_000_000,
    ) {
        let mut h = Harness::new(start);
        for o in ops {
            h.apply(o);
        }
        h.drain();
    }
}
