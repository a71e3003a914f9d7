"""The asyncio twin of :mod:`redis_lock_module.election` (``redis.asyncio.Redis`` and
``redis.asyncio.cluster.RedisCluster``): the same semantics, every method that talks to
the server a coroutine, ``observe()`` an async generator."""

from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator, Awaitable, Callable, Optional, Union

from ._common import Leader, Number
from .asyncio import Lock
from .election import _ElectionBase, _LeadershipBase, _Watch

OnLost = Callable[["Leadership", str], Union[Any, Awaitable[Any]]]


class Leadership(_LeadershipBase):
    """See :class:`redis_lock_module.election.Leadership`; ``async with`` resigns at the
    end."""

    lock: Lock

    async def wait_lost(self, timeout: Optional[Number] = None) -> Optional[str]:
        return await self.lock.wait_lost(timeout)

    async def proclaim(self, value: str) -> None:
        await self.lock._run(self._proclaim(value))

    async def if_held(self, *args: Any) -> Any:
        return await self.lock.if_held(*args)

    async def resign(self) -> bool:
        return await self.lock._run(self._resign())

    async def __aenter__(self) -> "Leadership":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.resign()


class Election(_ElectionBase):
    """See :class:`redis_lock_module.election.Election` (same options)."""

    _LOCK = Lock
    _LEADERSHIP = Leadership
    _LOCK_OPTIONS: Any = {}

    async def campaign(
        self,
        value: str,
        timeout: Optional[Number] = None,
        on_lost: Optional[OnLost] = None,
    ) -> Optional[Leadership]:
        """See :meth:`redis_lock_module.election.Election.campaign`. Cancelling the
        task that awaits it cancels the campaign (the candidate leaves the queue; a
        grant that raced the cancellation is given back)."""
        return await self._probe._run(self._campaign(value, timeout, on_lost))

    @staticmethod
    async def _give_back(lock: Lock, token: bytes) -> None:
        # Cancelled (or failed) while waiting: its connection is closed; release a grant
        # that may have raced that, without letting a second cancellation interrupt the
        # release.
        release = asyncio.ensure_future(lock._run(lock._release_quietly(token)))
        try:
            await asyncio.shield(release)
        except BaseException:
            pass

    async def leader(self) -> Optional[Leader]:
        return await self._probe._run(self._leader())

    def observe(self, block: Number = 10.0) -> AsyncIterator[Optional[Leader]]:
        """An async generator: see :meth:`redis_lock_module.election.Election.observe`.
        It ends when the caller stops: ``aclose()``, leaving an ``async for``, or
        cancelling the task that iterates it (its connection is closed)."""
        return _observe(_Watch(self._lock(), float(block)))


async def _observe(watch: _Watch) -> AsyncIterator[Optional[Leader]]:
    run = watch.lock._run
    try:
        while True:
            got = await run(watch.round())
            if got is _Watch.PAUSE:
                await asyncio.sleep(watch.pause())
            elif got is not _Watch.AGAIN:
                yield got
    finally:
        await run(watch.drop())
