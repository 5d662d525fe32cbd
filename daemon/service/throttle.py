"""Throttled GPU-seconds: how long each GPU ran with its clocks cut, by NVML's reason.

Integrated from the NVML source's clock-event reasons bitmask (one reading per
GPU per poll): the interval between two readings of a GPU counts for each
reason set in the first of them. An interval longer than ``max_gap_s`` (a
source that was down, a GPU lost) counts nothing: unknown is not throttled.
This is the outcome rackguard exists to keep at zero
(``rackguard_gpu_throttled_seconds_total``).
"""

from __future__ import annotations

import collections
from collections.abc import Iterable

from policies.model import Reading, SensorKind

# The reasons that mean heat or power cut the clocks (nvmlClocksEventReason* bits).
THROTTLE_REASONS: tuple[tuple[int, str], ...] = (
    (0x008, "hw_slowdown"),
    (0x020, "sw_thermal_slowdown"),
    (0x040, "hw_thermal_slowdown"),
    (0x080, "hw_power_brake_slowdown"),
)
THROTTLE_MASK = sum(bit for bit, _ in THROTTLE_REASONS)
MAX_GAP_S = 10.0


class ThrottleClock:
    """Seconds each GPU spent throttled, per reason, since the daemon started."""

    def __init__(self, max_gap_s: float = MAX_GAP_S) -> None:
        self._max_gap_s = max_gap_s
        self._last: dict[tuple[str, str], tuple[float, int]] = {}  # (gpu, uuid) -> (mono, mask)
        self.seconds: collections.defaultdict[tuple[str, str, str], float] = (
            collections.defaultdict(float)
        )

    def observe(self, readings: Iterable[Reading]) -> None:
        """Take a poll's readings (any kind; only usable clock-event readings count)."""
        for r in readings:
            if r.kind is not SensorKind.GPU_CLOCK_EVENT_REASONS:
                continue
            gpu = (r.labels.get("gpu", r.sensor), r.labels.get("uuid", ""))
            if not r.usable or r.value is None:
                self._last.pop(gpu, None)
                continue
            previous = self._last.get(gpu)
            self._last[gpu] = (r.mono, int(r.value))
            if previous is None:
                for _, reason in THROTTLE_REASONS:
                    self.seconds[(*gpu, reason)] += 0.0  # exported at 0 from the first reading
                continue
            since, mask = previous
            dt = r.mono - since
            if not 0 < dt <= self._max_gap_s:
                continue
            for bit, reason in THROTTLE_REASONS:
                if mask & bit:
                    self.seconds[(*gpu, reason)] += dt
