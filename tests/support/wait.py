"""The one way tests wait for something to happen: poll a condition, fail with what was awaited.

A test never sleeps for a fixed time to let something happen; it waits for the
observable effect, with a generous timeout that only bounds a failing run.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


async def wait_until(
    condition: Callable[[], object],
    timeout: float = 10.0,  # noqa: ASYNC109 (a bound for a failing run, not a cancel scope)
    what: str = "condition",
    interval: float = 0.01,
) -> None:
    """Poll ``condition()`` until it is truthy; AssertionError after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what} not reached within {timeout}s")
        await asyncio.sleep(interval)


async def wait_for_result(
    fetch: Callable[[], Awaitable[T]],
    accept: Callable[[T], bool],
    timeout: float = 10.0,  # noqa: ASYNC109 (a bound for a failing run, not a cancel scope)
    what: str = "result",
    interval: float = 0.05,
) -> T:
    """Call ``fetch()`` until ``accept`` takes its result; return it, or fail naming the last."""
    deadline = time.monotonic() + timeout
    while True:
        result = await fetch()
        if accept(result):
            return result
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what} not reached within {timeout}s; last: {result!r}")
        await asyncio.sleep(interval)


def wait_until_sync(
    condition: Callable[[], object],
    timeout: float = 10.0,
    what: str = "condition",
    interval: float = 0.01,
) -> None:
    """The blocking twin of :func:`wait_until`, for tests without an event loop."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what} not reached within {timeout}s")
        time.sleep(interval)
