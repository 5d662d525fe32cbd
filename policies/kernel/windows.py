"""A GPU's two confirm windows: its raw temperatures over the last ``2 w`` seconds.

The newer window holds the samples of ``[now - w, now]``, the older those of
``[now - 2 w, now - w]``. Their median pairwise slopes are the heating rates the
fast-heating signature and the resistance estimate read at every temperature
sample and every evaluation, so the windows' place in the samples (found by
bisection) and their slopes are remembered: the older window at one evaluation is
the newer one of a confirm window before. Samples whose times are out of order (a
NaN time) are windowed by scanning instead.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from math import isfinite
from operator import sub
from typing import Final

from policies.kernel.samples import TimedValues
from policies.kernel.slopes import median_slope, median_slope_of

_SLOPE_CACHE: Final = 32  # window slopes remembered (two confirm windows of 1 Hz samples fit)
_UNSEEN: Final = object()  # a slope not in the cache (None is a cached answer)
Sample = tuple[float, float]
Spans = tuple[int, int, int, int]  # older window start:end, newer window start:end
Values = tuple[list[float], list[float]]  # the sorted values of the newer and older window


def mid(ordered: list[float]) -> float:
    """The median of sorted values (statistics.median's arithmetic, without its overhead)."""
    n = len(ordered)
    half = n // 2
    return ordered[half] if n % 2 else (ordered[half - 1] + ordered[half]) / 2.0


def within_one_step(values: Values) -> bool:
    """The windows' median levels differ by no more than one reading step."""
    newer, older = values
    moved = abs(mid(newer) - mid(older))
    distinct = sorted(set(newer).union(older))
    return moved <= min(map(sub, distinct[1:], distinct), default=0.0)


def _resolved(values: Values, rates: tuple[float, float]) -> tuple[float, float]:
    """``rates``, or (0, 0) when the windows' levels differ by no more than one reading step."""
    return (0.0, 0.0) if within_one_step(values) else rates


class ConfirmWindows:
    """The temperatures of the last two confirm windows, their places and slopes remembered."""

    __slots__ = (
        "_slopes",
        "_spans_added",
        "_spans_found",
        "_spans_now",
        "_spans_w",
        "recent",
    )

    def __init__(self) -> None:
        self.recent = TimedValues()
        # The slopes of recent windows (a pure function of their samples), by place.
        self._slopes: dict[int, float | None] = {}
        # The windows' place last found: at what time and width, after how many samples.
        self._spans_now = self._spans_w = math.nan  # equal to no time or width
        self._spans_added = -1
        self._spans_found: Spans | None = None

    def add(self, t: float, value: float, keep_s: float) -> None:
        """One temperature sample; those older than ``keep_s`` before it are dropped."""
        self.recent.add(t, value, keep_s)

    def spans(self, now: float, w: float) -> Spans | None:
        """Where the older and the newer window of width ``w`` lie in the kept samples' lists.

        None when they cannot be found by bisection (times out of order, or ``now``
        not finite): the windows are then found by scanning.
        """
        recent = self.recent
        # Asked at a sample's time and again at the evaluation after it, usually the
        # same time: remembered while no sample is taken.
        if self._spans_now == now and self._spans_w == w and self._spans_added == recent.added:
            return self._spans_found
        lo, middle = now - 2 * w, now - w
        if not (recent.ordered and isfinite(lo) and isfinite(middle)):
            return None
        times, head = recent.times, recent.head
        n_end = bisect_right(times, now, head)
        o_end = bisect_right(times, middle, head, n_end)
        spans = (
            bisect_left(times, lo, head, o_end),
            o_end,
            bisect_left(times, middle, head, o_end),
            n_end,
        )
        self._spans_now, self._spans_w = now, w
        self._spans_added, self._spans_found = recent.added, spans
        return spans

    def slope(self, start: int, end: int) -> float | None:
        """median_slope of the kept samples ``start:end`` (list indices), remembered."""
        # Times strictly increase: a window is a run of samples, and a run's place in
        # the sequence of every sample taken names its content.
        if end - start < 4:
            return None
        recent = self.recent
        # One int for (first sample, length): no tuple to build and hash per look-up.
        key = (recent.added - len(recent.times) + start) << 32 | (end - start)
        cache = self._slopes
        slope = cache.get(key, _UNSEEN)
        if slope is not _UNSEEN:
            return slope  # type: ignore[return-value]  # a float or None, as stored
        slope = median_slope_of(recent.times, recent.values, start, end)
        if len(cache) >= _SLOPE_CACHE:
            # Emptied, not trimmed oldest first: a dict's oldest key costs a scan over
            # the slots of keys deleted before it, and a miss is only a refit.
            cache.clear()
        cache[key] = slope
        return slope

    def beyond(self, start: int, end: int, limit: float) -> bool:
        """``abs(a) > limit`` for ``a = self.slope(start, end)`` (False for None)."""
        a = self.slope(start, end)
        return a is not None and abs(a) > limit

    def samples_of(self, now: float, w: float, spans: Spans | None) -> tuple[list[Sample], ...]:
        """The samples of the newer (``now - w <= t <= now``) and the older window."""
        recent = self.recent
        if spans is None:
            lo, middle = now - 2 * w, now - w
            samples = recent.samples
            return (
                [p for p in samples if middle <= p[0] <= now],
                [p for p in samples if lo <= p[0] <= middle],
            )
        o_start, o_end, n_start, n_end = spans
        times, values = recent.times, recent.values
        return (
            list(zip(times[n_start:n_end], values[n_start:n_end], strict=True)),
            list(zip(times[o_start:o_end], values[o_start:o_end], strict=True)),
        )

    def values_of(self, now: float, w: float, spans: Spans | None) -> Values:
        """The sorted temperatures of the newer and the older window."""
        if spans is None:
            newer, older = self.samples_of(now, w, None)
            return sorted([v for _, v in newer]), sorted([v for _, v in older])
        o_start, o_end, n_start, n_end = spans
        values = self.recent.values
        return sorted(values[n_start:n_end]), sorted(values[o_start:o_end])

    def rates(self, now: float, w: float) -> tuple[float, float] | None:
        """The slope (C/s) over the newer and the older window; see GpuTracker.heating_rate."""
        spans = self.spans(now, w)
        if spans is None:
            newer, older = self.samples_of(now, w, None)
            a, b = median_slope(newer), median_slope(older)
        else:
            a = self.slope(spans[2], spans[3])
            b = self.slope(spans[0], spans[1]) if a is not None else None
        if a is None or b is None:
            return None
        return _resolved(self.values_of(now, w, spans), (a, b))

    def fast(self, now: float, w: float, fastest: float) -> float | None:
        """The newer window's rate (C/s) when both windows' exceed ``fastest`` > 0.

        ``rates`` compared with ``fastest``: the windows' levels are compared only
        when both slopes are that fast.
        """
        spans = self.spans(now, w)
        if spans is None:
            rates = self.rates(now, w)
        else:
            o_start, o_end, n_start, n_end = spans
            # The newer window first: it is rarely that fast, and then the older one is
            # not worked out.
            a = self.slope(n_start, n_end)
            if a is None or not a > fastest:
                return None
            b = self.slope(o_start, o_end)
            if b is None or not b > fastest:
                return None
            rates = _resolved(self.values_of(now, w, spans), (a, b))
        if rates is None:
            return None
        newer, older = rates
        return newer if newer > fastest and older > fastest else None
