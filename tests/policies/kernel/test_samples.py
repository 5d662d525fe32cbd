"""A GPU's recent power samples: the kept window and its range, against their definition."""

from __future__ import annotations

import math
import random

from policies.kernel.samples import RecentSamples


def test_spread_is_the_range_of_the_samples_kept() -> None:
    rng = random.Random(11)
    for _ in range(50):
        keep_s = rng.choice([5.0, 30.0, 120.0])
        r = RecentSamples()
        taken: list[tuple[float, float]] = []
        t = 0.0
        for _ in range(rng.randrange(1, 1200)):
            # Mostly forward, sometimes a repeat or a step back (refused), values with ties.
            t += rng.choice([1.0, 1.0, 1.0, 0.5, 0.0, -2.0])
            value = rng.choice([300.0, 310.0, rng.uniform(100.0, 700.0)])
            r.add(t, value, keep_s)
            if not taken or t > taken[-1][0]:
                taken.append((t, value))
            kept = [(ts, v) for ts, v in taken if ts >= taken[-1][0] - keep_s]
            assert list(r.samples) == kept
            assert r.count == len(kept)
            assert r.spread() == max(v for _, v in kept) - min(v for _, v in kept)
            since = t - rng.choice([0.0, 3.0, 50.0])
            newest_first = []
            for ts, v in reversed(kept):
                if not ts >= since:
                    break
                newest_first.append(v)
            assert r.values_since(since) == newest_first


def test_empty_has_no_spread() -> None:
    assert RecentSamples().spread() == 0.0
    assert RecentSamples().count == 0


def test_a_nan_time_is_taken_and_stops_the_trim_past_it() -> None:
    r = RecentSamples()
    for t in (1.0, 2.0, 3.0):
        r.add(t, 10.0 * t, 60.0)
    r.add(math.nan, 5.0, 60.0)  # compares false with the newest: taken, not refused
    assert (r.count, r.ordered, r.added) == (4, False, 4)
    r.add(500.0, 7.0, 60.0)  # trimmed up to the NaN, which never compares older
    assert r.count == 2
    assert r.spread() == 7.0 - 5.0


def test_an_infinite_time_drops_every_finite_sample() -> None:
    r = RecentSamples()
    for t in (1.0, 2.0, 3.0):
        r.add(t, 10.0 * t, 60.0)
    r.add(math.inf, 1.0, 60.0)
    assert (r.count, r.spread(), r.ordered) == (1, 0.0, False)
