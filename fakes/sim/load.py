"""Whether this host keeps the asked speed: an honest simulation says when it did not.

At ``speed`` x the agents' GPU polls get ``1 / speed`` wall seconds and time
out after 80% of that; a busy host misses such deadlines, and a late event loop
skips simulated time the agents never saw. Either changes the answer, so the
run is marked INVALID (and says so at once) rather than scored as if it were
sound. :func:`poll_timeout_note` says why a speed that asks for poll timeouts
below :data:`MIN_POLL_TIMEOUT_S` is lowered before the run.
"""

from __future__ import annotations

import time
from collections.abc import Callable

MIN_POLL_TIMEOUT_S = 0.05  # below this, a loaded host misses GPU polls (x40: 0.02 s failed)
# A loop stall worth this many simulated seconds invalidates the run: the demo's
# agents call a GPU reading stale after 5 simulated seconds (stale_after_s).
MAX_LAG_SIM_S = 5.0
MIN_LAG_BOUND_S = 0.1


def poll_timeout_s(speed: float, poll_sim_s: float = 1.0) -> float:
    """The GPU poll timeout the agents get at ``speed`` (80% of the scaled interval)."""
    return poll_sim_s / speed * 0.8


def safe_speed(poll_sim_s: float = 1.0) -> float:
    """The highest speed whose GPU poll timeouts stay at or above MIN_POLL_TIMEOUT_S."""
    return poll_sim_s * 0.8 / MIN_POLL_TIMEOUT_S


def poll_timeout_note(speed: float) -> str:
    """A warning when ``speed`` asks for poll timeouts below what a busy host meets ("" if not)."""
    timeout = poll_timeout_s(speed)
    if timeout >= MIN_POLL_TIMEOUT_S:
        return ""
    return (
        f"x{speed:g} gives the agents GPU poll timeouts of {timeout:.3f} s, below the"
        f" {MIN_POLL_TIMEOUT_S} s a busy host can be trusted to meet (x{safe_speed():g} or"
        " less is safe)"
    )


class LoadWatch:
    """Measures the event loop's lateness around each step's sleep; the first breach invalidates."""

    def __init__(self, speed: float, say: Callable[[str], None]) -> None:
        self.speed = speed
        self.bound_s = max(MIN_LAG_BOUND_S, MAX_LAG_SIM_S / speed)
        self._say = say
        self.worst_lag_s = 0.0
        self.invalid = ""  # why the run's result is not valid, "" while it is
        self._since = time.monotonic()

    def before_sleep(self) -> None:
        """Mark the start of a sleep."""
        self._since = time.monotonic()

    def after_sleep(self, asked_s: float) -> None:
        """The sleep of ``asked_s`` ended: how late was it?"""
        lag = time.monotonic() - self._since - asked_s
        self.worst_lag_s = max(self.worst_lag_s, lag)
        if lag > self.bound_s:
            self.breach(
                f"the event loop lagged {lag:.2f} s (bound {self.bound_s:.2f} s at x{self.speed:g})"
            )

    def breach(self, what: str) -> None:
        """Invalidate the run (once), saying so at once."""
        if self.invalid:
            return
        self.invalid = f"{what}: this host cannot keep x{self.speed:g}"
        self._say(f"INVALID RUN: {self.invalid}; lower --speed")
