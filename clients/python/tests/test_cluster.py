"""Sync and asyncio locks on a three-master Redis Cluster: routing by key (no MOVED),
exact fences read from the owning node, BLOCK hand-off on the right node."""

import asyncio
import threading
import time

import redis
import redis.asyncio as aredis
from redis.cluster import RedisCluster

from redis_lock_module import Lock
from redis_lock_module.asyncio import Lock as AsyncLock
from servers import raw_fence

NAMES = [f"cl:{i}" for i in range(12)]


def test_locks_on_every_master_without_moved(cluster):
    rc = RedisCluster(host="127.0.0.1", port=cluster.nodes[0].port)
    owners = {cluster.node_for(n).port for n in NAMES}
    assert len(owners) == 3, "the names spread over all masters"
    rc.execute_command("LOCK.INFO", NAMES[0])  # let redis-py learn the command table
    before = cluster.moved_count()
    for name in NAMES:
        lock = Lock(rc, name, timeout=5)
        assert lock.acquire(blocking=False)
        assert lock.fence == raw_fence(cluster.node_for(name).port, name)
        assert lock.owned() and lock.extend(1)
        assert lock.acquire is not None
        lock.release()
        # The blocking path opens its own connection to the key's node.
        assert lock.acquire(blocking_timeout=1)
        assert lock.fence == raw_fence(cluster.node_for(name).port, name)
        lock.release()
    assert cluster.moved_count() == before, "every call went to the right node"
    # The control: a call sent to a node that does not own the key is counted.
    wrong = [n for n in cluster.nodes if n.port != cluster.node_for(NAMES[0]).port][0]
    try:
        wrong.client().execute_command("LOCK.INFO", NAMES[0])
        raise AssertionError("expected MOVED")
    except redis.exceptions.MovedError:
        pass
    assert cluster.moved_count() == before + 1
    rc.close()


def test_hand_off_on_a_cluster(cluster):
    rc = RedisCluster(host="127.0.0.1", port=cluster.nodes[1].port)
    name = NAMES[5]
    holder = Lock(rc, name, timeout=10)
    assert holder.acquire()
    first = holder.fence
    out = {}

    def wait():
        w = Lock(rc, name, timeout=10)
        out["ok"] = w.acquire(blocking_timeout=5)
        out["fence"] = w.fence
        w.release()

    t = threading.Thread(target=wait)
    t.start()
    while int(holder.info()["waiters"]) < 1:
        time.sleep(0.01)
    holder.release()
    t.join(5)
    assert out["ok"] and out["fence"] > first
    rc.close()


def test_asyncio_cluster(cluster):
    async def main():
        rc = aredis.RedisCluster(host="127.0.0.1", port=cluster.nodes[2].port)
        before = cluster.moved_count()
        for name in NAMES:
            lock = AsyncLock(rc, name, timeout=5)
            assert await lock.acquire(blocking_timeout=1)
            assert lock.fence == raw_fence(cluster.node_for(name).port, name)
            assert await lock.owned()
            await lock.release()
            assert await lock.acquire(blocking=False)
            await lock.release()
        assert cluster.moved_count() == before
        await (getattr(rc, "aclose", None) or rc.close)()

    asyncio.run(main())
