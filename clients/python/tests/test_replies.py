"""The defaults that read what the server itself answers, against real servers: no
credential or token in any error or log line (a wrong password, the server gone), a
missing module named as such (the server's own unknown-command error), grants confirmed
on the replicas (ROLE, WAIT) and surviving a failover (issue 22 items 2, 9 and issue 20
item 3). These replies are what differs between servers, so this file runs on every
server of the Makefile's PKG_TEST_SERVERS (PY_TESTS_EVERY_SERVER); the rest of the
defaults is in test_defaults.py."""

import logging
import threading
import time
import traceback

import pytest
import redis

from helpers import Pair, PlainServer, timed, wait_until, with_async_client
from redis_lock_module import Election, Lock, LockNotConfirmedError, ModuleNotLoadedError
from redis_lock_module.asyncio import Lock as AsyncLock
from servers import raw_fence

SECRET_TOKEN = "secret-token-4f1c2a9e7d"
PASSWORD = "hunter2-pass-8c1e"


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
        errors.append(timed(call)[1])
    own_server.kill()
    for call in (
        lambda: Lock(r, key, network_timeout=0.5).acquire(blocking=False, token=SECRET_TOKEN),
        lambda: Lock(r, key, network_timeout=0.5).acquire(blocking_timeout=1, token=SECRET_TOKEN),
        lock.release,
    ):
        errors.append(timed(call)[1])
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

