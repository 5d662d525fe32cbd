"""Whole-stack runs: simulator -> fake NVML -> real daemons -> webhook -> fake scheduler."""

from __future__ import annotations

import io

import pytest

from fakes.demo import run_scenario, summary

pytestmark = pytest.mark.scenario


async def test_hot_gpu_drains_only_the_heated_node_before_slowdown() -> None:
    out = io.StringIO()
    result = await run_scenario("hot-gpu", speed=30, seed=7, out=out)
    assert result.acted_nodes == {"gpu-node-02"}
    drain = result.first_action("gpu-node-02")
    assert drain is not None and drain.action == "drain"
    assert drain.reason.startswith("rackguard: gpu3 ") and "near slowdown 90C" in drain.reason
    assert drain.domain == "gpu"
    assert result.first_crossing is not None
    crossing_t, node, gpu = result.first_crossing
    assert (node, gpu) == ("gpu-node-02", 3)
    assert drain.t < crossing_t - 30  # drained well before the GPU throttles
    # Repaired at t=720 s and healthy for resume_after: back in service by the end.
    assert result.decisions[-1].action == "resume"
    assert result.final_state == {"gpu-node-02": "idle"}
    assert result.as_expected
    assert "outcome as expected" in summary(result)


async def test_sensor_dropout_is_unknown_never_a_drain() -> None:
    out = io.StringIO()
    result = await run_scenario("sensor-dropout", speed=40, seed=1, out=out)
    assert result.decisions == []
    log = out.getvalue()
    assert "gpu-node-03  condition unknown" in log  # the dropout is visible
    assert "NVML_ERROR_UNKNOWN" in log
    assert result.as_expected
