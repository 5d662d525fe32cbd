"""A real etcd for the fleet tests: one server per module, a fresh key prefix per test."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest

from fakes.etcd_server import EtcdServer, etcd_available

_prefixes = itertools.count(1)


@pytest.fixture(scope="module")
def etcd_server() -> Iterator[EtcdServer]:
    """etcd on loopback with a temporary data directory; skipped (saying why) when absent."""
    why = etcd_available()
    if why:
        pytest.skip(why)
    server = EtcdServer()
    server.start()
    yield server
    server.close()


@pytest.fixture
def prefix() -> str:
    """A key prefix no other test uses."""
    return f"/rackguard-test-{next(_prefixes)}/"
