"""Readiness, the one-line status for `systemctl status`, and the watchdog pings."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence

from daemon.http.view import ServiceView
from daemon.service.notify import Notifier
from daemon.service.runner import SourceRunner

log = logging.getLogger(__name__)

STATUS_INTERVAL_S = 5.0


class StatusReporter:
    """Tells systemd (and the log) how the service is doing."""

    def __init__(self, view: ServiceView, notifier: Notifier) -> None:
        self._view = view
        self._notifier = notifier
        self.ready = asyncio.Event()

    def line(self) -> str:
        """E.g. ``gpu-node-07: ok; sources: gpus up; undelivered: 0``."""
        v = self._view
        outcome = v.outcome
        cond = outcome.node.condition.value if outcome else "starting"
        sources = ", ".join(f"{s.name} {s.health}" for s in v.sources())
        simulated = " (SIMULATED GPUs)" if v.simulated else ""
        return (
            f"{v.config.node.name}{simulated}: {cond}; sources: {sources};"
            f" undelivered: {v.pending_count()}"
        )

    async def mark_ready(self, runners: Callable[[], Sequence[SourceRunner]]) -> None:
        """READY=1 once every source has tried once."""
        await asyncio.gather(*(r.first_attempt.wait() for r in runners()))
        self.ready.set()
        status = self.line()
        log.info("%s: ready: %s", self._view.config.node.name, status)
        self._notifier.ready(status)

    async def report(self) -> None:
        """STATUS= whenever the line changes."""
        await self.ready.wait()
        while True:
            self._notifier.status(self.line())
            await asyncio.sleep(STATUS_INTERVAL_S)

    async def watchdog(self, watchdog_s: float) -> None:
        """WATCHDOG=1 every half period."""
        # Pinged from the event loop itself: a blocked loop stops the pings and
        # systemd restarts the service.
        while True:
            self._notifier.watchdog()
            await asyncio.sleep(watchdog_s / 2)
