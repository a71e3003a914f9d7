"""What the lock does by default, against real servers: every call bounded while the
server is down or stopped; no credential or token in any error or log line; a missing
module named as such; timeout=None held until released; once-per-period runs with
release_on_exit=False; grants confirmed on the replicas (WAIT) and surviving a
failover (issue 22 items 1-3, 6, 9 and issue 20 item 3)."""

import logging
import os
import subprocess
import sys
import textwrap
import threading
import time
import traceback

import pytest
import redis
from redis.exceptions import ConnectionError, LockError, TimeoutError

from helpers import Pair, PlainServer, lease_ms, python_env, wait_until
from redis_lock_module import (
    LOST_NOT_HELD,
    Election,
    Lock,
    LockNotConfirmedError,
    ModuleNotLoadedError,
)
from redis_lock_module.asyncio import Lock as AsyncLock
from helpers import with_async_client
from servers import Server, raw_fence

SECRET_TOKEN = "secret-token-4f1c2a9e7d"
PASSWORD = "hunter2-pass-8c1e"


def _timed(fn):
    t0 = time.monotonic()
    try:
        fn()
    except Exception as e:  # the caller checks what was raised
        return time.monotonic() - t0, e
    return time.monotonic() - t0, None


# ---------------------------------------------------------------- 1. bounded calls


def test_every_call_is_bounded_while_the_server_is_down(own_server, key):
    # A client with no limits of its own and redis-py's default retries.
    r = redis.Redis(port=own_server.port)
    held = Lock(r, key + ":held", timeout=30, network_timeout=0.5)
    assert held.acquire(blocking=False)
    own_server.kill()
    plain, plain_error = _timed(r.ping)
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
        took, error = _timed(call)
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
            took, error = _timed(call)
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


# ---------------------------------------------------------------- 2. nothing secret in errors


def _all_text(e: BaseException) -> str:
    return "".join(traceback.format_exception(type(e), e, e.__traceback__)) + repr(e)


def test_no_credential_or_token_in_errors_or_logs(own_server, key, caplog):
    caplog.set_level(logging.DEBUG)
    admin = own_server.client()
    admin.config_set("requirepass", PASSWORD)
    r = redis.Redis(port=own_server.port, password=PASSWORD)
    lock = Lock(r, key, timeout=5, network_timeout=0.5)
    assert lock.acquire(blocking=False, token=SECRET_TOKEN)
    errors = []
    # A wrong password, then the server gone.
    wrong = redis.Redis(port=own_server.port, password=PASSWORD + "-wrong")
    for call in (
        lambda: Lock(wrong, key, network_timeout=0.5).acquire(blocking=False),
        lambda: Lock(wrong, key, network_timeout=0.5).acquire(blocking_timeout=1),
    ):
        errors.append(_timed(call)[1])
    own_server.kill()
    for call in (
        lambda: Lock(r, key, network_timeout=0.5).acquire(blocking=False, token=SECRET_TOKEN),
        lambda: Lock(r, key, network_timeout=0.5).acquire(blocking_timeout=1, token=SECRET_TOKEN),
        lock.release,
    ):
        errors.append(_timed(call)[1])
    assert all(e is not None for e in errors), errors
    for e in errors:
        text = _all_text(e)
        assert PASSWORD not in text and SECRET_TOKEN not in text, text
    logged = "\n".join(rec.getMessage() for rec in caplog.records)
    assert PASSWORD not in logged and SECRET_TOKEN not in logged


def test_a_missing_module_is_named_without_echoing_arguments(key):
    plain = PlainServer()
    try:
        r = redis.Redis(port=plain.port, socket_timeout=5)
        # The control: the server's own message echoes the arguments, the token too.
        with pytest.raises(redis.exceptions.ResponseError) as raw:
            r.execute_command("LOCK.ACQUIRE", key, "PX", 1000, "TOKEN", SECRET_TOKEN)
        assert SECRET_TOKEN in str(raw.value)
        for blocking in (False, True):
            with pytest.raises(ModuleNotLoadedError) as e:
                Lock(r, key, timeout=1).acquire(
                    blocking=blocking, blocking_timeout=1, token=SECRET_TOKEN
                )
            assert f"the redis-lock module is not loaded on localhost:{plain.port}" in str(
                e.value
            ) or f"not loaded on 127.0.0.1:{plain.port}" in str(e.value), str(e.value)
            assert SECRET_TOKEN not in _all_text(e.value)
        with pytest.raises(ModuleNotLoadedError):
            Lock(r, key).info()
        # An observer's LOCK.WATCH says so too, before any change is seen.
        watch = Election(r, key).observe(block=1)
        with pytest.raises(ModuleNotLoadedError) as e:
            next(watch)
        # The server's own text (not kept) echoes the arguments, the key among them.
        assert "not loaded on" in str(e.value) and key not in _all_text(e.value)
    finally:
        plain.close()


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


# ---------------------------------------------------------------- 9. confirmed grants


@pytest.fixture
def pair():
    p = Pair()
    yield p
    p.close()


def test_a_grant_is_confirmed_on_the_replica_or_given_back(pair, key):
    r = pair.primary.client()
    # The control: the replica running, the default lock is confirmed and returned.
    ok = Lock(r, key + ":ok", timeout=10, network_timeout=0.5)
    assert ok.acquire(blocking=False)
    wait_until(lambda: raw_fence(pair.replica.port, key + ":ok") == ok.fence, 2, "on the replica")
    ok.release()
    pair.replica.stop()
    try:
        for blocking in (False, True):
            lock = Lock(r, key, timeout=10, network_timeout=0.5)
            t0 = time.monotonic()
            with pytest.raises(LockNotConfirmedError, match="0 of 1 replica"):
                lock.acquire(blocking=blocking, blocking_timeout=1)
            assert time.monotonic() - t0 < 0.5 * 2 + 1.5
            assert raw_fence(pair.primary.port, key) is None, "the grant was given back"
            assert not lock.owned() and lock.token is None
        # Asked for: no confirmation, the grant is returned at once.
        unconfirmed = Lock(r, key, timeout=10, confirm=False)
        assert unconfirmed.acquire(blocking=False)
        assert raw_fence(pair.primary.port, key) == unconfirmed.fence
        unconfirmed.release()
    finally:
        pair.replica.cont()


def test_expected_replicas_that_are_not_connected_are_an_error(pair, key):
    r = pair.primary.client()
    with pytest.raises(LockNotConfirmedError, match=r"2 replica\(s\) expected \(replicas=\) but 1"):
        Lock(r, key, timeout=5, replicas=2).acquire(blocking=False)
    assert raw_fence(pair.primary.port, key) is None, "nothing was acquired"
    lock = Lock(r, key, timeout=5, replicas=1)
    assert lock.acquire(blocking=False)
    lock.release()


def test_a_hand_off_is_confirmed_too(pair, key):
    r = pair.primary.client()
    holder = Lock(r, key, timeout=10)
    assert holder.acquire()
    out = {}

    def wait():
        w = Lock(r, key, timeout=10, network_timeout=0.5)
        try:
            out["ok"] = w.acquire(blocking_timeout=5)
        except LockNotConfirmedError as e:
            out["error"] = e

    t = threading.Thread(target=wait)
    t.start()
    wait_until(lambda: int(holder.info()["waiters"]) == 1, 5, "the waiter queued")
    pair.replica.stop()
    try:
        holder.release()  # the server hands the lock to the waiter
        t.join(10)
        assert "error" in out, out
        assert raw_fence(pair.primary.port, key) is None, "the hand-off was given back"
    finally:
        pair.replica.cont()


def test_a_replica_in_its_full_sync_is_not_counted(key):
    """The replicas that confirm are those online (`state=online`): one still in its first
    full sync is not counted, so locks are granted (unconfirmed: nothing can confirm them
    yet) instead of failing until the sync ends; the replica gets them with its sync."""
    pair = Pair(syncing=True)
    try:
        r = pair.primary.client()
        held = []
        for blocking in (False, True):
            lock = Lock(r, f"{key}:{blocking}", timeout=30, network_timeout=0.5)
            assert lock.acquire(blocking=blocking, blocking_timeout=1)
            held.append(lock)

        async def main(ar):
            for blocking in (False, True):
                lock = AsyncLock(ar, f"{key}:async:{blocking}", timeout=30, network_timeout=0.5)
                assert await lock.acquire(blocking=blocking, blocking_timeout=1)
                held.append(lock)

        with_async_client(pair.primary.port, main)
        # A deployment that expects a replica refuses before acquiring anything.
        with pytest.raises(LockNotConfirmedError, match=r"1 replica\(s\) expected \(replicas=\) but 0 online"):
            Lock(r, key + ":n", timeout=30, replicas=1, network_timeout=0.5).acquire(blocking=False)
        assert raw_fence(pair.primary.port, key + ":n") is None
        assert pair.replica_state() == "wait_bgsave", "all of it ran during the sync"
        pair.finish_sync()
        for lock in held:
            assert raw_fence(pair.replica.port, lock.name) == lock.fence, lock.name
    finally:
        pair.close()


def test_confirmed_grants_survive_a_failover(pair, key):
    r = pair.primary.client()
    locks = []
    for i in range(30):
        lock = Lock(r, f"{key}:{i}", timeout=60)
        assert lock.acquire(blocking=i % 2 == 0, blocking_timeout=1)
        locks.append(lock)
    pair.primary.kill()  # right after the last grant returned
    pair.promote()
    for lock in locks:
        assert raw_fence(pair.replica.port, lock.name) == lock.fence, lock.name
