//! Blocked clients and timers: the engine's [`Sched`] over the server, the callbacks of
//! a blocked LOCK.ACQUIRE, and the timers that serve queues (lease deadlines, events,
//! retries while writes are paused), end waits (BLOCK deadlines) and give back grants
//! whose client left before it heard of them.
//!
//! The engine lives here, in one static, borrowed for the duration of one call.

use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crate::engine::value::Digest;
use crate::engine::{Answer, Engine, Gate, Keyspace, QueueKey, Sched, WaiterId};
use crate::ffi::blocked::{BlockHandler, BlockedClient, Timer};
use crate::ffi::{self, Ctx, MainThread, OwnedStr};
use crate::keyspace::RedisKey;

/// A blocked LOCK.ACQUIRE: its handle and the timer at its BLOCK deadline.
pub struct WaiterRec {
    pub bc: BlockedClient<Waiting>,
    pub deadline: Option<Timer<WaiterId>>,
}

pub type LockEngine = Engine<WaiterRec, Timer<QueueKey>>;

static ENGINE: MainThread<RefCell<Option<LockEngine>>> = MainThread(RefCell::new(None));
/// Fences seen while the engine was busy (a value loaded during a command); folded in at
/// the next call.
static PENDING_FENCE: AtomicU64 = AtomicU64::new(0);
/// Whether `CLIENT UNBLOCK` may end a wait: not on servers before Redis 7.4, where it can
/// race a hand-off and leave the client with no reply at all.
pub static UNBLOCK_ALLOWED: AtomicBool = AtomicBool::new(false);

/// Runs `f` on the engine. None if the engine is busy (a callback fired from inside an
/// engine call, which is handling that key already).
pub fn with_engine<R>(f: impl FnOnce(&mut LockEngine) -> R) -> Option<R> {
    let mut g = ENGINE.try_borrow_mut().ok()?;
    let e = g.get_or_insert_with(Engine::new);
    let pending = PENDING_FENCE.swap(0, Ordering::Relaxed);
    if pending > 0 {
        e.fence.observe(pending);
    }
    Some(f(e))
}

/// Records a fence issued elsewhere (RDB, RESTORE, replication).
pub fn observe_fence(fence: u64) {
    if with_engine(|e| e.fence.observe(fence)).is_none() {
        PENDING_FENCE.fetch_max(fence, Ordering::Relaxed);
    }
}

/// The engine's scheduler for one callback or command.
pub struct RedisSched<'a> {
    ctx: Ctx<'a>,
}

impl<'a> RedisSched<'a> {
    pub fn new(ctx: Ctx<'a>) -> Self {
        RedisSched { ctx }
    }
}

/// How soon a key whose hand-off waits for the gate (paused writes) is tried again.
const RETRY_MS: i64 = 10;
static RETRY_ARMED: MainThread<Cell<bool>> = MainThread(Cell::new(false));

impl Sched for RedisSched<'_> {
    type Waiter = WaiterRec;
    type Timer = Timer<QueueKey>;

    fn answer(&mut self, w: WaiterRec, a: Answer) {
        if let Some(t) = w.deadline {
            t.stop(self.ctx);
        }
        w.bc.unblock(Some(Box::new(a)));
    }

    fn arm(&mut self, key: &QueueKey, at: i64) -> Timer<QueueKey> {
        let delay = at.saturating_sub(ffi::now_ms());
        Timer::start(self.ctx, delay, service_fired, key.clone())
    }

    fn cancel(&mut self, t: Timer<QueueKey>) {
        t.stop(self.ctx);
    }

    fn retry_later(&mut self) {
        if !RETRY_ARMED.replace(true) {
            Timer::start(self.ctx, RETRY_MS, retry_fired, ());
        }
    }
}

/// Serves the queue of `key` (in `db`): opens the key and asks the engine.
pub fn serve_key(ctx: Ctx<'_>, db: i32, key: &[u8]) {
    if !ctx.select_db(db) {
        return;
    }
    let name = OwnedStr::new(key);
    let mut ks = RedisKey::new(ctx, name.as_str(), ffi::now_ms(), true);
    let mut sched = RedisSched::new(ctx);
    with_engine(|e| e.serve(&mut ks, &mut sched));
}

fn service_fired(ctx: Ctx<'_>, key: QueueKey) {
    with_engine(|e| e.timer_fired(&key));
    serve_key(ctx, key.0, &key.1);
}

fn retry_fired(ctx: Ctx<'_>, (): ()) {
    RETRY_ARMED.set(false);
    for (db, key) in with_engine(|e| e.take_deferred()).unwrap_or_default() {
        serve_key(ctx, db, &key);
    }
}

/// Asks for `key` to be served now (an event changed it).
pub fn wake(ctx: Ctx<'_>, db: i32, key: &[u8]) {
    let mut sched = RedisSched::new(ctx);
    with_engine(|e| e.arm(&mut sched, db, key, ffi::now_ms()));
}

fn deadline_fired(ctx: Ctx<'_>, id: WaiterId) {
    let mut sched = RedisSched::new(ctx);
    let Some(Some(w)) = with_engine(|e| {
        let w = e.abandon(&mut sched, id, ffi::now_ms());
        if w.is_some() {
            e.stats.wait_timeouts += 1;
        }
        w
    }) else {
        return;
    };
    // The timer that fired is spent; the reply callback answers nil.
    w.bc.unblock(Some(Box::new(Answer::Nil)));
}

/// Arms a waiter's BLOCK deadline, `block_ms` from now.
pub fn deadline_timer(ctx: Ctx<'_>, id: WaiterId, block_ms: u64) -> Timer<WaiterId> {
    let delay = i64::try_from(block_ms).unwrap_or(i64::MAX);
    Timer::start(ctx, delay, deadline_fired, id)
}

/// A grant whose client left before the reply: give it back (a write the module makes
/// on its own, so it waits for the gate like a hand-off).
struct Revoke {
    db: i32,
    key: Box<[u8]>,
    digest: Digest,
}

fn revoke_fired(ctx: Ctx<'_>, r: Revoke) {
    if !ctx.select_db(r.db) {
        return;
    }
    let name = OwnedStr::new(&r.key);
    let mut ks = RedisKey::new(ctx, name.as_str(), ffi::now_ms(), true);
    match ks.gate() {
        Gate::Now => {
            let mut sched = RedisSched::new(ctx);
            with_engine(|e| e.revoke(&mut ks, &mut sched, &r.digest));
        }
        Gate::Later => {
            Timer::start(ctx, RETRY_MS, revoke_fired, r);
        }
        // A replica or a node that lost the slot: the new owner decides.
        Gate::Replica | Gate::NotHere => {}
    }
}

/// The blocked-client callbacks of LOCK.ACQUIRE.
pub struct Waiting;

impl BlockHandler for Waiting {
    type Reply = Answer;

    fn reply(ctx: Ctx<'_>, reply: Option<&Answer>) {
        match reply {
            Some(Answer::Granted { token, fence, .. }) => {
                ctx.reply_array(2);
                ctx.reply_bytes(token);
                ctx.reply_int(*fence as i64);
            }
            Some(Answer::Failed(e)) => ctx.reply_error(&e.to_string()),
            Some(Answer::Nil) | None => ctx.reply_null(),
        }
    }

    fn timeout(ctx: Ctx<'_>, id: usize) {
        let mut sched = RedisSched::new(ctx);
        let w = with_engine(|e| {
            let w = e.abandon(&mut sched, id, ffi::now_ms());
            if w.is_some() {
                e.stats.wait_timeouts += 1;
            }
            w
        })
        .flatten();
        if let Some(w) = w {
            if let Some(t) = w.deadline {
                t.stop(ctx);
            }
            w.bc.unblock(None);
        }
        ctx.reply_null();
    }

    fn disconnected(ctx: Ctx<'_>, id: usize) {
        let mut sched = RedisSched::new(ctx);
        if let Some(Some(w)) = with_engine(|e| e.abandon(&mut sched, id, ffi::now_ms())) {
            if let Some(t) = w.deadline {
                t.stop(ctx);
            }
            w.bc.unblock(None);
        }
    }

    fn free(ctx: Ctx<'_>, reply: Box<Answer>, client_gone: bool) {
        if let (
            true,
            Answer::Granted {
                key: (db, key),
                digest,
                ..
            },
        ) = (client_gone, *reply)
        {
            Timer::start(ctx, 0, revoke_fired, Revoke { db, key, digest });
        }
    }
}
