"""The asyncio twin of :mod:`redis_lock_module.session` (``redis.asyncio.Redis`` and
``redis.asyncio.cluster.RedisCluster``): the same semantics, every method that talks to
the server a coroutine, the keepalive an asyncio task."""

from __future__ import annotations

import asyncio
import inspect
from typing import Any, Awaitable, Callable, Dict, Optional, Union

from ._base import run_async
from ._common import Number
from .asyncio import Lock
from .session import _SessionBase

OnLost = Callable[["Session", str], Union[Any, Awaitable[Any]]]


class Session(_SessionBase):
    """See :class:`redis_lock_module.session.Session` (same options; ``on_lost`` may be
    a coroutine function, awaited in the keepalive task). ``async with`` closes it at the
    end, also when the block is cancelled."""

    _LOCK = Lock
    _LOCK_OPTIONS: Any = {}

    def __init__(self, redis: Any, ttl: Number = 30.0, **kwargs: Any) -> None:
        super().__init__(redis, ttl, **kwargs)
        self._mutex = asyncio.Lock()

    async def __aenter__(self) -> "Session":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    async def acquire(
        self,
        name: Any,
        *,
        blocking: bool = True,
        blocking_timeout: Optional[Number] = None,
        shared: bool = False,
        limit: Optional[int] = None,
        owner: Optional[str] = None,
        token: Optional[Any] = None,
    ) -> Optional[Lock]:
        """See :meth:`redis_lock_module.session.Session.acquire`. Cancelling the task
        that awaits it leaves the queue, as for :meth:`Lock.acquire`."""
        return await run_async(
            self._acquire(name, blocking, blocking_timeout, shared, limit, owner, token)
        )

    async def keepalive(self) -> bool:
        return await run_async(self._keepalive())

    async def close(self) -> int:
        return await run_async(self._close())

    async def wait_lost(self, timeout: Optional[Number] = None) -> Optional[str]:
        await self._probe._wait(self._lost, timeout)
        return self._lost_reason

    async def info(self) -> Dict[str, Optional[Dict[str, Any]]]:
        return await run_async(self._info())

    # ------------------------------------------------------------------ I/O

    async def _enter(self) -> None:
        await self._mutex.acquire()

    def _start_worker(self) -> None:
        self._worker = asyncio.ensure_future(run_async(self._keep()))

    async def _join(self) -> None:
        task = self._worker
        if task is None or task is asyncio.current_task():
            return
        await asyncio.wait({task})
        if not task.cancelled():
            task.exception()  # retrieved (the worker reports its own failures)

    async def _callback(self, reason: str) -> None:
        r = self.on_lost(self, reason)  # type: ignore[misc]
        if inspect.isawaitable(r):
            await r
