"""One poller for every periodic loop: schedule, timeout, backoff, health, log once.

The owner supplies one async ``update`` (in the spirit of Home Assistant's
DataUpdateCoordinator); the poller calls it forever. The schedule is a grid on
the event loop's monotonic clock, optionally started at a random offset and
with jittered steps, so many agents never fire together. An update that runs
past its tick skips the missed ticks rather than queueing them. A failed update
(an exception of the ``failures`` kinds, or the per-attempt timeout) waits at
least the capped, jittered backoff; any other exception ends the poller, as it
would end a hand-written loop. Health moves STARTING -> UP / DEGRADED / DOWN;
the owner hears each move once (``on_change``) and repeats are DEBUG only.

This module sits below delivery, cluster and service (daemon/__init__.py), so
each of them can use it.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import math
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from adapters.timeouts import time_limit

log = logging.getLogger(__name__)

Update = Callable[[], Awaitable[None]]


def capped_backoff(initial_s: float, max_s: float, failures: int) -> float:
    """initial, 2x, 4x ... after ``failures`` (>= 1) failures in a row, never above ``max_s``.

    Callers add their own jitter.
    """
    return min(max_s, initial_s * 2.0 ** min(max(failures, 1) - 1, 30))


class Health(enum.StrEnum):
    """A poller's health as operators see it."""

    STARTING = "starting"  # no attempt finished yet
    UP = "up"
    DEGRADED = "degraded"  # failing, fewer than down_after times in a row; or no evidence
    DOWN = "down"


@dataclass(frozen=True, slots=True)
class Backoff:
    """The wait after ``n`` failures in a row: capped_backoff times a uniform jitter factor."""

    initial_s: float
    max_s: float
    jitter: tuple[float, float] = (0.8, 1.2)

    def delay_s(self, failures: int, rng: random.Random) -> float:
        return capped_backoff(self.initial_s, self.max_s, failures) * rng.uniform(*self.jitter)


@dataclass(slots=True)
class PollStats:
    """Counters for the API and metrics."""

    attempts: int = 0
    failures: int = 0
    consecutive_failures: int = 0
    skipped_ticks: int = 0
    last_duration_s: float = 0.0
    last_success_mono: float | None = None
    last_error: str = ""


# (old, new, what failed: "" on success): called once per change of health.
HealthChange = Callable[[Health, Health, str], None]


class Poller:
    """Calls ``update`` on a grid until cancelled; never raises for a failure it expects."""

    def __init__(
        self,
        name: str,
        update: Update,
        *,
        interval_s: float | Callable[[], float],
        timeout_s: float | None = None,
        backoff: Backoff | None = None,
        down_after: int = 1,
        failures: tuple[type[Exception], ...] = (Exception,),
        spread_start: bool = False,
        step_jitter: float = 0.0,
        on_change: HealthChange | None = None,
        describe: Callable[[Exception], str] | None = None,
        on_failure: Callable[[], Awaitable[None]] | None = None,
        on_attempt: Callable[[float], None] | None = None,
        wake: asyncio.Event | None = None,
        degraded: Callable[[], str] | None = None,
        rng: random.Random | None = None,
    ) -> None:
        """``interval_s``: seconds between ticks, or a function read at every tick (reloads).

        ``spread_start``: the first tick at a random offset within one interval
        (else at once). ``step_jitter``: each step is ``interval * U(1-j, 1+j)``.
        ``backoff``: None retries a failure at the next tick. ``down_after``:
        failures in a row before DOWN (DEGRADED until then). ``describe``: the
        words for a failure (``last_error``). ``on_failure``: awaited after a
        failed attempt (drop a broken session). ``on_attempt``: each attempt's
        duration in seconds. ``wake``: set by anyone, it brings the next attempt
        forward to now (the grid starts again there); cleared as each attempt begins.
        ``degraded``: after a success, why it gave nothing of use ("" if it did):
        DEGRADED, not UP, with that as ``last_error``.
        """
        self.name = name
        self._update = update
        self._interval = interval_s if callable(interval_s) else (lambda: interval_s)
        self.timeout_s = timeout_s
        self.backoff = backoff
        self.down_after = down_after
        self._failures = failures
        self._spread_start = spread_start
        self._step_jitter = step_jitter
        self._on_change = on_change or self._log_change
        self._describe = describe or _describe
        self._on_failure = on_failure
        self._on_attempt = on_attempt
        self._wake = wake
        self._degraded = degraded
        self._rng = rng or random.Random()
        self.health = Health.STARTING
        self.stats = PollStats()
        self.first_attempt = asyncio.Event()

    def backoff_s(self, failures: int) -> float:
        """The least wait before the next attempt after ``failures`` failures in a row."""
        return self.backoff.delay_s(failures, self._rng) if self.backoff is not None else 0.0

    async def run(self) -> None:
        """Poll until cancelled."""
        loop = asyncio.get_running_loop()
        at = loop.time()
        if self._spread_start:
            at += self._rng.uniform(0, self._interval())
        while True:
            at = await self._until(at)
            began = loop.time()
            ok = await self.attempt()
            earliest = loop.time()
            if not ok:
                earliest = max(earliest, began + self.backoff_s(self.stats.consecutive_failures))
            step = self._interval()
            if self._step_jitter:
                step *= self._rng.uniform(1 - self._step_jitter, 1 + self._step_jitter)
            # The next grid tick at or after `earliest`; the ticks in between are skipped.
            n = max(1, math.ceil((earliest - at) / step - 1e-9))
            if ok and n > 1:
                self.stats.skipped_ticks += n - 1
                log.debug("%s: attempt overran its interval; skipped %d tick(s)", self.name, n - 1)
            at += n * step

    async def _until(self, at: float) -> float:
        """Wait for the tick at ``at``, or for a wake; the time the attempt is due."""
        loop = asyncio.get_running_loop()
        delay = at - loop.time()
        if self._wake is None:
            if delay > 0:
                await asyncio.sleep(delay)
            return at
        if delay > 0 and not self._wake.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await self._wake.wait()
        if self._wake.is_set():
            at = min(at, loop.time())
        self._wake.clear()
        return at

    async def attempt(self) -> bool:
        """One update under the per-attempt timeout; True on success."""
        loop = asyncio.get_running_loop()
        began = loop.time()
        self.stats.attempts += 1
        try:
            async with time_limit(self.timeout_s):
                await self._update()
        except TimeoutError:
            self._failed(f"timed out after {self.timeout_s:g}s")
        except self._failures as err:
            self._failed(self._describe(err))
        else:
            self._succeeded()
            return self._finish(began, ok=True)
        if self._on_failure is not None:
            await self._on_failure()
        return self._finish(began)

    def _finish(self, began: float, *, ok: bool = False) -> bool:
        duration = asyncio.get_running_loop().time() - began
        self.stats.last_duration_s = duration
        self.first_attempt.set()
        if self._on_attempt is not None:
            self._on_attempt(duration)
        return ok

    def _succeeded(self) -> None:
        self.stats.consecutive_failures = 0
        self.stats.last_success_mono = asyncio.get_running_loop().time()
        why = self._degraded() if self._degraded is not None else ""
        if why:
            self.stats.last_error = why
        new = Health.DEGRADED if why else Health.UP
        if self.health is not new:
            old, self.health = self.health, new
            self._on_change(old, new, why)

    def _failed(self, message: str) -> None:
        self.stats.failures += 1
        self.stats.consecutive_failures += 1
        self.stats.last_error = message
        n = self.stats.consecutive_failures
        new = Health.DOWN if n >= self.down_after else Health.DEGRADED
        if new is not self.health:
            old, self.health = self.health, new
            self._on_change(old, new, message)
        else:
            log.debug("%s: failed again (%d in a row): %s", self.name, n, message)

    def _log_change(self, old: Health, new: Health, message: str) -> None:
        if new is Health.UP:
            log.info("%s: up" if old is Health.STARTING else "%s: recovered", self.name)
        else:
            level = logging.ERROR if new is Health.DOWN else logging.WARNING
            log.log(level, "%s: failed (now %s): %s", self.name, new, message)


def _describe(err: Exception) -> str:
    return str(err) or type(err).__name__
