"""Shared (SHARED) and counted (LIMIT n) locks: readers and a queued writer, n permits,
LIMITMISMATCH and WRONGMODE, asyncio (docs/commands.md, "The lock state")."""

import time

import pytest
from redis.exceptions import ResponseError

from redis_lock_module import Lock
from redis_lock_module.asyncio import Lock as AsyncLock
from helpers import wait_until, with_async_client
from servers import acquire_in_thread, raw_fences


def test_readers_share_and_a_writer_waits_for_all(server, key):
    r = server.client()
    a = Lock(r, key, timeout=10, shared=True, owner="reader-a")
    b = Lock(r, key, timeout=10, shared=True, owner="reader-b")
    assert a.acquire(blocking=False) and b.acquire(blocking=False)
    assert a.fence < b.fence
    assert sorted(raw_fences(server.port, key)) == [a.fence, b.fence]
    info = a.info()
    assert info["mode"] == "shared" and int(info["holders"]) == 2
    assert a.owned() and b.owned()
    # Each holder's own lease.
    assert a.extend(20)
    # Acquired in a thread and read here: not thread-local (as with redis-py's Lock).
    writer = Lock(r, key, timeout=10, thread_local=False)
    assert not writer.acquire(blocking=False)
    t, out = acquire_in_thread(writer, blocking_timeout=5)
    # Queued (polled: a thread may start late on a loaded machine), so that the reader
    # below arrives after a queued writer.
    wait_until(lambda: int(Lock(r, key).info()["waiters"]) == 1, what="the writer queued")
    a.release()
    time.sleep(0.2)
    assert "ok" not in out, "one reader still holds it"
    # A reader arriving after a queued writer waits too (no writer starvation).
    assert not Lock(r, key, shared=True).acquire(blocking=False)
    b_fence = b.fence
    b.release()
    t.join(5)
    assert out["ok"] and writer.fence > b_fence
    writer.release()


def test_counted_lock_has_n_permits(server, key):
    r = server.client()
    holders = [Lock(r, key, timeout=10, limit=2) for _ in range(2)]
    assert all(h.acquire(blocking=False) for h in holders)
    # Acquired in a thread and used here: not thread-local (as with redis-py's Lock).
    third = Lock(r, key, timeout=10, limit=2, thread_local=False)
    assert not third.acquire(blocking=False)
    info = third.info()
    assert info["mode"] == "counted" and int(info["limit"]) == 2 and int(info["holders"]) == 2
    with pytest.raises(ResponseError, match="LIMITMISMATCH"):
        Lock(r, key, limit=3).acquire(blocking=False)
    with pytest.raises(ResponseError, match="WRONGMODE"):
        Lock(r, key).acquire(blocking=False)
    with pytest.raises(ResponseError, match="WRONGMODE"):
        Lock(r, key, shared=True).acquire(blocking=False)
    t, out = acquire_in_thread(third, blocking_timeout=5)
    time.sleep(0.1)
    holders[0].release()
    t.join(5)
    assert out["ok"] and third.owned() and not holders[0].owned()
    assert sorted(raw_fences(server.port, key)) == sorted([holders[1].fence, third.fence])
    holders[1].release()
    third.release()
    assert not third.locked()


def test_limit_on_an_exclusive_lock_is_wrongmode(server, key):
    r = server.client()
    x = Lock(r, key, timeout=10)
    assert x.acquire()
    with pytest.raises(ResponseError, match="WRONGMODE"):
        Lock(r, key, limit=2).acquire(blocking=False)
    x.release()


def test_asyncio_shared_and_counted(server, key):
    async def main(r):
        a = AsyncLock(r, key, timeout=10, shared=True)
        b = AsyncLock(r, key, timeout=10, shared=True)
        assert await a.acquire(blocking=False) and await b.acquire(blocking=False)
        assert await a.owned() and await b.owned()
        await a.release()
        await b.release()
        c = AsyncLock(r, key + ":n", timeout=10, limit=1)
        assert await c.acquire(blocking=False)
        assert not await AsyncLock(r, key + ":n", limit=1).acquire(blocking=False)
        await c.release()

    with_async_client(server.port, main)
