"""The least-privilege ACL user of the README and the quick start, on a real primary with
a replica: the line as documented lets the sync and the asyncio lock acquire, confirm,
renew and release, and nothing else; without `+wait +role`, `confirm=False` still
works; the version difference the docs name (no `@lock` category on Redis 7.0)."""

import re
from pathlib import Path

import pytest
import redis
from redis.exceptions import NoPermissionError, ResponseError

from helpers import Pair, with_async_client
from redis_lock_module import Lock, LockNotConfirmedError
from redis_lock_module.asyncio import Lock as AsyncLock
from servers import raw_fence

ROOT = Path(__file__).resolve().parents[3]
DOCS = [ROOT / "clients" / "python" / "README.md", ROOT / "docs" / "quickstart-python.md"]


def documented_line() -> str:
    """The one `ACL SETUSER` line the README and the quick start give (the same in both)."""
    lines = set()
    for doc in DOCS:
        found = re.findall(r"^ACL SETUSER .*$", doc.read_text(), re.M)
        assert len(found) == 1, f"{doc}: {found}"
        lines.add(found[0])
    assert len(lines) == 1, lines
    return lines.pop()


def set_user(admin: redis.Redis, tokens: list) -> redis.Redis:
    """Runs the ACL SETUSER line; a new client logged in as that user."""
    assert admin.execute_command(*tokens) in (b"OK", "OK", True)
    return as_user(admin, tokens)


def as_user(admin: redis.Redis, tokens: list) -> redis.Redis:
    """A new client (the package remembers refusals per client for a minute)."""
    password = next(t[1:] for t in tokens if t.startswith(">"))
    return redis.Redis(port=admin.connection_pool.connection_kwargs["port"], username=tokens[2],
                       password=password, socket_timeout=10)


@pytest.fixture(scope="module")
def pair():
    p = Pair()
    yield p
    p.close()


def test_the_documented_user_can_lock_and_nothing_more(pair, key):
    tokens = documented_line().split()
    admin = pair.primary.client()
    admin.acl_log_reset()
    r = set_user(admin, tokens)
    # Acquire (with the confirmation on the replica), renew, release: sync.
    for blocking in (False, True):
        lock = Lock(r, key, timeout=5, network_timeout=5)
        assert lock.acquire(blocking=blocking, blocking_timeout=1)
        assert raw_fence(pair.replica.port, key) == lock.fence, "confirmed on the replica"
        assert lock.extend(5) and lock.reacquire() and lock.owned()
        lock.release()
    # A lock held until released renews itself (LOCK.INFO tells it the default lease).
    lost = []
    forever = Lock(r, key, network_timeout=5, on_lost=lambda lk, why: lost.append(why))
    assert forever.acquire(blocking=False) and forever.owned()
    forever.release()
    assert lost == []

    async def main(ar):
        for blocking in (False, True):
            alock = AsyncLock(ar, key, timeout=5, network_timeout=5)
            assert await alock.acquire(blocking=blocking, blocking_timeout=1)
            assert await alock.extend(5) and await alock.owned()
            await alock.release()

    with_async_client(pair.primary.port, main, username=tokens[2],
                      password=next(t[1:] for t in tokens if t.startswith(">")))
    # Nothing more: no INFO, no CONFIG, no other key, no other command, no FORCERELEASE.
    for what in (
        lambda: r.info(),
        lambda: r.config_get("maxmemory"),
        lambda: r.set(key, "x"),
        lambda: r.execute_command("LOCK.ACQUIRE", "other:" + key, "PX", 1000),
        lambda: r.execute_command("LOCK.FORCERELEASE", key),
    ):
        with pytest.raises(NoPermissionError):
            what()
    # What the client itself was refused, beyond what the test tried above: at most CONFIG
    # GET min-replicas-to-write (asked once per node; optional) and redis-py's CLIENT
    # SETINFO (7.2+; redis-py ignores the refusal).
    tried = {"info", "config|get", "set", "lock.forcerelease", "other:" + key}
    refused = {e["object"]: int(e["count"]) for e in admin.acl_log() if e["username"] == tokens[2]}
    assert set(refused) - tried <= {"client|setinfo"}, refused
    assert refused.get("config|get", 0) <= 3, refused

def test_without_wait_and_role_confirm_false_still_locks(pair, key):
    tokens = [t for t in documented_line().split() if t not in ("+wait", "+role")]
    tokens[2] = "locker-noconfirm"
    admin = pair.primary.client()
    r = set_user(admin, tokens)
    lock = Lock(r, key, timeout=5, confirm=False)
    assert lock.acquire(blocking=False)
    assert lock.extend(5)
    lock.release()
    # The default confirmation needs to know the replicas online: refused before anything
    # is acquired, with a message that names the ways out.
    with pytest.raises(LockNotConfirmedError, match=r"\+role.*replicas=.*confirm=False"):
        Lock(r, key, timeout=5).acquire(blocking=False)
    assert raw_fence(pair.primary.port, key) is None
    # A user allowed INFO instead of ROLE (the package asks INFO replication then).
    admin.execute_command("ACL", "SETUSER", tokens[2], "+wait", "+info")
    r = as_user(admin, tokens)
    lock = Lock(r, key, timeout=5, network_timeout=5)
    assert lock.acquire(blocking=False)
    assert raw_fence(pair.replica.port, key) == lock.fence
    lock.release()
    # With the count given, only WAIT is needed (no ROLE, no INFO).
    admin.execute_command("ACL", "SETUSER", tokens[2], "-info")
    r = as_user(admin, tokens)
    counted = Lock(r, key, timeout=5, replicas=1, network_timeout=5)
    assert counted.acquire(blocking=False)
    assert raw_fence(pair.replica.port, key) == counted.fence
    counted.release()


def test_the_lock_category_exists_from_redis_7_2(pair):
    """The docs' version note: Redis 7.0 gives module commands no ACL category, so the
    line names the commands; 7.2+ and Valkey have `@lock` (which also holds LOCK.CHECK,
    LOCK.WATCH, LOCK.IFHELD and LOCK.IFFENCE: more than the line)."""
    admin = pair.primary.client()
    server = admin.info("server")
    version = tuple(int(x) for x in str(server["redis_version"]).split(".")[:2])
    has_category = "valkey_version" in server or version >= (7, 2)
    if has_category:
        line = "ACL SETUSER by-category reset on >pw ~lock:* +@lock -@dangerous +wait +role"
        r = set_user(admin, line.split())
        lock = Lock(r, "lock:by-category", timeout=5, network_timeout=5)
        assert lock.acquire(blocking=False)
        assert raw_fence(pair.replica.port, "lock:by-category") == lock.fence
        assert lock.check(), "more than the line: LOCK.CHECK"
        with pytest.raises(NoPermissionError):
            r.execute_command("LOCK.FORCERELEASE", "lock:by-category")
        lock.release()
    else:
        with pytest.raises(ResponseError, match="Unknown command or category"):
            admin.execute_command("ACL", "SETUSER", "by-category", "reset", "+@lock")

