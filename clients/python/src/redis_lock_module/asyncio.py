"""The asyncio lock (redis.asyncio.Redis and redis.asyncio.cluster.RedisCluster), with
the API of ``redis.asyncio.lock.Lock``: the I/O of the logic in ``_base``, with tasks and
awaited reads."""

from __future__ import annotations

import asyncio
import inspect
from types import TracebackType
from typing import Any, Awaitable, Callable, Dict, Optional, Type, Union

from redis.exceptions import (
    ConnectionError,
    LockError,
    LockNotOwnedError,
    ResponseError,
    TimeoutError,
)

from ._base import Hold, LockBase, logger, run_async
from ._common import Number, parse_grant

OnLost = Callable[["Lock", str], Union[Any, Awaitable[Any]]]


class Lock(LockBase):
    """The asyncio twin of :class:`redis_lock_module.Lock` (same options).

    ``Lock(r, "name", timeout=10)`` or ``r.lock("name", timeout=10, lock_class=Lock)``;
    every method that talks to the server is a coroutine, as in redis-py's asyncio lock.
    Tasks share a thread: like redis-py's asyncio lock, the token lives on the lock.
    """

    _NET_ERRORS = (ConnectionError, TimeoutError, asyncio.TimeoutError)
    _RENEW_ERRORS = (ConnectionError, TimeoutError, OSError, ResponseError, asyncio.TimeoutError)
    _CLUSTER_MODULE = "redis.asyncio.cluster"
    _run = staticmethod(run_async)
    _event = staticmethod(asyncio.Event)

    async def __aenter__(self) -> "Lock":
        return await self._run(self._enter())

    async def __aexit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc_value: Optional[BaseException],
        traceback: Optional[TracebackType],
    ) -> None:
        await self._run(self._exit())

    async def acquire(
        self,
        blocking: Optional[bool] = None,
        blocking_timeout: Optional[Number] = None,
        token: Optional[Any] = None,
        sleep: Optional[Number] = None,
    ) -> bool:
        return await self._run(self._acquire(blocking, blocking_timeout, token))

    async def locked(self) -> bool:
        return await self._run(self._locked())

    async def owned(self) -> bool:
        return await self._run(self._owned())

    async def release(self) -> None:
        await self._run(self._release())

    async def extend(self, additional_time: Number, replace_ttl: bool = False) -> bool:
        return await self._run(self._extend(additional_time, replace_ttl))

    async def reacquire(self) -> bool:
        return await self._run(self._reacquire())

    async def info(self) -> Optional[Dict[str, Any]]:
        return await self._run(self._info())

    async def wait_lost(self, timeout: Optional[Number] = None) -> Optional[str]:
        return await self._run(self._wait_lost(timeout))

    # ------------------------------------------------------------------ I/O

    @staticmethod
    async def _wait(event: asyncio.Event, seconds: Optional[float]) -> bool:
        try:
            await asyncio.wait_for(event.wait(), seconds)
            return True
        except asyncio.TimeoutError:
            return event.is_set()

    async def _refresh_cluster(self) -> None:
        await self.redis.initialize()

    async def _release_now(self, token: bytes) -> Any:
        return await asyncio.wait_for(
            self.redis.execute_command("LOCK.RELEASE", self.name, token),
            self.network_timeout,
        )

    async def _connection(self) -> Any:
        """A connection of our own to the lock's node, with no read timeout of its own
        (each read below has its limit)."""
        if self._is_cluster():
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
            # same connection (``_late_grant``), keep reading the acquire's reply.
            await conn.send_command("LOCK.RELEASE", self.name, token)
            done, _ = await asyncio.wait({reading}, timeout=self.network_timeout)
            late: Any = None
            released: Any = None
            if done:
                late = reading.exception() or reading.result()
                try:
                    released = await asyncio.wait_for(conn.read_response(), self.network_timeout)
                except asyncio.TimeoutError:
                    released = None
            return await self._run(self._late_grant(token, late, released))
        except (ConnectionError, OSError, asyncio.TimeoutError):
            await self._run(self._release_quietly(token))
            raise
        finally:
            if reading is not None and not reading.done():
                reading.cancel()
            await conn.disconnect()

    # ------------------------------------------------------------------ renewal

    def _start_renewal(self, hold: Hold) -> None:
        hold.renewal = asyncio.ensure_future(self._run(self._renewal(hold)))

    async def _renew_call(self, hold: Hold, args: list, limit: float) -> Any:
        return await asyncio.wait_for(self.redis.execute_command(*args), max(0.001, limit))

    async def _callback(self, reason: str) -> None:
        r = self.on_lost(self, reason)  # type: ignore[misc]
        if inspect.isawaitable(r):
            await r


def lock(redis: Any, name: Any, timeout: Optional[Number] = None, **kwargs: Any) -> Lock:
    return Lock(redis, name, timeout=timeout, **kwargs)


__all__ = ["Lock", "lock", "LockError", "LockNotOwnedError"]
