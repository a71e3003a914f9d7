"""What the sync and the asyncio lock share: command arguments, reply parsing, options."""

from __future__ import annotations

import uuid
from typing import Any, Dict, List, NamedTuple, Optional, Tuple, Type, TypeVar, Union

from redis.exceptions import LockError, LockNotOwnedError, ResponseError

Number = Union[int, float]
E = TypeVar("E", bound=LockError)

# Where a user who met ModuleNotLoadedError finds how to load the module.
SETUP_DOC = "docs/quickstart-python.md in the redis-lock repository"

# Reasons given to an `on_lost` callback (and kept in `Lock.lost_reason`).
LOST_NOT_HELD = "not-held"  # a renewal was answered 0: expired, or LOCK.FORCERELEASE
LOST_FAILED = "failed"  # renewals failed (connection errors, error replies) until the lease ran out
LOST_EXPIRED = "expired"  # the lease deadline passed with no successful renewal
LOST_CAP = "cap-reached"  # max_hold reached: renewal stopped and the lease ran out


def lock_error(cls: Type[E], message: str, name: Any) -> E:
    """``cls(message, lock_name=name)`` where redis-py's LockError takes ``lock_name``
    (5.1 and later); older releases (4.5-5.0) take the message only, so the name is set
    as an attribute there: every error path works on each redis-py the package declares."""
    try:
        return cls(message, lock_name=name)  # type: ignore[call-arg]
    except TypeError:
        e = cls(message)
        e.lock_name = name  # type: ignore[attr-defined]
        return e


class LockNotConfirmedError(LockError):
    """A grant that the server's replicas did not confirm (``WAIT``) within the bound,
    or a deployment that expects more replicas than are connected. The grant, if there
    was one, was given back (LOCK.RELEASE) before this was raised."""


class QuorumUnavailableError(LockError):
    """Redlock: fewer than a majority of the nodes answered (connection errors,
    timeouts, a wrong password, a refused command), so whether the lock is free could not
    be learned. Not the None of a lock held elsewhere. What any node granted was released
    first. ``answered`` and ``quorum`` are counts; ``errors`` is ``[(host:port, error)]``
    for the nodes that did not answer (never a password: host and port only)."""

    def __init__(self, message: str, answered: int, quorum: int, errors: List[Tuple[str, BaseException]]):
        super().__init__(message)
        self.answered, self.quorum, self.errors = answered, quorum, errors


class SessionLostError(LockError):
    """The session ended before the client closed it: a keepalive was answered 0 (it
    was closed or ran out on the server, or the server restarted without it), an acquire
    in it was answered ``NOSESSION``, or no keepalive got through before its lease ran
    out. Its locks are gone (or will be at the end of their lease). ``reason`` is the
    loss reason (``not-held``, ``failed``, ``expired``)."""

    def __init__(self, message: str, reason: str):
        super().__init__(message)
        self.reason = reason


class ModuleNotLoadedError(ResponseError):
    """The server answered that LOCK.* is an unknown command: the redis-lock module is
    not loaded there. The message names the server, never the command's arguments (the
    server's own message echoes them, the lock's token included)."""


def is_unknown_lock_command(e: BaseException) -> bool:
    text = str(e)
    if text.startswith("ERR "):
        text = text[4:]
    return text.lower().startswith("unknown command") and "lock." in text.lower()[:40]


def module_missing(where: str) -> ModuleNotLoadedError:
    return ModuleNotLoadedError(
        f"the redis-lock module is not loaded on {where}; load it at start-up "
        "(loadmodule target/release/libredis_lock.so of a build, or "
        f"/usr/lib/redis/modules/redis-lock.so of the .deb), see {SETUP_DOC}"
    )


def raise_if_module_missing(e: BaseException, where: str) -> None:
    """Raises :class:`ModuleNotLoadedError` (without the server's text, which echoes the
    arguments) when `e` says the server does not know a LOCK.* command."""
    if is_unknown_lock_command(e):
        raise module_missing(where) from None


def new_token() -> bytes:
    return uuid.uuid4().hex.encode()


def to_bytes(v: Any) -> bytes:
    if isinstance(v, bytes):
        return v
    if isinstance(v, str):
        return v.encode()
    return str(v).encode()


def to_str(v: Any) -> Any:
    return v.decode() if isinstance(v, bytes) else v


def ms(seconds: Number) -> int:
    """Seconds (int or float) to whole milliseconds, at least 1."""
    return max(1, int(round(seconds * 1000)))


def acquire_args(
    name: Any,
    token: bytes,
    timeout: Optional[Number],
    owner: Optional[str],
    shared: bool,
    limit: Optional[int],
    block_ms: Optional[int],
    session: Optional[str] = None,
) -> List[Any]:
    args: List[Any] = ["LOCK.ACQUIRE", name]
    if shared:
        args.append("SHARED")
    if limit is not None:
        args += ["LIMIT", limit]
    if session is not None:
        # The session's lease instead of one of its own (PX/EX and SESSION exclude each
        # other on the server).
        args += ["SESSION", session]
    elif timeout is not None:
        args += ["PX", ms(timeout)]
    args += ["TOKEN", token]
    if owner is not None:
        args += ["OWNER", owner]
    if block_ms is not None:
        args += ["BLOCK", block_ms]
    return args


def parse_grant(reply: Any, token: bytes) -> Optional[int]:
    """The fence of a LOCK.ACQUIRE reply, None when not acquired."""
    if reply is None:
        return None
    if isinstance(reply, (list, tuple)) and len(reply) == 2:
        if to_bytes(reply[0]) != token:
            raise LockError("LOCK.ACQUIRE granted a token other than the one sent")
        fence = reply[1]
        if isinstance(fence, (bytes, str)):
            fence = int(fence)
        if isinstance(fence, int) and not isinstance(fence, bool) and fence > 0:
            return fence
    # Not the reply itself: it holds the token.
    raise LockError(f"unexpected LOCK.ACQUIRE reply (a {type(reply).__name__})")


def parse_info(reply: Any) -> Optional[Dict[str, Any]]:
    """LOCK.INFO as a dict with str keys (RESP2 flat list or RESP3 map); None when free."""
    if reply is None:
        return None
    if isinstance(reply, dict):
        items = list(reply.items())
    elif isinstance(reply, (list, tuple)):
        items = [(reply[i], reply[i + 1]) for i in range(0, len(reply) - 1, 2)]
    else:
        raise LockError(f"unexpected LOCK.INFO reply {reply!r}")
    out: Dict[str, Any] = {}
    for k, v in items:
        k = to_str(k)
        if k == "holder-list" and isinstance(v, (list, tuple)):
            v = [parse_info(h) if isinstance(h, (dict, list, tuple)) else h for h in v]
        else:
            v = to_str(v)
        out[k] = v
    return out


def holder_ttl(info: Optional[Dict[str, Any]], fence: Optional[int]) -> Optional[int]:
    """The TTL (ms) of the holder with `fence` in a parsed LOCK.INFO, None if not a holder."""
    if info is None or fence is None:
        return None
    holders = info.get("holder-list")
    if isinstance(holders, list):
        for h in holders:
            if isinstance(h, dict) and _int(h.get("fence")) == fence:
                return _int(h.get("ttl"))
        return None
    if _int(info.get("fence")) == fence:
        return _int(info.get("ttl"))
    return None


def _int(v: Any) -> Optional[int]:
    try:
        return int(v)
    except (TypeError, ValueError):
        return None


def is_moved(e: BaseException) -> bool:
    """A cluster redirection: redis-py's MovedError/AskError, or the plain reply text
    (a connection of the package's own may parse it as a plain ResponseError)."""
    try:
        from redis.exceptions import AskError, MovedError

        if isinstance(e, (MovedError, AskError)):
            return True
    except ImportError:  # pragma: no cover - very old redis-py
        pass
    return isinstance(e, ResponseError) and str(e).startswith(("MOVED ", "ASK "))


def online_in_role(reply: Any) -> int:
    """How many replicas a primary's ROLE reply lists: those online (a replica still in
    its full sync is left out). Not a primary (a replica, a sentinel): 0."""
    if not isinstance(reply, (list, tuple)) or len(reply) < 3 or to_str(reply[0]) != "master":
        return 0
    replicas = reply[2]
    return len(replicas) if isinstance(replicas, (list, tuple)) else 0


def online_in_info(text: Any) -> int:
    """How many `slaveN:` lines of an INFO replication reply say `state=online`."""
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    return sum(
        1
        for line in str(text).splitlines()
        if line.startswith("slave") and ":" in line and "state=online" in line
    )


def config_value(reply: Any) -> Optional[int]:
    """The value of a one-parameter CONFIG GET reply (RESP2 pair or RESP3 map)."""
    if isinstance(reply, dict):
        values = list(reply.values())
    elif isinstance(reply, (list, tuple)):
        values = list(reply[1::2])
    else:
        return None
    return _int(to_str(values[0])) if values else None


def check_options(
    timeout: Optional[Number],
    shared: bool,
    limit: Optional[int],
    auto_renew: bool,
    max_hold: Optional[Number],
    network_timeout: Number,
    replicas: Optional[int] = None,
) -> None:
    if timeout is not None and timeout <= 0:
        raise ValueError("timeout must be positive (or None: held until released)")
    if shared and limit is not None:
        raise ValueError("a lock is either shared or counted (limit=), not both")
    if limit is not None and (not isinstance(limit, int) or limit < 1):
        raise ValueError("limit must be an integer >= 1")
    if max_hold is not None and max_hold <= 0:
        raise ValueError("max_hold must be positive")
    if max_hold is not None and not auto_renew and timeout is not None:
        raise ValueError("max_hold caps auto-renewal: pass auto_renew=True with it")
    if network_timeout <= 0:
        raise ValueError("network_timeout must be positive")
    if replicas is not None and (not isinstance(replicas, int) or replicas < 0):
        raise ValueError("replicas must be an integer >= 0")


# ---------------------------------------------------------------------- election


class Leader(NamedTuple):
    """Who leads an election: the value it campaigned with (or proclaimed since) and
    its term, the fence of its grant (terms strictly increase from one leader to the
    next)."""

    value: str
    term: int


# What an observer has seen before its first answer.
UNSEEN: Any = object()

# Error codes after which an observer reconnects and reads the state again.
TRANSIENT_CODES = (
    "TRYAGAIN",
    "LOCKMOVED",
    "UNBLOCKED",
    "LOADING",
    "MASTERDOWN",
    "CLUSTERDOWN",
    "BUSY",
    "MAXWAITERS",
)
# redis-py's classes for some of them (its parsers turn the code into the class).
TRANSIENT_CLASSES = (
    "TryAgainError",
    "ClusterDownError",
    "MasterDownError",
    "BusyLoadingError",
)


def is_transient_reply(e: BaseException) -> bool:
    return type(e).__name__ in TRANSIENT_CLASSES or str(e).startswith(TRANSIENT_CODES)


def is_not_held_reply(e: BaseException) -> bool:
    """LOCK.IFHELD / LOCK.IFFENCE refused: the token (fence) does not hold the lock."""
    return isinstance(e, ResponseError) and str(e).startswith("NOTHELD")


def check_value(value: Any) -> None:
    if not isinstance(value, (str, bytes)) or not 1 <= len(to_bytes(value)) <= 256:
        raise ValueError("an election value must be a str of 1 to 256 bytes")


def parse_holder(reply: Any) -> Optional[Tuple[int, Any]]:
    """The leader in a LOCK.WATCH summary or a LOCK.INFO reply: ``(term, label as
    sent)``, None when nobody holds the key (nil, or a lock-delay running). The exclusive
    holder's fence and label; for a shared or counted key the first holder's."""
    if reply is None:
        return None
    if isinstance(reply, dict):
        items = list(reply.items())
    elif isinstance(reply, (list, tuple)) and len(reply) % 2 == 0:
        items = [(reply[i], reply[i + 1]) for i in range(0, len(reply), 2)]
    else:
        raise LockError(f"unexpected LOCK.WATCH / LOCK.INFO reply (a {type(reply).__name__})")
    fence: Optional[int] = None
    label: Any = None
    first: Optional[Tuple[Optional[int], Any]] = None
    for k, v in items:
        k = to_str(k)
        if k == "state" and to_str(v) != "held":
            return None
        if k == "kind" and to_str(v) == "string":
            raise LockError("the key holds a classic SET NX lock (a string), not an election")
        if k == "fence":
            fence = _int(to_str(v))
        elif k == "owner":
            label = v
        elif k == "holder-list" and isinstance(v, (list, tuple)) and v:
            h = parse_holder_entry(v[0])
            if h is not None:
                first = h
    if fence is None and first is not None:
        fence, label = first
    return None if fence is None else (fence, label)


def parse_holder_entry(entry: Any) -> Optional[Tuple[Optional[int], Any]]:
    if isinstance(entry, dict):
        items = list(entry.items())
    elif isinstance(entry, (list, tuple)):
        items = [(entry[i], entry[i + 1]) for i in range(0, len(entry) - 1, 2)]
    else:
        return None
    fence, label = None, None
    for k, v in items:
        k = to_str(k)
        if k == "fence":
            fence = _int(to_str(v))
        elif k == "owner":
            label = v
    return fence, label


def leader_of(seen: Optional[Tuple[int, Any]]) -> Optional[Leader]:
    if seen is None:
        return None
    term, label = seen
    if isinstance(label, bytes):
        value = label.decode(errors="replace")
    else:
        value = "" if label is None else str(label)
    return Leader(value, term)


def watch_args(name: Any, last: Any, block_ms: int) -> List[Any]:
    """The next command of an observer: LOCK.INFO before the first answer (who leads
    now, at once), then LOCK.WATCH for the next change of what it saw last."""
    if last is UNSEEN:
        return ["LOCK.INFO", name, "COUNT", 1]
    if last is None:
        return ["LOCK.WATCH", name, "BLOCK", block_ms]
    term, label = last
    args: List[Any] = ["LOCK.WATCH", name, "FENCE", term]
    if label is not None and len(to_bytes(label)) > 0:
        args += ["OWNER", label]
    return args + ["BLOCK", block_ms]
