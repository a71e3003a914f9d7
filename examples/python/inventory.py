#!/usr/bin/env python3
"""Safe inventory deduction with the redis-lock module and plain redis-py.

"One checkout at a time per product": every checkout takes the product's lock with
LOCK.ACQUIRE (waiting in the module's FIFO queue with BLOCK), reads the stock,
writes the new stock, and releases with LOCK.RELEASE. No Lua, no client library for
locks: the module's commands are enough.

The write goes to a *fenced store*: it carries the lock's fencing token and the store
rejects any write whose fence is lower than the highest it has accepted. That is what
makes the lock safe when a holder pauses past its lease (a GC pause, a stalled VM):
the lease expires, someone else takes the lock with a higher fence and writes, and the
paused holder's late write is refused instead of silently undoing the other's work.
Here the store is a Redis hash updated by a small script; in production it is your
database, e.g.
    UPDATE inventory SET stock = :stock, fence = :fence WHERE sku = :sku AND fence <= :fence

Run against a server with the module loaded:
    REDIS_URL=redis://127.0.0.1:6379 python3 examples/python/inventory.py
Exits non-zero if any check fails (`make test-examples` runs it against a fresh server).
"""

import os
import sys
import threading
import time
import uuid

import redis

URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379")
SKU = "9001"
LOCK = f"lock:product:{SKU}"
STORE = f"inventory:{SKU}"

# Fences are 64-bit integers (around 2^60): beyond a Lua number's 53-bit precision, so
# the script compares them as decimal strings (longer is larger, else lexicographic).
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
    token = str(uuid.uuid4())
    # Wait up to 10 s in the FIFO queue; the lease is 5 s.
    reply = r.execute_command(
        "LOCK.ACQUIRE", LOCK, "PX", 5000, "TOKEN", token, "OWNER", order_id, "BLOCK", 10000
    )
    if reply is None:
        results[order_id] = "timeout"
        return
    _token, fence = reply
    try:
        stock = store.stock()
        if stock <= 0:
            results[order_id] = "sold-out"
            return
        time.sleep(0.01)  # the rest of a checkout: payment, ...
        store.write_stock(stock - 1, fence)
        results[order_id] = "bought"
    finally:
        r.execute_command("LOCK.RELEASE", LOCK, token)


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
    check(connect().execute_command("LOCK.INFO", LOCK) is None, "the lock is free afterwards")


def paused_holder():
    print("== a holder pauses past its lease; its late write is fenced off")
    r = connect()
    store = FencedStore(r)
    store.reset(5)

    # A takes the lock with a short lease and reads the stock...
    token_a = str(uuid.uuid4())
    _, fence_a = r.execute_command("LOCK.ACQUIRE", LOCK, "PX", 200, "TOKEN", token_a, "OWNER", "A")
    stock_seen_by_a = store.stock()
    # ...then stalls (GC pause, swapped-out VM) for longer than the lease.
    time.sleep(0.4)
    check(r.execute_command("LOCK.INFO", LOCK) is None, "A's lease expired during the pause")

    # B takes the lock: a higher fence. B sells one unit.
    token_b = str(uuid.uuid4())
    _, fence_b = r.execute_command("LOCK.ACQUIRE", LOCK, "PX", 5000, "TOKEN", token_b, "OWNER", "B")
    check(fence_b > fence_a, f"B's fence {fence_b} > A's fence {fence_a}")
    store.write_stock(store.stock() - 1, fence_b)
    check(r.execute_command("LOCK.RELEASE", LOCK, token_b) == 1, "B released its lock")

    # A wakes up and writes what it computed before the pause: rejected.
    try:
        store.write_stock(stock_seen_by_a - 1, fence_a)
        check(False, "A's stale write was rejected")
    except redis.exceptions.ResponseError as e:
        check("STALE" in str(e), f"A's stale write was rejected ({e})")
    check(store.stock() == 4, f"stock is 4: B's sale counted once (stock {store.stock()})")
    # A cannot release what it no longer holds (the token is the capability).
    check(r.execute_command("LOCK.RELEASE", LOCK, token_a) == 0, "A's release is refused (0)")


def info_shows_the_holder():
    print("== LOCK.INFO shows who holds the lock, never the token")
    r = connect()
    token, fence = r.execute_command("LOCK.ACQUIRE", LOCK, "PX", 5000, "OWNER", "order-1042")
    raw = r.execute_command("LOCK.INFO", LOCK)
    info = dict(zip(raw[::2], raw[1::2])) if isinstance(raw, list) else raw
    check(info.get("owner") == "order-1042", f"owner is order-1042 ({info.get('owner')})")
    check(int(info.get("fence")) == fence, "the fence matches the grant")
    check(token not in [str(v) for v in info.values()], "the token is not revealed")
    check(r.execute_command("LOCK.RELEASE", LOCK, token) == 1, "released")


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
