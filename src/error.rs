//! One error type for every reply the module can fail with. Each variant renders to a
//! reply text that starts with an error code, so clients can match on the code.

use std::fmt;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LockError {
    /// Wrong number of arguments for the named command.
    WrongArity(&'static str),
    /// Unknown, repeated or incomplete option.
    Syntax(String),
    /// A numeric argument that is not a 64-bit integer.
    NotInteger,
    /// TTL out of range (<= 0, or its ms overflow).
    InvalidExpire(&'static str),
    /// TTL above `lock.max-ttl`: what was asked and the limit, in ms, so that the reply
    /// names the setting (a `--hold 144h` refused by a 24 h limit says why).
    AboveMaxTtl {
        cmd: &'static str,
        ms: u64,
        max: u64,
    },
    /// BLOCK negative or not an integer.
    InvalidTimeout(&'static str),
    /// TOKEN or OWNER too short or too long.
    BadLength {
        what: &'static str,
        min: usize,
        max: usize,
    },
    /// LOCKDELAY negative or above lock.max-ttl.
    InvalidLockDelay,
    /// COUNT or WAITERS of LOCK.INFO out of range (the option, the largest allowed).
    InvalidCount(&'static str, usize),
    /// A write command on a replica (also a writable one): locks change only where the
    /// server is the primary for the key.
    ReadOnly,
    /// The module's state is in use by an outer call (a module command reached from
    /// inside one of the module's own callbacks).
    Busy,
    /// Storing the key failed (the server refused the value).
    StoreFailed,
    /// MINFENCE out of range.
    InvalidFence,
    /// The key holds a value that is neither a lock nor a string.
    WrongType,
    /// The wait queue of this lock is full.
    TooManyWaiters(u64),
    /// The per-server fencing counter cannot grow further.
    FenceExhausted,
    /// A fence (MINFENCE, or one arriving by replication) too far ahead of the clock.
    FenceTooFarAhead,
    /// A command that only the replication stream or AOF may send.
    InternalOnly(&'static str),
    /// A Rust panic was caught at the FFI boundary.
    Internal(&'static str),
    /// A BLOCK time whose deadline the server cannot schedule.
    BlockOutOfRange,
    /// Exclusive/SHARED on a counted key, or LIMIT on a read-write key.
    WrongMode,
    /// LIMIT n on a counted key with another limit (the key's is given).
    LimitMismatch(u32),
    /// LIMIT 0, or above the largest limit (given).
    InvalidLimit(u32),
    /// FENCE of FORCERELEASE not a positive integer.
    InvalidFenceArg,
    /// A waiter's lock moved to another cluster node (slot migration).
    TryAgain,
    /// A waiter's lock was moved to another server by MIGRATE.
    Moved,
    /// This node began serving the key's hash slot a moment ago and has not yet heard
    /// every other node's fence counter.
    SlotArriving,
    /// A waiter on a server that became a replica.
    Unblocked,
    /// AFTER of LOCK.INFO not a fence (0 or more).
    InvalidAfter,
    /// OWNER on EXTEND of a classic string lock (it has no label).
    NoLabel,
    /// LOCK.IFHELD / LOCK.IFFENCE: the token (or fence) does not hold the lock now, so
    /// nothing ran.
    NotHeld { fence: bool },
    /// LOCK.IFHELD / LOCK.IFFENCE: a wrapped command that may not run inside them.
    NotGuardable(String),
    /// Keys of one command in different hash slots of a cluster.
    CrossSlot,
    /// The ACL user may not run the wrapped command or touch its keys.
    NoPerm,
    /// No such session on this server (never opened here, or it ended).
    NoSession,
    /// LOCK.EXTEND of a lock taken in a session (its lease is the session's), or a
    /// same-token retry naming another session.
    InSession,
    /// The server's eviction policy (named) could evict a held lock and grant it again;
    /// `lock.allow-eviction` is off.
    Evictable(&'static str),
}

impl fmt::Display for LockError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LockError::WrongArity(cmd) => {
                write!(f, "ERR wrong number of arguments for '{cmd}' command")
            }
            LockError::Syntax(msg) => write!(f, "ERR syntax error: {msg}"),
            LockError::NotInteger => write!(f, "ERR value is not an integer or out of range"),
            LockError::InvalidExpire(cmd) => {
                write!(f, "ERR invalid expire time in '{cmd}' command")
            }
            LockError::AboveMaxTtl { cmd, ms, max } => write!(
                f,
                "ERR invalid expire time in '{cmd}' command: {ms} ms is above lock.max-ttl \
                 ({max} ms)"
            ),
            LockError::InvalidTimeout(why) => write!(f, "ERR timeout {why}"),
            LockError::BadLength { what, min, max } if *what == "TOKEN" && *min > 1 => write!(
                f,
                "ERR TOKEN must be {min} to {max} bytes long (lock.min-token-length is {min}; \
                 a short token is easy to guess: put labels in OWNER)"
            ),
            LockError::BadLength { what, min, max } => {
                write!(f, "ERR {what} must be {min} to {max} bytes long")
            }
            LockError::InvalidLockDelay => write!(
                f,
                "ERR LOCKDELAY must be an integer from 0 to lock.max-ttl (ms)"
            ),
            LockError::InvalidCount(option, max) => {
                write!(f, "ERR {option} must be an integer from 1 to {max}")
            }
            LockError::ReadOnly => write!(
                f,
                "READONLY this server is a replica: locks are granted, released and extended \
                 by its primary"
            ),
            LockError::Busy => write!(
                f,
                "ERR the lock module is busy with an outer call; retry the command on its own"
            ),
            LockError::StoreFailed => write!(f, "ERR the server refused to store the lock"),
            LockError::InvalidFence => {
                write!(
                    f,
                    "ERR MINFENCE must be an integer from 1 to 9223372036854775806"
                )
            }
            LockError::WrongType => write!(
                f,
                "WRONGTYPE Operation against a key holding the wrong kind of value"
            ),
            LockError::TooManyWaiters(max) => write!(
                f,
                "MAXWAITERS this lock already has lock.max-waiters ({max}) clients waiting"
            ),
            LockError::FenceExhausted => write!(f, "ERR fencing token counter exhausted"),
            LockError::FenceTooFarAhead => {
                write!(f, "ERR fence is too far ahead of this server's clock")
            }
            LockError::InternalOnly(cmd) => write!(
                f,
                "ERR '{cmd}' is internal: only the replication stream and the AOF may send it"
            ),
            LockError::Internal(cmd) => write!(
                f,
                "ERR internal error in '{cmd}' (the module caught a panic; see the server log)"
            ),
            LockError::BlockOutOfRange => write!(f, "ERR timeout is out of range"),
            LockError::WrongMode => write!(
                f,
                "WRONGMODE this key is locked, or waited for, in another mode (exclusive and \
                 SHARED mix; a LIMIT key takes only LIMIT)"
            ),
            LockError::LimitMismatch(n) => {
                write!(f, "LIMITMISMATCH this key is a semaphore with LIMIT {n}")
            }
            LockError::InvalidLimit(max) => {
                write!(f, "ERR LIMIT must be an integer from 1 to {max}")
            }
            LockError::InvalidFenceArg => {
                write!(
                    f,
                    "ERR FENCE must be an integer from 1 to 9223372036854775806"
                )
            }
            LockError::TryAgain => write!(
                f,
                "TRYAGAIN the lock's hash slot moved to another node while you waited; retry \
                 and the cluster will redirect you"
            ),
            LockError::SlotArriving => write!(
                f,
                "TRYAGAIN this node began serving the lock's hash slot a moment ago and is \
                 confirming its fences with the other nodes; retry"
            ),
            LockError::Moved => write!(
                f,
                "LOCKMOVED the lock was moved to another server (MIGRATE, CLUSTER MIGRATESLOTS) while you waited"
            ),
            LockError::Unblocked => write!(
                f,
                "UNBLOCKED this server is a replica now; locks are granted by its primary"
            ),
            LockError::InvalidAfter => write!(
                f,
                "ERR AFTER must be an integer from 0 to 9223372036854775806 (a fence)"
            ),
            LockError::NoLabel => write!(
                f,
                "ERR OWNER needs a module lock: this key holds a string lock (SET NX), which \
                 has no label"
            ),
            LockError::NotHeld { fence: false } => write!(
                f,
                "NOTHELD the token does not hold this lock now; the command did not run"
            ),
            LockError::NotHeld { fence: true } => write!(
                f,
                "NOTHELD that fence does not hold this lock now; the command did not run"
            ),
            LockError::NotGuardable(why) => write!(f, "ERR {why}"),
            LockError::NoPerm => write!(
                f,
                "NOPERM this user has no permissions to run the wrapped command or to use its \
                 keys (it runs as the caller)"
            ),
            LockError::CrossSlot => {
                write!(f, "CROSSSLOT Keys in request don't hash to the same slot")
            }
            LockError::NoSession => write!(
                f,
                "NOSESSION no such session here (it ended, or was never opened on this server)"
            ),
            LockError::InSession => write!(
                f,
                "INSESSION the lock was taken in a session: its lease is the session's (LOCK.SESSION KEEPALIVE), and a retry names the same SESSION"
            ),
            LockError::Evictable(policy) => write!(
                f,
                "EVICTION maxmemory-policy {policy} with maxmemory set can evict a held lock \
                 and grant it to a second holder: no new grants (use noeviction or a \
                 volatile-* policy, or accept the risk with CONFIG SET lock.allow-eviction yes)"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_error_starts_with_a_code() {
        let all = [
            LockError::WrongArity("lock.acquire"),
            LockError::Syntax("x".into()),
            LockError::NotInteger,
            LockError::InvalidExpire("lock.extend"),
            LockError::AboveMaxTtl {
                cmd: "lock.acquire",
                ms: 2,
                max: 1,
            },
            LockError::InvalidTimeout("is negative"),
            LockError::BadLength {
                what: "TOKEN",
                min: 16,
                max: 256,
            },
            LockError::BadLength {
                what: "OWNER",
                min: 1,
                max: 256,
            },
            LockError::InvalidCount("COUNT", 1000),
            LockError::InvalidLockDelay,
            LockError::ReadOnly,
            LockError::Busy,
            LockError::StoreFailed,
            LockError::InvalidFence,
            LockError::WrongType,
            LockError::TooManyWaiters(3),
            LockError::FenceExhausted,
            LockError::FenceTooFarAhead,
            LockError::InternalOnly("lock.sync"),
            LockError::Internal("lock.info"),
            LockError::BlockOutOfRange,
            LockError::WrongMode,
            LockError::LimitMismatch(3),
            LockError::InvalidLimit(1_000_000),
            LockError::InvalidFenceArg,
            LockError::TryAgain,
            LockError::Moved,
            LockError::SlotArriving,
            LockError::Unblocked,
            LockError::InvalidAfter,
            LockError::NoLabel,
            LockError::NotHeld { fence: false },
            LockError::NotHeld { fence: true },
            LockError::NotGuardable("x".into()),
            LockError::CrossSlot,
            LockError::NoPerm,
            LockError::Evictable("allkeys-lru"),
            LockError::NoSession,
            LockError::InSession,
        ];
        for e in all {
            let text = e.to_string();
            let code = text.split(' ').next().unwrap_or("");
            assert!(
                !code.is_empty() && code.bytes().all(|b| b.is_ascii_uppercase()),
                "{text}"
            );
            assert!(!text.contains('\n') && !text.contains('\r'));
        }
    }
}
