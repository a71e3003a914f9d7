"""Redlock: a lock held on a majority of N independent servers, with quorum fencing,
the semantics of the Rust client (client/src/redlock.rs):

1. send ``LOCK.ACQUIRE key PX ttl TOKEN t`` to every node at once, each within a node
   limit (a tenth of the TTL, 50 ms to 1 s);
2. the attempt holds if a majority (N/2+1) granted and the validity
   ``ttl - elapsed - drift`` (drift = 1 % of the TTL + 2 ms) is still positive;
3. quorum fencing: F = the highest fence among the grants. Every granting node whose
   fence is lower gets ``LOCK.ACQUIRE ... MINFENCE F``, an idempotent renew that keeps
   that node's fence but raises its counter to >= F; the lock counts only if a majority
   is then known to have a counter >= F, still within the validity. Its fence is F, and
   any later quorum fence is larger (two majorities share a node);
4. otherwise release on every node (those that timed out too) and, while the wait
   lasts, retry after a random pause. If fewer than a majority of the nodes answered at
   all (errors: down, timed out, a wrong password), the last attempt's outcome is
   :class:`QuorumUnavailableError`, not the None of a lock held elsewhere.

Exclusive and shared locks work over a quorum; counted ones (``limit=``) are refused:
each node grants its own n permits and a holder needs only a majority of nodes, so up
to ``floor(n*N / (N/2+1))`` holders could hold it at once. An error that retrying
cannot fix (WRONGMODE, LIMITMISMATCH, a node without the module) ends the acquisition
with that error, after releasing on every node. Redlock nodes are independent servers:
grants are not confirmed on replicas (``WAIT``), and there is no auto-renewal here:
``extend()`` before the validity ends.
"""

from __future__ import annotations

import random
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, List, Optional, Sequence, Tuple

from redis.exceptions import ResponseError

from ._common import (
    ModuleNotLoadedError,
    Number,
    QuorumUnavailableError,
    acquire_args,
    ms,
    new_token,
    parse_grant,
)
from .lock import Lock

__all__ = ["Redlock", "RedlockGrant", "drift"]

# Errors from a node that retrying cannot fix.
USAGE_CODES = ("WRONGMODE", "LIMITMISMATCH", "WRONGTYPE")


def drift(ttl: float) -> float:
    """The Redlock clock-drift allowance: 1 % of the TTL plus 2 ms (seconds)."""
    return ttl / 100 + 0.002


def _is_usage(e: BaseException) -> bool:
    return isinstance(e, ModuleNotLoadedError) or (
        isinstance(e, ResponseError) and str(e).startswith(USAGE_CODES)
    )


def where(client: Any) -> str:
    """host:port of a redis-py client (never its credentials)."""
    kw = getattr(getattr(client, "connection_pool", None), "connection_kwargs", {}) or {}
    if "path" in kw and "host" not in kw:
        return str(kw["path"])
    return f"{kw.get('host', 'localhost')}:{kw.get('port', 6379)}"


def _why(e: BaseException) -> str:
    """The class of a node's error, with the code of an error reply (the reply's text
    may echo arguments: a token)."""
    name = type(e).__name__
    if isinstance(e, ResponseError) and not isinstance(e, ModuleNotLoadedError):
        code = str(e).split(" ", 1)[0]
        if code.isupper() and code.isalpha():
            return f"{name} {code}"
    return name


class RedlockGrant:
    """A lock held on a majority: its token, the quorum fence, and until when it holds
    (this client's conservative view, time.monotonic())."""

    def __init__(self, rl: "Redlock", name: Any, token: bytes, fence: int, valid_until: float):
        self.redlock = rl
        self.name = name
        self.token = token
        self.fence = fence
        self.valid_until = valid_until

    @property
    def validity(self) -> float:
        """Seconds the grant still holds (0 once over)."""
        return max(0.0, self.valid_until - time.monotonic())

    def extend(self, ttl: Number) -> bool:
        """LOCK.EXTEND on every node; True when a majority confirmed within the new
        validity (which then replaces the old one)."""
        until = self.redlock._extend(self.name, self.token, float(ttl))
        if until is None:
            return False
        self.valid_until = until
        return True

    def release(self) -> bool:
        """LOCK.RELEASE on every node; True when a majority still held it."""
        return self.redlock.release(self.name, self.token) >= self.redlock.quorum

    def __enter__(self) -> "RedlockGrant":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()


class Redlock:
    """Redlock over independent servers: ``Redlock([redis.Redis(...), ...])``.

    ``acquire(name, ttl, wait=None, shared=False, owner=None, token=None)`` returns a
    :class:`RedlockGrant` (with the quorum ``fence``) or None when no majority granted
    within ``wait`` seconds (None: one attempt): the lock is held elsewhere. When fewer
    than a majority of the nodes answered at all, it raises
    :class:`QuorumUnavailableError` instead.
    """

    def __init__(
        self,
        clients: Sequence[Any],
        *,
        node_timeout: Optional[Number] = None,
        retry_delay: Number = 0.15,
        retry_jitter: Number = 0.1,
    ) -> None:
        if not clients:
            raise ValueError("Redlock needs at least one node")
        self.clients = list(clients)
        self.node_timeout = node_timeout
        self.retry_delay = float(retry_delay)
        self.retry_jitter = float(retry_jitter)
        self._pool = ThreadPoolExecutor(max_workers=len(self.clients), thread_name_prefix="redlock")

    @property
    def quorum(self) -> int:
        return len(self.clients) // 2 + 1

    def _limit(self, ttl: float) -> float:
        if self.node_timeout is not None:
            return float(self.node_timeout)
        return min(1.0, max(0.05, ttl / 10))

    def _each(
        self, name: Any, args: List[Any], limit: float, clients: Optional[List[Any]] = None
    ) -> List[Tuple[bool, Any]]:
        """`args` on every node (of `clients`) at once, each within `limit`: (ok, reply
        or error)."""

        def one(client: Any) -> Tuple[bool, Any]:
            node = Lock(client, name, network_timeout=max(0.001, limit), confirm=False)
            try:
                return True, node._run(node._call(*args, limit=limit))
            except Exception as e:  # reported per node; the quorum decides
                return False, e

        return list(self._pool.map(one, self.clients if clients is None else clients))

    def release(self, name: Any, token: Any) -> int:
        """LOCK.RELEASE on every node; how many released a lock held by `token`."""
        tok = token if isinstance(token, bytes) else str(token).encode()
        limit = self.node_timeout if self.node_timeout is not None else 0.25
        return sum(
            1 for ok, r in self._each(name, ["LOCK.RELEASE", name, tok], float(limit)) if ok and r == 1
        )

    def _extend(self, name: Any, token: bytes, ttl: float) -> Optional[float]:
        start = time.monotonic()
        valid_until = start + ttl - drift(ttl)
        limit = min(self._limit(ttl), max(0.001, valid_until - start))
        got = self._each(name, ["LOCK.EXTEND", name, token, "PX", ms(ttl)], limit)
        held = sum(1 for ok, r in got if ok and r == 1)
        if held >= self.quorum and time.monotonic() < valid_until:
            return valid_until
        return None

    def acquire(
        self,
        name: Any,
        ttl: Number,
        *,
        wait: Optional[Number] = None,
        shared: bool = False,
        limit: Optional[int] = None,
        owner: Optional[str] = None,
        token: Optional[Any] = None,
    ) -> Optional[RedlockGrant]:
        ttl = float(ttl)
        if ttl <= 0:
            raise ValueError("ttl must be positive")
        if limit is not None:
            n = len(self.clients)
            raise ValueError(
                f"Redlock cannot hold a counted lock (limit={limit}): each node grants its own "
                f"{limit} permits and a holder needs only a majority of nodes, so up to "
                f"{limit * n // self.quorum} holders could hold it at once on these {n} nodes; "
                "use a counted lock on one server"
            )
        tok = new_token() if token is None else (token if isinstance(token, bytes) else str(token).encode())
        wait_end = None if wait is None else time.monotonic() + float(wait)
        while True:
            unavailable: Optional[QuorumUnavailableError] = None
            try:
                grant = self._attempt(name, tok, ttl, shared, owner)
            except QuorumUnavailableError as e:
                grant, unavailable = None, e
            if grant is not None:
                return grant
            pause = max(0.0, self.retry_delay + random.uniform(-self.retry_jitter, self.retry_jitter))
            if wait_end is None or time.monotonic() + pause >= wait_end:
                if unavailable is not None:
                    raise unavailable
                return None
            time.sleep(pause)

    def _attempt(
        self, name: Any, token: bytes, ttl: float, shared: bool, owner: Optional[str]
    ) -> Optional[RedlockGrant]:
        start = time.monotonic()
        valid_until = start + ttl - drift(ttl)

        def left() -> float:
            return valid_until - time.monotonic()

        args = acquire_args(name, token, ttl, owner, shared, None, None)
        results = self._each(name, args, min(self._limit(ttl), max(0.001, left())))
        granted: List[Tuple[int, int]] = []
        usage: Optional[BaseException] = None
        for i, (ok, r) in enumerate(results):
            if ok:
                fence = parse_grant(r, token)
                if fence is not None:
                    granted.append((i, fence))
            elif _is_usage(r) and usage is None:
                usage = r
        if usage is not None:
            self.release(name, token)
            raise usage
        failed = [(where(self.clients[i]), r) for i, (ok, r) in enumerate(results) if not ok]
        answered = len(results) - len(failed)
        if answered < self.quorum:
            self.release(name, token)
            why = ", ".join(f"{w}: {_why(e)}" for w, e in failed)
            raise QuorumUnavailableError(
                f"Redlock {name!r}: {answered} of {len(results)} nodes answered, a majority "
                f"is {self.quorum}; not acquired ({why})",
                answered,
                self.quorum,
                failed,
            )
        if len(granted) < self.quorum or left() <= 0:
            self.release(name, token)
            return None
        # Round 2, quorum fencing: lift every lower node's counter to the top fence.
        top = max(f for _, f in granted)
        confirmed = sum(1 for _, f in granted if f == top)
        lift = [i for i, f in granted if f < top]
        if lift:
            node_lease = start + ttl - time.monotonic()
            if node_lease < 0.001 or left() <= 0:
                self.release(name, token)
                return None
            renew = acquire_args(name, token, node_lease, owner, shared, None, None) + ["MINFENCE", top]
            limit = min(self._limit(ttl), max(0.001, left()))
            subset = [self.clients[i] for i in lift]
            confirmed += sum(
                1
                for ok, r in self._each(name, renew, limit, subset)
                if ok and parse_grant(r, token) is not None
            )
        if confirmed < self.quorum or left() <= 0:
            self.release(name, token)
            return None
        return RedlockGrant(self, name, token, top, valid_until)

    def close(self) -> None:
        self._pool.shutdown(wait=False)

