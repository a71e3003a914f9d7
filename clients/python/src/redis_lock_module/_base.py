"""The lock's logic, written once for the sync and the asyncio lock.

Every operation here is a generator of steps. It yields ``(function, *args)`` for each
call that does I/O (a command, a wait, a callback) and is sent back the result, or has
the exception thrown in. :class:`redis_lock_module.Lock` runs the steps with plain calls
(:func:`run_sync`), :class:`redis_lock_module.asyncio.Lock` awaits each one
(:func:`run_async`); what differs between the two (threads or tasks, how a connection
of the lock's own is opened and read) is all that those files keep.
"""

from __future__ import annotations

import importlib
import logging
import time
from types import SimpleNamespace
from typing import Any, Callable, Generator, Optional, Tuple

from redis.exceptions import LockError, LockNotOwnedError, ResponseError, TimeoutError

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

Step = Tuple[Any, ...]
Steps = Generator[Step, Any, Any]


class _Run:
    """One operation's steps: ``next()`` is the next step, or None once the operation
    has returned (its value in ``result``); set ``reply`` or ``error`` in between."""

    def __init__(self, steps: Steps) -> None:
        self.steps = steps
        self.reply: Any = None
        self.error: Optional[BaseException] = None
        self.result: Any = None

    def next(self) -> Optional[Step]:
        error, self.error = self.error, None
        try:
            if error is not None:
                return self.steps.throw(error)
            return self.steps.send(self.reply)
        except StopIteration as done:
            self.result = done.value
            return None


def run_sync(steps: Steps) -> Any:
    run = _Run(steps)
    while (step := run.next()) is not None:
        try:
            run.reply = step[0](*step[1:])
        except Exception as e:
            run.error = e
    return run.result


async def run_async(steps: Steps) -> Any:
    run = _Run(steps)
    while (step := run.next()) is not None:
        try:
            run.reply = await step[0](*step[1:])
        except Exception as e:
            run.error = e
    return run.result


def is_cluster(client: Any, module: str) -> bool:
    """True when `client` is the `RedisCluster` of `module` (redis-py may lack it)."""
    try:
        cls = importlib.import_module(module).RedisCluster
    except (ImportError, AttributeError):  # pragma: no cover - redis-py without cluster
        return False
    return isinstance(client, cls)


class Hold:
    """One grant: its token, fence, and the renewal that keeps it (a thread or a task)."""

    def __init__(self, token: bytes, fence: int, granted_at: float, event: Callable[[], Any]):
        self.token = token
        self.fence = fence
        # Where the client counts the lease from: the send time of a non-blocking
        # acquire (never after the server's grant), the reply time of a blocking one.
        self.granted_at = granted_at
        self.stop = event()
        self.lost = event()
        self.lost_reason: Optional[str] = None
        self.renewal: Any = None  # the thread or task that renews
        self.conn: Any = None  # the renewal's own connection, where it has one


class LockBase:
    """What the sync and the asyncio lock share; the subclasses supply the I/O:

    - ``_run(steps)``: run an operation's steps (plain calls, or awaited);
    - ``_event()``: a new event (threading or asyncio);
    - ``_wait(event, seconds)``: wait for it, True when set;
    - ``_acquire_blocking_once(token, block_ms)``: LOCK.ACQUIRE ... BLOCK on a connection
      of the lock's own, the fence or None;
    - ``_refresh_cluster()``: learn the slots again after a redirection;
    - ``_release_now(token)``: LOCK.RELEASE for a failed acquire;
    - ``_start_renewal(hold)``: run ``_renewal(hold)`` in the background;
    - ``_renew_call(hold, args, limit)``: a renewal's command, within `limit` seconds;
    - ``_callback(reason)``: call ``on_lost``;
    - ``_NET_ERRORS``: what a failed non-blocking acquire releases its token after;
    - ``_RENEW_ERRORS``: what a renewal retries after;
    - ``_CLUSTER_MODULE``: where the client's ``RedisCluster`` class is.
    """

    _NET_ERRORS: Tuple[type, ...] = ()
    _RENEW_ERRORS: Tuple[type, ...] = ()
    _CLUSTER_MODULE = ""

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
        on_lost: Optional[Callable[..., Any]] = None,
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
        self.local: Any = self._new_local()

    def _new_local(self) -> Any:
        return SimpleNamespace(token=None, hold=None)

    # ------------------------------------------------------------------ state

    @property
    def token(self) -> Optional[bytes]:
        """The token of the current grant (None when not held here)."""
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

    def _command(self, *args: Any) -> Step:
        return (self.redis.execute_command, *args)

    def _held(self, verb: str) -> Hold:
        hold = self.local.hold
        if hold is None:
            raise LockError(f"Cannot {verb} an unlocked lock", lock_name=self.name)
        return hold

    def _not_owned(self, verb: str) -> LockNotOwnedError:
        return LockNotOwnedError(
            f"Cannot {verb} a lock that's no longer owned", lock_name=self.name
        )

    # ------------------------------------------------------------------ redis-py API

    def _enter(self) -> Steps:
        if (yield (self.acquire,)):
            return self
        raise LockError("Unable to acquire lock within the time specified", lock_name=self.name)

    def _exit(self) -> Steps:
        try:
            yield (self.release,)
        except LockError:
            if self.raise_on_release_error:
                raise
            logger.warning("Lock was unlocked or no longer owned when exiting context manager.")

    def _acquire(
        self, blocking: Optional[bool], blocking_timeout: Optional[Number], token: Optional[Any]
    ) -> Steps:
        if blocking is None:
            blocking = self.blocking
        if blocking_timeout is None:
            blocking_timeout = self.blocking_timeout
        tok = new_token() if token is None else self.redis.get_encoder().encode(token)
        sent = time.monotonic()
        if not blocking or (blocking_timeout is not None and blocking_timeout <= 0):
            fence = yield from self._acquire_now(tok)
        else:
            block_ms = 0 if blocking_timeout is None else ms(blocking_timeout)
            fence = yield from self._acquire_blocking(tok, block_ms)
            # When in the wait the grant happened is unknown: count from the reply.
            sent = time.monotonic()
        if fence is None:
            return False
        hold = Hold(tok, fence, sent, self._event)
        self.local.token = tok
        self.local.hold = hold
        if self.auto_renew:
            self._start_renewal(hold)
        return True

    def _locked(self) -> Steps:
        return bool((yield self._command("EXISTS", self.name)))

    def _owned(self) -> Steps:
        hold = self.local.hold
        if hold is None:
            return False
        return holder_ttl((yield from self._info()), hold.fence) is not None

    def _release(self) -> Steps:
        hold = self.local.hold
        if hold is None:
            raise LockError(
                "Cannot release a lock that's not owned or is already unlocked.",
                lock_name=self.name,
            )
        hold.stop.set()
        self.local.token = None
        self.local.hold = None
        if not (yield self._command("LOCK.RELEASE", self.name, hold.token)):
            raise self._not_owned("release")

    def _extend(self, additional_time: Number, replace_ttl: bool) -> Steps:
        hold = self._held("extend")
        if replace_ttl:
            px = ms(additional_time)
        else:
            left = holder_ttl((yield from self._info()), hold.fence)
            if left is None:
                raise self._not_owned("extend")
            px = max(1, left) + ms(additional_time)
        if not (yield self._command("LOCK.EXTEND", self.name, hold.token, "PX", px)):
            raise self._not_owned("extend")
        return True

    def _reacquire(self) -> Steps:
        hold = self._held("reacquire")
        args: list = ["LOCK.EXTEND", self.name, hold.token]
        if self.timeout is not None:
            args += ["PX", ms(self.timeout)]
        if not (yield self._command(*args)):
            raise self._not_owned("reacquire")
        return True

    def _info(self) -> Steps:
        return parse_info((yield self._command("LOCK.INFO", self.name)))

    def _wait_lost(self, timeout: Optional[Number]) -> Steps:
        hold = self.local.hold
        if hold is None:
            return None
        yield (self._wait, hold.lost, timeout)
        return hold.lost_reason

    # ------------------------------------------------------------------ acquiring

    def _args(self, token: bytes, block_ms: Optional[int]) -> list:
        return acquire_args(
            self.name, token, self.timeout, self.owner, self.shared, self.limit, block_ms
        )

    def _is_cluster(self) -> bool:
        return is_cluster(self.redis, self._CLUSTER_MODULE)

    def _acquire_now(self, token: bytes) -> Steps:
        # redis-py may retry this after a timeout: with our TOKEN a retry is a renew.
        try:
            reply = yield self._command(*self._args(token, None))
        except self._NET_ERRORS:
            yield from self._release_quietly(token)
            raise
        return parse_grant(reply, token)

    def _acquire_blocking(self, token: bytes, block_ms: int) -> Steps:
        for attempt in range(2):
            try:
                return (yield (self._acquire_blocking_once, token, block_ms))
            except ResponseError as e:
                if attempt == 0 and self._is_cluster() and is_moved(e):
                    yield (self._refresh_cluster,)
                    continue
                raise
        return None  # pragma: no cover - the loop returns or raises

    def _late_grant(self, token: bytes, late: Any, released: Any) -> Steps:
        """After a waiting acquire had no reply in time, LOCK.RELEASE was queued behind
        it on the same connection (the server runs it right after the wait ends, so a
        grant made after we gave up is given back at once instead of sitting with nobody
        listening until its lease ends). `late` and `released` are the two replies, None
        where none came."""
        if released is None:
            yield from self._release_quietly(token)
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

    def _release_quietly(self, token: bytes) -> Steps:
        try:
            yield (self._release_now, token)
        except Exception as e:  # best effort: the lease ends by itself anyway
            logger.warning("LOCK.RELEASE %r after a failed acquire failed: %s", self.name, e)

    # ------------------------------------------------------------------ renewal

    def _renewal(self, hold: Hold) -> Steps:
        """Keeps `hold` with LOCK.EXTEND every third of the lease until released, lost or
        capped by ``max_hold``."""
        started = hold.granted_at
        cap_at = started + self.max_hold if self.max_hold is not None else None
        try:
            if self.timeout is not None:
                ttl = float(self.timeout)
            else:
                pttl = yield (self._renew_call, hold, ["PTTL", self.name], self.network_timeout)
                ttl = max(0.003, int(pttl) / 1000)
            deadline = started + ttl - ttl / 100  # the client's conservative view
            interval = ttl / 3
            while True:
                if (yield from self._sleep(hold, min(interval, deadline - time.monotonic()))):
                    return
                now = time.monotonic()
                if now >= deadline:
                    yield from self._lost(hold, LOST_EXPIRED)
                    return
                ask = ttl if cap_at is None else min(ttl, cap_at - now)
                if ask < 0.001:
                    # The cap: no more renewals; the lease runs out on the server.
                    if not (yield from self._sleep(hold, deadline - now)):
                        yield from self._lost(hold, LOST_CAP)
                    return
                sent = time.monotonic()
                n = None
                for attempt in range(2):
                    try:
                        n = yield (
                            self._renew_call,
                            hold,
                            ["LOCK.EXTEND", self.name, hold.token, "PX", ms(ask)],
                            min(self.network_timeout, deadline - time.monotonic()),
                        )
                        break
                    except self._RENEW_ERRORS as e:
                        if attempt == 1 or hold.stop.is_set() or time.monotonic() >= deadline:
                            logger.warning("renewal of %r failed: %s", self.name, e)
                            yield from self._lost(hold, LOST_FAILED)
                            return
                if hold.stop.is_set():
                    return
                if n != 1:
                    yield from self._lost(hold, LOST_NOT_HELD)
                    return
                deadline = sent + ask - ttl / 100
                if ask < ttl:
                    # The cap: that was the last renewal; the lease runs out by itself.
                    if not (yield from self._sleep(hold, sent + ask - time.monotonic())):
                        yield from self._lost(hold, LOST_CAP)
                    return
        except Exception as e:
            logger.warning("renewal of %r stopped: %s", self.name, e)
            yield from self._lost(hold, LOST_FAILED)

    def _sleep(self, hold: Hold, seconds: float) -> Steps:
        """Waits `seconds` (at least 0); True when the hold was released meanwhile."""
        return (yield (self._wait, hold.stop, max(0.0, seconds)))

    def _lost(self, hold: Hold, reason: str) -> Steps:
        if hold.stop.is_set():
            return
        hold.lost_reason = reason
        hold.lost.set()
        if self.on_lost is None:
            logger.warning("lock %r lost: %s", self.name, reason)
            return
        try:
            yield (self._callback, reason)
        except Exception:
            logger.exception("on_lost callback of %r raised", self.name)
