"""One runner wraps every sensor adapter: a poller (daemon/poller.py) around connect + read.

The schedule is the poller's grid, started at a random offset so many agents
(and many sources) never fire together. An attempt that runs past its tick
skips the missed ticks rather than queueing them. A failing source backs off
exponentially (capped, jittered), and its session is rebuilt from scratch;
health moves STARTING -> UP / DEGRADED / DOWN and each move is logged once.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable, Sequence

from adapters.base import SensorAdapter
from adapters.errors import SourceAuthError, SourceError, SourceSetupError
from adapters.timeouts import time_limit
from daemon.config.sources import SourceTiming
from daemon.poller import Backoff, Health, Poller, PollStats
from policies.model import Reading

__all__ = ["Health", "ReadingsSink", "RunnerStats", "SourceRunner"]

log = logging.getLogger(__name__)

RunnerStats = PollStats

ReadingsSink = Callable[[str, Sequence[Reading]], None]


class SourceRunner:
    """Polls one adapter forever; never raises for a device failure."""

    def __init__(
        self,
        adapter: SensorAdapter,
        timing: SourceTiming,
        on_readings: ReadingsSink,
        *,
        rng: random.Random | None = None,
        on_attempt: Callable[[SourceRunner, float], None] | None = None,
    ) -> None:
        self.adapter = adapter
        self.name = adapter.name
        self.timing = timing
        self._on_readings = on_readings
        self._on_attempt = on_attempt
        self._connected = False
        self._kind = "poll failed"
        self.poller = Poller(
            self.name,
            self._poll,
            interval_s=timing.interval_s,
            timeout_s=timing.timeout_s,
            backoff=Backoff(timing.backoff_initial_s, timing.backoff_max_s),
            down_after=timing.down_after,
            spread_start=True,
            on_change=self._changed,
            describe=self._describe,
            on_failure=self._reset,
            on_attempt=self._attempted,
            degraded=self._degraded,
            rng=rng,
        )

    @property
    def health(self) -> Health:
        return self.poller.health

    @property
    def stats(self) -> PollStats:
        return self.poller.stats

    @property
    def first_attempt(self) -> asyncio.Event:
        return self.poller.first_attempt

    def backoff_s(self, failures: int) -> float:
        """Delay before the next attempt after ``failures`` failures in a row (>= 1)."""
        return self.poller.backoff_s(failures)

    async def run(self) -> None:
        """Poll until cancelled."""
        try:
            await self.poller.run()
        finally:
            await self._close()

    async def attempt(self) -> bool:
        """One connect-if-needed + read under the per-attempt timeout; True on success."""
        return await self.poller.attempt()

    async def _poll(self) -> None:
        self._kind = "poll failed"  # a timeout's words; _describe names the others
        if not self._connected:
            await self.adapter.connect()
            self._connected = True
        readings = await self.adapter.read()
        self._on_readings(self.name, readings)

    def _attempted(self, duration: float) -> None:
        if self._on_attempt is not None:
            self._on_attempt(self, duration)

    async def _reset(self) -> None:
        # A failed session is rebuilt from scratch on the next attempt.
        self._connected = False
        await self._close()

    def _describe(self, err: Exception) -> str:
        self._kind = (
            "authentication failed"
            if isinstance(err, SourceAuthError)
            else "cannot work as configured"
            if isinstance(err, SourceSetupError)
            else "poll failed"
        )
        if isinstance(err, SourceError):
            return str(err) or type(err).__name__
        # A device's answer tripped something in its adapter: that is one
        # source failing, never the daemon (the others keep polling).
        if not self.stats.consecutive_failures:
            log.error("%s: adapter error, treated as a failed poll", self.name, exc_info=err)
        return f"adapter error: {type(err).__name__}: {err}"

    def _degraded(self) -> str:
        # A device that answers but gives nothing rackguard uses (a PDU whose profile
        # reads no probe, no power) is degraded, not up; the adapter says why.
        return str(getattr(self.adapter, "degraded_reason", ""))

    def _changed(self, old: Health, new: Health, message: str) -> None:
        if new is Health.DEGRADED and not self.stats.consecutive_failures:
            log.error("%s: source answers but is degraded: %s", self.name, message)
            return
        if new is Health.UP:
            if old is Health.STARTING:
                log.info("%s: source up", self.name)
            else:
                log.info("%s: source recovered (was %s)", self.name, old)
            return
        kind = self._kind
        n = self.stats.consecutive_failures
        level = logging.ERROR if new is Health.DOWN else logging.WARNING
        log.log(level, "%s: %s (%d in a row, now %s): %s", self.name, kind, n, new, message)

    async def _close(self) -> None:
        try:
            # Not wait_for: on 3.11 it returns close()'s result when a stop lands in the
            # same turn, and the stop is lost (the runner polls on; a reload waits forever).
            async with time_limit(1.0):
                await self.adapter.close()
        except (TimeoutError, SourceError, OSError) as err:
            log.debug("%s: close failed: %s", self.name, err)
