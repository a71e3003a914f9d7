"""What the package's tests need beyond the launcher in servers.py (which this file only
uses through its public API: Server(extra=..., module_args=...), .port, .stop(),
.cont(), .kill(), .close()): a lease read from LOCK.INFO, a primary with a replica, a
server without the module, and a few servers at once."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from typing import Any, List, Optional

import redis

from redis_lock_module._common import parse_info
from servers import Server, free_port, server_bin


def lease_ms(r: redis.Redis, key: str) -> Optional[int]:
    """The lease left (ms) as LOCK.INFO reports it. Never PTTL: a module lock's lease
    runs on the server's monotonic clock and its key may carry no Redis expiry."""
    info = parse_info(r.execute_command("LOCK.INFO", key))
    return None if info is None else int(info["ttl"])


def timed(fn: Any) -> tuple:
    """Runs `fn()`: (seconds it took, the exception it raised or None)."""
    t0 = time.monotonic()
    try:
        fn()
    except Exception as e:  # the caller checks what was raised
        return time.monotonic() - t0, e
    return time.monotonic() - t0, None


def wait_until(check: Any, seconds: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not reached within {seconds} s")
        time.sleep(0.02)


class Pair:
    """A primary and one replica, both with the module loaded. By default the link is up
    and the replica online (the primary starts a full sync at once:
    repl-diskless-sync-delay 0). With ``syncing=True`` the replica is held in its first
    full sync (the primary waits an hour before it starts the transfer; state
    ``wait_bgsave``) until :meth:`finish_sync`."""

    def __init__(self, primary_extra: Optional[List[str]] = None, syncing: bool = False) -> None:
        delay = "3600" if syncing else "0"
        self.primary = Server(
            extra=["--repl-diskless-sync", "yes", "--repl-diskless-sync-delay", delay,
                   *(primary_extra or [])]
        )
        try:
            self.replica = Server(extra=["--replicaof", "127.0.0.1", str(self.primary.port)])
        except BaseException:
            self.primary.close()
            raise
        try:
            if syncing:
                wait_until(lambda: self.replica_state() == "wait_bgsave", 20, "a full sync")
            else:
                wait_until(self.link_up, 20, "replication link")
        except BaseException:
            self.close()
            raise

    def replica_state(self) -> Optional[str]:
        """The replica's `state` in the primary's INFO replication (None: not listed)."""
        slave = self.primary.client().info("replication").get("slave0")
        return slave.get("state") if isinstance(slave, dict) else None

    def link_up(self) -> bool:
        """The replica online and acknowledging: a write of this connection is confirmed
        (after a diskless sync a primary sends nothing more to the replica until its first
        acknowledgement, up to a second later)."""
        info = self.replica.client().info("replication")
        if info.get("master_link_status") != "up" or self.replica_state() != "online":
            return False
        r = self.primary.client()
        r.set("pair:probe", 1)
        return r.wait(1, 100) == 1

    def finish_sync(self) -> None:
        """Lets the held full sync run, and waits until the replica is online."""
        self.primary.client().config_set("repl-diskless-sync-delay", 0)
        wait_until(self.link_up, 20, "the end of the full sync")

    def promote(self) -> None:
        """REPLICAOF NO ONE on the replica (the primary is gone)."""
        self.replica.client().execute_command("REPLICAOF", "NO", "ONE")

    def close(self) -> None:
        self.replica.close()
        self.primary.close()


class PlainServer:
    """The server binary without the module (what a user meets before loading it)."""

    def __init__(self, extra: Optional[List[str]] = None) -> None:
        self.dir = tempfile.mkdtemp(prefix="redis-lock-py-plain-")
        self.port = free_port()
        self.proc = subprocess.Popen(
            [server_bin(), "--bind", "127.0.0.1", "--port", str(self.port), "--dir", self.dir,
             "--save", "", "--appendonly", "no", *(extra or [])],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while True:
            try:
                if redis.Redis(port=self.port, socket_timeout=1).ping():
                    return
            except redis.exceptions.AuthenticationError:
                return
            except redis.exceptions.RedisError as e:
                if "NOAUTH" in str(e) or "Authentication" in str(e):
                    return
            if time.monotonic() > deadline:
                self.close()
                raise RuntimeError("plain server did not start")
            time.sleep(0.02)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


def python_env() -> dict:
    """The environment for a child Python that imports the package from this venv."""
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    return env


def with_async_client(port: int, main: Any, **kwargs: Any) -> None:
    """servers.with_async_client for every declared redis-py: it closes the client
    with ``aclose()`` where it exists (5.0.1+), else ``close()`` (4.5-5.0.0)."""
    import asyncio

    import redis.asyncio as aredis

    async def run() -> None:
        r = aredis.Redis(port=port, **kwargs)
        try:
            await main(r)
        finally:
            closing = getattr(r, "aclose", None) or r.close
            await closing()

    asyncio.run(run())
