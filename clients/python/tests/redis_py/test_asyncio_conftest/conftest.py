"""The asyncio fixtures redis-py's tests/test_asyncio/test_lock.py uses: ``r`` and
``create_redis``, on the server the parent conftest started (see there)."""

import pytest_asyncio
import redis.asyncio as aredis


async def _close(client):
    await (getattr(client, "aclose", None) or client.close)()


@pytest_asyncio.fixture()
async def create_redis(lock_server):
    made = []

    async def create(**kwargs):
        client = aredis.Redis(host="127.0.0.1", port=lock_server.port, **kwargs)
        await client.flushdb()
        made.append(client)
        return client

    yield create
    for client in made:
        await _close(client)


@pytest_asyncio.fixture()
async def r(create_redis):
    yield await create_redis()
