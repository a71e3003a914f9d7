//! The client's one error type.

use std::fmt;
use std::time::Duration;

/// What went wrong talking to the lock server(s).
///
/// "The lock is busy" is not an error: acquire calls return `Ok(None)` for it.
#[derive(Debug)]
pub enum Error {
    /// A connection failure or an error reply from a server.
    Redis(redis::RedisError),
    /// A network call did not finish within its time limit.
    Timeout {
        /// Which call (e.g. `"LOCK.EXTEND"`).
        what: &'static str,
        /// The limit that passed.
        after: Duration,
    },
    /// A reply of a shape the module never sends (wrong server, or a proxy in between).
    Protocol(String),
    /// Invalid arguments (a zero TTL, an empty node list, a bad URL, ...).
    Invalid(String),
    /// Redlock: fewer than a majority of the nodes answered (down, stopped, or too slow).
    NoQuorum {
        /// Nodes that answered.
        answered: usize,
        /// The majority needed.
        needed: usize,
        /// One of the errors, for the message.
        error: String,
    },
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// True for failures of the connection itself (refused, reset, closed), after which
    /// the connection is dropped and a fresh one is made on the next call.
    pub fn is_connection_error(&self) -> bool {
        match self {
            Error::Redis(e) => {
                e.is_io_error()
                    || e.is_connection_dropped()
                    || e.is_connection_refusal()
                    || e.is_unrecoverable_error()
            }
            _ => false,
        }
    }

    /// The code of an error reply (`WRONGMODE`, `LIMITMISMATCH`, `WRONGTYPE`,
    /// `MAXWAITERS`, `ERR`, ...), `None` for other errors.
    pub fn server_code(&self) -> Option<&str> {
        match self {
            Error::Redis(e) => e.code(),
            _ => None,
        }
    }

    /// True for a mistake in how the lock is used rather than a failure or contention:
    /// invalid arguments, a mode the key does not have (`WRONGMODE`), another limit
    /// (`LIMITMISMATCH`). Retrying does not help.
    pub fn is_usage_error(&self) -> bool {
        matches!(self, Error::Invalid(_))
            || matches!(self.server_code(), Some("WRONGMODE" | "LIMITMISMATCH"))
    }

    /// True when the server answered `ERR unknown command` (the module is not loaded).
    pub(crate) fn is_unknown_command(&self) -> bool {
        match self {
            Error::Redis(e) => {
                e.kind() == redis::ErrorKind::ResponseError
                    && e.to_string()
                        .to_ascii_lowercase()
                        .contains("unknown command")
            }
            _ => false,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Redis(e) => write!(f, "{e}"),
            Error::Timeout { what, after } => {
                write!(f, "{what} timed out after {} ms", after.as_millis())
            }
            Error::Protocol(m) => write!(f, "unexpected reply: {m}"),
            Error::Invalid(m) => write!(f, "invalid argument: {m}"),
            Error::NoQuorum {
                answered,
                needed,
                error,
            } => write!(
                f,
                "only {answered} node(s) answered, a majority needs {needed} (e.g. {error})"
            ),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Redis(e) => Some(e),
            _ => None,
        }
    }
}

impl From<redis::RedisError> for Error {
    fn from(e: redis::RedisError) -> Self {
        Error::Redis(e)
    }
}
