"""A real etcd for the fleet tests: one server per module, a fresh key prefix per test."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest

from fakes.etcd_server import EtcdServer
from tests.support.etcd import served_etcd

_prefixes = itertools.count(1)


@pytest.fixture(scope="module")
def etcd_server() -> Iterator[EtcdServer]:
    """etcd on loopback with a temporary data directory; skipped (saying why) when absent."""
    yield from served_etcd()


@pytest.fixture
def etcd() -> Iterator[EtcdServer]:
    """A member of the test's own, for tests that freeze, restart or wipe it."""
    yield from served_etcd()


@pytest.fixture
def prefix() -> str:
    """A key prefix no other test uses."""
    return f"/rackguard-test-{next(_prefixes)}/"
