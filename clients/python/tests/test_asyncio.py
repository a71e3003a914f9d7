"""The asyncio Lock against a real server (each test runs its own event loop)."""

import asyncio
import gc
import socket
import time

import pytest
from redis.exceptions import LockError, LockNotOwnedError

from redis_lock_module import LOST_CAP, LOST_NOT_HELD
from redis_lock_module.asyncio import Lock
from helpers import lease_ms
from helpers import with_async_client
from servers import raw_fence


def test_api_and_exact_fences(server, key):
    async def main(r):
        fences = []
        for _ in range(10):
            lock = r.lock(key, timeout=5, lock_class=Lock)
            async with lock:
                assert await lock.owned() and await lock.locked()
                assert lock.fence == raw_fence(server.port, key)
                fences.append(lock.fence)
                assert not await Lock(r, key).acquire(blocking=False)
                assert await lock.extend(10)
                assert 14_000 < lease_ms(server.client(), key) <= 15_000
                assert await lock.reacquire()
                assert 4_000 < lease_ms(server.client(), key) <= 5_000
        assert all(a < b for a, b in zip(fences, fences[1:]))
        with pytest.raises(LockError):
            await lock.release()
        lock = Lock(r, key, timeout=5)
        assert await lock.acquire(token="tok-1-000000000000")
        await r.execute_command("LOCK.FORCERELEASE", key)
        with pytest.raises(LockNotOwnedError):
            await lock.release()

    with_async_client(server.port, main)


def test_block_hand_off(server, key):
    async def main(r):
        holder = Lock(r, key, timeout=10)
        assert await holder.acquire()
        first = holder.fence
        waiter = Lock(r, key, timeout=10)
        task = asyncio.ensure_future(waiter.acquire(blocking_timeout=5))
        while int((await holder.info())["waiters"]) < 1:
            await asyncio.sleep(0.01)
        # The client's own connections stay usable while the waiter blocks.
        assert await r.ping()
        t0 = time.monotonic()
        await holder.release()
        assert await task
        assert time.monotonic() - t0 < 1
        assert waiter.fence > first and waiter.fence == raw_fence(server.port, key)
        await waiter.release()
        # A wait that times out leaves no waiter behind.
        assert await holder.acquire()
        t0 = time.monotonic()
        assert not await Lock(r, key).acquire(blocking_timeout=0.3)
        assert 0.29 <= time.monotonic() - t0 < 1.5
        assert int((await holder.info())["waiters"]) == 0
        await holder.release()

    with_async_client(server.port, main)


def test_no_orphan_after_a_client_side_timeout(own_server, key):
    async def main(r):
        await r.execute_command("LOCK.ACQUIRE", key, "PX", "300", "TOKEN", "holder-token-0001")
        before = int((await r.info("lock"))["lock_handed_off"])
        lock = Lock(r, key, timeout=30, network_timeout=1.0)
        task = asyncio.ensure_future(lock.acquire(blocking_timeout=1.0))
        await asyncio.sleep(0.1)
        own_server.stop()
        await asyncio.sleep(2.4)  # past BLOCK + network_timeout, within the grace after it
        own_server.cont()
        assert await task is False
        # No grant to a waiter whose BLOCK ended in the stall (see test_lock.py).
        assert int((await r.info("lock"))["lock_handed_off"]) == before
        assert await lock.info() is None, "the lock is free"
        second = Lock(r, key, timeout=5)
        assert await second.acquire(blocking=False)
        await second.release()

    with_async_client(own_server.port, main, socket_timeout=10)


def test_auto_renewal_loss_and_cap(server, key):
    async def main(r):
        reasons = []

        async def on_lost(lk, why):
            reasons.append(why)

        # 1.5 s leases, renewed every 0.5 s: a renewal may come 1 s late on a loaded
        # machine before the lease runs out (300 ms left 0.2 s).
        lock = Lock(r, key, timeout=1.5, auto_renew=True, on_lost=on_lost)
        assert await lock.acquire()
        granted = time.monotonic()
        while True:
            await asyncio.sleep(0.2)
            sent = time.monotonic() - granted
            assert await lock.owned(), f"lost {sent:.2f} s after the grant"
            if sent > 3.0:  # two leases
                break
        await r.execute_command("LOCK.FORCERELEASE", key)
        assert await lock.wait_lost(10) == LOST_NOT_HELD
        assert reasons == [LOST_NOT_HELD]

        capped = Lock(r, key, timeout=1.5, auto_renew=True, max_hold=3.5)
        t0 = time.monotonic()
        assert await capped.acquire()
        assert await capped.wait_lost(15) == LOST_CAP
        assert 3.45 < time.monotonic() - t0 < 15
        # The lease then runs out on the server (its last stretch ends at the cap, seen
        # from the server a little later: poll, not one look 50 ms after).
        deadline = time.monotonic() + 10
        while await capped.locked():
            assert time.monotonic() < deadline, "the lease runs out on the server by the cap"
            await asyncio.sleep(0.01)

    with_async_client(server.port, main)


def test_cancelling_a_waiting_acquire_leaves_no_unretrieved_exception(server, key):
    """Cancelling a task that waits in the queue: the waiter leaves, the lock stays usable,
    and asyncio reports nothing ("Task exception was never retrieved" for the read the
    acquire was waiting on, once its connection is closed)."""
    reported = []

    async def main(r):
        asyncio.get_running_loop().set_exception_handler(lambda loop, ctx: reported.append(ctx))
        holder = Lock(r, key, timeout=10)
        assert await holder.acquire()
        for _ in range(3):
            waiter = Lock(r, key, timeout=10)
            task = asyncio.ensure_future(waiter.acquire(blocking_timeout=5))
            while int((await holder.info())["waiters"]) < 1:
                await asyncio.sleep(0.01)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            while int((await holder.info())["waiters"]) > 0:
                await asyncio.sleep(0.01)
        await holder.release()
        await asyncio.sleep(0.1)  # what the cancelled reads left settles
        gc.collect()  # an unretrieved exception is reported when its task is collected
        await asyncio.sleep(0)

    with_async_client(server.port, main)
    gc.collect()
    assert reported == [], [c.get("message") for c in reported]
