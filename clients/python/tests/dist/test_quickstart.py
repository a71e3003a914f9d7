"""Runs every command of docs/quickstart-python.md: the server as `make run` starts it
(its config file, redis.conf.example, from the repository root, on a free port, without
the AOF file), the venv and `pip install ./clients/python` (in a scratch dir whose
`clients` is the repository's), and each Python block against that server."""

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from servers import free_port  # noqa: E402

ROOT = Path(__file__).resolve().parents[4]
DOC = ROOT / "docs" / "quickstart-python.md"
RUN_SERVER = os.environ.get("LOCK_SERVER_BIN") or "/usr/bin/redis-server"


def blocks(lang):
    return re.findall(rf"```{lang}\n(.*?)```", DOC.read_text(), re.S)


@pytest.fixture(scope="module")
def make_run_server():
    assert blocks("sh")[0].strip() == "make run"
    assert "exec $(RUN_SERVER) redis.conf.example --port $(PORT)" in (ROOT / "Makefile").read_text()
    port = free_port()
    proc = subprocess.Popen(
        # From the repository root as make run (loadmodule ./target/...), without the AOF
        # it would leave there.
        [RUN_SERVER, "redis.conf.example", "--port", str(port), "--appendonly", "no", "--save", ""],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 10
    while True:
        try:
            if redis.Redis(port=port, socket_timeout=1).ping():
                break
        except redis.exceptions.RedisError:
            pass
        assert time.monotonic() < deadline and proc.poll() is None, "the server of make run did not start"
        time.sleep(0.05)
    yield port
    proc.kill()
    proc.wait()


def test_every_command_of_the_python_quick_start(make_run_server, tmp_path):
    install = blocks("sh")[1]
    (tmp_path / "clients").symlink_to(ROOT / "clients")
    subprocess.run(["bash", "-euo", "pipefail", "-c", install], cwd=tmp_path, check=True, timeout=300)
    subprocess.run(["rm", "-rf", str(ROOT / "clients/python/build")], check=True)
    py = str(tmp_path / ".venv" / "bin" / "python")
    env = dict(os.environ, REDIS_URL=f"redis://127.0.0.1:{make_run_server}")
    first, daily, session = blocks("python")
    out = subprocess.run([py, "-c", first], env=env, capture_output=True, text=True, timeout=60, check=True).stdout
    assert re.search(r"holding lock:report with fence \d+\nreleased\n", out), out
    runs = [
        subprocess.run([py, "-c", daily], env=env, capture_output=True, text=True, timeout=60, check=True).stdout
        for _ in range(2)
    ]
    assert runs == ["this server runs the daily report\n", "another server ran it in this period\n"], runs
    out = subprocess.run([py, "-c", session], env=env, capture_output=True, text=True, timeout=60, check=True).stdout
    assert out == "holding both in one session: True\nreleased both\n", out


def test_the_module_paths_are_those_each_install_route_gives():
    """Every module file the quick start names is what its install route gives: a build's
    target/release/libredis_lock.so (what redis.conf.example, make run's config, loads), or
    the .deb's file as scripts/build-deb.sh installs it, with the snippet that loads it."""
    text = DOC.read_text()
    conf = (ROOT / "redis.conf.example").read_text()
    deb = (ROOT / "scripts" / "build-deb.sh").read_text()
    built, packaged = "target/release/libredis_lock.so", "/usr/lib/redis/modules/redis-lock.so"
    assert f"loadmodule ./{built}" in conf
    assert f'"$pkg{packaged}"' in deb and f"loadmodule {packaged}" in deb
    assert '"$pkg/etc/redis/modules/redis-lock.conf"' in deb
    named = re.findall(r"[\w./-]+\.so\b", text)
    assert built in text and packaged in text, named
    for path in named:
        assert path == packaged or path.endswith(built), f"{path}: no install route gives it"
    assert "include /etc/redis/modules/redis-lock.conf" in text
