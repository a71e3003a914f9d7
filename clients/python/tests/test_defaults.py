"""What the lock does by default, against real servers: every call bounded while the
server is down or stopped; timeout=None held until released; once-per-period runs with
release_on_exit=False (issue 22 items 1, 3, 6). The defaults that read the server's own
replies (its errors, ROLE/WAIT for the replicas) are in test_replies.py, which runs on
every server of the Makefile's PKG_TEST_SERVERS; this file runs on the first."""

import subprocess
import sys
import textwrap
import time

import pytest
import redis
from redis.exceptions import ConnectionError, LockError, TimeoutError

from helpers import lease_ms, python_env, timed, wait_until, with_async_client
from redis_lock_module import LOST_NOT_HELD, Lock
from redis_lock_module.asyncio import Lock as AsyncLock
from servers import raw_fence


# ---------------------------------------------------------------- 1. bounded calls


def test_every_call_is_bounded_while_the_server_is_down(own_server, key):
    # A client with no limits of its own and redis-py's default retries.
    r = redis.Redis(port=own_server.port)
    held = Lock(r, key + ":held", timeout=30, network_timeout=0.5)
    assert held.acquire(blocking=False)
    own_server.kill()
    plain, plain_error = timed(r.ping)
    assert isinstance(plain_error, ConnectionError)
    calls = {
        "acquire(blocking=False)": lambda: Lock(r, key, timeout=5, network_timeout=0.5).acquire(
            blocking=False
        ),
        "acquire(blocking_timeout=5)": lambda: Lock(r, key, timeout=5, network_timeout=0.5).acquire(
            blocking_timeout=5
        ),
        "acquire() waiting forever": lambda: Lock(r, key, timeout=5, network_timeout=0.5).acquire(),
        "release()": held.release,
        "locked()": Lock(r, key, network_timeout=0.5).locked,
    }
    for what, call in calls.items():
        took, error = timed(call)
        print(f"{what}: {took:.3f} s ({type(error).__name__}); a plain PING: {plain:.3f} s")
        assert isinstance(error, ConnectionError), (what, error)
        assert took < 0.5 + 1.0, (what, took)
        assert str(own_server.port) in str(error)


def test_every_call_is_bounded_while_the_server_is_stopped(own_server, key):
    """SIGSTOP: connections are accepted by the kernel, nothing is answered."""
    r = redis.Redis(port=own_server.port)  # socket_timeout=None: it would wait forever
    held = Lock(r, key + ":held", timeout=30, network_timeout=0.4)
    assert held.acquire(blocking=False)
    own_server.stop()
    try:
        bound = 0.4 * 3 + 1.0  # the read, then LOCK.RELEASE's two reads, plus slack
        for what, call in {
            "acquire(blocking=False)": lambda: Lock(r, key, timeout=5, network_timeout=0.4).acquire(
                blocking=False
            ),
            "acquire(blocking_timeout=0.3)": lambda: Lock(
                r, key, timeout=5, network_timeout=0.4
            ).acquire(blocking_timeout=0.3),
            "release()": held.release,
            "info()": Lock(r, key, network_timeout=0.4).info,
        }.items():
            took, error = timed(call)
            print(f"{what}: {took:.3f} s ({type(error).__name__})")
            assert isinstance(error, TimeoutError), (what, error)
            assert took < bound + 0.3, (what, took)
    finally:
        own_server.cont()


def test_asyncio_calls_are_bounded_while_the_server_is_down(own_server, key):
    port = own_server.port

    async def main(r):
        own_server.kill()
        for blocking in (False, True):
            t0 = time.monotonic()
            with pytest.raises(ConnectionError):
                await AsyncLock(r, key, timeout=5, network_timeout=0.5).acquire(
                    blocking=blocking, blocking_timeout=5
                )
            assert time.monotonic() - t0 < 1.5

    with_async_client(port, main)


# ---------------------------------------------------------------- 3. once per period

CRON_JOB = textwrap.dedent(
    """
    import sys, time
    import redis
    from redis_lock_module import Lock

    port, start, skew, key, keep = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), sys.argv[4], sys.argv[5]
    time.sleep(max(0.0, start + skew - time.time()))
    r = redis.Redis(port=int(port), socket_timeout=5)
    lock = Lock(r, key, timeout=10, blocking=False, release_on_exit=(keep == "release"))
    try:
        with lock:
            r.incr(key + ":runs")
            time.sleep(0.5)  # the job
            print("ran")
    except Exception as e:  # not acquired: another server runs it this period
        print("skipped", type(e).__name__)
    """
)


def _cron(server, key, keep):
    start = time.time() + 3.0  # every process has started by then (2 cores, five starts)
    skews = [0.0, 0.3, 0.9, 1.4, 2.0]  # cron on five servers, 0-2 s apart
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CRON_JOB, str(server.port), str(start), str(s), key, keep],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=python_env(),
            text=True,
        )
        for s in skews
    ]
    outs = [p.communicate(timeout=30)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    return int(server.client().get(key + ":runs") or 0), outs


def test_once_per_period_across_five_processes(server, key):
    runs, outs = _cron(server, key, "keep")
    assert runs == 1, outs
    assert sum("ran" in o for o in outs) == 1
    # The lock stays until its lease ends: the period is the lease.
    assert 4_000 < lease_ms(server.client(), key) <= 10_000
    # The control: releasing when the job ends lets later servers run it again.
    runs, outs = _cron(server, key + ":control", "release")
    assert runs >= 2, outs


def test_release_on_exit_false_keeps_the_lock_and_stops_renewing(server, key):
    r = server.client()
    with Lock(r, key, timeout=0.6, auto_renew=True, release_on_exit=False) as lock:
        fence = lock.fence
        time.sleep(0.7)
        assert lock.owned(), "renewed while the work ran"
    assert raw_fence(server.port, key) == fence, "kept after the work"
    assert lock.token is None
    wait_until(lambda: raw_fence(server.port, key) is None, 2, "the lease ran out")


# ---------------------------------------------------------------- 6. timeout=None


def test_timeout_none_is_held_until_released(own_server, key):
    r = own_server.client()
    r.config_set("lock.default-ttl", 300)  # the lease the lock keeps renewing
    lost = []
    lock = Lock(r, key, on_lost=lambda lk, why: lost.append(why))
    assert lock.acquire(blocking=False)
    fence = lock.fence
    time.sleep(1.0)  # three leases
    assert lock.owned() and raw_fence(own_server.port, key) == fence
    # As redis-py's lock without a timeout: nothing to extend.
    with pytest.raises(LockError, match="no timeout"):
        lock.extend(1)
    with pytest.raises(LockError, match="no timeout"):
        lock.reacquire()
    lock.release()
    assert raw_fence(own_server.port, key) is None and lost == []
    # The loss signal: the lock taken away while held.
    with Lock(r, key, on_lost=lambda lk, why: lost.append(why), raise_on_release_error=False) as held:
        r.execute_command("LOCK.FORCERELEASE", key)
        assert held.wait_lost(2) == LOST_NOT_HELD
    assert lost == [LOST_NOT_HELD]


def test_timeout_none_with_redis_py_s_context_manager(own_server, key):
    """`with Lock(r, name): long_job()` after "changing the import" from redis-py."""
    r = own_server.client()
    r.config_set("lock.default-ttl", 200)
    with Lock(r, key) as lock:
        time.sleep(0.8)
        assert lock.owned()
    assert not lock.locked()

    async def main(ar):
        async with AsyncLock(ar, key) as alock:
            await __import__("asyncio").sleep(0.6)
            assert await alock.owned()
        assert not await alock.locked()

    with_async_client(own_server.port, main)

