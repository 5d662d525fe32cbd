"""time_limit: a cancellation it caused always ends as TimeoutError; anyone else's goes on."""

from __future__ import annotations

import asyncio
import sys

import pytest

from adapters.timeouts import time_limit
from tests.support.stray_cancel import CancelledWithResult, reply_racing_the_cancel


async def test_plain_asyncio_timeout_lets_the_subclass_pass_as_a_cancellation() -> None:
    # The trap itself, in CPython 3.11 and 3.12 (checked: 3.11.7, 3.12.1). 3.13.0 checks
    # issubclass and raises TimeoutError, where time_limit is only belt and braces.
    leaks = sys.version_info < (3, 13)
    with pytest.raises(CancelledWithResult if leaks else TimeoutError):
        async with asyncio.timeout(0.01):
            await reply_racing_the_cancel()
    current = asyncio.current_task()
    assert current is not None and current.cancelling() == 0  # nobody cancelled us


async def test_the_subclass_at_the_time_limit_is_a_timeout() -> None:
    with pytest.raises(TimeoutError) as caught:
        async with time_limit(0.01):
            await reply_racing_the_cancel()
    assert isinstance(caught.value.__cause__, CancelledWithResult)
    current = asyncio.current_task()
    assert current is not None and current.cancelling() == 0


async def test_a_plain_timeout_and_a_result_in_time_behave_as_asyncio_timeout() -> None:
    with pytest.raises(TimeoutError):
        async with time_limit(0.01):
            await asyncio.sleep(10)
    async with time_limit(1.0):
        await asyncio.sleep(0)
    async with time_limit(None):
        await asyncio.sleep(0)


async def test_someone_elses_cancel_goes_on_with_or_without_the_subclass() -> None:
    for body in (reply_racing_the_cancel, asyncio.sleep):

        async def limited(body: object = body) -> None:
            async with time_limit(10):
                await body(10)  # type: ignore[operator]

        task = asyncio.create_task(limited())
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert task.cancelled()


async def test_a_stop_arriving_with_the_time_limit_goes_on() -> None:
    async def stop_asked_as_the_limit_runs_out() -> None:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            # The daemon's stop lands before the task runs again: a second cancel.
            current = asyncio.current_task()
            assert current is not None
            current.cancel()
            raise CancelledWithResult("reply arrived with the cancel") from None

    async def limited() -> None:
        async with time_limit(0.01):
            await stop_asked_as_the_limit_runs_out()

    task = asyncio.create_task(limited())
    with pytest.raises(asyncio.CancelledError):
        await task
    assert task.cancelled()


async def test_a_close_while_being_stopped_still_times_out_as_itself() -> None:
    # A polite close inside an ``except BaseException`` during a stop: the task is
    # already cancelling when the close's own time limit runs out.
    seen: list[str] = []

    async def stopping() -> None:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            try:
                async with time_limit(0.01):
                    await reply_racing_the_cancel()
            except TimeoutError:
                seen.append("close timed out")
            raise

    task = asyncio.create_task(stopping())
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert seen == ["close timed out"]
