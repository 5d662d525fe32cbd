"""The compiled build's bisection gives bisect's answers."""

from __future__ import annotations

import bisect
import math
import random

from policies import search


def test_left_and_right_are_bisects_answers() -> None:
    rng = random.Random(7)
    for _ in range(300):
        # Ties, -0.0 beside 0.0, and runs of equal values: where bisect's two sides differ.
        a = sorted(
            rng.choice([-1.5, -0.0, 0.0, 0.5, 2.0, rng.uniform(-3, 3)])
            for _ in range(rng.randrange(12))
        )
        for x in (*a, -0.0, 0.0, -9.0, 9.0, rng.uniform(-3, 3), math.nan):
            lo = rng.randrange(len(a) + 1)
            hi = rng.randrange(lo, len(a) + 1)
            assert search.left(a, x, lo, hi) == bisect.bisect_left(a, x, lo, hi), (a, x, lo, hi)
            assert search.right(a, x, lo, hi) == bisect.bisect_right(a, x, lo, hi), (a, x, lo, hi)
