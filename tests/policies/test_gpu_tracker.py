"""One GPU's tracker: heating fast over two windows at flat power, load steps, what it keeps."""

from __future__ import annotations

import math
import random
from collections.abc import Callable

import pytest

from policies.freshness import fresh_value
from policies.gpu_tracker import GpuTracker
from policies.kernel.slopes import median_slope
from policies.model import Quality, Reading, SensorKind
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


KINDS = (
    SensorKind.GPU_TEMPERATURE,
    SensorKind.GPU_SLOWDOWN_THRESHOLD,
    SensorKind.GPU_SHUTDOWN_THRESHOLD,
    SensorKind.GPU_POWER,
    SensorKind.GPU_POWER_LIMIT,
)


def _random_reading(kind: SensorKind, t: float, rng: random.Random) -> Reading:
    if rng.random() < 0.2:
        return Reading(
            "gpus",
            "s",
            kind,
            None,
            "u",
            rng.choice([Quality.BAD, Quality.ABSENT]),
            t,
            t,
            reason="x",
        )
    return Reading(
        "gpus", "s", kind, rng.choice([60.0, 90.0, 95.0, 450.0]), "u", Quality.GOOD, t, t
    )


def test_kept_values_are_fresh_value_of_the_latest_readings() -> None:
    rng = random.Random(3)
    g = GpuTracker(PolicySettings())
    t = 0.0
    for _ in range(3000):
        t += rng.choice([0.5, 1.0, 7.0])
        g.observe(_random_reading(rng.choice(KINDS), t, rng))
        now = t + rng.choice([0.0, 2.0, 10.0, math.nan])
        for stale in (5.0, 30.0):
            assert g.fresh_temperature(now, stale) == fresh_value(g.temperature, now, stale)
            assert g.fresh_slowdown(now, stale) == fresh_value(g.slowdown, now, stale)
            assert g.fresh_shutdown(now, stale) == fresh_value(g.shutdown, now, stale)
            assert g.fresh_limit(now, stale) == fresh_value(g.limit, now, stale)
