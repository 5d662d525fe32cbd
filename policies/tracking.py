"""What the policy remembers per series: the latest reading, and a forecaster for slow ones.

Readings are routed by kind: ``gpu_*`` kinds belong to a node (label ``node``,
else the tracker's default node), everything else (inlet air, PDU, coolant) to a
rack (label ``rack``, else the rack of the node label, else the default rack).
Feeding the same reading twice changes nothing, so a caller may pass every
latest reading on every evaluation.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from itertools import combinations, takewhile
from operator import itemgetter, sub
from typing import ClassVar, Final

from policies.forecast import SeriesForecaster, z_for
from policies.headroom import ResistanceEstimator
from policies.model import Quality, Reading, SensorKind
from policies.settings import PolicySettings
from policies.window import BucketWindow, finite

_NOMINAL_POWER_LIMIT_W: Final = 500.0  # load-step scale when a GPU reports no power limit


_GPU_KINDS: Final = frozenset(k for k in SensorKind if k.value.startswith("gpu_"))


def gpu_kind(kind: SensorKind) -> bool:
    """True for the kinds that belong to one GPU of one node."""
    return kind in _GPU_KINDS


def absent(r: Reading | None, ever_usable: bool) -> bool:
    """A series that is absent (not fitted) and was never present: neither fault nor evidence.

    A series that was present and then reports absent is a change worth not trusting:
    it stays unknown like a BAD one.
    """
    return r is not None and r.quality is Quality.ABSENT and not ever_usable


def fresh(r: Reading | None, now: float, stale_after_s: float) -> tuple[float | None, str]:
    """The value of a reading a policy may act on now, or None and why not."""
    if r is None:
        return None, "no reading"
    if not r.usable or r.value is None:
        return None, f"{r.quality.value}: {r.reason}"
    age = now - r.mono
    if age > stale_after_s:
        return None, f"stale ({age:.0f}s old)"
    return r.value, ""


def fresh_value(r: Reading | None, now: float, stale_after_s: float) -> float | None:
    """``fresh(r, now, stale_after_s)[0]``, without the words of why not."""
    # Asked four times per GPU per evaluation: the module's Quality.GOOD, not Quality.GOOD
    # (an enum member looked up on its class costs ten times a global on Python 3.11).
    if r is None or r.quality is not Quality.GOOD:
        return None
    value = r.value
    if value is None or not finite(value) or now - r.mono > stale_after_s:
        return None
    return value


_MAX_SLOPE_POINTS: Final = 16  # bounds the pairwise fit's cost whatever the sample rate
_SLOPE_CACHE: Final = 32  # window slopes a GPU remembers (two confirm windows of 1 Hz samples fit)
_UNSEEN: Final = object()  # a slope not in the cache (None is a cached answer)
_Sample = tuple[float, float]
_Spans = tuple[int, int, int, int]  # older window start:end, newer window start:end
_time = itemgetter(0)


def median_slope(points: Iterable[tuple[float, float]]) -> float | None:
    """The median pairwise slope (Theil-Sen) of (t, value) points; None under 4 points.

    More than ``_MAX_SLOPE_POINTS`` points (a 100 Hz sampler) are averaged into that
    many consecutive groups first, so the cost stays bounded.
    """
    pts = list(points)
    if len(pts) < 4:
        return None
    if len(pts) > _MAX_SLOPE_POINTS:
        k = len(pts) / _MAX_SLOPE_POINTS
        groups = [pts[round(i * k) : round((i + 1) * k)] for i in range(_MAX_SLOPE_POINTS)]
        pts = [(sum(t for t, _ in g) / len(g), sum(v for _, v in g) / len(g)) for g in groups if g]
    slopes = [(v1 - v0) / (t1 - t0) for (t0, v0), (t1, v1) in combinations(pts, 2) if t1 > t0]
    slopes.sort()
    if not slopes:
        return None
    mid = len(slopes) // 2
    return slopes[mid] if len(slopes) % 2 else (slopes[mid - 1] + slopes[mid]) / 2.0


def _median_slope_of(times: list[float], values: list[float], start: int, end: int) -> float | None:
    """:func:`median_slope` of the points ``zip(times, values)[start:end]``, on the lists."""
    n = end - start
    if n > _MAX_SLOPE_POINTS:
        return median_slope(zip(times[start:end], values[start:end], strict=True))
    if n < 4:
        return None
    # combinations() of the points, written out: the same slopes in the same order
    # (so the same median, ties of 0.0 and -0.0 included), and loops a compiled build
    # runs on native floats, over the lists as they are (no copies of the window).
    slopes: list[float] = []
    for i in range(start, end - 1):
        t0, v0 = times[i], values[i]
        for j in range(i + 1, end):
            t1 = times[j]
            if t1 > t0:
                slopes.append((values[j] - v0) / (t1 - t0))
    slopes.sort()
    if not slopes:
        return None
    mid = len(slopes) // 2
    return slopes[mid] if len(slopes) % 2 else (slopes[mid - 1] + slopes[mid]) / 2.0


# Where a window's median pairwise slope lies against a rate limit (see _slope_side).
_NO_SLOPE: Final = 0  # no median: under 4 points, or no pair of distinct times
_WITHIN: Final = 1  # -limit <= median <= limit
_ABOVE: Final = 2  # median > limit
_BELOW: Final = 3  # median < -limit
_EXACT: Final = 4  # the counts do not tell: work the median out
_SANE_LIMIT: Final = 1e300  # beyond this, a mean of two slopes under it could overflow
_INF: Final = math.inf


def _slope_side(times: list[float], values: list[float], start: int, end: int, limit: float) -> int:
    """Where :func:`_median_slope_of` of the points ``start:end`` lies against ``limit``.

    Asked at every temperature sample and every evaluation, where only the side
    matters: counting the pairwise slopes beyond ``limit`` either way tells it without
    sorting them, except where the two middle slopes (an even count) fall on both
    sides of the limit, or a slope is not finite: then the answer is _EXACT.
    The median of an even count is the mean of the two middle slopes, which lies
    between them when they are finite and under _SANE_LIMIT (IEEE rounding is
    monotone and both ends are representable).
    """
    n = end - start
    if n < 4:
        return _NO_SLOPE
    if n > _MAX_SLOPE_POINTS or not 0.0 <= limit <= _SANE_LIMIT:
        return _EXACT
    k = above = below = 0
    infinite = False
    for i in range(start, end - 1):
        t0, v0 = times[i], values[i]
        for j in range(i + 1, end):
            t1 = times[j]
            if t1 > t0:
                s = (values[j] - v0) / (t1 - t0)
                k += 1
                # An infinite slope is beyond any finite limit: checked only there.
                if s > limit:
                    above += 1
                    infinite = infinite or s == _INF
                elif s < -limit:
                    below += 1
                    infinite = infinite or s == -_INF
    if k == 0:
        return _NO_SLOPE
    if infinite:
        return _EXACT
    half = k // 2
    # Sorted, the median is slope[half] (odd k) or the mean of slope[half - 1] and
    # slope[half] (even k); more than ``half`` slopes above the limit put both there.
    if above > half:
        return _ABOVE
    if below > half:
        return _BELOW
    if k % 2 or (above < half and below < half):
        return _WITHIN
    return _EXACT


def _sorted_values(windows: tuple[list[_Sample], list[_Sample]]) -> _Values:
    """The sorted values of the newer and the older window."""
    newer, older = windows
    return sorted([v for _, v in newer]), sorted([v for _, v in older])


def _mid(ordered: list[float]) -> float:
    """The median of sorted values (statistics.median's arithmetic, without its overhead)."""
    n = len(ordered)
    mid = n // 2
    return ordered[mid] if n % 2 else (ordered[mid - 1] + ordered[mid]) / 2.0


_Values = tuple[list[float], list[float]]  # the sorted values of the newer and older window


def _within_one_step(values: _Values) -> bool:
    """The windows' median levels differ by no more than one reading step."""
    newer, older = values
    moved = abs(_mid(newer) - _mid(older))
    distinct = sorted(set(newer).union(older))
    return moved <= min(map(sub, distinct[1:], distinct), default=0.0)


def _resolved(values: _Values, rates: tuple[float, float]) -> tuple[float, float]:
    """``rates``, or (0, 0) when the windows' levels differ by no more than one reading step."""
    return (0.0, 0.0) if _within_one_step(values) else rates


class LossRun:
    """A run of successive samples of one series that all showed loss (flow low, pump stopped)."""

    __slots__ = ("last", "since")

    def __init__(self) -> None:
        self.since: float | None = None  # the first sample of the current run
        self.last: float | None = None  # its newest sample

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


class RecentSamples:
    """The (t, value) samples of the last ``keep_s`` seconds, and their range in O(1).

    Times must increase (a sample at or before the newest is ignored). The range comes
    from sliding-window maximum and minimum deques: asked at every temperature sample,
    scanning two minutes of power samples each time dominated a replay. Samples kept
    without ``ranged`` have no range (the deques are not kept).
    """

    __slots__ = ("_highs", "_lows", "_ranged", "added", "ordered", "samples")

    def __init__(self, *, ranged: bool = True) -> None:
        self.samples: deque[tuple[float, float]] = deque()
        self.added = 0  # samples taken so far: a version number for cached results
        # Times strictly increasing, as they are unless a non-finite one was ever taken
        # (NaN compares false with the newest, so it is not refused like a repeat).
        self.ordered = True
        self._ranged = ranged
        # Candidates for the window's max (values decreasing) and min (increasing).
        self._highs: deque[tuple[float, float]] = deque()
        self._lows: deque[tuple[float, float]] = deque()

    def add(self, t: float, value: float, keep_s: float) -> None:
        """One sample; those older than ``keep_s`` before it are dropped."""
        samples = self.samples
        if samples and t <= samples[-1][0]:
            return
        if not finite(t):
            self.ordered = False
        sample = (t, value)
        samples.append(sample)
        self.added += 1
        cutoff = t - keep_s
        while samples[0][0] < cutoff:
            samples.popleft()
        if not self._ranged:
            return
        highs, lows = self._highs, self._lows
        while highs and highs[-1][1] <= value:
            highs.pop()
        highs.append(sample)
        while lows and lows[-1][1] >= value:
            lows.pop()
        lows.append(sample)
        while highs[0][0] < cutoff:
            highs.popleft()
        while lows[0][0] < cutoff:
            lows.popleft()

    def spread(self) -> float:
        """The highest minus the lowest value kept (0.0 when none)."""
        if not self.samples:
            return 0.0
        if not self._ranged:
            raise ValueError("these samples are kept without their range")
        return self._highs[0][1] - self._lows[0][1]

    @property
    def count(self) -> int:
        """Samples kept."""
        return len(self.samples)

    def values_since(self, since: float) -> list[float]:
        """The values of the newest samples back to the first older than ``since``, newest first."""
        return [v for _, v in takewhile(lambda x: x[0] >= since, reversed(self.samples))]


class TimedValues:
    """The (t, value) samples of the last ``keep_s`` seconds, as two parallel lists.

    Times must increase (a sample at or before the newest is ignored). Kept as plain
    lists from ``head`` on, so windows are found by bisection on the times and read
    as slices: the confirm windows are asked for at every temperature sample.
    """

    __slots__ = ("added", "head", "ordered", "times", "values")

    _COMPACT = 256  # dropped samples kept before the lists are shortened

    def __init__(self) -> None:
        self.times: list[float] = []
        self.values: list[float] = []
        self.head = 0  # the oldest sample kept
        self.added = 0  # samples taken so far: a version number for cached results
        # Times strictly increasing, as they are unless a non-finite one was ever taken
        # (NaN compares false with the newest, so it is not refused like a repeat).
        self.ordered = True

    def add(self, t: float, value: float, keep_s: float) -> None:
        """One sample; those older than ``keep_s`` before it are dropped."""
        times = self.times
        if len(times) > self.head and t <= times[-1]:
            return
        if not finite(t):
            self.ordered = False
        times.append(t)
        self.values.append(value)
        self.added += 1
        cutoff = t - keep_s
        head = self.head
        while times[head] < cutoff:
            head += 1
        if head >= self._COMPACT:
            del times[:head]
            del self.values[:head]
            head = 0
        self.head = head

    @property
    def first(self) -> int:
        """The sequence number (in every sample taken) of ``times[0]``."""
        return self.added - len(self.times)

    @property
    def samples(self) -> list[tuple[float, float]]:
        """The samples kept, oldest first."""
        head = self.head
        return list(zip(self.times[head:], self.values[head:], strict=True))


class GpuTracker:
    """One GPU: its latest readings, its thermal-margin forecaster and load-step detection."""

    __slots__ = (
        "_limit_t",
        "_limit_v",
        "_power",
        "_power_ref",
        "_power_t",
        "_power_v",
        "_settings",
        "_shut_t",
        "_shut_v",
        "_side_found",
        "_side_key",
        "_side_limit",
        "_slopes",
        "_slow_good",
        "_slow_raw",
        "_slow_t",
        "_slow_v",
        "_spans_added",
        "_spans_at",
        "_spans_found",
        "_temp_t",
        "_temp_v",
        "limit",
        "load_steps",
        "margin",
        "power",
        "recent_power",
        "recent_temp",
        "resistance",
        "shutdown",
        "slowdown",
        "step_times",
        "temperature",
    )

    def __init__(self, settings: PolicySettings) -> None:
        self.configure(settings)
        self.temperature: Reading | None = None
        self.slowdown: Reading | None = None
        self.shutdown: Reading | None = None
        self.power: Reading | None = None
        self.limit: Reading | None = None
        # What the evaluation and the resistance estimate read of those readings, taken
        # once as they arrive: compiled, each field of a Reading (a msgspec Struct) is a
        # generic attribute read, and these were read for every sample and evaluation.
        # A value is NaN unless its reading is usable; a time is NaN with no reading.
        self._temp_v = self._temp_t = math.nan
        self._slow_v = self._slow_t = math.nan
        self._slow_good = False  # the slowdown reading is GOOD (the margin's condition)
        self._slow_raw = math.nan  # its value, when GOOD
        self._shut_v = self._shut_t = math.nan
        self._power_v = self._power_t = math.nan
        self._limit_v: float | None = None  # the power limit, when usable
        self._limit_t = math.nan
        self.margin = SeriesForecaster(
            settings.trend(settings.max_gpu_rate_c_per_min), floor=settings.critical_margin_c
        )
        self._power = BucketWindow(settings.trend_bucket_s, 2 * settings.trend_bucket_s)
        self._power_ref: float | None = None
        self.load_steps = 0
        self.step_times: deque[float] = deque(maxlen=16)  # recent load steps (bucket times)
        # Raw samples for the fast signature (heating with flat power): temperatures over
        # two confirm windows, power over the settle time (a step's heating lasts that long).
        self.recent_temp = TimedValues()
        self.recent_power = RecentSamples()
        # The slopes of recent windows (a pure function of their samples), by place.
        self._slopes: dict[int, float | None] = {}
        # Twice the fewest buckets a fit needs: enough for the median's bounds, short enough
        # to follow a cold plate that degrades or is repaired within a few minutes.
        keep = 2 * settings.trend_min_points
        self.resistance = ResistanceEstimator(
            settings.trend_bucket_s, keep, z_for(settings.confidence)
        )

    def configure(self, settings: PolicySettings) -> None:
        """Read these settings from now on (a reload that keeps the windows' shape)."""
        self._settings = settings
        # The windows' place last found, at what time after how many samples taken:
        # forgotten, as the windows' width may have changed.
        self._spans_at = math.nan  # equal to no time
        self._spans_added = -1
        self._spans_found: _Spans | None = None
        # The last window _side placed, against which limit, and where (-1: none yet).
        self._side_key = -1
        self._side_limit = math.nan
        self._side_found = _NO_SLOPE

    @property
    def temperature_at(self) -> float:
        """The monotonic time of the latest temperature reading (NaN: none yet)."""
        return self._temp_t

    def sample_resistance(self, reference: float | None) -> None:
        """Feed the thermal-resistance estimate with the latest temperature reading, if steady.

        Called after :meth:`observe` took that reading: it reads what observe kept of it
        (its value when usable, its time), not the reading's fields again.
        """
        watts = self._power_v  # NaN: no usable power reading
        value = self._temp_v  # NaN unless the reading is usable
        if reference is None or not finite(watts) or not finite(value):
            return
        now = self._temp_t
        if now - self._power_t > self._settings.stale_after_s:
            return
        # Asked at every temperature sample, the replay's hot path: each step below is
        # taken only when its answer can change what is kept.
        spans = self._spans(now)
        if spans is None:
            self._sample_scanning(now, value, reference, watts)
            return
        o_start, o_end, n_start, n_end = spans
        temps = self.recent_temp.values
        # Cooling at this power, the GPU reads above its steady temperature: the
        # newer window's highest reading bounds the resistance from above. The newest
        # reading's ratio bounds that bound from below, so when no kept sample is above
        # it (the common case) the window is not scanned.
        if (
            watts > 0.0
            and n_end > n_start
            and not self.resistance.highest <= (temps[n_end - 1] - reference) / watts
        ):
            bound = (max(temps[n_start:n_end]) - reference) / watts
            if self.resistance.capped_by(bound):
                values = sorted(temps[n_start:n_end]), sorted(temps[o_start:o_end])
                if self._cooling_at_flat_power(values, now):
                    self.resistance.cap(bound)
        # Not steady while power moves, or while heating faster than a load step would
        # (only the newer window counts here; the rate needs both to be defined).
        steady = self.power_steady()
        # |a| <= fastest (a: the newer window's slope) is steady whatever the older
        # window says, and whatever one reading step resolves it to (0.0 is slower).
        if (
            steady
            and self._beyond(n_start, n_end, self._settings.max_gpu_rate_c_per_s)
            and self._slope(o_start, o_end) is not None
        ):
            values = sorted(temps[n_start:n_end]), sorted(temps[o_start:o_end])
            steady = _within_one_step(values)
        self.resistance.add(now, value - reference, watts, steady)

    def _sample_scanning(self, now: float, value: float, reference: float, watts: float) -> None:
        """sample_resistance by its definition, for samples whose times are out of order."""
        values = self._values_of(now, None)
        if self._cooling_at_flat_power(values, now) and watts > 0.0:
            self.resistance.cap((values[0][-1] - reference) / watts)
        rates = self.heating_rate(now)
        fastest = self._settings.max_gpu_rate_c_per_s
        steady = self.power_steady() and (rates is None or abs(rates[0]) <= fastest)
        self.resistance.add(now, value - reference, watts, steady)

    def fast_heating(self, now: float, fastest: float) -> float | None:
        """The newer window's heating rate (C/s) when both windows' exceed ``fastest`` > 0.

        ``heating_rate`` compared with ``fastest``, asked at every evaluation: the
        windows' levels are compared only when both slopes are that fast.
        """
        spans = self._spans(now)
        if spans is None:
            rates = self.heating_rate(now)
        else:
            o_start, o_end, n_start, n_end = spans
            if not (self._above(n_start, n_end, fastest) and self._above(o_start, o_end, fastest)):
                return None
            a, b = self._slope(n_start, n_end), self._slope(o_start, o_end)
            if a is None or b is None:  # not after _above: for the type checker
                return None
            rates = _resolved(self._values_of(now, spans), (a, b))
        if rates is None:
            return None
        newer, older = rates
        return newer if newer > fastest and older > fastest else None

    def heating_rate(self, now: float) -> tuple[float, float] | None:
        """The temperature slope (C/s) over the last and the previous confirm window.

        None until both windows hold enough samples: one sample cannot make a rate,
        and a rise must last two windows to count (a blip that recovers does not).
        (0.0, 0.0) when the windows' levels differ by no more than one reading step:
        NVML reports whole degrees, and over a few seconds a steady temperature reads
        as one step up or down, whose pairwise slope looks like fast heating.
        """
        return self._rates_of(now, self._spans(now), None)

    def _rates_of(
        self, now: float, spans: _Spans | None, values: _Values | None
    ) -> tuple[float, float] | None:
        """heating_rate at ``now`` given the windows' place (and sorted values, when taken)."""
        if spans is None:
            newer, older = self._windows_of(now, None)
            a, b = median_slope(newer), median_slope(older)
        else:
            a = self._slope(spans[2], spans[3])
            b = self._slope(spans[0], spans[1]) if a is not None else None
        if a is None or b is None:
            return None
        return _resolved(values or self._values_of(now, spans), (a, b))

    def _side(self, start: int, end: int, limit: float) -> int:
        """_slope_side of the kept samples ``start:end``, the last answer remembered."""
        # Asked at a sample for the newer window and again at the evaluation after it,
        # usually the same window: keyed as _slope keys its cache.
        recent = self.recent_temp
        key = (recent.added - len(recent.times) + start) << 32 | (end - start)
        if key == self._side_key and limit == self._side_limit:
            return self._side_found
        side = _slope_side(recent.times, recent.values, start, end, limit)
        self._side_key, self._side_limit, self._side_found = key, limit, side
        return side

    def _beyond(self, start: int, end: int, limit: float) -> bool:
        """``abs(a) > limit`` for ``a = self._slope(start, end)`` (False for None)."""
        side = self._side(start, end, limit)
        if side == _EXACT:
            a = self._slope(start, end)
            return a is not None and abs(a) > limit
        return _ABOVE <= side <= _BELOW

    def _above(self, start: int, end: int, limit: float) -> bool:
        """``not (a is None or a <= limit)`` for ``a = self._slope(start, end)``."""
        side = self._side(start, end, limit)
        if side == _EXACT:
            a = self._slope(start, end)
            return not (a is None or a <= limit)
        return side == _ABOVE

    def _slope(self, start: int, end: int) -> float | None:
        """median_slope of the kept samples ``start:end`` (list indices), remembered."""
        # Times strictly increase: a window is a run of samples, and a run's place in
        # the sequence of every sample taken names its content.
        if end - start < 4:
            return None
        recent = self.recent_temp
        first = recent.added - len(recent.times)
        # One int for (first sample, length): no tuple to build and hash per look-up.
        key = (first + start) << 32 | (end - start)
        cache = self._slopes
        slope = cache.get(key, _UNSEEN)
        if slope is not _UNSEEN:
            return slope  # type: ignore[return-value]  # a float or None, as stored
        slope = _median_slope_of(recent.times, recent.values, start, end)
        if len(cache) >= _SLOPE_CACHE:
            # Emptied, not trimmed oldest first: a dict's oldest key costs a scan over
            # the slots of keys deleted before it, and a miss is only a refit.
            cache.clear()
        cache[key] = slope
        return slope

    def _spans(self, now: float) -> _Spans | None:
        """Where the older and the newer confirm window lie in the kept samples' lists.

        None when they cannot be found by bisection (times out of order, or ``now``
        not finite): the windows are then found by scanning.
        """
        recent = self.recent_temp
        # Asked at a sample's time and again at the evaluation after it, usually the
        # same time: remembered while no sample is taken.
        if self._spans_at == now and self._spans_added == recent.added:
            return self._spans_found
        w = self._settings.flow_loss_confirm_s
        lo, mid = now - 2 * w, now - w
        if not (recent.ordered and finite(lo) and finite(mid)):
            return None
        times, head = recent.times, recent.head
        n_end = bisect_right(times, now, head)
        o_end = bisect_right(times, mid, head, n_end)
        spans = (
            bisect_left(times, lo, head, o_end),
            o_end,
            bisect_left(times, mid, head, o_end),
            n_end,
        )
        self._spans_at, self._spans_added, self._spans_found = now, recent.added, spans
        return spans

    def _windows_of(self, now: float, spans: _Spans | None) -> tuple[list[_Sample], list[_Sample]]:
        """The temperature samples of the newer (``now - w <= t <= now``) and the older window."""
        recent = self.recent_temp
        if spans is None:
            w = self._settings.flow_loss_confirm_s
            lo, mid = now - 2 * w, now - w
            samples = recent.samples
            return (
                [p for p in samples if mid <= p[0] <= now],
                [p for p in samples if lo <= p[0] <= mid],
            )
        o_start, o_end, n_start, n_end = spans
        times, values = recent.times, recent.values
        return (
            list(zip(times[n_start:n_end], values[n_start:n_end], strict=True)),
            list(zip(times[o_start:o_end], values[o_start:o_end], strict=True)),
        )

    def _values_of(self, now: float, spans: _Spans | None) -> _Values:
        """The sorted temperatures of the newer and the older window."""
        if spans is None:
            return _sorted_values(self._windows_of(now, None))
        o_start, o_end, n_start, n_end = spans
        values = self.recent_temp.values
        return sorted(values[n_start:n_end]), sorted(values[o_start:o_end])

    def _windows(self, now: float) -> tuple[list[_Sample], list[_Sample]]:
        """The temperature samples of the newer and the older confirm window."""
        return self._windows_of(now, self._spans(now))

    def _cooling_at_flat_power(self, values: _Values, now: float) -> bool:
        """The newer window's median under the older's, power flat over both.

        Medians of three or more readings, so one glitch cannot make a GPU look
        cooling; power flat over the windows, because a GPU whose load just rose
        still cools for a moment below its new steady temperature. ``values``: the
        sorted temperatures of the newer and the older window.
        """
        newer, older = values
        if len(newer) < 3 or len(older) < 3 or _mid(newer) >= _mid(older):
            return False
        since = now - 2 * self._settings.flow_loss_confirm_s
        watts = self.recent_power.values_since(since)
        return bool(watts) and max(watts) - min(watts) <= self._load_step_w()

    def _load_step_w(self) -> float:
        limit = self._limit_v
        return self._settings.load_step_fraction * (limit or _NOMINAL_POWER_LIMIT_W)

    def power_steady(self) -> bool:
        """No power change of a load step over the settle time (and none detected)."""
        if self.recent_power.count < 2:
            return False
        return self.recent_power.spread() <= self._load_step_w()

    def observe(self, r: Reading, kind: SensorKind | None = None) -> None:
        """Take one reading of this GPU (``kind``: its kind, where the caller has read it)."""
        # The replay hot path: a GOOD reading is a usable one (Reading checks that its
        # value is finite), so `quality is GOOD` stands for the `usable` property here.
        if kind is None:
            kind = r.kind
        if kind is SensorKind.GPU_TEMPERATURE:
            self.temperature = r
            value = r.value
            mono = self._temp_t = r.mono
            self._temp_v = math.nan
            if r.quality is Quality.GOOD and value is not None:
                if finite(value):  # usable (a reading forged past its checks is not)
                    self._temp_v = value
                    self.recent_temp.add(mono, value, self._settings.temperature_keep_s)
                if self._slow_good:
                    self.margin.add(mono, self._slow_raw - value)
        elif kind is SensorKind.GPU_SLOWDOWN_THRESHOLD:
            self.slowdown = r
            value = r.value
            self._slow_t = r.mono
            self._slow_good = good = r.quality is Quality.GOOD and value is not None
            self._slow_raw = value if good and value is not None else math.nan
            self._slow_v = self._slow_raw if good and finite(self._slow_raw) else math.nan
        elif kind is SensorKind.GPU_POWER:
            self.power = r
            value = r.value
            mono = self._power_t = r.mono
            self._power_v = math.nan
            if r.quality is Quality.GOOD and value is not None:
                if finite(value):
                    self._power_v = value
                    self.recent_power.add(mono, value, self._settings.power_keep_s)
                if self._power.add(mono, value):
                    self._check_load_step()
        elif kind is SensorKind.GPU_POWER_LIMIT:
            self.limit = r
            value = r.value
            self._limit_t = r.mono
            good = r.usable
            self._limit_v = value if good else None
        elif kind is SensorKind.GPU_SHUTDOWN_THRESHOLD:
            self.shutdown = r
            value = r.value
            self._shut_t = r.mono
            good = r.usable
            self._shut_v = value if good and value is not None else math.nan

    def fresh_temperature(self, now: float, stale_after_s: float) -> float | None:
        """``fresh_value(self.temperature, now, stale_after_s)``, from what observe kept."""
        value = self._temp_v
        # NaN (not usable) fails value - value == 0.0; written out: one call, not three.
        return value if value - value == 0.0 and not now - self._temp_t > stale_after_s else None

    def fresh_slowdown(self, now: float, stale_after_s: float) -> float | None:
        """``fresh_value(self.slowdown, now, stale_after_s)``, from what observe kept."""
        value = self._slow_v
        # NaN (not usable) fails value - value == 0.0; written out: one call, not three.
        return value if value - value == 0.0 and not now - self._slow_t > stale_after_s else None

    def fresh_limit(self, now: float, stale_after_s: float) -> float | None:
        """``fresh_value(self.limit, now, stale_after_s)``, from what observe kept."""
        value = self._limit_v
        return value if value is not None and not now - self._limit_t > stale_after_s else None

    def fresh_shutdown(self, now: float, stale_after_s: float) -> float | None:
        """``fresh_value(self.shutdown, now, stale_after_s)``, from what observe kept."""
        value = self._shut_v
        # NaN (not usable) fails value - value == 0.0; written out: one call, not three.
        return value if value - value == 0.0 and not now - self._shut_t > stale_after_s else None

    def _check_load_step(self) -> None:
        bucket = self._power.newest
        assert bucket is not None
        ref = self._power_ref
        self._power_ref = bucket.value
        if ref is None:
            return
        if abs(bucket.value - ref) > self._load_step_w():
            # A job started, stopped or was capped: the temperature follows the load
            # for a while. That is load, not a thermal trend: fit afresh once it settles.
            self.load_steps += 1
            self.step_times.append(bucket.t)
            self.margin.restart(bucket.t + self._settings.load_settle_s)


@dataclass
class NodeTracker:
    """The GPUs of one node, by GPU index label."""

    gpus: dict[str, GpuTracker] = field(default_factory=dict)


class SlowSeries:
    """A rack-level slow series: latest reading, forecaster, and plain windows for its range.

    ``raw`` (never restarted, so the range survives fast changes) gives the window's
    lowest and newest bucket means. ``sustained_high`` is the highest level the
    series held over two successive buckets within the last ``REFERENCE_S`` (or
    ``trend_window_s`` if longer): one glitch sample moves one bucket only, and a
    level from long ago does not stay the reference for good.
    """

    REFERENCE_S: ClassVar[float] = 1800.0

    __slots__ = (
        "_peaks",
        "_prev",
        "_prev_sample",
        "_reference_s",
        "ever_usable",
        "forecaster",
        "latest",
        "raw",
    )

    def __init__(self, settings: PolicySettings, max_rate_per_min: float | None) -> None:
        self.latest: Reading | None = None
        self.ever_usable = False
        self.forecaster = SeriesForecaster(settings.trend(max_rate_per_min))
        self.raw = BucketWindow(settings.trend_bucket_s, settings.trend_window_s)
        self._reference_s = max(settings.trend_window_s, self.REFERENCE_S)
        self._prev: float | None = None  # the mean of the bucket closed before the newest
        # (bucket time, level held over it and the bucket before), levels decreasing:
        # a sliding-window maximum, O(1) amortised per bucket, bounded by the window.
        self._peaks: deque[tuple[float, float]] = deque()
        self._prev_sample: float | None = None  # the usable sample before the latest

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
        # min(max(a.value, b.value) for a, b in pairwise(buckets)), written out (compiled,
        # a loop on native floats, not a generator over pairs): the same comparisons,
        # so the same first-found value on ties, -0.0 beside 0.0 included.
        low = _INF
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


class RackTracker:
    """The shared evidence of one rack: inlet air, coolant and PDU, per series."""

    def __init__(self, settings: PolicySettings) -> None:
        self._settings = settings
        self.slow: dict[SensorKind, dict[str, SlowSeries]] = {k: {} for k in _SLOW_RACK_KINDS}
        self.state: dict[SensorKind, dict[str, Reading]] = {k: {} for k in _STATE_RACK_KINDS}
        self.present: set[str] = set()  # state series that have had a usable reading
        self.runs: dict[str, LossRun] = {}  # loss runs of flow and pump series
        # When the cooling unit last answered, and its usual poll interval.
        self.coolant_last: float | None = None
        self.coolant_interval_s: float | None = None
        self._observed = 0  # readings taken: a version number for the cached reference
        self._reference: tuple[float, int, float | None] | None = None

    def configure(self, settings: PolicySettings) -> None:
        """Read these settings from now on (a reload that keeps the windows' shape)."""
        self._settings = settings
        self._reference = None  # found with the old staleness

    def observe(self, r: Reading) -> None:
        """Take one rack-level reading; kinds the policy does not use are ignored."""
        self._observed += 1
        # Each field read once: compiled, a field of a Reading (a msgspec Struct) is a
        # generic attribute read, and its key (read once here) a Python property.
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
                s = self._settings
                rate = None if kind is SensorKind.COOLANT_FLOW else s.max_air_rate_c_per_min
                series = by_key[key] = SlowSeries(s, rate)
            high = series.sustained_high
            series.observe(r)
            if kind is SensorKind.COOLANT_FLOW and ok and value is not None:
                low = (
                    high is not None
                    and high > 0
                    and value < self._settings.flow_low_fraction * high
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
        if last is not None and last[0] == now and last[1] == self._observed:
            return last[2]
        value = self._reference_now(now)
        self._reference = (now, self._observed, value)
        return value

    def _reference_now(self, now: float) -> float | None:
        stale = self._settings.rack_stale_after_s
        for kind in (SensorKind.COOLANT_SUPPLY_TEMPERATURE, SensorKind.INLET_TEMPERATURE):
            values = [
                v
                for x in self.slow[kind].values()
                if (v := fresh_value(x.latest, now, stale)) is not None
            ]
            if values:
                return max(values)
        return None

    def coolant_silent(self, now: float) -> bool:
        """The cooling unit has missed two polls (or never answered with data)."""
        if self.coolant_last is None:
            return True
        interval = self.coolant_interval_s or self._settings.rack_stale_after_s / 2
        return now - self.coolant_last > 2.0 * interval + 1.0


class Tracker:
    """Every node's GPUs and every rack's evidence, fed with readings."""

    def __init__(
        self,
        settings: PolicySettings,
        racks: Mapping[str, tuple[str, ...]],
        *,
        default_node: str | None = None,
    ) -> None:
        self._settings = settings
        self.racks = dict(racks)
        self.rack_of = {node: rack for rack, nodes in racks.items() for node in nodes}
        self.default_node = default_node
        self.nodes: dict[str, NodeTracker] = {n: NodeTracker() for n in self.rack_of}
        self.rack: dict[str, RackTracker] = {rk: RackTracker(settings) for rk in racks}

    @property
    def settings(self) -> PolicySettings:
        """The settings every tracker reads."""
        return self._settings

    @settings.setter
    def settings(self, new: PolicySettings) -> None:
        # A reload that keeps the windows' shape (Policy.settings): the trackers kept
        # read the new values too, not only the GPUs and racks seen after it.
        self._settings = new
        for node in self.nodes.values():
            for g in node.gpus.values():
                g.configure(new)
        for rt in self.rack.values():
            rt.configure(new)

    def observe(self, readings: Iterable[Reading]) -> None:
        """Route readings to their GPU or rack; unknown nodes and racks are ignored."""
        nodes, default_node, gpu_kinds = self.nodes, self.default_node, _GPU_KINDS
        racks, rack_of = self.rack, self.rack_of
        # A GPU's readings come together (temperature, thresholds, power, limit) and a
        # node's GPUs too: the last GPU's and the last node's look-ups are kept, and
        # reused while the labels are equal. Comparing two strings costs less than
        # hashing one (each reading's label values are new strings) and looking it up.
        last_node, last_gpu, last = "", "", None  # labels of the last GPU found, and it
        rack_node, node_rack = "", None  # the last node whose rack was looked up, and it
        for r in readings:
            kind = r.kind
            # A reading's labels are a dict but typed a Mapping: compiled, ``get`` on a
            # Mapping is a method call by name, on a dict a direct look-up.
            given = r.labels
            labels = given if isinstance(given, dict) else dict(given)
            node = labels.get("node") or default_node
            if kind in gpu_kinds:
                label = labels.get("gpu")
                if label is None or node is None:
                    continue
                # Typed str from here: compiled, comparing two str is a native operation.
                gpu: str = label
                on: str = node
                if last is not None and gpu == last_gpu and on == last_node:
                    g = last
                else:
                    tracker = nodes.get(on)
                    if tracker is None:
                        continue
                    found = tracker.gpus.get(gpu)
                    if found is None:
                        found = tracker.gpus[gpu] = GpuTracker(self.settings)
                    last_node, last_gpu, last = on, gpu, found
                    g = found
                g.observe(r, kind)
                if kind is SensorKind.GPU_TEMPERATURE:
                    if on != rack_node or not on:
                        rack_node = on
                        node_rack = racks.get(rack_of.get(on, "")) if on else None
                    at = g.temperature_at  # r.mono, as observe kept it
                    reference = node_rack.reference(at) if node_rack is not None else None
                    g.sample_resistance(reference)
                continue
            rack = labels.get("rack") or (self.rack_of.get(node) if node else None)
            if rack is None and len(self.rack) == 1:
                rack = next(iter(self.rack))
            rt = self.rack.get(rack) if rack is not None else None
            if rt is not None:
                rt.observe(r)
