"""Fetches redis-py's own Lock tests for the installed redis-py (from its sdist on PyPI,
cached under target/redis-py-tests/<version>/) with its MIT licence notice, lays them
out beside this directory's conftest files, and runs pytest on them.

    python tests/redis_py/run.py [pytest args]     (from clients/python, in the venv)
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import redis

HERE = Path(__file__).resolve().parent
TESTS = HERE.parent
ROOT = TESTS.parents[2]
FILES = ["tests/test_lock.py", "tests/test_asyncio/test_lock.py", "LICENSE"]


def fetch(version: str, into: Path) -> None:
    if all((into / f).exists() for f in FILES):
        return
    sdist_dir = into.parent / f"sdist-{version}"
    sdist_dir.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check",
         "--no-deps", "--no-binary", ":all:", f"redis=={version}", "-d", str(sdist_dir)],
        check=True,
    )
    (sdist,) = sdist_dir.glob(f"redis-{version}.tar.gz")
    with tarfile.open(sdist) as t:
        for f in FILES:
            member = t.getmember(f"redis-{version}/{f}")
            data = t.extractfile(member)
            assert data is not None
            (into / f).parent.mkdir(parents=True, exist_ok=True)
            (into / f).write_bytes(data.read())


def main() -> int:
    version = redis.__version__
    work = ROOT / "target" / "redis-py-tests" / version
    fetch(version, work)
    (work / "tests" / "__init__.py").write_text("")
    (work / "tests" / "test_asyncio" / "__init__.py").write_text("")
    shutil.copy(HERE / "conftest.py", work / "tests" / "conftest.py")
    shutil.copy(HERE / "test_asyncio_conftest" / "conftest.py", work / "tests" / "test_asyncio" / "conftest.py")
    env = dict(os.environ, REDIS_LOCK_PY_TESTS=str(TESTS))
    print(f"redis-py {version}'s own Lock tests (MIT, {work / 'LICENSE'}) against redis_lock_module")
    return subprocess.call(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "asyncio_mode=auto",
         "-o", "asyncio_default_fixture_loop_scope=function",
         "--rootdir", str(work), str(work / "tests"), *sys.argv[1:]],
        cwd=work,
        env=env,
    )


if __name__ == "__main__":
    sys.exit(main())
