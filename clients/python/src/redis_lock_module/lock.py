"""The synchronous lock (redis.Redis and redis.cluster.RedisCluster): the I/O of the
logic in ``_base``, with threads and blocking sockets."""

from __future__ import annotations

import threading
from types import TracebackType
from typing import Any, Callable, Dict, Optional, Type

from redis.exceptions import (
    ConnectionError,
    LockError,
    LockNotOwnedError,
    ResponseError,
    TimeoutError,
)

from ._base import Hold, LockBase, logger, run_sync
from ._common import Number, parse_grant, to_bytes

OnLost = Callable[["Lock", str], Any]


class _Local(threading.local):
    # Class attributes: every thread starts with no token (redis-py's threading.local
    # only has them in the thread that made the lock).
    token: Optional[bytes] = None
    hold: Optional[Hold] = None


class Lock(LockBase):
    """A lock on the redis-lock module with the API of ``redis.lock.Lock``.

    ``Lock(r, "name", timeout=10)`` or ``r.lock("name", timeout=10, lock_class=Lock)``.
    Differences from redis-py's lock: waiting is the module's FIFO ``BLOCK`` on a
    connection of its own (``sleep`` is accepted and ignored); every grant has a
    ``fence``; ``timeout=None`` means the server's ``lock.default-ttl`` (the module has
    no lock without a lease), so ``extend``/``reacquire`` work without a timeout too.
    """

    _NET_ERRORS = (ConnectionError, TimeoutError)
    _RENEW_ERRORS = (ConnectionError, TimeoutError, OSError, ResponseError)
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
        """Add ``additional_time`` seconds to the lease (or set it, ``replace_ttl``)."""
        return self._run(self._extend(additional_time, replace_ttl))

    def reacquire(self) -> bool:
        """Reset the lease to ``timeout`` (the server's default TTL when None)."""
        return self._run(self._reacquire())

    # ------------------------------------------------------------------ additions

    def info(self) -> Optional[Dict[str, Any]]:
        """LOCK.INFO as a dict (None when the lock is free)."""
        return self._run(self._info())

    def wait_lost(self, timeout: Optional[Number] = None) -> Optional[str]:
        """Block until auto-renewal loses the lock (or ``timeout``); the reason or None."""
        return self._run(self._wait_lost(timeout))

    # ------------------------------------------------------------------ I/O

    @staticmethod
    def _wait(event: threading.Event, seconds: Optional[float]) -> bool:
        return event.wait(seconds)

    def _refresh_cluster(self) -> None:
        try:
            self.redis.nodes_manager.initialize()
        except Exception as e:  # the retry reports what matters
            logger.debug("cluster refresh failed: %s", e)

    def _release_now(self, token: bytes) -> Any:
        return self.redis.execute_command("LOCK.RELEASE", self.name, token)

    def _connection(self) -> Any:
        """A connection of our own to the node of the lock, with a bounded read timeout."""
        if self._is_cluster():
            node = self.redis.get_node_from_key(self.name)
            pool = self.redis.get_redis_connection(node).connection_pool
        else:
            pool = self.redis.connection_pool
        kwargs = dict(pool.connection_kwargs)
        kwargs["socket_timeout"] = self.network_timeout
        kwargs["socket_keepalive"] = True
        return pool.connection_class(**kwargs)

    def _acquire_blocking_once(self, token: bytes, block_ms: int) -> Optional[int]:
        conn = self._connection()
        try:
            conn.send_command(*self._args(token, block_ms))
            # The server answers by the BLOCK deadline; allow network_timeout on top.
            wait = None if block_ms == 0 else block_ms / 1000 + self.network_timeout
            if conn.can_read(timeout=wait):
                return parse_grant(conn.read_response(), token)
            return self._undo_late_grant(conn, token)
        except (ConnectionError, TimeoutError, OSError):
            self._run(self._release_quietly(token))
            raise
        finally:
            conn.disconnect()

    def _undo_late_grant(self, conn: Any, token: bytes) -> None:
        """No reply in time: queue LOCK.RELEASE behind the waiting acquire on the same
        connection and read both replies (``_late_grant``)."""
        conn.send_command("LOCK.RELEASE", self.name, token)
        late: Any = None
        released: Any = None
        if conn.can_read(timeout=self.network_timeout):
            try:
                late = conn.read_response()
            except ResponseError as e:
                late = e
            if conn.can_read(timeout=self.network_timeout):
                released = conn.read_response()
        return self._run(self._late_grant(token, late, released))

    # ------------------------------------------------------------------ renewal

    def _start_renewal(self, hold: Hold) -> None:
        t = threading.Thread(
            target=self._renew_in_thread,
            args=(hold,),
            name=f"redis-lock-renew:{self.name!r}",
            daemon=True,
        )
        hold.renewal = t
        t.start()

    def _renew_in_thread(self, hold: Hold) -> None:
        hold.conn = self._connection()
        try:
            self._run(self._renewal(hold))
        finally:
            hold.conn.disconnect()

    def _renew_call(self, hold: Hold, args: list, limit: float) -> Any:
        conn = hold.conn
        try:
            conn.send_command(*args)
            if not conn.can_read(timeout=max(0.001, limit)):
                raise TimeoutError(f"{args[0]}: no reply within {limit:.3f} s")
            return conn.read_response()
        except Exception:
            conn.disconnect()  # a fresh connection for the retry
            raise

    def _callback(self, reason: str) -> Any:
        return self.on_lost(self, reason)  # type: ignore[misc]


def lock(redis: Any, name: Any, timeout: Optional[Number] = None, **kwargs: Any) -> Lock:
    """``Lock(redis, name, timeout, **kwargs)``, like ``redis.Redis.lock``."""
    return Lock(redis, name, timeout=timeout, **kwargs)


__all__ = ["Lock", "lock", "LockError", "LockNotOwnedError", "to_bytes"]
