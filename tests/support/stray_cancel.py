"""A library's own CancelledError, raised where no one cancelled the task."""

from __future__ import annotations

import asyncio


class CancelledWithResult(asyncio.CancelledError):
    """What asyncua's wait_for2 raises when a reply lands in the same turn as a cancel."""
