"""The asyncio twin of :mod:`redis_lock_module.election` (``redis.asyncio.Redis`` and
``redis.asyncio.cluster.RedisCluster``): the same semantics, every method that talks to
the server a coroutine, ``observe()`` an async generator."""

from __future__ import annotations

import asyncio
import time
from typing import Any, AsyncIterator, Awaitable, Callable, Optional, Union

from redis.exceptions import LockNotOwnedError, ResponseError

from ._base import NET_ERRORS, NoReply, logger
from ._common import (
    UNSEEN,
    Leader,
    Number,
    check_value,
    is_moved,
    is_transient_reply,
    is_unknown_lock_command,
    leader_of,
    module_missing,
    ms,
    new_token,
    parse_holder,
    watch_args,
)
from .asyncio import Lock
from .election import FIRST_BACKOFF, MAX_BACKOFF

OnLost = Callable[["Leadership", str], Union[Any, Awaitable[Any]]]


class Leadership:
    """See :class:`redis_lock_module.election.Leadership`; ``async with`` resigns at the
    end."""

    def __init__(self, key: Any, lock: Lock) -> None:
        self.key = key
        self.lock = lock
        self._term = lock.fence

    @property
    def term(self) -> int:
        return int(self._term or 0)

    @property
    def value(self) -> Any:
        return self.lock.owner

    @property
    def lost_reason(self) -> Optional[str]:
        return self.lock.lost_reason

    def is_leader(self) -> bool:
        hold = self.lock.local.hold
        return hold is not None and not hold.lost.is_set()

    async def wait_lost(self, timeout: Optional[Number] = None) -> Optional[str]:
        return await self.lock.wait_lost(timeout)

    async def proclaim(self, value: str) -> None:
        check_value(value)
        try:
            await self.lock._run(self.lock._relabel(value))
        except LockNotOwnedError:
            raise LockNotOwnedError(
                f"leadership of {self.key!r} lost; the value was not published"
            ) from None

    async def if_held(self, *args: Any) -> Any:
        return await self.lock.if_held(*args)

    async def resign(self) -> bool:
        if self.lock.local.hold is None:
            return False
        try:
            await self.lock.release()
            return True
        except LockNotOwnedError:
            return False

    async def __aenter__(self) -> "Leadership":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.resign()

    def __repr__(self) -> str:
        return f"Leadership(key={self.key!r}, value={self.value!r}, term={self.term})"


class Election:
    """See :class:`redis_lock_module.election.Election` (same options)."""

    def __init__(
        self,
        redis: Any,
        key: Any,
        *,
        ttl: Optional[Number] = None,
        network_timeout: Number = 2.0,
        confirm: bool = True,
        replicas: Optional[int] = None,
    ) -> None:
        self.redis = redis
        self.key = key
        self.ttl = ttl
        self.network_timeout = network_timeout
        self.confirm = confirm
        self.replicas = replicas
        self._probe = self._lock()

    def _lock(self, **kwargs: Any) -> Lock:
        return Lock(
            self.redis,
            self.key,
            timeout=self.ttl,
            network_timeout=self.network_timeout,
            confirm=self.confirm,
            replicas=self.replicas,
            **kwargs,
        )

    async def campaign(
        self,
        value: str,
        timeout: Optional[Number] = None,
        on_lost: Optional[OnLost] = None,
    ) -> Optional[Leadership]:
        """See :meth:`redis_lock_module.election.Election.campaign`. Cancelling the
        task that awaits it cancels the campaign (the candidate leaves the queue; a
        grant that raced the cancellation is given back)."""
        check_value(value)
        box: list = []

        def lost(_lock: Lock, reason: str) -> Any:
            if on_lost is not None and box:
                return on_lost(box[0], reason)
            logger.warning("leadership of %r lost: %s", self.key, reason)
            return None

        lock = self._lock(owner=value, auto_renew=True, on_lost=lost)
        token = new_token()
        try:
            won = await lock.acquire(blocking=True, blocking_timeout=timeout, token=token)
        except BaseException:
            # Cancelled (or failed) while waiting: its connection is closed; release a
            # grant that may have raced that, without letting a second cancellation
            # interrupt the release.
            release = asyncio.ensure_future(lock._run(lock._release_quietly(token)))
            try:
                await asyncio.shield(release)
            except BaseException:
                pass
            raise
        if not won:
            return None
        leadership = Leadership(self.key, lock)
        box.append(leadership)
        return leadership

    async def leader(self) -> Optional[Leader]:
        p = self._probe
        reply = await p._run(p._call("LOCK.INFO", self.key, "COUNT", 1))
        return leader_of(parse_holder(reply))

    def observe(self, block: Number = 10.0) -> AsyncIterator[Optional[Leader]]:
        """An async generator: see :meth:`redis_lock_module.election.Election.observe`.
        It ends when the caller stops: ``aclose()``, leaving an ``async for``, or
        cancelling the task that iterates it (its connection is closed)."""
        return _observe(self._lock(), float(block))

    def __repr__(self) -> str:
        return f"Election(key={self.key!r})"


async def _observe(lock: Lock, block: float) -> AsyncIterator[Optional[Leader]]:
    node: Any = None
    conn: Any = None
    last: Any = UNSEEN
    backoff = FIRST_BACKOFF
    block_ms = ms(block)

    async def drop() -> None:
        nonlocal conn
        if conn is not None:
            c, conn = conn, None
            await lock._close(node, c, False)

    async def pause() -> None:
        nonlocal backoff
        await asyncio.sleep(backoff)
        backoff = min(MAX_BACKOFF, backoff * 2)

    try:
        while True:
            args = watch_args(lock.name, last, block_ms)
            try:
                if conn is None:
                    node = await lock._node()
                    conn = await lock._open(node)
                started = time.monotonic()
                await lock._send(conn, args)
                reply = await lock._read(conn, block + lock.network_timeout)
            except NoReply:
                logger.debug("observe %r: no answer in time; reconnecting", lock.name)
                await drop()
                continue
            except ResponseError as e:
                await drop()
                if is_unknown_lock_command(e):
                    raise module_missing(node.where) from None
                if is_moved(e):
                    await lock._refresh_cluster()
                elif not is_transient_reply(e):
                    raise
                logger.debug("observe %r: %s; reading the state again", lock.name, e)
                await pause()
                continue
            except NET_ERRORS as e:
                await drop()
                logger.debug("observe %r: %s; reconnecting", lock.name, type(e).__name__)
                await pause()
                continue
            seen = parse_holder(reply)
            if last is UNSEEN or seen != last:
                last = seen
                backoff = FIRST_BACKOFF
                yield leader_of(seen)
            elif time.monotonic() - started < block / 2:
                await pause()
            else:
                backoff = FIRST_BACKOFF
    finally:
        await drop()
