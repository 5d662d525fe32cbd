"""Slopes: the median pairwise slope (Theil-Sen) of samples or bucket means, and Sen's bounds.

:func:`median_slope` and :func:`median_slope_of` fit raw (t, value) samples (a
GPU's confirm windows). :class:`SortedSlopes` keeps the sorted pairwise
slopes of a sliding run of buckets, so a refit at each bucket close merges the
new pairs instead of sorting them all; :func:`sen` gives the median and Sen's
rank-based bounds from sorted slopes.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections.abc import Iterable
from functools import lru_cache
from itertools import combinations
from operator import is_
from typing import Final

from policies.kernel.buckets import Bucket

_MAX_SLOPE_POINTS: Final = 16  # bounds the pairwise fit's cost whatever the sample rate


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


def median_slope_of(times: list[float], values: list[float], start: int, end: int) -> float | None:
    """:func:`median_slope` of the points ``zip(times, values)[start:end]``, on the lists."""
    n = end - start
    if n > _MAX_SLOPE_POINTS:
        return median_slope(zip(times[start:end], values[start:end], strict=True))
    if n < 4:
        return None
    # combinations() of the points, written out over the lists as they are (no copies
    # of the window): the same slopes in the same order, so the same median, ties of
    # 0.0 and -0.0 included.
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


def pair_slopes(points: list[Bucket]) -> list[float]:
    """Every pair's slope, later bucket over earlier, in pair order (unsorted)."""
    out: list[float] = []
    for i, a in enumerate(points):
        t, y = a.t, a.value
        out += [(b.value - y) / (b.t - t) for b in points[i + 1 :] if b.t > t]
    return out


@lru_cache(maxsize=256)
def _ranks(n: int, m: int, z: float) -> tuple[int, int]:
    # Sen (1968): the bounds are order statistics of the pairwise slopes, at ranks
    # (N -+ z * sd(S)) / 2 with Var(S) = n(n-1)(2n+5)/18 (Kendall's S, no ties).
    c = z * math.sqrt(n * (n - 1) * (2 * n + 5) / 18.0)
    lo_i = min(m - 1, max(0, math.floor((m - c) / 2.0) - 1))
    hi_i = min(m - 1, max(0, math.ceil((m + c) / 2.0)))
    return lo_i, hi_i


def sen(n: int, slopes: list[float], z: float) -> tuple[float, float, float]:
    """The median slope and Sen's bounds of ``n`` points from their sorted pairwise slopes."""
    m = len(slopes)
    mid = m // 2
    slope = slopes[mid] if m % 2 else (slopes[mid - 1] + slopes[mid]) / 2.0
    lo_i, hi_i = _ranks(n, m, z)
    return slope, slopes[lo_i], slopes[hi_i]


class SortedSlopes:
    """The pairwise slopes of a moving run of buckets, kept sorted as buckets come and go.

    A fit at every bucket close needs order statistics of every pair's slope; a run
    of a sliding window gains its newest bucket and loses its oldest, so all but
    those buckets' pairs are as they were at the last close. The new pairs are
    merged in; the dropped ones, recomputed by the same expression (so they compare
    equal), are found and deleted: the first equal slope for each, as a bisection
    finds it. Ties keep their order (old slopes before new ones, new ones in pair
    order), as a stable sort of the kept list and its new tail leaves them.
    """

    __slots__ = ("_buckets", "_slopes")

    def __init__(self) -> None:
        self._buckets: list[Bucket] = []
        self._slopes: list[float] = []

    def _moved(self, run: list[Bucket]) -> int:
        """How many kept buckets ``run`` has left behind; -1 if it is not a later state of them."""
        kept = self._buckets
        # The identity checks run in C (list.index stops at the same bucket, or at an
        # equal one, which the identity test then refuses): asked at every bucket close.
        try:
            drop = kept.index(run[0])
        except ValueError:
            return -1
        later = kept[drop] is run[0] and len(kept) - drop <= len(run)
        # Not a later state of the kept run (a restart, a trimmed window): afresh.
        return drop if later and all(map(is_, kept[drop:], run)) else -1

    def of(self, run: list[Bucket]) -> list[float]:
        """The sorted pairwise slopes of ``run`` (consecutive buckets of one window, oldest first).

        The list is kept: read it before the next call, do not change it.
        """
        kept, slopes = self._buckets, self._slopes
        drop = self._moved(run)
        if drop < 0:
            kept, slopes = [], []
            self._buckets, self._slopes = kept, slopes
        else:
            for i in range(drop):
                a = kept[i]
                t, y = a.t, a.value
                # A dropped bucket's pairs, in pair order: each found by bisection and
                # deleted (the first equal slope), one C call each.
                for gone in [(b.value - y) / (b.t - t) for b in kept[i + 1 :] if b.t > t]:
                    del slopes[bisect_left(slopes, gone)]
            del kept[:drop]
        for new in run[len(kept) :]:
            t, y = new.t, new.value
            slopes += [(y - a.value) / (t - a.t) for a in kept if t > a.t]
            kept.append(new)
        # A sorted run and a short unsorted tail: the sort merges, it does not start over.
        slopes.sort()
        return slopes

    def sen(self, run: list[Bucket], z: float) -> tuple[float, float, float] | None:
        """:func:`sen` of ``run`` (consecutive buckets of one window, oldest first)."""
        slopes = self.of(run)
        n = len(run)
        if n < 3 or len(slopes) < 3:
            return None
        stats = sen(n, slopes, z)
        if 0.0 in stats and _has_negative_zero(slopes):
            return sen_in_pair_order(run, z)
        return stats


def _has_negative_zero(slopes: list[float]) -> bool:
    """Whether sorted ``slopes`` hold a -0.0 (equal to 0.0, but not the same float)."""
    i, j = bisect_left(slopes, 0.0), bisect_right(slopes, 0.0)
    return any(math.copysign(1.0, s) < 0.0 for s in slopes[i:j])


def sen_in_pair_order(run: list[Bucket], z: float) -> tuple[float, float, float]:
    """:func:`sen` of ``run`` from its slopes taken in :func:`policies.forecast.theil_sen`'s order.

    For kept slopes holding both 0.0 and -0.0 when an order statistic is zero:
    which of the two a sort puts first depends on the order the slopes came in, and
    this order gives the same float as :func:`policies.forecast.theil_sen`.
    """
    slopes = pair_slopes(run)
    slopes.sort()
    return sen(len(run), slopes, z)
