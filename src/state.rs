//! The module's one state: the engine (with its counters), the wake-up timer, what the
//! shell remembers about the server (whether anything receives the replication stream,
//! the role, client addresses), and the values a MIGRATE may be moving. Owned here, in one
//! static, and borrowed once per entry point (command, timer, server event, data-type
//! callback) through [`with`].
//!
//! A data-type callback can fire while the state is borrowed: the module's own delete
//! or overwrite of a key unlinks its old value. Those are the module's own changes and
//! are marked [`ours`]; anything else that arrives while the state is busy (another
//! module's command run from inside one of ours, say) waits in a small queue that the
//! next borrow takes first.

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};

use std::sync::atomic::{AtomicI64, Ordering};

use crate::engine::Engine;
use crate::ffi::blocked::{BlockedClient, Timer};
use crate::ffi::datatype::TypeHandle;
use crate::ffi::{self, Ctx, MainThread};
use crate::lock::codec::Clock;
use crate::lock::value::{Addr, LockValue};

/// A blocked LOCK.ACQUIRE (its callbacks are in `sched`).
pub struct Waiting;
pub type Waiter = BlockedClient<Waiting>;

/// The registered data type; `TYPE key` shows its name.
pub static LOCK_TYPE: TypeHandle<LockValue> = TypeHandle::new();

/// Lock values the server owns (created minus freed): `lock_held` in INFO. Atomic
/// because a value's `free` may run on a lazy-free thread.
static LIVE: AtomicI64 = AtomicI64::new(0);

pub fn count_created() {
    LIVE.fetch_add(1, Ordering::Relaxed);
}

pub fn count_freed() {
    LIVE.fetch_sub(1, Ordering::Relaxed);
}

pub fn live() -> u64 {
    LIVE.load(Ordering::Relaxed).max(0) as u64
}

/// Both clocks, now.
pub fn now() -> Clock {
    Clock {
        mono: ffi::mono_us(),
        wall: ffi::wall_ms(),
    }
}

/// The engine's wake-up timer: at most one armed, for the earliest instant asked for.
pub struct WakeTimer {
    armed: Option<(Timer<()>, i64)>,
    /// What the timer runs (`sched::fired`, installed at load).
    pub fire: fn(Ctx<'_>, ()),
}

impl Default for WakeTimer {
    fn default() -> Self {
        WakeTimer {
            armed: None,
            fire: |_, ()| {},
        }
    }
}

impl WakeTimer {
    /// Makes sure the engine is woken no later than `at` (monotonic µs).
    pub fn arm(&mut self, ctx: Ctx<'_>, at: i64) {
        if let Some((_, due)) = &self.armed {
            if *due <= at {
                return;
            }
        }
        self.rearm(ctx, at);
    }

    /// Arms the timer for `at` whatever was armed (after the wall clock stepped).
    pub fn rearm(&mut self, ctx: Ctx<'_>, at: i64) {
        if let Some((t, _)) = self.armed.take() {
            t.stop(ctx);
        }
        let left_us = at.saturating_sub(ffi::mono_us()).max(0);
        // At least 1 ms: a timer due at once would fire in the same pass of the event loop
        // as the command that armed it, before that command's reply is written, so a
        // RELEASE with a thousand watchers would wait for all of them to be answered.
        let delay_ms = (left_us.saturating_add(999) / 1000).max(1);
        self.armed = Some((Timer::start(ctx, delay_ms, self.fire, ()), at));
    }

    /// The armed timer fired (its handle is spent).
    pub fn spent(&mut self) {
        self.armed = None;
    }
}

pub struct State {
    pub engine: Engine<Waiter>,
    pub wake: WakeTimer,
    /// Whether anything can receive the replication stream (an AOF, a replica, a
    /// replication backlog): when nothing can, no change is built or sent.
    pub listening: bool,
    /// This server is a replica (cached from the role-change events).
    pub replica: bool,
    /// Whether `CLIENT UNBLOCK` may end a wait (not before Redis 7.4, where it can race a
    /// hand-off and leave the client with no reply at all).
    pub unblock_allowed: bool,
    /// Lock values serialized by the running command (a MIGRATE among them) and not yet
    /// seen again: their unlink in the same command is a move, not a release.
    pub serialized: HashSet<usize>,
    /// A synchronous save (SAVE, DEBUG RELOAD) is running: it serializes every value.
    pub saving: bool,
    /// Whether the module listens to keyspace events (only once a client waited for a
    /// classic string lock: they cost every other command a call into the module).
    pub key_events: bool,
    /// Whether the module listens to `evicted` notifications (from the first time the
    /// server removed a lock key itself: every notification of the server would cost a
    /// call into the module's subscriber list otherwise).
    pub eviction_events: bool,
    /// The wall clock minus the monotonic one at the last cron (µs), to see it step.
    pub clock_offset: Option<i64>,
    /// When `listening` was last asked of the server (monotonic µs).
    pub listen_checked: i64,
    /// In a cluster: the slots this node serves and what the other nodes said.
    pub cluster: Option<crate::cluster::Cluster>,
    /// The lock key the server unlinked last while a policy can evict locks, until the
    /// next `evicted` notification tells whether it was this eviction.
    pub last_unlinked: Option<Unlinked>,
    /// What LOCK.IFHELD learned of the commands it was asked to run (by lower-case
    /// name), until a module is loaded or unloaded.
    pub command_flags: HashMap<Vec<u8>, crate::ffi::call::Flags>,
    /// Lock keys loaded from an encoding older than 3, until loading ends: those releases
    /// kept the lease as the key's Redis expiry too, which the server loads with the key.
    pub legacy_expiry: Vec<(i32, Vec<u8>)>,
    /// The walk for unlinked values that live on under another name, while one runs.
    pub adopting: Option<Adopting>,
    /// The address of every connection the server announced, by client id, until it
    /// leaves. Only announced ones: asking the server for the address of a script's or a
    /// module call's client by its id crashes Valkey 9.1 (a fake client has no
    /// connection), and such a caller has no address anyway.
    addrs: HashMap<u64, Addr, BuildHasherDefault<IdHasher>>,
}

/// Client ids are the server's own sequence numbers, not a client's choice: a
/// multiplication spreads them (the default SipHash costs ~300 instructions per grant).
#[derive(Default)]
pub struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_u64(&mut self, id: u64) {
        self.0 = (self.0 ^ id).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

/// A lock key the server unlinked: `evicted` follows at once if it was evicted.
pub struct Unlinked {
    pub db: i32,
    pub name: Vec<u8>,
    /// Its value, while grants are refused for the eviction policy (put back if evicted).
    pub kept: Option<LockValue>,
    /// How many commands the server had run then. Evictions run between commands (before
    /// one, or in the server's eviction timer), their notification right after the
    /// unlink: it sees the same count if this unlink was that eviction. A DEL or an
    /// overwrite of the same name earlier was a command, counted once it finished.
    pub commands: i64,
}

/// Something that happened while the state was busy.
pub enum Pending {
    Unlinked {
        db: i32,
        name: Vec<u8>,
        value: LockValue,
        moved: bool,
    },
}

/// Lock values the server unlinked that may live on under another name (RENAME, MOVE
/// put the same value there), by address, until they are freed: the free callback may run
/// on a lazy-free thread, hence the lock (and the count, to skip it when there are none).
static ORPHANS: std::sync::Mutex<Vec<usize>> = std::sync::Mutex::new(Vec::new());
static ORPHAN_COUNT: AtomicI64 = AtomicI64::new(0);

pub fn orphan(ptr: usize) {
    if let Ok(mut o) = ORPHANS.lock() {
        o.push(ptr);
        ORPHAN_COUNT.store(o.len() as i64, Ordering::Relaxed);
    }
}

/// A value is freed: it lives on nowhere.
pub fn forget_orphan(ptr: usize) {
    if ORPHAN_COUNT.load(Ordering::Relaxed) == 0 {
        return;
    }
    if let Ok(mut o) = ORPHANS.lock() {
        o.retain(|p| *p != ptr);
        ORPHAN_COUNT.store(o.len() as i64, Ordering::Relaxed);
    }
}

/// The unlinked values still alive (each is somewhere in the keyspace).
pub fn take_orphans() -> Vec<usize> {
    if ORPHAN_COUNT.load(Ordering::Relaxed) == 0 {
        return Vec::new();
    }
    match ORPHANS.lock() {
        Ok(mut o) => {
            ORPHAN_COUNT.store(0, Ordering::Relaxed);
            std::mem::take(&mut *o)
        }
        Err(_) => Vec::new(),
    }
}

/// A walk of the keyspace looking for values the engine no longer knows the names of.
pub struct Adopting {
    pub wanted: Vec<usize>,
    pub db: i32,
    pub scan: crate::ffi::scan::Scan,
}

static STATE: MainThread<RefCell<Option<State>>> = MainThread(RefCell::new(None));
static PENDING: MainThread<RefCell<Vec<Pending>>> = MainThread(RefCell::new(Vec::new()));
static OURS: MainThread<Cell<bool>> = MainThread(Cell::new(false));

impl State {
    fn new() -> State {
        State {
            engine: Engine::new(),
            wake: WakeTimer::default(),
            listening: true,
            replica: false,
            unblock_allowed: false,
            serialized: HashSet::new(),
            saving: false,
            key_events: false,
            eviction_events: false,
            clock_offset: None,
            listen_checked: 0,
            last_unlinked: None,
            cluster: None,
            command_flags: HashMap::new(),
            legacy_expiry: Vec::new(),
            adopting: None,
            addrs: HashMap::default(),
        }
    }

    /// The address of the client with this id (none for a script's or a module call's
    /// client, the AOF loader, or a connection older than the module's MODULE LOAD).
    #[inline]
    pub fn addr(&self, id: u64) -> Addr {
        self.addrs.get(&id).cloned().unwrap_or(Addr::None)
    }

    /// Whether `id` is a connection the server announced (not a script's or a module
    /// call's client, which never disconnects).
    pub fn is_connection(&self, id: u64) -> bool {
        self.addrs.contains_key(&id)
    }

    /// A connection arrived (with its address) or left.
    pub fn client(&mut self, id: u64, addr: Option<Addr>) {
        match addr {
            Some(a) => {
                self.addrs.insert(id, a);
            }
            None => {
                self.addrs.remove(&id);
            }
        }
    }
}

/// Runs `f` on the state; None when it is busy (an outer call holds it).
pub fn with<R>(f: impl FnOnce(&mut State) -> R) -> Option<R> {
    let mut g = STATE.try_borrow_mut().ok()?;
    let st = g.get_or_insert_with(State::new);
    let pending = PENDING
        .try_borrow_mut()
        .ok()
        .filter(|p| !p.is_empty())
        .map(|mut p| std::mem::take(&mut *p));
    for p in pending.unwrap_or_default() {
        match p {
            Pending::Unlinked {
                db,
                name,
                value,
                moved,
            } => {
                let now = crate::ffi::mono_us();
                st.engine.unlinked(db, &name, &value, moved, now);
            }
        }
    }
    Some(f(st))
}

/// Keeps what happened while the state was busy for the next borrow.
pub fn defer(p: Pending) {
    if let Ok(mut q) = PENDING.try_borrow_mut() {
        q.push(p);
    }
}

/// Runs one of the module's own deletes or overwrites (their unlinks are not news).
pub fn ours<R>(f: impl FnOnce() -> R) -> R {
    let prev = OURS.replace(true);
    let r = f();
    OURS.set(prev);
    r
}

pub fn is_ours() -> bool {
    OURS.get()
}
