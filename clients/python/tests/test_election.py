"""Leader election (sync and asyncio) and guarded writes against a real server: three
candidates elected in FIFO order as leaders resign, terms strictly increasing, an
observer that sees every leader, every proclaim and the gap (its LOCK.WATCH calls
counted in INFO commandstats), a leader SIGKILLed in a child process, a proclaim after
the leadership was lost, cancelled campaigns, an observer that survives a killed
connection and a MIGRATE of the key (LOCKMOVED); if_held / if_fence / check."""

import asyncio
import os
import queue
import signal
import subprocess
import sys
import threading
import time

import pytest
from redis.exceptions import LockNotOwnedError, ResponseError

from redis_lock_module import Election, Leader, Lock
from redis_lock_module.asyncio import Election as AsyncElection
from helpers import lease_ms, python_env, wait_until, with_async_client
from servers import Server


def watch_calls(r) -> int:
    stats = r.info("commandstats")
    return int(stats.get("cmdstat_lock.watch", {}).get("calls", 0))


def waiters(r, key) -> int:
    info = Lock(r, key).info()
    return 0 if info is None else int(info["waiters"])


def observe_in_thread(election, block):
    """The observer in a thread of its own: what it yields goes into a queue."""
    seen: "queue.Queue" = queue.Queue()
    stop = threading.Event()

    def run():
        for leader in election.observe(block=block, stop=stop):
            seen.put(leader)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return seen, stop, t


def test_guarded_writes_run_while_held_and_are_refused_after_the_lease(server, key):
    r = server.client()
    r.set("stock:9001", 10)
    a = Lock(r, key, timeout=1)
    assert a.acquire(blocking=False)
    fence_a = a.fence
    assert a.if_held("DECRBY", "stock:9001", 1) == 9
    assert a.if_fence(fence_a, "SET", "price:9001", 1999) in (b"OK", "OK")
    assert a.check() and Lock(r, key).check(fence_a)
    with pytest.raises(ResponseError, match="WRONGTYPE"):
        a.if_held("LPUSH", "stock:9001", "x")
    with pytest.raises(ValueError):
        a.if_held()

    # A pauses past its lease; B takes the lock and sells one unit.
    time.sleep(1.2)
    b = Lock(r, key, timeout=5)
    assert b.acquire(blocking=False)
    assert b.if_held("DECRBY", "stock:9001", 1) == 8
    # A wakes up: its guarded writes are refused and nothing runs.
    with pytest.raises(LockNotOwnedError) as refused:
        a.if_held("DECRBY", "stock:9001", 1)
    assert a.token.decode() not in str(refused.value)
    assert "did not run" in str(refused.value)
    assert a.lost_reason == "not-held"
    with pytest.raises(LockNotOwnedError):
        Lock(r, key).if_fence(fence_a, "SET", "price:9001", 1)
    assert int(r.get("stock:9001")) == 8 and int(r.get("price:9001")) == 1999
    assert not Lock(r, key).check(fence_a) and b.check()
    b.release()

    # A refused guarded write of a renewing lock reports the loss once.
    reasons = []
    c = Lock(r, key, timeout=5, auto_renew=True, on_lost=lambda lock, why: reasons.append(why))
    assert c.acquire(blocking=False)
    r.execute_command("LOCK.FORCERELEASE", key)
    with pytest.raises(LockNotOwnedError):
        c.if_held("SET", "other:data", 1)
    assert reasons == ["not-held"] and c.lost_reason == "not-held"
    assert r.get("other:data") is None


def test_three_candidates_lead_in_fifo_order_and_one_observer_sees_every_change(server, key):
    r = server.client()
    before = watch_calls(r)
    started = time.monotonic()
    block = 1.0
    e = Election(server.client(), key, ttl=2)
    seen, stop, t = observe_in_thread(Election(server.client(), key), block)
    assert seen.get(timeout=3) is None
    assert e.leader() is None

    # A 20 s lease: a hand-over that waited for it to run out (not the resign's release)
    # misses the 10 s bound below, which leaves room for a loaded machine's pauses.
    la = Election(server.client(), key, ttl=20).campaign("node-a")
    assert la is not None and la.is_leader()
    first = seen.get(timeout=3)
    assert first == Leader("node-a", la.term)
    assert e.leader() == first

    results = {}

    def candidate(name):
        results[name] = (Election(server.client(), key, ttl=2).campaign(name), time.monotonic())

    tb = threading.Thread(target=candidate, args=("node-b",))
    tb.start()
    wait_until(lambda: waiters(r, key) == 1, 3, "B queued")
    tc = threading.Thread(target=candidate, args=("node-c",))
    tc.start()
    wait_until(lambda: waiters(r, key) == 2, 3, "C queued")

    la.proclaim("node-a:8080")
    assert la.value == "node-a:8080"
    assert seen.get(timeout=3) == Leader("node-a:8080", la.term)
    assert e.leader() == Leader("node-a:8080", la.term)

    t0 = time.monotonic()
    assert la.resign()
    tb.join(15)
    lb, at = results["node-b"]
    handover = at - t0
    assert handover < 10.0, handover
    assert lb.term > la.term
    assert seen.get(timeout=3) == Leader("node-b", lb.term)

    assert lb.resign()
    tc.join(5)
    lc, _ = results["node-c"]
    assert lc.term > lb.term
    assert seen.get(timeout=3) == Leader("node-c", lc.term)

    assert lc.resign()
    assert seen.get(timeout=3) is None
    assert e.leader() is None

    # Six states (none, A, A's new value, B, C, none): the first from LOCK.INFO, then one
    # LOCK.WATCH per change (and one per `block` without a change, and the one pending).
    elapsed = time.monotonic() - started
    calls = watch_calls(r) - before
    assert 5 <= calls <= 5 + int(elapsed / block) + 2, (calls, elapsed)
    stop.set()
    t.join(block + 3)
    assert not t.is_alive()
    assert seen.empty()


def test_a_leader_killed_with_sigkill_keeps_its_term_until_its_lease_ends(server, key):
    code = (
        "import sys, time, redis\n"
        "from redis_lock_module import Election\n"
        f"l = Election(redis.Redis(port={server.port}), {key!r}, ttl=3).campaign('doomed')\n"
        "print(l.term, flush=True)\n"
        "time.sleep(60)\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, env=python_env(), text=True
    )
    try:
        term = int(child.stdout.readline())
        e = Election(server.client(), key, ttl=1)
        assert e.leader() == Leader("doomed", term)
        results = {}

        def heir():
            results["l"] = e.campaign("heir")
            results["at"] = time.monotonic()

        t = threading.Thread(target=heir)
        t.start()
        wait_until(lambda: waiters(server.client(), key) == 1, 3, "heir queued")
        # The heir is never elected before the lease read just before the kill ends
        # (timed from before the read; a renewal after it only moves the end later;
        # 20 ms for the server's ms clock). Up to 3 s were left, 2 s unless the child's
        # renewal ran late on a loaded machine (a fixed ">= 0.3 s after the kill" of a
        # 1 s lease failed then); the upper bound is a hang guard.
        sent = time.monotonic()
        left = lease_ms(server.client(), key)
        assert left is not None
        killed_at = time.monotonic()
        os.kill(child.pid, signal.SIGKILL)
        t.join(15)
        waited = results["at"] - killed_at
        assert results["at"] - sent >= left / 1000 - 0.02, (waited, left)
        assert waited <= 10, waited
        assert results["l"].term > term
        assert e.leader() == Leader("heir", results["l"].term)
        assert results["l"].resign()
    finally:
        child.kill()
        child.wait()


def test_proclaim_after_the_leadership_was_lost_fails(server, key):
    r = server.client()
    reasons = []
    e = Election(r, key, ttl=3)
    lead = e.campaign("node-a", on_lost=lambda l, why: reasons.append((l, why)))
    r.execute_command("LOCK.FORCERELEASE", key)
    with pytest.raises(LockNotOwnedError, match="not published"):
        lead.proclaim("node-a:2")
    assert reasons == [(lead, "not-held")] and lead.lost_reason == "not-held"
    assert not lead.is_leader() and lead.value == "node-a"
    assert e.leader() is None
    # Once lost, it fails without asking the server; resigning has nothing to give up.
    with pytest.raises(LockNotOwnedError):
        lead.proclaim("node-a:3")
    assert not lead.resign()
    with pytest.raises(ValueError):
        e.campaign("")
    # Not elected within the timeout: None, and the candidate left the queue.
    holder = Lock(r, key, timeout=5)
    assert holder.acquire(blocking=False)
    t = time.monotonic()
    assert e.campaign("late", timeout=0.3) is None
    assert time.monotonic() - t >= 0.28
    assert waiters(r, key) == 0
    holder.release()


def test_asyncio_election_cancelled_campaign_and_an_observer_that_survives(key):
    server = Server()
    other = Server()
    try:

        async def main(r):
            t0 = time.monotonic()
            before = watch_calls(server.client())
            e = AsyncElection(r, key, ttl=2)
            seen: asyncio.Queue = asyncio.Queue()
            changes = e.observe(block=0.3)

            async def observe():
                async for leader in changes:
                    await seen.put(leader)

            watcher = asyncio.ensure_future(observe())
            assert await asyncio.wait_for(seen.get(), 3) is None
            # Quiet periods: each 0.3 s BLOCK ends without a change, nothing is yielded,
            # the observer asks again (at least twice: polled, a loaded machine may take
            # more than the 1 s for it), and once per BLOCK, not in a busy loop (the bound
            # follows the time taken).
            await asyncio.sleep(1.0)
            limit = time.monotonic() + 10
            while watch_calls(server.client()) - before < 2:
                assert time.monotonic() < limit, "no two quiet BLOCKs in 10 s"
                await asyncio.sleep(0.05)
            assert seen.empty()
            quiet = watch_calls(server.client()) - before
            elapsed = time.monotonic() - t0
            assert quiet <= int(elapsed / 0.3) + 2, (quiet, elapsed)

            la = await AsyncElection(r, key, ttl=20).campaign("node-a")
            assert await asyncio.wait_for(seen.get(), 3) == Leader("node-a", la.term)
            assert await e.leader() == Leader("node-a", la.term)
            lb_task = asyncio.ensure_future(AsyncElection(r, key, ttl=2).campaign("node-b"))
            while waiters(server.client(), key) != 1:
                await asyncio.sleep(0.01)
            # A cancelled campaign leaves the queue.
            lc_task = asyncio.ensure_future(AsyncElection(r, key, ttl=2).campaign("node-c"))
            while waiters(server.client(), key) != 2:
                await asyncio.sleep(0.01)
            lc_task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await lc_task
            while waiters(server.client(), key) != 1:
                await asyncio.sleep(0.01)

            await la.proclaim("node-a:8080")
            assert await asyncio.wait_for(seen.get(), 3) == Leader("node-a:8080", la.term)
            # The observer's connection is killed: it reconnects and goes on.
            clients = server.client().client_list()
            ids = [c["id"] for c in clients if c.get("cmd") == "lock.watch"]
            assert len(ids) == 1
            server.client().client_kill_filter(_id=ids[0])
            # At once after the resign: within 10 s (a loaded machine's pauses), well
            # before A's 20 s lease could end.
            t0 = time.monotonic()
            assert await la.resign()
            lb = await asyncio.wait_for(lb_task, 15)
            assert time.monotonic() - t0 < 10.0
            assert lb.term > la.term
            assert await asyncio.wait_for(seen.get(), 3) == Leader("node-b", lb.term)
            # The key moves to another server: LOCKMOVED, then nobody leads here.
            server.client().migrate("127.0.0.1", other.port, key, 0, 5000)
            assert await asyncio.wait_for(seen.get(), 3) is None
            assert not await lb.resign()
            assert await e.leader() is None
            # The caller stops: the generator closes its connection.
            watcher.cancel()
            with pytest.raises(asyncio.CancelledError):
                await watcher
            await changes.aclose()
            await asyncio.sleep(0.1)
            left = [c for c in server.client().client_list() if c.get("cmd") == "lock.watch"]
            assert left == []

        with_async_client(server.port, main)
    finally:
        other.close()
        server.close()
