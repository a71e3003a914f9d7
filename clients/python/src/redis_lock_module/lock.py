"""The synchronous lock (redis.Redis and redis.cluster.RedisCluster): the I/O of the
logic in ``_base``, with threads and blocking sockets."""

from __future__ import annotations

import threading
from types import TracebackType
from typing import Any, Callable, Dict, Optional, Type

from . import _errors
from ._base import Conn, Hold, LockBase, NoReply, logger, run_sync
from ._common import Number, to_bytes
from ._errors import (  # re-exported (`X as X`: explicit for mypy --strict)
    LockError as LockError,
    LockNotOwnedError as LockNotOwnedError,
    LockNotConfirmedError as LockNotConfirmedError,
    ModuleNotLoadedError as ModuleNotLoadedError,
    QuorumUnavailableError as QuorumUnavailableError,
    SessionLostError as SessionLostError,
)
from ._conns import NODES, Node

OnLost = Callable[["Lock", str], Any]


class _Local(threading.local):
    # Class attributes: every thread starts with no token (redis-py's threading.local
    # only has them in the thread that made the lock).
    token: Optional[bytes] = None
    hold: Optional[Hold] = None
    fence: Optional[int] = None


class Lock(LockBase):
    """A lock on the redis-lock module with the API of ``redis.lock.Lock``.

    ``Lock(r, "name", timeout=10)`` or ``r.lock("name", timeout=10, lock_class=Lock)``.
    Differences from redis-py's lock: waiting is the module's FIFO ``BLOCK`` (``sleep``
    is accepted and ignored); every grant has a ``fence``; commands go over connections
    of the lock's own, each bounded by ``network_timeout``; a grant is confirmed on the
    server's replicas (``WAIT``) before ``acquire`` returns (``confirm=False`` turns that
    off). ``timeout=None`` holds until released, as redis-py's: the module has no lease
    without an end, so the lock renews the server's ``lock.default-ttl`` while held and
    reports a loss (``on_lost``, ``wait_lost``). ``session=`` takes it in a
    :class:`~redis_lock_module.Session` (no ``timeout``: the session's lease is its own).
    """

    _CLUSTER_MODULE = "redis.cluster"
    _run = staticmethod(run_sync)
    _event = staticmethod(threading.Event)

    def _new_local(self) -> Any:
        return _Local() if self.thread_local else super()._new_local()

    # ------------------------------------------------------------------ redis-py API

    def __enter__(self) -> "Lock":
        return self._run(self._enter())

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc_value: Optional[BaseException],
        traceback: Optional[TracebackType],
    ) -> None:
        self._run(self._exit())

    def acquire(
        self,
        sleep: Optional[Number] = None,
        blocking: Optional[bool] = None,
        blocking_timeout: Optional[Number] = None,
        token: Optional[Any] = None,
    ) -> bool:
        """Take the lock; True when taken. ``blocking=False``: one try. Otherwise wait in
        the server's FIFO queue up to ``blocking_timeout`` seconds (None: no limit).
        ``sleep`` is ignored: the server hands the lock over; nothing polls."""
        return self._run(self._acquire(blocking, blocking_timeout, token))

    def locked(self) -> bool:
        """True if anyone holds the lock."""
        return self._run(self._locked())

    def owned(self) -> bool:
        """True if this lock's grant still holds it (LOCK.INFO shows our fence)."""
        return self._run(self._owned())

    def release(self) -> None:
        """Release the lock; LockNotOwnedError if it was no longer ours."""
        self._run(self._release())

    def extend(self, additional_time: Number, replace_ttl: bool = False) -> bool:
        """Add ``additional_time`` seconds to the lease (or set it, ``replace_ttl``).
        LockError for a lock with ``timeout=None`` (as redis-py's: it renews itself)."""
        return self._run(self._extend(additional_time, replace_ttl))

    def reacquire(self) -> bool:
        """Reset the lease to ``timeout``; LockError for a lock with ``timeout=None``."""
        return self._run(self._reacquire())

    # ------------------------------------------------------------------ additions

    def info(self) -> Optional[Dict[str, Any]]:
        """LOCK.INFO as a dict (None when the lock is free)."""
        return self._run(self._info())

    def wait_lost(self, timeout: Optional[Number] = None) -> Optional[str]:
        """Block until auto-renewal loses the lock (or ``timeout``); the reason or None."""
        return self._run(self._wait_lost(timeout))

    def if_held(self, *args: Any) -> Any:
        """Run one command only while this grant holds the lock, in one atomic step on
        the server (``LOCK.IFHELD name token *args``), and return its reply as the
        server sent it (``lock.if_held("DECRBY", "stock:9001", 1)``). When the grant no
        longer holds the lock (its lease ended: a pause longer than the lease, a lost
        renewal) nothing runs, the lock counts as lost (``lost_reason`` ``not-held``,
        ``on_lost`` is called) and LockNotOwnedError is raised. The command is sent
        once. In a cluster its keys must share the lock's slot (a hash tag)."""
        return self._run(self._if_held(args))

    def if_fence(self, fence: int, *args: Any) -> Any:
        """``LOCK.IFFENCE name fence *args``: the same for code that was handed only a
        fence (no token): runs the command only while the holder with that fence holds
        the lock; LockNotOwnedError (nothing ran) otherwise. Works on a Lock that was
        never acquired: ``Lock(r, name).if_fence(fence, "SET", "k", "v")``."""
        return self._run(self._if_fence(fence, args))

    def check(self, fence: Optional[int] = None) -> bool:
        """``LOCK.CHECK name fence`` (default: this grant's fence): True while that
        fence is a current holder's. A check and a later write are still a race: use
        ``if_held`` / ``if_fence`` for writes."""
        return self._run(self._check(fence))

    # ------------------------------------------------------------------ I/O

    @staticmethod
    def _wait(event: threading.Event, seconds: Optional[float]) -> bool:
        return event.wait(seconds)

    def _refresh_cluster(self) -> None:
        try:
            self.redis.nodes_manager.initialize()
        except Exception as e:  # the retry reports what matters
            logger.debug("cluster refresh failed: %s", type(e).__name__)

    def _node(self) -> Node:
        if self._is_cluster():
            node = self.redis.get_node_from_key(self.name)
            key: Any = (node.host, node.port)

            def make() -> Any:
                pool = self.redis.get_redis_connection(node).connection_pool
                return pool.connection_class, dict(pool.connection_kwargs)

        else:
            key = "default"

            def make() -> Any:
                pool = self.redis.connection_pool
                return pool.connection_class, dict(pool.connection_kwargs)

        return NODES.node(self.redis, key, make)

    def _open(self, node: Node) -> Conn:
        raw = node.take()
        if raw is not None:
            try:
                # Readable while idle means closed by the server (or out of step).
                if not raw.can_read(timeout=0):
                    conn = Conn(raw)
                    conn.reused = True  # type: ignore[attr-defined]
                    return conn
            except Exception:
                pass
            raw.disconnect()
        raw = node.new_connection(self.network_timeout)
        try:
            raw.connect()
        except BaseException:
            raw.disconnect()
            raise
        return Conn(raw)

    @staticmethod
    def _close(node: Node, conn: Conn, reuse: bool) -> None:
        if reuse and node.give_back(conn.raw):
            return
        conn.raw.disconnect()

    @staticmethod
    def _send(conn: Conn, args: Any) -> None:
        conn.raw.send_command(*args)

    @staticmethod
    def _read(conn: Conn, seconds: Optional[float]) -> Any:
        if not conn.raw.can_read(timeout=seconds):
            raise NoReply()
        return conn.raw.read_response()

    # ------------------------------------------------------------------ renewal

    def _start_renewal(self, hold: Hold) -> None:
        t = threading.Thread(
            target=self._run,
            args=(self._renewal(hold),),
            name=f"redis-lock-renew:{self.name!r}",
            daemon=True,
        )
        hold.renewal = t
        t.start()

    def _callback(self, reason: str) -> Any:
        return self.on_lost(self, reason)  # type: ignore[misc]


def lock(redis: Any, name: Any, timeout: Optional[Number] = None, **kwargs: Any) -> Lock:
    """``Lock(redis, name, timeout, **kwargs)``, like ``redis.Redis.lock``."""
    return Lock(redis, name, timeout=timeout, **kwargs)


__all__ = ["Lock", "lock", "to_bytes"]
__all__ += _errors.__all__
