//! The ways a client waits for a lock: the module's server-side queue, and the three
//! recipes that lock libraries use today. Each one is written from the library's
//! documented behaviour (commands sent, sleep between attempts, release script), not
//! from its code.

use std::thread::sleep;
use std::time::{Duration, Instant};

use redis::{Connection, Value};
use redis_lock_testkit::Rng;

use crate::Error;

/// Lease of every lock taken in the benchmark: far longer than any critical section, so
/// no lock ever expires and every hand-off is a release.
pub const LEASE_MS: u64 = 10_000;
/// How long one blocking call may wait (module BLOCK, BLPOP) before the client looks at
/// the clock again.
pub const WAIT_MS: u64 = 10_000;

/// Compare-and-delete, the release every SET-NX recipe uses (redis-py's `Lock.release`,
/// node-redlock, redsync): delete only if the key still holds our token.
pub const RELEASE_SCRIPT: &str = "\
if redis.call('get', KEYS[1]) == ARGV[1] then
  return redis.call('del', KEYS[1])
end
return 0";

/// python-redis-lock's release: if the token matches, replace the signal list by one
/// element (with an expiry, so a signal nobody takes does not linger) and delete the
/// lock. KEYS = lock, signal; ARGV = token, signal expiry (ms).
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
}

pub const ALL: [Method; 4] = [
    Method::Module,
    Method::Poll100,
    Method::PollJitter,
    Method::Blpop,
];

impl Method {
    /// Short name, for env selection and the chart legend.
    pub fn id(self) -> &'static str {
        match self {
            Method::Module => "module",
            Method::Poll100 => "poll100",
            Method::PollJitter => "jitter",
            Method::Blpop => "blpop",
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Method::Module => "module LOCK.ACQUIRE BLOCK",
            Method::Poll100 => "(a) SET NX, 100 ms poll",
            Method::PollJitter => "(b) SET NX, 10±5 ms poll",
            Method::Blpop => "(c) SET NX + BLPOP signal",
        }
    }

    pub fn from_id(s: &str) -> Option<Method> {
        ALL.into_iter().find(|m| m.id() == s)
    }
}

/// SHA1s of the two scripts, loaded once per server (SCRIPT LOAD), as redis-py's
/// `register_script` and node-redlock do.
#[derive(Debug, Clone)]
pub struct Scripts {
    pub release: String,
    pub signal_release: String,
}

impl Scripts {
    pub fn load(c: &mut Connection) -> Result<Scripts, Error> {
        let load = |c: &mut Connection, body: &str| -> Result<String, Error> {
            Ok(redis::cmd("SCRIPT").arg("LOAD").arg(body).query(c)?)
        };
        Ok(Scripts {
            release: load(c, RELEASE_SCRIPT)?,
            signal_release: load(c, SIGNAL_RELEASE_SCRIPT)?,
        })
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
    /// Commands sent so far.
    pub commands: u64,
}

/// How an acquire attempt ended.
pub enum Acquired {
    /// Granted; the token to release with.
    Token(Vec<u8>),
    /// Still not granted at `give_up`.
    GaveUp,
}

impl Client<'_> {
    fn query(&mut self, cmd: &redis::Cmd) -> Result<Value, Error> {
        self.commands += 1;
        Ok(cmd.query::<Value>(&mut self.conn)?)
    }

    fn fresh_token(&mut self) -> Vec<u8> {
        self.serial += 1;
        format!("{}:{}", self.name, self.serial).into_bytes()
    }

    /// Waits for the lock the way `method` does; gives up once `give_up` has passed.
    pub fn acquire(&mut self, give_up: Instant) -> Result<Acquired, Error> {
        match self.method {
            Method::Module => loop {
                let v = self.query(
                    redis::cmd("LOCK.ACQUIRE")
                        .arg(self.key)
                        .arg("PX")
                        .arg(LEASE_MS)
                        .arg("BLOCK")
                        .arg(WAIT_MS),
                )?;
                if let Value::Array(items) = &v {
                    if let Some(Value::BulkString(token)) = items.first() {
                        return Ok(Acquired::Token(token.clone()));
                    }
                }
                if !matches!(v, Value::Nil) {
                    return Err(format!("LOCK.ACQUIRE replied {v:?}").into());
                }
                if Instant::now() >= give_up {
                    return Ok(Acquired::GaveUp);
                }
            },
            Method::Poll100 | Method::PollJitter => {
                let token = self.fresh_token();
                loop {
                    if self.set_nx(&token, "PX", LEASE_MS)? {
                        return Ok(Acquired::Token(token));
                    }
                    if Instant::now() >= give_up {
                        return Ok(Acquired::GaveUp);
                    }
                    let pause_us = match self.method {
                        Method::Poll100 => 100_000,
                        _ => self.rng.range(5_000, 14_999),
                    };
                    sleep(Duration::from_micros(pause_us));
                }
            }
            Method::Blpop => {
                let token = self.fresh_token();
                loop {
                    if self.set_nx(&token, "EX", LEASE_MS / 1000)? {
                        return Ok(Acquired::Token(token));
                    }
                    if Instant::now() >= give_up {
                        return Ok(Acquired::GaveUp);
                    }
                    // Wakes on a release's signal, on a stale signal left in the list,
                    // or after the timeout; in every case: try SET NX again.
                    let signal = self.signal_key.clone();
                    self.query(redis::cmd("BLPOP").arg(signal).arg(WAIT_MS / 1000))?;
                }
            }
        }
    }

    fn set_nx(&mut self, token: &[u8], unit: &str, ttl: u64) -> Result<bool, Error> {
        let v = self.query(
            redis::cmd("SET")
                .arg(self.key)
                .arg(token)
                .arg("NX")
                .arg(unit)
                .arg(ttl),
        )?;
        match v {
            Value::Okay => Ok(true),
            Value::Nil => Ok(false),
            other => Err(format!("SET NX replied {other:?}").into()),
        }
    }

    /// Releases; an error if the lock was no longer ours (it never expires here).
    pub fn release(&mut self, token: &[u8]) -> Result<(), Error> {
        let (v, ok) = match self.method {
            Method::Module => (
                self.query(redis::cmd("LOCK.RELEASE").arg(self.key).arg(token))?,
                Value::Int(1),
            ),
            Method::Poll100 | Method::PollJitter => {
                let sha = self.scripts.release.clone();
                (
                    self.query(
                        redis::cmd("EVALSHA")
                            .arg(sha)
                            .arg(1)
                            .arg(self.key)
                            .arg(token),
                    )?,
                    Value::Int(1),
                )
            }
            Method::Blpop => {
                let sha = self.scripts.signal_release.clone();
                let signal = self.signal_key.clone();
                (
                    self.query(
                        redis::cmd("EVALSHA")
                            .arg(sha)
                            .arg(2)
                            .arg(self.key)
                            .arg(signal)
                            .arg(token)
                            .arg(SIGNAL_EXPIRE_MS),
                    )?,
                    Value::Int(0),
                )
            }
        };
        if v == ok {
            Ok(())
        } else {
            Err(format!("{} release replied {v:?}", self.method.id()).into())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn method_ids_round_trip() {
        for m in ALL {
            assert_eq!(Method::from_id(m.id()), Some(m));
        }
        assert_eq!(Method::from_id("nope"), None);
    }
}
