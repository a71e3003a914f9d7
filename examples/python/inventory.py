#!/usr/bin/env python3
"""Safe inventory deduction with the redis-lock module and its Python package.

"Lock product:9001, check stock, deduct, release": every checkout takes the product's
lock with redis_lock_module.Lock (the API of redis-py's Lock; it waits in the module's
FIFO queue with BLOCK), reads the stock, and writes the new stock with
``lock.if_held("SET", ...)``: LOCK.IFHELD runs the write only while the lock's token
still holds the lock, in the same atomic step on the server.

That is what makes the lock safe when a holder pauses past its lease (a GC pause, a
stalled VM): the lease ends, someone else takes the lock and sells a unit, and the
paused holder's late write, computed from the stock it read before the pause, is
refused (NOTHELD: nothing runs) instead of silently undoing the other sale. No fenced
store, no Lua: the check is the server's. For a store outside Redis, pass ``lock.fence``
with the write and have the store refuse a fence lower than the highest it has seen.

Run against a server with the module loaded (pip install ./clients/python first):
    REDIS_URL=redis://127.0.0.1:6379 python3 examples/python/inventory.py
Exits non-zero if any check fails (`make test-examples` runs it against a fresh server).
"""

import os
import threading
import time

import redis
from redis_lock_module import Lock, LockError, LockNotOwnedError

from checks import check, run_checks

URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379")
SKU = "9001"
# One hash tag for the lock and the data it guards: in a Redis Cluster LOCK.IFHELD needs
# them in one slot (on one server it changes nothing).
LOCK = f"lock:product:{{{SKU}}}"
STOCK = f"stock:{{{SKU}}}"

def connect():
    return redis.Redis.from_url(URL, decode_responses=True, socket_timeout=15)


def stock(r):
    return int(r.get(STOCK))


def checkout(order_id, results):
    """One customer buying one unit: lock, check stock, deduct, release."""
    r = connect()
    # A 5 s lease; wait up to 10 s in the FIFO queue.
    lock = Lock(r, LOCK, timeout=5, blocking_timeout=10, owner=order_id)
    try:
        with lock:
            left = stock(r)
            if left <= 0:
                results[order_id] = "sold-out"
                return
            time.sleep(0.01)  # the rest of a checkout: payment, ...
            lock.if_held("SET", STOCK, left - 1)  # refused if the lease ended meanwhile
            results[order_id] = "bought"
    except LockNotOwnedError:
        results[order_id] = "lease-lost"
    except LockError:
        results[order_id] = "timeout"


def concurrent_checkouts():
    print("== 16 concurrent checkouts for 10 units")
    r = connect()
    r.set(STOCK, 10)
    results = {}
    threads = [
        threading.Thread(target=checkout, args=(f"order-{1040 + i}", results))
        for i in range(16)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    bought = sum(1 for v in results.values() if v == "bought")
    sold_out = sum(1 for v in results.values() if v == "sold-out")
    check(len(results) == 16, f"every checkout finished ({len(results)}/16)")
    check(bought == 10, f"exactly 10 units sold (sold {bought})")
    check(sold_out == 6, f"6 customers told 'sold out' (told {sold_out})")
    check(stock(r) == 0, f"stock is 0, never negative (stock {stock(r)})")
    check(not Lock(connect(), LOCK).locked(), "the lock is free afterwards")


def paused_holder():
    print("== a holder pauses past its lease; its late write is refused by LOCK.IFHELD")
    r = connect()
    r.set(STOCK, 5)

    # A takes the lock with a short lease and reads the stock...
    a = Lock(r, LOCK, timeout=0.2, owner="A")
    check(a.acquire(blocking=False), "A took the lock")
    seen_by_a = stock(r)
    # ...then stalls (GC pause, swapped-out VM) for longer than the lease.
    time.sleep(0.4)
    check(not a.locked(), "A's lease ended during the pause")

    # B takes the lock (a higher fence) and sells one unit, guarded the same way.
    b = Lock(r, LOCK, timeout=5, owner="B")
    check(b.acquire(blocking=False), "B took the lock")
    check(b.fence > a.fence, f"B's fence {b.fence} > A's fence {a.fence}")
    b.if_held("SET", STOCK, stock(r) - 1)
    b.release()

    # A wakes up and writes what it computed before the pause: nothing runs.
    try:
        a.if_held("SET", STOCK, seen_by_a - 1)
        check(False, "A's late write was refused")
    except LockNotOwnedError as e:
        check("did not run" in str(e), f"A's late write was refused ({e})")
    check(stock(r) == 4, f"stock is 4: B's sale counted once (stock {stock(r)})")
    check(a.lost_reason == "not-held", f"A's lock counts as lost ({a.lost_reason})")
    # A cannot release what it no longer holds (the token is the capability).
    try:
        a.release()
        check(False, "A's release is refused")
    except LockNotOwnedError:
        check(True, "A's release is refused (LockNotOwnedError)")


def info_shows_the_holder():
    print("== LOCK.INFO shows who holds the lock, never the token")
    r = connect()
    lock = Lock(r, LOCK, timeout=5, owner="order-1042")
    with lock:
        info = lock.info()
        check(info.get("owner") == "order-1042", f"owner is order-1042 ({info.get('owner')})")
        check(int(info.get("fence")) == lock.fence, "the fence matches the grant")
        check(lock.token.decode() not in [str(v) for v in info.values()], "the token is not revealed")
        check(lock.check(), "LOCK.CHECK says the fence holds")
    check(not lock.locked(), "released")


def main(r):
    r.delete(LOCK)
    concurrent_checkouts()
    paused_holder()
    info_shows_the_holder()


if __name__ == "__main__":
    run_checks(URL, connect(), main)
