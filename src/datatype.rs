//! The `redislock` data type: how a lock is saved in RDB files (and DUMP payloads),
//! rewritten into an AOF, digested, measured and freed, through the codec. A value read
//! while the server loads its own data (its RDB or AOF, a full sync, DEBUG RELOAD) is
//! repaired when the validity rule refuses part of it, never refused: the server empties
//! the dataset before such a load and a refused value fails the whole file, so every other
//! key would be lost with it. A RESTORE payload (nothing is lost by refusing it) is
//! refused whole.

use std::ffi::c_int;

use crate::engine::Engine;
use crate::ffi::datatype::{AofOut, DataType, DigestOut, RdbIn, RdbOut};
use crate::ffi::{self, Str};
use crate::lock::codec::{self, repl, Policy, Sink, Source};
use crate::lock::value::LockValue;
use crate::state::{self, count_created, now, Waiter};

pub struct LockType;

struct In<'a>(&'a mut RdbIn);
struct Out<'a>(&'a mut RdbOut);

impl Source for In<'_> {
    fn u64(&mut self) -> Option<u64> {
        self.0.u64()
    }
    fn i64(&mut self) -> Option<i64> {
        self.0.i64()
    }
    fn bytes(&mut self) -> Option<Vec<u8>> {
        self.0.bytes()
    }
}

impl Sink for Out<'_> {
    fn u64(&mut self, v: u64) {
        self.0.u64(v)
    }
    fn i64(&mut self, v: i64) {
        self.0.i64(v)
    }
    fn bytes(&mut self, b: &[u8]) {
        self.0.bytes(b)
    }
}

fn counter() -> u64 {
    state::with(|st| st.engine.fence.last()).unwrap_or(0)
}

fn on_engine<R>(f: impl FnOnce(&mut Engine<Waiter>) -> R) -> Option<R> {
    state::with(|st| {
        let r = f(&mut st.engine);
        if let (Some(at), Some(ctx)) = (st.engine.next_due(), ffi::module_ctx()) {
            st.wake.arm(ctx, at);
        }
        r
    })
}

impl DataType for LockType {
    type Value = LockValue;
    /// Exactly nine characters, as the server requires.
    const NAME: &'static str = "redislock";
    const ENCODING: c_int = codec::ENCODING;

    fn load(io: &mut RdbIn, encver: c_int) -> Option<Box<LockValue>> {
        let clock = now();
        let loading = ffi::loading();
        let ceiling = state::with(|st| st.engine.fence.loaded_ceiling(clock.wall, loading))?;
        let policy = Policy {
            ceiling,
            repair: loading,
        };
        let d = codec::decode(&mut In(io), encver, clock, policy)?;
        let key = io.key();
        if !d.repaired.is_empty() {
            let what: Vec<String> = d.repaired.iter().map(ToString::to_string).collect();
            let name = key.as_ref().map_or(String::new(), |(_, k)| {
                String::from_utf8_lossy(k).into_owned()
            });
            ffi::log_raw(
                std::ptr::null_mut(),
                "warning",
                &format!(
                    "redis-lock: repaired the lock '{name}' while loading: dropped {} holder(s) ({})",
                    d.repaired.len(),
                    what.join(", ")
                ),
            );
        }
        let top = d.value.iter().map(|h| h.fence).max().unwrap_or(0);
        if let (true, Some(k)) = (loading && encver < 3, &key) {
            // 0.1 and 0.2 set the key's Redis expiry to the lease: it comes back with the
            // key, and is taken off once loading ends (see events::clear_legacy_expiry).
            let k = k.clone();
            state::with(|st| st.legacy_expiry.push(k));
        }
        on_engine(|e| {
            e.fence.observe(top);
            if !d.repaired.is_empty() {
                e.stats.repaired += 1;
            }
            if let Some((db, name)) = &key {
                e.loaded(*db, name, &d.value, clock.mono);
            }
        });
        count_created();
        Some(Box::new(d.value))
    }

    fn save(v: &LockValue, io: &mut RdbOut) {
        codec::encode(v, &mut Out(io), now());
        if !ffi::in_child() {
            crate::events::serialized(v);
        }
    }

    /// A lock as the LOCK.REPL commands the primary replicates: one ADD per holder, the
    /// first carrying the fence counter when it is above the lock's own fences, then the
    /// DELAY of a lock-delay that runs (a key whose holders are gone is only that). A
    /// holder in a session comes after its session's SEEN (an AOF rewritten without its
    /// RDB preamble has no other record of the session's lease and label), and its MOVED
    /// when the session lost a lock to a slot move here (not kept alive here). The same
    /// commands carry the slots' locks to the target of a Valkey atomic slot migration.
    fn rewrite(v: &LockValue, key: Str<'_>, aof: &mut AofOut) {
        let (clock, floor) = (now(), counter());
        for h in v.iter() {
            let Some(d) = h.session() else {
                continue;
            };
            let (ttl, owner, moved) = state::with(|st| st.engine.session_ttl_owner(d))
                .flatten()
                .unwrap_or((0, None, false));
            let open = repl::SessionChange::Seen {
                digest: d,
                ttl,
                deadline: h.deadline,
                owner: owner.as_deref(),
            };
            repl::encode_session(&open, clock, &mut |cmd, args| aof.emit_keyless(cmd, args));
            if moved {
                let mark = repl::SessionChange::Moved { digest: d };
                repl::encode_session(&mark, clock, &mut |cmd, args| aof.emit_keyless(cmd, args));
            }
        }
        let mut emit = |c: repl::Change<'_>| {
            repl::encode(&c, clock, &mut |cmd, args| aof.emit(cmd, key, args));
        };
        for (i, h) in v.iter().enumerate() {
            emit(repl::Change::Add {
                mode: v.mode(),
                holder: h,
                floor: if i == 0 { floor } else { 0 },
            });
        }
        if let Some(until) = v.delay_until().filter(|_| v.delaying(clock.mono)) {
            emit(repl::Change::Delay { until });
        }
    }

    fn mem_usage(v: &LockValue) -> usize {
        v.heap_bytes()
    }

    /// DEBUG DIGEST: what a replica must hold alike (not the lease: each server keeps it
    /// on its own monotonic clock).
    fn digest(v: &LockValue, d: &mut DigestOut) {
        d.bytes(v.mode().name().as_bytes());
        if let crate::lock::value::Mode::Counted(n) = v.mode() {
            d.int(i64::from(n));
        }
        for h in v.iter() {
            d.bytes(&h.digest);
            d.int(h.fence as i64);
            d.int(h.acquired_at());
            if let Some(o) = h.owner() {
                d.bytes(o);
            }
        }
        d.end();
    }

    fn unlinked(db: i32, key: &[u8], v: &LockValue) {
        crate::events::unlinked(db, key, v);
    }

    fn unlink_ignored() -> bool {
        state::is_ours()
    }

    fn freed(v: Box<LockValue>) {
        state::count_freed();
        state::forget_orphan(&*v as *const LockValue as usize);
        drop(v);
    }

    /// The fence counter goes into every RDB file (and AOF base and full-sync payload), so
    /// that a restart from a snapshot taken after every lock was released still continues
    /// above the last fence.
    fn aux_save(io: &mut RdbOut) {
        io.u64(counter());
        let sessions = state::with(|st| st.engine.session_records()).unwrap_or_default();
        codec::encode_sessions(&sessions, &mut Out(io), now());
    }

    fn aux_load(io: &mut RdbIn, encver: c_int) -> bool {
        if !(1..=codec::ENCODING).contains(&encver) {
            return false;
        }
        let Some(last) = io.u64() else {
            return false;
        };
        if encver >= 4 {
            let Some(sessions) = codec::decode_sessions(&mut In(io), now()) else {
                return false;
            };
            on_engine(|e| e.sessions_loaded(sessions));
        }
        let wall = ffi::wall_ms();
        let kept = on_engine(|e| {
            let ok = last <= e.fence.loaded_ceiling(wall, true);
            if ok {
                e.fence.observe(last);
            } else {
                e.stats.repaired += 1;
            }
            ok
        });
        if kept == Some(false) {
            // Refusing it would fail the whole load (and lose every key): the values
            // carry their own fences, and the counter starts above those.
            ffi::log_raw(
                std::ptr::null_mut(),
                "warning",
                &format!("redis-lock: ignored a fence counter too far ahead of the clock ({last}) while loading"),
            );
        }
        true
    }
}
