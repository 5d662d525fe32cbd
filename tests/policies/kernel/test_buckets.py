"""Bucket windows: means on a fixed grid, bounded, refusing repeats and overflowing buckets."""

from __future__ import annotations

import math

from policies.forecast import SeriesForecaster, TrendSettings
from policies.kernel.buckets import Bucket, BucketWindow


def test_window_buckets_on_a_fixed_grid_and_stays_bounded() -> None:
    w = BucketWindow(10.0, 60.0)
    for k in range(100_000):
        w.add(k * 0.5, float(k % 20))  # 20 samples per bucket: 0..19 -> mean 9.5
    assert len(w) == 7  # ceil(60 / 10) + 1 buckets, however long it ran
    assert w.closes == 100_000 // 20 - 1
    b = w.newest
    assert b is not None and b.n == 20 and b.value == 9.5 and (b.lo, b.hi) == (0.0, 19.0)
    assert all(x.t > b.t - 60.0 - 1e-9 for x in w.buckets())


def test_a_bucket_whose_mean_overflows_is_dropped() -> None:
    # Finite samples near the largest float sum to inf: that bucket has no mean, and
    # its inf would give NaN slopes (inf - inf) to every fit it is in.
    w = BucketWindow(10.0, 60.0)
    assert not w.add(0.0, 1.5e308)
    assert not w.add(1.0, 1.5e308)
    assert not w.add(10.0, 1.0)  # closes the first bucket: not kept, so not "closed"
    assert len(w) == 0 and w.closes == 0
    assert w.add(20.0, 2.0)  # the next one is
    assert w.newest == Bucket(10.0, 1.0, 1, 1.0, 1.0) and w.closes == 1
    f = SeriesForecaster(TrendSettings(bucket_s=10.0, window_s=300.0, min_points=3))
    for k in range(100):
        f.add(float(k), 1.5e308 if k % 20 < 10 else -1e307)
    assert all(math.isfinite(b.value) for b in f.window.buckets())
    assert f.trend is None or not math.isnan(f.trend.slope)


def test_window_ignores_repeats_and_reset_keeps_time_moving() -> None:
    w = BucketWindow(1.0, 10.0)
    assert not w.add(0.2, 1.0)
    assert not w.add(0.2, 99.0)  # the same reading again
    assert not w.add(0.1, 99.0)  # out of order
    assert w.add(1.5, 3.0)
    assert w.newest == Bucket(0.2, 1.0, 1, 1.0, 1.0)
    w.reset()
    assert len(w) == 0 and w.newest is None
    assert not w.add(1.0, 5.0)  # still before the last sample
