"""Rolling windows: bucket means over a sliding time span, O(1) per sample, bounded memory.

A series sampled at 1 Hz for ten minutes would be 600 floats to fit a trend on;
the policies fit on bucket means instead (e.g. 10 s buckets: 30 points for five
minutes), which also averages the sensor noise. Buckets sit on a fixed grid
(``floor(t / bucket_s)``) so the same samples always give the same buckets,
however often the window is read.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from math import isfinite
from operator import attrgetter

import msgspec


class Bucket(msgspec.Struct, frozen=True, gc=False):
    """The samples of one grid cell: their mean time, mean value, count and range.

    A Struct, as a Reading is: one is built per bucket of every series, and a frozen
    Struct is built several times faster than a frozen dataclass. It holds numbers
    only, so it is left out of the cyclic garbage collector.
    """

    t: float
    value: float
    n: int
    lo: float
    hi: float


_time = attrgetter("t")


class BucketWindow:
    """Closed buckets of the last ``span_s`` seconds plus the one being filled.

    ``add`` is O(1); at most ``ceil(span_s / bucket_s) + 1`` buckets are kept.
    Samples at or before the last one added are ignored (a poller re-reporting
    the same reading, or one out of order), and so are non-finite values and times
    (one NaN would poison every mean and fit it touched).
    """

    __slots__ = (
        "_closed",
        "_hi",
        "_keep",
        "_last_cell",
        "_lo",
        "_n",
        "_sum_t",
        "_sum_v",
        "bucket_s",
        "closes",
        "last_t",
        "last_value",
        "span_s",
    )

    def __init__(self, bucket_s: float, span_s: float) -> None:
        if bucket_s <= 0 or span_s < bucket_s:
            raise ValueError(f"need 0 < bucket_s <= span_s, got {bucket_s}, {span_s}")
        self.bucket_s = bucket_s
        self.span_s = span_s
        # A list trimmed from the front: at most ``_keep`` buckets (31 for the defaults),
        # so a trim moves a few pointers, and fits read it as a list.
        self._keep = math.ceil(span_s / bucket_s) + 1
        self._closed: list[Bucket] = []
        self._n = 0
        self._sum_t = 0.0
        self._sum_v = 0.0
        self._lo = math.inf
        self._hi = -math.inf
        self.last_t: float | None = None
        self._last_cell = 0  # the grid cell of last_t
        self.last_value: float | None = None
        self.closes = 0  # buckets closed so far: a version number for cached fits

    def _cell(self, t: float) -> int:
        return math.floor(t / self.bucket_s)

    def add(self, t: float, value: float) -> bool:
        """Add one sample; True when it closed the bucket before it (and kept it)."""
        # Called for every sample of every slow series and GPU margin: comparisons, not
        # min()/max() calls (the same values: both finite).
        if not (isfinite(t) and isfinite(value)):
            return False
        last = self.last_t
        if last is not None and t <= last:
            return False
        closed = False
        cell = math.floor(t / self.bucket_s)
        if last is not None and self._n and cell != self._last_cell:
            closed = self._close()
        self._n += 1
        self._sum_t += t
        self._sum_v += value
        if value < self._lo:  # noqa: PLR1730 - a comparison costs less than a min() call
            self._lo = value
        if value > self._hi:  # noqa: PLR1730
            self._hi = value
        self.last_t = t
        self._last_cell = cell
        self.last_value = value
        return closed

    def _close(self) -> bool:
        """Close the open bucket; False if its means are not finite (it is dropped)."""
        n = self._n
        t, value = self._sum_t / n, self._sum_v / n
        # Finite samples can still sum past the largest float (values near 1e308): such
        # a bucket has no mean, and its inf would make NaN slopes of every pair it is in.
        kept = isfinite(t) and isfinite(value)
        if kept:
            closed = self._closed
            closed.append(Bucket(t, value, n, self._lo, self._hi))
            if len(closed) > self._keep:
                del closed[0]
            self.closes += 1
        self._n = 0
        self._sum_t = self._sum_v = 0.0
        self._lo, self._hi = math.inf, -math.inf
        return kept

    def buckets(self, since: float = -math.inf) -> list[Bucket]:
        """Closed buckets within ``span_s`` of the newest one and not older than ``since``."""
        if not self._closed:
            return []
        closed = self._closed
        start = max(since, closed[-1].t - self.span_s)
        # Bucket times increase (each bucket's samples come after the last's).
        return closed[bisect_left(closed, start, key=_time) :]

    @property
    def newest(self) -> Bucket | None:
        """The most recently closed bucket."""
        return self._closed[-1] if self._closed else None

    @property
    def previous(self) -> Bucket | None:
        """The bucket closed before the newest (None with fewer than two)."""
        closed = self._closed
        return closed[-2] if len(closed) >= 2 else None

    def reset(self) -> None:
        """Forget every sample (e.g. after a load step: the old regime is not this one)."""
        self._closed.clear()
        self._n = 0
        self._sum_t = self._sum_v = 0.0
        self._lo, self._hi = math.inf, -math.inf
        # last_t stays: samples must still move forward in time.

    def __len__(self) -> int:
        return len(self._closed)
