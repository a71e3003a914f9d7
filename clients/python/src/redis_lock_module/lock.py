"""The synchronous lock (redis.Redis and redis.cluster.RedisCluster)."""

from __future__ import annotations

import logging
import threading
import time
from types import SimpleNamespace, TracebackType
from typing import Any, Callable, Dict, Optional, Type

from redis.exceptions import (
    ConnectionError,
    LockError,
    LockNotOwnedError,
    ResponseError,
    TimeoutError,
)

from ._common import (
    LOST_CAP,
    LOST_EXPIRED,
    LOST_FAILED,
    LOST_NOT_HELD,
    Number,
    acquire_args,
    check_options,
    holder_ttl,
    is_moved,
    ms,
    new_token,
    parse_grant,
    parse_info,
    to_bytes,
)

logger = logging.getLogger("redis_lock_module")

OnLost = Callable[["Lock", str], Any]


def _is_cluster(client: Any) -> bool:
    try:
        from redis.cluster import RedisCluster
    except ImportError:  # pragma: no cover - redis-py without cluster support
        return False
    return isinstance(client, RedisCluster)


def _refresh_cluster(client: Any) -> None:
    try:
        client.nodes_manager.initialize()
    except Exception as e:  # the retry below reports what matters
        logger.debug("cluster refresh failed: %s", e)


class _Hold:
    """One grant: its token, fence, and the renewal thread that keeps it."""

    def __init__(self, token: bytes, fence: int, granted_at: float) -> None:
        self.token = token
        self.fence = fence
        # Where the client counts the lease from: the send time of a non-blocking
        # acquire (never after the server's grant), the reply time of a blocking one.
        self.granted_at = granted_at
        self.stop = threading.Event()
        self.lost = threading.Event()
        self.lost_reason: Optional[str] = None
        self.thread: Optional[threading.Thread] = None


class _Local(threading.local):
    # Class attributes: every thread starts with no token (redis-py's threading.local
    # only has them in the thread that made the lock).
    token: Optional[bytes] = None
    hold: Optional[_Hold] = None


class Lock:
    """A lock on the redis-lock module with the API of ``redis.lock.Lock``.

    ``Lock(r, "name", timeout=10)`` or ``r.lock("name", timeout=10, lock_class=Lock)``.
    Differences from redis-py's lock: waiting is the module's FIFO ``BLOCK`` on a
    connection of its own (``sleep`` is accepted and ignored); every grant has a
    ``fence``; ``timeout=None`` means the server's ``lock.default-ttl`` (the module has
    no lock without a lease), so ``extend``/``reacquire`` work without a timeout too.
    """

    def __init__(
        self,
        redis: Any,
        name: Any,
        timeout: Optional[Number] = None,
        sleep: Number = 0.1,
        blocking: bool = True,
        blocking_timeout: Optional[Number] = None,
        thread_local: bool = True,
        raise_on_release_error: bool = True,
        *,
        owner: Optional[str] = None,
        shared: bool = False,
        limit: Optional[int] = None,
        auto_renew: bool = False,
        max_hold: Optional[Number] = None,
        on_lost: Optional[OnLost] = None,
        network_timeout: Number = 2.0,
    ) -> None:
        check_options(timeout, shared, limit, auto_renew, max_hold, network_timeout)
        self.redis = redis
        self.name = name
        self.timeout = timeout
        self.sleep = sleep
        self.blocking = blocking
        self.blocking_timeout = blocking_timeout
        self.thread_local = bool(thread_local)
        self.raise_on_release_error = raise_on_release_error
        self.owner = owner
        self.shared = shared
        self.limit = limit
        self.auto_renew = auto_renew
        self.max_hold = max_hold
        self.on_lost = on_lost
        self.network_timeout = network_timeout
        self.local: Any = _Local() if self.thread_local else SimpleNamespace(token=None, hold=None)

    # ------------------------------------------------------------------ redis-py API

    def __enter__(self) -> "Lock":
        if self.acquire():
            return self
        raise LockError("Unable to acquire lock within the time specified", lock_name=self.name)

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc_value: Optional[BaseException],
        traceback: Optional[TracebackType],
    ) -> None:
        try:
            self.release()
        except LockError:
            if self.raise_on_release_error:
                raise
            logger.warning("Lock was unlocked or no longer owned when exiting context manager.")

    def acquire(
        self,
        sleep: Optional[Number] = None,
        blocking: Optional[bool] = None,
        blocking_timeout: Optional[Number] = None,
        token: Optional[Any] = None,
    ) -> bool:
        """Take the lock; True when taken. ``blocking=False``: one try. Otherwise wait in
        the server's FIFO queue up to ``blocking_timeout`` seconds (None: no limit)."""
        del sleep  # the server hands the lock over; nothing polls
        if blocking is None:
            blocking = self.blocking
        if blocking_timeout is None:
            blocking_timeout = self.blocking_timeout
        tok = new_token() if token is None else self.redis.get_encoder().encode(token)
        sent = time.monotonic()
        if not blocking or (blocking_timeout is not None and blocking_timeout <= 0):
            fence = self._acquire_now(tok)
        else:
            block_ms = 0 if blocking_timeout is None else ms(blocking_timeout)
            fence = self._acquire_blocking(tok, block_ms)
            # When in the wait the grant happened is unknown: count from the reply.
            sent = time.monotonic()
        if fence is None:
            return False
        hold = _Hold(tok, fence, sent)
        self.local.token = tok
        self.local.hold = hold
        if self.auto_renew:
            self._start_renewal(hold)
        return True

    def locked(self) -> bool:
        """True if anyone holds the lock."""
        return bool(self.redis.execute_command("EXISTS", self.name))

    def owned(self) -> bool:
        """True if this lock's grant still holds it (LOCK.INFO shows our fence)."""
        hold = self.local.hold
        if hold is None:
            return False
        return holder_ttl(self.info(), hold.fence) is not None

    def release(self) -> None:
        """Release the lock; LockNotOwnedError if it was no longer ours."""
        hold = self.local.hold
        if hold is None:
            raise LockError(
                "Cannot release a lock that's not owned or is already unlocked.",
                lock_name=self.name,
            )
        hold.stop.set()
        self.local.token = None
        self.local.hold = None
        if not self.redis.execute_command("LOCK.RELEASE", self.name, hold.token):
            raise LockNotOwnedError(
                "Cannot release a lock that's no longer owned", lock_name=self.name
            )

    def extend(self, additional_time: Number, replace_ttl: bool = False) -> bool:
        """Add ``additional_time`` seconds to the lease (or set it, ``replace_ttl``)."""
        hold = self.local.hold
        if hold is None:
            raise LockError("Cannot extend an unlocked lock", lock_name=self.name)
        if replace_ttl:
            px = ms(additional_time)
        else:
            left = holder_ttl(self.info(), hold.fence)
            if left is None:
                raise LockNotOwnedError(
                    "Cannot extend a lock that's no longer owned", lock_name=self.name
                )
            px = max(1, left) + ms(additional_time)
        if not self.redis.execute_command("LOCK.EXTEND", self.name, hold.token, "PX", px):
            raise LockNotOwnedError(
                "Cannot extend a lock that's no longer owned", lock_name=self.name
            )
        return True

    def reacquire(self) -> bool:
        """Reset the lease to ``timeout`` (the server's default TTL when None)."""
        hold = self.local.hold
        if hold is None:
            raise LockError("Cannot reacquire an unlocked lock", lock_name=self.name)
        args: list = ["LOCK.EXTEND", self.name, hold.token]
        if self.timeout is not None:
            args += ["PX", ms(self.timeout)]
        if not self.redis.execute_command(*args):
            raise LockNotOwnedError(
                "Cannot reacquire a lock that's no longer owned", lock_name=self.name
            )
        return True

    # ------------------------------------------------------------------ additions

    @property
    def token(self) -> Optional[bytes]:
        """The token of the current grant (None when not held by this thread)."""
        return self.local.token

    @property
    def fence(self) -> Optional[int]:
        """The fencing token of the current grant: pass it with every write."""
        hold = self.local.hold
        return hold.fence if hold is not None else None

    @property
    def lost_reason(self) -> Optional[str]:
        """Why auto-renewal gave the lock up (``not-held``, ``failed``, ``expired``,
        ``cap-reached``), None while it holds."""
        hold = self.local.hold
        return hold.lost_reason if hold is not None else None

    def info(self) -> Optional[Dict[str, Any]]:
        """LOCK.INFO as a dict (None when the lock is free)."""
        return parse_info(self.redis.execute_command("LOCK.INFO", self.name))

    # ------------------------------------------------------------------ acquiring

    def _args(self, token: bytes, block_ms: Optional[int]) -> list:
        return acquire_args(
            self.name, token, self.timeout, self.owner, self.shared, self.limit, block_ms
        )

    def _acquire_now(self, token: bytes) -> Optional[int]:
        # redis-py may retry this after a timeout: with our TOKEN a retry is a renew.
        try:
            reply = self.redis.execute_command(*self._args(token, None))
        except (ConnectionError, TimeoutError):
            self._release_quietly(token)
            raise
        return parse_grant(reply, token)

    def _pool(self) -> Any:
        if _is_cluster(self.redis):
            node = self.redis.get_node_from_key(self.name)
            return self.redis.get_redis_connection(node).connection_pool
        return self.redis.connection_pool

    def _connection(self) -> Any:
        """A connection of our own to the node of the lock, with a bounded read timeout."""
        pool = self._pool()
        kwargs = dict(pool.connection_kwargs)
        kwargs["socket_timeout"] = self.network_timeout
        kwargs["socket_keepalive"] = True
        return pool.connection_class(**kwargs)

    def _acquire_blocking(self, token: bytes, block_ms: int) -> Optional[int]:
        for attempt in range(2):
            try:
                return self._acquire_blocking_once(token, block_ms)
            except ResponseError as e:
                if attempt == 0 and _is_cluster(self.redis) and is_moved(e):
                    _refresh_cluster(self.redis)
                    continue
                raise
        return None  # pragma: no cover - the loop returns or raises

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
            self._release_quietly(token)
            raise
        finally:
            conn.disconnect()

    def _undo_late_grant(self, conn: Any, token: bytes) -> None:
        """The server did not answer in time. Queue LOCK.RELEASE behind the waiting
        acquire on the same connection: the server runs it right after the wait ends,
        so a grant made after we gave up is given back at once instead of sitting
        with nobody listening until its lease ends."""
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
        if released is None:
            self._release_quietly(token)
            raise TimeoutError(
                f"LOCK.ACQUIRE {self.name!r}: no reply within the wait plus "
                f"{self.network_timeout} s; sent LOCK.RELEASE for the token"
            )
        logger.info(
            "LOCK.ACQUIRE %r answered after the client gave up (%r); released (%r)",
            self.name,
            late,
            released,
        )
        return None

    def _release_quietly(self, token: bytes) -> None:
        try:
            self.redis.execute_command("LOCK.RELEASE", self.name, token)
        except Exception as e:  # best effort: the lease ends by itself anyway
            logger.warning("LOCK.RELEASE %r after a failed acquire failed: %s", self.name, e)

    # ------------------------------------------------------------------ renewal

    def _start_renewal(self, hold: _Hold) -> None:
        t = threading.Thread(
            target=self._renew_loop,
            args=(hold,),
            name=f"redis-lock-renew:{self.name!r}",
            daemon=True,
        )
        hold.thread = t
        t.start()

    def _call(self, conn: Any, args: list, limit: float) -> Any:
        conn.send_command(*args)
        if not conn.can_read(timeout=max(0.001, limit)):
            raise TimeoutError(f"{args[0]}: no reply within {limit:.3f} s")
        return conn.read_response()

    def _renew_loop(self, hold: _Hold) -> None:
        started = hold.granted_at
        cap_at = started + self.max_hold if self.max_hold is not None else None
        conn = self._connection()
        try:
            if self.timeout is not None:
                ttl = float(self.timeout)
            else:
                ttl = max(0.003, int(self._call(conn, ["PTTL", self.name], self.network_timeout)) / 1000)
            deadline = started + ttl - ttl / 100  # the client's conservative view
            interval = ttl / 3
            while True:
                if hold.stop.wait(max(0.0, min(interval, deadline - time.monotonic()))):
                    return
                now = time.monotonic()
                if now >= deadline:
                    self._lost(hold, LOST_EXPIRED)
                    return
                ask = ttl if cap_at is None else min(ttl, cap_at - now)
                if ask < 0.001:
                    # The cap: no more renewals; the lease runs out on the server.
                    if not hold.stop.wait(max(0.0, deadline - now)):
                        self._lost(hold, LOST_CAP)
                    return
                sent = time.monotonic()
                n = None
                for attempt in range(2):
                    try:
                        n = self._call(
                            conn,
                            ["LOCK.EXTEND", self.name, hold.token, "PX", ms(ask)],
                            min(self.network_timeout, deadline - time.monotonic()),
                        )
                        break
                    except (ConnectionError, TimeoutError, OSError, ResponseError) as e:
                        conn.disconnect()
                        if attempt == 1 or hold.stop.is_set() or time.monotonic() >= deadline:
                            logger.warning("renewal of %r failed: %s", self.name, e)
                            self._lost(hold, LOST_FAILED)
                            return
                if hold.stop.is_set():
                    return
                if n != 1:
                    self._lost(hold, LOST_NOT_HELD)
                    return
                deadline = sent + ask - ttl / 100
                if ask < ttl:
                    # The cap: that was the last renewal; the lease runs out by itself.
                    if not hold.stop.wait(max(0.0, sent + ask - time.monotonic())):
                        self._lost(hold, LOST_CAP)
                    return
        except Exception as e:
            logger.warning("renewal of %r stopped: %s", self.name, e)
            self._lost(hold, LOST_FAILED)
        finally:
            conn.disconnect()

    def _lost(self, hold: _Hold, reason: str) -> None:
        if hold.stop.is_set():
            return
        hold.lost_reason = reason
        hold.lost.set()
        if self.on_lost is None:
            logger.warning("lock %r lost: %s", self.name, reason)
            return
        try:
            self.on_lost(self, reason)
        except Exception:
            logger.exception("on_lost callback of %r raised", self.name)

    def wait_lost(self, timeout: Optional[Number] = None) -> Optional[str]:
        """Block until auto-renewal loses the lock (or ``timeout``); the reason or None."""
        hold = self.local.hold
        if hold is None:
            return None
        hold.lost.wait(timeout)
        return hold.lost_reason


def lock(redis: Any, name: Any, timeout: Optional[Number] = None, **kwargs: Any) -> Lock:
    """``Lock(redis, name, timeout, **kwargs)``, like ``redis.Redis.lock``."""
    return Lock(redis, name, timeout=timeout, **kwargs)


__all__ = ["Lock", "lock", "LockError", "LockNotOwnedError", "to_bytes"]
