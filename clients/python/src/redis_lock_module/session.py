"""Sessions: one lease for any number of locks, as etcd, ZooKeeper and Consul have them,
for ``redis.Redis`` and ``redis.cluster.RedisCluster``.

::

    with Session(r, ttl=30, bind=5) as session:        # one keepalive every 10 s
        orders = session.acquire("lock:orders", blocking_timeout=10)
        invoices = session.acquire("lock:invoices", blocking_timeout=10)
        ...                                            # session.lost tells if it ended
    # closed: every lock of the session released at once (LOCK.SESSION CLOSE)

Every lock taken in a session (``LOCK.ACQUIRE ... SESSION id``) has the session's lease:
one ``LOCK.SESSION KEEPALIVE`` per server renews all of them, and when the session ends
(closed, its lease run out, or, with ``bind``, the process gone) every lock it holds is
released in one step. ``LOCK.SESSION`` has no key, so in a cluster the session is opened
on each primary before its first lock there, and kept alive on each of them.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Dict, List, Optional, Set

from redis.exceptions import LockError, ResponseError
from redis.exceptions import TimeoutError

from ._base import NET_ERRORS, Hold, NoReply, Steps, logger
from ._common import (
    LOST_EXPIRED,
    LOST_FAILED,
    LOST_NOT_HELD,
    Number,
    SessionLostError,
    new_token,
    parse_info,
    raise_if_module_missing,
)
from .lock import Lock

OnLost = Callable[["Session", str], Any]

# The longest pause between two tries while a server does not answer a keepalive.
RETRY_MAX_S = 1.0


class _Part:
    """The session on one server: the connection it is kept alive over (a bound session
    is bound to it), and when it was last renewed there."""

    def __init__(self, node: Any) -> None:
        self.node = node
        self.conn: Any = None
        self.opened = False
        # The send time of its last OPEN or KEEPALIVE that the server answered as renewed.
        self.renewed_at = 0.0
        # What the last try failed with (None after a success).
        self.failing: Optional[str] = None


class _SessionBase:
    """What the sync and the asyncio session share: options, state, and every operation
    as steps (run by the probe lock's ``_run``, over its connections). The subclasses
    supply ``_enter()`` (take the session's mutex, a step), ``_start_worker()``,
    ``_join()`` (a step: the keepalive worker has ended) and ``_callback(reason)``."""

    _LOCK: Any = Lock
    # The sync Lock keeps its token per thread by default; a session's lock is not a
    # thread's.
    _LOCK_OPTIONS: Any = {"thread_local": False}

    def __init__(
        self,
        redis: Any,
        ttl: Number = 30.0,
        *,
        bind: Optional[Number] = None,
        owner: Optional[str] = None,
        on_lost: Optional[Callable[..., Any]] = None,
        network_timeout: Number = 2.0,
        confirm: bool = True,
        replicas: Optional[int] = None,
    ) -> None:
        if not ttl > 0.003:
            raise ValueError("ttl must be above 3 ms (seconds, as Lock's timeout)")
        if bind is not None and bind < 0:
            raise ValueError("bind is a grace period in seconds, 0 or more (or None)")
        if owner is not None and not 1 <= len(str(owner).encode()) <= 256:
            raise ValueError("owner must be 1 to 256 bytes")
        self.redis = redis
        self.ttl = float(ttl)
        self.bind = bind
        self.owner = owner
        self.on_lost = on_lost
        self.network_timeout = float(network_timeout)
        self.confirm, self.replicas = confirm, replicas
        # The session's id: a secret, like a lock's token (whoever has it can keep the
        # session alive or close it). 32 random hex digits.
        self.id = new_token().decode()
        # Its I/O: the lock's connections to each server (made from the client's
        # settings), never the user's.
        self._probe = self._LOCK(redis, "lock.session", network_timeout=network_timeout)
        self._parts: Dict[Any, _Part] = {}
        self._holds: Set[Hold] = set()
        self._stop = self._probe._event()
        self._lost = self._probe._event()
        self._lost_reason: Optional[str] = None
        self._lost_where = ""
        self._to_notify = False
        self._closed = False
        self._worker: Any = None

    # ------------------------------------------------------------------ state

    @property
    def interval(self) -> float:
        """Seconds between two keepalives: a third of the TTL (two more tries fit in
        the lease when one fails, as for a lock's auto-renewal)."""
        return self.ttl / 3

    @property
    def lost(self) -> bool:
        """True once the session is known to have ended without ``close()``."""
        return self._lost.is_set()

    @property
    def lost_reason(self) -> Optional[str]:
        """Why it ended: ``not-held`` (a server answered that the session is not open
        there: closed by someone else, its lease ran out, a restart without it),
        ``failed`` (keepalives failed until its lease ran out), ``expired`` (no
        keepalive was tried in time: the process was paused); None while it holds."""
        return self._lost_reason

    @property
    def closed(self) -> bool:
        return self._closed

    def __repr__(self) -> str:  # never the id: it is a secret
        state = "closed" if self._closed else f"lost ({self._lost_reason})" if self.lost else "open"
        return f"Session(ttl={self.ttl}, servers={len(self._parts)}, {state})"

    def _check_usable(self) -> None:
        if self._closed:
            raise LockError("the session is closed")
        if self._lost_reason is not None:
            raise SessionLostError(f"the session ended ({self._lost_reason})", self._lost_reason)

    def _deadline(self, part: _Part) -> float:
        # The client's conservative view of the lease there (drift: 1% of the TTL).
        return part.renewed_at + self.ttl - self.ttl / 100

    def _opened(self) -> List[_Part]:
        return [p for p in list(self._parts.values()) if p.opened]

    # ------------------------------------------------------------------ locks

    def _track(self, hold: Hold) -> None:
        self._holds.add(hold)
        if self._lost_reason is not None:
            hold.lost_reason = self._lost_reason
            hold.lost.set()

    def _untrack(self, hold: Hold) -> None:
        self._holds.discard(hold)

    def _acquire(
        self,
        name: Any,
        blocking: bool,
        blocking_timeout: Optional[Number],
        shared: bool,
        limit: Optional[int],
        owner: Optional[str],
        token: Optional[Any],
    ) -> Steps:
        self._check_usable()
        lock = self._LOCK(
            self.redis,
            name,
            session=self,
            owner=self.owner if owner is None else owner,
            shared=shared,
            limit=limit,
            network_timeout=self.network_timeout,
            confirm=self.confirm,
            replicas=self.replicas,
            **self._LOCK_OPTIONS,
        )
        if (yield from lock._acquire(blocking, blocking_timeout, token)):
            return lock
        return None

    # ------------------------------------------------------------------ commands

    def _open_args(self) -> List[Any]:
        args: List[Any] = ["LOCK.SESSION", "OPEN", self.id, "PX", max(1, round(self.ttl * 1000))]
        if self.bind is not None:
            args += ["BIND", round(self.bind * 1000)]
        if self.owner is not None:
            args += ["OWNER", self.owner]
        return args

    def _keepalive_args(self, part: _Part) -> List[Any]:
        """KEEPALIVE; on a new connection of a bound session, OPEN (which renews it and
        binds it to that connection; a KEEPALIVE rebinds only a session whose connection
        the server saw close, and a restarted server keeps no binding)."""
        if self.bind is not None and part.conn is None:
            return self._open_args()
        return ["LOCK.SESSION", "KEEPALIVE", self.id]

    def _drop(self, part: _Part) -> Steps:
        if part.conn is not None:
            conn, part.conn = part.conn, None
            yield (self._probe._close, part.node, conn, False)

    def _command(self, part: _Part, args: List[Any]) -> Steps:
        """One command on the part's connection (made if there is none). A connection
        that was open and turns out closed (a server restart) is replaced once."""
        probe = self._probe
        for _ in range(2):
            fresh = part.conn is None
            try:
                if fresh:
                    part.conn = yield (probe._open, part.node)
                yield (probe._send, part.conn, args)
                return (yield (probe._read, part.conn, self.network_timeout))
            except ResponseError as e:
                raise_if_module_missing(e, part.node.where)
                raise
            except NoReply:
                yield from self._drop(part)
                raise TimeoutError(
                    f"LOCK.SESSION {args[1]}: no reply from {part.node.where} within "
                    f"{self.network_timeout:.3g} s"
                ) from None
            except NET_ERRORS:
                yield from self._drop(part)
                if fresh:
                    raise
        raise AssertionError("unreachable")  # pragma: no cover

    def _open_on(self, node: Any) -> Steps:
        """Opens the session on `node` unless it is open there (before the first lock
        the session takes there), and starts the keepalive."""
        self._check_usable()
        part = self._parts.get(node)
        if part is not None and part.opened:
            return
        yield (self._enter,)
        try:
            self._check_usable()
            part = self._parts.setdefault(node, _Part(node))
            if part.opened:
                return
            sent = time.monotonic()
            # 1: opened; 0: it was open (an OPEN whose reply was lost, sent again).
            yield from self._command(part, self._open_args())
            part.opened, part.renewed_at, part.failing = True, sent, None
            if self._worker is None:
                self._start_worker()
        finally:
            self._mutex.release()

    def _mark_lost(self, reason: str, where: str) -> None:
        if self._closed or self._lost_reason is not None:
            return
        self._lost_reason, self._lost_where = reason, where
        self._lost.set()
        self._stop.set()
        for hold in list(self._holds):
            if hold.lost_reason is None and not hold.stop.is_set():
                hold.lost_reason = reason
                hold.lost.set()
        self._to_notify = True

    def _notify(self) -> Steps:
        """Calls ``on_lost`` once, outside the mutex (it may close the session)."""
        if not self._to_notify:
            return
        self._to_notify = False
        if self.on_lost is None:
            logger.warning("session lost on %s: %s", self._lost_where, self._lost_reason)
            return
        try:
            yield (self._callback, self._lost_reason)
        except Exception:
            logger.exception("on_lost callback of a session raised")

    def _ended_on(self, name: Any) -> Steps:
        """An acquire was answered NOSESSION: the session ended on that server."""
        self._mark_lost(LOST_NOT_HELD, f"the server of {name!r}")
        yield from self._notify()
        return SessionLostError(
            f"the session ended on the server of {name!r} (NOSESSION): its locks there are gone",
            LOST_NOT_HELD,
        )

    def _round(self) -> Steps:
        """One keepalive on every server the session is open on, all sent before any
        reply is read: True when every one renewed it. A server that answers that the
        session is not open there marks it lost. Called with the mutex held."""
        probe = self._probe
        parts = self._opened()
        sent = time.monotonic()
        # Replies are awaited until the earliest lease ends, network_timeout at most.
        limit = min([self.network_timeout] + [self._deadline(p) - sent for p in parts])
        asked = []
        again = []
        renewed = True
        for p in parts:
            fresh = p.conn is None
            args = self._keepalive_args(p)
            try:
                if fresh:
                    p.conn = yield (probe._open, p.node)
                yield (probe._send, p.conn, args)
                asked.append((p, args, fresh))
            except NET_ERRORS as e:
                yield from self._drop(p)
                p.failing = type(e).__name__
                if not fresh:
                    again.append(p)
        for p, args, fresh in asked:
            try:
                left = max(0.001, sent + limit - time.monotonic())
                reply = yield (probe._read, p.conn, left)
            except ResponseError as e:  # LOADING after a restart, an ACL refusal, ...
                p.failing = str(e).split(" ", 1)[0]
                continue
            except NoReply:
                yield from self._drop(p)
                p.failing = "no reply"
                continue
            except NET_ERRORS as e:
                yield from self._drop(p)
                p.failing = type(e).__name__
                if not fresh:
                    again.append(p)
                continue
            # Every reply is read (none is left on a connection), whatever this one says.
            renewed = (yield from self._renewed(p, args, reply, sent)) and renewed
        if not renewed:
            return False
        # An idle connection the server closed (a restart, a timeout): once more, on a
        # new one.
        for p in again:
            resent = time.monotonic()
            args = self._keepalive_args(p)
            try:
                reply = yield from self._command(p, args)
            except (ResponseError,) + NET_ERRORS as e:
                p.failing = type(e).__name__
                continue
            if not (yield from self._renewed(p, args, reply, resent)):
                return False
        return all(p.failing is None for p in parts)

    def _renewed(self, part: _Part, args: List[Any], reply: Any, sent: float) -> Steps:
        opened = args[1] == "OPEN"
        # KEEPALIVE: 1 renewed, 0 not open there. OPEN: 0 it was open (renewed and bound
        # to this connection), 1 it was not (a new, empty session).
        if reply == (0 if opened else 1):
            part.renewed_at, part.failing = sent, None
            return True
        if opened:
            try:  # the new session holds nothing: end it
                yield from self._command(part, ["LOCK.SESSION", "CLOSE", self.id])
            except (ResponseError,) + NET_ERRORS:
                pass
        self._mark_lost(LOST_NOT_HELD, part.node.where)
        return False

    def _keep(self) -> Steps:
        """The keepalive worker: a round every third of the TTL (sooner, and again
        within a second, while a server fails to answer) until the session is closed or
        lost; lost when its lease on some server passed without a renewal."""
        probe = self._probe
        try:
            while not self._stop.is_set():
                parts = self._opened()
                now = time.monotonic()
                deadline = min(self._deadline(p) for p in parts)
                due = min(p.renewed_at for p in parts) + self.interval
                if any(p.failing for p in parts):
                    due = min(due, now + max(0.05, min(RETRY_MAX_S, (deadline - now) / 4)))
                if (yield (probe._wait, self._stop, max(0.0, min(due, deadline) - now))):
                    break
                yield (self._enter,)
                try:
                    if self._stop.is_set():
                        break
                    late = [p for p in self._opened() if self._deadline(p) <= time.monotonic()]
                    if late:
                        failed = any(p.failing for p in late)
                        self._mark_lost(LOST_FAILED if failed else LOST_EXPIRED, late[0].node.where)
                    else:
                        yield from self._round()
                finally:
                    self._mutex.release()
                yield from self._notify()
        except Exception as e:
            logger.warning("keepalive of a session stopped: %s", type(e).__name__)
            self._mark_lost(LOST_FAILED, "a server")
            yield from self._notify()

    def _keepalive(self) -> Steps:
        self._check_usable()
        yield (self._enter,)
        try:
            ok = (yield from self._round()) if self._opened() else True
        finally:
            self._mutex.release()
        yield from self._notify()
        return bool(ok) and self._lost_reason is None

    def _close(self) -> Steps:
        if self._closed:
            return 0
        self._stop.set()
        yield (self._join,)
        yield (self._enter,)
        if self._closed:  # closed meanwhile (by on_lost, another thread)
            self._mutex.release()
            return 0
        self._closed = True
        released = 0
        failed: Optional[BaseException] = None
        try:
            for p in list(self._parts.values()):
                try:
                    if p.opened:
                        n = yield from self._command(p, ["LOCK.SESSION", "CLOSE", self.id])
                        released += int(n or 0)
                except (ResponseError,) + NET_ERRORS as e:
                    # The other servers first; the session ends here with its lease.
                    failed = failed or e
                finally:
                    yield from self._drop(p)
        finally:
            self._mutex.release()
            for hold in list(self._holds):
                hold.stop.set()
            self._holds.clear()
        if failed is not None:
            raise failed
        return released

    def _info(self) -> Steps:
        out: Dict[str, Optional[Dict[str, Any]]] = {}
        yield (self._enter,)
        try:
            for p in self._opened():
                out[p.node.where] = parse_info(
                    (yield from self._command(p, ["LOCK.SESSION", "INFO", self.id]))
                )
        finally:
            self._mutex.release()
        return out


class Session(_SessionBase):
    """A session on one server or a Redis Cluster (sync; ``redis_lock_module.asyncio.
    Session`` is the asyncio twin).

    ``ttl``: the session's lease in seconds (default 30): every lock taken in it lives
    as long as the session, and a keepalive every third of it renews them all (one
    command per server, however many locks). ``bind``: a grace period in seconds, or None
    (default): the session is bound to its connection, and ends ``bind`` seconds after
    that connection closes (the process died) unless a keepalive comes first, instead of
    at the end of its lease. ``owner``: a label (``LOCK.SESSION INFO``, and the default
    label of its locks). ``on_lost(session, reason)`` is called, from the keepalive
    thread, once the session is known to have ended (see :attr:`lost_reason`).
    ``network_timeout``, ``confirm``, ``replicas``: as for :class:`Lock`, for the
    session's commands and the grants of its locks.

    ``with Session(r, ttl=30) as session:`` closes it at the end: every lock still held
    in it is released in one step.
    """

    _LOCK = Lock

    def __init__(self, redis: Any, ttl: Number = 30.0, **kwargs: Any) -> None:
        super().__init__(redis, ttl, **kwargs)
        self._mutex = threading.Lock()

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def acquire(
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
        """Takes ``name`` in the session (``LOCK.ACQUIRE name ... SESSION id``): the
        :class:`Lock`, or None when it is held elsewhere (after ``blocking_timeout``
        seconds; ``blocking=False``: one try). The waiting, ``shared``/``limit`` and the
        confirmation on replicas are those of :meth:`Lock.acquire`. The lock has the
        session's lease: it is not renewed on its own, ``release()`` gives it back,
        ``extend()``/``reacquire()`` raise LockError, and its ``lost_reason`` /
        ``wait_lost()`` are the session's. ``Lock(r, name, session=session)`` is the same
        lock, for a ``with`` block. SessionLostError once the session has ended."""
        return self._probe._run(
            self._acquire(name, blocking, blocking_timeout, shared, limit, owner, token)
        )

    def keepalive(self) -> bool:
        """A keepalive now, on every server the session is open on (the background one
        goes on as before): True when each renewed it; False when one did not (then
        :attr:`lost_reason` is set if the session ended there)."""
        return self._probe._run(self._keepalive())

    def close(self) -> int:
        """Ends the session: ``LOCK.SESSION CLOSE`` on every server it is open on
        releases all its locks there at once (waiters served), and its connections are
        closed. The number of locks released. Every server is tried; if one could not be
        reached, its error is raised afterwards (the session ends there with its lease,
        or its ``bind`` grace). Closing twice does nothing (0)."""
        return self._probe._run(self._close())

    def wait_lost(self, timeout: Optional[Number] = None) -> Optional[str]:
        """Blocks until the session is lost (or ``timeout`` seconds): the reason, or None."""
        self._lost.wait(timeout)
        return self._lost_reason

    def info(self) -> Dict[str, Optional[Dict[str, Any]]]:
        """``LOCK.SESSION INFO`` of every server it is open on, by ``host:port`` (None
        where it is not open any more): ttl, owner, bound, locks, lock-list, ..."""
        return self._probe._run(self._info())

    # ------------------------------------------------------------------ I/O

    def _enter(self) -> None:
        self._mutex.acquire()

    def _start_worker(self) -> None:
        t = threading.Thread(
            target=self._probe._run, args=(self._keep(),), name="redis-lock-session", daemon=True
        )
        self._worker = t
        t.start()

    def _join(self) -> None:
        t = self._worker
        if t is not None and t is not threading.current_thread():
            t.join()

    def _callback(self, reason: str) -> Any:
        return self.on_lost(self, reason)  # type: ignore[misc]
