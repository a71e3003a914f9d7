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
from typing import Any, Callable, Generator, List, Optional, Tuple

from redis.exceptions import ConnectionError, LockError, LockNotOwnedError, ResponseError
from redis.exceptions import TimeoutError

from ._common import (
    LOST_CAP,
    LOST_EXPIRED,
    LOST_FAILED,
    LOST_NOT_HELD,
    LockNotConfirmedError,
    Number,
    acquire_args,
    check_options,
    config_value,
    is_moved,
    is_not_held_reply,
    lock_error,
    ms,
    new_token,
    online_in_info,
    online_in_role,
    parse_grant,
    parse_info,
    raise_if_module_missing,
)

logger = logging.getLogger("redis_lock_module")

Step = Tuple[Any, ...]
Steps = Generator[Step, Any, Any]

# What a connection of the package's own can fail with, short of an error reply.
NET_ERRORS: Tuple[type, ...] = (ConnectionError, TimeoutError, OSError)


class NoReply(Exception):
    """Nothing arrived on a connection within the time allowed (the connection may still
    get the reply later: it is read again, or closed, never reused)."""


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
        except BaseException as e:  # KeyboardInterrupt too: the steps clean up first
            run.error = e
    return run.result


async def run_async(steps: Steps) -> Any:
    run = _Run(steps)
    while (step := run.next()) is not None:
        try:
            run.reply = await step[0](*step[1:])
        except BaseException as e:  # a cancellation too: the steps close what they opened
            run.error = e
    return run.result


def is_cluster(client: Any, module: str) -> bool:
    """True when `client` is the `RedisCluster` of `module` (redis-py may lack it)."""
    try:
        cls = importlib.import_module(module).RedisCluster
    except (ImportError, AttributeError):  # pragma: no cover - redis-py without cluster
        return False
    return isinstance(client, cls)


class Conn:
    """A connection of the package's own: the redis-py connection, and (asyncio) a read
    that is still pending after a call gave up waiting for it."""

    def __init__(self, raw: Any) -> None:
        self.raw = raw
        self.pending: Any = None


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


class LockBase:
    """What the sync and the asyncio lock share; the subclasses supply the I/O, each a
    step (a plain function, or a coroutine function for asyncio):

    - ``_node()``: the :class:`~redis_lock_module._conns.Node` that owns the key;
    - ``_open(node)``: a :class:`Conn` to it (an idle one, or a new one connected
      within ``network_timeout``);
    - ``_close(node, conn, reuse)``: keep it for reuse, or close it;
    - ``_send(conn, args)``; ``_read(conn, seconds)``: the next reply, or
      :class:`NoReply` when none came within `seconds` (None: no limit);
    - ``_refresh_cluster()``: learn the slots again after a redirection;
    - ``_event()``, ``_wait(event, seconds)``: an event and a wait for it (True if set);
    - ``_start_renewal(hold)``: run ``_renewal(hold)`` in the background;
    - ``_callback(reason)``: call ``on_lost``;
    - ``_CLUSTER_MODULE``: where the client's ``RedisCluster`` class is.
    """

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
        release_on_exit: bool = True,
        confirm: bool = True,
        replicas: Optional[int] = None,
        session: Any = None,
    ) -> None:
        check_options(timeout, shared, limit, auto_renew, max_hold, network_timeout, replicas)
        if session is not None:
            if timeout is not None or auto_renew or max_hold is not None:
                raise ValueError(
                    "a lock of a session has the session's lease: no timeout, auto_renew "
                    "or max_hold (the session's keepalive renews it)"
                )
            if not isinstance(self, session._LOCK):
                raise TypeError("a sync Session takes sync locks, an asyncio Session asyncio locks")
        self.redis, self.name, self.owner = redis, name, owner
        # redis-py's Lock parameters
        self.timeout, self.sleep = timeout, sleep
        self.blocking, self.blocking_timeout = blocking, blocking_timeout
        self.thread_local = bool(thread_local)
        self.raise_on_release_error = raise_on_release_error
        # this package's own
        self.shared, self.limit = shared, limit
        # timeout=None is redis-py's "until released": a lease the lock keeps renewing
        # (a lock of a session: the session keeps it).
        self.session = session
        self.auto_renew = (auto_renew or timeout is None) and session is None
        self.max_hold, self.on_lost = max_hold, on_lost
        self.network_timeout = float(network_timeout)
        self.release_on_exit = release_on_exit
        self.confirm, self.replicas = confirm, replicas
        self.local: Any = self._new_local()

    def _new_local(self) -> Any:
        return SimpleNamespace(token=None, hold=None, fence=None)

    # ------------------------------------------------------------------ state

    @property
    def token(self) -> Optional[bytes]:
        """The token of the current grant (None when not held here)."""
        return self.local.token

    @property
    def fence(self) -> int:
        """The fencing token of the current grant: pass it with every write. After a
        release, the last grant's; LockError when this lock was never acquired (here, in
        this thread with ``thread_local``)."""
        fence: Optional[int] = self.local.fence
        if fence is None:
            raise self._error("Cannot read the fence of a lock that was never acquired")
        return fence

    @property
    def lost_reason(self) -> Optional[str]:
        """Why auto-renewal gave the lock up (``not-held``, ``failed``, ``expired``,
        ``cap-reached``), None while it holds."""
        hold = self.local.hold
        return hold.lost_reason if hold is not None else None

    def _error(self, message: str) -> LockError:
        return lock_error(LockError, message, self.name)

    def _held(self, verb: str) -> Hold:
        hold = self.local.hold
        if hold is None:
            raise self._error(f"Cannot {verb} an unlocked lock")
        if self.session is not None:
            raise self._error(
                f"Cannot {verb} a lock of a session: its lease is the session's, renewed by "
                "the session's keepalive (session.keepalive() renews every lock of it now)"
            )
        if self.timeout is None:
            # As redis-py's: a lock without a timeout has no lease to extend (this one
            # renews its own while held).
            raise self._error(f"Cannot {verb} a lock with no timeout")
        return hold

    def _not_owned(self, verb: str) -> LockNotOwnedError:
        return lock_error(
            LockNotOwnedError, f"Cannot {verb} a lock that's no longer owned", self.name
        )

    # ------------------------------------------------------------------ commands

    def _call(self, *args: Any, limit: Optional[float] = None, retry: bool = True) -> Steps:
        """One command on a connection of the lock's own, its reply within `limit`
        seconds (default ``network_timeout``). A connection that was idle and turns out
        closed (a server restart) is replaced once, unless ``retry=False`` (a command that
        must not run twice: a guarded write)."""
        limit = self.network_timeout if limit is None else max(0.001, limit)
        node = yield (self._node,)
        for attempt in range(2):
            conn = yield (self._open, node)
            reuse = False
            try:
                yield (self._send, conn, args)
                reply = yield (self._read, conn, limit)
                reuse = True
                return reply
            except ResponseError as e:
                reuse = True
                raise_if_module_missing(e, node.where)
                raise
            except NoReply:
                raise TimeoutError(
                    f"{args[0]} {self.name!r}: no reply from {node.where} within {limit:.3g} s"
                ) from None
            except ConnectionError:
                if retry and attempt == 0 and getattr(conn, "reused", False):
                    continue
                raise
            finally:
                yield (self._close, node, conn, reuse)
        raise AssertionError("unreachable")  # pragma: no cover

    # ------------------------------------------------------------------ redis-py API

    def _enter(self) -> Steps:
        if (yield (self.acquire,)):
            return self
        raise self._error("Unable to acquire lock within the time specified")

    def _exit(self) -> Steps:
        if not self.release_on_exit:
            # Once per period: the work is done, the lock stays until its lease ends.
            hold = self.local.hold
            if hold is not None:
                hold.stop.set()
                self.local.token = None
                self.local.hold = None
            return
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
        block_ms: Optional[int] = None
        if blocking and not (blocking_timeout is not None and blocking_timeout <= 0):
            block_ms = 0 if blocking_timeout is None else ms(blocking_timeout)
        sent = time.monotonic()
        fence = None
        for attempt in range(2):
            try:
                fence = yield from self._acquire_once(tok, block_ms)
                break
            except ResponseError as e:
                if attempt == 0 and self._is_cluster() and is_moved(e):
                    yield (self._refresh_cluster,)
                    continue
                if self.session is not None and str(e).startswith("NOSESSION"):
                    # The session ended on that server: its locks there are gone.
                    raise (yield from self.session._ended_on(self.name)) from None
                raise
        if block_ms is not None:
            # When in the wait the grant happened is unknown: count from the reply.
            sent = time.monotonic()
        if fence is None:
            return False
        hold = Hold(tok, fence, sent, self._event)
        self.local.token = tok
        self.local.hold = hold
        self.local.fence = fence
        if self.session is not None:
            self.session._track(hold)
        if self.auto_renew:
            self._start_renewal(hold)
        return True

    def _locked(self) -> Steps:
        return bool((yield from self._call("EXISTS", self.name)))

    def _owned(self) -> Steps:
        hold = self.local.hold
        if hold is None:
            return False
        return (yield from self._holder_ttl(hold.fence)) is not None

    def _release(self) -> Steps:
        hold = self.local.hold
        if hold is None:
            raise self._error("Cannot release a lock that's not owned or is already unlocked.")
        hold.stop.set()
        self.local.token = None
        self.local.hold = None
        if self.session is not None:
            self.session._untrack(hold)
        if not (yield from self._call("LOCK.RELEASE", self.name, hold.token)):
            raise self._not_owned("release")

    def _extend(self, additional_time: Number, replace_ttl: bool) -> Steps:
        hold = self._held("extend")
        if replace_ttl:
            px = ms(additional_time)
        else:
            left = yield from self._holder_ttl(hold.fence)
            if left is None:
                raise self._not_owned("extend")
            px = max(1, left) + ms(additional_time)
        if not (yield from self._call("LOCK.EXTEND", self.name, hold.token, "PX", px)):
            raise self._not_owned("extend")
        return True

    def _reacquire(self) -> Steps:
        hold = self._held("reacquire")
        assert self.timeout is not None  # _held refused a lock without one
        px = ms(self.timeout)
        if not (yield from self._call("LOCK.EXTEND", self.name, hold.token, "PX", px)):
            raise self._not_owned("reacquire")
        return True

    # ------------------------------------------------------------------ guarded writes

    def _guard_refused(self, what: str) -> LockNotOwnedError:
        return lock_error(
            LockNotOwnedError,
            f"{what} of {self.name!r}: the lock is no longer held by this grant (its lease "
            "ended, or it was released); the command did not run",
            self.name,
        )

    def _if_held(self, args: Tuple[Any, ...]) -> Steps:
        """LOCK.IFHELD name token args...: the wrapped command's reply; NOTHELD (nothing
        ran) marks the lock lost and raises LockNotOwnedError."""
        if not args:
            raise ValueError("if_held needs a command, e.g. lock.if_held('SET', 'k', 'v')")
        hold = self.local.hold
        if hold is None:
            raise self._guard_refused("LOCK.IFHELD")
        try:
            return (
                yield from self._call("LOCK.IFHELD", self.name, hold.token, *args, retry=False)
            )
        except ResponseError as e:
            if not is_not_held_reply(e):
                raise
        yield from self._lost(hold, LOST_NOT_HELD)
        raise self._guard_refused("LOCK.IFHELD")

    def _if_fence(self, fence: int, args: Tuple[Any, ...]) -> Steps:
        if not args:
            raise ValueError("if_fence needs a command, e.g. lock.if_fence(f, 'SET', 'k', 'v')")
        try:
            return (
                yield from self._call("LOCK.IFFENCE", self.name, int(fence), *args, retry=False)
            )
        except ResponseError as e:
            if not is_not_held_reply(e):
                raise
        raise self._guard_refused("LOCK.IFFENCE")

    def _check(self, fence: Optional[int]) -> Steps:
        if fence is None:
            hold = self.local.hold
            if hold is None:
                raise self._error("Cannot check an unlocked lock (give a fence)")
            fence = hold.fence
        return bool((yield from self._call("LOCK.CHECK", self.name, int(fence))))

    def _relabel(self, owner: Any) -> Steps:
        """LOCK.EXTEND name token [PX timeout] OWNER owner: a new label (and a fresh
        lease), the fence kept. LockNotOwnedError when the lock was lost (without asking
        the server once the loss is known)."""
        hold = self.local.hold
        if hold is None or hold.lost.is_set() or hold.stop.is_set():
            raise self._not_owned("relabel")
        args: List[Any] = ["LOCK.EXTEND", self.name, hold.token]
        if self.timeout is not None:
            args += ["PX", ms(self.timeout)]
        args += ["OWNER", owner]
        if (yield from self._call(*args)) != 1:
            yield from self._lost(hold, LOST_NOT_HELD)
            raise self._not_owned("relabel")
        self.owner = owner

    def _info(self) -> Steps:
        return parse_info((yield from self._call("LOCK.INFO", self.name)))

    def _holder_ttl(self, fence: int) -> Steps:
        """The remaining lease (ms) of the holder with `fence`, None if not a holder.
        LOCK.INFO lists a page of holders (sorted by fence) with a `cursor` for the next
        one; an exclusive lock names its holder at the top level."""
        args: List[Any] = ["LOCK.INFO", self.name]
        for _ in range(10_000):
            info = parse_info((yield from self._call(*args)))
            if info is None:
                return None
            holders = info.get("holder-list")
            if not isinstance(holders, list):
                return _int(info.get("ttl")) if _int(info.get("fence")) == fence else None
            for h in holders:
                if isinstance(h, dict) and _int(h.get("fence")) == fence:
                    return _int(h.get("ttl"))
            cursor = _int(info.get("cursor")) or 0
            if cursor <= 0 or cursor >= fence:
                return None
            args = ["LOCK.INFO", self.name, "COUNT", 100, "AFTER", cursor]
        return None

    def _wait_lost(self, timeout: Optional[Number]) -> Steps:
        hold = self.local.hold
        if hold is None:
            return None
        yield (self._wait, hold.lost, timeout)
        return hold.lost_reason

    # ------------------------------------------------------------------ acquiring

    def _args(self, token: bytes, block_ms: Optional[int]) -> list:
        return acquire_args(
            self.name,
            token,
            self.timeout,
            self.owner,
            self.shared,
            self.limit,
            block_ms,
            None if self.session is None else self.session.id,
        )

    def _is_cluster(self) -> bool:
        return is_cluster(self.redis, self._CLUSTER_MODULE)

    def _acquire_once(self, token: bytes, block_ms: Optional[int]) -> Steps:
        """LOCK.ACQUIRE (with BLOCK when `block_ms` is not None) on a connection of our
        own, then the replicas' confirmation on the same one: the fence, or None."""
        node = yield (self._node,)
        if self.session is not None:
            # Opened on this server before its first lock there (a cluster: on each
            # primary it takes locks on).
            yield from self.session._open_on(node)
        # A connect that fails has sent nothing: there is nothing to give back.
        conn = yield (self._open, node)
        reuse = False
        try:
            need = (yield from self._replicas_needed(node, conn)) if self.confirm else 0
            yield (self._send, conn, self._args(token, block_ms))
            if block_ms is None:
                limit: Optional[float] = self.network_timeout
            elif block_ms == 0:
                limit = None
            else:
                limit = block_ms / 1000 + self.network_timeout
            try:
                reply = yield (self._read, conn, limit)
            except NoReply:
                return (yield from self._no_reply(node, conn, token, block_ms, limit))
            except ResponseError as e:
                reuse = True
                raise_if_module_missing(e, node.where)
                raise
            except NET_ERRORS:
                # The command may have run: give the token's grant back (bounded).
                yield from self._release_quietly(token)
                raise
            fence = parse_grant(reply, token)
            if fence is not None and need > 0:
                yield from self._confirm(node, conn, token, need)
            reuse = True
            return fence
        finally:
            yield (self._close, node, conn, reuse)

    def _replicas_needed(self, node: Any, conn: Conn) -> Steps:
        """How many replicas must confirm a grant, the rule of the Rust client and the CLI:
        ``replicas=``, else the server's ``min-replicas-to-write`` when set, else the
        replicas online now (a replica in its full sync is not counted: it gets the grant
        with its sync). Read with ROLE (reused for a second). Fewer online than expected
        is an error before anything is acquired; so is not knowing how many are online
        (ROLE and INFO refused) unless the count is given."""
        cached = node.cached_replicas()
        online, to_write = cached if cached is not None else (yield from self._read_replicas(node, conn))
        if self.replicas is not None:
            expected, source = self.replicas, "replicas="
        elif to_write > 0:
            expected, source = to_write, "min-replicas-to-write"
        elif online is None:
            raise lock_error(
                LockNotConfirmedError,
                f"lock {self.name!r}: cannot learn how many replicas of {node.where} should "
                "confirm a grant (ROLE and INFO refused); grant the user +role, or pass "
                "replicas=n (the count) or confirm=False; not acquired",
                self.name,
            )
        else:
            return online
        if online is not None and online < expected and cached is not None:
            # A second old: ask again before refusing.
            online, _ = yield from self._read_replicas(node, conn)
        if online is not None and online < expected:
            raise lock_error(
                LockNotConfirmedError,
                f"lock {self.name!r}: {expected} replica(s) expected ({source}) but "
                f"{online} online at {node.where}; not acquired",
                self.name,
            )
        return expected

    def _read_replicas(self, node: Any, conn: Conn) -> Steps:
        """(replicas online or None, min-replicas-to-write or 0) from ROLE (INFO
        replication if ROLE is refused) and CONFIG GET; what the server refuses (an ACL
        user without it) is not asked again for a minute."""
        online: Optional[int] = None
        to_write = 0
        # ROLE (or INFO when ROLE was refused) and CONFIG GET go out together: one round
        # trip; INFO follows only when ROLE is refused now.
        asks = [a for a in ("ROLE", "INFO") if not node.refuses(a)][:1]
        if not node.refuses("CONFIG"):
            asks.append("CONFIG")
        commands = {
            "ROLE": ["ROLE"],
            "INFO": ["INFO", "replication"],
            "CONFIG": ["CONFIG", "GET", "min-replicas-to-write"],
        }
        try:
            for ask in asks:
                yield (self._send, conn, commands[ask])
            while asks:
                ask = asks.pop(0)
                try:
                    reply = yield (self._read, conn, self.network_timeout)
                except ResponseError:  # not allowed (an ACL user without it), renamed
                    node.remember_refused(ask)
                    if ask == "ROLE" and not node.refuses("INFO"):
                        asks.append("INFO")
                        yield (self._send, conn, commands["INFO"])
                    continue
                if ask == "CONFIG":
                    to_write = config_value(reply) or 0
                else:
                    online = online_in_role(reply) if ask == "ROLE" else online_in_info(reply)
        except NoReply:
            # Nothing was acquired yet: a plain timeout.
            raise TimeoutError(
                f"ROLE: no reply from {node.where} within {self.network_timeout:.3g} s"
            ) from None
        node.remember_replicas(online, to_write)
        return online, to_write

    def _confirm(self, node: Any, conn: Conn, token: bytes, need: int) -> Steps:
        """WAIT for `need` replicas on the grant's connection; fewer within the bound:
        the grant is given back and LockNotConfirmedError raised."""
        wait_ms = ms(self.network_timeout)
        acks: Optional[int] = None
        try:
            yield (self._send, conn, ["WAIT", need, wait_ms])
            acks = _int((yield (self._read, conn, 2 * self.network_timeout)))
        except (NoReply, ResponseError) + NET_ERRORS as e:
            yield from self._release_quietly(token)
            raise lock_error(
                LockNotConfirmedError,
                f"lock {self.name!r}: WAIT for {need} replica(s) of {node.where} failed "
                f"({type(e).__name__}); the grant was released",
                self.name,
            ) from None
        if acks is None or acks < need:
            released = False
            try:
                yield (self._send, conn, ["LOCK.RELEASE", self.name, token])
                released = bool((yield (self._read, conn, self.network_timeout)))
            except (NoReply, ResponseError) + NET_ERRORS:
                yield from self._release_quietly(token)
                raise lock_error(
                    LockNotConfirmedError,
                    f"lock {self.name!r}: {acks or 0} of {need} replica(s) of {node.where} "
                    f"confirmed the grant within {wait_ms} ms; sent LOCK.RELEASE",
                    self.name,
                ) from None
            raise lock_error(
                LockNotConfirmedError,
                f"lock {self.name!r}: {acks or 0} of {need} replica(s) of {node.where} "
                f"confirmed the grant within {wait_ms} ms; "
                + ("released it" if released else "it was no longer held"),
                self.name,
            )

    def _no_reply(
        self, node: Any, conn: Conn, token: bytes, block_ms: Optional[int], limit: Optional[float]
    ) -> Steps:
        """No reply to LOCK.ACQUIRE in time: LOCK.RELEASE goes out on the same connection
        (the server runs it right after the acquire, so a grant made after we gave up is
        given back at once instead of sitting with nobody listening until its lease
        ends); then both replies are read, network_timeout each."""
        released: Any = None
        late: Any = None
        try:
            yield (self._send, conn, ["LOCK.RELEASE", self.name, token])
            try:
                late = yield (self._read, conn, self.network_timeout)
            except ResponseError as e:
                late = e
            released = yield (self._read, conn, self.network_timeout)
        except (NoReply, ResponseError) + NET_ERRORS:
            released = None
        waited = "the wait plus " if block_ms is not None else ""
        if released is None:
            yield from self._release_quietly(token)
            raise TimeoutError(
                f"LOCK.ACQUIRE {self.name!r}: no reply from {node.where} within "
                f"{waited}{self.network_timeout:.3g} s; sent LOCK.RELEASE for the token"
            )
        granted = isinstance(late, (list, tuple))
        logger.info(
            "LOCK.ACQUIRE %r answered after the client gave up (%s); released (%r)",
            self.name,
            "granted" if granted else type(late).__name__,
            released,
        )
        if block_ms is None:
            raise TimeoutError(
                f"LOCK.ACQUIRE {self.name!r}: no reply from {node.where} within "
                f"{self.network_timeout:.3g} s (answered late; released)"
            )
        return None

    def _release_quietly(self, token: bytes) -> Steps:
        try:
            yield from self._call("LOCK.RELEASE", self.name, token)
        except Exception as e:  # best effort: the lease ends by itself anyway
            logger.warning(
                "LOCK.RELEASE %r after a failed acquire failed: %s", self.name, type(e).__name__
            )

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
                # The server's lock.default-ttl: what LOCK.INFO says is left of it.
                left = yield from self._holder_ttl(hold.fence)
                if left is None:
                    yield from self._lost(hold, LOST_NOT_HELD)
                    return
                ttl = max(0.003, left / 1000)
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
                        n = yield from self._call(
                            "LOCK.EXTEND",
                            self.name,
                            hold.token,
                            "PX",
                            ms(ask),
                            limit=min(self.network_timeout, deadline - time.monotonic()),
                        )
                        break
                    except (ResponseError,) + NET_ERRORS as e:
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
        if hold.stop.is_set() or hold.lost.is_set():
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


def _int(v: Any) -> Optional[int]:
    if isinstance(v, bytes):
        v = v.decode(errors="replace")
    try:
        return int(v)
    except (TypeError, ValueError):
        return None
