"""Headroom at full load: thermal resistance from steady periods, projected to the power limit."""

from __future__ import annotations

import pytest

from fakes.sim.scenario import parse_scenario
from fakes.sim.trace_writer import scenario_readings
from policies.headroom import ResistanceEstimator
from policies.model import Action, FaultDomain
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
