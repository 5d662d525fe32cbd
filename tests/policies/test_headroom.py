"""Headroom at full load: thermal resistance from steady periods, projected to the power limit."""

from __future__ import annotations

import math
import random

import pytest

from fakes.sim.scenario import parse_scenario
from fakes.sim.trace_writer import scenario_readings
from policies.gpu_tracker import GpuTracker
from policies.headroom import ResistanceEstimator
from policies.model import Action, FaultDomain, Quality, Reading, SensorKind
from policies.replay import replay_readings
from policies.settings import PolicySettings


def test_resistance_is_the_robust_median_of_steady_buckets() -> None:
    est = ResistanceEstimator(10.0, 30, 1.28)
    for k in range(200):  # 20 buckets at 0.05 K/W, one wild one, one unsteady one
        t = float(k)
        ratio = 0.5 if 50 <= k < 60 else 0.05
        est.add(t, ratio * 600.0, 600.0, steady=not 100 <= k < 105)
    r = est.estimate(6)
    assert r is not None and r.median == pytest.approx(0.05)
    assert r.n == 18  # 19 closed buckets, the unsteady one left out
    assert r.lo <= r.median <= r.hi < 0.5
    assert ResistanceEstimator(10.0, 30, 1.28).estimate(6) is None


def _scenario(factor: float) -> dict[str, object]:
    return {
        "name": "idle-node-bad-plate",
        "description": "An idle node whose GPU 3 cold plate degrades: fine idle, not at full load.",
        "duration_s": 900,
        "seed": 1,
        "rack": {"nodes": ["gpu-node-01", "gpu-node-02"]},
        "events": [
            {"at_s": 0, "kind": "job_start", "target": "gpu-node-01", "util": 0.9},
            {
                "at_s": 60,
                "kind": "cold_plate_degrade",
                "target": "gpu-node-02",
                "gpu": 3,
                "factor": factor,
                "ramp_s": 120,
            },
        ],
        "expect": {},
    }


@pytest.mark.parametrize(("factor", "drained"), [(3.0, True), (1.2, False)])
def test_an_idle_node_unfit_for_full_load_is_drained(factor: float, drained: bool) -> None:
    """Idle, its GPUs stay far from slowdown; at its power limit one would pass it."""
    header, readings = scenario_readings(parse_scenario(_scenario(factor)))
    decisions = [
        d for t in replay_readings(header, list(readings), PolicySettings()) for d in t.decisions
    ]
    if not drained:
        assert decisions == []
        return
    (d,) = decisions
    assert d.node == "gpu-node-02" and d.action is Action.DRAIN and d.domain is FaultDomain.GPU
    assert "gpu3 would be" in d.reason and "at full power" in d.reason


def _gpu_sample(g: GpuTracker, t: float, temp: float, watts: float) -> None:
    for kind, value in (
        (SensorKind.GPU_POWER_LIMIT, 700.0),
        (SensorKind.GPU_POWER, watts),
        (SensorKind.GPU_TEMPERATURE, float(round(temp))),  # NVML: whole degrees
    ):
        r = Reading("gpus", f"gpu0.{kind.value}", kind, value, "x", Quality.GOOD, t, t)
        g.observe(r)
        if kind is SensorKind.GPU_TEMPERATURE:
            g.sample_resistance(30.0)


def test_a_repaired_plate_caps_the_estimate_as_the_gpu_cools_never_under_the_truth() -> None:
    s = PolicySettings()
    g = GpuTracker(s)
    for k in range(300):  # a bad plate at 0.1 K/W: steady at 90 C under 600 W
        _gpu_sample(g, float(k), 90.0, 600.0)
    before = g.resistance.estimate(s.trend_min_points)
    assert before is not None and before.lo == pytest.approx(0.1, abs=0.002)
    # Repaired at t=300 (0.05 K/W): it cools toward 60 C with a 40 s time constant.
    for k in range(300, 400):
        temp = 60.0 + 30.0 * math.exp(-(k - 300) / 40.0)
        _gpu_sample(g, float(k), temp, 600.0)
        est = g.resistance.estimate(s.trend_min_points)
        assert est is not None and est.lo >= 0.05 - 0.5 / 600  # a bound, never under R
    after = g.resistance.estimate(s.trend_min_points)
    assert after is not None and after.lo < 0.06  # followed it down within 100 s


def test_a_gpu_still_heating_after_its_load_rose_does_not_lower_the_estimate() -> None:
    s = PolicySettings()
    g = GpuTracker(s)
    for k in range(300):
        _gpu_sample(g, float(k), 90.0, 600.0)
    for k in range(300, 330):  # the job pauses: down to 100 W, the GPU cools
        _gpu_sample(g, float(k), 35.0 + 55.0 * math.exp(-(k - 300) / 10.0), 100.0)
    for k in range(330, 360):  # back at 600 W: cooling for a moment, then heating
        _gpu_sample(g, float(k), 90.0 - 40.0 * math.exp(-(k - 330) / 10.0), 600.0)
    est = g.resistance.estimate(s.trend_min_points)
    assert est is not None and est.lo >= 0.1 - 0.002


def test_a_steady_gpu_read_in_whole_degrees_is_not_heating_fast() -> None:
    s = PolicySettings()
    g = GpuTracker(s)
    rng = random.Random(3)
    fastest = s.max_gpu_rate_c_per_min / 60.0
    t = 0.0
    for _ in range(3000):  # 64.5 C, 0.3 C of noise, polled about once a second with jitter
        t += 1.0 + rng.uniform(-0.6, 0.6)
        _gpu_sample(g, t, 64.5 + rng.gauss(0.0, 0.3), 600.0)
        rates = g.heating_rate(t)
        assert rates is None or not (rates[0] > fastest and rates[1] > fastest)
