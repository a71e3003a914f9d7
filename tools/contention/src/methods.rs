//! The ways a client waits for a lock: the module's queue, and the recipes lock libraries
//! use today, each written from their documented behaviour, not from their code.

use std::collections::HashMap;
use std::thread::sleep;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use redis::{Cmd, Connection, ToRedisArgs, Value};
use redis_lock_report::contention_kinds::{INTENT_MS, JITTER_US, SEM_POLL_MS};
use redis_lock_testkit::Rng;

use crate::stats::Role;
use crate::Error;

/// Every lease: no lock expires in a cell, so every hand-off is a release.
pub const LEASE_MS: u64 = 10_000;
/// One blocking call's wait (module BLOCK, BLPOP) before the client looks at the clock.
pub const WAIT_MS: u64 = 10_000;

/// Compare-and-delete, the release of every SET-NX recipe (redis-py, node-redlock, redsync).
pub const RELEASE_SCRIPT: &str = "\
if redis.call('get', KEYS[1]) == ARGV[1] then
  return redis.call('del', KEYS[1])
end
return 0";

/// python-redis-lock's release: the signal list replaced by one element that expires, the
/// lock deleted. KEYS = lock, signal; ARGV = token, signal expiry (ms).
pub const SIGNAL_RELEASE_SCRIPT: &str = "\
if redis.call('get', KEYS[1]) ~= ARGV[1] then
  return 1
end
redis.call('del', KEYS[2])
redis.call('lpush', KEYS[2], 1)
redis.call('pexpire', KEYS[2], ARGV[2])
redis.call('del', KEYS[1])
return 0";
/// python-redis-lock's default `signal_expire`.
pub const SIGNAL_EXPIRE_MS: u64 = 1000;

// The client-side read-write lock (as Redisson's RReadWriteLock and Community Solid
// Server's RedisLocker keep it): a hash with a reader count and the writer's token; a
// refused client sleeps and retries. Writer-first (python redis-rw-lock's "writer's
// priority"): a refused writer leaves a note that keeps new readers out until its turn.

/// KEYS = lock [, writer-waiting note]; ARGV = lease ms. 1 granted, 0 refused.
pub const RW_READ_ACQUIRE: &str = "\
if redis.call('hexists', KEYS[1], 'writer') == 1 then
  return 0
end
if #KEYS > 1 and redis.call('exists', KEYS[2]) == 1 then
  return 0
end
redis.call('hincrby', KEYS[1], 'readers', 1)
redis.call('pexpire', KEYS[1], ARGV[1])
return 1";

/// KEYS = lock. 1 released, 0 there was no reader to release.
pub const RW_READ_RELEASE: &str = "\
local n = redis.call('hincrby', KEYS[1], 'readers', -1)
if n <= 0 then
  redis.call('hdel', KEYS[1], 'readers')
end
if n < 0 then
  return 0
end
return 1";

/// KEYS = lock [, note]; ARGV = token, lease ms [, note lease ms]. A refused writer
/// writes its token in a free note; only the writer named there may take the lock.
pub const RW_WRITE_ACQUIRE: &str = "\
local first = false
if #KEYS > 1 then
  first = redis.call('get', KEYS[2])
  if first and first ~= ARGV[1] then
    return 0
  end
end
if redis.call('hexists', KEYS[1], 'writer') == 1
    or tonumber(redis.call('hget', KEYS[1], 'readers') or '0') > 0 then
  if #KEYS > 1 then
    redis.call('set', KEYS[2], ARGV[1], 'PX', ARGV[3])
  end
  return 0
end
if first then
  redis.call('del', KEYS[2])
end
redis.call('hset', KEYS[1], 'writer', ARGV[1])
redis.call('pexpire', KEYS[1], ARGV[2])
return 1";

/// KEYS = lock; ARGV = token. 1 released, 0 not this writer's.
pub const RW_WRITE_RELEASE: &str = "\
if redis.call('hget', KEYS[1], 'writer') == ARGV[1] then
  redis.call('hdel', KEYS[1], 'writer')
  return 1
end
return 0";

/// What a cell measures: one mutex, a read-write lock, a semaphore.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    Mutex,
    ReadWrite,
    Semaphore,
}

impl Family {
    pub fn id(self) -> &'static str {
        match self {
            Family::Mutex => "mutex",
            Family::ReadWrite => "rw",
            Family::Semaphore => "sem",
        }
    }

    pub fn from_id(s: &str) -> Option<Family> {
        [Family::Mutex, Family::ReadWrite, Family::Semaphore]
            .into_iter()
            .find(|f| f.id() == s)
    }

    /// Its methods, in the order they are measured and shown.
    pub fn methods(self) -> &'static [Method] {
        use Method::*;
        match self {
            Family::Mutex => &[Module, Poll100, PollJitter, Blpop],
            Family::ReadWrite => &[Shared, Module, PollJitter, RwScript, RwScriptWriterFirst],
            Family::Semaphore => &[Limit, ZsetPoll],
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    /// `LOCK.ACQUIRE k PX ttl BLOCK ms`, `LOCK.RELEASE k token`.
    Module,
    /// redis-py `Lock` defaults: `SET k tok NX PX ttl`, sleep 100 ms between attempts,
    /// release by compare-and-delete script (EVALSHA).
    Poll100,
    /// node-redlock / redsync style: `SET NX PX`, sleep 10 ms ± 5 ms uniform jitter
    /// (node-redlock's `retryDelay + (2·rand − 1)·retryJitter`), compare-and-delete.
    PollJitter,
    /// python-redis-lock: `SET k tok NX EX s`; when busy, `BLPOP signal s` and try again;
    /// release by [`SIGNAL_RELEASE_SCRIPT`].
    Blpop,
    /// `LOCK.ACQUIRE k SHARED PX ttl BLOCK ms` for a reader, without `SHARED` for a
    /// writer; `LOCK.RELEASE`.
    Shared,
    /// The read-write lock scripts above (readers first), retried after 10 ± 5 ms.
    RwScript,
    /// The same with the writer-waiting note (writer first).
    RwScriptWriterFirst,
    /// `LOCK.ACQUIRE k LIMIT n PX ttl BLOCK ms`, `LOCK.RELEASE`.
    Limit,
    /// The sorted-set semaphore ("Redis in Action", 6.3): in one MULTI/EXEC,
    /// `ZREMRANGEBYSCORE k -inf now−lease` (drop the expired), `ZADD k now id`,
    /// `ZRANK k id`; a rank below n holds a permit, else `ZREM k id`, sleep, retry.
    /// Release: `ZREM k id`. `now` is the client's clock.
    ZsetPoll,
}

impl Method {
    /// Short name, for env selection and the chart legend.
    pub fn id(self) -> &'static str {
        match self {
            Method::Module => "module",
            Method::Poll100 => "poll100",
            Method::PollJitter => "jitter",
            Method::Blpop => "blpop",
            Method::Shared => "shared",
            Method::RwScript => "rw-script",
            Method::RwScriptWriterFirst => "rw-script-wfirst",
            Method::Limit => "limit",
            Method::ZsetPoll => "zset",
        }
    }

    /// How the docs name it in a cell of `family`.
    pub fn label(self, family: Family) -> &'static str {
        match (family, self) {
            (Family::Mutex, Method::Module) => "module LOCK.ACQUIRE BLOCK",
            (Family::Mutex, Method::PollJitter) => "(b) SET NX, 10±5 ms poll",
            (_, Method::Module) => "(a) one mutex: module BLOCK",
            (_, Method::PollJitter) => "(a) one mutex: SET NX, 10±5 ms poll",
            (_, Method::Poll100) => "(a) SET NX, 100 ms poll",
            (_, Method::Blpop) => "(c) SET NX + BLPOP signal",
            (_, Method::Shared) => "module SHARED BLOCK",
            (_, Method::RwScript) => "(b) Lua read-write lock, readers first",
            (_, Method::RwScriptWriterFirst) => "(b) Lua read-write lock, writer first",
            (_, Method::Limit) => "module LIMIT n BLOCK",
            (_, Method::ZsetPoll) => "sorted-set semaphore, 10 ms poll",
        }
    }

    /// The method of `family` whose id is `s`.
    pub fn from_id(family: Family, s: &str) -> Option<Method> {
        family.methods().iter().copied().find(|m| m.id() == s)
    }

    /// Commands its client sends itself, as `INFO commandstats` names them (not scripts').
    pub fn sent_commands(self) -> &'static [&'static str] {
        match self {
            Method::Module | Method::Shared | Method::Limit => &["lock.acquire", "lock.release"],
            Method::Poll100 | Method::PollJitter => &["set", "evalsha"],
            Method::Blpop => &["set", "blpop", "evalsha"],
            Method::RwScript | Method::RwScriptWriterFirst => &["evalsha"],
            Method::ZsetPoll => &["multi", "zremrangebyscore", "zadd", "zrank", "exec", "zrem"],
        }
    }
}

/// SHA1s of the scripts above by body, loaded once (as redis-py and node-redlock do).
#[derive(Debug, Clone)]
pub struct Scripts(HashMap<&'static str, String>);

impl Scripts {
    pub fn load(c: &mut Connection) -> Result<Scripts, Error> {
        let bodies = [
            RELEASE_SCRIPT,
            SIGNAL_RELEASE_SCRIPT,
            RW_READ_ACQUIRE,
            RW_READ_RELEASE,
            RW_WRITE_ACQUIRE,
            RW_WRITE_RELEASE,
        ];
        let load = |body| -> Result<_, Error> {
            Ok((body, redis::cmd("SCRIPT").arg("LOAD").arg(body).query(c)?))
        };
        bodies
            .into_iter()
            .map(load)
            .collect::<Result<_, _>>()
            .map(Scripts)
    }
}

/// One client's connection and state for one cell.
pub struct Client<'a> {
    pub conn: Connection,
    pub method: Method,
    pub key: &'a str,
    pub signal_key: String,
    pub scripts: &'a Scripts,
    pub rng: Rng,
    pub name: String,
    pub serial: u64,
    /// What it asks for (a mutex method takes the lock exclusively whatever the role).
    pub role: Role,
    pub limit: u32,
    pub commands: u64,
    pub round_trips: u64,
    /// When the current acquire's first request had been written to the socket.
    pub first_sent: Option<Instant>,
}

impl Client<'_> {
    /// Sends `cmd` and waits for its reply; notes when the first request had been written.
    fn query(&mut self, cmd: &Cmd) -> Result<Value, Error> {
        self.commands += 1;
        self.round_trips += 1;
        self.conn.send_packed_command(&cmd.get_packed_command())?;
        self.first_sent.get_or_insert_with(Instant::now);
        Ok(self.conn.recv_response()?.extract_error()?)
    }

    /// `EVALSHA sha numkeys keys... args...` of one of the scripts.
    fn evalsha(&self, body: &str, keys: &[&str], args: impl ToRedisArgs) -> Cmd {
        cmd("EVALSHA", (&self.scripts.0[body], keys.len(), keys, args))
    }

    fn is_reader(&self) -> bool {
        self.role == Role::Reader
    }

    /// Waits the way `method` does: the token to release with, `None` after `give_up`.
    pub fn acquire(&mut self, give_up: Instant) -> Result<Option<Vec<u8>>, Error> {
        self.first_sent = None;
        self.serial += 1;
        let token = format!("{}:{}", self.name, self.serial).into_bytes();
        loop {
            if let Some(token) = self.attempt(&token)? {
                return Ok(Some(token));
            }
            if Instant::now() >= give_up {
                return Ok(None);
            }
            self.wait()?;
        }
    }

    /// One attempt (the recipes with `token`): the token to release with if granted.
    fn attempt(&mut self, token: &[u8]) -> Result<Option<Vec<u8>>, Error> {
        let granted = match self.method {
            Method::Module | Method::Shared | Method::Limit => return self.module_attempt(),
            Method::Poll100 | Method::PollJitter => self.set_nx(token, "PX", LEASE_MS)?,
            Method::Blpop => self.set_nx(token, "EX", LEASE_MS / 1000)?,
            Method::RwScript | Method::RwScriptWriterFirst => self.rw_script_attempt(token)?,
            Method::ZsetPoll => self.zset_attempt(token)?,
        };
        Ok(granted.then(|| token.to_vec()))
    }

    /// Between two attempts: the module's BLOCK waited already; the recipes sleep or BLPOP.
    fn wait(&mut self) -> Result<(), Error> {
        let pause_us = match self.method {
            Method::Module | Method::Shared | Method::Limit => return Ok(()),
            Method::Blpop => {
                // A release's signal, a stale one, or the timeout: try SET NX again.
                let blpop = cmd("BLPOP", (&self.signal_key, WAIT_MS / 1000));
                return self.query(&blpop).map(drop);
            }
            Method::Poll100 => 100_000,
            Method::PollJitter | Method::RwScript | Method::RwScriptWriterFirst => {
                self.rng.range(JITTER_US.0, JITTER_US.1)
            }
            Method::ZsetPoll => SEM_POLL_MS * 1000,
        };
        sleep(Duration::from_micros(pause_us));
        Ok(())
    }

    /// `LOCK.ACQUIRE ... BLOCK`: the token, or `None` when the wait timed out.
    fn module_attempt(&mut self) -> Result<Option<Vec<u8>>, Error> {
        let mut cmd = redis::cmd("LOCK.ACQUIRE");
        cmd.arg(self.key);
        if self.method == Method::Shared && self.is_reader() {
            cmd.arg("SHARED");
        }
        if self.method == Method::Limit {
            cmd.arg("LIMIT").arg(self.limit);
        }
        cmd.arg("PX").arg(LEASE_MS).arg("BLOCK").arg(WAIT_MS);
        match self.query(&cmd)? {
            Value::Nil => Ok(None),
            Value::Array(items) if matches!(items.first(), Some(Value::BulkString(_))) => {
                Ok(redis::from_redis_value_ref(&items[0])?)
            }
            v => Err(format!("LOCK.ACQUIRE replied {v:?}").into()),
        }
    }

    fn set_nx(&mut self, token: &[u8], unit: &str, ttl: u64) -> Result<bool, Error> {
        match self.query(&cmd("SET", (self.key, token, "NX", unit, ttl)))? {
            Value::Okay => Ok(true),
            Value::Nil => Ok(false),
            other => Err(format!("SET NX replied {other:?}").into()),
        }
    }

    /// One attempt of the client-side read-write lock: true if granted.
    fn rw_script_attempt(&mut self, token: &[u8]) -> Result<bool, Error> {
        let writer_first = self.method == Method::RwScriptWriterFirst;
        let note = format!("{}:writer-waiting", self.key);
        let keys = if writer_first {
            vec![self.key, &note]
        } else {
            vec![self.key]
        };
        // A reader sends the lease; a writer its token first, and the note's lease last.
        let (body, token) = match self.is_reader() {
            true => (RW_READ_ACQUIRE, None),
            false => (RW_WRITE_ACQUIRE, Some(token)),
        };
        let intent = (writer_first && token.is_some()).then_some(INTENT_MS);
        match self.query(&self.evalsha(body, &keys, (token, LEASE_MS, intent)))? {
            Value::Int(1) => Ok(true),
            Value::Int(0) => Ok(false),
            other => Err(format!("{} acquire replied {other:?}", self.method.id()).into()),
        }
    }

    /// One attempt of the sorted-set semaphore: true if `id` ranks below the limit.
    fn zset_attempt(&mut self, id: &[u8]) -> Result<bool, Error> {
        let now_us = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_err(|e| format!("clock before 1970: {e}"))?
            .as_micros() as u64;
        let expired_before = now_us.saturating_sub(LEASE_MS * 1000);
        self.commands += 5; // MULTI, three commands, EXEC: one write, one reply
        self.round_trips += 1;
        self.first_sent.get_or_insert_with(Instant::now);
        let (_, _, rank): (i64, i64, Option<u64>) = redis::pipe()
            .atomic()
            .cmd("ZREMRANGEBYSCORE")
            .arg(self.key)
            .arg("-inf")
            .arg(format!("({expired_before}"))
            .cmd("ZADD")
            .arg(self.key)
            .arg(now_us)
            .arg(id)
            .cmd("ZRANK")
            .arg(self.key)
            .arg(id)
            .query(&mut self.conn)?;
        if rank.is_some_and(|r| r < u64::from(self.limit)) {
            return Ok(true);
        }
        self.query(&cmd("ZREM", (self.key, id)))?;
        Ok(false)
    }

    /// Releases; an error if the lock was no longer ours (it never expires here).
    pub fn release(&mut self, token: &[u8]) -> Result<(), Error> {
        let key = self.key;
        let (cmd, ok) = match self.method {
            Method::Module | Method::Shared | Method::Limit => {
                (cmd("LOCK.RELEASE", (key, token)), 1)
            }
            Method::Poll100 | Method::PollJitter => {
                (self.evalsha(RELEASE_SCRIPT, &[key], token), 1)
            }
            Method::Blpop => {
                let keys = [key, &self.signal_key];
                let args = (token, SIGNAL_EXPIRE_MS);
                (self.evalsha(SIGNAL_RELEASE_SCRIPT, &keys, args), 0)
            }
            Method::RwScript | Method::RwScriptWriterFirst => {
                let (body, token) = match self.is_reader() {
                    true => (RW_READ_RELEASE, None),
                    false => (RW_WRITE_RELEASE, Some(token)),
                };
                (self.evalsha(body, &[key], token), 1)
            }
            Method::ZsetPoll => (cmd("ZREM", (key, token)), 1),
        };
        match self.query(&cmd)? {
            Value::Int(n) if n == ok => Ok(()),
            v => Err(format!("{} release replied {v:?}", self.method.id()).into()),
        }
    }
}

/// `name args...` as one command.
fn cmd(name: &str, args: impl ToRedisArgs) -> Cmd {
    let mut cmd = redis::cmd(name);
    cmd.arg(args);
    cmd
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn method_ids_round_trip() {
        for f in [Family::Mutex, Family::ReadWrite, Family::Semaphore] {
            assert_eq!(Family::from_id(f.id()), Some(f));
            for &m in f.methods() {
                assert_eq!(Method::from_id(f, m.id()), Some(m));
            }
        }
        assert_eq!(Method::from_id(Family::Mutex, "nope"), None);
        assert_eq!(Method::from_id(Family::Semaphore, "module"), None);
        assert_eq!(Family::from_id("nope"), None);
    }
}
