"""Heat removal failing, seen from the GPUs alone: heating fast over two windows at flat power."""

from __future__ import annotations

import math
import random
from collections.abc import Callable

import pytest

from policies.gpu_tracker import GpuTracker
from policies.kernel import slopes
from policies.kernel.slopes import median_slope
from policies.model import Quality, Reading, SensorKind
from policies.rack_tracker import LossRun
from policies.settings import PolicySettings


def _reading(kind: SensorKind, t: float, value: float) -> Reading:
    return Reading("gpus", f"gpu0.{kind.value}", kind, value, "x", Quality.GOOD, t, t)


def _feed(
    g: GpuTracker, seconds: float, rate: float, hz: float, power: float | Callable[[float], float]
) -> None:
    n = round(seconds * hz)
    for k in range(n + 1):
        t = k / hz
        watts = power(t) if callable(power) else power
        g.observe(_reading(SensorKind.GPU_POWER_LIMIT, t, 700.0))
        g.observe(_reading(SensorKind.GPU_POWER, t, watts))
        g.observe(_reading(SensorKind.GPU_TEMPERATURE, t, 60.0 + rate * t))


@pytest.mark.parametrize("hz", [1.0, 100.0])  # a 100 Hz sampler is averaged, not fitted raw
def test_heating_at_flat_power_shows_over_both_windows(hz: float) -> None:
    g = GpuTracker(PolicySettings())
    _feed(g, 130.0, 0.5, hz, 650.0)
    rates = g.heating_rate(130.0)
    assert rates is not None and rates == pytest.approx((0.5, 0.5), rel=0.01)
    assert g.power_steady()


def test_a_load_step_is_not_flat_power() -> None:
    g = GpuTracker(PolicySettings())
    _feed(g, 60.0, 0.5, 1.0, lambda t: 100.0 if t < 30 else 650.0)
    assert not g.power_steady()


def _rates_by_definition(g: GpuTracker, now: float) -> tuple[float, float] | None:
    w = PolicySettings().flow_loss_confirm_s
    samples = g.recent_temp.samples
    newer = median_slope([p for p in samples if now - w <= p[0] <= now])
    older = median_slope([p for p in samples if now - 2 * w <= p[0] <= now - w])
    return None if newer is None or older is None else (newer, older)


def test_the_cached_heating_rate_is_the_one_its_definition_gives() -> None:
    # Noisy heating, asked at every sample and between samples: the cached windows
    # give exactly (==) what scanning every sample gives, also after a NaN time.
    g = GpuTracker(PolicySettings())
    for k in range(60):
        t = k * 0.7
        g.observe(_reading(SensorKind.GPU_TEMPERATURE, t, 60.0 + 0.3 * t + (k * 7919 % 5) / 4))
        for now in (t, t + 0.35, t + 3.0):
            assert g.heating_rate(now) == _rates_by_definition(g, now)
        if k == 40:
            g.observe(_reading(SensorKind.GPU_TEMPERATURE, math.nan, 70.0))
            assert not g.recent_temp.ordered


def test_median_slope_ignores_one_wild_sample() -> None:
    pts = [(float(t), 2.0 * t) for t in range(10)]
    pts[5] = (5.0, 500.0)
    assert median_slope(pts) == pytest.approx(2.0)
    assert median_slope(pts[:3]) is None


def test_a_loss_run_needs_two_samples_the_confirm_window_apart() -> None:
    run = LossRun()
    run.update(0.0, True)
    run.update(3.0, True)
    assert not run.confirmed(5.0)
    run.update(5.0, True)
    assert run.confirmed(5.0)
    run.update(6.0, False)  # one healthy sample ends the run
    run.update(7.0, True)
    assert not run.confirmed(5.0)


def _scanning_gpu(s: PolicySettings) -> GpuTracker:
    """A GpuTracker that never finds its windows by bisection: every step by definition."""
    g = GpuTracker(s)
    # What a non-finite sample time does: the windows are found by scanning from then on.
    g.recent_temp.ordered = False
    return g


@pytest.mark.parametrize("seed", range(6))
def test_the_resistance_fast_path_keeps_what_its_definition_keeps(seed: int) -> None:
    # Load steps, heating at flat power, a repair that cools the GPU at once (caps),
    # jittered times, whole-degree readings: the bisected, cached and short-cut steps
    # keep exactly (==) the samples and give the fast-heating rates that the
    # definition (scanning every sample) gives.
    rnd = random.Random(seed)
    s = PolicySettings()
    fast, slow = GpuTracker(s), _scanning_gpu(s)
    reference, resistance, watts, t, temp = 30.0, 0.05, 600.0, 0.0, 60.0
    again = 0.0
    whole = rnd.random() < 0.5
    for k in range(900):
        t += 1.0 + rnd.uniform(-0.2, 0.2)
        if k % 150 == 0:
            watts = rnd.choice([150.0, 400.0, 650.0, 0.0])
        if k == 500:
            resistance = 0.03  # a cold plate reseated
        steady = reference + resistance * watts
        heating = 0.4 if 300 <= k < 360 else 0.0
        temp += heating + 0.2 * (steady - temp) + rnd.gauss(0.0, 0.3)
        value = float(round(temp)) if whole else temp
        power = watts + rnd.gauss(0.0, 3.0)
        for g in (fast, slow):
            g.observe(_reading(SensorKind.GPU_POWER_LIMIT, t, 700.0))
            g.observe(_reading(SensorKind.GPU_POWER, t, power))
            r = _reading(SensorKind.GPU_TEMPERATURE, t, value)
            g.observe(r)
        # The time asked last, asked again now that a sample came in: a remembered
        # place of the windows must not outlive the samples it was found in.
        assert fast.heating_rate(again) == slow.heating_rate(again), k
        for g in (fast, slow):
            g.sample_resistance(reference)
        assert list(fast.resistance.samples) == list(slow.resistance.samples), k
        fastest = s.max_gpu_rate_c_per_min / 60.0
        again = math.floor(t) + 2.0
        for now in (t, t + 0.5, again):
            assert fast.fast_heating(now, fastest) == slow.fast_heating(now, fastest), k
            assert fast.heating_rate(now) == slow.heating_rate(now), k
    assert fast.resistance.estimate(s.trend_min_points) == slow.resistance.estimate(
        s.trend_min_points
    )


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
