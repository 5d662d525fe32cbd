"""Throttled GPU-seconds: how long each GPU ran with its clocks cut, by NVML's reason.

Two sources, one reading each per GPU per poll:

* NVML's thermal violation counter (``nvmlDeviceGetViolationStatus``,
  NVML_PERF_POLICY_THERMAL), cumulative: its step between two usable readings counts
  as reason ``thermal``, exact however far apart the polls were. The adapter marks a
  step that went backwards or ran ahead of the wall clock BAD; the step across a BAD
  reading counts nothing.
* The clock-event reasons bitmask, sampled: the interval between two readings counts
  for each reason set in the first of them. An interval longer than ``max_gap_s`` (a
  source that was down, a GPU lost) counts nothing: unknown is not throttled. In a
  poll with a usable counter reading of the GPU the two thermal bits are left to the
  counter, so one throttled second is not counted twice; without one (NVML does not
  support the counter on that GPU, or it failed this time) they count as before.

This is the outcome rackguard exists to keep at zero (``rackguard_gpu_throttled_seconds_total``).
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
# The bits NVML's thermal violation counter covers, where a GPU has one.
THERMAL_BITS = 0x020 | 0x040
COUNTER_REASON = "thermal"
MAX_GAP_S = 10.0

_Gpu = tuple[str, str]  # (gpu index label, uuid)


def _gpu(r: Reading) -> _Gpu:
    return (r.labels.get("gpu", r.sensor), r.labels.get("uuid", ""))


class ThrottleClock:
    """Seconds each GPU spent throttled, per reason, since the daemon started."""

    def __init__(self, max_gap_s: float = MAX_GAP_S) -> None:
        self._max_gap_s = max_gap_s
        self._last: dict[_Gpu, tuple[float, int]] = {}  # gpu -> (mono, mask)
        self._counter: dict[_Gpu, float] = {}  # gpu -> violation seconds last read
        self.seconds: collections.defaultdict[tuple[str, str, str], float] = (
            collections.defaultdict(float)
        )

    def observe(self, readings: Iterable[Reading]) -> None:
        """Take a poll's readings (any kind; only usable throttle readings count)."""
        masks: list[Reading] = []
        counted: set[_Gpu] = set()  # GPUs with a usable counter reading in this poll
        for r in readings:
            if r.kind is SensorKind.GPU_THERMAL_VIOLATION:
                if self._observe_counter(r):
                    counted.add(_gpu(r))
            elif r.kind is SensorKind.GPU_CLOCK_EVENT_REASONS:
                masks.append(r)  # after the counters: they decide which bits count
        for r in masks:
            self._observe_mask(r, THERMAL_BITS if _gpu(r) in counted else 0)

    def _observe_counter(self, r: Reading) -> bool:
        """Count the counter's step; True when the reading was usable."""
        gpu = _gpu(r)
        if not r.usable or r.value is None:
            self._counter.pop(gpu, None)
            return False
        previous = self._counter.get(gpu)
        self._counter[gpu] = r.value
        if previous is None:
            self.seconds[(*gpu, COUNTER_REASON)] += 0.0  # exported at 0 from the first
        elif r.value > previous:
            self.seconds[(*gpu, COUNTER_REASON)] += r.value - previous
        return True

    def _observe_mask(self, r: Reading, skip: int) -> None:
        """Count the interval since the GPU's last mask for each bit set then, but ``skip``."""
        gpu = _gpu(r)
        if not r.usable or r.value is None:
            self._last.pop(gpu, None)
            return
        previous = self._last.get(gpu)
        self._last[gpu] = (r.mono, int(r.value))
        if previous is None:
            for bit, reason in THROTTLE_REASONS:
                if not bit & skip:
                    self.seconds[(*gpu, reason)] += 0.0  # exported at 0 from the first reading
            return
        since, mask = previous
        dt = r.mono - since
        if not 0 < dt <= self._max_gap_s:
            return
        for bit, reason in THROTTLE_REASONS:
            if mask & bit & ~skip:
                self.seconds[(*gpu, reason)] += dt
