#!/usr/bin/env python3
"""Leader election with the redis-lock module and its Python package.

Three schedulers campaign for "election:scheduler"; exactly one leads at a time, in the
order they started campaigning. The leader publishes where it can be reached
(``proclaim``), runs its jobs with writes guarded by its leadership (``if_held``: a
leader whose lease ended cannot write any more), then resigns, and the next candidate
is elected in the same step. An observer prints every change as it happens, from
LOCK.WATCH, without polling.

    REDIS_URL=redis://127.0.0.1:6379 python3 examples/python/election.py
Exits non-zero if a check fails (`make test-examples` runs it).
"""

import os
import threading
import time

import redis
from redis_lock_module import Election, Leader

from checks import check, run_checks

URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379")
KEY = "election:{scheduler}"
RUNS = "scheduler:{scheduler}:runs"


def connect():
    return redis.Redis.from_url(URL, decode_responses=True, socket_timeout=15)


def scheduler(name, results):
    election = Election(connect(), KEY, ttl=5)
    leadership = election.campaign(name)  # waits in the FIFO queue until elected
    results.append((name, leadership.term))
    leadership.proclaim(f"{name}:8080")  # where followers find the leader
    for _ in range(3):
        leadership.if_held("INCR", RUNS)  # a job, written only while it leads
        time.sleep(0.05)
    leadership.resign()  # the next candidate leads at once


def main(r):
    r.delete(KEY, RUNS)

    seen = []
    stop = threading.Event()

    def observe():
        for leader in Election(connect(), KEY).observe(block=1, stop=stop):
            print("   observer:", "nobody leads" if leader is None else f"{leader.value} (term {leader.term})")
            seen.append(leader)

    watcher = threading.Thread(target=observe, daemon=True)
    watcher.start()
    time.sleep(0.2)

    results = []
    threads = []
    for name in ("scheduler-a", "scheduler-b", "scheduler-c"):
        t = threading.Thread(target=scheduler, args=(name, results))
        t.start()
        threads.append(t)
        time.sleep(0.1)  # they start campaigning in this order
    for t in threads:
        t.join(30)
    time.sleep(0.3)
    stop.set()
    watcher.join(3)

    names = [n for n, _ in results]
    terms = [t for _, t in results]
    check(names == ["scheduler-a", "scheduler-b", "scheduler-c"], f"elected in FIFO order ({names})")
    check(all(a < b for a, b in zip(terms, terms[1:])), "each term is larger than the last")
    check(int(r.get(RUNS)) == 9, f"9 guarded job runs ({r.get(RUNS)})")
    values = [s.value if isinstance(s, Leader) else None for s in seen]
    # Each leader's lasting value, in order. A state that lasts less than a round trip
    # (the campaign value, proclaimed over at once) may be seen or overtaken.
    lasting = [v for v in values if v is None or v.endswith(":8080")]
    expected = [None] + [f"{n}:8080" for n in names] + [None]
    allowed = {None, *names, *(f"{n}:8080" for n in names)}
    check(
        lasting == expected and set(values) <= allowed,
        f"the observer saw each leader in order ({values})",
    )
    check(Election(r, KEY).leader() is None, "nobody leads at the end")


if __name__ == "__main__":
    run_checks(URL, connect(), main)
