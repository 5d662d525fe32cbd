"""Loops that run until the daemon stops: restarted or fatal, never gone without a word.

A TaskGroup (CPython 3.11) drops a child that ended with CancelledError or
returned, without a word. A library may raise its own CancelledError where no
one cancelled us (asyncua's wait_for2 did: see adapters/timeouts.py), so a loop
ended by one would vanish while /health still reads as before. ``keep_running``
restarts it with an ERROR; a loop that returns is a bug in core code and ends
the daemon non-zero, so systemd restarts it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import NoReturn

log = logging.getLogger(__name__)

RESTART_S = 1.0


class LoopEnded(RuntimeError):
    """A loop that runs until cancelled returned: a bug; the daemon stops (non-zero)."""


def stop_requested() -> bool:
    """The running task was asked to stop: a cancel someone requested is pending."""
    task = asyncio.current_task()
    return task is None or task.cancelling() > 0


def run_in(
    tg: asyncio.TaskGroup,
    name: str,
    loop: Callable[[], Awaitable[None]],
    *,
    what: str = "",
    restart_s: float = RESTART_S,
) -> asyncio.Task[None]:
    """Start ``loop`` in ``tg`` as a task named ``name``, under :func:`keep_running`.

    ``what``: how the log names the loop (its node or device first); default ``name``.
    """
    return tg.create_task(keep_running(what or name, loop, restart_s=restart_s), name=name)


async def keep_running(
    what: str, loop: Callable[[], Awaitable[None]], *, restart_s: float = RESTART_S
) -> NoReturn:
    """Await ``loop()`` until cancelled; again after a cancellation no one asked for.

    ``what`` names the loop in the log, e.g. ``cdu: source runner``.
    """
    while True:
        try:
            await loop()
        except asyncio.CancelledError:
            if stop_requested():
                raise  # a stop or a reload: asked for
            log.error(
                "%s ended by a cancellation no one asked for (a library's bug); restarting"
                " it in %gs",
                what,
                restart_s,
            )
        else:
            raise LoopEnded(f"{what} returned, but it runs until the daemon stops")
        await asyncio.sleep(restart_s)
