"""Leader election on a lock, with the semantics of etcd's election API (Campaign,
Proclaim, Resign, Leader, Observe), for ``redis.Redis`` and ``redis.cluster.RedisCluster``.

::

    election = Election(r, "election:scheduler", ttl=10)
    leadership = election.campaign("node-a:8080")     # waits in the FIFO queue
    print("leading in term", leadership.term)
    leadership.if_held("SET", "scheduler:config", "...")   # a write guarded by it
    leadership.resign()                                # the next candidate leads at once

    for leader in election.observe():                  # elsewhere: every change
        print(leader)                                  # Leader(value, term) or None

A leader learns that its lease ended only when a renewal fails or is refused: guard its
writes to Redis with ``if_held`` and pass ``term`` as a fence to other stores.
docs/election.md in the repository has the whole story.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Iterator, Optional

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
from .lock import Lock

OnLost = Callable[["Leadership", str], Any]

FIRST_BACKOFF = 0.05
MAX_BACKOFF = 1.0


class Leadership:
    """A won election: the leader's lock, renewed in the background until it is resigned
    or lost. ``with election.campaign(v) as leadership:`` resigns at the end."""

    def __init__(self, key: Any, lock: Lock) -> None:
        self.key = key
        self.lock = lock
        self._term = lock.fence

    @property
    def term(self) -> int:
        """The fence of the leader's grant (terms strictly increase)."""
        return int(self._term or 0)

    @property
    def value(self) -> Any:
        """The value published now: the campaign's, or the last one proclaimed."""
        return self.lock.owner

    @property
    def lost_reason(self) -> Optional[str]:
        """Why the leadership was lost (``not-held``, ``failed``, ``expired``), None
        while it holds."""
        return self.lock.lost_reason

    def is_leader(self) -> bool:
        """True until the leadership is resigned or known to be lost."""
        hold = self.lock.local.hold
        return hold is not None and not hold.lost.is_set()

    def wait_lost(self, timeout: Optional[Number] = None) -> Optional[str]:
        """Block until the leadership is lost (or ``timeout``); the reason or None."""
        return self.lock.wait_lost(timeout)

    def proclaim(self, value: str) -> None:
        """Publish ``value`` in place of the current one, keeping the term
        (``LOCK.EXTEND key token PX ttl OWNER value``); observers see the change.
        LockNotOwnedError when the leadership was lost (nothing is published)."""
        check_value(value)
        try:
            self.lock._run(self.lock._relabel(value))
        except LockNotOwnedError:
            raise LockNotOwnedError(
                f"leadership of {self.key!r} lost; the value was not published"
            ) from None

    def if_held(self, *args: Any) -> Any:
        """A write guarded by the leadership: see :meth:`Lock.if_held`."""
        return self.lock.if_held(*args)

    def resign(self) -> bool:
        """Give the leadership up at once (LOCK.RELEASE): the server hands the lock to
        the next candidate in the same step. True if it was still held."""
        if self.lock.local.hold is None:
            return False
        try:
            self.lock.release()
            return True
        except LockNotOwnedError:
            return False

    def __enter__(self) -> "Leadership":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.resign()

    def __repr__(self) -> str:
        return f"Leadership(key={self.key!r}, value={self.value!r}, term={self.term})"


class Election:
    """The election of one key on one server (or a Redis Cluster).

    ``ttl``: the leader's lease in seconds, renewed every third of it (default None:
    the server's ``lock.default-ttl``, 30 s, as for :class:`Lock`); it is also how long
    a crashed leader keeps the others waiting. ``network_timeout``, ``confirm`` and
    ``replicas`` as for :class:`Lock`.
    """

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
            thread_local=False,
            network_timeout=self.network_timeout,
            confirm=self.confirm,
            replicas=self.replicas,
            **kwargs,
        )

    def campaign(
        self,
        value: str,
        timeout: Optional[Number] = None,
        on_lost: Optional[OnLost] = None,
    ) -> Optional[Leadership]:
        """Wait in the key's FIFO queue until elected (``LOCK.ACQUIRE key BLOCK ...
        OWNER value``), then return the :class:`Leadership`; None when ``timeout``
        seconds passed first (None: no limit). Candidates are elected in the order they
        started campaigning. ``on_lost(leadership, reason)`` is called if the
        leadership is lost. An interrupted campaign (KeyboardInterrupt, an error) leaves
        the queue and gives back a grant that raced it."""
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
            won = lock.acquire(blocking=True, blocking_timeout=timeout, token=token)
        except BaseException:
            lock._run(lock._release_quietly(token))
            raise
        if not won:
            return None
        leadership = Leadership(self.key, lock)
        box.append(leadership)
        return leadership

    def leader(self) -> Optional[Leader]:
        """Who leads now, ``Leader(value, term)``, or None. One round trip: ``LOCK.INFO
        key COUNT 1`` (which answers at once whether or not the key is held)."""
        p = self._probe
        return leader_of(parse_holder(p._run(p._call("LOCK.INFO", self.key, "COUNT", 1))))

    def observe(
        self, block: Number = 10.0, stop: Optional[threading.Event] = None
    ) -> Iterator[Optional[Leader]]:
        """A generator of who leads: first who leads now, then every change (a new
        leader, a new value proclaimed, nobody leading: None), each from one
        ``LOCK.WATCH`` that waits on the server (no polling) on a connection of its own.
        ``block``: the longest one LOCK.WATCH waits before it answers anyway (it also
        bounds how long a dead connection goes unnoticed). It survives time-outs,
        reconnects, TRYAGAIN and LOCKMOVED (it reads the state again). It ends when the
        caller closes it (``close()``, leaving a ``for`` loop, garbage collection), or
        within ``block`` once ``stop`` is set. Changes closer together than a round trip
        may be seen as one; the latest state is always seen."""
        return _observe(self._lock(), float(block), stop)

    def __repr__(self) -> str:
        return f"Election(key={self.key!r})"


def _observe(
    lock: Lock, block: float, stop: Optional[threading.Event]
) -> Iterator[Optional[Leader]]:
    node: Any = None
    conn: Any = None
    last: Any = UNSEEN
    backoff = FIRST_BACKOFF
    block_ms = ms(block)

    def drop() -> None:
        nonlocal conn
        if conn is not None:
            lock._close(node, conn, False)
            conn = None

    def pause() -> None:
        nonlocal backoff
        if stop is not None:
            stop.wait(backoff)
        else:
            time.sleep(backoff)
        backoff = min(MAX_BACKOFF, backoff * 2)

    try:
        while stop is None or not stop.is_set():
            args = watch_args(lock.name, last, block_ms)
            try:
                if conn is None:
                    node = lock._node()
                    conn = lock._open(node)
                started = time.monotonic()
                lock._send(conn, args)
                reply = lock._read(conn, block + lock.network_timeout)
            except NoReply:
                logger.debug("observe %r: no answer in time; reconnecting", lock.name)
                drop()
                continue
            except ResponseError as e:
                drop()
                if is_unknown_lock_command(e):
                    raise module_missing(node.where) from None
                if is_moved(e):
                    lock._refresh_cluster()
                elif not is_transient_reply(e):
                    raise
                logger.debug("observe %r: %s; reading the state again", lock.name, e)
                pause()
                continue
            except NET_ERRORS as e:
                drop()
                logger.debug("observe %r: %s; reconnecting", lock.name, type(e).__name__)
                pause()
                continue
            seen = parse_holder(reply)
            if last is UNSEEN or seen != last:
                last = seen
                backoff = FIRST_BACKOFF
                yield leader_of(seen)
            elif time.monotonic() - started < block / 2:
                # Answered early with nothing new: do not spin.
                pause()
            else:
                backoff = FIRST_BACKOFF
    finally:
        drop()
