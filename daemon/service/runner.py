"""One runner wraps every sensor adapter: schedule, timeout, backoff, health.

The schedule is a grid on the event loop's monotonic clock, started at a random
offset so many agents (and many sources) never fire together. An attempt that
runs past its tick skips the missed ticks rather than queueing them. A failing
source backs off exponentially (capped, jittered); health moves
STARTING -> UP / DEGRADED / DOWN and each move is logged once.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from adapters.base import SensorAdapter
from adapters.errors import SourceAuthError, SourceError, SourceSetupError
from daemon.config.sources import SourceTiming
from daemon.service.backoff import capped_backoff
from policies.model import Reading

log = logging.getLogger(__name__)


class Health(enum.StrEnum):
    """A source's health as operators see it."""

    STARTING = "starting"  # no attempt finished yet
    UP = "up"
    DEGRADED = "degraded"  # failing, fewer than down_after times in a row; or no evidence
    DOWN = "down"


@dataclass(slots=True)
class RunnerStats:
    """Counters for the API and metrics."""

    attempts: int = 0
    failures: int = 0
    consecutive_failures: int = 0
    skipped_ticks: int = 0
    last_duration_s: float = 0.0
    last_success_mono: float | None = None
    last_error: str = ""


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
        self._rng = rng or random.Random()
        self.health = Health.STARTING
        self.stats = RunnerStats()
        self.first_attempt = asyncio.Event()
        self._connected = False

    def backoff_s(self, failures: int) -> float:
        """Delay before the next attempt after ``failures`` failures in a row (>= 1)."""
        t = self.timing
        return capped_backoff(t.backoff_initial_s, t.backoff_max_s, failures) * self._rng.uniform(
            0.8, 1.2
        )

    async def run(self) -> None:
        """Poll until cancelled."""
        loop = asyncio.get_running_loop()
        interval = self.timing.interval_s
        start = loop.time() + self._rng.uniform(0, interval)
        tick = 0
        try:
            while True:
                delay = start + tick * interval - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                began = loop.time()
                ok = await self.attempt()
                earliest = loop.time()
                if not ok:
                    backoff = self.backoff_s(self.stats.consecutive_failures)
                    earliest = max(earliest, began + backoff)
                # The next grid tick at or after `earliest`; the ticks in between are skipped.
                following = max(tick + 1, math.ceil((earliest - start) / interval - 1e-9))
                if ok and following > tick + 1:
                    self.stats.skipped_ticks += following - tick - 1
                    log.debug(
                        "%s: attempt overran its interval; skipped %d tick(s)",
                        self.name,
                        following - tick - 1,
                    )
                tick = following
        finally:
            await self._close()

    async def attempt(self) -> bool:
        """One connect-if-needed + read under the per-attempt timeout; True on success."""
        loop = asyncio.get_running_loop()
        began = loop.time()
        self.stats.attempts += 1
        try:
            async with asyncio.timeout(self.timing.timeout_s):
                if not self._connected:
                    await self.adapter.connect()
                    self._connected = True
                readings = await self.adapter.read()
        except TimeoutError:
            self._failed(f"timed out after {self.timing.timeout_s:g}s", None)
        except SourceError as err:
            self._failed(str(err) or type(err).__name__, err)
        except Exception as err:
            # A device's answer tripped something in its adapter: that is one
            # source failing, never the daemon (the others keep polling).
            if not self.stats.consecutive_failures:
                log.error("%s: adapter error, treated as a failed poll", self.name, exc_info=True)
            self._failed(f"adapter error: {type(err).__name__}: {err}", None)
        else:
            self._succeeded()
            self._on_readings(self.name, readings)
            return self._finish(began, ok=True)
        # A failed session is rebuilt from scratch on the next attempt.
        self._connected = False
        await self._close()
        return self._finish(began)

    def _finish(self, began: float, *, ok: bool = False) -> bool:
        duration = asyncio.get_running_loop().time() - began
        self.stats.last_duration_s = duration
        self.first_attempt.set()
        if self._on_attempt is not None:
            self._on_attempt(self, duration)
        return ok

    def _succeeded(self) -> None:
        self.stats.consecutive_failures = 0
        self.stats.last_success_mono = asyncio.get_running_loop().time()
        # A device that answers but gives nothing rackguard uses (a PDU whose profile
        # reads no probe, no power) is degraded, not up; the adapter says why.
        why = getattr(self.adapter, "degraded_reason", "")
        if why:
            self.stats.last_error = why
            if self.health is not Health.DEGRADED:
                log.error("%s: source answers but is degraded: %s", self.name, why)
                self.health = Health.DEGRADED
        elif self.health is not Health.UP:
            if self.health is Health.STARTING:
                log.info("%s: source up", self.name)
            else:
                log.info("%s: source recovered (was %s)", self.name, self.health)
            self.health = Health.UP

    def _failed(self, message: str, err: SourceError | None) -> None:
        self.stats.failures += 1
        self.stats.consecutive_failures += 1
        self.stats.last_error = message
        n = self.stats.consecutive_failures
        new = Health.DOWN if n >= self.timing.down_after else Health.DEGRADED
        kind = (
            "authentication failed"
            if isinstance(err, SourceAuthError)
            else "cannot work as configured"
            if isinstance(err, SourceSetupError)
            else "poll failed"
        )
        if new is not self.health:
            level = logging.ERROR if new is Health.DOWN else logging.WARNING
            log.log(level, "%s: %s (%d in a row, now %s): %s", self.name, kind, n, new, message)
            self.health = new
        else:
            log.debug("%s: %s again (%d in a row): %s", self.name, kind, n, message)

    async def _close(self) -> None:
        try:
            await asyncio.wait_for(self.adapter.close(), timeout=1.0)
        except (TimeoutError, SourceError, OSError) as err:
            log.debug("%s: close failed: %s", self.name, err)
