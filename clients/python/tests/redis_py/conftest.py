"""Runs redis-py's own Lock tests (tests/test_lock.py and tests/test_asyncio/test_lock.py
of the redis-py release under test, taken from its sdist by run.py) against this
package: every ``Lock`` those files name is replaced by ``redis_lock_module.Lock`` (or
the asyncio one), on a server with the module started here. Each test starts on an
empty database (FLUSHDB), as redis-py's fixtures do.

A short list of tests may fail, each only because it reads the lock's key as a string,
reads its Redis expiry, or patches redis-py's own lock internals; they run and are
reported as xfail (never counted as passing) with the reason. Every other test must pass.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import redis

HERE = Path(os.environ["REDIS_LOCK_PY_TESTS"])  # clients/python/tests
sys.path.insert(0, str(HERE))

from servers import Server  # noqa: E402

import redis_lock_module  # noqa: E402
import redis_lock_module.asyncio  # noqa: E402

STRING = "reads the lock's key as a string (GET): a module lock is its own type, WRONGTYPE"
EXPIRY = (
    "reads the key's Redis expiry (TTL/PTTL/PEXPIRE): a module lock's lease is kept by the "
    "module (LOCK.INFO ttl), not as a Redis expiry"
)
INTERNALS = (
    "times redis-py's polling (sleep=) or patches its clock and sleep: the module waits in the "
    "server's queue and ignores sleep="
)

# test name -> why it may fail. The same names in the sync and the asyncio file.
MAY_FAIL = {
    "test_lock": STRING,
    "test_lock_token": STRING,
    "test_lock_token_thread_local_false": STRING,
    "test_context_manager": STRING,
    "test_timeout": EXPIRY,
    "test_float_timeout": EXPIRY,
    "test_extend_lock": EXPIRY,
    "test_extend_lock_replace_ttl": EXPIRY,
    "test_extend_lock_float": EXPIRY,
    "test_reacquire_lock": EXPIRY,
    "test_blocking_timeout": INTERNALS,
    "test_context_manager_blocking_timeout": INTERNALS,
    "test_high_sleep_small_blocking_timeout": INTERNALS,
}


def pytest_configure(config):
    for mark in ("onlynoncluster", "onlycluster", "redismod", "asyncio"):
        config.addinivalue_line("markers", f"{mark}: a mark of redis-py's suite")


def pytest_collection_modifyitems(items):
    for item in items:
        module = item.module
        asyncio_file = "test_asyncio" in str(item.fspath)
        if hasattr(module, "Lock"):
            module.Lock = (
                redis_lock_module.asyncio.Lock if asyncio_file else redis_lock_module.Lock
            )
        why = MAY_FAIL.get(item.originalname)
        if why is not None:
            item.add_marker(pytest.mark.xfail(reason=why, strict=False))


@pytest.fixture(scope="session")
def lock_server():
    s = Server()
    yield s
    s.close()


def _get_client(cls, request=None, single_connection_client=True, flushdb=True, **kwargs):
    """What redis-py's conftest offers under this name: a client of the test server."""
    port = request.getfixturevalue("lock_server").port if request is not None else None
    client = cls(host="127.0.0.1", port=port, **kwargs)
    if flushdb:
        client.flushdb()
    if request is not None:
        request.addfinalizer(client.close)
    return client


@pytest.fixture()
def r(request, lock_server):
    client = redis.Redis(host="127.0.0.1", port=lock_server.port)
    client.flushdb()
    yield client
    client.close()
