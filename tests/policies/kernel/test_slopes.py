"""Median pairwise slopes: robust to one wild sample, placed against a limit without sorting,
and kept sorted over a sliding run as they would be sorted from scratch."""

from __future__ import annotations

import math
import random

import pytest

from policies.forecast import z_for
from policies.kernel import slopes
from policies.kernel.buckets import Bucket
from policies.kernel.slopes import median_slope


def test_median_slope_ignores_one_wild_sample() -> None:
    pts = [(float(t), 2.0 * t) for t in range(10)]
    pts[5] = (5.0, 500.0)
    assert median_slope(pts) == pytest.approx(2.0)
    assert median_slope(pts[:3]) is None


def _window(rnd: random.Random, regime: int, n: int) -> tuple[list[float], list[float]]:
    """Strictly increasing times and values of one of several kinds."""
    times, t = [], rnd.uniform(-100.0, 100.0)
    for _ in range(n):
        t += rnd.choice([0.5, 1.0, 1.0, 1.3])
        times.append(t)
    if regime == 0:  # whole degrees: many equal slopes, the median often on the limit
        values = [float(round(60.0 + 0.05 * x + rnd.gauss(0.0, 0.6))) for x in times]
    elif regime == 1:  # a noisy ramp
        values = [60.0 + rnd.choice([-0.2, 0.0, 0.1, 0.3]) * x + rnd.gauss(0, 0.2) for x in times]
    elif regime == 2:  # differences that overflow: infinite slopes
        values = [rnd.choice([1.7e308, -1.7e308, 0.0]) for _ in times]
    else:  # slopes of exactly the limit (0.05) and its negation
        values = [rnd.choice([0.0, 0.025, 0.05, -0.05]) + 0.05 * x for x in times]
    return times, values


@pytest.mark.parametrize("regime", range(4))
def test_the_side_of_a_window_slope_is_the_side_of_its_median(regime: int) -> None:
    # _slope_side answers from counts where they tell; where it says so, the median
    # is worked out. Either way a caller gets what comparing the median gives.
    rnd = random.Random(regime)
    told = asked = 0
    for _ in range(3000):
        n = rnd.randrange(0, 20)  # over 16 points the median is of averaged groups
        times, values = _window(rnd, regime, n + 4)
        start = rnd.randrange(0, 4)
        end = start + n
        limit = rnd.choice([0.0, 0.05, 0.05, 1e-9, 2.0, 1e301, -1.0, math.nan, math.inf])
        side = slopes.slope_side(times, values, start, end, limit)
        m = slopes.median_slope_of(times, values, start, end)
        usual = n <= 16 and 0.0 <= limit <= 1e300  # a sampled window, a configured rate
        asked += usual
        if side == slopes.EXACT:
            continue
        told += usual
        assert side == _side_by_median(m, limit), (times[start:end], values[start:end], limit, m)
    # For the usual windows and limits the counts decide, bar a few ties on the limit
    # (and infinite slopes): asked at every sample, it must rarely need the median.
    assert told >= asked * (0.2 if regime == 2 else 0.9)


def _side_by_median(m: float | None, limit: float) -> int:
    if m is None:
        return slopes.NO_SLOPE
    if m > limit:
        return slopes.ABOVE
    if m < -limit:
        return slopes.BELOW
    return slopes.WITHIN


def _value(rng: random.Random, kind: int) -> float:
    if kind == 0:
        return rng.gauss(0, 1)
    if kind == 1:  # ties, and slopes of 0.0 beside -0.0
        return rng.choice([0.0, -0.0, 1.0, 5e-324, -5e-324])
    # Finite values whose differences overflow: slopes of inf and -inf.
    return rng.choice([1.7e308, -1.7e308, 0.0, 1.0])


@pytest.mark.parametrize("kind", range(3))
def test_kept_slopes_of_any_run_are_its_sorted_pair_slopes(kind: int) -> None:
    rng = random.Random(7 + kind)
    pool = [Bucket(rng.uniform(0, 100), _value(rng, kind), 1, 0.0, 0.0) for _ in range(40)]
    listed = slopes.SortedSlopes()
    z = z_for(0.9)
    start, end = 0, 3
    for _ in range(2000):
        # Mostly sliding or growing; now and then anywhere (times are out of order too).
        if rng.random() < 0.05:
            start = rng.randrange(len(pool) - 3)
            end = rng.randrange(start + 3, len(pool) + 1)
        else:
            end = min(len(pool), end + rng.choice([0, 1, 1, 2]))
            start = min(end - 3, start + rng.choice([0, 1, 1, 2]))
        run = pool[start:end]
        want = sorted(
            (b.value - a.value) / (b.t - a.t)
            for i, a in enumerate(run)
            for b in run[i + 1 :]
            if b.t > a.t
        )
        kept = listed.of(run)
        assert kept == want
        # Its order statistics are the bits of the slopes sorted from scratch in pair
        # order (which of 0.0 and -0.0 comes first depends on the order they came in).
        fresh = None if len(want) < 3 else slopes.sen_in_pair_order(run, z)
        assert _hex(listed.sen(run, z)) == _hex(fresh)


def _hex(stats: tuple[float, float, float] | None) -> tuple[str, ...] | None:
    return None if stats is None else tuple(x.hex() for x in stats)
