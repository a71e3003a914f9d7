//! The engine's [`Sched`] and [`Store`] over the server: blocking and answering clients,
//! the one timer that wakes the engine, and opening keys for the work it does on its own.
//!
//! Server timers (`RM_CreateTimer`) count on the wall clock, so they are only a hint:
//! a timer that fires early finds nothing due and is armed again, and one that a
//! backward step delays is overtaken by the server's cron, which runs on the monotonic
//! clock `hz` times a second (see `events::cron`). Nothing here decides when a lease ends.

use crate::engine::{Answer, Engine, Sched, Store, WaiterId};
use crate::ffi::blocked::{BlockHandler, BlockedClient};
use crate::ffi::{self, Ctx};
use crate::keyspace::RedisKey;
use crate::lock::codec::Clock;
use crate::reply::Reply;
use crate::state::{self, now, State, Waiter, Waiting, WakeTimer};

/// The wake-up timer's callback (installed into the state's [`WakeTimer`] at load).
pub fn fired(ctx: Ctx<'_>, (): ()) {
    state::with(|st| {
        st.wake.spent();
        tick(ctx, st);
    });
}

/// Runs what is due, then arms the timer for what comes next.
pub fn tick(ctx: Ctx<'_>, st: &mut State) {
    on_keys(ctx, st, Some(false), |engine, store, sched| {
        engine.tick(store, sched)
    });
}

/// Runs `f` on the engine with a store that opens keys on its own and a scheduler that
/// blocks nobody: for the engine's own work (a tick) and a command without a key of its
/// own (`in_command`: `Some(false)` for a timer; `None` for what a primary or the AOF sent,
/// which is passed on as received, so nothing is built for replicas), then arms the timer.
pub fn on_keys<R>(
    ctx: Ctx<'_>,
    st: &mut State,
    in_command: Option<bool>,
    f: impl FnOnce(&mut Engine<Waiter>, &mut RedisStore<'_>, &mut RedisSched<'_>) -> R,
) -> R {
    let State {
        engine,
        wake,
        listening,
        cluster,
        ..
    } = st;
    let mut store = RedisStore {
        ctx,
        listening: *listening && in_command.is_some(),
        in_command: in_command.unwrap_or(true),
        cluster: cluster.as_ref(),
    };
    let mut sched = RedisSched {
        ctx,
        wake,
        may_block: false,
        unblock_allowed: false,
    };
    let r = f(engine, &mut store, &mut sched);
    if let Some(at) = engine.next_due() {
        sched.wake.arm(ctx, at);
    }
    r
}

/// The scheduler for one command or callback.
pub struct RedisSched<'a> {
    pub ctx: Ctx<'a>,
    pub wake: &'a mut WakeTimer,
    /// Whether the running command may block its client (not in MULTI, a script, the
    /// replication stream or while loading).
    pub may_block: bool,
    pub unblock_allowed: bool,
}

impl Sched for RedisSched<'_> {
    type Waiter = Waiter;

    fn block(&mut self) -> Option<(WaiterId, Waiter)> {
        if !self.may_block {
            return None;
        }
        let bc = BlockedClient::block(self.ctx, self.unblock_allowed);
        Some((bc.id(), bc))
    }

    fn answer(&mut self, w: Waiter, a: Answer) {
        w.unblock(Some(Box::new(a)));
    }

    fn wake_at(&mut self, at: i64) {
        self.wake.arm(self.ctx, at);
    }
}

/// Whether a command running in `ctx` may block its client.
pub fn may_block(ctx: Ctx<'_>) -> bool {
    ctx.flags()
        & (ffi::FLAG_DENY_BLOCKING
            | ffi::FLAG_MULTI
            | ffi::FLAG_LUA
            | ffi::FLAG_REPLICATED
            | ffi::FLAG_LOADING)
        == 0
}

/// Opens keys for a timer or an event.
pub struct RedisStore<'a> {
    pub ctx: Ctx<'a>,
    pub listening: bool,
    /// Inside a client's command (not a timer or an event).
    pub in_command: bool,
    pub cluster: Option<&'a crate::cluster::Cluster>,
}

impl Store for RedisStore<'_> {
    type Key<'k>
        = RedisKey<'k>
    where
        Self: 'k;

    fn open(&mut self, db: i32, name: &[u8]) -> Option<Self::Key<'_>> {
        if !self.ctx.select_db(db) {
            return None;
        }
        let mut k = RedisKey::owned(self.ctx, name, self.listening);
        if let Some(c) = self.cluster {
            let slot = crate::cluster::key_slot(name);
            k.slot_pending = c.confirming(slot);
            k.exported = c.exports_slot(slot);
        }
        Some(k)
    }

    fn clock(&self) -> Clock {
        now()
    }

    fn replicate_session(&mut self, c: &crate::lock::codec::repl::SessionChange<'_>) {
        if !self.listening {
            // Nothing to build, but the change must still count for RDB save points.
            self.ctx.mark_dirty(self.in_command);
            return;
        }
        let ctx = self.ctx;
        crate::lock::codec::repl::encode_session(c, now(), &mut |cmd, args| {
            ctx.replicate_keyless(cmd, args)
        });
    }
}

// The blocked-client callbacks of LOCK.ACQUIRE (the marker type lives in the state).
/// Runs `f` on the engine, then makes sure it is woken for what `f` put on its agenda.
pub fn with_engine<R>(ctx: Ctx<'_>, f: impl FnOnce(&mut Engine<Waiter>) -> R) -> Option<R> {
    state::with(|st| {
        let r = f(&mut st.engine);
        if let Some(at) = st.engine.next_due() {
            st.wake.arm(ctx, at);
        }
        r
    })
}

impl BlockHandler for Waiting {
    type Reply = Answer;

    fn reply(ctx: Ctx<'_>, reply: Option<&Answer>) {
        match reply {
            Some(Answer::Granted { token, fence, .. }) => {
                ctx.reply_array(2);
                ctx.reply_bytes(token);
                ctx.reply_int(i64::try_from(*fence).unwrap_or(i64::MAX));
            }
            Some(Answer::GrantedAll { token, fences, .. }) => {
                ffi::reply::send(ctx, &crate::engine::grant_reply(token.clone(), fences))
            }
            Some(Answer::State(r)) => ffi::reply::send(ctx, r),
            Some(Answer::Failed(e)) => ctx.reply_error(&e.to_string()),
            Some(Answer::Nil) | None => ctx.reply_null(),
        }
    }

    /// `CLIENT UNBLOCK id TIMEOUT` (the module times BLOCK out itself). A watcher is
    /// answered with the key as it is, as when its BLOCK time is up.
    fn timeout(ctx: Ctx<'_>, id: usize) {
        let now = ffi::mono_us();
        let found = state::with(|st| {
            if let Some(w) = st.engine.timed_out(id, now) {
                return Some((w, Reply::Nil));
            }
            let (w, (db, name)) = st.engine.unwatch(id)?;
            // This context is the watcher's own client: its selected db is put back.
            let mine = ctx.db();
            let r = if ctx.select_db(db) {
                let mut ks = RedisKey::owned(ctx, &name, false);
                st.engine.summary_of(&mut ks)
            } else {
                Reply::Nil
            };
            ctx.select_db(mine);
            Some((w, r))
        });
        let reply = match found.flatten() {
            Some((w, r)) => {
                w.unblock(None);
                r
            }
            None => Reply::Nil,
        };
        ffi::reply::send(ctx, &reply);
        state::with(|st| {
            if let Some(at) = st.engine.next_due() {
                st.wake.arm(ctx, at);
            }
        });
    }

    fn disconnected(ctx: Ctx<'_>, id: usize) {
        if let Some(Some(w)) = with_engine(ctx, |e| e.abandon(id, ffi::mono_us())) {
            w.unblock(None);
        }
    }

    fn free(ctx: Ctx<'_>, reply: Box<Answer>, client_gone: bool) {
        if !client_gone {
            return;
        }
        // A write the module makes on its own: given back on the next tick, through the
        // gate like a hand-off.
        match *reply {
            Answer::Granted { key, digest, .. } => {
                with_engine(ctx, |e| e.revoke_later(key, digest, ffi::mono_us()));
            }
            Answer::GrantedAll { keys, digest, .. } => {
                with_engine(ctx, |e| {
                    for key in keys {
                        e.revoke_later(key, digest, ffi::mono_us());
                    }
                });
            }
            _ => {}
        }
    }
}
