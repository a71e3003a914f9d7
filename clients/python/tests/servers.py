"""Throw-away servers with the module loaded, on free loopback ports, for the tests.

LOCK_SERVER_BIN (default /usr/bin/redis-server) and LOCK_MODULE (default the repo's
target/release/libredis_lock.so) choose what runs.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Awaitable, Callable, Dict, List, Optional, Tuple

import redis
import redis.asyncio as aredis

ROOT = Path(__file__).resolve().parents[3]


def server_bin() -> str:
    return os.environ.get("LOCK_SERVER_BIN") or "/usr/bin/redis-server"


def module_path() -> str:
    p = os.environ.get("LOCK_MODULE") or str(ROOT / "target" / "release" / "libredis_lock.so")
    if not os.path.isfile(p):
        raise RuntimeError(f"module not built: {p} (run make build)")
    return p


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, extra: Optional[List[str]] = None, module_args: Optional[List[str]] = None):
        self.extra = extra or []
        self.module_args = module_args or []
        self.dir = tempfile.mkdtemp(prefix="redis-lock-py-")
        self.proc: Optional[subprocess.Popen] = None
        self.port = 0
        for _ in range(5):
            self.port = free_port()
            if self._start():
                return
        raise RuntimeError(f"server did not start; log:\n{self.log()}")

    def _start(self) -> bool:
        args = [
            server_bin(),
            "--bind", "127.0.0.1",
            "--port", str(self.port),
            "--dir", self.dir,
            "--save", "",
            "--appendonly", "no",
            "--daemonize", "no",
            "--logfile", os.path.join(self.dir, "server.log"),
            "--loadmodule", module_path(), *self.module_args,
            *self.extra,
        ]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            try:
                if redis.Redis(port=self.port, socket_timeout=1).ping():
                    return True
            except redis.exceptions.RedisError:
                pass
            time.sleep(0.02)
        self.proc.kill()
        return False

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def client(self, **kw: Any) -> redis.Redis:
        kw.setdefault("socket_timeout", 10)
        return redis.Redis(port=self.port, **kw)

    def log(self) -> str:
        try:
            return Path(self.dir, "server.log").read_text()[-4000:]
        except OSError:
            return ""

    def stop(self) -> None:
        os.kill(self.proc.pid, signal.SIGSTOP)

    def cont(self) -> None:
        os.kill(self.proc.pid, signal.SIGCONT)

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.kill()
            self.proc.wait()

    def close(self) -> None:
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


class Cluster:
    """Three masters, no replicas; slots assigned by hand (works with any server)."""

    def __init__(self, masters: int = 3):
        self.nodes = [
            Server(extra=["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                          "--cluster-node-timeout", "5000"])
            for _ in range(masters)
        ]
        try:
            self._create()
        except BaseException:
            self.close()
            raise

    def _create(self) -> None:
        n = len(self.nodes)
        per = 16384 // n
        for i, node in enumerate(self.nodes):
            lo = i * per
            hi = 16383 if i == n - 1 else (i + 1) * per - 1
            node.client().execute_command("CLUSTER", "ADDSLOTSRANGE", lo, hi)
        first = self.nodes[0].client()
        for node in self.nodes[1:]:
            first.execute_command("CLUSTER", "MEET", "127.0.0.1", node.port)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            ok = True
            for node in self.nodes:
                c = node.client()
                info = c.execute_command("CLUSTER", "INFO")
                info = info.decode() if isinstance(info, bytes) else info
                if "cluster_state:ok" not in info or len(c.execute_command("CLUSTER", "SLOTS")) != n:
                    ok = False
                    break
            if ok:
                return
            time.sleep(0.05)
        raise RuntimeError("cluster did not become ok")

    def node_for(self, key: str) -> Server:
        slot = self.nodes[0].client().execute_command("CLUSTER", "KEYSLOT", key)
        return [n for n in self.nodes if _owns(n, slot)][0]

    def moved_count(self) -> int:
        """MOVED and ASK errors answered by all nodes so far (INFO errorstats)."""
        total = 0
        for node in self.nodes:
            stats = node.client().info("errorstats")
            for k in ("errorstat_MOVED", "errorstat_ASK"):
                if k in stats:
                    total += int(stats[k]["count"])
        return total

    def close(self) -> None:
        for node in self.nodes:
            node.close()


def _owns(node: Server, slot: int) -> bool:
    c = node.client()
    mine = c.execute_command("CLUSTER", "MYID")
    mine = mine.decode() if isinstance(mine, bytes) else mine
    for lo, hi, master, *_ in c.execute_command("CLUSTER", "SLOTS"):
        if lo <= slot <= hi:
            mid = master[2]
            mid = mid.decode() if isinstance(mid, bytes) else mid
            return mid == mine
    return False


# ---------------------------------------------------------------- raw RESP


def raw_command(port: int, *args: Any) -> bytes:
    """Sends one command over a plain socket and returns the reply's bytes unparsed."""
    parts = [f"*{len(args)}\r\n".encode()]
    for a in args:
        b = a if isinstance(a, bytes) else str(a).encode()
        parts.append(f"${len(b)}\r\n".encode() + b + b"\r\n")
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(b"".join(parts))
        data = b""
        # LOCK.INFO's reply is small; read until the server has sent a complete reply.
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
            if _complete(data):
                break
        return data


def _complete(data: bytes) -> bool:
    try:
        return _skip(data, 0) == len(data)
    except (IndexError, ValueError):
        return False


def _skip(data: bytes, i: int) -> int:
    end = data.index(b"\r\n", i)
    t, body = data[i:i + 1], data[i + 1:end]
    i = end + 2
    if t in (b"+", b"-", b":", b"_", b",", b"#", b"("):
        return i
    if t in (b"$", b"=", b"!"):
        n = int(body)
        if n < 0:
            return i
        if len(data) < i + n + 2:
            raise IndexError
        return i + n + 2
    if t in (b"*", b"~", b">", b"%", b"|"):
        n = int(body)
        if n < 0:
            return i
        if t in (b"%", b"|"):
            n *= 2
        for _ in range(n):
            i = _skip(data, i)
        return i
    raise ValueError(t)


def raw_fence(port: int, key: str) -> Optional[int]:
    """The `fence` LOCK.INFO reports, read digit by digit from the RESP2 bytes."""
    data = raw_command(port, "LOCK.INFO", key)
    if data.startswith(b"*-1") or data.startswith(b"$-1") or data.startswith(b"_"):
        return None
    marker = b"$5\r\nfence\r\n:"
    i = data.index(marker) + len(marker)
    return int(data[i:data.index(b"\r\n", i)].decode())


def raw_fences(port: int, key: str) -> List[int]:
    """Every `fence` in the raw LOCK.INFO reply (one per holder for SHARED/LIMIT locks)."""
    data = raw_command(port, "LOCK.INFO", key)
    marker = b"$5\r\nfence\r\n:"
    out, i = [], 0
    while True:
        i = data.find(marker, i)
        if i < 0:
            return out
        i += len(marker)
        out.append(int(data[i:data.index(b"\r\n", i)].decode()))


def acquire_in_thread(lock: Any, **kwargs: Any) -> Tuple[threading.Thread, Dict[str, Any]]:
    """Starts `lock.acquire(**kwargs)` in a thread: the thread, and a dict that gets the
    result under "ok" once the acquire returns."""
    out: Dict[str, Any] = {}
    t = threading.Thread(target=lambda: out.update(ok=lock.acquire(**kwargs)))
    t.start()
    return t, out


def with_async_client(port: int, main: Callable[[Any], Awaitable[None]], **kwargs: Any) -> None:
    """Runs `main(r)` in an event loop of its own with a `redis.asyncio.Redis` on `port`
    (`kwargs` are its options), and closes the client after it."""

    async def run() -> None:
        r = aredis.Redis(port=port, **kwargs)
        try:
            await main(r)
        finally:
            await r.aclose()

    asyncio.run(run())
