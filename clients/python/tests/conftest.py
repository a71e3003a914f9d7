import os
import sys
import uuid

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from servers import Cluster, Server  # noqa: E402


@pytest.fixture(scope="session")
def server():
    s = Server()
    yield s
    s.close()


@pytest.fixture
def own_server():
    """A server of the test's own (for tests that stop or kill it)."""
    s = Server()
    yield s
    s.close()


@pytest.fixture(scope="session")
def cluster():
    c = Cluster(3)
    yield c
    c.close()


@pytest.fixture
def key():
    return f"lock:{uuid.uuid4().hex[:12]}"
