"""A real etcd for a test (or a module of tests), and the teardown of agents run on it."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Iterable, Iterator
from typing import Protocol

import pytest

from fakes.etcd_server import EtcdServer, etcd_available


class Closable(Protocol):
    async def close(self) -> None: ...


def served_etcd() -> Iterator[EtcdServer]:
    """etcd on loopback with a temporary data directory; skipped (saying why) when absent."""
    why = etcd_available()
    if why:
        pytest.skip(why)
    server = EtcdServer()
    server.start()
    yield server
    if server.proc is not None and server.proc.poll() is None:
        os.kill(server.proc.pid, signal.SIGCONT)  # a test that froze it and failed
    server.close()


async def stop_all(tasks: Iterable[asyncio.Task[None]], *closables: Iterable[Closable]) -> None:
    """Cancel the tasks, wait for them, then close each agent, sink or client in order."""
    every = list(tasks)
    for t in every:
        t.cancel()
    await asyncio.gather(*every, return_exceptions=True)
    for group in closables:
        for c in group:
            await c.close()
