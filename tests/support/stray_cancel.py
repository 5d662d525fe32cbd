"""A library's own CancelledError: raised where no one cancelled, or past a time limit's cancel."""

from __future__ import annotations

import asyncio


class CancelledWithResult(asyncio.CancelledError):
    """What asyncua's wait_for2 raises when a reply lands in the same turn as a cancel."""


async def reply_racing_the_cancel(seconds: float = 10.0) -> None:
    """Sleep; cancelled meanwhile, raise the library's subclass, as a reply racing it does."""
    try:
        await asyncio.sleep(seconds)
    except asyncio.CancelledError:
        raise CancelledWithResult("reply arrived with the cancel") from None
