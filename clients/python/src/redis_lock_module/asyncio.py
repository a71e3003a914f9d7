"""The asyncio lock (redis.asyncio.Redis and redis.asyncio.cluster.RedisCluster), with
the API of ``redis.asyncio.lock.Lock``: the I/O of the logic in ``_base``, with tasks and
awaited reads."""

from __future__ import annotations

import asyncio
import inspect
from types import TracebackType
from typing import Any, Awaitable, Callable, Dict, Optional, Type, Union

from redis.exceptions import TimeoutError as RedisTimeoutError

from . import _errors
from ._base import Conn, Hold, LockBase, NoReply, run_async
from ._common import Number
from ._errors import (  # re-exported (`X as X`: explicit for mypy --strict)
    LockError as LockError,
    LockNotOwnedError as LockNotOwnedError,
    LockNotConfirmedError as LockNotConfirmedError,
    ModuleNotLoadedError as ModuleNotLoadedError,
    QuorumUnavailableError as QuorumUnavailableError,
    SessionLostError as SessionLostError,
)
from ._conns import NODES, Node

OnLost = Callable[["Lock", str], Union[Any, Awaitable[Any]]]


class Lock(LockBase):
    """The asyncio twin of :class:`redis_lock_module.Lock` (same options).

    ``Lock(r, "name", timeout=10)`` or ``r.lock("name", timeout=10, lock_class=Lock)``;
    every method that talks to the server is a coroutine, as in redis-py's asyncio lock.
    Tasks share a thread: like redis-py's asyncio lock, the token lives on the lock.
    """

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

    async def if_held(self, *args: Any) -> Any:
        """See :meth:`redis_lock_module.Lock.if_held`."""
        return await self._run(self._if_held(args))

    async def if_fence(self, fence: int, *args: Any) -> Any:
        """See :meth:`redis_lock_module.Lock.if_fence`."""
        return await self._run(self._if_fence(fence, args))

    async def check(self, fence: Optional[int] = None) -> bool:
        """See :meth:`redis_lock_module.Lock.check`."""
        return await self._run(self._check(fence))

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

    async def _node(self) -> Node:
        loop = asyncio.get_running_loop()
        if self._is_cluster():
            if getattr(self.redis, "_initialize", False):
                await self.redis.initialize()  # not connected yet: learn the slots
            node = self.redis.get_node_from_key(self.name)
            key: Any = (node.host, node.port, id(loop))

            def make() -> Any:
                return node.connection_class, dict(node.connection_kwargs)

        else:
            key = ("default", id(loop))

            def make() -> Any:
                pool = self.redis.connection_pool
                return pool.connection_class, dict(pool.connection_kwargs)

        n = NODES.node(self.redis, key, make)
        if getattr(n, "loop", None) is not loop:
            # Connections belong to one event loop; a new loop (with a reused id) starts
            # with none.
            n.idle.clear()
            n.loop = loop  # type: ignore[attr-defined]
        return n

    async def _open(self, node: Node) -> Conn:
        raw = node.take()
        if raw is not None:
            try:
                probe = getattr(raw, "can_read", None) or raw.can_read_destructive
                if not await probe():
                    conn = Conn(raw)
                    conn.reused = True  # type: ignore[attr-defined]
                    return conn
            except Exception:
                pass
            await _disconnect(raw)
        # No socket timeout: every read here has its own limit (asyncio.wait), and a
        # BLOCK may wait longer than any socket timeout.
        raw = node.new_connection(self.network_timeout, read_timeout=None)
        try:
            await asyncio.wait_for(raw.connect(), self.network_timeout)
        except asyncio.TimeoutError:
            await _disconnect(raw)
            raise RedisTimeoutError(
                f"connecting to {node.where}: no answer within {self.network_timeout:.3g} s"
            ) from None
        except BaseException:
            await _disconnect(raw)
            raise
        return Conn(raw)

    @staticmethod
    async def _close(node: Node, conn: Conn, reuse: bool) -> None:
        if reuse and conn.pending is None and node.give_back(conn.raw):
            return
        if conn.pending is not None:
            # A read nobody will take up: its outcome (the ConnectionError of the close
            # below, or a late reply) is dropped here, not reported by asyncio as an
            # exception never retrieved.
            conn.pending.add_done_callback(_drop_outcome)
            conn.pending.cancel()
            conn.pending = None
        await _disconnect(conn.raw)

    @staticmethod
    async def _send(conn: Conn, args: Any) -> None:
        await conn.raw.send_command(*args)

    @staticmethod
    async def _read(conn: Conn, seconds: Optional[float]) -> Any:
        # A read that timed out stays pending (never cancelled: a cancelled read can
        # leave half a reply in the buffer); the next read of this call takes it up.
        reading = conn.pending or asyncio.ensure_future(conn.raw.read_response())
        # Pending until it is done: a timeout or a cancellation (of a waiting acquire)
        # leaves it to the next read, or to _close.
        conn.pending = reading
        done, _ = await asyncio.wait({reading}, timeout=seconds)
        if not done:
            raise NoReply()
        conn.pending = None
        return reading.result()

    # ------------------------------------------------------------------ renewal

    def _start_renewal(self, hold: Hold) -> None:
        hold.renewal = asyncio.ensure_future(self._run(self._renewal(hold)))

    async def _callback(self, reason: str) -> None:
        r = self.on_lost(self, reason)  # type: ignore[misc]
        if inspect.isawaitable(r):
            await r


def _drop_outcome(read: "asyncio.Future[Any]") -> None:
    if not read.cancelled():
        read.exception()


async def _disconnect(raw: Any) -> None:
    try:
        await raw.disconnect()
    except Exception:  # closing a broken connection: nothing to report
        pass


def lock(redis: Any, name: Any, timeout: Optional[Number] = None, **kwargs: Any) -> Lock:
    return Lock(redis, name, timeout=timeout, **kwargs)


from ._common import Leader  # noqa: E402
from ._election_async import Election, Leadership  # noqa: E402
from ._session_async import Session  # noqa: E402

__all__ = ["Election", "Leader", "Leadership", "Lock", "Session", "lock"]
__all__ += _errors.__all__
