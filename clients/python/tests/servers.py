"""Throw-away servers with the module loaded, on free loopback ports, for the tests.

The servers come from the repository's test kit (`redis-lock-testkit serve`, built by
`make testkit`), the launcher every suite uses: `Kit` is one run of it, `Server` one
standalone server, `Cluster` masters with the slots shared out. LOCK_SERVER_BIN (default
/usr/bin/redis-server), LOCK_MODULE (default the repo's target/release/libredis_lock.so)
and LOCK_TESTKIT (default target/release/redis-lock-testkit) choose what runs.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
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


def kit_bin() -> str:
    p = os.environ.get("LOCK_TESTKIT") or str(ROOT / "target" / "release" / "redis-lock-testkit")
    if not os.path.isfile(p):
        raise RuntimeError(f"test kit not built: {p} (run make testkit)")
    return p


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Kit:
    """One `redis-lock-testkit serve` run: `topology` is `("servers", n)`, `("pair",)` or
    `("cluster", n)`; `extra` server options, `module_args` after the module. `members`
    are its servers; closing the kit kills them and removes their directories."""

    def __init__(self, *topology: Any, extra: Optional[List[str]] = None,
                 module_args: Optional[List[str]] = None):
        argv = [kit_bin(), "serve", "--server", server_bin(), "--module", module_path()]
        for a in module_args or []:
            argv += ["--module-arg", a]
        argv += [str(t) for t in topology] + ["--", *(extra or [])]
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait(timeout=30)
            raise RuntimeError(f"the test kit could not start {topology} (exit {self.proc.returncode}; its stderr above)")
        self.members = [Member(self, i, m) for i, m in enumerate(json.loads(line)["servers"])]

    def send(self, op: str, i: int) -> Dict[str, Any]:
        self.proc.stdin.write(f"{op} {i}\n")
        self.proc.stdin.flush()
        reply = json.loads(self.proc.stdout.readline() or '{"error": "the test kit exited"}')
        if "error" in reply:
            raise RuntimeError(f"test kit: {op} {i}: {reply['error']}")
        return reply

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.terminate()
                self.proc.wait()


class Member:
    """One server of a kit: its port, directory and process id, and what can be done to it."""

    def __init__(self, kit: Kit, index: int, info: Dict[str, Any]):
        self.kit, self.index = kit, index
        self.port, self.pid, self.dir = info["port"], info["pid"], info["dir"]

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
        """SIGSTOP: the server stops answering until cont()."""
        self.kit.send("stop", self.index)

    def cont(self) -> None:
        self.kit.send("cont", self.index)

    def kill(self) -> None:
        """SIGKILL (the directory stays until close())."""
        self.kit.send("kill", self.index)

    def restart(self) -> None:
        """Starts it again on the same port, with the same directory and arguments."""
        self.pid = self.kit.send("restart", self.index)["pid"]


class Server(Member):
    """A standalone server of its own; `extra` are server options (`["--appendonly",
    "yes"]`), `module_args` go after the module's path."""

    def __init__(self, extra: Optional[List[str]] = None, module_args: Optional[List[str]] = None):
        self.extra, self.module_args = extra or [], module_args or []
        kit = Kit("single", extra=extra, module_args=module_args)
        self.proc = kit.proc
        super().__init__(kit, 0, {"port": kit.members[0].port, "pid": kit.members[0].pid,
                                  "dir": kit.members[0].dir})

    def close(self) -> None:
        self.kit.close()


class Cluster:
    """Masters (three by default), no replicas, every slot served."""

    def __init__(self, masters: int = 3):
        self.kit = Kit("cluster", masters)
        self.nodes = self.kit.members

    def node_for(self, key: str) -> Member:
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
        self.kit.close()


def _owns(node: Member, slot: int) -> bool:
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
