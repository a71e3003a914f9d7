"""The asyncio lock (redis.asyncio.Redis and redis.asyncio.cluster.RedisCluster), with
the API of ``redis.asyncio.lock.Lock``."""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from types import SimpleNamespace, TracebackType
from typing import Any, Awaitable, Callable, Dict, Optional, Type, Union

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
)

logger = logging.getLogger("redis_lock_module")

OnLost = Callable[["Lock", str], Union[Any, Awaitable[Any]]]


def _is_cluster(client: Any) -> bool:
    try:
        from redis.asyncio.cluster import RedisCluster
    except ImportError:  # pragma: no cover
        return False
    return isinstance(client, RedisCluster)


class _Hold:
    def __init__(self, token: bytes, fence: int, granted_at: float) -> None:
        self.token = token
        self.fence = fence
        self.granted_at = granted_at
        self.stop = asyncio.Event()
        self.lost = asyncio.Event()
        self.lost_reason: Optional[str] = None
        self.task: Optional[asyncio.Task] = None


class Lock:
    """The asyncio twin of :class:`redis_lock_module.Lock` (same options).

    ``Lock(r, "name", timeout=10)`` or ``r.lock("name", timeout=10, lock_class=Lock)``;
    every method that talks to the server is a coroutine, as in redis-py's asyncio lock.
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
        # Tasks share a thread: like redis-py's asyncio lock, the token lives on the lock.
        self.local: Any = SimpleNamespace(token=None, hold=None)

    async def __aenter__(self) -> "Lock":
        if await self.acquire():
            return self
        raise LockError("Unable to acquire lock within the time specified", lock_name=self.name)

    async def __aexit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc_value: Optional[BaseException],
        traceback: Optional[TracebackType],
    ) -> None:
        try:
            await self.release()
        except LockError:
            if self.raise_on_release_error:
                raise
            logger.warning("Lock was unlocked or no longer owned when exiting context manager.")

    async def acquire(
        self,
        blocking: Optional[bool] = None,
        blocking_timeout: Optional[Number] = None,
        token: Optional[Any] = None,
        sleep: Optional[Number] = None,
    ) -> bool:
        del sleep
        if blocking is None:
            blocking = self.blocking
        if blocking_timeout is None:
            blocking_timeout = self.blocking_timeout
        tok = new_token() if token is None else self.redis.get_encoder().encode(token)
        sent = time.monotonic()
        if not blocking or (blocking_timeout is not None and blocking_timeout <= 0):
            fence = await self._acquire_now(tok)
        else:
            block_ms = 0 if blocking_timeout is None else ms(blocking_timeout)
            fence = await self._acquire_blocking(tok, block_ms)
            sent = time.monotonic()
        if fence is None:
            return False
        hold = _Hold(tok, fence, sent)
        self.local.token = tok
        self.local.hold = hold
        if self.auto_renew:
            hold.task = asyncio.ensure_future(self._renew_loop(hold))
        return True

    async def locked(self) -> bool:
        return bool(await self.redis.execute_command("EXISTS", self.name))

    async def owned(self) -> bool:
        hold = self.local.hold
        if hold is None:
            return False
        return holder_ttl(await self.info(), hold.fence) is not None

    async def release(self) -> None:
        hold = self.local.hold
        if hold is None:
            raise LockError(
                "Cannot release a lock that's not owned or is already unlocked.",
                lock_name=self.name,
            )
        hold.stop.set()
        self.local.token = None
        self.local.hold = None
        if not await self.redis.execute_command("LOCK.RELEASE", self.name, hold.token):
            raise LockNotOwnedError(
                "Cannot release a lock that's no longer owned", lock_name=self.name
            )

    async def extend(self, additional_time: Number, replace_ttl: bool = False) -> bool:
        hold = self.local.hold
        if hold is None:
            raise LockError("Cannot extend an unlocked lock", lock_name=self.name)
        if replace_ttl:
            px = ms(additional_time)
        else:
            left = holder_ttl(await self.info(), hold.fence)
            if left is None:
                raise LockNotOwnedError(
                    "Cannot extend a lock that's no longer owned", lock_name=self.name
                )
            px = max(1, left) + ms(additional_time)
        if not await self.redis.execute_command("LOCK.EXTEND", self.name, hold.token, "PX", px):
            raise LockNotOwnedError(
                "Cannot extend a lock that's no longer owned", lock_name=self.name
            )
        return True

    async def reacquire(self) -> bool:
        hold = self.local.hold
        if hold is None:
            raise LockError("Cannot reacquire an unlocked lock", lock_name=self.name)
        args: list = ["LOCK.EXTEND", self.name, hold.token]
        if self.timeout is not None:
            args += ["PX", ms(self.timeout)]
        if not await self.redis.execute_command(*args):
            raise LockNotOwnedError(
                "Cannot reacquire a lock that's no longer owned", lock_name=self.name
            )
        return True

    @property
    def token(self) -> Optional[bytes]:
        return self.local.token

    @property
    def fence(self) -> Optional[int]:
        hold = self.local.hold
        return hold.fence if hold is not None else None

    @property
    def lost_reason(self) -> Optional[str]:
        hold = self.local.hold
        return hold.lost_reason if hold is not None else None

    async def info(self) -> Optional[Dict[str, Any]]:
        return parse_info(await self.redis.execute_command("LOCK.INFO", self.name))

    async def wait_lost(self, timeout: Optional[Number] = None) -> Optional[str]:
        hold = self.local.hold
        if hold is None:
            return None
        try:
            await asyncio.wait_for(hold.lost.wait(), timeout)
        except asyncio.TimeoutError:
            pass
        return hold.lost_reason

    # ------------------------------------------------------------------ acquiring

    def _args(self, token: bytes, block_ms: Optional[int]) -> list:
        return acquire_args(
            self.name, token, self.timeout, self.owner, self.shared, self.limit, block_ms
        )

    async def _acquire_now(self, token: bytes) -> Optional[int]:
        try:
            reply = await self.redis.execute_command(*self._args(token, None))
        except (ConnectionError, TimeoutError, asyncio.TimeoutError):
            await self._release_quietly(token)
            raise
        return parse_grant(reply, token)

    async def _connection(self) -> Any:
        """A connection of our own to the lock's node, with no read timeout of its own
        (each read below has its limit)."""
        if _is_cluster(self.redis):
            if getattr(self.redis, "_initialize", False):
                await self.redis.initialize()  # not connected yet: learn the slots
            node = self.redis.get_node_from_key(self.name)
            cls, kwargs = node.connection_class, dict(node.connection_kwargs)
        else:
            pool = self.redis.connection_pool
            cls, kwargs = pool.connection_class, dict(pool.connection_kwargs)
        kwargs["socket_timeout"] = None
        kwargs["socket_keepalive"] = True
        conn = cls(**kwargs)
        await asyncio.wait_for(conn.connect(), self.network_timeout)
        return conn

    async def _acquire_blocking(self, token: bytes, block_ms: int) -> Optional[int]:
        for attempt in range(2):
            try:
                return await self._acquire_blocking_once(token, block_ms)
            except ResponseError as e:
                if attempt == 0 and _is_cluster(self.redis) and is_moved(e):
                    await self.redis.initialize()
                    continue
                raise
        return None  # pragma: no cover

    async def _acquire_blocking_once(self, token: bytes, block_ms: int) -> Optional[int]:
        conn = await self._connection()
        reading: Optional[asyncio.Future] = None
        try:
            await conn.send_command(*self._args(token, block_ms))
            reading = asyncio.ensure_future(conn.read_response())
            wait = None if block_ms == 0 else block_ms / 1000 + self.network_timeout
            done, _ = await asyncio.wait({reading}, timeout=wait)
            if done:
                return parse_grant(reading.result(), token)
            # No reply in time: queue LOCK.RELEASE behind the waiting acquire on the
            # same connection (see the sync lock), keep reading the acquire's reply.
            await conn.send_command("LOCK.RELEASE", self.name, token)
            done, _ = await asyncio.wait({reading}, timeout=self.network_timeout)
            released: Any = None
            if done:
                late = reading.exception() or reading.result()
                try:
                    released = await asyncio.wait_for(conn.read_response(), self.network_timeout)
                except asyncio.TimeoutError:
                    released = None
                logger.info(
                    "LOCK.ACQUIRE %r answered after the client gave up (%r); released (%r)",
                    self.name,
                    late,
                    released,
                )
            if released is None:
                await self._release_quietly(token)
                raise TimeoutError(
                    f"LOCK.ACQUIRE {self.name!r}: no reply within the wait plus "
                    f"{self.network_timeout} s; sent LOCK.RELEASE for the token"
                )
            return None
        except (ConnectionError, OSError, asyncio.TimeoutError):
            await self._release_quietly(token)
            raise
        finally:
            if reading is not None and not reading.done():
                reading.cancel()
            await conn.disconnect()

    async def _release_quietly(self, token: bytes) -> None:
        try:
            await asyncio.wait_for(
                self.redis.execute_command("LOCK.RELEASE", self.name, token),
                self.network_timeout,
            )
        except Exception as e:
            logger.warning("LOCK.RELEASE %r after a failed acquire failed: %s", self.name, e)

    # ------------------------------------------------------------------ renewal

    async def _call(self, args: list, limit: float) -> Any:
        return await asyncio.wait_for(self.redis.execute_command(*args), max(0.001, limit))

    async def _sleep_or_stop(self, hold: _Hold, seconds: float) -> bool:
        """True when stopped."""
        try:
            await asyncio.wait_for(hold.stop.wait(), max(0.0, seconds))
            return True
        except asyncio.TimeoutError:
            return hold.stop.is_set()

    async def _renew_loop(self, hold: _Hold) -> None:
        started = hold.granted_at
        cap_at = started + self.max_hold if self.max_hold is not None else None
        try:
            if self.timeout is not None:
                ttl = float(self.timeout)
            else:
                pttl = await self._call(["PTTL", self.name], self.network_timeout)
                ttl = max(0.003, int(pttl) / 1000)
            deadline = started + ttl - ttl / 100
            interval = ttl / 3
            while True:
                if await self._sleep_or_stop(hold, min(interval, deadline - time.monotonic())):
                    return
                now = time.monotonic()
                if now >= deadline:
                    await self._lost(hold, LOST_EXPIRED)
                    return
                ask = ttl if cap_at is None else min(ttl, cap_at - now)
                if ask < 0.001:
                    if not await self._sleep_or_stop(hold, deadline - now):
                        await self._lost(hold, LOST_CAP)
                    return
                sent = time.monotonic()
                n = None
                for attempt in range(2):
                    try:
                        n = await self._call(
                            ["LOCK.EXTEND", self.name, hold.token, "PX", ms(ask)],
                            min(self.network_timeout, deadline - time.monotonic()),
                        )
                        break
                    except (ConnectionError, TimeoutError, OSError, ResponseError, asyncio.TimeoutError) as e:
                        if attempt == 1 or hold.stop.is_set() or time.monotonic() >= deadline:
                            logger.warning("renewal of %r failed: %s", self.name, e)
                            await self._lost(hold, LOST_FAILED)
                            return
                if hold.stop.is_set():
                    return
                if n != 1:
                    await self._lost(hold, LOST_NOT_HELD)
                    return
                deadline = sent + ask - ttl / 100
                if ask < ttl:
                    # The cap: that was the last renewal; the lease runs out by itself.
                    if not await self._sleep_or_stop(hold, sent + ask - time.monotonic()):
                        await self._lost(hold, LOST_CAP)
                    return
        except asyncio.CancelledError:
            raise
        except Exception as e:
            logger.warning("renewal of %r stopped: %s", self.name, e)
            await self._lost(hold, LOST_FAILED)

    async def _lost(self, hold: _Hold, reason: str) -> None:
        if hold.stop.is_set():
            return
        hold.lost_reason = reason
        hold.lost.set()
        if self.on_lost is None:
            logger.warning("lock %r lost: %s", self.name, reason)
            return
        try:
            r = self.on_lost(self, reason)
            if inspect.isawaitable(r):
                await r
        except Exception:
            logger.exception("on_lost callback of %r raised", self.name)


def lock(redis: Any, name: Any, timeout: Optional[Number] = None, **kwargs: Any) -> Lock:
    return Lock(redis, name, timeout=timeout, **kwargs)


__all__ = ["Lock", "lock", "LockError", "LockNotOwnedError"]
