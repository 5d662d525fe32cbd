"""A GPU's recent power samples: the kept window and its range, against their definition."""

from __future__ import annotations

import math
import random

import pytest

from policies.tracking import PackedRecent, RecentSamples

# Both stores: the sources' deques and the compiled build's packed vectors (here both
# interpreted: librt's vectors work without the build too).
STORES = (RecentSamples, PackedRecent)


@pytest.mark.parametrize("store", STORES)
def test_spread_is_the_range_of_the_samples_kept(
    store: type[RecentSamples] | type[PackedRecent],
) -> None:
    rng = random.Random(11)
    for _ in range(50):
        keep_s = rng.choice([5.0, 30.0, 120.0])
        r = store()
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


@pytest.mark.parametrize("store", STORES)
def test_empty_has_no_spread(store: type[RecentSamples] | type[PackedRecent]) -> None:
    assert store().spread() == 0.0
    assert store().count == 0


def test_both_stores_keep_the_same_through_non_finite_times() -> None:
    # A NaN time is taken (it compares false with the newest) and stops the window
    # from being trimmed past it; +inf drops every finite sample. Both stores alike,
    # over enough samples that the packed one cuts its dropped entries off.
    rng = random.Random(5)
    deques, packed = RecentSamples(), PackedRecent()
    t = 0.0
    for k in range(3000):
        t += rng.choice([1.0, 1.0, 0.5, -1.0])
        when = math.nan if k in (700, 1900) else math.inf if k == 2500 else t
        value = rng.uniform(100.0, 700.0)
        deques.add(when, value, 60.0)
        packed.add(when, value, 60.0)
        assert repr(list(deques.samples)) == repr(packed.samples)  # NaN != NaN: by repr
        assert (deques.count, deques.spread(), deques.ordered, deques.added) == (
            packed.count,
            packed.spread(),
            packed.ordered,
            packed.added,
        )
