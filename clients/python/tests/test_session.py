"""Sessions (sync and asyncio): one keepalive for many locks, released together when the
session ends (closed, its lease run out, its process gone with ``bind``), and the loss
signal when it ends without ``close()``."""

import asyncio
import gc
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import redis.asyncio as aredis
from redis.cluster import RedisCluster
from redis.exceptions import LockError

from redis_lock_module import LOST_NOT_HELD, Lock, Session, SessionLostError
from redis_lock_module._common import parse_info
from redis_lock_module.asyncio import Lock as AsyncLock
from redis_lock_module.asyncio import Session as AsyncSession
from helpers import python_env, wait_until, with_async_client
from servers import acquire_in_thread, raw_fence

NAMES = [f"cl:{i}" for i in range(12)]


def counters(r):
    info = r.info("lock")
    return int(info["lock_session_keepalives"]), int(info["lock_extended"])


def waiters(r, key):
    info = parse_info(r.execute_command("LOCK.INFO", key))
    return int(info["waiters"]) if info else 0


def test_one_keepalive_keeps_ten_locks_past_several_ttls(server, key):
    r = server.client()
    keys = [f"{key}:{i}" for i in range(10)]
    control = Lock(r, f"{key}:control", timeout=1)
    # A 3 s session: a keepalive every second may come 2 s late (a loaded machine's
    # pause) before the session is given up; with 1 s it had 0.67 s.
    with Session(r, ttl=3, owner="job-7") as session:
        locks = [session.acquire(k, blocking=False) for k in keys[:8]]
        locks.append(session.acquire(keys[8], blocking=False, shared=True))
        locks.append(session.acquire(keys[9], blocking=False, limit=2))
        assert all(lock is not None for lock in locks)
        assert control.acquire(blocking=False)
        (info,) = session.info().values()
        assert info["locks"] == 10 and info["owner"] == "job-7" and info["bound"] == 0
        keepalives, extended = counters(r)
        t0 = time.monotonic()
        time.sleep(6.5)  # more than two TTLs
        elapsed = time.monotonic() - t0
        assert not control.locked(), "the control's lease (1 s, not renewed) ran out"
        for k, lock in zip(keys, locks):
            assert lock.owned() and raw_fence(server.port, k) == lock.fence, k
            assert lock.lost_reason is None
        k2, e2 = counters(r)
        # One KEEPALIVE per round (every third of the TTL) for all ten; a renewal per
        # lock would be ten per round.
        assert 3 <= k2 - keepalives <= elapsed / session.interval + 2, k2 - keepalives
        assert e2 == extended, "no lock was extended on its own"
        # A session lock is not extended on its own; it is released on its own.
        with pytest.raises(LockError, match="session"):
            locks[0].extend(10)
        locks[0].release()
        assert not Lock(r, keys[0]).locked()
        # Lock(..., session=) is the same lock, for a with block.
        with Lock(r, f"{key}:with", session=session, blocking_timeout=1) as held:
            assert raw_fence(server.port, f"{key}:with") == held.fence
        assert raw_fence(server.port, f"{key}:with") is None
        # Blocking in the session: served when the holder releases.
        holder = Lock(r, f"{key}:busy", timeout=10)
        assert holder.acquire()
        out = {}
        t = threading.Thread(
            target=lambda: out.update(lock=session.acquire(f"{key}:busy", blocking_timeout=5))
        )
        t.start()
        wait_until(lambda: waiters(r, f"{key}:busy") == 1, what="a waiter in the session")
        holder.release()
        t.join(5)
        assert out["lock"].fence == raw_fence(server.port, f"{key}:busy")
        assert session.keepalive()
    # Closed: the ten (nine plus the waited one) released at once.
    assert session.closed and session.lost_reason is None
    for k in keys + [f"{key}:busy"]:
        assert raw_fence(server.port, k) is None, k
    assert r.execute_command("LOCK.SESSION", "INFO", session.id) is None
    with pytest.raises(LockError, match="closed"):
        session.acquire(keys[0])


CHILD = textwrap.dedent(
    """
    import sys, time
    import redis
    from redis_lock_module import Session

    r = redis.Redis(port=int(sys.argv[1]))
    session = Session(r, ttl=60, bind=0.5)
    for k in sys.argv[2:]:
        assert session.acquire(k, blocking=False) is not None
    print("ready", flush=True)
    time.sleep(120)
    """
)


def test_a_bound_session_ends_when_its_process_dies(server, key):
    """A process holding three locks in a session bound to its connection (grace 0.5 s,
    lease 60 s) is killed: a waiter in this process gets the lock within the grace, not
    the lease, and the other locks are free."""
    r = server.client()
    keys = [f"{key}:{i}" for i in range(3)]
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(server.port), *keys],
        stdout=subprocess.PIPE, text=True, env=python_env(),
    )
    try:
        assert child.stdout.readline().strip() == "ready"
        waiter = Lock(r, keys[0], timeout=10, thread_local=False)
        t, out = acquire_in_thread(waiter, blocking_timeout=30)
        wait_until(lambda: waiters(r, keys[0]) == 1, what="the waiter queued")
        t0 = time.monotonic()
        child.send_signal(signal.SIGKILL)
        t.join(30)
        took = time.monotonic() - t0
        assert out["ok"] and waiter.fence == raw_fence(server.port, keys[0])
        assert 0.45 <= took < 30, f"served {took:.2f} s after the kill (grace 0.5 s, lease 60 s)"
        assert all(raw_fence(server.port, k) is None for k in keys[1:])
        waiter.release()
    finally:
        child.kill()
        child.wait()


def test_lost_when_closed_elsewhere_and_when_the_server_restarts(own_server, key):
    r = own_server.client()
    reasons = []
    # 3 s: expired before the CLOSE below needs a keepalive 2 s late, not 0.67 s.
    session = Session(r, ttl=3, on_lost=lambda s, why: reasons.append(why))
    a = session.acquire(f"{key}:a", blocking=False)
    b = session.acquire(f"{key}:b", blocking=False)
    waiter = Lock(r, f"{key}:a", timeout=10, thread_local=False)
    t, out = acquire_in_thread(waiter, blocking_timeout=10)
    wait_until(lambda: waiters(r, f"{key}:a") == 1, what="the waiter queued")
    # Closed from another connection (an operator, a script with the id).
    assert r.execute_command("LOCK.SESSION", "CLOSE", session.id) == 2
    t.join(10)
    assert out["ok"], "the waiter was served by the close"
    waiter.release()
    assert session.wait_lost(10) == LOST_NOT_HELD
    assert reasons == [LOST_NOT_HELD]
    assert a.lost_reason == LOST_NOT_HELD and b.wait_lost(0) == LOST_NOT_HELD
    with pytest.raises(SessionLostError):
        session.acquire(f"{key}:c")
    assert session.close() == 0

    # A restart without persistence forgets every session: an unbound one and a bound
    # one both learn it at their next keepalive. 6 s: the restart (a process start, 1-2 s
    # on a loaded machine) ends well before a keepalive failing meanwhile gives up (4 s).
    plain = Session(r, ttl=6)
    bound = Session(r, ttl=6, bind=1)
    assert plain.acquire(f"{key}:p", blocking=False) is not None
    assert bound.acquire(f"{key}:q", blocking=False) is not None
    own_server.restart()
    assert plain.wait_lost(10) == LOST_NOT_HELD
    assert bound.wait_lost(10) == LOST_NOT_HELD
    # The bound one's check (an OPEN on a new connection) left no session behind.
    assert r.info("lock")["lock_sessions"] == 0
    plain.close()
    bound.close()


def test_lost_when_one_of_its_locks_moves_to_another_server(server, own_server, key):
    # MIGRATE (what a slot move does to each key) takes one lock of the session to
    # another server: the session's server answers its next keepalive 0, so the loss
    # signal fires (the moved lock lasts there only as long as the keepalives that reach
    # it there); the other lock stays held to its lease.
    r = server.client()
    session = Session(r, ttl=30)
    a = session.acquire(f"{key}:a", blocking=False)
    b = session.acquire(f"{key}:b", blocking=False)
    assert session.keepalive()
    assert r.execute_command("MIGRATE", "127.0.0.1", own_server.port, f"{key}:a", 0, 5000) == b"OK"
    assert not session.keepalive()
    assert session.lost_reason == LOST_NOT_HELD
    assert a.wait_lost(0) == LOST_NOT_HELD and b.wait_lost(0) == LOST_NOT_HELD
    assert r.execute_command("LOCK.INFO", f"{key}:b") is not None, "held to its lease"
    assert session.close() == 1


def test_asyncio_session_and_cancellation(server, key):
    """The asyncio session keeps its locks past its TTL; a waiting acquire in it and the
    block of `async with` can be cancelled, and asyncio reports nothing afterwards (no
    "Task exception was never retrieved")."""
    reported = []

    async def main(r):
        asyncio.get_running_loop().set_exception_handler(lambda loop, ctx: reported.append(ctx))
        holder = AsyncLock(r, f"{key}:busy", timeout=10)
        assert await holder.acquire()
        # 3 s sessions: a keepalive may come 2 s late on a loaded machine.
        async with AsyncSession(r, ttl=3) as session:
            locks = [await session.acquire(f"{key}:{i}", blocking=False) for i in range(3)]
            await asyncio.sleep(3.5)  # past the TTL
            for lock in locks:
                assert await lock.owned()
            assert await session.keepalive()
            waiting = asyncio.ensure_future(session.acquire(f"{key}:busy", blocking_timeout=5))
            while int((await holder.info())["waiters"]) < 1:
                await asyncio.sleep(0.01)
            waiting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiting
        assert not any([await AsyncLock(r, f"{key}:{i}").locked() for i in range(3)])

        async def body(started):
            async with AsyncSession(r, ttl=3) as s:
                assert await s.acquire(f"{key}:x", blocking=False)
                started.set()
                await asyncio.sleep(30)

        started = asyncio.Event()
        task = asyncio.ensure_future(body(started))
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert not await AsyncLock(r, f"{key}:x").locked(), "the cancelled block closed it"
        assert int((await holder.info())["waiters"]) == 0
        await holder.release()
        await asyncio.sleep(0.1)
        gc.collect()
        await asyncio.sleep(0)

    with_async_client(server.port, main)
    gc.collect()
    assert reported == [], [c.get("message") for c in reported]


def test_a_session_on_every_master(cluster):
    rc = RedisCluster(host="127.0.0.1", port=cluster.nodes[0].port)
    # 3 s: a keepalive may come 2 s late on a loaded machine.
    with Session(rc, ttl=3) as session:
        locks = {n: session.acquire(n, blocking=False) for n in NAMES}
        info = session.info()
        assert len(info) == 3, "opened on each master"
        assert sum(i["locks"] for i in info.values()) == len(NAMES)
        time.sleep(6.5)  # more than two TTLs
        for n, lock in locks.items():
            assert lock.fence == raw_fence(cluster.node_for(n).port, n), n
    assert session.lost_reason is None
    for n in NAMES:
        assert raw_fence(cluster.node_for(n).port, n) is None, n
    for node in cluster.nodes:
        assert node.client().execute_command("LOCK.SESSION", "INFO", session.id) is None
    rc.close()


def test_asyncio_session_on_a_cluster(cluster):
    async def main():
        rc = aredis.RedisCluster(host="127.0.0.1", port=cluster.nodes[1].port)
        async with AsyncSession(rc, ttl=5) as session:
            for n in NAMES:
                lock = await session.acquire(n, blocking_timeout=1)
                assert lock.fence == raw_fence(cluster.node_for(n).port, n)
            assert len(await session.info()) == 3
            released = await session.close()
        assert released == len(NAMES)
        assert all(raw_fence(cluster.node_for(n).port, n) is None for n in NAMES)
        await (getattr(rc, "aclose", None) or rc.close)()

    asyncio.run(main())
