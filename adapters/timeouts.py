"""A time limit around a device call that always ends as TimeoutError when it runs out.

``asyncio.timeout`` turns the cancellation it caused into TimeoutError only when
the exception's type *is* CancelledError (an identity check in CPython 3.11
and 3.12; 3.13 checks the subclass too).
asyncua cancels its requests through wait_for2, which raises its subclass
``CancelledWithResultError`` when a reply lands in the same loop iteration as
the cancel. That subclass slips past ``asyncio.timeout`` as a cancellation: a
poller catching TimeoutError ends as if the daemon were stopping, and the
source is silently never polled again (seen: 4 of 59 timeouts of an OPC-UA
connect between 0.5 and 30 ms).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator


@contextlib.asynccontextmanager
async def time_limit(seconds: float | None) -> AsyncIterator[None]:
    """Like ``asyncio.timeout(seconds)``, but a cancellation it caused is always TimeoutError.

    A cancellation someone else asked for (the daemon stopping, a reload) still
    propagates, also when it arrives together with the time limit.
    """
    task = asyncio.current_task()
    pending = task.cancelling() if task is not None else 0  # e.g. a close while being cancelled
    limit = asyncio.timeout(seconds)
    try:
        async with limit:
            yield
    except asyncio.CancelledError as err:
        # Past asyncio.timeout's exit its own cancel is uncounted again: any count above
        # the one on entry is someone else's cancellation, which must go on.
        if limit.expired() and task is not None and task.cancelling() <= pending:
            raise TimeoutError from err
        raise
