"""The exceptions every public module of the package exports: redis-py's own two (what
``redis.lock.Lock`` raises) and the module's."""

from redis.exceptions import LockError, LockNotOwnedError

from ._common import (
    LockNotConfirmedError,
    ModuleNotLoadedError,
    QuorumUnavailableError,
    SessionLostError,
)

__all__ = [
    "LockError",
    "LockNotOwnedError",
    "LockNotConfirmedError",
    "ModuleNotLoadedError",
    "QuorumUnavailableError",
    "SessionLostError",
]
