"""Median pairwise slopes: robust to one wild sample, and kept sorted over a sliding run
as they would be sorted from scratch."""

from __future__ import annotations

import random

import msgspec
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


def test_a_run_from_an_equal_copy_of_a_kept_bucket_is_its_own_sorted_pair_slopes() -> None:
    # Equal buckets that are not the same object: the store matches kept buckets by
    # identity, so it must not take the copy for a later state of what it kept.
    pool = [Bucket(float(t), float(t * t % 7), 1, 0.0, 0.0) for t in range(8)]
    twin = msgspec.structs.replace(pool[1])
    listed = slopes.SortedSlopes()
    listed.of([pool[0], twin, *pool[2:6]])
    for run in ([pool[1], *pool[2:7]], [twin, pool[1], *pool[2:8]], pool[3:8]):
        want = sorted(
            (b.value - a.value) / (b.t - a.t)
            for i, a in enumerate(run)
            for b in run[i + 1 :]
            if b.t > a.t
        )
        assert listed.of(run) == want
