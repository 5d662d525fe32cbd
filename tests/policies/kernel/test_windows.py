"""A GPU's two confirm windows: the remembered places and slopes give what scanning gives."""

from __future__ import annotations

import random

import pytest

from policies.kernel.slopes import median_slope
from policies.kernel.windows import ConfirmWindows, within_one_step


def _by_definition(cw: ConfirmWindows, now: float, w: float) -> tuple[float, float] | None:
    samples = cw.recent.samples
    newer = [p for p in samples if now - w <= p[0] <= now]
    older = [p for p in samples if now - 2 * w <= p[0] <= now - w]
    a, b = median_slope(newer), median_slope(older)
    if a is None or b is None:
        return None
    values = sorted(v for _, v in newer), sorted(v for _, v in older)
    return (0.0, 0.0) if within_one_step(values) else (a, b)


@pytest.mark.parametrize("seed", range(4))
def test_rates_are_the_median_slopes_of_the_two_windows(seed: int) -> None:
    rng = random.Random(seed)
    cw = ConfirmWindows()
    t = 0.0
    for _ in range(400):
        t += rng.choice([0.5, 1.0, 1.0, 2.5])
        cw.add(t, round(60.0 + 0.2 * t + rng.gauss(0.0, 1.0)), 21.0)
        for now in (t, t + 0.25):
            # Two widths asked in turn, as across a reload: neither answers for the other.
            for w in (5.0, 10.0):
                assert cw.rates(now, w) == _by_definition(cw, now, w), (t, now, w)


def test_whole_degree_steps_over_steady_windows_are_no_rate() -> None:
    cw = ConfirmWindows()
    for k in range(21):
        cw.add(float(k), 60.0 if k < 15 else 61.0, 21.0)  # one reading step up
    assert cw.rates(20.0, 10.0) == (0.0, 0.0)


def test_fast_is_the_newer_rate_only_when_both_windows_are_faster() -> None:
    cw = ConfirmWindows()
    for k in range(21):
        cw.add(float(k), 60.0 + 2.0 * k, 21.0)  # 2 C/s in both windows
    assert cw.fast(20.0, 10.0, 1.0) == pytest.approx(2.0)
    assert cw.fast(20.0, 10.0, 3.0) is None
    flat_then_fast = ConfirmWindows()
    for k in range(21):
        flat_then_fast.add(float(k), 60.0 if k <= 10 else 60.0 + 2.0 * (k - 10), 21.0)
    assert flat_then_fast.fast(20.0, 10.0, 1.0) is None  # the older window is flat


def test_out_of_order_times_are_windowed_by_scanning() -> None:
    cw = ConfirmWindows()
    for k in range(12):
        cw.add(float(k), 60.0 + k, 30.0)
    cw.add(float("nan"), 99.0, 30.0)
    assert not cw.recent.ordered
    assert cw.spans(11.0, 5.0) is None
    assert cw.rates(11.0, 5.0) == _by_definition(cw, 11.0, 5.0)
