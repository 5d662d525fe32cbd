"""A GPU's recent power samples: the kept window and its range, against their definition."""

from __future__ import annotations

import random

from policies.tracking import RecentSamples


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
            assert r.spread() == max(v for _, v in kept) - min(v for _, v in kept)


def test_empty_has_no_spread() -> None:
    assert RecentSamples().spread() == 0.0
