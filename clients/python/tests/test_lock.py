"""The synchronous Lock against a real server with the module loaded."""

import socket
import threading
import time

import pytest
import redis
from redis.exceptions import LockError, LockNotOwnedError

from redis_lock_module import LOST_CAP, LOST_FAILED, LOST_NOT_HELD, Lock
from helpers import lease_ms
from servers import acquire_in_thread, raw_fence


def test_acquire_release_and_the_exact_fence(server, key):
    r = server.client()
    lock = Lock(r, key, timeout=5)
    with pytest.raises(LockError, match="never acquired"):
        lock.fence  # an int when there is one (typed int): none before the first grant
    assert lock.acquire(blocking=False)
    assert isinstance(lock.fence, int)
    # The fence the server stored, read from the raw RESP bytes.
    fence = raw_fence(server.port, key)
    assert lock.fence == fence
    assert lock.locked() and lock.owned()
    lock.release()
    assert not lock.locked()
    assert raw_fence(server.port, key) is None
    assert lock.fence == fence, "the last grant's, after the release"


def test_consecutive_fences_differ_and_increase(server, key):
    r = server.client()
    fences = []
    for _ in range(30):
        lock = Lock(r, key, timeout=5)
        assert lock.acquire(blocking=False)
        assert raw_fence(server.port, key) == lock.fence
        fences.append(lock.fence)
        lock.release()
    assert all(a < b for a, b in zip(fences, fences[1:])), fences


def test_redis_py_lock_api(server, key):
    r = server.client()
    # redis-py's own factory takes our class.
    lock = r.lock(key, timeout=5, lock_class=Lock)
    assert isinstance(lock, Lock)
    with lock as held:
        assert held is lock and lock.owned()
        other = r.lock(key, timeout=5, blocking=False, lock_class=Lock)
        assert not other.acquire()
        with pytest.raises(LockError, match="Unable to acquire"):
            with other:
                pass
        assert not other.owned() and other.locked()
    assert not lock.locked()
    # Release without holding: redis-py's own exception types.
    with pytest.raises(LockError):
        lock.release()
    assert issubclass(LockNotOwnedError, redis.exceptions.LockError)
    with pytest.raises(LockError):
        lock.extend(1)
    with pytest.raises(LockError):
        lock.reacquire()


def test_extend_adds_or_replaces_and_reacquire_resets(server, key):
    r = server.client()
    lock = Lock(r, key, timeout=2)
    assert lock.acquire()
    assert lock.extend(10)  # adds to what is left (~2 s)
    assert 11_000 < lease_ms(r, key) <= 12_000
    assert lock.extend(3, replace_ttl=True)
    assert 2_000 < lease_ms(r, key) <= 3_000
    assert lock.reacquire()
    assert 1_000 < lease_ms(r, key) <= 2_000
    fence = lock.fence
    assert raw_fence(server.port, key) == fence, "extending keeps the fence"
    lock.release()


def test_not_owned_after_forcerelease(server, key):
    r = server.client()
    lock = Lock(r, key, timeout=5)
    assert lock.acquire()
    assert r.execute_command("LOCK.FORCERELEASE", key) == 1
    assert not lock.owned()
    with pytest.raises(LockNotOwnedError):
        lock.extend(1)
    with pytest.raises(LockNotOwnedError):
        lock.reacquire()
    with pytest.raises(LockNotOwnedError):
        lock.release()
    # raise_on_release_error=False only logs when the context manager exits.
    quiet = Lock(r, key, timeout=5, raise_on_release_error=False)
    with quiet:
        r.execute_command("LOCK.FORCERELEASE", key)


def test_a_retry_with_the_same_token_is_a_renew(server, key):
    r = server.client()
    a = Lock(r, key, timeout=5)
    assert a.acquire(token="retry-token-00000001")
    assert a.token == b"retry-token-00000001"
    # What redis-py's retry after a lost reply sends again: the same TOKEN.
    again = Lock(r, key, timeout=5)
    assert again.acquire(blocking=False, token="retry-token-00000001")
    assert again.fence == a.fence
    assert Lock(r, key).acquire(blocking=False) is False
    a.release()


def test_owner_and_info(server, key):
    r = server.client()
    lock = Lock(r, key, timeout=5, owner="worker-7")
    assert lock.acquire()
    info = lock.info()
    assert info["owner"] == "worker-7"
    assert int(info["fence"]) == lock.fence
    assert 4_000 < lease_ms(r, key) <= 5_000
    lock.release()


def test_decode_responses_and_resp3(server, key):
    options = [{"decode_responses": True}]
    if int(redis.__version__.split(".")[0]) >= 5:  # RESP3 (protocol=) came in redis-py 5
        options.append({"protocol": 3})
    for kw in options:
        r = server.client(**kw)
        lock = Lock(r, key, timeout=5)
        assert lock.acquire(blocking_timeout=1)
        assert lock.fence == raw_fence(server.port, key)
        assert lock.owned()
        assert lock.extend(1)
        lock.release()


def test_thread_local_token(server, key):
    r = server.client()
    lock = Lock(r, key, timeout=5)
    assert lock.acquire()
    seen = []
    t = threading.Thread(target=lambda: seen.append((lock.token, lock.owned())))
    t.start()
    t.join()
    assert seen == [(None, False)], "another thread does not see this thread's token"
    shared = Lock(r, key + "b", timeout=5, thread_local=False)
    assert shared.acquire()
    t = threading.Thread(target=shared.release)
    t.start()
    t.join()
    assert not shared.locked()
    lock.release()


def test_block_hand_off_in_fifo_order(server, key):
    r = server.client()
    holder = Lock(r, key, timeout=10)
    assert holder.acquire()
    order, fences = [], {}

    def wait(i):
        lock = Lock(r, key, timeout=10)
        assert lock.acquire(blocking_timeout=10)
        order.append(i)
        fences[i] = lock.fence
        time.sleep(0.05)
        lock.release()

    threads = []
    for i in range(3):
        t = threading.Thread(target=wait, args=(i,))
        t.start()
        threads.append(t)
        deadline = time.monotonic() + 5
        while int(holder.info()["waiters"]) < i + 1:
            assert time.monotonic() < deadline
            time.sleep(0.01)
    t0 = time.monotonic()
    first = holder.fence
    holder.release()
    for t in threads:
        t.join(10)
    assert order == [0, 1, 2], "the server hands the lock over in arrival order"
    assert first < fences[0] < fences[1] < fences[2]
    assert time.monotonic() - t0 < 2


def test_wait_times_out_and_leaves_no_waiter(server, key):
    r = server.client()
    holder = Lock(r, key, timeout=10)
    assert holder.acquire()
    t0 = time.monotonic()
    assert not Lock(r, key).acquire(blocking_timeout=0.3)
    took = time.monotonic() - t0
    assert 0.29 <= took < 1.5, took
    assert int(holder.info()["waiters"]) == 0
    holder.release()


def test_blocking_uses_its_own_connection_with_a_timeout_above_block(server, key):
    # A one-connection pool and a read timeout (0.2 s) well below the wait (1 s).
    pool = redis.BlockingConnectionPool(port=server.port, max_connections=1, timeout=2, socket_timeout=0.2)
    r = redis.Redis(connection_pool=pool)
    holder = Lock(r, key, timeout=10)
    assert holder.acquire()
    # The control: the plain command on that client gives up long before BLOCK ends.
    with pytest.raises(redis.exceptions.TimeoutError):
        r.execute_command("LOCK.ACQUIRE", key, "TOKEN", "plain-token-000001", "BLOCK", 1000)
    result = {}

    def wait():
        t0 = time.monotonic()
        result["ok"] = Lock(r, key, timeout=5).acquire(blocking_timeout=1.0)
        result["took"] = time.monotonic() - t0

    t = threading.Thread(target=wait)
    t.start()
    time.sleep(0.3)
    # The pool's only connection is free while the waiter blocks.
    assert r.ping()
    t.join(5)
    assert result["ok"] is False and 0.95 <= result["took"] < 2.5, result
    holder.release()


def _abandoned_block(port, key, block_ms):
    """What a client with a short command timeout leaves behind: BLOCK sent, reply
    never read, connection kept open (ioredis commandTimeout, valkey-glide)."""
    s = socket.create_connection(("127.0.0.1", port))
    args = ["LOCK.ACQUIRE", key, "PX", "30000", "TOKEN", "abandoned-token-01", "BLOCK", str(block_ms)]
    s.sendall(("*%d\r\n" % len(args) + "".join("$%d\r\n%s\r\n" % (len(a), a) for a in args)).encode())
    return s


def _handed_off(r):
    return int(r.info("lock")["lock_handed_off"])


def test_no_orphan_after_a_client_side_timeout(own_server, key):
    """The server stops (SIGSTOP) while a client waits; the holder's lease and the
    client's own limit both pass. The control: a client that gave up on its own while
    its BLOCK still runs on the server is handed the lock on resume and holds it, unseen.
    Ours: BLOCK is the client's own limit, so the server ends the wait (its deadline is
    due before the lease's end is seen after a stall) and hands nothing to anyone who
    gave up; the LOCK.RELEASE queued behind the wait would free a late grant, and the
    lock is free at once either way."""
    r = own_server.client()
    # The control: an abandoned waiter (its BLOCK longer than the stop) ends up holding
    # the lock.
    r.execute_command("LOCK.ACQUIRE", key, "PX", "300", "TOKEN", "holder-token-0001")
    s = _abandoned_block(own_server.port, key, 5000)
    time.sleep(0.1)
    own_server.stop()
    time.sleep(1.3)
    own_server.cont()
    time.sleep(0.2)
    info = Lock(r, key).info()
    assert info is not None and int(info["ttl"]) > 20_000, f"orphaned grant expected, got {info}"
    s.close()
    r.execute_command("LOCK.FORCERELEASE", key)

    # Our client in the same situation.
    r.execute_command("LOCK.ACQUIRE", key, "PX", "300", "TOKEN", "holder-token-0001")
    before = _handed_off(r)
    lock = Lock(r, key, timeout=30, network_timeout=1.0)
    t, out = acquire_in_thread(lock, blocking_timeout=1.0)
    time.sleep(0.1)
    own_server.stop()
    # Past BLOCK (1 s) + network_timeout (1 s): the client gave up and sent LOCK.RELEASE;
    # it waits network_timeout more for the late replies, so resume well within that.
    time.sleep(2.4)
    own_server.cont()
    t.join(5)
    assert out == {"ok": False}
    assert _handed_off(r) == before, "no grant to a waiter whose BLOCK ended in the stall"
    assert lock.info() is None, "the lock is free"
    second = Lock(r, key, timeout=5)
    assert second.acquire(blocking=False)
    second.release()


def test_auto_renewal_keeps_the_lock_and_release_stops_it(server, key):
    # A 1.5 s lease, renewed every 0.5 s: a renewal may come 1 s late (a loaded CI
    # machine) before the lease runs out; 300 ms left 0.2 s. Held until a check sent two
    # leases after the grant finds it still ours.
    r = server.client()
    lost = []
    lock = Lock(r, key, timeout=1.5, auto_renew=True, on_lost=lambda l, why: lost.append(why))
    assert lock.acquire()
    granted = time.monotonic()
    while True:
        time.sleep(0.2)
        sent = time.monotonic() - granted
        assert lock.owned(), f"renewed past its 1.5 s lease: lost {sent:.2f} s after the grant"
        if sent > 3.0:
            break
    lock.release()
    time.sleep(0.3)
    assert not lock.locked() and lost == []


def test_loss_callback_when_the_lock_is_taken_away(server, key):
    r = server.client()
    lost = threading.Event()
    reasons = []

    def on_lost(lk, why):
        reasons.append(why)
        lost.set()

    lock = Lock(r, key, timeout=0.6, auto_renew=True, on_lost=on_lost)
    assert lock.acquire()
    r.execute_command("LOCK.FORCERELEASE", key)
    assert lost.wait(2)
    assert reasons == [LOST_NOT_HELD] and lock.lost_reason == LOST_NOT_HELD


def test_cap_on_the_total_hold(server, key):
    # A 1.5 s lease capped at 3.5 s (a renewal may come 1 s late on a loaded machine
    # without losing the lease first; 300 ms left 0.2 s): lost at the cap, never before,
    # and the lease then runs out on the server.
    r = server.client()
    lock = Lock(r, key, timeout=1.5, auto_renew=True, max_hold=3.5)
    t0 = time.monotonic()
    assert lock.acquire()
    assert lock.wait_lost(15) == LOST_CAP
    took = time.monotonic() - t0
    assert 3.45 < took < 15, took
    deadline = time.monotonic() + 10
    while lock.locked():
        assert time.monotonic() < deadline, "the lease runs out on the server by the cap"
        time.sleep(0.01)


def test_loss_callback_when_the_server_dies(own_server, key):
    r = own_server.client()
    lock = Lock(r, key, timeout=1, auto_renew=True, network_timeout=0.3)
    assert lock.acquire()
    own_server.kill()
    assert lock.wait_lost(3) == LOST_FAILED


def test_invalid_options():
    with pytest.raises(ValueError):
        Lock(None, "k", shared=True, limit=2)
    with pytest.raises(ValueError):
        Lock(None, "k", limit=0)
    with pytest.raises(ValueError):
        Lock(None, "k", timeout=5, max_hold=5)
    with pytest.raises(ValueError):
        Lock(None, "k", replicas=-1)
    with pytest.raises(ValueError):
        Lock(None, "k", timeout=0)
