#!/usr/bin/env python3
"""Safe inventory deduction with the redis-lock module and its Python package.

"One checkout at a time per product": every checkout takes the product's lock with
redis_lock_module.Lock (the API of redis-py's Lock; it waits in the module's FIFO queue
with BLOCK), reads the stock, writes the new stock with the lock's fence, and releases.

The write goes to a *fenced store*: it carries the lock's fencing token and the store
rejects any write whose fence is lower than the highest it has accepted. That is what
makes the lock safe when a holder pauses past its lease (a GC pause, a stalled VM):
the lease expires, someone else takes the lock with a higher fence and writes, and the
paused holder's late write is refused instead of silently undoing the other's work.
Here the store is a Redis hash updated by a small script; in production it is your
database, e.g.
    UPDATE inventory SET stock = :stock, fence = :fence WHERE sku = :sku AND fence <= :fence

Run against a server with the module loaded (pip install ./clients/python first):
    REDIS_URL=redis://127.0.0.1:6379 python3 examples/python/inventory.py
Exits non-zero if any check fails (`make test-examples` runs it against a fresh server).
"""

import os
import sys
import threading
import time

import redis
from redis_lock_module import Lock, LockError, LockNotOwnedError

URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379")
SKU = "9001"
LOCK = f"lock:product:{SKU}"
STORE = f"inventory:{SKU}"

# Fences can be above 2^53 (servers that started on an older release count on from
# there): beyond a Lua number's precision, so the script compares them as decimal
# strings (longer is larger, else lexicographic). Python's int is exact at any size.
FENCED_WRITE = """
local function less(a, b)
  if #a ~= #b then return #a < #b end
  return a < b
end
local highest = redis.call('HGET', KEYS[1], 'fence') or '0'
if less(ARGV[1], highest) then
  return redis.error_reply('STALE fence ' .. ARGV[1] .. ' is lower than ' .. highest)
end
redis.call('HSET', KEYS[1], 'fence', ARGV[1], 'stock', ARGV[2])
return 1
"""

failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)


def connect():
    return redis.Redis.from_url(URL, decode_responses=True, socket_timeout=15)


class FencedStore:
    """The downstream store: accepts a write only with a fence >= the highest seen."""

    def __init__(self, r):
        self.r = r
        self.write_script = r.register_script(FENCED_WRITE)

    def reset(self, stock):
        self.r.delete(STORE)
        self.r.hset(STORE, mapping={"stock": stock, "fence": 0})

    def stock(self):
        return int(self.r.hget(STORE, "stock"))

    def write_stock(self, stock, fence):
        self.write_script(keys=[STORE], args=[fence, stock])


def checkout(order_id, results):
    """One customer buying one unit."""
    r = connect()
    store = FencedStore(r)
    # A 5 s lease; wait up to 10 s in the FIFO queue.
    lock = Lock(r, LOCK, timeout=5, blocking_timeout=10, owner=order_id)
    try:
        with lock:
            stock = store.stock()
            if stock <= 0:
                results[order_id] = "sold-out"
                return
            time.sleep(0.01)  # the rest of a checkout: payment, ...
            store.write_stock(stock - 1, lock.fence)
            results[order_id] = "bought"
    except LockError:
        results[order_id] = "timeout"


def concurrent_checkouts():
    print("== 16 concurrent checkouts for 10 units")
    store = FencedStore(connect())
    store.reset(10)
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
    check(store.stock() == 0, f"stock is 0, never negative (stock {store.stock()})")
    check(not Lock(connect(), LOCK).locked(), "the lock is free afterwards")


def paused_holder():
    print("== a holder pauses past its lease; its late write is fenced off")
    r = connect()
    store = FencedStore(r)
    store.reset(5)

    # A takes the lock with a short lease and reads the stock...
    a = Lock(r, LOCK, timeout=0.2, owner="A")
    check(a.acquire(blocking=False), "A took the lock")
    stock_seen_by_a = store.stock()
    # ...then stalls (GC pause, swapped-out VM) for longer than the lease.
    time.sleep(0.4)
    check(not a.locked(), "A's lease expired during the pause")

    # B takes the lock: a higher fence. B sells one unit.
    b = Lock(r, LOCK, timeout=5, owner="B")
    check(b.acquire(blocking=False), "B took the lock")
    check(b.fence > a.fence, f"B's fence {b.fence} > A's fence {a.fence}")
    store.write_stock(store.stock() - 1, b.fence)
    b.release()

    # A wakes up and writes what it computed before the pause: rejected.
    try:
        store.write_stock(stock_seen_by_a - 1, a.fence)
        check(False, "A's stale write was rejected")
    except redis.exceptions.ResponseError as e:
        check("STALE" in str(e), f"A's stale write was rejected ({e})")
    check(store.stock() == 4, f"stock is 4: B's sale counted once (stock {store.stock()})")
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
    check(not lock.locked(), "released")


def main():
    r = connect()
    try:
        r.ping()
    except redis.exceptions.ConnectionError as e:
        print(f"cannot reach {URL}: {e}", file=sys.stderr)
        return 2
    r.delete(LOCK)
    concurrent_checkouts()
    paused_holder()
    info_shows_the_holder()
    if failures:
        print(f"{len(failures)} check(s) failed", file=sys.stderr)
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
