//! The client's one error type.
//!
//! Every message names the server by `host:port` only: never a URL with its user and
//! password, never a lock token, never the arguments of a command (a server's
//! `unknown command '...', with args beginning with: ...` reply is cut before them).

use std::fmt;
use std::time::Duration;

/// What went wrong talking to the lock server(s).
///
/// "The lock is busy" is not an error: acquire calls return `Ok(None)` for it.
pub enum Error {
    /// A connection failure or an error reply from the server at `node` (`host:port`).
    Redis {
        node: String,
        error: redis::RedisError,
    },
    /// A network call to `node` did not finish within its time limit.
    Timeout {
        node: String,
        /// Which call (e.g. `"LOCK.EXTEND"`, `"connect"`).
        what: &'static str,
        /// The limit that passed.
        after: Duration,
        /// What the silence probably means, when the client could tell (e.g. a TLS
        /// handshake against a server without TLS).
        hint: Option<String>,
    },
    /// A reply of a shape the module never sends (wrong server, or a proxy in between).
    Protocol(String),
    /// Invalid arguments (a zero TTL, an empty node list, a bad URL, ...).
    Invalid(String),
    /// The server at `node` does not have the redis-lock module, and what was asked
    /// needs it (a shared or counted lock; the classic `SET NX PX` fallback takes
    /// exclusive locks only).
    ModuleMissing {
        node: String,
        /// What needed the module (e.g. `"a shared lock"`).
        needs: String,
    },
    /// A grant was not confirmed on the server's replicas (`WAIT`) within the limit, or
    /// fewer replicas are connected than the deployment expects; the grant was given
    /// back (`LOCK.RELEASE`), so nobody holds it on its behalf.
    Unconfirmed {
        node: String,
        /// Replicas that acknowledged the grant.
        confirmed: u32,
        /// Replicas that had to (the setting, `min-replicas-to-write`, or every replica
        /// connected at the time).
        needed: u32,
        /// Replicas connected and online, as `INFO replication` last said (`None`: not
        /// known).
        connected: Option<u32>,
        /// The `WAIT` limit (zero when the grant was given back before waiting, because
        /// too few replicas were connected).
        after: Duration,
    },
    /// The lock is not held by this holder any more (its lease ended, it was released
    /// or force-released), so what needed it did not happen: a guarded command
    /// (`LOCK.IFHELD` / `LOCK.IFFENCE` answered `NOTHELD`; nothing ran), or a leader's
    /// [`proclaim`](crate::Leadership::proclaim) after its leadership was lost. Never
    /// carries the token.
    NotHeld {
        node: String,
        /// The lock's name (its key).
        key: String,
        /// What did not happen (e.g. `"the guarded command did not run"`).
        what: &'static str,
    },
    /// A TLS connection the server ended, with what probably went wrong (a client
    /// certificate the server requires and was not given).
    Tls { node: String, detail: String },
    /// The session is not open on the server at `node` (`NOSESSION`): it ended (closed,
    /// its lease ran out, its bound connection closed, the server restarted without
    /// it), so every lock it held there is gone and nothing can be taken in it. The
    /// [`Session`](crate::Session)'s loss signal fires with it. Never carries the id.
    NoSession { node: String },
    /// Redlock: fewer than a majority of the nodes could be asked at all (down, stopped,
    /// too slow, a wrong password, a grant they could not confirm): neither a grant nor
    /// "held elsewhere" can be told.
    NoQuorum {
        /// Nodes that answered (granted, or said the lock is held elsewhere).
        answered: usize,
        /// The majority needed.
        needed: usize,
        /// One of the errors, for the message.
        error: String,
    },
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A server error text without the part that repeats the command's arguments (the
/// server's `unknown command 'X', with args beginning with: 'key' 'PX' ... 'TOKEN'
/// '<token>'` would put the token into logs and cron mail).
pub(crate) fn scrub(text: &str) -> String {
    let lower = text.to_ascii_lowercase();
    match lower.find("with args beginning with") {
        Some(i) => format!(
            "{} (arguments not shown)",
            text[..i].trim_end().trim_end_matches(',')
        ),
        None => text.to_string(),
    }
}

impl Error {
    /// An error of a call to `node`.
    pub(crate) fn redis(node: &str, error: redis::RedisError) -> Error {
        Error::Redis {
            node: node.to_string(),
            error,
        }
    }

    /// True for failures of the connection itself (refused, reset, closed), after which
    /// the connection is dropped and a fresh one is made on the next call.
    pub fn is_connection_error(&self) -> bool {
        match self {
            Error::Redis { error: e, .. } => {
                e.is_io_error()
                    || e.is_connection_dropped()
                    || e.is_connection_refusal()
                    || e.is_unrecoverable_error()
            }
            _ => false,
        }
    }

    /// True while Sentinels name no usable primary for the service (during a failover:
    /// the old primary is down and no replica promoted yet). Trying again later helps.
    pub fn is_failover_pending(&self) -> bool {
        match self {
            Error::Redis { error: e, .. } => {
                e.kind() == redis::ErrorKind::MasterNameNotFoundBySentinel
            }
            _ => false,
        }
    }

    /// The code of an error reply (`WRONGMODE`, `LIMITMISMATCH`, `WRONGTYPE`,
    /// `MAXWAITERS`, `NOREPLICAS`, `READONLY`, `ERR`, ...), `None` for other errors.
    pub fn server_code(&self) -> Option<&str> {
        match self {
            Error::Redis { error: e, .. } => e.code(),
            _ => None,
        }
    }

    /// True for a mistake in how the lock is used rather than a failure or contention:
    /// invalid arguments, a mode the key does not have (`WRONGMODE`), another limit
    /// (`LIMITMISMATCH`), a kind of lock the server cannot give without the module.
    /// Retrying does not help.
    pub fn is_usage_error(&self) -> bool {
        matches!(self, Error::Invalid(_) | Error::ModuleMissing { .. })
            || matches!(self.server_code(), Some("WRONGMODE" | "LIMITMISMATCH"))
            || self.is_lease_too_long()
    }

    /// True when the server refused a lease this long: above its `lock.max-ttl` (the
    /// module's message names the setting and the limit). An acquire with a
    /// [hold](crate::AcquireOptions::hold) is refused so before anything is taken.
    pub fn is_lease_too_long(&self) -> bool {
        match self {
            Error::Redis { error, .. } => {
                error.code() == Some("ERR")
                    && error
                        .detail()
                        .is_some_and(|d| d.starts_with("invalid expire time"))
            }
            _ => false,
        }
    }

    /// True for [`Error::NotHeld`]: the lock was not held by this holder, so the guarded
    /// command did not run (or the leader's value was not published).
    pub fn is_not_held(&self) -> bool {
        matches!(self, Error::NotHeld { .. })
    }

    /// True for [`Error::NoSession`]: the session ended on the server (its locks are
    /// gone).
    pub fn is_no_session(&self) -> bool {
        matches!(self, Error::NoSession { .. })
    }

    /// A `NOSESSION` error reply as [`Error::NoSession`]; any other error as it is.
    pub(crate) fn or_no_session(self) -> Error {
        match self {
            Error::Redis { node, error } if error.code() == Some("NOSESSION") => {
                Error::NoSession { node }
            }
            e => e,
        }
    }

    /// An error reply `NOTHELD ...` (`LOCK.IFHELD` / `LOCK.IFFENCE` refused to run the
    /// command).
    pub(crate) fn is_notheld_reply(&self) -> bool {
        self.server_code() == Some("NOTHELD")
    }

    /// True when the server answered `ERR unknown command` (the module is not loaded).
    pub(crate) fn is_unknown_command(&self) -> bool {
        match self {
            Error::Redis { error: e, .. } => {
                e.code() == Some("ERR")
                    && e.to_string()
                        .to_ascii_lowercase()
                        .contains("unknown command")
            }
            _ => false,
        }
    }

    /// The server (`host:port`) the error came from, when it came from one.
    pub fn node(&self) -> Option<&str> {
        match self {
            Error::Redis { node, .. }
            | Error::Timeout { node, .. }
            | Error::ModuleMissing { node, .. }
            | Error::Unconfirmed { node, .. }
            | Error::Tls { node, .. }
            | Error::NoSession { node }
            | Error::NotHeld { node, .. } => Some(node),
            _ => None,
        }
    }
}

/// Where to read about loading the module, for messages.
pub(crate) const MODULE_HELP: &str = "see docs/CLIENT.md, \"Without the module\" \
     (load it with `loadmodule /usr/lib/redis/modules/redis-lock.so`)";

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Redis { node, error }
                if error.kind() == redis::ErrorKind::AuthenticationFailed =>
            {
                write!(
                    f,
                    "{node}: authentication failed (wrong or missing user name or password)"
                )
            }
            // A server's reply as redis-cli shows it: `CODE message`.
            Error::Redis { node, error } => match (error.code(), error.detail()) {
                (Some(code), Some(detail)) => write!(f, "{node}: {code} {}", scrub(detail)),
                _ => write!(f, "{node}: {}", scrub(&error.to_string())),
            },
            Error::Timeout {
                node,
                what,
                after,
                hint,
            } => {
                write!(
                    f,
                    "{node}: {what}: no answer within {} ms",
                    after.as_millis()
                )?;
                match hint {
                    Some(h) => write!(f, "; {h}"),
                    None => write!(f, " (the server is down, stopped or overloaded)"),
                }
            }
            Error::Protocol(m) => write!(f, "unexpected reply: {m}"),
            Error::Invalid(m) => write!(f, "invalid argument: {m}"),
            Error::ModuleMissing { node, needs } => write!(
                f,
                "the redis-lock module is not loaded on {node}; {MODULE_HELP}. {needs} needs \
                 it (without the module only exclusive locks can be taken, with SET NX PX)"
            ),
            Error::Unconfirmed {
                node,
                confirmed,
                needed,
                connected,
                after,
            } => {
                if after.is_zero() {
                    write!(
                        f,
                        "{node}: only {} replica(s) online, {needed} expected: the grant \
                         was given back (it would not survive a failover)",
                        connected.unwrap_or(0)
                    )
                } else {
                    write!(
                        f,
                        "{node}: the grant was confirmed by {confirmed} of {needed} replica(s) \
                         within {} ms (WAIT){}: it was given back (it might not survive a \
                         failover)",
                        after.as_millis(),
                        connected.map_or(String::new(), |c| format!(", {c} connected"))
                    )
                }
            }
            Error::Tls { node, detail } => write!(f, "{node}: {detail}"),
            Error::NoSession { node } => write!(
                f,
                "{node}: NOSESSION the session is not open on this server (it was closed, \
                 its lease ran out or its connection closed): its locks there are gone"
            ),
            Error::NotHeld { node, key, what } => write!(
                f,
                "{node}: {key} is not held by this holder any more (its lease ended, or it \
                 was released): {what}"
            ),
            Error::NoQuorum {
                answered,
                needed,
                error,
            } => write!(
                f,
                "only {answered} node(s) answered, a majority needs {needed}: not acquired, \
                 and not known to be held elsewhere (e.g. {error})"
            ),
        }
    }
}

/// The variant and the message (the same text as `Display`, so that an `unwrap` never
/// shows more than a log line would).
impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let variant = match self {
            Error::Redis { .. } => "Redis",
            Error::Timeout { .. } => "Timeout",
            Error::Protocol(_) => "Protocol",
            Error::Invalid(_) => "Invalid",
            Error::ModuleMissing { .. } => "ModuleMissing",
            Error::Unconfirmed { .. } => "Unconfirmed",
            Error::NotHeld { .. } => "NotHeld",
            Error::Tls { .. } => "Tls",
            Error::NoSession { .. } => "NoSession",
            Error::NoQuorum { .. } => "NoQuorum",
        };
        write!(f, "{variant}({self})")
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        // Not the RedisError: its text may repeat a command's arguments (see `scrub`).
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The error of a server's `-ERR text` reply.
    fn reply(text: &str) -> redis::RedisError {
        match redis::parse_redis_value(format!("-ERR {text}\r\n").as_bytes()) {
            Ok(redis::Value::ServerError(e)) => e.into(),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn an_unknown_command_reply_never_shows_its_arguments() {
        let token = "608a1f0e-1c2d-4e5f-8a9b-0c1d2e3f4a5b";
        let e = Error::redis(
            "127.0.0.1:6379",
            reply(&format!(
                "unknown command 'LOCK.ACQUIRE', with args beginning with: 'x' 'PX' '1000' \
                 'TOKEN' '{token}' "
            )),
        );
        for text in [e.to_string(), format!("{e:?}")] {
            assert!(!text.contains(token), "{text}");
            assert!(!text.contains("'PX'"), "{text}");
            assert!(
                text.starts_with("Redis(127.0.0.1:6379: ") || text.starts_with("127.0.0.1:6379: ")
            );
            assert!(text.contains("unknown command 'LOCK.ACQUIRE'"), "{text}");
        }
        assert!(e.is_unknown_command());
        let e = Error::redis(
            "h:1",
            reply(
                "invalid expire time in 'lock.extend' command: 518400000 ms is above \
                 lock.max-ttl (86400000 ms)",
            ),
        );
        assert!(e.is_lease_too_long() && e.is_usage_error());
        assert!(
            e.to_string().ends_with("above lock.max-ttl (86400000 ms)"),
            "{e}"
        );
        // Other replies are shown whole.
        let e = Error::redis("h:1", reply("TOKEN must be 16 to 256 bytes long"));
        assert_eq!(e.to_string(), "h:1: ERR TOKEN must be 16 to 256 bytes long");
    }

    #[test]
    fn messages_name_the_node() {
        let e = Error::Timeout {
            node: "10.0.0.1:6379".into(),
            what: "LOCK.ACQUIRE",
            after: Duration::from_millis(1500),
            hint: None,
        };
        assert_eq!(
            e.to_string(),
            "10.0.0.1:6379: LOCK.ACQUIRE: no answer within 1500 ms (the server is down, \
             stopped or overloaded)"
        );
        let e = Error::Unconfirmed {
            node: "h:1".into(),
            confirmed: 0,
            needed: 1,
            connected: Some(1),
            after: Duration::from_secs(1),
        };
        assert!(e
            .to_string()
            .contains("confirmed by 0 of 1 replica(s) within 1000 ms"));
        let e = Error::ModuleMissing {
            node: "h:2".into(),
            needs: "a shared lock".into(),
        };
        assert!(e
            .to_string()
            .starts_with("the redis-lock module is not loaded on h:2; see "));
        assert!(e.is_usage_error());
        assert_eq!(e.node(), Some("h:2"));
    }
}
