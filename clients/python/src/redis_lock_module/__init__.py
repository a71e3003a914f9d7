"""redis-py locks on the redis-lock server module.

``from redis_lock_module import Lock`` instead of ``from redis.lock import Lock`` (or
``redis_lock_module.asyncio.Lock`` for ``redis.asyncio``): same constructor, same
methods, same exceptions (redis-py's own ``LockError`` / ``LockNotOwnedError``), plus
``fence``, ``owner=``, auto-renewal with a loss callback and a cap on the hold, and the
server's FIFO wait instead of polling; guarded writes (``lock.if_held(...)``:
LOCK.IFHELD) and leader election (``Election``: campaign, proclaim, resign, leader,
observe); sessions (``Session``: one keepalive for any number of locks, released
together when it ends).
"""

from ._common import LOST_CAP, LOST_EXPIRED, LOST_FAILED, LOST_NOT_HELD
from . import _errors
from ._errors import (  # re-exported (`X as X`: explicit for mypy --strict)
    LockError as LockError,
    LockNotOwnedError as LockNotOwnedError,
    LockNotConfirmedError as LockNotConfirmedError,
    ModuleNotLoadedError as ModuleNotLoadedError,
    QuorumUnavailableError as QuorumUnavailableError,
    SessionLostError as SessionLostError,
)
from ._common import Leader
from .election import Election, Leadership
from .lock import Lock, lock
from .redlock import Redlock, RedlockGrant
from .session import Session

__version__ = "0.1.0"

__all__ = [
    "Election",
    "Leader",
    "Leadership",
    "Lock",
    "lock",
    "Redlock",
    "RedlockGrant",
    "Session",
    "LOST_CAP",
    "LOST_EXPIRED",
    "LOST_FAILED",
    "LOST_NOT_HELD",
]
__all__ += _errors.__all__
