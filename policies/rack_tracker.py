"""One rack's shared evidence: inlet air, coolant and PDU series, and loss runs.

Slow series (inlet air, coolant supply and return, flow) keep a forecaster and a
plain bucket window for their range; state series (pumps, leak sensors, PDU power,
the cooling unit's own supply limit) only their latest reading. Flow and pump
series also keep their run of samples showing loss, which confirms lost flow.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import InitVar, dataclass, field
from typing import ClassVar, Final

from policies.forecast import SeriesForecaster
from policies.freshness import absent, fresh_value
from policies.kernel.buckets import BucketWindow
from policies.model import Reading, SensorKind
from policies.settings import PolicySettings


@dataclass(frozen=True, slots=True)
class RackStamp:
    """A rack's readings as read at ``at``: see :meth:`RackTracker.reads_as`."""

    version: int
    at: float
    oldest_fresh: float | None  # the time of the oldest reading fresh at ``at``
    silent: bool  # the cooling unit silent at ``at``


@dataclass(slots=True)
class LossRun:
    """A run of successive samples of one series that all showed loss (flow low, pump stopped)."""

    since: float | None = None  # the first sample of the current run
    last: float | None = None  # its newest sample

    def update(self, mono: float, lost: bool) -> None:
        """One fresh usable sample; a sample without loss ends the run."""
        if not lost:
            self.since = self.last = None
        else:
            self.since = mono if self.since is None else self.since
            self.last = mono

    def confirmed(self, confirm_s: float) -> bool:
        """Two samples at least ``confirm_s`` apart showed loss, and none between did not."""
        return (
            self.since is not None
            and self.last is not None
            and self.last - self.since >= confirm_s - 1e-6
        )


@dataclass(slots=True, eq=False)
class SlowSeries:
    """A rack-level slow series: latest reading, forecaster, and plain windows for its range.

    ``raw`` (never restarted, so the range survives fast changes) gives the window's
    lowest and newest bucket means. ``sustained_high`` is the highest level the
    series held over two successive buckets within the last ``REFERENCE_S`` (or
    ``trend_window_s`` if longer): one glitch sample moves one bucket only, and a
    level from long ago does not stay the reference for good.
    """

    REFERENCE_S: ClassVar[float] = 1800.0

    settings: InitVar[PolicySettings]
    max_rate_per_min: InitVar[float | None]
    latest: Reading | None = field(init=False, default=None)
    ever_usable: bool = field(init=False, default=False)
    forecaster: SeriesForecaster = field(init=False)
    raw: BucketWindow = field(init=False)
    _reference_s: float = field(init=False)
    _prev: float | None = field(init=False, default=None)  # the bucket closed before the newest
    # (bucket time, level held over it and the bucket before), levels decreasing:
    # a sliding-window maximum, O(1) amortised per bucket, bounded by the window.
    _peaks: deque[tuple[float, float]] = field(init=False, default_factory=deque)
    _prev_sample: float | None = field(init=False, default=None)  # the usable one before

    def __post_init__(self, settings: PolicySettings, max_rate_per_min: float | None) -> None:
        self.forecaster = SeriesForecaster(settings.trend(max_rate_per_min))
        self.raw = BucketWindow(settings.trend_bucket_s, settings.trend_window_s)
        self._reference_s = max(settings.trend_window_s, self.REFERENCE_S)

    def observe(self, r: Reading) -> None:
        """Take one reading of this series."""
        self.latest = r
        value = r.value
        if value is not None and r.usable:
            mono = r.mono
            self.ever_usable = True
            self.forecaster.add(mono, value)
            last_t, last_value = self.raw.last_t, self.raw.last_value
            if self.raw.add(mono, value):
                self._closed()
            if self.raw.last_t != last_t:  # taken (not a repeat, not out of order)
                self._prev_sample = last_value

    def _closed(self) -> None:
        bucket = self.raw.newest
        assert bucket is not None
        prev, self._prev = self._prev, bucket.value
        if prev is None:
            return
        held = min(prev, bucket.value)
        peaks = self._peaks
        while peaks and peaks[-1][1] <= held:
            peaks.pop()
        peaks.append((bucket.t, held))
        while peaks[0][0] < bucket.t - self._reference_s:
            peaks.popleft()

    @property
    def absent(self) -> bool:
        """Reported absent (no probe fitted, not on the device) and never present."""
        return absent(self.latest, self.ever_usable)

    @property
    def sustained_high(self) -> float | None:
        """The highest level held over two successive buckets in the reference window."""
        return self._peaks[0][1] if self._peaks else None

    def window_low(self) -> float | None:
        """The lowest level held over two successive buckets in the window.

        One low sample cannot set it: a CDU polled every 15 s puts one sample in
        each bucket, and over a window of twenty such samples the noise alone
        spans about supply_rise_c from the lowest to the newest.
        """
        buckets = self.raw.buckets()
        if len(buckets) < 2:
            return buckets[0].value if buckets else None
        # min(max(a.value, b.value) for a, b in pairwise(buckets)), written out: the
        # first-found value on ties matters (-0.0 beside 0.0).
        low = math.inf
        prev = buckets[0].value
        for i in range(1, len(buckets)):
            value = buckets[i].value
            held = value if value > prev else prev  # max(prev, value)
            if i == 1 or held < low:  # min(): the first, then only a lower one
                low = held
            prev = value
        return low

    def held_level(self) -> float | None:
        """The current level, robust to one noisy sample.

        The higher of the newest closed bucket's mean (one sample is averaged in)
        and the lower of the last two samples (a real step shows at once, one
        sample alone cannot).
        """
        levels = []
        newest = self.raw.newest
        if newest is not None:
            levels.append(newest.value)
        last = self.raw.last_value
        if last is not None and self._prev_sample is not None:
            levels.append(min(last, self._prev_sample))
        return max(levels) if levels else None


# Rack-level kinds the policy forecasts.
_SLOW_RACK_KINDS: Final = (
    SensorKind.INLET_TEMPERATURE,
    SensorKind.COOLANT_SUPPLY_TEMPERATURE,
    SensorKind.COOLANT_RETURN_TEMPERATURE,
    SensorKind.COOLANT_FLOW,
)
# Rack-level kinds the policy only needs the latest value of.
_STATE_RACK_KINDS: Final = (
    SensorKind.PUMP_STATE,
    SensorKind.LEAK,
    SensorKind.POWER,
    SensorKind.COOLANT_SUPPLY_LIMIT,
)
# Kinds whose polls tell whether the cooling unit is answering.
_COOLANT_KINDS: Final = frozenset(
    {
        SensorKind.COOLANT_SUPPLY_TEMPERATURE,
        SensorKind.COOLANT_RETURN_TEMPERATURE,
        SensorKind.COOLANT_FLOW,
        SensorKind.PUMP_STATE,
        SensorKind.LEAK,
    }
)


@dataclass(eq=False)
class RackTracker:
    """The shared evidence of one rack: inlet air, coolant and PDU, per series."""

    settings: PolicySettings
    slow: dict[SensorKind, dict[str, SlowSeries]] = field(
        init=False, default_factory=lambda: {k: {} for k in _SLOW_RACK_KINDS}
    )
    state: dict[SensorKind, dict[str, Reading]] = field(
        init=False, default_factory=lambda: {k: {} for k in _STATE_RACK_KINDS}
    )
    present: set[str] = field(init=False, default_factory=set)  # ever usable state series
    runs: dict[str, LossRun] = field(init=False, default_factory=dict)  # flow and pump series
    # When the cooling unit last answered, and its usual poll interval.
    coolant_last: float | None = field(init=False, default=None)
    coolant_interval_s: float | None = field(init=False, default=None)
    # Bumped at each reading taken and each reload: what is remembered from this
    # rack's readings (the reference, a RackStamp) holds only while it is unchanged.
    version: int = field(init=False, default=0)
    _reference: tuple[float, int, float | None] | None = field(init=False, default=None)

    def configure(self, settings: PolicySettings) -> None:
        """Read these settings from now on (a reload that keeps the windows' shape)."""
        self.settings = settings
        self.version += 1  # what was found with the old staleness is not reused

    def observe(self, r: Reading) -> None:
        """Take one rack-level reading; kinds the policy does not use are ignored."""
        self.version += 1
        # Each field read once: the key is a property of a Reading, built when read.
        kind, value, mono = r.kind, r.value, r.mono
        ok = r.usable
        if ok and kind in _COOLANT_KINDS:
            # Only data counts as the unit answering: an adapter reporting a silent
            # subscription stamps BAD readings at every poll.
            self._polled(mono)
        key = r.key
        by_key = self.slow.get(kind)
        if by_key is not None:
            series = by_key.get(key)
            if series is None:
                s = self.settings
                rate = None if kind is SensorKind.COOLANT_FLOW else s.max_air_rate_c_per_min
                series = by_key[key] = SlowSeries(s, rate)
            high = series.sustained_high
            series.observe(r)
            if kind is SensorKind.COOLANT_FLOW and ok and value is not None:
                low = (
                    high is not None and high > 0 and value < self.settings.flow_low_fraction * high
                )
                self.runs.setdefault(key, LossRun()).update(mono, low)
            return
        latest = self.state.get(kind)
        if latest is not None:
            latest[key] = r
            if ok and value is not None:
                self.present.add(key)
                if kind is SensorKind.PUMP_STATE:
                    self.runs.setdefault(key, LossRun()).update(mono, value < 0.5)

    def _polled(self, mono: float) -> None:
        last = self.coolant_last
        if last is not None and mono > last:
            gap = mono - last
            old = self.coolant_interval_s
            # The usual interval: a slow average, so one late poll does not redefine it.
            self.coolant_interval_s = gap if old is None else old + 0.2 * (gap - old)
        if last is None or mono > last:
            self.coolant_last = mono

    def reference(self, now: float) -> float | None:
        """What the GPUs reject heat to: the highest fresh coolant supply, else inlet air."""
        # Asked at every GPU temperature sample: remembered until a reading or time moves.
        last = self._reference
        if last is not None and last[0] == now and last[1] == self.version:
            return last[2]
        value = self._reference_now(now)
        self._reference = (now, self.version, value)
        return value

    def _reference_now(self, now: float) -> float | None:
        stale = self.settings.rack_stale_after_s
        for kind in (SensorKind.COOLANT_SUPPLY_TEMPERATURE, SensorKind.INLET_TEMPERATURE):
            values = [
                v
                for x in self.slow[kind].values()
                if (v := fresh_value(x.latest, now, stale)) is not None
            ]
            if values:
                return max(values)
        return None

    def stamp(self, now: float) -> RackStamp:
        """What reading this rack at ``now`` depends on, for :meth:`reads_as`."""
        stale = self.settings.rack_stale_after_s
        slow = [x.latest for by_key in self.slow.values() for x in by_key.values()]
        state = [r for by_key in self.state.values() for r in by_key.values()]
        fresh = [
            r.mono
            for r in (*slow, *state)
            if r is not None and fresh_value(r, now, stale) is not None
        ]
        return RackStamp(self.version, now, min(fresh, default=None), self.coolant_silent(now))

    def reads_as(self, stamp: RackStamp, now: float) -> bool:
        """Every reading is as fresh, and the cooling unit as silent, at ``now`` as at the stamp's.

        Nothing was taken since; time has not gone back, so what was stale is still
        stale; and the oldest reading that was fresh still is, so (subtraction being
        monotonic) every newer one is too.
        """
        oldest = stamp.oldest_fresh
        return (
            stamp.version == self.version
            and now >= stamp.at
            and (oldest is None or now - oldest <= self.settings.rack_stale_after_s)
            and self.coolant_silent(now) == stamp.silent
        )

    def coolant_silent(self, now: float) -> bool:
        """The cooling unit has missed two polls (or never answered with data)."""
        if self.coolant_last is None:
            return True
        interval = self.coolant_interval_s or self.settings.rack_stale_after_s / 2
        return now - self.coolant_last > 2.0 * interval + 1.0
