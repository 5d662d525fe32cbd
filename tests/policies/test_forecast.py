"""Rolling windows, the robust trend, time-to-threshold, skill against persistence, load steps."""

from __future__ import annotations

import math
import random
from dataclasses import replace
from types import MappingProxyType

import msgspec
import pytest

from policies.forecast import (
    SeriesForecaster,
    SkillTracker,
    Trend,
    TrendSettings,
    theil_sen,
    time_to_threshold,
    z_for,
)
from policies.gpu_tracker import GpuTracker
from policies.kernel.buckets import Bucket
from policies.model import Quality, Reading, SensorKind
from policies.settings import PolicySettings

Z90 = z_for(0.9)


def _points(values: list[float], dt: float = 10.0) -> list[Bucket]:
    return [Bucket(i * dt, v, 1, v, v) for i, v in enumerate(values)]


def test_theil_sen_exact_line_and_outliers() -> None:
    line = [5.0 + 0.2 * 10 * i for i in range(30)]
    t = theil_sen(_points(line), Z90)
    assert t is not None and t.slope == pytest.approx(0.2) and t.at(290.0) == pytest.approx(63.0)
    spiky = list(line)
    for i in (3, 11, 20, 27):  # four wild readings out of thirty
        spiky[i] += 40.0
    robust = theil_sen(_points(spiky), Z90)
    assert robust is not None and robust.slope == pytest.approx(0.2, rel=0.05)
    assert theil_sen(_points([1.0, 2.0]), Z90) is None


def test_theil_sen_bounds_bracket_the_true_slope_under_noise() -> None:
    rng = random.Random(4)
    hits = 0
    for _ in range(200):
        pts = _points([0.01 * 10 * i + rng.gauss(0, 0.3) for i in range(30)])
        t = theil_sen(pts, Z90)
        assert t is not None and t.lo <= t.slope <= t.hi
        hits += t.lo <= 0.01 <= t.hi
    # Two one-sided 90 % bounds: about 80 % coverage.
    assert 0.7 <= hits / 200 <= 0.95


@pytest.mark.parametrize(
    ("level", "slope", "lo", "hi", "threshold", "falling", "point", "early", "late"),
    [
        (20.0, -0.1, -0.2, -0.05, 0.0, True, 200.0, 100.0, 400.0),
        (20.0, -0.1, -0.2, 0.05, 0.0, True, 200.0, 100.0, None),  # maybe not falling
        (20.0, 0.1, 0.05, 0.2, 0.0, True, None, None, None),  # moving away
        (-1.0, -0.1, -0.2, -0.05, 0.0, True, 0.0, 0.0, 0.0),  # already there
        (30.0, 0.01, 0.005, 0.02, 35.0, False, 500.0, 250.0, 1000.0),  # rising to a limit
    ],
)
def test_time_to_threshold(
    level: float,
    slope: float,
    lo: float,
    hi: float,
    threshold: float,
    falling: bool,
    point: float | None,
    early: float | None,
    late: float | None,
) -> None:
    t = theil_sen(_points([0.0, 1.0, 2.0]), Z90)
    assert t is not None
    got = time_to_threshold(
        msgspec.structs.replace(t, slope=slope, lo=lo, hi=hi), level, threshold, falling=falling
    )
    for have, want in ((got.point_s, point), (got.early_s, early), (got.late_s, late)):
        assert (have is None) == (want is None)
        if want is not None:
            assert have == pytest.approx(want)


def test_skill_needs_to_beat_persistence_by_the_margin() -> None:
    sk = SkillTracker(60.0, keep=4, max_pending=10, margin=0.2)
    assert not sk.trusted  # no record: not trusted
    for t in range(4):
        sk.record(t * 10.0, forecast=10.0, persisted=10.0)  # ties
    sk.score(100.0, actual=12.0, tolerance_s=5.0)
    assert sk.scored == 4 and not sk.trusted
    for t in range(4):
        sk.record(200.0 + t * 10.0, forecast=11.9, persisted=10.0)
    sk.score(300.0, actual=12.0, tolerance_s=5.0)
    assert sk.trusted  # the last four verdicts: 0.1 against 2.0
    for t in range(4):
        sk.record(400.0 + t * 10.0, forecast=14.5, persisted=10.0)
    sk.score(500.0, actual=12.0, tolerance_s=5.0)
    assert not sk.trusted  # worse than persistence now


SETTINGS = TrendSettings(bucket_s=10.0, window_s=300.0, max_rate_per_s=10.0 / 60, settle_s=120.0)


def _feed(f: SeriesForecaster, t0: float, t1: float, value: object, noise: float = 0.1) -> None:
    rng = random.Random(int(t0))
    t = t0
    while t < t1:
        assert callable(value)
        f.add(t, value(t) + rng.gauss(0, noise))
        t += 1.0


def test_a_slow_ramp_is_trusted_and_its_crossing_forecast() -> None:
    f = SeriesForecaster(SETTINGS)
    _feed(f, 0.0, 300.0, lambda t: 25.0)
    assert f.time_to(0.0, falling=True, at=300.0) is None  # flat: no crossing
    _feed(f, 300.0, 900.0, lambda t: 25.0 - 1.2 / 60 * (t - 300.0))  # 1.2 C/min down
    assert f.trusted
    ttt = f.time_to(0.0, falling=True, at=900.0)
    truth = (25.0 - 1.2 / 60 * 600.0) / (1.2 / 60)
    assert ttt is not None and ttt.point_s is not None and ttt.early_s is not None
    assert ttt.point_s == pytest.approx(truth, rel=0.1)
    assert ttt.early_s <= ttt.point_s
    assert f.forecast(300.0) == pytest.approx(25.0 - 1.2 / 60 * 900.0, abs=1.0)


def test_a_settled_step_is_not_extrapolated() -> None:
    f = SeriesForecaster(replace(SETTINGS, max_rate_per_s=None))
    _feed(f, 0.0, 300.0, lambda t: 30.0)
    # A first-order rise of 30 C (a job start), then flat.
    _feed(f, 300.0, 700.0, lambda t: 30.0 - 30.0 * (1 - math.exp(-(t - 300.0) / 45.0)))
    # Its fit still slopes (the step sits in the window) but it lost to persistence.
    assert not f.trusted and f.time_to(0.0, falling=True, at=700.0) is None


def test_a_fast_change_restarts_the_fit_after_settling() -> None:
    f = SeriesForecaster(SETTINGS)
    _feed(f, 0.0, 200.0, lambda t: 30.0)
    _feed(f, 200.0, 260.0, lambda t: 30.0 - 0.5 * (t - 200.0))  # 30 C/min: a step
    assert f.trend is None
    _feed(f, 260.0, 380.0, lambda t: 0.0)
    assert f.trend is None  # still settling
    _feed(f, 380.0, 500.0, lambda t: 0.0)
    assert f.trend is not None and not f.trend.significant


def test_floor_holds_a_margin_forecast_at_throttling() -> None:
    f = SeriesForecaster(SETTINGS, floor=0.0)
    assert f.project(5.0, -0.1, 300.0) == 0.0
    assert f.project(-1.0, -0.1, 300.0) == -1.0  # already under: not lower than now
    assert f.project(5.0, 0.1, 300.0) == 35.0


def _gpu(sensor: str, kind: SensorKind, value: float, t: float) -> Reading:
    labels = MappingProxyType({"gpu": "0"})
    return Reading("gpus", f"gpu0.{sensor}", kind, value, "x", Quality.GOOD, t, t, labels=labels)


def test_gpu_load_step_restarts_the_margin_trend() -> None:
    g = GpuTracker(PolicySettings())
    t = 0.0
    while t < 400.0:
        power = 100.0 if t < 200.0 else 650.0  # a job starts at t = 200
        temp = 35.0 if t < 200.0 else 64.0 - 29.0 * math.exp(-(t - 200.0) / 45.0)
        for r in (
            _gpu("slowdown_threshold", SensorKind.GPU_SLOWDOWN_THRESHOLD, 90.0, t),
            _gpu("power_limit", SensorKind.GPU_POWER_LIMIT, 700.0, t),
            _gpu("power", SensorKind.GPU_POWER, power, t),
            _gpu("temperature", SensorKind.GPU_TEMPERATURE, temp, t),
        ):
            g.observe(r)
        t += 1.0
    assert g.load_steps == 1 and 200.0 <= g.step_times[0] <= 211.0
    assert g.margin.time_to(0.0, falling=True, at=400.0) is None


def _bits(trend: Trend | None) -> tuple[object, ...] | None:
    """Every field of a trend, floats by their bits (0.0 and -0.0 differ)."""
    if trend is None:
        return None
    floats = (trend.slope, trend.lo, trend.hi, trend.level, trend.t_ref, trend.span_s)
    return (*(x.hex() for x in floats), trend.n)


def _plain_fit(points: list[Bucket], settings: TrendSettings) -> Trend | None:
    """SeriesForecaster's fit from scratch: theil_sen of the whole window and its recent half."""
    if len(points) < settings.min_points:
        return None
    z = z_for(settings.confidence)
    whole = theil_sen(points, z)
    recent = theil_sen(points[len(points) // 2 :], z)
    if whole is None or recent is None or recent.lo <= whole.slope <= recent.hi:
        return whole
    return recent if abs(recent.slope) < abs(whole.slope) else whole


@pytest.mark.parametrize("seed", range(6))
def test_the_kept_slopes_fit_as_theil_sen_does_from_scratch(seed: int) -> None:
    rng = random.Random(seed)
    settings = TrendSettings(bucket_s=10.0, window_s=rng.choice([60.0, 150.0, 300.0]))
    f = SeriesForecaster(settings)
    # Quantized readings give ties (equal slopes); a few denormals give slopes of -0.0.
    levels = [0.0, 5e-324, -5e-324] if seed == 0 else [float(k) for k in range(-3, 4)]
    since = -math.inf
    t = 0.0
    for _ in range(3000):
        t += rng.choice([0.5, 1.0, 1.0, 3.0, 17.0])  # gaps close several buckets at once
        if rng.random() < 0.003:  # a restart: the window grows again from nothing
            since = t + rng.choice([0.0, 40.0])
            f.restart(since)
        if f.add(t, rng.choice(levels) + (rng.gauss(0.0, 0.5) if seed % 2 else 0.0)):
            assert _bits(f.trend) == _bits(_plain_fit(f.window.buckets(since), settings))
