"""A real etcd for the fleet tests: one server per module, a fresh key prefix per test."""

from __future__ import annotations

import itertools
import os
import signal
from collections.abc import Iterator

import pytest

from fakes.etcd_server import EtcdServer, etcd_available

_prefixes = itertools.count(1)


def _served() -> Iterator[EtcdServer]:
    why = etcd_available()
    if why:
        pytest.skip(why)
    server = EtcdServer()
    server.start()
    yield server
    if server.proc is not None and server.proc.poll() is None:
        os.kill(server.proc.pid, signal.SIGCONT)  # a test that froze it and failed
    server.close()


@pytest.fixture(scope="module")
def etcd_server() -> Iterator[EtcdServer]:
    """etcd on loopback with a temporary data directory; skipped (saying why) when absent."""
    yield from _served()


@pytest.fixture
def etcd() -> Iterator[EtcdServer]:
    """A member of the test's own, for tests that freeze, restart or wipe it."""
    yield from _served()


@pytest.fixture
def prefix() -> str:
    """A key prefix no other test uses."""
    return f"/rackguard-test-{next(_prefixes)}/"
