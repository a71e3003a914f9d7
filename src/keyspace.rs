//! The engine's [`Keyspace`] over a real key: type checks (WRONGTYPE), classic string
//! locks, replication, notifications and modification signals, and the gate that decides
//! whether the module may write this key on its own right now.

use std::ffi::c_int;

use redis_module::raw;

use crate::engine::{Event, Gate, Keyspace, Slot};
use crate::error::LockError;
use crate::ffi::{self, Ctx, Key, KeyKind, OwnedStr, Route, Str};
use crate::lock::codec::{repl, Clock};
use crate::lock::value::LockValue;
use crate::state::{self, LOCK_TYPE};

/// The key's name: the server's string, and its bytes (read once: the engine asks for
/// them often, and each read is a call into the server).
enum Name<'a> {
    Arg(Str<'a>, &'a [u8]),
    Own(OwnedStr, Box<[u8]>),
}

/// One lock key for the duration of a command or callback.
pub struct RedisKey<'a> {
    ctx: Ctx<'a>,
    name: Name<'a>,
    write: bool,
    /// Opened on first use, and closed around anything that may delete the key behind
    /// the handle's back (the cluster routing check can expire it).
    key: Option<Key<'a, LockValue>>,
    db: i32,
    clock: Clock,
    listening: bool,
    /// Opened by a client's command for the key it names: the server already checked that
    /// a write command may write it here (routing, paused writes, the replica role).
    in_command: bool,
    /// A client now waits for this classic string lock.
    pub classic_waiter: bool,
    /// In a cluster: this node is still confirming the key's slot (no grant on it yet).
    pub slot_pending: bool,
    /// In a cluster: an atomic slot migration streams the key's slot to another node.
    pub exported: bool,
}

impl<'a> RedisKey<'a> {
    /// The key a command names (`write`: opened for writing).
    pub fn command(ctx: Ctx<'a>, name: Str<'a>, write: bool, listening: bool) -> Self {
        RedisKey {
            ctx,
            name: Name::Arg(name, name.bytes()),
            write,
            key: None,
            db: ctx.db(),
            clock: state::now(),
            listening,
            in_command: true,
            classic_waiter: false,
            slot_pending: false,
            exported: false,
        }
    }

    /// A key the module opens on its own (a timer, an event).
    pub fn owned(ctx: Ctx<'a>, name: &[u8], listening: bool) -> Self {
        RedisKey {
            ctx,
            name: Name::Own(OwnedStr::new(name), name.into()),
            write: true,
            key: None,
            db: ctx.db(),
            clock: state::now(),
            listening,
            in_command: false,
            classic_waiter: false,
            slot_pending: false,
            exported: false,
        }
    }

    fn name_str(&self) -> Str<'_> {
        name_of(&self.name)
    }

    fn key(&mut self) -> &mut Key<'a, LockValue> {
        let (ctx, write, name) = (self.ctx, self.write, name_of(&self.name));
        // The server keeps its own reference to the name while the key is open.
        self.key
            .get_or_insert_with(|| ctx.open_key(name, write, &LOCK_TYPE))
    }
}

fn name_of<'b>(n: &'b Name<'_>) -> Str<'b> {
    match n {
        Name::Arg(s, _) => *s,
        Name::Own(o, _) => o.as_str(),
    }
}

impl Keyspace for RedisKey<'_> {
    fn db(&self) -> i32 {
        self.db
    }

    fn name(&self) -> &[u8] {
        match &self.name {
            Name::Arg(_, b) => b,
            Name::Own(_, b) => b,
        }
    }

    fn clock(&self) -> Clock {
        self.clock
    }

    fn read(&mut self) -> Result<Slot<'_>, LockError> {
        let key = self.key();
        match key.kind() {
            KeyKind::Empty => Ok(Slot::Free),
            KeyKind::String => Ok(Slot::Classic(key.abs_expire())),
            KeyKind::Ours => key.value().map(Slot::Lock).ok_or(LockError::WrongType),
            KeyKind::Other => Err(LockError::WrongType),
        }
    }

    fn put(&mut self, v: LockValue) -> Result<(), LockError> {
        let key = self.key();
        let stored = state::ours(|| {
            if key.kind() != KeyKind::Empty {
                key.delete();
            }
            key.put(Box::new(v))
        });
        if !stored {
            return Err(LockError::StoreFailed);
        }
        state::count_created();
        Ok(())
    }

    fn remove(&mut self) {
        let key = self.key();
        state::ours(|| key.delete());
    }

    fn classic_matches(&mut self, token: &[u8]) -> bool {
        let key = self.key();
        key.kind() == KeyKind::String && key.string_eq(token)
    }

    fn set_classic_expiry(&mut self, at: i64) {
        self.key().set_abs_expire(at);
    }

    fn replicate(&mut self, c: repl::Change<'_>) {
        if !self.listening {
            // Nothing to build, but the change must still count for RDB save points.
            self.ctx.mark_dirty(self.in_command);
            return;
        }
        let (ctx, clock) = (self.ctx, self.clock);
        let name = self.name_str();
        repl::encode(&c, clock, &mut |cmd, args| ctx.replicate(cmd, name, args));
    }

    fn changed(&mut self, ev: Event) {
        const GENERIC: c_int = raw::REDISMODULE_NOTIFY_GENERIC as c_int;
        const EXPIRED: c_int = raw::REDISMODULE_NOTIFY_EXPIRED as c_int;
        let note = match ev {
            Event::Acquire => Some((GENERIC, c"lock.acquire")),
            Event::Release => Some((GENERIC, c"lock.release")),
            Event::Extend => Some((GENERIC, c"lock.extend")),
            Event::Handoff => Some((GENERIC, c"lock.handoff")),
            Event::ForceRelease => Some((GENERIC, c"lock.forcerelease")),
            Event::Expired => Some((EXPIRED, c"expired")),
            Event::Applied => None,
        };
        let name = self.name_str();
        // Nobody can hear a class the server does not publish.
        if let Some((class, event)) = note.filter(|(c, _)| ffi::notify_classes() & c != 0) {
            self.ctx.notify(class, event, name);
        }
        self.ctx.signal_modified(name);
    }

    fn exported(&self) -> bool {
        self.exported
    }

    fn gate(&mut self) -> Gate {
        if self.slot_pending {
            return Gate::Later;
        }
        if self.in_command {
            // A command that opened the key only to read it may not write it (it can run
            // while writes are paused, on a replica, in a read-only script).
            return if self.write { Gate::Now } else { Gate::Later };
        }
        let flags = self.ctx.flags();
        if flags & ffi::FLAG_SLAVE != 0 {
            return Gate::Replica;
        }
        if flags & ffi::FLAG_LOADING != 0 || ffi::writes_paused() {
            return Gate::Later;
        }
        if flags & ffi::FLAG_CLUSTER == 0 {
            return Gate::Now;
        }
        // The routing check runs a command that may expire the key: no handle may be
        // open across it.
        self.key = None;
        match self.ctx.route(self.name_str()) {
            Route::Here => Gate::Now,
            Route::Elsewhere => Gate::NotHere,
            Route::Down => Gate::Later,
        }
    }

    fn waits_on_classic(&mut self) {
        self.classic_waiter = true;
    }

    fn new_token(&mut self) -> [u8; 36] {
        let mut buf = [0u8; uuid::fmt::Hyphenated::LENGTH];
        uuid::Uuid::new_v4().hyphenated().encode_lower(&mut buf);
        buf
    }
}

impl Drop for RedisKey<'_> {
    fn drop(&mut self) {
        // The key handle goes before the name it was opened with.
        self.key = None;
    }
}
