"""DedicatedThread: one daemon thread, abandoned calls never queue a second one."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Iterator

import pytest

from adapters.blocking import DedicatedThread
from adapters.errors import SourceUnavailable


@pytest.fixture
def gate() -> Iterator[threading.Event]:
    """An event a blocking call waits on; always set at teardown so no thread stays hung."""
    event = threading.Event()
    yield event
    event.set()


@pytest.fixture
async def worker() -> AsyncIterator[DedicatedThread]:
    """A fresh DedicatedThread, closed after the test."""
    thread = DedicatedThread("test-worker")
    yield thread
    thread.close()


async def wait_idle(thread: DedicatedThread, limit_s: float = 5.0) -> None:
    """Wait until an abandoned call has finished."""
    deadline = time.monotonic() + limit_s
    while thread.busy:
        assert time.monotonic() < deadline, "the abandoned call never finished"
        await asyncio.sleep(0.005)


async def test_call_returns_result_on_one_non_loop_daemon_thread(worker: DedicatedThread) -> None:
    seen: list[threading.Thread] = []

    def work(a: int, b: int, *, scale: int) -> int:
        seen.append(threading.current_thread())
        return (a + b) * scale

    assert await worker.call(work, 2, 3, scale=10) == 50
    assert await worker.call(work, 1, 1, scale=1) == 2
    assert len({t.ident for t in seen}) == 1
    assert seen[0].ident != threading.get_ident()
    assert seen[0].daemon
    assert worker.ident == seen[0].ident
    assert not worker.busy


async def test_exception_from_the_call_reaches_the_caller(worker: DedicatedThread) -> None:
    def boom() -> None:
        raise KeyError("nope")

    with pytest.raises(KeyError, match="nope"):
        await worker.call(boom)
    assert not worker.busy
    assert await worker.call(lambda: "still works") == "still works"


async def test_stop_iteration_is_wrapped_not_lost(worker: DedicatedThread) -> None:
    def stop() -> None:
        raise StopIteration

    with pytest.raises(RuntimeError, match="StopIteration"):
        await worker.call(stop)


async def test_timed_out_call_is_abandoned_and_next_call_fails_at_once(
    worker: DedicatedThread, gate: threading.Event
) -> None:
    started = threading.Event()
    ran: list[str] = []

    def hang() -> str:
        started.set()
        gate.wait(5)
        ran.append("hang")
        return "late"

    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.05):
            await worker.call(hang)
    assert started.is_set()
    assert worker.busy

    t0 = time.monotonic()
    with pytest.raises(SourceUnavailable, match="previous call still running"):
        await worker.call(ran.append, "second")
    assert time.monotonic() - t0 < 0.05  # refused at once, not queued
    assert ran == []

    gate.set()
    await wait_idle(worker)
    assert ran == ["hang"]  # the abandoned call did finish on its thread
    await worker.call(ran.append, "third")
    assert ran == ["hang", "third"]


async def test_concurrent_callers_get_one_result_and_one_refusal(
    worker: DedicatedThread,
) -> None:
    results = await asyncio.gather(
        worker.call(time.sleep, 0.1), worker.call(time.sleep, 0.1), return_exceptions=True
    )
    refusals = [r for r in results if isinstance(r, SourceUnavailable)]
    assert len(refusals) == 1
    assert results.count(None) == 1


async def test_event_loop_keeps_running_during_a_blocking_call(worker: DedicatedThread) -> None:
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    task = asyncio.create_task(ticker())
    try:
        await worker.call(time.sleep, 0.3)
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert ticks >= 10  # a blocked loop would tick at most once


async def test_close_does_not_wait_for_a_hung_call_and_never_adds_a_second_thread(
    worker: DedicatedThread, gate: threading.Event
) -> None:
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.05):
            await worker.call(gate.wait, 5)
    old_ident = worker.ident
    old = next(t for t in threading.enumerate() if t.ident == old_ident)

    t0 = time.monotonic()
    worker.close()
    assert time.monotonic() - t0 < 0.05
    assert worker.ident is None
    # The hung call still holds the worker: no fresh thread piles up behind it.
    with pytest.raises(SourceUnavailable):
        await worker.call(lambda: None)

    gate.set()
    await wait_idle(worker)
    old.join(2)
    assert not old.is_alive()  # the closed thread exited after its call

    ident = await worker.call(threading.get_ident)
    assert worker.ident == ident
    fresh = next(t for t in threading.enumerate() if t.ident == ident)
    assert fresh is not old  # idents may be reused; thread objects are not


def test_result_after_the_loop_closed_is_dropped_quietly(gate: threading.Event) -> None:
    worker = DedicatedThread("test-closed-loop")

    async def abandon() -> None:
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.05):
                await worker.call(gate.wait, 5)

    asyncio.run(abandon())  # closes that loop while the call still hangs
    ident = worker.ident
    gate.set()
    deadline = time.monotonic() + 5
    while worker.busy:
        assert time.monotonic() < deadline
        time.sleep(0.005)

    async def again() -> int:
        return await worker.call(threading.get_ident)

    assert asyncio.run(again()) == ident  # same worker survived the closed loop
    worker.close()
