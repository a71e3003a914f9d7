"""Installs each artifact of `make dist-python` (the wheel and the sdist in
REDIS_LOCK_DIST) into a fresh venv, with redis-py from the registry, and uses it
against a server with the module; checks the metadata a registry shows.

Run by `make test-python` (after `make dist-python`):
    REDIS_LOCK_DIST=target/dist pytest tests/dist
"""

import email
import os
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from servers import Server  # noqa: E402

DIST = Path(os.environ["REDIS_LOCK_DIST"])
REDIS_PY = os.environ.get("REDIS_LOCK_DIST_REDIS", "redis==8.1.0")

USE = """
import sys
import redis
from redis_lock_module import Lock, __version__
r = redis.Redis(port=int(sys.argv[1]))
with Lock(r, "dist:check", timeout=5, blocking_timeout=2) as lock:
    assert isinstance(lock.fence, int) and lock.fence > 0
    assert lock.owned()
assert not Lock(r, "dist:check").locked()
print("ok", __version__, lock.fence)
"""


def artifacts():
    found = sorted(DIST.glob("redis_lock_module-*.whl")) + sorted(DIST.glob("redis_lock_module-*.tar.gz"))
    assert len(found) == 2, f"expected a wheel and an sdist in {DIST}: {found}"
    return found


@pytest.fixture(scope="module")
def server():
    s = Server()
    yield s
    s.close()


def test_the_wheel_s_metadata():
    (wheel,) = [a for a in artifacts() if a.suffix == ".whl"]
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        meta_name = [n for n in names if n.endswith(".dist-info/METADATA")][0]
        meta = email.message_from_bytes(z.read(meta_name))
        assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names), names
        assert any(n.endswith("redis_lock_module/py.typed") for n in names)
    assert meta["License-Expression"] == "MIT"
    assert meta["Requires-Python"] == ">=3.11"
    assert "redis>=4.5.0" in meta.get_all("Requires-Dist")
    assert any(c.startswith("Programming Language :: Python :: 3.11") for c in meta.get_all("Classifier"))
    # No project URL until the project has a public home (none is made up).
    assert not meta.get_all("Project-URL")


@pytest.mark.parametrize("kind", ["wheel", "sdist"])
def test_installs_into_a_fresh_venv_and_locks(kind, server, tmp_path):
    artifact = [a for a in artifacts() if (a.suffix == ".whl") == (kind == "wheel")][0]
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    py = str(env_dir / "bin" / "python")
    subprocess.run(
        [py, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", str(artifact), REDIS_PY],
        check=True,
        timeout=300,
    )
    out = subprocess.run([py, "-c", USE, str(server.port)], check=True, capture_output=True, text=True, timeout=60)
    assert out.stdout.startswith("ok 0.1.0 "), out.stdout + out.stderr
