"""The package's own connections, made from the settings of the user's client.

Every command the lock sends goes over a connection of its own to the node that owns
the key, made with the client's host, port, TLS, credentials, database, protocol and
decoding, but with limits of the lock's: a connect limit of at most ``network_timeout``,
no reconnect retries (redis-py's default retries a failed connect with backoff for
seconds), and a read limit per call. So every call is bounded whatever the client's
``socket_timeout`` says, a grant and its ``WAIT`` share one connection (``WAIT`` counts
the writes of its own connection), and a read that timed out never leaves a reply
behind on a connection the user's client reads.

Idle connections are kept per client and node, a few at most, and dropped after a fork.
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from typing import Any, Dict, List, Optional, Tuple

try:
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    def _no_retry() -> Any:
        return Retry(NoBackoff(), 0)

except ImportError:  # pragma: no cover - redis-py without redis.retry

    def _no_retry() -> Any:
        return None


IDLE_PER_NODE = 4
# How long what a node said about its replicas is reused (ROLE, CONFIG GET).
REPLICAS_CACHE_S = 1.0
# How long a command the node refused (an ACL user without it) is not asked again.
REFUSED_RETRY_S = 60.0


class Node:
    """One server: how to connect to it, its idle connections, and a short cache of
    what it said about its replicas."""

    def __init__(self, cls: Any, kwargs: Dict[str, Any]) -> None:
        self.cls = cls
        self.kwargs = kwargs
        self.idle: List[Any] = []
        self.mutex = threading.Lock()
        # (at, replicas online or None when unknown, min-replicas-to-write)
        self.replicas: Optional[Tuple[float, Optional[int], int]] = None
        # Commands this server refused (an ACL user without them), and when.
        self.refused: Dict[str, float] = {}
        self.pid = os.getpid()

    @property
    def where(self) -> str:
        """host:port (or the socket path) for messages: never a credential."""
        k = self.kwargs
        if "path" in k and "host" not in k:
            return str(k["path"])
        return f"{k.get('host', 'localhost')}:{k.get('port', 6379)}"

    def new_connection(self, network_timeout: float, read_timeout: Any = "network") -> Any:
        kwargs = dict(self.kwargs)
        user = kwargs.get("socket_connect_timeout")
        kwargs["socket_connect_timeout"] = (
            network_timeout if user is None else min(float(user), network_timeout)
        )
        kwargs["socket_timeout"] = network_timeout if read_timeout == "network" else read_timeout
        kwargs["socket_keepalive"] = True
        kwargs["retry_on_timeout"] = False
        retry = _no_retry()
        if retry is not None:
            kwargs["retry"] = retry
        kwargs.pop("retry_on_error", None)
        return self.cls(**kwargs)

    def take(self) -> Optional[Any]:
        with self.mutex:
            if self.pid != os.getpid():  # forked: the parent's sockets are not ours
                self.idle.clear()
                self.pid = os.getpid()
            return self.idle.pop() if self.idle else None

    def give_back(self, conn: Any) -> bool:
        """Keeps `conn` for reuse; False when it should be closed instead."""
        with self.mutex:
            if self.pid == os.getpid() and len(self.idle) < IDLE_PER_NODE:
                self.idle.append(conn)
                return True
        return False

    def cached_replicas(self) -> Optional[Tuple[Optional[int], int]]:
        r = self.replicas
        if r is not None and time.monotonic() - r[0] < REPLICAS_CACHE_S:
            return r[1], r[2]
        return None

    def refuses(self, command: str) -> bool:
        """True if the server refused `command` less than a minute ago."""
        at = self.refused.get(command)
        return at is not None and time.monotonic() - at < REFUSED_RETRY_S

    def remember_refused(self, command: str) -> None:
        self.refused[command] = time.monotonic()

    def remember_replicas(self, online: Optional[int], min_to_write: int) -> None:
        self.replicas = (time.monotonic(), online, min_to_write)


class Registry:
    """Nodes per user client (weakly keyed: a client that goes away takes its nodes)."""

    def __init__(self) -> None:
        self.by_client: "weakref.WeakKeyDictionary[Any, Dict[Any, Node]]" = (
            weakref.WeakKeyDictionary()
        )
        self.mutex = threading.Lock()

    def node(self, client: Any, key: Any, make: Any) -> Node:
        with self.mutex:
            nodes = self.by_client.get(client)
            if nodes is None:
                nodes = {}
                self.by_client[client] = nodes
            node = nodes.get(key)
            if node is None:
                cls, kwargs = make()
                node = Node(cls, kwargs)
                nodes[key] = node
            return node


# The nodes of every client, sync and asyncio (a client is one or the other).
NODES = Registry()
