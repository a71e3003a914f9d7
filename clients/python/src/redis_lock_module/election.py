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

from ._base import NET_ERRORS, NoReply, Steps, logger
from ._common import (
    UNSEEN,
    Leader,
    Number,
    check_value,
    is_moved,
    is_transient_reply,
    leader_of,
    ms,
    new_token,
    parse_holder,
    raise_if_module_missing,
    watch_args,
)
from .lock import Lock

OnLost = Callable[["Leadership", str], Any]

FIRST_BACKOFF = 0.05
MAX_BACKOFF = 1.0


class _LeadershipBase:
    """What the sync and the asyncio Leadership share; the I/O is the lock's."""

    def __init__(self, key: Any, lock: Any) -> None:
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

    def _proclaim(self, value: str) -> Steps:
        check_value(value)
        try:
            yield from self.lock._relabel(value)
        except LockNotOwnedError:
            raise LockNotOwnedError(
                f"leadership of {self.key!r} lost; the value was not published"
            ) from None

    def _resign(self) -> Steps:
        if self.lock.local.hold is None:
            return False
        try:
            yield from self.lock._release()
            return True
        except LockNotOwnedError:
            return False

    def __repr__(self) -> str:
        return f"Leadership(key={self.key!r}, value={self.value!r}, term={self.term})"


class Leadership(_LeadershipBase):
    """A won election: the leader's lock, renewed in the background until it is resigned
    or lost. ``with election.campaign(v) as leadership:`` resigns at the end."""

    lock: Lock

    def wait_lost(self, timeout: Optional[Number] = None) -> Optional[str]:
        """Block until the leadership is lost (or ``timeout``); the reason or None."""
        return self.lock.wait_lost(timeout)

    def proclaim(self, value: str) -> None:
        """Publish ``value`` in place of the current one, keeping the term
        (``LOCK.EXTEND key token PX ttl OWNER value``); observers see the change.
        LockNotOwnedError when the leadership was lost (nothing is published)."""
        self.lock._run(self._proclaim(value))

    def if_held(self, *args: Any) -> Any:
        """A write guarded by the leadership: see :meth:`Lock.if_held`."""
        return self.lock.if_held(*args)

    def resign(self) -> bool:
        """Give the leadership up at once (LOCK.RELEASE): the server hands the lock to
        the next candidate in the same step. True if it was still held."""
        return self.lock._run(self._resign())

    def __enter__(self) -> "Leadership":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.resign()


class _ElectionBase:
    """What the sync and the asyncio Election share: the options, the candidate's lock,
    a campaign and a look at the leader as steps (run by the lock's ``_run``)."""

    _LOCK: Any = Lock
    _LEADERSHIP: Any = Leadership
    # The sync Lock keeps its token per thread by default; a leadership is not a thread's.
    _LOCK_OPTIONS: Any = {"thread_local": False}

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

    def _lock(self, **kwargs: Any) -> Any:
        return self._LOCK(
            self.redis,
            self.key,
            timeout=self.ttl,
            network_timeout=self.network_timeout,
            confirm=self.confirm,
            replicas=self.replicas,
            **self._LOCK_OPTIONS,
            **kwargs,
        )

    def _campaign(self, value: str, timeout: Optional[Number], on_lost: Any) -> Steps:
        check_value(value)
        box: list = []

        def lost(_lock: Any, reason: str) -> Any:
            if on_lost is not None and box:
                return on_lost(box[0], reason)
            logger.warning("leadership of %r lost: %s", self.key, reason)
            return None

        lock = self._lock(owner=value, auto_renew=True, on_lost=lost)
        token = new_token()
        try:
            won = yield from lock._acquire(True, timeout, token)
        except BaseException:
            yield (self._give_back, lock, token)
            raise
        if not won:
            return None
        leadership = self._LEADERSHIP(self.key, lock)
        box.append(leadership)
        return leadership

    @staticmethod
    def _give_back(lock: Lock, token: bytes) -> None:
        lock._run(lock._release_quietly(token))

    def _leader(self) -> Steps:
        reply = yield from self._probe._call("LOCK.INFO", self.key, "COUNT", 1)
        return leader_of(parse_holder(reply))

    def __repr__(self) -> str:
        return f"Election(key={self.key!r})"


class Election(_ElectionBase):
    """The election of one key on one server (or a Redis Cluster).

    ``ttl``: the leader's lease in seconds, renewed every third of it (default None:
    the server's ``lock.default-ttl``, 30 s, as for :class:`Lock`); it is also how long
    a crashed leader keeps the others waiting. ``network_timeout``, ``confirm`` and
    ``replicas`` as for :class:`Lock`.
    """

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
        return self._probe._run(self._campaign(value, timeout, on_lost))

    def leader(self) -> Optional[Leader]:
        """Who leads now, ``Leader(value, term)``, or None. One round trip: ``LOCK.INFO
        key COUNT 1`` (which answers at once whether or not the key is held)."""
        return self._probe._run(self._leader())

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
        return _observe(_Watch(self._lock(), float(block)), stop)


class _Watch:
    """An observer's connection and what it saw last; ``round()`` is one LOCK.WATCH (or
    the first LOCK.INFO) as steps, ``drop()`` closes the connection."""

    AGAIN: Any = object()  # ask again at once
    PAUSE: Any = object()  # ask again after ``pause()`` seconds

    def __init__(self, lock: Any, block: float) -> None:
        self.lock = lock
        self.block = block
        self.block_ms = ms(block)
        self.node: Any = None
        self.conn: Any = None
        self.last: Any = UNSEEN
        self.backoff = FIRST_BACKOFF

    def pause(self) -> float:
        seconds, self.backoff = self.backoff, min(MAX_BACKOFF, self.backoff * 2)
        return seconds

    def drop(self) -> Steps:
        if self.conn is not None:
            conn, self.conn = self.conn, None
            yield (self.lock._close, self.node, conn, False)

    def round(self) -> Steps:
        """The new leader (or None: nobody leads) when it changed, else AGAIN or PAUSE."""
        lock = self.lock
        args = watch_args(lock.name, self.last, self.block_ms)
        try:
            if self.conn is None:
                self.node = yield (lock._node,)
                self.conn = yield (lock._open, self.node)
            started = time.monotonic()
            yield (lock._send, self.conn, args)
            reply = yield (lock._read, self.conn, self.block + lock.network_timeout)
        except NoReply:
            logger.debug("observe %r: no answer in time; reconnecting", lock.name)
            yield from self.drop()
            return self.AGAIN
        except ResponseError as e:
            yield from self.drop()
            raise_if_module_missing(e, self.node.where)
            if is_moved(e):
                yield (lock._refresh_cluster,)
            elif not is_transient_reply(e):
                raise
            logger.debug("observe %r: %s; reading the state again", lock.name, e)
            return self.PAUSE
        except NET_ERRORS as e:
            yield from self.drop()
            logger.debug("observe %r: %s; reconnecting", lock.name, type(e).__name__)
            return self.PAUSE
        seen = parse_holder(reply)
        if self.last is UNSEEN or seen != self.last:
            self.last = seen
            self.backoff = FIRST_BACKOFF
            return leader_of(seen)
        if time.monotonic() - started < self.block / 2:
            return self.PAUSE  # answered early with nothing new: do not spin
        self.backoff = FIRST_BACKOFF
        return self.AGAIN


def _observe(watch: _Watch, stop: Optional[threading.Event]) -> Iterator[Optional[Leader]]:
    run = watch.lock._run
    try:
        while stop is None or not stop.is_set():
            got = run(watch.round())
            if got is _Watch.PAUSE:
                if stop is not None:
                    stop.wait(watch.pause())
                else:
                    time.sleep(watch.pause())
            elif got is not _Watch.AGAIN:
                yield got
    finally:
        run(watch.drop())
