"""keep_running: a loop that runs until the daemon stops is restarted or fatal, never gone."""

from __future__ import annotations

import asyncio
import logging

import pytest

from daemon.loops import LoopEnded, keep_running, run_in
from tests.support.stray_cancel import CancelledWithResult, reply_racing_the_cancel
from tests.support.virtual_time import virtual_time


class Loop:
    """A loop body: ends by the scripted exception at each start, then runs on."""

    def __init__(self, *endings: BaseException | None) -> None:
        self.endings = list(endings)
        self.starts: list[float] = []

    async def __call__(self) -> None:
        self.starts.append(asyncio.get_running_loop().time())
        if self.endings:
            ending = self.endings.pop(0)
            if ending is None:
                return
            raise ending
        await asyncio.sleep(3600)


@virtual_time
async def test_a_loop_ended_by_a_cancellation_no_one_asked_for_is_restarted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    loop = Loop(CancelledWithResult(), CancelledWithResult())

    async def serve() -> None:
        async with asyncio.TaskGroup() as tg:
            run_in(tg, "delivery", loop, restart_s=2.0)

    service = asyncio.create_task(serve())
    await asyncio.sleep(10)
    assert not service.done()
    assert loop.starts == [0.0, 2.0, 4.0]  # restarted twice, each after restart_s
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert [r.getMessage() for r in errors] == [
        "delivery ended by a cancellation no one asked for (a library's bug); restarting it in 2s"
    ] * 2
    service.cancel()  # the daemon stopping: not restarted
    await asyncio.gather(service, return_exceptions=True)
    assert service.cancelled() and len(loop.starts) == 3


@virtual_time
async def test_a_stop_during_the_restart_delay_is_not_swallowed() -> None:
    loop = Loop(CancelledWithResult())
    task = asyncio.create_task(keep_running("steering", loop, restart_s=5.0))
    await asyncio.sleep(1)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert task.cancelled() and loop.starts == [0.0]


@virtual_time
async def test_a_stray_cancellation_together_with_a_stop_stops() -> None:
    # The library's own CancelledError, on our cancel.
    task = asyncio.create_task(keep_running("reconcile", reply_racing_the_cancel))
    await asyncio.sleep(1)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert task.cancelled()


@virtual_time
async def test_a_loop_that_returns_ends_its_task_group_loudly() -> None:
    loop = Loop(None)
    other = Loop()
    with pytest.raises(ExceptionGroup) as raised:
        async with asyncio.TaskGroup() as tg:
            run_in(tg, "power-cap", loop)
            run_in(tg, "policy", other)
    (err,) = raised.value.exceptions
    assert isinstance(err, LoopEnded)
    assert str(err) == "power-cap returned, but it runs until the daemon stops"
    assert len(loop.starts) == 1
