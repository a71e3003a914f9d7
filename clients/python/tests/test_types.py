"""The package as a `mypy --strict` user sees it (no server): every public name of
`redis_lock_module` and `redis_lock_module.asyncio` imports explicitly, and a held lock's
fence is an `int` (sync, asyncio, Redlock, an election's term), as the docs say."""

import subprocess
import sys
import textwrap

import redis_lock_module
import redis_lock_module.asyncio


def test_mypy_strict_accepts_every_public_name_and_an_int_fence(tmp_path):
    names = sorted(redis_lock_module.__all__)
    async_names = sorted(redis_lock_module.asyncio.__all__)
    user = tmp_path / "user.py"
    user.write_text(
        f"from redis_lock_module import {', '.join(names)}\n"
        + "from redis_lock_module.asyncio import "
        + ", ".join(f"{n} as Async{n}" for n in async_names)
        + "\n"
        + textwrap.dedent(
            """
            import redis
            import redis.asyncio


            def fence(r: redis.Redis) -> int:
                with Lock(r, "lock:a", timeout=5) as held:
                    return held.fence


            def acquired_fence(r: redis.Redis) -> int:
                lock = Lock(r, "lock:a", timeout=5)
                if not lock.acquire(blocking=False):
                    raise LockError("busy")
                return lock.fence


            async def async_fence(r: redis.asyncio.Redis) -> int:
                async with AsyncLock(r, "lock:a", timeout=5) as held:
                    return held.fence


            def quorum_fence(nodes: list[redis.Redis]) -> int:
                try:
                    grant = Redlock(nodes).acquire("lock:a", 5)
                except QuorumUnavailableError as e:
                    return e.answered
                if grant is None:
                    raise LockNotOwnedError("busy")
                return grant.fence


            def session_fences(r: redis.Redis) -> list[int]:
                with Session(r, ttl=30, bind=5) as session:
                    lock = session.acquire("lock:a", blocking_timeout=1)
                    with Lock(r, "lock:b", session=session) as other:
                        return [other.fence] + ([] if lock is None else [lock.fence])


            async def async_session_fence(r: redis.asyncio.Redis) -> int:
                async with AsyncSession(r, ttl=30) as session:
                    lock = await session.acquire("lock:a", blocking=False)
                    if session.lost_reason is not None or lock is None:
                        raise SessionLostError("lost", session.lost_reason or "")
                    return lock.fence


            def term(r: redis.Redis) -> int:
                leadership = Election(r, "election:a", ttl=10).campaign("node-a", timeout=1)
                return 0 if leadership is None else leadership.term
            """
        )
    )
    # Every name used once, so that an unused import is no excuse.
    user.write_text(
        user.read_text()
        + "\nPUBLIC = ["
        + ", ".join(names + [f"Async{n}" for n in async_names])
        + "]\n"
    )
    out = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", str(user)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout + out.stderr
